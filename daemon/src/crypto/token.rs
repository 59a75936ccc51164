//! Opaque tokens: a position the daemon hands a client and later takes back (ListKeys' page
//! token), AES-256-GCM-encrypted under a key drawn once per daemon from the DRBG and kept in
//! memory only. A client can neither read a token (it may name a record the client may not
//! see) nor make or alter one: what does not authenticate under this daemon's key, with the
//! purpose and the caller it was issued to as associated data, is refused. Tokens do not
//! survive a restart of the daemon (a listing then starts over).

use zeroize::Zeroizing;

use super::aead::{self, NONCE_LEN};
use super::drbg::Drbg;
use crate::error::Error;

/// Longest token accepted (hex): far above any token issued (a 64-byte key name makes 184
/// characters), so a huge string is refused before it is decoded.
const MAX_TOKEN: usize = 512;

/// The per-daemon token key.
pub struct TokenKey {
    key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKey").finish_non_exhaustive()
    }
}

impl TokenKey {
    /// A fresh key from `drbg`.
    ///
    /// # Errors
    /// [`Error::Internal`] if the DRBG fails.
    pub fn new(drbg: &Drbg) -> Result<Self, Error> {
        let mut key = Zeroizing::new([0u8; 32]);
        drbg.fill(key.as_mut())?;
        Ok(Self { key })
    }

    /// A token carrying `plain` for the caller and purpose `binding` (hex of a fresh nonce and
    /// the ciphertext).
    ///
    /// # Errors
    /// [`Error::Internal`] if the DRBG or the cipher fails.
    pub fn seal(&self, drbg: &Drbg, binding: &[u8], plain: &[u8]) -> Result<String, Error> {
        let mut nonce = [0u8; NONCE_LEN];
        drbg.fill(&mut nonce)?;
        let sealed = aead::seal(&self.key, nonce, binding, plain)?;
        let mut token = hex::encode(nonce);
        token.push_str(&hex::encode(sealed));
        Ok(token)
    }

    /// What a token [`TokenKey::seal`] made for `binding` carries; `None` for anything else
    /// (another daemon's or caller's token, an altered or made-up one).
    pub fn open(&self, binding: &[u8], token: &str) -> Option<Zeroizing<Vec<u8>>> {
        if token.len() > MAX_TOKEN {
            return None;
        }
        let bytes = hex::decode(token).ok()?;
        let (nonce, sealed) = bytes.split_at_checked(NONCE_LEN)?;
        aead::open(&self.key, nonce, binding, sealed, "token").ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_only_for_its_binding_under_its_key() {
        let drbg = Drbg::new(&[]).unwrap_or_else(|e| panic!("{e}"));
        let key = TokenKey::new(&drbg).unwrap_or_else(|e| panic!("{e}"));
        let token = key.seal(&drbg, b"uid 1000", b"web-1").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(key.open(b"uid 1000", &token).map(|p| p.to_vec()), Some(b"web-1".to_vec()));
        assert!(!token.contains(&hex::encode(b"web-1")), "the position is not readable");
        assert!(key.open(b"uid 1001", &token).is_none(), "another caller");
        let other = TokenKey::new(&drbg).unwrap_or_else(|e| panic!("{e}"));
        assert!(other.open(b"uid 1000", &token).is_none(), "another daemon");
        let mut altered = token.clone().into_bytes();
        altered[30] = if altered[30] == b'0' { b'1' } else { b'0' };
        assert!(key.open(b"uid 1000", &String::from_utf8_lossy(&altered)).is_none(), "altered");
        for made_up in ["", "web-1", "00", "ab".repeat(40).as_str(), "0".repeat(MAX_TOKEN + 2).as_str()] {
            assert!(key.open(b"uid 1000", made_up).is_none(), "{made_up:?}");
        }
        assert_ne!(key.seal(&drbg, b"uid 1000", b"web-1").ok(), Some(token), "fresh nonce each time");
    }
}
