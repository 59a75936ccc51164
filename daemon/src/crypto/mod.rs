//! In-core cryptography: everything the vault does on the CPU instead of the TPM (signature
//! verification, the AEAD stream format, the DRBG, and the post-quantum algorithms TPMs lack).
//! A firmware TPM is a vault, not an accelerator: only private-key operations of TPM keys go to
//! it.

pub mod drbg;
pub mod pq;
pub mod stream;
pub mod verify;
