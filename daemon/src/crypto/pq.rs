//! Post-quantum algorithms in-core (aws-lc-rs): parameter sets, SubjectPublicKeyInfo encodings,
//! ML-DSA verification and the hybrid ECDSA P-256 + ML-DSA-65 verifier.
//!
//! Public keys are exported as DER SubjectPublicKeyInfo with the raw key as the BIT STRING and
//! an `AlgorithmIdentifier` without parameters: ML-DSA per RFC 9881 (`id-ml-dsa-44/65/87`,
//! 2.16.840.1.101.3.4.3.17/18/19), ML-KEM per draft-ietf-lamps-kyber-certificates
//! (`id-alg-ml-kem-768/1024`, 2.16.840.1.101.3.4.4.2/3). aws-lc-rs can export an ML-DSA key pair's
//! SPKI but not one rebuilt from stored bytes, nor any ML-KEM SPKI, so both are built here with
//! the `spki`/`der` crates (a unit test checks the ML-DSA encoding against aws-lc's).
//! Private keys never pass through this module.

use aws_lc_rs::kem;
use aws_lc_rs::signature::{self, PqdsaSigningAlgorithm, PqdsaVerificationAlgorithm, UnparsedPublicKey};
use spki::der::asn1::BitString;
use spki::der::{Decode, Encode};
use spki::{AlgorithmIdentifierOwned, ObjectIdentifier, SubjectPublicKeyInfoOwned, SubjectPublicKeyInfoRef};
use tpm_vault_proto::ml_dsa::{self, ParameterSet};
use tpm_vault_proto::{hybrid, ml_kem};

use crate::error::Error;
use crate::model::KeyAlg;

/// The post-quantum algorithm a key's sealed material is for: the key's own for ML-DSA and
/// ML-KEM keys, ML-DSA-65 for a hybrid key, none for ECC and RSA keys.
pub fn pq_part(alg: KeyAlg) -> Option<KeyAlg> {
    alg.info().pq_algorithm.and_then(KeyAlg::from_api)
}

/// The SPKI algorithm OID of an ML-DSA or ML-KEM parameter set.
pub fn oid(alg: KeyAlg) -> Option<ObjectIdentifier> {
    alg.info().spki_oid.and_then(|oid| ObjectIdentifier::new(oid).ok())
}

/// aws-lc-rs signing parameters of an ML-DSA parameter set.
pub fn ml_dsa_signing(alg: KeyAlg) -> Option<&'static PqdsaSigningAlgorithm> {
    Some(match ml_dsa_set(alg)? {
        ParameterSet::MlDsa44 => &signature::ML_DSA_44_SIGNING,
        ParameterSet::MlDsa65 => &signature::ML_DSA_65_SIGNING,
        ParameterSet::MlDsa87 => &signature::ML_DSA_87_SIGNING,
    })
}

/// aws-lc-rs verification parameters of an ML-DSA parameter set.
pub fn ml_dsa_verification(alg: KeyAlg) -> Option<&'static PqdsaVerificationAlgorithm> {
    Some(match ml_dsa_set(alg)? {
        ParameterSet::MlDsa44 => &signature::ML_DSA_44,
        ParameterSet::MlDsa65 => &signature::ML_DSA_65,
        ParameterSet::MlDsa87 => &signature::ML_DSA_87,
    })
}

/// The FIPS 204 parameter set of an ML-DSA algorithm.
fn ml_dsa_set(alg: KeyAlg) -> Option<ParameterSet> {
    alg.info().ml_dsa()
}

/// aws-lc-rs parameters of an ML-KEM parameter set.
pub fn ml_kem(alg: KeyAlg) -> Option<&'static kem::Algorithm> {
    match alg.info().ml_kem_rank()? {
        3 => Some(&kem::ML_KEM_768),
        4 => Some(&kem::ML_KEM_1024),
        _ => None,
    }
}

/// FIPS 203 sizes of an ML-KEM parameter set: (encapsulation key, decapsulation key,
/// ciphertext) in bytes.
pub fn ml_kem_sizes(alg: KeyAlg) -> Option<(usize, usize, usize)> {
    match alg.info().ml_kem_rank()? {
        3 => Some((1184, 2400, 1088)),
        4 => Some((1568, 3168, 1568)),
        _ => None,
    }
}

/// DER SubjectPublicKeyInfo of a raw ML-DSA or ML-KEM public key.
///
/// # Errors
/// [`Error::Internal`] for an algorithm without an OID or an encoder failure.
pub fn spki_der(alg: KeyAlg, raw: &[u8]) -> Result<Vec<u8>, Error> {
    let oid = oid(alg).ok_or_else(|| Error::Internal(format!("no SPKI algorithm for {alg}")))?;
    let spki = SubjectPublicKeyInfoOwned {
        algorithm: AlgorithmIdentifierOwned { oid, parameters: None },
        subject_public_key: BitString::from_bytes(raw).map_err(|e| Error::Internal(format!("SPKI: {e}")))?,
    };
    spki.to_der().map_err(|e| Error::Internal(format!("SPKI: {e}")))
}

/// Checks a raw public key of the post-quantum algorithm `alg` as one received from elsewhere
/// (or read back from the state directory): an ML-DSA key has its parameter set's length
/// ([`tpm_vault_proto::ml_dsa`]), an ML-KEM key passes the FIPS 203 input check
/// ([`tpm_vault_proto::ml_kem`]: its size, every coefficient below the modulus). Keys of other
/// algorithms are not checked here.
///
/// # Errors
/// What is wrong with the key, in words.
pub fn check_public_key(alg: KeyAlg, raw: &[u8]) -> Result<(), String> {
    if let Some(set) = ml_dsa_set(alg) {
        return ml_dsa::check_public_key(raw, set).map_err(|e| e.to_string());
    }
    if let Some(k) = alg.info().ml_kem_rank() {
        return ml_kem::check_encapsulation_key(raw, k).map_err(|e| format!("{alg} public key: {e}"));
    }
    Ok(())
}

/// The raw public key inside an ML-DSA or ML-KEM SubjectPublicKeyInfo of algorithm `alg`,
/// checked by [`check_public_key`].
///
/// # Errors
/// [`Error::InvalidArgument`] for DER that does not parse, another algorithm, parameters
/// present, a BIT STRING with unused bits, an ML-DSA key of the wrong length, or an ML-KEM key
/// of the wrong size or with a coefficient not below the modulus.
pub fn raw_public_key(alg: KeyAlg, der: &[u8]) -> Result<Vec<u8>, Error> {
    let bad = |why: String| Error::invalid(format!("{alg} public key: {why}"));
    let spki = SubjectPublicKeyInfoRef::from_der(der).map_err(|e| bad(e.to_string()))?;
    if Some(spki.algorithm.oid) != oid(alg) || spki.algorithm.parameters.is_some() {
        return Err(bad(format!("algorithm is {}, not id-{alg}", spki.algorithm.oid)));
    }
    let raw = spki.subject_public_key.as_bytes().ok_or_else(|| bad("BIT STRING has unused bits".into()))?;
    check_public_key(alg, raw).map_err(Error::invalid)?;
    Ok(raw.to_vec())
}

/// Verifies a pure ML-DSA signature (FIPS 204, empty context) of `message` with the raw public
/// key `pk`. `Ok(false)` for a wrong or malformed signature.
///
/// # Errors
/// [`Error::InvalidArgument`] if `alg` is not ML-DSA or `pk` is not of its length.
pub fn verify_ml_dsa(alg: KeyAlg, pk: &[u8], message: &[u8], sig: &[u8]) -> Result<bool, Error> {
    let params = ml_dsa_verification(alg).ok_or_else(|| Error::invalid(format!("{alg} is not an ML-DSA algorithm")))?;
    check_public_key(alg, pk).map_err(Error::invalid)?;
    Ok(UnparsedPublicKey::new(params, pk).verify(message, sig).is_ok())
}

/// Verifies a [`hybrid`] signature of `message`: the ECDSA P-256/SHA-256 half with the SPKI
/// `ecdsa_spki` and the ML-DSA-65 half with the raw key `ml_dsa_pk`, both over
/// `hybrid::signed_message(message)`. True only if both are valid; `Ok(false)` for malformed
/// framing too.
///
/// # Errors
/// [`Error::InvalidArgument`] if `ml_dsa_pk` is not of ML-DSA-65's length; [`Error::Internal`]
/// if the stored ECDSA public key does not parse.
pub fn verify_hybrid(ecdsa_spki: &[u8], ml_dsa_pk: &[u8], message: &[u8], sig: &[u8]) -> Result<bool, Error> {
    use p256::ecdsa::signature::Verifier;
    use p256::pkcs8::DecodePublicKey;
    check_public_key(KeyAlg::MlDsa65, ml_dsa_pk).map_err(Error::invalid)?;
    let Ok(parts) = hybrid::HybridSignature::decode(sig) else {
        return Ok(false);
    };
    let vk = p256::ecdsa::VerifyingKey::from_public_key_der(ecdsa_spki)
        .map_err(|e| Error::Internal(format!("stored ECDSA public key does not parse: {e}")))?;
    let signed = hybrid::signed_message(message);
    let ecdsa_ok = p256::ecdsa::Signature::from_der(&parts.ecdsa).is_ok_and(|s| vk.verify(&signed, &s).is_ok());
    let ml_dsa_ok = verify_ml_dsa(KeyAlg::MlDsa65, ml_dsa_pk, &signed, &parts.ml_dsa)?;
    Ok(ecdsa_ok && ml_dsa_ok)
}

#[cfg(test)]
mod tests {
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::signature::{KeyPair, PqdsaKeyPair};

    use super::*;

    #[test]
    fn ml_dsa_spki_matches_aws_lc() {
        for alg in [KeyAlg::MlDsa44, KeyAlg::MlDsa65, KeyAlg::MlDsa87] {
            let kp = PqdsaKeyPair::from_seed(ml_dsa_signing(alg).unwrap(), &[7u8; 32]).unwrap();
            let ours = spki_der(alg, kp.public_key().as_ref()).unwrap();
            let theirs = kp.public_key().as_der().unwrap();
            assert_eq!(ours, theirs.as_ref(), "{alg}");
            assert_eq!(raw_public_key(alg, &ours).unwrap(), kp.public_key().as_ref());
            assert!(raw_public_key(KeyAlg::MlDsa87, &spki_der(KeyAlg::MlDsa44, &[1; 4]).unwrap()).is_err());
        }
    }

    #[test]
    fn ml_kem_spki_round_trips() {
        for alg in [KeyAlg::MlKem768, KeyAlg::MlKem1024] {
            let dk = kem::DecapsulationKey::generate(ml_kem(alg).unwrap()).unwrap();
            let ek = dk.encapsulation_key().unwrap().key_bytes().unwrap();
            assert_eq!(ek.as_ref().len(), ml_kem_sizes(alg).unwrap().0);
            let der = spki_der(alg, ek.as_ref()).unwrap();
            assert_eq!(raw_public_key(alg, &der).unwrap(), ek.as_ref());
        }
        // id-alg-ml-kem-768 = 2.16.840.1.101.3.4.4.2
        let der = spki_der(KeyAlg::MlKem768, &[0; 1184]).unwrap();
        assert_eq!(&der[4..17], &[0x30, 0x0b, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x04, 0x02]);
    }

    /// FIPS 203 section 7.2: the daemon's parser of ML-KEM SubjectPublicKeyInfo refuses a key of
    /// the wrong size or with a coefficient of q = 3329 or more (found by the `pq_spki` fuzz
    /// target), as the client does.
    #[test]
    fn ml_kem_spki_is_checked() {
        for alg in [KeyAlg::MlKem768, KeyAlg::MlKem1024] {
            let (ek_len, _, _) = ml_kem_sizes(alg).unwrap();
            assert!(raw_public_key(alg, &spki_der(alg, &vec![0; ek_len]).unwrap()).is_ok());
            assert!(raw_public_key(alg, &spki_der(alg, &vec![0; ek_len - 1]).unwrap()).is_err());
            let mut ek = vec![0; ek_len];
            // The second coefficient of the last 3-byte group := 4095.
            ek[ek_len - 33] = 0xff;
            ek[ek_len - 34] = 0xf0;
            let err = raw_public_key(alg, &spki_der(alg, &ek).unwrap()).unwrap_err().to_string();
            assert!(err.contains("is 4095, not below the modulus 3329"), "{err}");
        }
    }

    /// An ML-DSA public key of another length than its parameter set's (FIPS 204: 1312, 1952,
    /// 2592 bytes) is refused with an error saying so, as SPKI and raw, instead of parsing and
    /// then failing every verification as if the signatures were wrong.
    #[test]
    fn ml_dsa_public_key_length_is_checked() {
        for (alg, len) in [(KeyAlg::MlDsa44, 1312), (KeyAlg::MlDsa65, 1952), (KeyAlg::MlDsa87, 2592)] {
            let kp = PqdsaKeyPair::from_seed(ml_dsa_signing(alg).unwrap(), &[7u8; 32]).unwrap();
            let pk = kp.public_key().as_ref().to_vec();
            assert_eq!(pk.len(), len);
            let mut sig = vec![0; kp.algorithm().signature_len()];
            let n = kp.sign(b"m", &mut sig).unwrap();
            let sig = &sig[..n];
            assert!(verify_ml_dsa(alg, &pk, b"m", sig).unwrap());
            for bad_len in [0, len - 1, len + 1] {
                let mut bad = pk.clone();
                bad.resize(bad_len, 0);
                let err = raw_public_key(alg, &spki_der(alg, &bad).unwrap()).unwrap_err().to_string();
                assert!(err.contains(&format!("public key is {bad_len} bytes, not {len}")), "{alg}: {err}");
                let err = verify_ml_dsa(alg, &bad, b"m", sig).unwrap_err().to_string();
                assert!(err.contains(&format!("public key is {bad_len} bytes, not {len}")), "{alg}: {err}");
            }
        }
        let err = verify_hybrid(&[], &[0; 1951], b"m", &[]).unwrap_err().to_string();
        assert!(err.contains("ML-DSA-65 public key is 1951 bytes, not 1952"), "{err}");
    }
}
