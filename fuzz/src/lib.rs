//! Fixtures shared by the fuzz targets and by `tests/seeds.rs`, which writes the seed corpora
//! under `corpus/<target>/`: fixed keys and names, so that a seed made by the test is a valid
//! input for its target (and the fuzzer starts from inputs that reach the deep code paths).
#![forbid(unsafe_code)]

use std::sync::OnceLock;

use p256::pkcs8::EncodePublicKey;

/// The key name every key-record seed uses (`from_bytes` checks the record names its file).
pub const RECORD_NAME: &str = "fuzz";

/// The data key of the `aead_stream` target.
pub const STREAM_KEY: [u8; 32] = [0x5a; 32];

/// The associated data (`context`) of the `aead_stream` target.
pub const STREAM_CONTEXT: &[u8] = b"fuzz-context";

/// `min_policy_version` the `signed_policy` target checks approvals against: seeds with a lower
/// version exercise the "revoked" path, the others the accepted one.
pub const MIN_POLICY_VERSION: u64 = 2;

/// The policy authority of the `signed_policy` target: a fixed P-256 key, so that seeds signed
/// by `tests/seeds.rs` verify.
pub fn authority() -> p256::ecdsa::SigningKey {
    // invariant: 0x01..0x20 is a valid P-256 scalar (non-zero, below the group order).
    let scalar: [u8; 32] = std::array::from_fn(|i| i as u8 + 1);
    p256::ecdsa::SigningKey::from_slice(&scalar).unwrap_or_else(|e| panic!("fixed authority key: {e}"))
}

/// [`authority`]'s DER SubjectPublicKeyInfo (what a sealed record stores).
pub fn authority_spki() -> &'static [u8] {
    static SPKI: OnceLock<Vec<u8>> = OnceLock::new();
    SPKI.get_or_init(|| {
        authority()
            .verifying_key()
            .to_public_key_der()
            .map(|d| d.as_bytes().to_vec())
            .unwrap_or_else(|e| panic!("authority SPKI: {e}"))
    })
}

/// The ML-DSA-65 half of the `hybrid_signature` target's key (from a fixed seed), so that
/// seeds signed by `tests/seeds.rs` verify.
pub fn ml_dsa_65() -> &'static aws_lc_rs::signature::PqdsaKeyPair {
    static KEY: OnceLock<aws_lc_rs::signature::PqdsaKeyPair> = OnceLock::new();
    KEY.get_or_init(|| {
        aws_lc_rs::signature::PqdsaKeyPair::from_seed(&aws_lc_rs::signature::ML_DSA_65_SIGNING, &[0x65; 32])
            .unwrap_or_else(|e| panic!("fixed ML-DSA-65 key: {e}"))
    })
}

/// The message length prefix of the `hybrid_signature` target's inputs: 2 bytes, big-endian,
/// then the message, then the signature.
pub fn split_message(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = data.split_first_chunk::<2>()?;
    rest.split_at_checked(usize::from(u16::from_be_bytes(*len)))
}

/// Splits `len` bytes into pieces whose sizes follow `seed` (1 to 4096 bytes, mostly small):
/// how a network peer's message boundaries fall. Deterministic for a given seed.
pub fn pieces(seed: u64, len: usize) -> Vec<usize> {
    let mut state = seed | 1;
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let size = match state % 4 {
            0 => 1 + (state >> 8) as usize % 4,
            1 => 1 + (state >> 8) as usize % 64,
            2 => 1 + (state >> 8) as usize % 1024,
            _ => 1 + (state >> 8) as usize % 4096,
        };
        let size = size.min(left);
        out.push(size);
        left -= size;
    }
    out
}

/// The FIPS 203 section 7.2 check of an ML-KEM-768 (else ML-KEM-1024) encapsulation key, the
/// fuzz targets' oracle, written out independently of the code under test:
/// `ByteEncode12(ByteDecode12(ek[..384k])) == ek[..384k]` with coefficients reduced mod q.
pub fn fips203_ok(ml_kem_768: bool, ek: &[u8]) -> bool {
    let k = if ml_kem_768 { 3 } else { 4 };
    if ek.len() != 384 * k + 32 {
        return false;
    }
    let mut bits = 0u32;
    let mut n = 0;
    let mut coefficients = Vec::new();
    for &b in &ek[..384 * k] {
        bits |= u32::from(b) << n;
        n += 8;
        while n >= 12 {
            coefficients.push((bits & 0xfff) % 3329);
            bits >>= 12;
            n -= 12;
        }
    }
    let mut again = Vec::new();
    for pair in coefficients.chunks(2) {
        let v = pair[0] | (pair[1] << 12);
        again.extend_from_slice(&v.to_le_bytes()[..3]);
    }
    again == ek[..384 * k]
}
