//! Conversions between TPM structures and the standard encodings users expect: signature
//! schemes in, DER `ECDSA-Sig-Value` / RSA signature bytes out, and TPM public areas to
//! SubjectPublicKeyInfo DER. Pure functions; no TPM I/O.

use p256::pkcs8::EncodePublicKey;
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::structures::{HashScheme, HashcheckTicket, Public, Signature, SignatureScheme};
use tss_esapi::tss2_esys::TPMT_TK_HASHCHECK;

use tpm_vault_proto::algorithm::{Curve, TpmKey};

use super::error::{wrap, TpmError};
use crate::model::{HashAlg, KeyAlg, Scheme};

/// The TPM hashing algorithm for a vault hash.
pub fn hashing_algorithm(hash: HashAlg) -> HashingAlgorithm {
    match hash {
        HashAlg::Sha256 => HashingAlgorithm::Sha256,
        HashAlg::Sha384 => HashingAlgorithm::Sha384,
        HashAlg::Sha512 => HashingAlgorithm::Sha512,
        HashAlg::Sha1 => HashingAlgorithm::Sha1,
    }
}

/// The TPM signature scheme for a (scheme, hash) pair.
pub fn signature_scheme(scheme: Scheme, hash: HashAlg) -> SignatureScheme {
    let hash_scheme = HashScheme::new(hashing_algorithm(hash));
    match scheme {
        // A hybrid signature's TPM half is ECDSA.
        Scheme::Ecdsa | Scheme::Hybrid => SignatureScheme::EcDsa { hash_scheme },
        Scheme::RsaPss => SignatureScheme::RsaPss { hash_scheme },
        Scheme::RsaPkcs1 => SignatureScheme::RsaSsa { hash_scheme },
        // ML-DSA is never asked of the TPM (it signs in-core).
        Scheme::MlDsa => SignatureScheme::Null,
    }
}

/// Encodes a TPM signature the way OpenSSL and rustls expect: ECDSA as DER `ECDSA-Sig-Value`
/// (r and s left-padded first: the TPM drops leading zero bytes, about 1 in 256 signatures),
/// RSA as the raw signature left-padded to the modulus length.
///
/// # Errors
/// [`TpmError::Malformed`] if the TPM returned something that is not a valid signature.
pub fn encode_signature(alg: KeyAlg, sig: &Signature) -> Result<Vec<u8>, TpmError> {
    let bad = |why: &str| TpmError::Malformed(format!("signature: {why}"));
    match (alg.tpm_key(), sig) {
        (Some(TpmKey::Ecc(curve)), Signature::EcDsa(ecc)) => {
            let (r, s) = (ecc.signature_r().value(), ecc.signature_s().value());
            match curve {
                Curve::NistP256 => {
                    let r = left_pad::<32>(r).ok_or_else(|| bad("r too long"))?;
                    let s = left_pad::<32>(s).ok_or_else(|| bad("s too long"))?;
                    let sig = p256::ecdsa::Signature::from_scalars(r, s).map_err(|e| bad(&e.to_string()))?;
                    Ok(sig.to_der().as_bytes().to_vec())
                }
                Curve::NistP384 => {
                    let r = left_pad::<48>(r).ok_or_else(|| bad("r too long"))?;
                    let s = left_pad::<48>(s).ok_or_else(|| bad("s too long"))?;
                    let sig = p384::ecdsa::Signature::from_scalars(r, s).map_err(|e| bad(&e.to_string()))?;
                    Ok(sig.to_der().as_bytes().to_vec())
                }
            }
        }
        (Some(TpmKey::Rsa { bits }), Signature::RsaPss(rsa) | Signature::RsaSsa(rsa)) => {
            let len = usize::from(bits) / 8;
            let raw = rsa.signature().value();
            if raw.len() > len {
                return Err(bad("longer than the modulus"));
            }
            let mut out = vec![0u8; len - raw.len()];
            out.extend_from_slice(raw);
            Ok(out)
        }
        _ => Err(bad("unexpected signature type for the key")),
    }
}

fn left_pad<const N: usize>(v: &[u8]) -> Option<[u8; N]> {
    // Strip leading zeros first: some TPMs emit an extra zero byte on other curves' sizes.
    let v = &v[v.iter().take_while(|&&b| b == 0).count().min(v.len())..];
    if v.len() > N {
        return None;
    }
    let mut out = [0u8; N];
    out[N - v.len()..].copy_from_slice(v);
    Some(out)
}

/// DER SubjectPublicKeyInfo of a TPM public area.
///
/// # Errors
/// [`TpmError::Malformed`] for a public area that is not a valid key of `alg`.
pub fn public_key_der(alg: KeyAlg, public: &Public) -> Result<Vec<u8>, TpmError> {
    let bad = |why: String| TpmError::Malformed(format!("public key: {why}"));
    match (alg.tpm_key(), public) {
        (Some(TpmKey::Ecc(curve)), Public::Ecc { unique, .. }) => {
            let (x, y) = (unique.x().value(), unique.y().value());
            let der = match curve {
                Curve::NistP256 => {
                    let x = left_pad::<32>(x).ok_or_else(|| bad("x too long".into()))?;
                    let y = left_pad::<32>(y).ok_or_else(|| bad("y too long".into()))?;
                    let point = p256::EncodedPoint::from_affine_coordinates(&x.into(), &y.into(), false);
                    let key = p256::PublicKey::from_sec1_bytes(point.as_bytes()).map_err(|e| bad(e.to_string()))?;
                    key.to_public_key_der()
                }
                Curve::NistP384 => {
                    let x = left_pad::<48>(x).ok_or_else(|| bad("x too long".into()))?;
                    let y = left_pad::<48>(y).ok_or_else(|| bad("y too long".into()))?;
                    let point = p384::EncodedPoint::from_affine_coordinates(&x.into(), &y.into(), false);
                    let key = p384::PublicKey::from_sec1_bytes(point.as_bytes()).map_err(|e| bad(e.to_string()))?;
                    key.to_public_key_der()
                }
            };
            Ok(der.map_err(|e| bad(e.to_string()))?.as_bytes().to_vec())
        }
        (Some(TpmKey::Rsa { .. }), Public::Rsa { unique, parameters, .. }) => {
            let n = rsa::BigUint::from_bytes_be(unique.value());
            let e = match parameters.exponent().value() {
                0 => 65537u32,
                e => e,
            };
            let key = rsa::RsaPublicKey::new(n, rsa::BigUint::from(e)).map_err(|e| bad(e.to_string()))?;
            Ok(rsa::pkcs8::EncodePublicKey::to_public_key_der(&key)
                .map_err(|e| bad(e.to_string()))?
                .as_bytes()
                .to_vec())
        }
        _ => Err(bad(format!("public area does not hold a {alg} key"))),
    }
}

/// The NULL hashcheck ticket an unrestricted key accepts for externally computed digests.
pub(crate) fn null_hashcheck() -> Result<HashcheckTicket, TpmError> {
    let raw = TPMT_TK_HASHCHECK {
        tag: tss_esapi::constants::tss::TPM2_ST_HASHCHECK,
        hierarchy: tss_esapi::constants::tss::TPM2_RH_NULL,
        digest: Default::default(),
    };
    HashcheckTicket::try_from(raw).map_err(wrap("hashcheck ticket"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_pad_restores_short_scalars() {
        assert_eq!(left_pad::<4>(&[1, 2]), Some([0, 0, 1, 2]));
        assert_eq!(left_pad::<2>(&[0, 0, 1, 2]), Some([1, 2]));
        assert_eq!(left_pad::<2>(&[1, 2, 3]), None);
        assert_eq!(left_pad::<2>(&[]), Some([0, 0]));
    }
}
