//! tpm-vault daemon library: owns the TPM, keeps keys non-extractable, serves them over gRPC.
//!
//! # Layout
//! Modules follow the request path:
//! - [`rpc`]: gRPC services; converts proto input into [`model`] types at the edge and maps
//!   [`Error`] to `tonic::Status` in exactly one place (`rpc/status.rs`).
//! - [`vault`]: key operations (create, sign, ...) combining the store and the TPM actor.
//! - [`tpm`]: the TPM actor thread that owns the ESAPI context, SRK, sessions and loaded objects.
//! - [`store`]: the state directory (crash-safe key records).
//! - [`crypto`]: in-core cryptography (verification; bulk crypto later).
//! - [`model`]: validated domain types; [`error`]: the error type; [`metrics`]: counters.
//! - [`bounds`]: connection and message bounds that hold before authorization.
//! - [`config`], [`server`], [`simulator`]: configuration, the listener/lifecycle, and the
//!   private swtpm used when the machine has no TPM; [`spawn`]: child processes that
//!   inherit no TPM socket.
//! - [`tls`]: TPM-resident TLS keys in-process (a rustls signing key over the TPM actor) and
//!   the `--listen` gRPC-over-TLS listener with client certificates.
//! - [`logwriter`]: log and audit lines to stderr in batches, off the request path.
//! - [`systemd`], [`telemetry`]: readiness, stopping and watchdog messages to systemd, and the
//!   optional Prometheus endpoint.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs, missing_debug_implementations)]
// One audited exception: `spawn` runs a close_range hook between fork and exec.
#![deny(unsafe_code)]

pub mod auth;
pub mod bounds;
pub mod config;
pub mod crypto;
pub mod error;
pub mod logwriter;
pub mod metrics;
pub mod model;
pub mod rpc;
pub mod server;
pub mod simulator;
pub mod spawn;
pub mod store;
pub mod systemd;
pub mod telemetry;
pub mod tls;
pub mod tpm;
pub mod vault;

pub use error::Error;
pub use vault::{Vault, VaultConfig};
