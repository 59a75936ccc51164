//! Sign and verify inputs and outputs, and the in-core hashing of large messages.
//!
//! The daemon hashes a message itself when it is sent whole, but a gRPC message has a size
//! limit, so messages above [`INLINE_MESSAGE_LIMIT`] are hashed here and sent as a digest; the
//! signature is the same either way. This module does not talk to the daemon.

use std::fmt;
use std::io::{self, Write};

use sha2::Digest as _;
use tpm_vault_proto::v1 as proto;

use crate::names::Named;
use crate::{HashAlgorithm, KeyAuth, SignPurpose, SignatureScheme};

/// Messages up to this size are sent whole; larger ones are hashed on the client.
///
/// Well under the daemon's 4 MiB limit, so request framing never pushes a message over it.
pub const INLINE_MESSAGE_LIMIT: usize = 1024 * 1024;

/// The largest message the daemon signs whole (ML-DSA and hybrid keys sign nothing else).
pub const MAX_WHOLE_MESSAGE: usize = 4 * 1024 * 1024;

/// What is signed (or was signed, for verification).
#[derive(Clone, PartialEq, Eq)]
pub enum SignInput {
    /// The message itself. It is hashed with the chosen hash, by the daemon or, when larger than
    /// 1 MiB, by the client; the TPM only ever sees the digest. ML-DSA and hybrid keys sign the
    /// whole message (at most 4 MiB) in the daemon.
    Message(Vec<u8>),
    /// A precomputed digest; its length must match the hash (32 bytes for SHA-256, 48 for
    /// SHA-384). Not for ML-DSA or hybrid keys.
    Digest(Vec<u8>),
}

impl SignInput {
    /// The input's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            SignInput::Message(bytes) | SignInput::Digest(bytes) => bytes.len(),
        }
    }

    /// True when the input is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn into_sign_proto(self) -> proto::sign_request::Input {
        match self {
            SignInput::Message(bytes) => proto::sign_request::Input::Message(bytes),
            SignInput::Digest(bytes) => proto::sign_request::Input::Digest(bytes),
        }
    }

    pub(crate) fn into_verify_proto(self) -> proto::verify_request::Input {
        match self {
            SignInput::Message(bytes) => proto::verify_request::Input::Message(bytes),
            SignInput::Digest(bytes) => proto::verify_request::Input::Digest(bytes),
        }
    }
}

impl fmt::Debug for SignInput {
    /// Shows the kind and length only: the content may be private.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignInput::Message(bytes) => write!(f, "Message({} bytes)", bytes.len()),
            SignInput::Digest(bytes) => write!(f, "Digest({} bytes)", bytes.len()),
        }
    }
}

/// How to sign or verify: hash and scheme. The defaults let the daemon choose.
///
/// ```
/// use tpm_vault_client::{HashAlgorithm, SignOptions, SignatureScheme};
///
/// let options = SignOptions::new()
///     .with_hash(HashAlgorithm::Sha384)
///     .with_scheme(SignatureScheme::RsaPss);
/// assert_eq!(options.hash(), HashAlgorithm::Sha384);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SignOptions {
    /// `Unspecified` = the key's natural hash (SHA-384 for P-384 keys, SHA-256 otherwise).
    hash: HashAlgorithm,
    /// `Unspecified` = ECDSA for ECC keys, RSA-PSS for RSA keys.
    scheme: SignatureScheme,
    /// The key's password, for keys created with one; ignored by verification.
    auth: Option<KeyAuth>,
    /// What the message is (`Unspecified`: a raw signature); ignored by verification.
    purpose: SignPurpose,
}

impl SignOptions {
    /// Options that let the daemon choose the hash and the scheme.
    pub fn new() -> SignOptions {
        SignOptions::default()
    }

    /// Uses this hash algorithm.
    pub fn with_hash(mut self, hash: HashAlgorithm) -> SignOptions {
        self.hash = hash;
        self
    }

    /// Uses this signature scheme.
    pub fn with_scheme(mut self, scheme: SignatureScheme) -> SignOptions {
        self.scheme = scheme;
        self
    }

    /// Signs with a key that has a password (see
    /// [`Client::create_key_with_auth`](crate::Client::create_key_with_auth)).
    pub fn with_auth(mut self, auth: KeyAuth) -> SignOptions {
        self.auth = Some(auth);
        self
    }

    /// Says what the message is: [`SignPurpose::Ssh`] for an SSH user-authentication request
    /// or SSHSIG blob, which a key with the `ssh` usage signs (the daemon parses it; the input
    /// must be the whole message). The default, `Unspecified`, is a raw signature (usage `sign`).
    pub fn with_purpose(mut self, purpose: SignPurpose) -> SignOptions {
        self.purpose = purpose;
        self
    }

    /// What the message is (see [`SignOptions::with_purpose`]).
    pub fn purpose(&self) -> SignPurpose {
        self.purpose
    }

    /// The hash algorithm (`Unspecified` = the key's natural hash).
    pub fn hash(&self) -> HashAlgorithm {
        self.hash
    }

    /// The signature scheme (`Unspecified` = the key's natural scheme).
    pub fn scheme(&self) -> SignatureScheme {
        self.scheme
    }

    /// The key's password, if one was given.
    pub fn auth(&self) -> Option<&KeyAuth> {
        self.auth.as_ref()
    }
}

/// A signature, with the hash and scheme the daemon actually used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// DER `ECDSA-Sig-Value` for ECDSA, the raw signature for RSA.
    bytes: Vec<u8>,
    /// Reported so that callers who left it unspecified know what they got.
    scheme: SignatureScheme,
    /// Reported so that callers who left it unspecified know what they got.
    hash: HashAlgorithm,
}

impl Signature {
    /// The signature bytes: DER `ECDSA-Sig-Value` for ECDSA (as OpenSSL and rustls expect), the
    /// raw signature for RSA.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Takes the signature bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The scheme used.
    pub fn scheme(&self) -> SignatureScheme {
        self.scheme
    }

    /// The hash used.
    pub fn hash(&self) -> HashAlgorithm {
        self.hash
    }
}

impl From<proto::SignResponse> for Signature {
    fn from(response: proto::SignResponse) -> Signature {
        Signature { scheme: response.scheme(), hash: response.hash(), bytes: response.signature }
    }
}

/// An incremental hash, for messages hashed on the client (also a [`Write`] sink, so a file can
/// be streamed into it with `io::copy`). SHA-1 is not offered: the vault takes SHA-1 only as a
/// digest the caller made (see `HashAlgorithm::Sha1`).
#[derive(Clone, Debug)]
pub enum Hasher {
    /// SHA-256.
    Sha256(sha2::Sha256),
    /// SHA-384.
    Sha384(sha2::Sha384),
    /// SHA-512.
    Sha512(sha2::Sha512),
}

impl Hasher {
    /// A hasher for `hash`, which must be specified (resolve `Unspecified` first).
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for `Unspecified` and SHA-1.
    pub fn new(hash: HashAlgorithm) -> Result<Hasher, crate::Error> {
        match hash {
            HashAlgorithm::Sha256 => Ok(Hasher::Sha256(sha2::Sha256::new())),
            HashAlgorithm::Sha384 => Ok(Hasher::Sha384(sha2::Sha384::new())),
            HashAlgorithm::Sha512 => Ok(Hasher::Sha512(sha2::Sha512::new())),
            HashAlgorithm::Unspecified | HashAlgorithm::Sha1 => {
                Err(crate::Error::InvalidInput(format!("cannot hash with an {} hash algorithm", hash.name())))
            }
        }
    }

    /// Adds data.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha384(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }

    /// The digest.
    pub fn finish(self) -> Vec<u8> {
        match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha384(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
        }
    }

    /// The digest's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Hasher::Sha256(_) => 32,
            Hasher::Sha384(_) => 48,
            Hasher::Sha512(_) => 64,
        }
    }

    /// Never true: a digest has at least 32 bytes (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Write for Hasher {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_content() {
        let input = SignInput::Message(b"secret".to_vec());
        assert_eq!(format!("{input:?}"), "Message(6 bytes)");
        assert_eq!(input.len(), 6);
    }

    #[test]
    fn hasher_matches_sha2() {
        let mut h = Hasher::new(HashAlgorithm::Sha256).unwrap();
        h.update(b"ab");
        h.write_all(b"c").unwrap();
        assert_eq!(h.finish(), sha2::Sha256::digest(b"abc").to_vec());
        let h = Hasher::new(HashAlgorithm::Sha384).unwrap();
        assert_eq!(h.finish().len(), 48);
        assert!(Hasher::new(HashAlgorithm::Unspecified).is_err());
    }

    #[test]
    fn options_default_to_unspecified() {
        let o = SignOptions::new();
        assert_eq!(o.hash(), HashAlgorithm::Unspecified);
        assert_eq!(o.scheme(), SignatureScheme::Unspecified);
    }
}
