//! The rustls signing key of a vault key, one implementation for the daemon's in-process TLS
//! key (which signs through its TPM actor) and the client library's (which signs through the
//! daemon): which TLS 1.3 schemes a key offers ([`crate::algorithm`]), what each asks of the key
//! ([`crate::tls_scheme`]), and the synchronous wait that is safe on either tokio runtime
//! flavour ([`wait_blocking`]). How a signature is made is the [`SignMessage`] implementation's
//! business. Built with the `rustls` feature.
//!
//! rustls' `Signer::sign` is synchronous and runs on whichever thread polls the handshake, so a
//! signature must be made elsewhere (the TPM actor's thread, a client on its own runtime) and
//! waited for with [`wait_blocking`].

use std::fmt;
use std::sync::Arc;

use rustls::pki_types::SubjectPublicKeyInfoDer;
use rustls::sign::{Signer, SigningKey};
use rustls::{SignatureAlgorithm, SignatureScheme};

use crate::algorithm::{Algorithm, Family};
use crate::tls_scheme;
use crate::v1::{HashAlgorithm, KeyAlgorithm, SignatureScheme as VaultScheme};

/// Signs a handshake message with a vault key, blocking the calling thread until the signature
/// is there (as rustls' `Signer::sign` must).
pub trait SignMessage: fmt::Debug + Send + Sync + 'static {
    /// Signs `message` (unhashed) with `hash` and `scheme`.
    ///
    /// # Errors
    /// The rustls error that fails the handshake.
    fn sign_message(&self, message: &[u8], hash: HashAlgorithm, scheme: VaultScheme) -> Result<Vec<u8>, rustls::Error>;
}

/// A rustls signing key whose private half is the vault key that `S` signs with.
#[derive(Debug)]
pub struct TlsKey<S> {
    signer: Arc<S>,
    algorithm: &'static Algorithm,
    /// DER SubjectPublicKeyInfo, for `CertifiedKey::keys_match`.
    spki: Vec<u8>,
}

impl<S> Clone for TlsKey<S> {
    fn clone(&self) -> Self {
        Self { signer: self.signer.clone(), algorithm: self.algorithm, spki: self.spki.clone() }
    }
}

impl<S: SignMessage> TlsKey<S> {
    /// The signing key of a vault key of `algorithm` with public key `spki`; `None` when keys of
    /// `algorithm` cannot sign TLS 1.3 handshakes (ML-DSA, ML-KEM, hybrid).
    pub fn new(signer: S, algorithm: KeyAlgorithm, spki: Vec<u8>) -> Option<Self> {
        let algorithm = algorithm.info().filter(|a| !a.tls_schemes.is_empty())?;
        Some(Self { signer: Arc::new(signer), algorithm, spki })
    }

    /// What signs.
    pub fn signer(&self) -> &S {
        &self.signer
    }
}

impl<S: SignMessage> SigningKey for TlsKey<S> {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        let scheme =
            self.algorithm.tls_schemes.iter().map(|&code| SignatureScheme::from(code)).find(|s| offered.contains(s))?;
        Some(Box::new(TlsSigner { signer: self.signer.clone(), scheme }))
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        Some(SubjectPublicKeyInfoDer::from(self.spki.as_slice()))
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        if self.algorithm.family == Family::Rsa {
            SignatureAlgorithm::RSA
        } else {
            SignatureAlgorithm::ECDSA
        }
    }
}

/// One handshake's signer.
#[derive(Debug)]
struct TlsSigner<S> {
    signer: Arc<S>,
    scheme: SignatureScheme,
}

impl<S: SignMessage> Signer for TlsSigner<S> {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let Some((hash, scheme)) = tls_scheme::meaning(u16::from(self.scheme)) else {
            return Err(rustls::Error::General(format!("unsupported signature scheme {:?}", self.scheme)));
        };
        self.signer.sign_message(message, hash, scheme)
    }

    fn scheme(&self) -> SignatureScheme {
        self.scheme
    }
}

/// Runs `wait`, a blocking wait for a signature made on another thread, in the way that is safe
/// where it is called: inside `block_in_place` on a multi-thread tokio runtime (the worker's
/// other tasks move elsewhere meanwhile), plainly on a current-thread runtime or outside any
/// runtime, where `block_in_place` would panic.
pub fn wait_blocking<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if matches!(h.runtime_flavor(), tokio::runtime::RuntimeFlavor::MultiThread) => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Echo;

    impl SignMessage for Echo {
        fn sign_message(
            &self,
            message: &[u8],
            hash: HashAlgorithm,
            scheme: VaultScheme,
        ) -> Result<Vec<u8>, rustls::Error> {
            Ok([message, &[hash as u8, scheme as u8]].concat())
        }
    }

    #[test]
    fn the_scheme_codes_are_rustls_schemes() {
        assert_eq!(SignatureScheme::from(tls_scheme::ECDSA_NISTP256_SHA256), SignatureScheme::ECDSA_NISTP256_SHA256);
        assert_eq!(SignatureScheme::from(tls_scheme::ECDSA_NISTP384_SHA384), SignatureScheme::ECDSA_NISTP384_SHA384);
        assert_eq!(SignatureScheme::from(tls_scheme::RSA_PSS_SHA256), SignatureScheme::RSA_PSS_SHA256);
        assert_eq!(SignatureScheme::from(tls_scheme::RSA_PSS_SHA384), SignatureScheme::RSA_PSS_SHA384);
    }

    #[test]
    fn offers_the_tables_schemes_and_passes_their_meaning() {
        assert!(TlsKey::new(Echo, KeyAlgorithm::MlDsa65, vec![]).is_none());
        assert!(TlsKey::new(Echo, KeyAlgorithm::Unspecified, vec![]).is_none());
        let p384 = TlsKey::new(Echo, KeyAlgorithm::EccP384, vec![1]).unwrap();
        assert_eq!(p384.algorithm(), SignatureAlgorithm::ECDSA);
        assert!(p384.choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256]).is_none());
        let signer = p384.choose_scheme(&[SignatureScheme::ECDSA_NISTP384_SHA384]).unwrap();
        assert_eq!(signer.sign(b"m").unwrap(), [b'm', HashAlgorithm::Sha384 as u8, VaultScheme::Ecdsa as u8]);
        let rsa = TlsKey::new(Echo, KeyAlgorithm::Rsa2048, vec![]).unwrap();
        assert_eq!(rsa.algorithm(), SignatureAlgorithm::RSA);
        assert!(rsa.choose_scheme(&[SignatureScheme::RSA_PKCS1_SHA256]).is_none());
        let offered = [SignatureScheme::RSA_PSS_SHA384, SignatureScheme::RSA_PSS_SHA256];
        assert_eq!(rsa.choose_scheme(&offered).unwrap().scheme(), SignatureScheme::RSA_PSS_SHA256, "best first");
        assert_eq!(wait_blocking(|| 7), 7);
    }
}
