//! AES-256-GCM for the vault's envelopes: a payload encrypted in-core under a 256-bit key that
//! a TPM sealed object holds (sealed secrets, post-quantum private keys). One place for the
//! cipher, so every envelope uses the same construction; the nonce is the caller's (96 bits from
//! the vault's DRBG, never reused: every envelope has a key of its own). Streams have their own
//! format in [`super::stream`].

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use zeroize::Zeroizing;

use crate::error::Error;

/// Nonce length (96 bits).
pub const NONCE_LEN: usize = 12;

/// Encrypts `plain` under `key` with `aad` as associated data: ciphertext and tag.
///
/// # Errors
/// [`Error::Internal`] if the cipher fails (it does not for these sizes).
pub fn seal(key: &[u8; 32], nonce: [u8; NONCE_LEN], aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, Error> {
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).map_err(|_| Error::Internal("AES key".into()))?);
    let mut buf = Zeroizing::new(plain.to_vec());
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut *buf)
        .map_err(|_| Error::Internal("AES-GCM seal".into()))?;
    Ok(std::mem::take(&mut *buf))
}

/// Decrypts what [`seal`] made, into a buffer wiped on drop. `what` names the payload in the
/// error.
///
/// # Errors
/// [`Error::Internal`] when it does not authenticate (a damaged state file: the key came from
/// the TPM, the nonce and ciphertext from the record).
pub fn open(
    key: &[u8; 32],
    nonce: &[u8],
    aad: &[u8],
    ciphertext: &[u8],
    what: &str,
) -> Result<Zeroizing<Vec<u8>>, Error> {
    let corrupt = || Error::Internal(format!("{what} does not authenticate (state file damaged?)"));
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).map_err(|_| corrupt())?);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| corrupt())?;
    let mut buf = Zeroizing::new(ciphertext.to_vec());
    let len = key.open_in_place(nonce, Aad::from(aad), buf.as_mut_slice()).map_err(|_| corrupt())?.len();
    buf.truncate(len);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_what_it_sealed_and_nothing_else() {
        let key = [7u8; 32];
        let sealed = seal(&key, [1; NONCE_LEN], b"name", b"secret").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sealed.len(), 6 + 16);
        let open_with = |k: &[u8; 32], n: &[u8], aad: &[u8], c: &[u8]| open(k, n, aad, c, "test payload");
        assert_eq!(
            open_with(&key, &[1; NONCE_LEN], b"name", &sealed).map(|p| p.to_vec()).ok(),
            Some(b"secret".to_vec())
        );
        assert!(open_with(&[8; 32], &[1; NONCE_LEN], b"name", &sealed).is_err(), "other key");
        assert!(open_with(&key, &[2; NONCE_LEN], b"name", &sealed).is_err(), "other nonce");
        assert!(open_with(&key, &[1; NONCE_LEN], b"other", &sealed).is_err(), "other associated data");
        assert!(open_with(&key, &[1; 8], b"name", &sealed).is_err(), "short nonce");
        let mut flipped = sealed.clone();
        flipped[0] ^= 1;
        assert!(open_with(&key, &[1; NONCE_LEN], b"name", &flipped).is_err(), "tampered");
    }
}
