//! tpm-vault daemon library: owns the TPM, keeps keys non-extractable, serves them over gRPC.
//!
//! # Public face
//! The modules are private; what other crates use is re-exported here, and nothing more:
//! - [`Vault`] with [`VaultConfig`], [`SignRequest`], [`SealTarget`], [`QueueConfig`],
//!   [`ClientKey`] (whose TPM jobs they are: [`ClientKey::DAEMON`] for in-process users) and the
//!   errors [`Error`] (with [`Denied`] and [`Invalid`]) and [`TpmError`]: key operations in-process, as the benches, the fuzz
//!   seeds and the tests drive them; [`model`]: the validated domain types they take.
//! - [`daemon`]: what the `tpm-vaultd` binary and the integration tests need to run and serve
//!   the daemon (configuration, listeners, serving, access policies, audit, metrics).
//! - [`harness`]: the test and benchmark harness (a private swtpm, its ports, children that
//!   inherit no TPM socket).
//! - [`formats`]: byte-level formats and checks the benches and fuzz targets use directly
//!   (post-quantum keys and signatures, signature verification, TPM templates and PCR policy
//!   digests, store records, certificate chains, signed PCR policies).
//!
//! # Layout
//! Modules follow the request path, one line each:
//! - [`serve`]: listeners, TLS, connection and message bounds, descriptor limit, systemd, lifecycle.
//! - [`rpc`]: gRPC services; proto input to [`model`] types, per-call accounting, every `tonic::Status`.
//! - [`auth`]: who the peer is, the access policies, per-client limits and the audit log.
//! - [`vault`]: key operations over the store, the TPM actor and in-core cryptography; no TPM or proto type.
//! - [`tpm`]: the actor thread and the connection it owns (the only `tss_esapi` code); the private swtpm.
//! - [`store`]: the state directory: crash-safe record tables, trusted only when nobody else can change it.
//! - [`crypto`]: in-core cryptography: verification, AEAD, streams, the DRBG, page tokens, post-quantum.
//! - [`observe`]: counters, the Prometheus endpoint, process figures, the batched log writer.
//! - [`model`]: validated domain types; [`error`]: the error type; [`config`]: configuration.
//! - `fuzzing` (hidden): the fuzz targets' way into parsers private to their modules.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs, missing_debug_implementations)]
// Two audited exceptions: `spawn` runs a close_range hook between fork and exec, and
// `auth::peer::peer_groups` reads SO_PEERGROUPS (getsockopt) into a buffer it owns.
#![deny(unsafe_code)]
// The layout above links the private modules; they resolve with `--document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

mod auth;
mod config;
mod crypto;
mod error;
pub mod model;
mod observe;
mod rpc;
mod serve;
mod store;
mod tpm;
mod vault;

pub use auth::Denied;
pub use error::{Busy, ChainArg, Error, Invalid, PcrArg, StreamArg, SubjectArg};
pub use tpm::{ClientKey, QueueConfig, TpmError};
pub use vault::{SealTarget, SignRequest, Vault, VaultConfig};

/// Running the daemon: what `tpm-vaultd` (`main.rs`) and the integration tests use to
/// configure, bind, serve and stop it, with the access policies, audit log and metrics they
/// wire in or check.
pub mod daemon {
    pub use crate::auth::audit::AuditLog;
    pub use crate::auth::limits::{ClientLimits, KeygenLimit, DEFAULT_PER_CLIENT};
    pub use crate::auth::{Access, Decision, GroupsSource, Identity, Operation, Policy, UnixIdentity};
    pub use crate::config::{
        check_audit_log, check_policies, check_state_dir, default_worker_threads, Args, Config, FileConfig, LogFormat,
        PolicyCheck, ResourceManagerSetting, ServeLimits,
    };
    pub use crate::observe::logwriter::{BatchedWriter, FlushGuard};
    pub use crate::observe::metrics::Metrics;
    pub use crate::observe::telemetry::MetricsSource;
    pub use crate::rpc::Ctx;
    pub use crate::serve::app::main;
    pub use crate::serve::fdlimit::{
        fit as fit_connections, planned as planned_nofile, raise as raise_nofile, Fitted, NoFile, FD_RESERVE,
    };
    pub use crate::serve::server::{
        activated_listener, bind_unix, run, serve_ctx, serve_ctx_with_tls, serve_with_limits, ServerError,
        HTTP2_MAX_FRAME,
    };
    pub use crate::serve::tls::{client_identity, provider, TlsListener};
    pub use crate::store::OwnerCheck;
    pub use crate::tpm::{DaState, PolicyAuth, ResourceManager};
    pub use crate::vault::seal::SignedPolicy;
    pub use crate::vault::{Client, LockoutConfig, Password};
}

/// The test and benchmark harness: a private swtpm per test, the port pair it listens on,
/// and children that inherit no TPM socket.
pub mod harness {
    pub use crate::tpm::simulator::{claim_port_pair, Swtpm};
    pub use crate::tpm::spawn::CloseInheritedFds;
}

/// Byte-level formats and checks the benches and fuzz targets use directly, without a vault.
/// (The encrypted stream format is `tpm_vault_proto::stream`.)
pub mod formats {
    pub use crate::tpm::KeyBlob;

    /// Post-quantum keys and signatures: sizes, SPKI encoding, hybrid verification.
    pub mod pq {
        pub use crate::crypto::pq::{ml_dsa_signing, ml_kem_sizes, raw_public_key, spki_der, verify_hybrid};
    }
    /// In-core signature verification (the Verify RPC's).
    pub mod verify {
        pub use crate::crypto::verify::verify_digest;
    }
    /// PCR selections and the policy digests sealed objects are bound to.
    pub mod pcr {
        pub use crate::tpm::pcr::{extended_value, policy_authorize_digest, policy_pcr_digest, selection_list};
    }
    /// The TPM object templates keys are created from.
    pub mod templates {
        pub use crate::tpm::templates::{attestation_key, external_p256, sealed, signing_key, srk};
    }
    /// Conversions between TPM structures and DER / signature schemes.
    pub mod convert {
        pub use crate::tpm::convert::{encode_signature, public_key_der, signature_scheme};
    }
    /// The state directory's record tables and their on-disk records.
    pub mod store {
        pub use crate::store::{
            DataKeyRecord, KeyRecord, PcrPolicy, Record, SealPolicy, SealedRecord, Store, TpmObject,
        };
    }
    /// Certificate subjects and the chains stored with keys.
    pub mod cert {
        pub use crate::vault::cert::{check_chain, parse_chain, CertSubject};
    }
    /// Signed PCR policies: the authority key and the approval check.
    pub mod seal {
        pub use crate::vault::seal::{authority_der, check_approval};
    }
}

/// Entry points for the fuzz targets (`fuzz/`) into parsers of untrusted input that are private
/// to their modules. Not an API: hidden from the docs, no stability promise, used by nothing
/// but `fuzz/`.
#[doc(hidden)]
pub mod fuzzing {
    use crate::error::Error;
    use crate::model::PcrTarget;
    use crate::observe::telemetry::Request;

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

    /// The strict parser of what an `ssh`-usage key may sign (`crypto::ssh`): SSH
    /// user-authentication requests and SSHSIG blobs, the check of a parsed request against a
    /// key, and a key's OpenSSH public key blob.
    pub mod ssh {
        pub use crate::crypto::ssh::{
            parse, parse_sshsig, parse_userauth, public_key_blob, signing_plan, SshDataError, SshSigned, Sshsig,
            UserAuth,
        };
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
