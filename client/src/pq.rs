//! Post-quantum keys on the client: encapsulating to a vault ML-KEM key, and checking ML-DSA and
//! hybrid (ECDSA P-256 + ML-DSA-65) signatures without the daemon, e.g. on a device that
//! verifies firmware updates signed by the vault.
//!
//! Public keys come as the SubjectPublicKeyInfo the daemon exports ([`PublicKey`]): ML-DSA per
//! RFC 9881 (`id-ml-dsa-44/65/87`), ML-KEM per draft-ietf-lamps-kyber-certificates
//! (`id-alg-ml-kem-768/1024`). Hybrid signatures use the versioned format of [`crate::hybrid`].
//! aws-lc-rs does the arithmetic. No private key is involved: decapsulation and signing happen
//! in the daemon ([`Client::decapsulate`], [`Client::sign`]).

use aws_lc_rs::kem::{EncapsulationKey, ML_KEM_1024, ML_KEM_768};
use aws_lc_rs::signature::{UnparsedPublicKey, ML_DSA_44, ML_DSA_65, ML_DSA_87};
use spki::der::Decode;
use spki::SubjectPublicKeyInfoRef;
use tpm_vault_proto::algorithm::{self, Family};
use tpm_vault_proto::ml_dsa::{self, ParameterSet};
use tpm_vault_proto::{hybrid, ml_kem};
use zeroize::Zeroizing;

use crate::{Error, KeyAlgorithm, PublicKey};

/// The algorithm and raw key of an ML-DSA or ML-KEM SubjectPublicKeyInfo; an ML-DSA key has
/// its parameter set's length ([`tpm_vault_proto::ml_dsa`]; an ML-KEM key is checked by
/// [`KemPublicKey::from_spki`]).
fn parse_spki(der: &[u8]) -> Result<(KeyAlgorithm, &[u8]), Error> {
    let bad = |why: String| Error::InvalidInput(format!("post-quantum public key: {why}"));
    let spki = SubjectPublicKeyInfoRef::from_der(der).map_err(|e| bad(e.to_string()))?;
    let oid = spki.algorithm.oid;
    let Some(info) = algorithm::by_spki_oid(&oid.to_string()) else {
        return Err(bad(format!("algorithm {oid} is not ML-DSA or ML-KEM")));
    };
    let algorithm = info.id;
    if spki.algorithm.parameters.is_some() {
        return Err(bad("the algorithm identifier must have no parameters".into()));
    }
    let raw = spki.subject_public_key.as_bytes().ok_or_else(|| bad("BIT STRING has unused bits".into()))?;
    if let Some(set) = info.ml_dsa() {
        ml_dsa::check_public_key(raw, set).map_err(|e| bad(e.to_string()))?;
    }
    Ok((algorithm, raw))
}

/// An ML-KEM public (encapsulation) key of a vault key.
#[derive(Debug)]
pub struct KemPublicKey {
    algorithm: KeyAlgorithm,
    key: EncapsulationKey,
}

/// The result of [`KemPublicKey::encapsulate`]: the ciphertext to send to the key's holder, and
/// the shared secret (zeroed on drop) that its decapsulation yields.
pub struct Encapsulated {
    /// The ML-KEM ciphertext (1088 bytes for ML-KEM-768, 1568 for ML-KEM-1024).
    pub ciphertext: Vec<u8>,
    shared_secret: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for Encapsulated {
    /// Shows the ciphertext length only: the shared secret is secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encapsulated").field("ciphertext_len", &self.ciphertext.len()).finish_non_exhaustive()
    }
}

impl Encapsulated {
    /// The 32-byte shared secret.
    pub fn shared_secret(&self) -> &[u8] {
        &self.shared_secret
    }
}

impl KemPublicKey {
    /// Parses an ML-KEM-768 or ML-KEM-1024 SubjectPublicKeyInfo (`id-alg-ml-kem-768/1024`),
    /// with the FIPS 203 input check ([`tpm_vault_proto::ml_kem`]: the size, and every
    /// coefficient below the modulus).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for anything else, a key of the wrong size or one that fails the
    /// modulus check.
    pub fn from_spki(der: &[u8]) -> Result<KemPublicKey, Error> {
        let (algorithm, raw) = parse_spki(der)?;
        let (params, k) = match algorithm.info().and_then(|a| a.ml_kem_rank()) {
            Some(3) => (&ML_KEM_768, 3),
            Some(4) => (&ML_KEM_1024, 4),
            _ => return Err(Error::InvalidInput(format!("a {algorithm:?} key cannot encapsulate"))),
        };
        ml_kem::check_encapsulation_key(raw, k)
            .map_err(|e| Error::InvalidInput(format!("{algorithm:?} public key rejected: {e}")))?;
        let key = EncapsulationKey::new(params, raw)
            .map_err(|e| Error::InvalidInput(format!("ML-KEM public key rejected: {e}")))?;
        Ok(KemPublicKey { algorithm, key })
    }

    /// The parameter set.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// Makes a fresh shared secret and its ciphertext for this key (FIPS 203 `Encaps`).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if aws-lc refuses (it does not for a key that parsed).
    pub fn encapsulate(&self) -> Result<Encapsulated, Error> {
        let (ciphertext, secret) =
            self.key.encapsulate().map_err(|_| Error::InvalidInput("ML-KEM encapsulation failed".into()))?;
        Ok(Encapsulated {
            ciphertext: ciphertext.as_ref().to_vec(),
            shared_secret: Zeroizing::new(secret.as_ref().to_vec()),
        })
    }
}

/// Checks a pure ML-DSA signature (FIPS 204, empty context) of `message` with an ML-DSA
/// SubjectPublicKeyInfo. `Ok(false)` means the signature is wrong.
///
/// # Errors
/// [`Error::InvalidInput`] if `spki_der` is not an ML-DSA public key (or not of its parameter
/// set's length).
pub fn verify_ml_dsa(spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<bool, Error> {
    let (algorithm, raw) = parse_spki(spki_der)?;
    let params = match algorithm.info().and_then(|a| a.ml_dsa()) {
        Some(ParameterSet::MlDsa44) => &ML_DSA_44,
        Some(ParameterSet::MlDsa65) => &ML_DSA_65,
        Some(ParameterSet::MlDsa87) => &ML_DSA_87,
        None => return Err(Error::InvalidInput(format!("a {algorithm:?} key does not sign"))),
    };
    Ok(UnparsedPublicKey::new(params, raw).verify(message, signature).is_ok())
}

/// Checks a hybrid signature ([`crate::hybrid`] format) of `message`: the ECDSA P-256/SHA-256
/// half with `ecdsa_spki` and the ML-DSA-65 half with `ml_dsa_spki`, both over
/// `hybrid::signed_message(message)`. `Ok(true)` only if both halves are valid; `Ok(false)` for a
/// wrong half or malformed framing.
///
/// # Errors
/// [`Error::InvalidInput`] if a public key is not what it should be.
pub fn verify_hybrid(ecdsa_spki: &[u8], ml_dsa_spki: &[u8], message: &[u8], signature: &[u8]) -> Result<bool, Error> {
    use p256::ecdsa::signature::Verifier;
    use p256::pkcs8::DecodePublicKey;
    let vk = p256::ecdsa::VerifyingKey::from_public_key_der(ecdsa_spki)
        .map_err(|e| Error::InvalidInput(format!("hybrid key's ECDSA half is not a P-256 public key: {e}")))?;
    if parse_spki(ml_dsa_spki)?.0 != KeyAlgorithm::MlDsa65 {
        return Err(Error::InvalidInput("hybrid key's ML-DSA half is not an ML-DSA-65 public key".into()));
    }
    let Ok(parts) = hybrid::HybridSignature::decode(signature) else {
        return Ok(false);
    };
    let signed = hybrid::signed_message(message);
    let ecdsa_ok = p256::ecdsa::Signature::from_der(&parts.ecdsa).is_ok_and(|s| vk.verify(&signed, &s).is_ok());
    let ml_dsa_ok = verify_ml_dsa(ml_dsa_spki, &signed, &parts.ml_dsa)?;
    Ok(ecdsa_ok && ml_dsa_ok)
}

impl PublicKey {
    /// Checks a signature made by this ML-DSA or hybrid key, in-core, without the daemon (the
    /// same check as [`Client::verify`](crate::Client::verify) with the default scheme).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for other keys (check ECC and RSA signatures with OpenSSL or
    /// `Client::verify`).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: tpm_vault_client::Client, image: Vec<u8>, sig: Vec<u8>) -> Result<(), tpm_vault_client::Error> {
    /// // Once, at provisioning: the device stores the vault key's public part.
    /// let public = client.public_key("firmware").await?;
    /// // On the device, for every update:
    /// assert!(public.verify_signature(&image, &sig)?);
    /// # Ok(()) }
    /// ```
    pub fn verify_signature(&self, message: &[u8], signature: &[u8]) -> Result<bool, Error> {
        match (self.algorithm.info().map(|a| a.family), &self.ml_dsa) {
            (Some(Family::Hybrid), Some((ml_dsa_der, _))) => verify_hybrid(&self.der, ml_dsa_der, message, signature),
            (Some(Family::MlDsa), _) => verify_ml_dsa(&self.der, message, signature),
            (_, _) => Err(Error::InvalidInput(format!(
                "in-core verification is for ML-DSA and hybrid keys; this is a {:?} key",
                self.algorithm
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::kem::DecapsulationKey;
    use aws_lc_rs::signature::{KeyPair, PqdsaKeyPair, ML_DSA_65_SIGNING};

    use super::*;

    #[test]
    fn ml_dsa_spki_from_aws_lc_verifies() {
        let kp = PqdsaKeyPair::from_seed(&ML_DSA_65_SIGNING, &[1; 32]).unwrap();
        let spki = kp.public_key().as_der().unwrap();
        let mut sig = vec![0; 3309];
        kp.sign(b"m", &mut sig).unwrap();
        assert!(verify_ml_dsa(spki.as_ref(), b"m", &sig).unwrap());
        assert!(!verify_ml_dsa(spki.as_ref(), b"n", &sig).unwrap());
        assert!(verify_ml_dsa(b"junk", b"m", &sig).is_err());
    }

    /// FIPS 204: an ML-DSA public key is 1312, 1952 or 2592 bytes; one of another length is
    /// refused with an error saying so (aws-lc alone takes it and fails every signature, so a
    /// truncated key read as "signature invalid").
    /// An SPKI for a NIST algorithm OID 2.16.840.1.101.3.4.`arc`: SEQUENCE { SEQUENCE { OID },
    /// BIT STRING (0 unused bits) `key` }, for keys of 256 bytes or more.
    fn nist_spki(arc: [u8; 2], key: &[u8]) -> Vec<u8> {
        let oid = [0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, arc[0], arc[1]];
        let alg = [&[0x30, oid.len() as u8][..], &oid].concat();
        let bits = [&[0x03, 0x82][..], &((key.len() + 1) as u16).to_be_bytes(), &[0], key].concat();
        let body = [alg, bits].concat();
        [&[0x30, 0x82][..], &(body.len() as u16).to_be_bytes(), &body].concat()
    }

    #[test]
    fn ml_dsa_key_of_the_wrong_length_is_refused() {
        use aws_lc_rs::signature::{ML_DSA_44_SIGNING, ML_DSA_87_SIGNING};
        for (alg, oid_byte, name, len) in [
            (&ML_DSA_44_SIGNING, 0x11, "ML-DSA-44", 1312),
            (&ML_DSA_65_SIGNING, 0x12, "ML-DSA-65", 1952),
            (&ML_DSA_87_SIGNING, 0x13, "ML-DSA-87", 2592),
        ] {
            let kp = PqdsaKeyPair::from_seed(alg, &[1; 32]).unwrap();
            let pk = kp.public_key().as_ref().to_vec();
            let spki = |pk: &[u8]| nist_spki([0x03, oid_byte], pk);
            assert_eq!(spki(&pk), kp.public_key().as_der().unwrap().as_ref());
            let mut sig = vec![0; kp.algorithm().signature_len()];
            let n = kp.sign(b"m", &mut sig).unwrap();
            assert!(verify_ml_dsa(&spki(&pk), b"m", &sig[..n]).unwrap());
            for bad_len in [len - 1, len + 1] {
                let mut bad = pk.clone();
                bad.resize(bad_len, 0);
                let err = verify_ml_dsa(&spki(&bad), b"m", &sig[..n]).unwrap_err().to_string();
                assert!(err.contains(&format!("{name} public key is {bad_len} bytes, not {len}")), "{err}");
            }
        }
    }

    #[test]
    fn kem_round_trip_with_a_hand_built_spki() {
        let dk = DecapsulationKey::generate(&ML_KEM_768).unwrap();
        let ek = dk.encapsulation_key().unwrap().key_bytes().unwrap();
        // SEQUENCE { SEQUENCE { OID 2.16.840.1.101.3.4.4.2 }, BIT STRING (0 unused bits) ek }
        let mut der =
            vec![0x30, 0x82, 0x04, 0xb2, 0x30, 0x0b, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x04];
        der.extend_from_slice(&[0x02, 0x03, 0x82, 0x04, 0xa1, 0x00]);
        der.extend_from_slice(ek.as_ref());
        let key = KemPublicKey::from_spki(&der).unwrap();
        assert_eq!(key.algorithm(), KeyAlgorithm::MlKem768);
        let enc = key.encapsulate().unwrap();
        let secret = dk.decapsulate(enc.ciphertext.as_slice().into()).unwrap();
        assert_eq!(secret.as_ref(), enc.shared_secret());
        assert!(!format!("{enc:?}").contains(&hex::encode(enc.shared_secret())));
    }

    /// FIPS 203 section 7.2: an encapsulation key with a coefficient of q = 3329 or more is
    /// refused (found by the `pq_spki` and `ml_kem_key` fuzz targets; aws-lc alone accepts it).
    #[test]
    fn kem_key_with_a_coefficient_above_the_modulus_is_refused() {
        for (alg, oid_byte) in [(&ML_KEM_768, 0x02), (&ML_KEM_1024, 0x03)] {
            let dk = DecapsulationKey::generate(alg).unwrap();
            let mut ek = dk.encapsulation_key().unwrap().key_bytes().unwrap().as_ref().to_vec();
            let spki = |ek: &[u8]| nist_spki([0x04, oid_byte], ek);
            assert!(KemPublicKey::from_spki(&spki(&ek)).is_ok());
            // Coefficient 0 := 3329 (q itself): bytes 0 and the low nibble of byte 1.
            ek[0] = 0x01;
            ek[1] = (ek[1] & 0xf0) | 0x0d;
            let err = KemPublicKey::from_spki(&spki(&ek)).unwrap_err().to_string();
            assert!(err.contains("coefficient 0 is 3329"), "{err}");
            // One byte short.
            assert!(KemPublicKey::from_spki(&spki(&ek[1..])).is_err());
        }
    }
}
