//! In-core cryptography: everything the vault does on the CPU instead of the TPM (signature
//! verification now; AEAD, DRBG and post-quantum algorithms as they land). A firmware TPM is a
//! vault, not an accelerator: only private-key operations go to it.

pub mod drbg;
pub mod stream;
pub mod verify;
