//! [`KeyAuth`]: a key's password (TPM auth value), held so that it is wiped from memory.
//!
//! Owns the length rule (1 to 32 bytes, the daemon's limit) and the hiding of the value from
//! `Debug`. It does not say where a password comes from: the CLI reads it from a file or the
//! environment (`cli::password`), programs from wherever they keep secrets.

use std::fmt;

use zeroize::Zeroizing;

use crate::Error;

/// The longest password the daemon accepts (the TPM's auth value size for SHA-256 names).
pub const MAX_KEY_AUTH: usize = 32;

/// A key's password: set at [`Client::create_key_with_auth`](crate::Client::create_key_with_auth),
/// needed by [`SignOptions::with_auth`](crate::SignOptions::with_auth) afterwards.
///
/// The bytes are zeroed when the value is dropped, and `Debug` never shows them. (The copy
/// put into the gRPC request is owned by the transport and is not zeroed; the daemon sends
/// the password to the TPM with parameter encryption.)
///
/// ```
/// use tpm_vault_client::KeyAuth;
///
/// let auth = KeyAuth::new(b"correct horse".to_vec())?;
/// assert_eq!(format!("{auth:?}"), "KeyAuth(..)");
/// assert!(KeyAuth::new(Vec::new()).is_err());
/// # Ok::<(), tpm_vault_client::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct KeyAuth(Zeroizing<Vec<u8>>);

impl KeyAuth {
    /// A password of 1 to [`MAX_KEY_AUTH`] bytes. `bytes` is moved in, not copied, so no
    /// unzeroed copy is left behind by this call.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty or too long password (which is then zeroed).
    pub fn new(bytes: impl Into<Zeroizing<Vec<u8>>>) -> Result<KeyAuth, Error> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(Error::InvalidInput("the key password is empty".to_owned()));
        }
        if bytes.len() > MAX_KEY_AUTH {
            return Err(Error::InvalidInput(format!(
                "the key password has {} bytes; at most {MAX_KEY_AUTH} are allowed",
                bytes.len()
            )));
        }
        Ok(KeyAuth(bytes))
    }

    /// The password bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for KeyAuth {
    /// Never shows the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyAuth(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_limits() {
        assert!(KeyAuth::new(vec![b'x'; 1]).is_ok());
        assert!(KeyAuth::new(vec![b'x'; MAX_KEY_AUTH]).is_ok());
        let err = KeyAuth::new(vec![b'x'; MAX_KEY_AUTH + 1]).unwrap_err();
        assert_eq!(err.to_string(), "the key password has 33 bytes; at most 32 are allowed");
        assert_eq!(KeyAuth::new(Vec::new()).unwrap_err().to_string(), "the key password is empty");
    }

    #[test]
    fn debug_hides_the_password() {
        let auth = KeyAuth::new(b"hunter2".to_vec()).unwrap();
        assert!(!format!("{auth:?}").contains("hunter2"));
        assert_eq!(auth.bytes(), b"hunter2");
    }
}
