//! tpm-vault daemon library: owns the TPM, keeps keys non-extractable, serves them over gRPC.
//!
//! # Layout
//! Modules follow the request path:
//! - [`rpc`]: gRPC services; converts proto input into [`model`] types at the edge, accounts
//!   for every call once (metrics and audit, `rpc/call.rs`) and builds every `tonic::Status`
//!   in one place (`rpc/status.rs`).
//! - [`auth`]: who the peer is, the access policies, per-client limits and the audit log.
//! - [`vault`]: key operations (create, sign, seal, data keys, ...) combining the store, the
//!   TPM actor and in-core cryptography; it speaks no TPM or proto type.
//! - [`tpm`]: the actor thread and the connection it owns (ESAPI context, SRK, sessions,
//!   loaded objects); the only code that touches `tss_esapi`.
//! - [`store`]: the state directory (one crash-safe record table per kind), trusted only when
//!   nobody else can change it, read without following links or waiting on FIFOs.
//! - [`crypto`]: in-core cryptography: signature verification, the envelopes' AEAD, the
//!   stream format, the DRBG every key comes from, opaque page tokens, and the post-quantum
//!   algorithms.
//! - [`model`]: validated domain types; [`error`]: the error type; [`metrics`]: counters.
//! - [`bounds`]: connection and message bounds that hold before authorization.
//! - [`config`], [`server`], [`simulator`]: configuration, the listener/lifecycle, and the
//!   private swtpm used when the machine has no TPM; [`spawn`]: child processes that
//!   inherit no TPM socket.
//! - [`tls`]: TPM-resident TLS keys in-process (a rustls signing key over the TPM actor) and
//!   the `--listen` gRPC-over-TLS listener with client certificates.
//! - [`logwriter`]: log and audit lines to stderr in batches, off the request path; loggers
//!   never wait (past its bounds lines are dropped, counted and reported).
//! - [`systemd`], [`telemetry`]: readiness, stopping and watchdog messages to systemd, and the
//!   optional Prometheus endpoint, with the `process_*` figures of [`process_metrics`].
//! - `fuzzing` (hidden): the fuzz targets' way into parsers private to their modules.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs, missing_debug_implementations)]
// Two audited exceptions: `spawn` runs a close_range hook between fork and exec, and
// `auth::peer::peer_groups` reads SO_PEERGROUPS (getsockopt) into a buffer it owns.
#![deny(unsafe_code)]

pub mod auth;
pub mod bounds;
pub mod config;
pub mod crypto;
pub mod error;
pub mod logwriter;
pub mod metrics;
pub mod model;
pub mod process_metrics;
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

/// Entry points for the fuzz targets (`fuzz/`) into parsers of untrusted input that are private
/// to their modules. Not an API: hidden from the docs, no stability promise, used by nothing
/// but `fuzz/`.
#[doc(hidden)]
pub mod fuzzing {
    use crate::error::Error;
    use crate::model::PcrTarget;
    use crate::telemetry::Request;

    /// The `PcrBinding` of Seal, CreateKey, CreateDataKey, Quote and ReadPcrs as the RPC layer
    /// parses it.
    ///
    /// # Errors
    /// What the RPC would answer INVALID_ARGUMENT with.
    pub fn pcr_binding(b: tpm_vault_proto::v1::PcrBinding) -> Result<PcrTarget, Error> {
        crate::rpc::pcr_binding(b)
    }

    /// ActivateCredential's credential blob and encrypted secret without their TPM2B size
    /// prefixes (`strip_tpm2b`), as the vault passes them to the TPM.
    ///
    /// # Errors
    /// What the RPC would answer INVALID_ARGUMENT with.
    pub fn credential_inputs(blob: &[u8], secret: &[u8]) -> Result<(Vec<u8>, Vec<u8>), Error> {
        crate::vault::attest::credential_inputs(blob, secret)
    }

    /// The metrics endpoint's reading of the bytes received so far on a connection: `None`
    /// while the head is incomplete, `Some(Ok((path, head_only)))` for `GET`/`HEAD` (the query
    /// string dropped), `Some(Err(status))` for the HTTP status it answers anything else with.
    pub fn metrics_request(received: &[u8]) -> Option<Result<(String, bool), u16>> {
        Request::parse(received).map(|r| match r {
            Request::Get { path, head_only } => Ok((path, head_only)),
            Request::OtherMethod => Err(405),
            Request::Malformed => Err(400),
            Request::TooLarge => Err(431),
        })
    }
}

pub use error::Error;
pub use vault::{Vault, VaultConfig};
