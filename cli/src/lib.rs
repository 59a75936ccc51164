//! `tpm-vault`, the command line of tpm-vault, and the programs it runs: an ACME client, an
//! OpenSSH agent and a Keylime agent, all built on the public API of the client library
//! (`tpm-vault-client`), which knows nothing of them.
//!
//! The binary (`src/main.rs`) only parses arguments, builds a runtime and calls [`cli::run`].
//!
//! # Layout
//! - [`cli`]: the `tpm-vault` command line: arguments (clap), output in text or JSON, exit codes;
//! - `acme`: certificates from an ACME CA (RFC 8555) for vault keys, the account key a vault key too (`cert enroll` / `cert renew`);
//! - [`ssh_agent`]: an OpenSSH agent serving vault keys (`tpm-vault ssh-agent`);
//! - [`keylime`]: a Keylime push-model agent attesting the device through the daemon (`tpm-vault keylime-agent`).
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod acme;
pub mod cli;
pub mod keylime;
pub mod ssh_agent;
