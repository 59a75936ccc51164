//! The one table of the vault's key algorithms: for each [`KeyAlgorithm`], its name, what the
//! TPM holds (the curve or modulus size the daemon builds a TPM template from), its sealed
//! post-quantum part, the schemes it signs with and their default, the hash used when a caller
//! names none, its signature length, its OIDs, its TLS 1.3 signature schemes and its SSH key
//! type. The daemon, the client library, the CLI and the PKCS#11 module read these facts here
//! instead of matching on algorithm variants each.
//!
//! It holds data only: no TPM types (the daemon turns [`TpmKey`] into a tss-esapi template) and
//! no cryptography.

pub use crate::ml_dsa::ParameterSet;
use crate::tls_scheme;
use crate::v1::{HashAlgorithm, KeyAlgorithm, SignatureScheme};

/// What kind of key an algorithm makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// ECDSA, generated inside the TPM.
    Ecc,
    /// RSA, generated inside the TPM.
    Rsa,
    /// ML-DSA (FIPS 204), generated in-core and sealed by the TPM.
    MlDsa,
    /// ML-KEM (FIPS 203), generated in-core and sealed by the TPM; it decapsulates, never signs.
    MlKem,
    /// An ECC P-256 key in the TPM paired with a sealed ML-DSA-65 key.
    Hybrid,
}

/// A NIST curve the TPM makes keys on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curve {
    /// NIST P-256 (secp256r1).
    NistP256,
    /// NIST P-384 (secp384r1).
    NistP384,
}

impl Curve {
    /// Bytes in one coordinate or scalar (an ECDSA `r`, `s`).
    pub const fn field_len(self) -> usize {
        match self {
            Self::NistP256 => 32,
            Self::NistP384 => 48,
        }
    }

    /// The named-curve OID.
    pub const fn oid(self) -> &'static str {
        match self {
            Self::NistP256 => "1.2.840.10045.3.1.7",
            Self::NistP384 => "1.3.132.0.34",
        }
    }

    /// DER of the named-curve OID (PKCS#11 `CKA_EC_PARAMS`).
    pub const fn oid_der(self) -> &'static [u8] {
        match self {
            Self::NistP256 => &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
            Self::NistP384 => &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22],
        }
    }

    /// The curve's SSH name (`nistp256`), the second field of its OpenSSH key blob.
    pub const fn ssh_name(self) -> &'static str {
        match self {
            Self::NistP256 => "nistp256",
            Self::NistP384 => "nistp384",
        }
    }

    /// The OpenSSH key type of a key on the curve (`ecdsa-sha2-nistp256`).
    pub const fn ssh_key_type(self) -> &'static str {
        match self {
            Self::NistP256 => "ecdsa-sha2-nistp256",
            Self::NistP384 => "ecdsa-sha2-nistp384",
        }
    }

    /// The TLS 1.3 signature scheme of a key on the curve.
    pub const fn tls_schemes(self) -> &'static [u16] {
        match self {
            Self::NistP256 => &[tls_scheme::ECDSA_NISTP256_SHA256],
            Self::NistP384 => &[tls_scheme::ECDSA_NISTP384_SHA384],
        }
    }

    /// The hash SSH and TLS pair with the curve.
    pub const fn hash(self) -> HashAlgorithm {
        match self {
            Self::NistP256 => HashAlgorithm::Sha256,
            Self::NistP384 => HashAlgorithm::Sha384,
        }
    }

    /// The curve of PKCS#11 `CKA_EC_PARAMS` bytes, if the vault makes keys on it.
    pub fn from_oid_der(der: &[u8]) -> Option<Curve> {
        [Self::NistP256, Self::NistP384].into_iter().find(|c| c.oid_der() == der)
    }
}

/// The key that lives in the TPM: what the daemon builds a TPM template from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpmKey {
    /// An ECC key on `curve`.
    Ecc(Curve),
    /// An RSA key with a `bits`-bit modulus (public exponent 65537).
    Rsa {
        /// Modulus size.
        bits: u16,
    },
}

/// The post-quantum key a vault key seals (in-core key material wrapped by the TPM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pq {
    /// An ML-DSA key of this parameter set.
    MlDsa(ParameterSet),
    /// An ML-KEM key with module rank `k` (3: ML-KEM-768, 4: ML-KEM-1024).
    MlKem {
        /// Module rank.
        k: usize,
    },
}

/// Everything the crates need to know about one key algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Algorithm {
    /// The API's value.
    pub id: KeyAlgorithm,
    /// The name people type and key records store (`ecc-p256`).
    pub name: &'static str,
    /// What kind of key it is.
    pub family: Family,
    /// The TPM-resident key: the key itself for ECC and RSA, the ECDSA half of a hybrid key,
    /// none for ML-DSA and ML-KEM (whose TPM object is the sealed wrapping key).
    pub tpm_key: Option<TpmKey>,
    /// The sealed post-quantum key: the key itself for ML-DSA and ML-KEM, the ML-DSA-65 half of
    /// a hybrid key, none for ECC and RSA.
    pub pq: Option<Pq>,
    /// The [`pq`](Self::pq) part as an algorithm of its own (ML-DSA-65 for a hybrid key).
    pub pq_algorithm: Option<KeyAlgorithm>,
    /// The schemes the key signs with, the default first; empty for a key that does not sign.
    pub schemes: &'static [SignatureScheme],
    /// The hash used when the caller names none.
    pub default_hash: HashAlgorithm,
    /// Bytes in one raw signature: ECDSA `r || s`, the RSA modulus, an ML-DSA signature; none
    /// for keys that do not sign and for hybrid signatures (variable length).
    pub signature_len: Option<usize>,
    /// The SubjectPublicKeyInfo algorithm OID of a post-quantum key (absent parameters).
    pub spki_oid: Option<&'static str>,
    /// The TLS 1.3 signature schemes (IANA codes, [`tls_scheme`]) a handshake key offers, best
    /// first; empty for keys that cannot sign handshakes.
    pub tls_schemes: &'static [u16],
    /// The OpenSSH key type of the key's public key blob; none for keys SSH cannot use.
    pub ssh_key_type: Option<&'static str>,
}

impl Algorithm {
    /// The scheme used when the caller names none; none for a key that does not sign.
    pub fn default_scheme(&self) -> Option<SignatureScheme> {
        self.schemes.first().copied()
    }

    /// True when the key signs with `scheme`.
    pub fn signs_with(&self, scheme: SignatureScheme) -> bool {
        self.schemes.contains(&scheme)
    }

    /// True for keys that sign whole messages, never digests (ML-DSA and hybrid keys).
    pub fn signs_whole_messages(&self) -> bool {
        matches!(self.family, Family::MlDsa | Family::Hybrid)
    }

    /// The curve of an ECC key.
    pub fn curve(&self) -> Option<Curve> {
        match self.family {
            Family::Ecc => match self.tpm_key {
                Some(TpmKey::Ecc(curve)) => Some(curve),
                _ => None,
            },
            _ => None,
        }
    }

    /// The ML-DSA parameter set of an ML-DSA key (not of a hybrid key's half).
    pub fn ml_dsa(&self) -> Option<ParameterSet> {
        match (self.family, self.pq) {
            (Family::MlDsa, Some(Pq::MlDsa(set))) => Some(set),
            _ => None,
        }
    }

    /// The module rank of an ML-KEM key.
    pub fn ml_kem_rank(&self) -> Option<usize> {
        match self.pq {
            Some(Pq::MlKem { k }) => Some(k),
            _ => None,
        }
    }
}

const ECDSA: &[SignatureScheme] = &[SignatureScheme::Ecdsa];
const RSA: &[SignatureScheme] = &[SignatureScheme::RsaPss, SignatureScheme::RsaPkcs1];
const ML_DSA: &[SignatureScheme] = &[SignatureScheme::MlDsa];
const RSA_TLS: &[u16] = &[tls_scheme::RSA_PSS_SHA256, tls_scheme::RSA_PSS_SHA384];

const fn ecc(id: KeyAlgorithm, name: &'static str, curve: Curve) -> Algorithm {
    Algorithm {
        id,
        name,
        family: Family::Ecc,
        tpm_key: Some(TpmKey::Ecc(curve)),
        pq: None,
        pq_algorithm: None,
        schemes: ECDSA,
        default_hash: curve.hash(),
        signature_len: Some(2 * curve.field_len()),
        spki_oid: None,
        tls_schemes: curve.tls_schemes(),
        ssh_key_type: Some(curve.ssh_key_type()),
    }
}

const fn rsa(id: KeyAlgorithm, name: &'static str, bits: u16) -> Algorithm {
    Algorithm {
        id,
        name,
        family: Family::Rsa,
        tpm_key: Some(TpmKey::Rsa { bits }),
        pq: None,
        pq_algorithm: None,
        schemes: RSA,
        default_hash: HashAlgorithm::Sha256,
        signature_len: Some(bits as usize / 8),
        spki_oid: None,
        tls_schemes: RSA_TLS,
        ssh_key_type: Some("ssh-rsa"),
    }
}

const fn ml_dsa(id: KeyAlgorithm, name: &'static str, set: ParameterSet, len: usize, oid: &'static str) -> Algorithm {
    Algorithm {
        id,
        name,
        family: Family::MlDsa,
        tpm_key: None,
        pq: Some(Pq::MlDsa(set)),
        pq_algorithm: Some(id),
        schemes: ML_DSA,
        default_hash: HashAlgorithm::Sha256,
        signature_len: Some(len),
        spki_oid: Some(oid),
        tls_schemes: &[],
        ssh_key_type: None,
    }
}

const fn ml_kem(id: KeyAlgorithm, name: &'static str, k: usize, oid: &'static str) -> Algorithm {
    Algorithm {
        id,
        name,
        family: Family::MlKem,
        tpm_key: None,
        pq: Some(Pq::MlKem { k }),
        pq_algorithm: Some(id),
        schemes: &[],
        default_hash: HashAlgorithm::Sha256,
        signature_len: None,
        spki_oid: Some(oid),
        tls_schemes: &[],
        ssh_key_type: None,
    }
}

/// Every algorithm, in documentation order.
pub const ALL: &[Algorithm] = &[
    ecc(KeyAlgorithm::EccP256, "ecc-p256", Curve::NistP256),
    ecc(KeyAlgorithm::EccP384, "ecc-p384", Curve::NistP384),
    rsa(KeyAlgorithm::Rsa2048, "rsa-2048", 2048),
    rsa(KeyAlgorithm::Rsa3072, "rsa-3072", 3072),
    ml_dsa(KeyAlgorithm::MlDsa44, "ml-dsa-44", ParameterSet::MlDsa44, 2420, crate::pq_oids::ID_ML_DSA_44),
    ml_dsa(KeyAlgorithm::MlDsa65, "ml-dsa-65", ParameterSet::MlDsa65, 3309, crate::pq_oids::ID_ML_DSA_65),
    ml_dsa(KeyAlgorithm::MlDsa87, "ml-dsa-87", ParameterSet::MlDsa87, 4627, crate::pq_oids::ID_ML_DSA_87),
    ml_kem(KeyAlgorithm::MlKem768, "ml-kem-768", 3, crate::pq_oids::ID_ALG_ML_KEM_768),
    ml_kem(KeyAlgorithm::MlKem1024, "ml-kem-1024", 4, crate::pq_oids::ID_ALG_ML_KEM_1024),
    Algorithm {
        id: KeyAlgorithm::HybridP256MlDsa65,
        name: "hybrid-p256-mldsa65",
        family: Family::Hybrid,
        tpm_key: Some(TpmKey::Ecc(Curve::NistP256)),
        pq: Some(Pq::MlDsa(ParameterSet::MlDsa65)),
        pq_algorithm: Some(KeyAlgorithm::MlDsa65),
        schemes: &[SignatureScheme::Hybrid],
        default_hash: HashAlgorithm::Sha256,
        signature_len: None,
        spki_oid: None,
        tls_schemes: &[],
        ssh_key_type: None,
    },
];

/// The algorithm named `name` (exact, lowercase).
pub fn by_name(name: &str) -> Option<&'static Algorithm> {
    ALL.iter().find(|a| a.name == name)
}

/// The algorithm whose post-quantum SubjectPublicKeyInfo OID is `oid` (dotted).
pub fn by_spki_oid(oid: &str) -> Option<&'static Algorithm> {
    ALL.iter().find(|a| a.spki_oid == Some(oid))
}

/// The ECC or RSA algorithm whose TPM key is `key` (not the hybrid one, whose ECDSA half is one).
pub fn by_tpm_key(key: TpmKey) -> Option<&'static Algorithm> {
    ALL.iter().find(|a| a.tpm_key == Some(key) && matches!(a.family, Family::Ecc | Family::Rsa))
}

/// The names of every algorithm, in documentation order.
pub fn names() -> impl Iterator<Item = &'static str> {
    ALL.iter().map(|a| a.name)
}

impl KeyAlgorithm {
    /// This algorithm's row of the table; `None` for `Unspecified`.
    pub fn info(self) -> Option<&'static Algorithm> {
        ALL.iter().find(|a| a.id == self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_value_but_unspecified_has_one_row() {
        let mut ids: Vec<i32> = ALL.iter().map(|a| a.id as i32).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), ALL.len(), "an algorithm appears twice");
        for v in 0..=i32::from(u8::MAX) {
            if let Ok(alg) = KeyAlgorithm::try_from(v) {
                assert_eq!(alg.info().is_some(), alg != KeyAlgorithm::Unspecified, "{alg:?}");
            }
        }
        for a in ALL {
            assert_eq!(by_name(a.name), Some(a));
            assert_eq!(a.name, a.name.to_ascii_lowercase());
        }
    }

    #[test]
    fn rows_are_consistent() {
        for a in ALL {
            let signs = !a.schemes.is_empty();
            assert_eq!(signs, a.family != Family::MlKem, "{}", a.name);
            assert_eq!(a.tpm_key.is_some(), matches!(a.family, Family::Ecc | Family::Rsa | Family::Hybrid));
            assert_eq!(a.pq.is_some(), a.pq_algorithm.is_some());
            if let Some(pq) = a.pq_algorithm.and_then(KeyAlgorithm::info) {
                assert_eq!(Some(pq.id), pq.pq_algorithm, "{}: its sealed part is a key of its own", a.name);
            }
            for &code in a.tls_schemes {
                let (_, sig) = tls_scheme::meaning(code).expect("offered schemes have a meaning");
                assert!(a.signs_with(sig), "{}", a.name);
            }
            assert_eq!(a.spki_oid.map(|o| by_spki_oid(o).map(|b| b.id)), a.spki_oid.map(|_| Some(a.id)));
        }
        let p384 = KeyAlgorithm::EccP384.info().unwrap();
        assert_eq!(p384.default_hash, HashAlgorithm::Sha384);
        assert_eq!(p384.signature_len, Some(96));
        assert_eq!(p384.tls_schemes, [tls_scheme::ECDSA_NISTP384_SHA384]);
        assert_eq!(Curve::from_oid_der(Curve::NistP384.oid_der()), Some(Curve::NistP384));
        assert_eq!(by_tpm_key(TpmKey::Ecc(Curve::NistP256)).map(|a| a.id), Some(KeyAlgorithm::EccP256));
        assert_eq!(by_tpm_key(TpmKey::Rsa { bits: 3072 }).map(|a| a.id), Some(KeyAlgorithm::Rsa3072));
        assert_eq!(by_tpm_key(TpmKey::Rsa { bits: 1024 }), None);
        assert_eq!(KeyAlgorithm::Rsa3072.info().unwrap().default_scheme(), Some(SignatureScheme::RsaPss));
        assert_eq!(KeyAlgorithm::MlKem768.info().unwrap().default_scheme(), None);
    }
}
