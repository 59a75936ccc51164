//! Mechanisms: which the token offers, what each does with its input before the daemon signs,
//! and how the daemon's signature becomes the PKCS#11 encoding.
//!
//! The TPM signs digests; messages are hashed here, in the caller's process (never on the
//! TPM). `CKM_RSA_PKCS` takes a DigestInfo, which is parsed back to the hash and digest the
//! TPM needs (SHA-256 and SHA-384 only; anything else is `CKR_DATA_INVALID`). PSS uses the salt
//! length the TPM makes (= the hash length); another is `CKR_MECHANISM_PARAM_INVALID`. ECDSA
//! signatures come back DER-encoded and leave as r || s, each padded to the field size.

use cryptoki_sys::*;
use tpm_vault_client::algorithm::Curve;
use tpm_vault_client::{HashAlgorithm, Hasher, SignInput, SignatureScheme};
use zeroize::Zeroizing;

use crate::error::Result;
use crate::objects::{Key, KeyKind};

/// The largest message ML-DSA signs (the daemon's limit).
pub(crate) const MAX_MESSAGE: usize = 4 << 20;

/// The largest input of a mechanism that takes a digest or DigestInfo.
const MAX_DIGEST_INPUT: usize = 512;

/// A hash the TPM signs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hash {
    /// SHA-1: only inside a DigestInfo for `CKM_RSA_PKCS` (legacy callers); never hashed here.
    Sha1,
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512 (where the TPM has it).
    Sha512,
}

impl Hash {
    /// Digest length in bytes.
    pub(crate) fn len(self) -> usize {
        match self {
            Hash::Sha1 => 20,
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// The API's name for it.
    fn api(self) -> HashAlgorithm {
        match self {
            Hash::Sha1 => HashAlgorithm::Sha1,
            Hash::Sha256 => HashAlgorithm::Sha256,
            Hash::Sha384 => HashAlgorithm::Sha384,
            Hash::Sha512 => HashAlgorithm::Sha512,
        }
    }

    /// A hasher for it (SHA-1 never: it is accepted only as a digest the caller made).
    pub(crate) fn hasher(self) -> Result<Hasher> {
        Hasher::new(self.api()).map_err(|_| CKR_MECHANISM_INVALID)
    }

    /// The digest mechanisms the token offers (`CKM_SHA256/384/512`) to the hash.
    pub(crate) fn from_mechanism(m: CK_MECHANISM_TYPE) -> Option<Hash> {
        match m {
            CKM_SHA256 => Some(Hash::Sha256),
            CKM_SHA384 => Some(Hash::Sha384),
            CKM_SHA512 => Some(Hash::Sha512),
            _ => None,
        }
    }

    /// The MGF1 generator PSS must use with this hash.
    fn mgf(self) -> CK_RSA_PKCS_MGF_TYPE {
        match self {
            Hash::Sha1 => CKG_MGF1_SHA1,
            Hash::Sha256 => CKG_MGF1_SHA256,
            Hash::Sha384 => CKG_MGF1_SHA384,
            Hash::Sha512 => CKG_MGF1_SHA512,
        }
    }
}

/// A mechanism's parameters, copied out of the caller's `CK_MECHANISM`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Params {
    /// None given.
    None,
    /// `CK_RSA_PKCS_PSS_PARAMS`.
    Pss {
        /// `hashAlg`.
        hash: CK_MECHANISM_TYPE,
        /// `mgf`.
        mgf: CK_RSA_PKCS_MGF_TYPE,
        /// `sLen`.
        salt: CK_ULONG,
    },
    /// `CK_SIGN_ADDITIONAL_CONTEXT` (ML-DSA).
    Context {
        /// `hedgeVariant`.
        hedge: CK_ULONG,
        /// Context string length.
        context_len: CK_ULONG,
    },
    /// Parameters of a size no mechanism here takes.
    Other,
}

/// A signature mechanism, checked against its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sign {
    /// ECDSA over a digest (`None`) or a message hashed here.
    Ecdsa(Option<Hash>),
    /// PKCS#1 v1.5 over a DigestInfo (`None`) or a message hashed here.
    RsaPkcs(Option<Hash>),
    /// PSS with salt = hash length, over a digest or (`prehash`) a message hashed here.
    RsaPss {
        /// The hash (and MGF1 hash).
        hash: Hash,
        /// True for the `CKM_SHA*_RSA_PKCS_PSS` mechanisms.
        prehash: bool,
    },
    /// Pure ML-DSA over the message, empty context.
    MlDsa,
}

impl Sign {
    /// The mechanism `kind` with `params` for `key`.
    ///
    /// # Errors
    /// `CKR_MECHANISM_INVALID` (not a signature mechanism here), `CKR_KEY_TYPE_INCONSISTENT`,
    /// `CKR_MECHANISM_PARAM_INVALID`.
    pub(crate) fn new(kind: CK_MECHANISM_TYPE, params: &Params, key: &Key) -> Result<Sign> {
        let mechanism = match kind {
            CKM_ECDSA => Sign::Ecdsa(None),
            CKM_ECDSA_SHA256 => Sign::Ecdsa(Some(Hash::Sha256)),
            CKM_ECDSA_SHA384 => Sign::Ecdsa(Some(Hash::Sha384)),
            CKM_ECDSA_SHA512 => Sign::Ecdsa(Some(Hash::Sha512)),
            CKM_RSA_PKCS => Sign::RsaPkcs(None),
            CKM_SHA256_RSA_PKCS => Sign::RsaPkcs(Some(Hash::Sha256)),
            CKM_SHA384_RSA_PKCS => Sign::RsaPkcs(Some(Hash::Sha384)),
            CKM_SHA512_RSA_PKCS => Sign::RsaPkcs(Some(Hash::Sha512)),
            CKM_RSA_PKCS_PSS => Sign::RsaPss { hash: pss_hash(params, None)?, prehash: false },
            CKM_SHA256_RSA_PKCS_PSS => Sign::RsaPss { hash: pss_hash(params, Some(Hash::Sha256))?, prehash: true },
            CKM_SHA384_RSA_PKCS_PSS => Sign::RsaPss { hash: pss_hash(params, Some(Hash::Sha384))?, prehash: true },
            CKM_SHA512_RSA_PKCS_PSS => Sign::RsaPss { hash: pss_hash(params, Some(Hash::Sha512))?, prehash: true },
            CKM_ML_DSA => Sign::MlDsa,
            _ => return Err(CKR_MECHANISM_INVALID),
        };
        match (mechanism, params) {
            (Sign::RsaPss { .. }, _) | (_, Params::None) => {}
            (Sign::MlDsa, Params::Context { hedge, context_len }) => {
                // The daemon signs hedged (aws-lc-rs) with an empty context.
                if *context_len != 0 || *hedge == CKH_DETERMINISTIC_REQUIRED {
                    return Err(CKR_MECHANISM_PARAM_INVALID);
                }
            }
            _ => return Err(CKR_MECHANISM_PARAM_INVALID),
        }
        let fits = matches!(
            (&key.kind, mechanism),
            (KeyKind::Ec { .. }, Sign::Ecdsa(_))
                | (KeyKind::Rsa { .. }, Sign::RsaPkcs(_) | Sign::RsaPss { .. })
                | (KeyKind::MlDsa { .. }, Sign::MlDsa)
        );
        if !fits {
            return Err(CKR_KEY_TYPE_INCONSISTENT);
        }
        Ok(mechanism)
    }

    /// A fresh accumulator for `C_SignUpdate` / `C_VerifyUpdate`.
    ///
    /// # Errors
    /// `CKR_MECHANISM_INVALID` for a hash the module does not compute.
    pub(crate) fn input(self) -> Result<Input> {
        Ok(match self {
            Sign::Ecdsa(Some(h)) | Sign::RsaPkcs(Some(h)) | Sign::RsaPss { hash: h, prehash: true } => {
                Input::Hashing(Box::new(h.hasher()?))
            }
            Sign::MlDsa => Input::Buffer(Zeroizing::new(Vec::new()), MAX_MESSAGE),
            Sign::Ecdsa(None) | Sign::RsaPkcs(None) | Sign::RsaPss { prehash: false, .. } => {
                Input::Buffer(Zeroizing::new(Vec::new()), MAX_DIGEST_INPUT)
            }
        })
    }

    /// The daemon request for the accumulated input: what to sign, hash, scheme.
    ///
    /// # Errors
    /// `CKR_DATA_LEN_RANGE` (a PSS digest of the wrong length), `CKR_DATA_INVALID` (a
    /// DigestInfo of another hash).
    pub(crate) fn request(self, key: &Key, input: Input) -> Result<(SignInput, HashAlgorithm, SignatureScheme)> {
        let data = input.finish();
        Ok(match self {
            Sign::Ecdsa(_) => {
                let (hash, digest) = ecdsa_digest(key, &data);
                (SignInput::Digest(digest), hash.api(), SignatureScheme::Ecdsa)
            }
            Sign::RsaPkcs(Some(h)) => (SignInput::Digest(data.to_vec()), h.api(), SignatureScheme::RsaPkcs1),
            Sign::RsaPkcs(None) => {
                let (hash, digest) = parse_digest_info(&data).inspect_err(|_| {
                    crate::debug(format_args!("CKM_RSA_PKCS input of {} bytes is no DigestInfo known here", data.len()))
                })?;
                (SignInput::Digest(digest.to_vec()), hash.api(), SignatureScheme::RsaPkcs1)
            }
            Sign::RsaPss { hash, .. } => {
                if data.len() != hash.len() {
                    return Err(CKR_DATA_LEN_RANGE);
                }
                (SignInput::Digest(data.to_vec()), hash.api(), SignatureScheme::RsaPss)
            }
            Sign::MlDsa => (SignInput::Message(data.to_vec()), HashAlgorithm::Unspecified, SignatureScheme::MlDsa),
        })
    }

    /// The daemon's signature in this mechanism's PKCS#11 encoding.
    ///
    /// # Errors
    /// `CKR_FUNCTION_FAILED` when the daemon's signature does not have the expected shape.
    pub(crate) fn encode(self, key: &Key, signature: &[u8]) -> Result<Vec<u8>> {
        let out = match (self, &key.kind) {
            (Sign::Ecdsa(_), KeyKind::Ec { curve: Curve::NistP256 }) => {
                p256::ecdsa::Signature::from_der(signature).map_err(|_| CKR_FUNCTION_FAILED)?.to_bytes().to_vec()
            }
            (Sign::Ecdsa(_), KeyKind::Ec { .. }) => {
                p384::ecdsa::Signature::from_der(signature).map_err(|_| CKR_FUNCTION_FAILED)?.to_bytes().to_vec()
            }
            _ => signature.to_vec(),
        };
        if out.len() != key.signature_len() {
            crate::debug(format_args!("the daemon's signature has {} bytes, not {}", out.len(), key.signature_len()));
            return Err(CKR_FUNCTION_FAILED);
        }
        Ok(out)
    }

    /// Checks `signature` (PKCS#11 encoding) over the accumulated input, in-core.
    ///
    /// # Errors
    /// `CKR_SIGNATURE_INVALID`, `CKR_SIGNATURE_LEN_RANGE`, and the input errors of
    /// [`Sign::request`].
    pub(crate) fn verify(self, key: &Key, input: Input, signature: &[u8]) -> Result<()> {
        if signature.len() != key.signature_len() {
            return Err(CKR_SIGNATURE_LEN_RANGE);
        }
        let (what, hash, _) = self.request(key, input)?;
        let valid = match (what, &key.kind) {
            (SignInput::Digest(digest), KeyKind::Ec { curve: Curve::NistP256 }) => {
                use p256::ecdsa::signature::hazmat::PrehashVerifier as _;
                let vk =
                    p256::ecdsa::VerifyingKey::from_sec1_bytes(&key.public_bits).map_err(|_| CKR_FUNCTION_FAILED)?;
                p256::ecdsa::Signature::from_slice(signature).is_ok_and(|s| vk.verify_prehash(&digest, &s).is_ok())
            }
            (SignInput::Digest(digest), KeyKind::Ec { .. }) => {
                use p384::ecdsa::signature::hazmat::PrehashVerifier as _;
                let vk =
                    p384::ecdsa::VerifyingKey::from_sec1_bytes(&key.public_bits).map_err(|_| CKR_FUNCTION_FAILED)?;
                p384::ecdsa::Signature::from_slice(signature).is_ok_and(|s| vk.verify_prehash(&digest, &s).is_ok())
            }
            (SignInput::Digest(digest), KeyKind::Rsa { .. }) => {
                use rsa::pkcs8::DecodePublicKey as _;
                let public = rsa::RsaPublicKey::from_public_key_der(&key.spki).map_err(|_| CKR_FUNCTION_FAILED)?;
                let result = match (self, hash) {
                    (Sign::RsaPss { .. }, HashAlgorithm::Sha384) => {
                        public.verify(rsa::Pss::new_with_salt::<sha2::Sha384>(48), &digest, signature)
                    }
                    (Sign::RsaPss { .. }, HashAlgorithm::Sha512) => {
                        public.verify(rsa::Pss::new_with_salt::<sha2::Sha512>(64), &digest, signature)
                    }
                    (Sign::RsaPss { .. }, _) => {
                        public.verify(rsa::Pss::new_with_salt::<sha2::Sha256>(32), &digest, signature)
                    }
                    (_, hash) => {
                        let prefix = DIGEST_INFOS
                            .iter()
                            .find(|(_, h)| h.api() == hash)
                            .map(|(prefix, _)| prefix.to_vec())
                            .ok_or(CKR_FUNCTION_FAILED)?;
                        let scheme = rsa::Pkcs1v15Sign { hash_len: Some(digest.len()), prefix: prefix.into() };
                        public.verify(scheme, &digest, signature)
                    }
                };
                result.is_ok()
            }
            (SignInput::Message(message), KeyKind::MlDsa { .. }) => {
                tpm_vault_client::verify_ml_dsa(&key.spki, &message, signature).map_err(|_| CKR_FUNCTION_FAILED)?
            }
            _ => return Err(CKR_FUNCTION_FAILED),
        };
        if valid {
            Ok(())
        } else {
            Err(CKR_SIGNATURE_INVALID)
        }
    }
}

/// The PSS hash from the parameters (required for `CKM_RSA_PKCS_PSS`, checked against the
/// mechanism's own hash for the others).
fn pss_hash(params: &Params, implied: Option<Hash>) -> Result<Hash> {
    match (params, implied) {
        (Params::None, Some(hash)) => Ok(hash),
        (Params::Pss { hash, mgf, salt }, _) => {
            let hash = Hash::from_mechanism(*hash).ok_or(CKR_MECHANISM_PARAM_INVALID)?;
            if implied.is_some_and(|h| h != hash) || *mgf != hash.mgf() || *salt as usize != hash.len() {
                return Err(CKR_MECHANISM_PARAM_INVALID);
            }
            Ok(hash)
        }
        _ => Err(CKR_MECHANISM_PARAM_INVALID),
    }
}

/// ECDSA's digest for the TPM: a hash longer than the field is cut to its leftmost bytes and a
/// shorter one is left-padded with zeros, which is what ECDSA does with it anyway (FIPS 186-5
/// §6.4.1), so the signature verifies for the original; then the hash of the field's size.
fn ecdsa_digest(key: &Key, data: &[u8]) -> (Hash, Vec<u8>) {
    let field = match key.kind {
        KeyKind::Ec { curve } => curve.field_len(),
        _ => 32,
    };
    let digest = if data.len() >= field {
        data[..field].to_vec()
    } else {
        let mut padded = vec![0u8; field - data.len()];
        padded.extend_from_slice(data);
        padded
    };
    (if field == 48 { Hash::Sha384 } else { Hash::Sha256 }, digest)
}

/// DER DigestInfo prefixes and their hashes (RFC 8017 §9.2 note 1), with the NULL parameters
/// first (what encoders write, and what the TPM writes), then without them.
const DIGEST_INFOS: [(&[u8], Hash); 8] = [
    (&[0x30, 0x21, 0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00, 0x04, 0x14], Hash::Sha1),
    (
        &[
            0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04,
            0x20,
        ],
        Hash::Sha256,
    ),
    (
        &[
            0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05, 0x00, 0x04,
            0x30,
        ],
        Hash::Sha384,
    ),
    (
        &[
            0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05, 0x00, 0x04,
            0x40,
        ],
        Hash::Sha512,
    ),
    (&[0x30, 0x1f, 0x30, 0x07, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x04, 0x14], Hash::Sha1),
    (
        &[0x30, 0x2f, 0x30, 0x0b, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x04, 0x20],
        Hash::Sha256,
    ),
    (
        &[0x30, 0x3f, 0x30, 0x0b, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x04, 0x30],
        Hash::Sha384,
    ),
    (
        &[0x30, 0x4f, 0x30, 0x0b, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x04, 0x40],
        Hash::Sha512,
    ),
];

/// The hash and digest inside a DER DigestInfo.
///
/// # Errors
/// `CKR_DATA_INVALID` for anything but a SHA-1, SHA-256, SHA-384 or SHA-512 DigestInfo.
pub(crate) fn parse_digest_info(data: &[u8]) -> Result<(Hash, &[u8])> {
    DIGEST_INFOS
        .iter()
        .find_map(|(prefix, hash)| {
            data.strip_prefix(*prefix).filter(|digest| digest.len() == hash.len()).map(|digest| (*hash, digest))
        })
        .ok_or(CKR_DATA_INVALID)
}

/// Input gathered for a signature or verification.
#[derive(Debug)]
pub(crate) enum Input {
    /// A message being hashed.
    Hashing(Box<Hasher>),
    /// Bytes kept whole, at most this many.
    Buffer(Zeroizing<Vec<u8>>, usize),
}

impl Input {
    /// Adds data.
    ///
    /// # Errors
    /// `CKR_DATA_LEN_RANGE` past the mechanism's limit.
    pub(crate) fn update(&mut self, data: &[u8]) -> Result<()> {
        match self {
            Input::Hashing(h) => h.update(data),
            Input::Buffer(buf, max) => {
                if buf.len() + data.len() > *max {
                    return Err(CKR_DATA_LEN_RANGE);
                }
                buf.extend_from_slice(data);
            }
        }
        Ok(())
    }

    /// The digest or the bytes.
    fn finish(self) -> Zeroizing<Vec<u8>> {
        match self {
            Input::Hashing(h) => Zeroizing::new(h.finish()),
            Input::Buffer(buf, _) => buf,
        }
    }
}

/// One mechanism the token offers.
struct Offered {
    /// `CKM_*`.
    kind: CK_MECHANISM_TYPE,
    /// Smallest key size (bits).
    min: CK_ULONG,
    /// Largest key size (bits).
    max: CK_ULONG,
    /// `CKF_*`.
    flags: CK_FLAGS,
}

/// Flags of a signature mechanism the TPM performs.
const SIGN: CK_FLAGS = CKF_HW | CKF_SIGN | CKF_VERIFY;
/// Flags of an EC mechanism.
const EC: CK_FLAGS = CKF_EC_F_P | CKF_EC_OID | CKF_EC_UNCOMPRESS;

/// Every mechanism, in the order `C_GetMechanismList` gives them.
const OFFERED: [Offered; 19] = [
    Offered { kind: CKM_ECDSA, min: 256, max: 384, flags: SIGN | EC },
    Offered { kind: CKM_ECDSA_SHA256, min: 256, max: 384, flags: SIGN | EC },
    Offered { kind: CKM_ECDSA_SHA384, min: 256, max: 384, flags: SIGN | EC },
    Offered { kind: CKM_ECDSA_SHA512, min: 256, max: 384, flags: SIGN | EC },
    Offered { kind: CKM_RSA_PKCS, min: 2048, max: 3072, flags: SIGN },
    Offered { kind: CKM_SHA256_RSA_PKCS, min: 2048, max: 3072, flags: SIGN },
    Offered { kind: CKM_SHA384_RSA_PKCS, min: 2048, max: 3072, flags: SIGN },
    Offered { kind: CKM_SHA512_RSA_PKCS, min: 2048, max: 3072, flags: SIGN },
    Offered { kind: CKM_RSA_PKCS_PSS, min: 2048, max: 3072, flags: SIGN },
    Offered { kind: CKM_SHA256_RSA_PKCS_PSS, min: 2048, max: 3072, flags: SIGN },
    Offered { kind: CKM_SHA384_RSA_PKCS_PSS, min: 2048, max: 3072, flags: SIGN },
    Offered { kind: CKM_SHA512_RSA_PKCS_PSS, min: 2048, max: 3072, flags: SIGN },
    Offered { kind: CKM_ML_DSA, min: 0, max: 0, flags: CKF_SIGN | CKF_VERIFY },
    Offered { kind: CKM_EC_KEY_PAIR_GEN, min: 256, max: 384, flags: CKF_HW | CKF_GENERATE_KEY_PAIR | EC },
    Offered { kind: CKM_RSA_PKCS_KEY_PAIR_GEN, min: 2048, max: 3072, flags: CKF_HW | CKF_GENERATE_KEY_PAIR },
    Offered { kind: CKM_ML_DSA_KEY_PAIR_GEN, min: 0, max: 0, flags: CKF_GENERATE_KEY_PAIR },
    Offered { kind: CKM_SHA256, min: 0, max: 0, flags: CKF_DIGEST },
    Offered { kind: CKM_SHA384, min: 0, max: 0, flags: CKF_DIGEST },
    Offered { kind: CKM_SHA512, min: 0, max: 0, flags: CKF_DIGEST },
];

/// `C_GetMechanismList`.
pub(crate) fn list() -> Vec<CK_MECHANISM_TYPE> {
    OFFERED.iter().map(|m| m.kind).collect()
}

/// `C_GetMechanismInfo`.
///
/// # Errors
/// `CKR_MECHANISM_INVALID` for a mechanism the token does not offer.
pub(crate) fn info(kind: CK_MECHANISM_TYPE) -> Result<CK_MECHANISM_INFO> {
    OFFERED
        .iter()
        .find(|m| m.kind == kind)
        .map(|m| CK_MECHANISM_INFO { ulMinKeySize: m.min, ulMaxKeySize: m.max, flags: m.flags })
        .ok_or(CKR_MECHANISM_INVALID)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_info_parses_the_hashes_the_tpm_signs_with() {
        let mut info = DIGEST_INFOS[1].0.to_vec();
        info.extend([7u8; 32]);
        assert_eq!(parse_digest_info(&info), Ok((Hash::Sha256, &[7u8; 32][..])));
        let mut short = DIGEST_INFOS[2].0.to_vec();
        short.extend([7u8; 47]);
        assert_eq!(parse_digest_info(&short), Err(CKR_DATA_INVALID));
        let mut sha1 = DIGEST_INFOS[0].0.to_vec();
        sha1.extend([1u8; 20]);
        assert_eq!(parse_digest_info(&sha1), Ok((Hash::Sha1, &[1u8; 20][..])));
        // SHA-224's DigestInfo: a hash the TPM does not sign with here.
        let mut sha224 = vec![
            0x30, 0x2d, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x04, 0x05, 0x00, 0x04,
            0x1c,
        ];
        sha224.extend([1u8; 28]);
        assert_eq!(parse_digest_info(&sha224), Err(CKR_DATA_INVALID));
        assert_eq!(parse_digest_info(&[7u8; 32]), Err(CKR_DATA_INVALID));
    }

    #[test]
    fn pss_salt_must_be_the_hash_length() {
        let good = Params::Pss { hash: CKM_SHA256, mgf: CKG_MGF1_SHA256, salt: 32 };
        assert_eq!(pss_hash(&good, None), Ok(Hash::Sha256));
        let salt = Params::Pss { hash: CKM_SHA256, mgf: CKG_MGF1_SHA256, salt: 20 };
        assert_eq!(pss_hash(&salt, None), Err(CKR_MECHANISM_PARAM_INVALID));
        let mgf = Params::Pss { hash: CKM_SHA256, mgf: CKG_MGF1_SHA384, salt: 32 };
        assert_eq!(pss_hash(&mgf, None), Err(CKR_MECHANISM_PARAM_INVALID));
        assert_eq!(pss_hash(&good, Some(Hash::Sha384)), Err(CKR_MECHANISM_PARAM_INVALID));
        assert_eq!(pss_hash(&Params::None, None), Err(CKR_MECHANISM_PARAM_INVALID));
    }
}
