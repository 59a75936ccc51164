//! The TLS 1.3 signature schemes a vault key signs handshakes with, one table for the daemon's
//! in-process TLS key and the client's: which schemes a key offers (best first) and which hash
//! and signature each means. Keyed by the IANA `SignatureScheme` code, which rustls's
//! `SignatureScheme` converts from and to (`u16`), so this crate needs no TLS library. RSA keys
//! do PSS only (TLS 1.3 has no PKCS#1 v1.5 handshake signatures), with salt = hash length.

/// `ecdsa_secp256r1_sha256`.
pub const ECDSA_NISTP256_SHA256: u16 = 0x0403;
/// `ecdsa_secp384r1_sha384`.
pub const ECDSA_NISTP384_SHA384: u16 = 0x0503;
/// `rsa_pss_rsae_sha256`.
pub const RSA_PSS_SHA256: u16 = 0x0804;
/// `rsa_pss_rsae_sha384`.
pub const RSA_PSS_SHA384: u16 = 0x0805;

/// The kinds of vault key that sign TLS handshakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// ECC P-256.
    EccP256,
    /// ECC P-384.
    EccP384,
    /// RSA of any size the vault makes.
    Rsa,
}

/// The digest a scheme signs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
}

/// The signature a scheme asks of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signature {
    /// ECDSA.
    Ecdsa,
    /// RSASSA-PSS.
    RsaPss,
}

/// The schemes a key of `kind` offers, best first.
pub fn offered(kind: KeyKind) -> &'static [u16] {
    match kind {
        KeyKind::EccP256 => &[ECDSA_NISTP256_SHA256],
        KeyKind::EccP384 => &[ECDSA_NISTP384_SHA384],
        KeyKind::Rsa => &[RSA_PSS_SHA256, RSA_PSS_SHA384],
    }
}

/// What scheme `code` means; `None` for a scheme no vault key offers.
pub fn meaning(code: u16) -> Option<(Hash, Signature)> {
    match code {
        ECDSA_NISTP256_SHA256 => Some((Hash::Sha256, Signature::Ecdsa)),
        ECDSA_NISTP384_SHA384 => Some((Hash::Sha384, Signature::Ecdsa)),
        RSA_PSS_SHA256 => Some((Hash::Sha256, Signature::RsaPss)),
        RSA_PSS_SHA384 => Some((Hash::Sha384, Signature::RsaPss)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offered_scheme_has_a_meaning_that_fits_its_key() {
        for (kind, sig) in [
            (KeyKind::EccP256, Signature::Ecdsa),
            (KeyKind::EccP384, Signature::Ecdsa),
            (KeyKind::Rsa, Signature::RsaPss),
        ] {
            for &code in offered(kind) {
                assert_eq!(meaning(code).map(|(_, s)| s), Some(sig), "{code:#06x}");
            }
        }
        assert_eq!(meaning(ECDSA_NISTP384_SHA384), Some((Hash::Sha384, Signature::Ecdsa)));
        assert_eq!(meaning(0x0401), None, "rsa_pkcs1_sha256 is not a TLS 1.3 handshake scheme");
    }
}
