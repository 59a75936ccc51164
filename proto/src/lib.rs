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
