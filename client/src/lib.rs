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
//! - `access`: access-policy checks ([`Client::check_access`], [`Operation`]);
//! - [`attest`]: the attestation key, quotes and PCR reads, the in-core verifier ([`Quote::verify`]), tpm2-tools files;
//! - `blocking`: [`BlockingClient`], the synchronous facade;
//! - `bulk`: stream encryption in this process (format v2): the AES-GCM pipeline and its threads;
//! - `cert`: certificate requests, self-signed certificates, stored chains ([`CertSubject`], [`CertificateChain`]);
//! - `client`: [`Client`] and [`ClientBuilder`], connecting over the Unix socket and the async calls, one per RPC;
//! - `crypto`: data keys, streaming encryption and decryption ([`Client::copy_encrypt`], ...), random bytes;
//! - `error`: [`Error`], and [`io_reason`] (an I/O error in a few clean words);
//! - [`eventlog`]: the measured-boot event log: parsing (both TCG formats), decoding, replay, the check against PCRs;
//! - `key`: [`KeyInfo`] and [`PublicKey`];
//! - `key_auth`: [`KeyAuth`], a key password that is zeroed on drop;
//! - `names`: the [`Named`] trait, the names users type for the API enums (`ecc-p256`, `sha384`, `pss`...);
//! - `pcr`: [`PcrBinding`], a PCR selection with optional expected values, and its text form;
//! - `policy`: signed PCR approvals ([`SignedPolicy`]), signed offline ([`PolicyAuthority`]) or by a vault key;
//! - `pq`: ML-KEM encapsulation ([`KemPublicKey`]), in-core ML-DSA and hybrid checks ([`verify_hybrid`]);
//! - `seal`: sealed secrets ([`Client::seal`], [`SealOptions`]);
//! - [`seal_for`]: secrets sealed offline for a device's storage key, imported there;
//! - `sign`: what is signed and how ([`SignInput`], [`SignOptions`], [`Signature`], [`Hasher`]);
//! - `status`: the daemon's status and metrics ([`DaemonStatus`]);
//! - `sync_io`: [`SyncIo`], a blocking reader or writer used where the library takes a tokio one;
//! - [`tls`]: rustls with vault keys ([`tls::VaultSigningKey`]), resolvers that follow rotation, TLS 1.3 defaults.
//!
//! The `tpm-vault` command line, its ACME client, SSH agent and Keylime agent are the
//! application crate `tpm-vault-cli` (`cli/`), built on this library's public API.
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod access;
pub mod attest;
mod blocking;
mod bulk;
mod cert;
mod client;
mod crypto;
mod error;
pub mod eventlog;
mod key;
mod key_auth;
mod names;
mod pcr;
mod policy;
mod pq;
mod seal;
pub mod seal_for;
mod sign;
mod status;
mod sync_io;
pub mod tls;

pub use access::{AccessCheck, AccessDecision, Operation};
pub use attest::{AttestationKey, PcrValues, Quote, QuoteError};
pub use blocking::BlockingClient;
pub use cert::{CertSubject, CertificateChain, San};
pub use client::{Client, ClientBuilder, DEFAULT_SOCKET, MAX_LIST_BYTES, MAX_LIST_PAGES};
pub use crypto::{
    read_header as read_stream_header, stream_key_name, CryptoReader, DataKey, IN_FLIGHT, MAX_RANDOM_REQUEST,
    MAX_STREAM_HEADER, MESSAGE_SIZE,
};
pub use error::{io_reason, ConnectFailure, Error};
pub use key::{KeyInfo, PublicKey};
pub use key_auth::{KeyAuth, MAX_KEY_AUTH};
pub use names::{natural_hash, signs_whole_messages, Named};
pub use pcr::{parse_selection as parse_pcr_selection, PcrBinding};
pub use policy::{PolicyApproval, PolicyAuthority, PolicyKeyError, SignedPolicy, MAX_SIGNED_POLICY};
pub use pq::{verify_hybrid, verify_ml_dsa, Encapsulated, KemPublicKey};
pub use seal::{SealInfo, SealOptions, MAX_SECRET};
pub use sign::{Hasher, SignInput, SignOptions, Signature, INLINE_MESSAGE_LIMIT, MAX_WHOLE_MESSAGE};
pub use status::{DaemonStatus, Metric};
pub use sync_io::SyncIo;
pub use tonic::Code;
pub use tpm_vault_proto::v1::{HashAlgorithm, KeyAlgorithm, KeyUsage, SignPurpose, SignatureScheme, TpmState};
/// The hybrid ECDSA P-256 + ML-DSA-65 signature format (`--scheme hybrid`), shared with the daemon.
pub use tpm_vault_proto::{algorithm, hybrid};

/// The generated gRPC types and service clients, for calls this crate does not wrap.
pub use tpm_vault_proto::v1 as proto;
