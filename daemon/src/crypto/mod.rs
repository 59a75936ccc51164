//! In-core cryptography: everything the vault does on the CPU instead of the TPM (signature
//! verification, the AEAD of the vault's envelopes, the stream format, the DRBG, opaque page
//! tokens, the post-quantum algorithms TPMs lack, and the strict parser of what an `ssh`-usage
//! key may sign). A firmware TPM is a vault, not an
//! accelerator: only private-key operations of TPM keys go to it.
//!
//! Randomness: every key and nonce the vault makes (sealed-secret and wrapping keys, data keys,
//! stream keys, ML-DSA seeds, envelope and token nonces, the page-token key, GetRandom) comes
//! from the one [`drbg::Drbg`], which the OS and the TPM's RNG seed. The exception is ML-KEM
//! key generation, which draws from aws-lc's own RNG (aws-lc-rs has no from-seed constructor
//! for it).

pub mod aead;
pub mod drbg;
pub mod pq;
pub mod ssh;
pub mod stream;
pub mod token;
pub mod verify;
