//! Signature verification in-core, against a key's SubjectPublicKeyInfo. Uses the RustCrypto
//! `p256`/`p384`/`rsa` crates, which verify precomputed digests as well as messages.

use p256::pkcs8::DecodePublicKey;
use sha2::{Sha256, Sha384, Sha512};
use tpm_vault_proto::algorithm::{Curve, Family};

use crate::error::Error;
use crate::model::{HashAlg, KeyAlg, Scheme};

/// Verifies `signature` over `digest` (already hashed with `hash`) with the public key `spki`.
/// Returns `Ok(false)` for a well-formed key and an invalid or malformed signature.
///
/// # Errors
/// [`Error::InvalidArgument`] for a scheme the key cannot use; [`Error::Internal`] if the stored
/// public key does not parse.
pub fn verify_digest(
    alg: KeyAlg,
    spki: &[u8],
    scheme: Scheme,
    hash: HashAlg,
    digest: &[u8],
    signature: &[u8],
) -> Result<bool, Error> {
    use p256::ecdsa::signature::hazmat::PrehashVerifier;
    alg.check_scheme(scheme)?;
    let bad_key = |e: String| Error::Internal(format!("stored public key does not parse: {e}"));
    match (alg.info().family, alg.info().curve()) {
        (_, Some(Curve::NistP256)) => {
            let key = p256::ecdsa::VerifyingKey::from_public_key_der(spki).map_err(|e| bad_key(e.to_string()))?;
            let Ok(sig) = p256::ecdsa::Signature::from_der(signature) else {
                return Ok(false);
            };
            Ok(key.verify_prehash(digest, &sig).is_ok())
        }
        (_, Some(Curve::NistP384)) => {
            let key = p384::ecdsa::VerifyingKey::from_public_key_der(spki).map_err(|e| bad_key(e.to_string()))?;
            let Ok(sig) = p384::ecdsa::Signature::from_der(signature) else {
                return Ok(false);
            };
            Ok(key.verify_prehash(digest, &sig).is_ok())
        }
        (Family::Rsa, _) => {
            let key = rsa::RsaPublicKey::from_public_key_der(spki).map_err(|e| bad_key(e.to_string()))?;
            let ok = match (scheme, hash) {
                (Scheme::RsaPss, HashAlg::Sha256) => {
                    key.verify(rsa::Pss::new_with_salt::<Sha256>(32), digest, signature)
                }
                (Scheme::RsaPss, HashAlg::Sha384) => {
                    key.verify(rsa::Pss::new_with_salt::<Sha384>(48), digest, signature)
                }
                (Scheme::RsaPss, HashAlg::Sha512) => {
                    key.verify(rsa::Pss::new_with_salt::<Sha512>(64), digest, signature)
                }
                (Scheme::RsaPss, HashAlg::Sha1) => return Ok(false),
                (_, HashAlg::Sha256) => key.verify(rsa::Pkcs1v15Sign::new::<Sha256>(), digest, signature),
                (_, HashAlg::Sha384) => key.verify(rsa::Pkcs1v15Sign::new::<Sha384>(), digest, signature),
                (_, HashAlg::Sha512) => key.verify(rsa::Pkcs1v15Sign::new::<Sha512>(), digest, signature),
                (_, HashAlg::Sha1) => {
                    // The rsa crate names hashes by their types; SHA-1 has none here, so its
                    // DigestInfo prefix (RFC 8017 §9.2 note 1) is given directly.
                    let prefix =
                        [0x30, 0x21, 0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00, 0x04, 0x14];
                    key.verify(rsa::Pkcs1v15Sign { hash_len: Some(20), prefix: prefix.into() }, digest, signature)
                }
            };
            Ok(ok.is_ok())
        }
        // ML-DSA signs whole messages (see `crypto::pq`); `check_scheme` refused ML-KEM above.
        _ => Err(Error::invalid(format!("{alg} signatures cannot be checked against a digest"))),
    }
}
