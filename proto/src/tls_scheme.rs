//! The TLS 1.3 signature schemes a vault key signs handshakes with, for the daemon's in-process
//! TLS key and the client's: which hash and signature each means (which schemes a key offers is
//! in [`crate::algorithm`]). Keyed by the IANA `SignatureScheme` code, which rustls's
//! `SignatureScheme` converts from and to (`u16`), so this crate needs no TLS library. RSA keys
//! do PSS only (TLS 1.3 has no PKCS#1 v1.5 handshake signatures), with salt = hash length.

use crate::v1::{HashAlgorithm, SignatureScheme};

/// `ecdsa_secp256r1_sha256`.
pub const ECDSA_NISTP256_SHA256: u16 = 0x0403;
/// `ecdsa_secp384r1_sha384`.
pub const ECDSA_NISTP384_SHA384: u16 = 0x0503;
/// `rsa_pss_rsae_sha256`.
pub const RSA_PSS_SHA256: u16 = 0x0804;
/// `rsa_pss_rsae_sha384`.
pub const RSA_PSS_SHA384: u16 = 0x0805;

/// What scheme `code` asks of the key: the hash and the vault signature scheme; `None` for a
/// scheme no vault key offers.
pub fn meaning(code: u16) -> Option<(HashAlgorithm, SignatureScheme)> {
    match code {
        ECDSA_NISTP256_SHA256 => Some((HashAlgorithm::Sha256, SignatureScheme::Ecdsa)),
        ECDSA_NISTP384_SHA384 => Some((HashAlgorithm::Sha384, SignatureScheme::Ecdsa)),
        RSA_PSS_SHA256 => Some((HashAlgorithm::Sha256, SignatureScheme::RsaPss)),
        RSA_PSS_SHA384 => Some((HashAlgorithm::Sha384, SignatureScheme::RsaPss)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_have_their_meanings() {
        assert_eq!(meaning(ECDSA_NISTP384_SHA384), Some((HashAlgorithm::Sha384, SignatureScheme::Ecdsa)));
        assert_eq!(meaning(0x0401), None, "rsa_pkcs1_sha256 is not a TLS 1.3 handshake scheme");
    }
}
