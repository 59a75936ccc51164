//! Client for `tpm-vaultd`, the daemon that turns a TPM 2.0 into a key vault.
//!
//! The daemon serves the `tpmvault.v1` gRPC API on a Unix socket (by default
//! [`DEFAULT_SOCKET`]). This crate wraps that API in plain Rust types:
//!
//! - [`Client`]: async, cheap to clone, one connection shared by all clones;
//! - [`BlockingClient`]: the same calls for synchronous code, driven by a private
//!   current-thread tokio runtime;
//! - [`Error`]: one error type whose `Display` is a single line fit for a user, and whose
//!   [`Error::code`] gives the gRPC code for programs.
//!
//! ```no_run
//! use tpm_vault_client::{Client, KeyAlgorithm, SignInput, SignOptions};
//!
//! # async fn demo() -> Result<(), tpm_vault_client::Error> {
//! let client = Client::connect("/run/tpm-vault/vault.sock").await?;
//! client.create_key("web", KeyAlgorithm::EccP256, None).await?;
//! let signature = client
//!     .sign("web", SignInput::Message(b"hello".to_vec()), &SignOptions::new())
//!     .await?;
//! println!("{} signature bytes", signature.bytes().len());
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - `client`: [`Client`] and [`ClientBuilder`], connecting over the Unix socket and the async calls, one per RPC;
//! - `blocking`: [`BlockingClient`], the synchronous facade;
//! - `error`: [`Error`];
//! - `names`: the [`Named`] trait, the names users type for the API enums (`ecc-p256`, `sha384`, `pss`...);
//! - `key`, `pcr`, `sign`, `status`: the friendly request/response types;
//! - `key_auth`: [`KeyAuth`], a key password that is zeroed on drop;
//! - `crypto`: data keys, streaming encryption and decryption ([`Client::copy_encrypt`],
//!   [`Client::encrypt_reader`], ...) and random bytes;
//! - [`attest`]: the attestation key, quotes and PCR reads, the in-core quote verifier
//!   ([`Quote::verify`]) and the tpm2-tools file formats (`quote.pcrs`, credential files);
//! - [`eventlog`]: the TPM's measured-boot event log: parsing (both TCG formats), decoding,
//!   replay per bank and the check against the TPM's or a quote's PCR values;
//! - `seal`: sealed secrets ([`Client::seal`], [`SealOptions`]);
//! - `policy`: signed PCR approvals for authorized secrets ([`SignedPolicy`]), signed offline
//!   ([`PolicyAuthority`]) or by a vault key ([`Client::sign_policy`]);
//! - `cert`: certificate requests, self-signed certificates and stored chains
//!   ([`Client::create_csr`], [`CertSubject`], [`CertificateChain`]);
//! - `acme`: certificates from an ACME CA (RFC 8555) for vault keys, the account key a vault
//!   key too (`tpm-vault cert enroll` / `cert renew`);
//! - [`tls`]: TLS with vault keys: [`tls::VaultSigningKey`] (a rustls signing key), certificate
//!   resolvers that follow rotation, and the TLS 1.3 defaults;
//! - `access`: access-policy checks ([`Client::check_access`], [`Operation`]);
//! - `pq`: post-quantum keys on the client: ML-KEM encapsulation ([`Client::encapsulate`],
//!   [`KemPublicKey`]) and in-core ML-DSA and hybrid signature checks
//!   ([`PublicKey::verify_signature`], [`verify_hybrid`]); [`hybrid`] is the hybrid signature
//!   format;
//! - [`ssh_agent`]: an OpenSSH agent serving vault keys (`tpm-vault ssh-agent`);
//! - [`cli`]: the `tpm-vault` command line (the binary only parses arguments and calls [`cli::run`]).
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod access;
mod acme;
pub mod attest;
mod blocking;
mod bulk;
mod cert;
pub mod cli;
mod client;
mod crypto;
mod error;
pub mod eventlog;
mod key;
mod key_auth;
pub mod keylime;
mod names;
mod pcr;
mod policy;
mod pq;
mod seal;
pub mod seal_for;
mod sign;
pub mod ssh_agent;
mod status;
mod sync_io;
pub mod tls;

pub use access::{AccessCheck, AccessDecision, Operation};
pub use attest::{AttestationKey, PcrValues, Quote, QuoteError};
pub use blocking::BlockingClient;
pub use cert::{CertSubject, CertificateChain, San};
pub use client::{Client, ClientBuilder, DEFAULT_SOCKET, MAX_LIST_BYTES, MAX_LIST_PAGES};
pub use crypto::{
    stream_key_name, CryptoReader, DataKey, IN_FLIGHT, MAX_RANDOM_REQUEST, MAX_STREAM_HEADER, MESSAGE_SIZE,
};
pub use error::{ConnectFailure, Error};
pub use key::{KeyInfo, PublicKey};
pub use key_auth::{KeyAuth, MAX_KEY_AUTH};
pub use names::Named;
pub use pcr::PcrBinding;
pub use policy::{PolicyApproval, PolicyAuthority, PolicyKeyError, SignedPolicy, MAX_SIGNED_POLICY};
pub use pq::{verify_hybrid, verify_ml_dsa, Encapsulated, KemPublicKey};
pub use seal::{SealInfo, SealOptions, MAX_SECRET};
pub use sign::{Hasher, SignInput, SignOptions, Signature};
pub use status::{DaemonStatus, Metric};
pub use tonic::Code;
pub use tpm_vault_proto::v1::{HashAlgorithm, KeyAlgorithm, KeyUsage, SignPurpose, SignatureScheme, TpmState};
/// The hybrid ECDSA P-256 + ML-DSA-65 signature format (`--scheme hybrid`), shared with the daemon.
pub use tpm_vault_proto::{algorithm, hybrid};

/// The generated gRPC types and service clients, for calls this crate does not wrap.
pub use tpm_vault_proto::v1 as proto;
