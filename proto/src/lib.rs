//! `tpmvault.v1`: the tpm-vault gRPC API.
//!
//! The `.proto` files live in `proto/tpmvault/v1/`; the Rust code in `src/gen/` is generated from
//! them by `tests/bootstrap.rs` (run `cargo test -p tpm-vault-proto` after editing a `.proto` and
//! commit the result), so building needs no `protoc`.
#![deny(missing_debug_implementations)]
#![forbid(unsafe_code)]

/// Version 1 of the API.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!("gen/tpmvault.v1.rs");

    /// Encoded `FileDescriptorSet` of the API, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("gen/tpmvault_descriptor.bin");
}

/// The byte strings a policy authority signs in a [`v1::SignedPolicy`] (ECDSA P-256 with
/// SHA-256 over each). Shared by the daemon (which checks them) and the CLI (which signs).
pub mod signed_policy {
    /// Domain separator of the envelope signature.
    pub const ENVELOPE_CONTEXT: &[u8] = b"tpm-vault-policy-v1";

    /// What `signature` covers: `approved_policy || policy_ref`, the message whose SHA-256 the
    /// TPM checks in `TPM2_VerifySignature` before `TPM2_PolicyAuthorize`.
    pub fn approval_message(approved_policy: &[u8], policy_ref: &[u8]) -> Vec<u8> {
        [approved_policy, policy_ref].concat()
    }

    /// What `envelope_signature` covers: the context string, the approval, and the version and
    /// expiry the daemon enforces.
    pub fn envelope_message(approved_policy: &[u8], policy_ref: &[u8], version: u64, expires_unix: i64) -> Vec<u8> {
        [ENVELOPE_CONTEXT, approved_policy, policy_ref, &version.to_be_bytes(), &expires_unix.to_be_bytes()].concat()
    }
}
