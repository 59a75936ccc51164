//! Post-quantum keys guarded by the TPM: ML-DSA (FIPS 204) and ML-KEM (FIPS 203) keys, and the
//! ML-DSA-65 half of hybrid keys.
//!
//! TPMs cannot compute these algorithms, so the private material is made in-core and then
//! sealed exactly like a sealed secret:
//! - ML-DSA: a 32-byte seed ξ from the vault DRBG ([`Vault::random`]), expanded with aws-lc-rs
//!   `PqdsaKeyPair::from_seed`; the seed is what gets sealed.
//! - ML-KEM: aws-lc-rs `DecapsulationKey::generate` (its randomness comes from aws-lc's own RNG:
//!   aws-lc-rs 1.19 has no from-seed constructor for ML-KEM), and the FIPS 203 decapsulation key
//!   from `key_bytes()` is what gets sealed.
//!
//! A TPM sealed object holds a fresh 256-bit wrapping key (under the key's PolicyPCR when it is
//! PCR-bound; created and unsealed through the salted, encrypted session, so the wrapping key
//! never crosses the TPM interface in clear), and the material is AES-256-GCM-encrypted in-core
//! with it, with the key's name, algorithm and public key as associated data. Both go into the
//! key record (its `pq` section, see [`crate::store::PqSection`]).
//!
//! On use, the wrapping key is unsealed, the material decrypted into zeroized buffers and turned
//! into an aws-lc key object, which stays in `PqCache` until it has been idle for the data-key
//! idle time (aws-lc frees key objects with `OPENSSL_free`, which wipes them). So a PCR-bound key
//! keeps working after its PCRs change until its unsealed copy is evicted; the next unseal then
//! fails with [`Error::PcrMismatch`] naming the PCR. No API returns the material, and none of it
//! is logged.
//!
//! ML-DSA signs whole messages (pure ML-DSA, empty context; aws-lc-rs has neither HashML-DSA nor
//! external-mu signing), so a digest is refused. Hybrid signatures are an ECDSA P-256 signature
//! by the key's TPM half and an ML-DSA-65 signature over the same message, in the
//! [`tpm_vault_proto::hybrid`] format.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lc_rs::kem::{Ciphertext, DecapsulationKey};
use aws_lc_rs::signature::{KeyPair, PqdsaKeyPair};
use tpm_vault_proto::hybrid;
use zeroize::Zeroizing;

use super::{blocking, seal, Loaded, SignOutput, SignRequest, Vault};
use crate::crypto::aead;
use crate::crypto::pq as algs;
use crate::error::Error;
use crate::model::{HashAlg, KeyAlg, KeyName, Scheme, SignInput};
use crate::store::{PcrPolicy, PqSection, SealPolicy, TpmObject};
use crate::tpm::{PolicyAuth, SignJob, TpmError};

/// Domain separator at the start of the AES-GCM associated data.
const AAD_CONTEXT: &[u8] = b"tpm-vault/pq-key/v1\0";

/// An unsealed post-quantum private key (an aws-lc key object; wiped by aws-lc when dropped).
pub(crate) enum PqPrivate {
    /// ML-DSA key pair.
    MlDsa(PqdsaKeyPair),
    /// ML-KEM decapsulation key.
    MlKem(DecapsulationKey),
}

impl std::fmt::Debug for PqPrivate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::MlDsa(_) => "PqPrivate::MlDsa(..)",
            Self::MlKem(_) => "PqPrivate::MlKem(..)",
        })
    }
}

impl PqPrivate {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let Self::MlDsa(kp) = self else {
            return Err(Error::Internal("ML-KEM key asked to sign".into()));
        };
        let mut sig = vec![0u8; kp.algorithm().signature_len()];
        let n = kp.sign(message, &mut sig).map_err(|_| Error::Internal("ML-DSA signing failed".into()))?;
        sig.truncate(n);
        Ok(sig)
    }

    fn decapsulate(&self, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        let Self::MlKem(dk) = self else {
            return Err(Error::Internal("ML-DSA key asked to decapsulate".into()));
        };
        let secret = dk
            .decapsulate(Ciphertext::from(ciphertext))
            .map_err(|_| Error::invalid("ML-KEM ciphertext was rejected"))?;
        Ok(Zeroizing::new(secret.as_ref().to_vec()))
    }
}

struct Entry {
    key: Arc<PqPrivate>,
    /// Name of the sealed object it came from: a key deleted and re-created under the same name
    /// never finds the old one.
    tag: Vec<u8>,
    used: Instant,
}

/// Unsealed post-quantum keys by key name, with their last use.
#[derive(Default)]
pub(crate) struct PqCache {
    map: Mutex<HashMap<KeyName, Entry>>,
}

impl std::fmt::Debug for PqCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PqCache").finish_non_exhaustive()
    }
}

impl PqCache {
    fn get(&self, name: &KeyName, tag: &[u8]) -> Option<Arc<PqPrivate>> {
        let mut map = self.map.lock().ok()?;
        let entry = map.get_mut(name).filter(|e| e.tag == tag)?;
        entry.used = Instant::now();
        Some(entry.key.clone())
    }

    fn put(&self, name: KeyName, tag: Vec<u8>, key: Arc<PqPrivate>) {
        if let Ok(mut map) = self.map.lock() {
            map.insert(name, Entry { key, tag, used: Instant::now() });
        }
    }

    pub(crate) fn remove(&self, name: &KeyName) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(name);
        }
    }

    /// Drops keys idle for longer than `idle` (all of them for `Duration::ZERO`).
    pub(crate) fn evict_idle(&self, idle: Duration) -> usize {
        let Ok(mut map) = self.map.lock() else { return 0 };
        let before = map.len();
        map.retain(|_, e| e.used.elapsed() < idle && !idle.is_zero());
        before - map.len()
    }
}

/// Freshly generated material: the raw public key and the private part to seal.
struct Material {
    public_key: Vec<u8>,
    private: Zeroizing<Vec<u8>>,
}

fn aad(name: &KeyName, alg: KeyAlg, public_key: &[u8]) -> Vec<u8> {
    [AAD_CONTEXT, name.as_str().as_bytes(), b"\0", alg.as_str().as_bytes(), b"\0", public_key].concat()
}

/// Rebuilds the key object from unsealed material, checking it against the stored public key.
fn expand(alg: KeyAlg, material: &[u8], public_key: &[u8]) -> Result<PqPrivate, Error> {
    let mismatch = || Error::Internal(format!("unsealed {alg} key does not match its public key"));
    if let Some(signing) = algs::ml_dsa_signing(alg) {
        let kp = PqdsaKeyPair::from_seed(signing, material).map_err(|_| mismatch())?;
        if kp.public_key().as_ref() != public_key {
            return Err(mismatch());
        }
        return Ok(PqPrivate::MlDsa(kp));
    }
    let (kem, (ek_len, dk_len, _)) = algs::ml_kem(alg)
        .zip(algs::ml_kem_sizes(alg))
        .ok_or_else(|| Error::Internal(format!("{alg} has no post-quantum key")))?;
    // FIPS 203 dk = dk_PKE (384·k bytes) || ek || H(ek) || z: the embedded ek must be ours.
    let ek_at = dk_len - ek_len - 64;
    if material.len() != dk_len || material.get(ek_at..ek_at + ek_len) != Some(public_key) {
        return Err(mismatch());
    }
    Ok(PqPrivate::MlKem(DecapsulationKey::new(kem, material).map_err(|_| mismatch())?))
}

/// The message of an ML-DSA or hybrid signature: whole messages only.
fn whole_message(input: SignInput, alg: KeyAlg) -> Result<Vec<u8>, Error> {
    match input {
        SignInput::Digest(_) => Err(Error::invalid(format!(
            "{alg} keys sign messages, not digests (ML-DSA hashes the whole message itself); send the message"
        ))),
        SignInput::Message(m) if m.len() > SignInput::MAX_MESSAGE => Err(Error::invalid(format!(
            "message of {} bytes exceeds the {} byte limit of {alg} keys, which sign whole messages; sign a \
             manifest holding the file's hash instead",
            m.len(),
            SignInput::MAX_MESSAGE
        ))),
        SignInput::Message(m) => Ok(m),
    }
}

/// Checks the hash named for an ML-DSA (none) or hybrid (SHA-256) signature.
fn check_hash(scheme: Scheme, hash: Option<HashAlg>) -> Result<(), Error> {
    match (scheme, hash) {
        (Scheme::MlDsa, None) | (Scheme::Hybrid, None | Some(HashAlg::Sha256)) => Ok(()),
        (Scheme::MlDsa, Some(h)) => Err(Error::invalid(format!(
            "ML-DSA hashes the message itself (SHAKE256); hash {} does not apply",
            h.as_str()
        ))),
        (_, Some(h)) => Err(Error::invalid(format!("the hybrid scheme's ECDSA half uses sha256, not {}", h.as_str()))),
        (_, None) => Ok(()),
    }
}

impl Vault {
    /// Generates post-quantum material for `alg` (ML-DSA, ML-KEM, or a hybrid key's ML-DSA-65
    /// half), seals a fresh wrapping key in a TPM sealed object (PCR-bound if `pcr` is given)
    /// and encrypts the material with it. Returns the record section (without `wrapping_key`)
    /// and the sealed object.
    pub(super) async fn seal_pq(
        &self,
        name: &KeyName,
        alg: KeyAlg,
        pcr: Option<&PcrPolicy>,
    ) -> Result<(PqSection, TpmObject), Error> {
        let part = algs::pq_part(alg).ok_or_else(|| Error::Internal(format!("{alg} has no post-quantum part")))?;
        let material = self.generate_pq(part)?;
        let aad = aad(name, alg, &material.public_key);
        let envelope = self.seal_envelope("pq_seal_create", seal::auth_policy(pcr)?, &aad, &material.private).await?;
        let section = PqSection {
            public_key: material.public_key,
            nonce: envelope.nonce.to_vec(),
            ciphertext: envelope.ciphertext,
            wrapping_key: None,
        };
        Ok((section, envelope.object))
    }

    fn generate_pq(&self, alg: KeyAlg) -> Result<Material, Error> {
        if let Some(signing) = algs::ml_dsa_signing(alg) {
            let mut seed = Zeroizing::new([0u8; 32]);
            self.random(seed.as_mut())?;
            let kp = PqdsaKeyPair::from_seed(signing, seed.as_ref())
                .map_err(|_| Error::Internal(format!("{alg} key generation failed")))?;
            return Ok(Material {
                public_key: kp.public_key().as_ref().to_vec(),
                private: Zeroizing::new(seed.to_vec()),
            });
        }
        let kem = algs::ml_kem(alg).ok_or_else(|| Error::Internal(format!("{alg} has no post-quantum key")))?;
        let failed = |_| Error::Internal(format!("{alg} key generation failed"));
        let dk = DecapsulationKey::generate(kem).map_err(failed)?;
        let private = Zeroizing::new(dk.key_bytes().map_err(failed)?.as_ref().to_vec());
        let public_key = dk.encapsulation_key().and_then(|ek| ek.key_bytes()).map_err(failed)?.as_ref().to_vec();
        Ok(Material { public_key, private })
    }

    /// The unsealed post-quantum key of `loaded`, from memory or unsealed now.
    async fn pq_private(&self, loaded: &Loaded) -> Result<Arc<PqPrivate>, Error> {
        let record = &loaded.record;
        let name = &record.name;
        let (Some(pq), Some(wrap), Some(part)) = (&record.pq, &loaded.wrap, algs::pq_part(record.alg)) else {
            return Err(Error::Internal(format!("key {name} has no sealed post-quantum part")));
        };
        if let Some(key) = self.inner.pqkeys.get(name, &wrap.name) {
            return Ok(key);
        }
        let blob = wrap.clone();
        let wrapping_key = self.unseal_key256(&format!("key {name}"), blob, record.pcr_policy.as_ref()).await?;
        let aad = aad(name, record.alg, &pq.public_key);
        let material = aead::open(&wrapping_key, &pq.nonce, &aad, &pq.ciphertext, "sealed post-quantum key")?;
        let key = Arc::new(expand(part, &material, &pq.public_key)?);
        self.inner.pqkeys.put(name.clone(), wrap.name.clone(), key.clone());
        Ok(key)
    }

    /// [`Vault::sign`] for ML-DSA and hybrid keys.
    pub(super) async fn sign_pq(&self, loaded: &Arc<Loaded>, req: SignRequest) -> Result<SignOutput, Error> {
        let alg = loaded.record.alg;
        let scheme = req.scheme.unwrap_or_else(|| alg.default_scheme());
        alg.check_scheme(scheme)?;
        check_hash(scheme, req.hash)?;
        let message = whole_message(req.input, alg)?;
        if scheme == Scheme::MlDsa {
            let key = self.pq_private(loaded).await?;
            let signature = blocking(move || key.sign(&message)).await?;
            return Ok(SignOutput { signature, scheme, hash: None });
        }
        // Hybrid: the TPM signs SHA-256(M') with the ECDSA half while the ML-DSA half signs M'.
        let signed = hybrid::signed_message(&message);
        let job = SignJob {
            key: loaded.blob.clone(),
            alg: KeyAlg::EccP256,
            scheme: Scheme::Ecdsa,
            hash: HashAlg::Sha256,
            digest: HashAlg::Sha256.digest(&signed),
            auth: None,
            policy: loaded.record.pcr_policy.as_ref().map(|p| PolicyAuth::Pcr(p.selection.clone())),
        };
        let ecdsa = self.tpm().call(self.client, "sign", move |tpm| tpm.sign(&job));
        let ml_dsa = async {
            let key = self.pq_private(loaded).await?;
            blocking(move || key.sign(&signed)).await
        };
        let (ecdsa, ml_dsa) = tokio::join!(ecdsa, ml_dsa);
        let ecdsa = match ecdsa {
            Err(TpmError::PolicyFailed) => {
                return Err(match loaded.record.pcr_policy.clone() {
                    Some(pcr) => self.pcr_mismatch_error(&SealPolicy::Pcr { pcr }, TpmError::PolicyFailed).await,
                    None => TpmError::PolicyFailed.into(),
                });
            }
            other => other?,
        };
        let parts = hybrid::HybridSignature { ecdsa, ml_dsa: ml_dsa? };
        let signature = parts.encode().map_err(|e| Error::Internal(format!("hybrid signature: {e}")))?;
        Ok(SignOutput { signature, scheme, hash: Some(HashAlg::Sha256) })
    }

    /// [`Vault::verify`] for ML-DSA and hybrid keys (public keys only; nothing is unsealed).
    pub(super) async fn verify_pq(
        &self,
        loaded: &Loaded,
        input: SignInput,
        signature: &[u8],
        hash: Option<HashAlg>,
        scheme: Option<Scheme>,
    ) -> Result<bool, Error> {
        let alg = loaded.record.alg;
        let scheme = scheme.unwrap_or_else(|| alg.default_scheme());
        alg.check_scheme(scheme)?;
        check_hash(scheme, hash)?;
        let message = whole_message(input, alg)?;
        let pk = loaded.record.pq.as_ref().map(|pq| pq.public_key.clone()).unwrap_or_default();
        let signature = signature.to_vec();
        if scheme == Scheme::MlDsa {
            return blocking(move || algs::verify_ml_dsa(alg, &pk, &message, &signature)).await;
        }
        let ecdsa_spki = loaded.spki.clone();
        blocking(move || algs::verify_hybrid(&ecdsa_spki, &pk, &message, &signature)).await
    }

    /// Decapsulates an ML-KEM ciphertext with ML-KEM key `name` and returns the shared secret.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::InvalidArgument`] for a key that is not ML-KEM or a
    /// ciphertext of the wrong length; [`Error::PcrMismatch`] when a PCR-bound key's PCRs
    /// changed; TPM errors.
    pub async fn decapsulate(&self, name: &KeyName, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        let loaded = self.load(name).await?;
        let alg = loaded.record.alg;
        let Some((_, _, ct_len)) = algs::ml_kem_sizes(alg) else {
            return Err(Error::invalid(format!("key {name} is a {alg} key; only ML-KEM keys decapsulate")));
        };
        if ciphertext.len() != ct_len {
            return Err(Error::invalid(format!("{alg} ciphertexts are {ct_len} bytes, not {}", ciphertext.len())));
        }
        let key = self.pq_private(&loaded).await?;
        key.decapsulate(ciphertext)
    }

    /// A hybrid key's ML-DSA-65 half as DER SubjectPublicKeyInfo; `None` for other keys.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], store errors.
    pub async fn hybrid_ml_dsa_public_key(&self, name: &KeyName) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.load(name).await?.pq_spki.clone())
    }

    /// Forgets every unsealed post-quantum key (the next use unseals again, and so re-checks
    /// PCRs). Returns how many were dropped.
    pub fn evict_pq_keys(&self) -> usize {
        self.inner.pqkeys.evict_idle(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_material_is_bound_to_name_algorithm_and_public_key() {
        let name = KeyName::try_from("fw").unwrap();
        let other = KeyName::try_from("fw2").unwrap();
        let key = [3u8; 32];
        let decrypt = |aad: &[u8], ct: &[u8]| aead::open(&key, &[1; 12], aad, ct, "test");
        let ct = aead::seal(&key, [1; 12], &aad(&name, KeyAlg::MlDsa65, b"pk"), b"seed").unwrap();
        assert_eq!(decrypt(&aad(&name, KeyAlg::MlDsa65, b"pk"), &ct).unwrap().as_slice(), b"seed");
        assert!(decrypt(&aad(&other, KeyAlg::MlDsa65, b"pk"), &ct).is_err());
        assert!(decrypt(&aad(&name, KeyAlg::MlDsa44, b"pk"), &ct).is_err());
        assert!(decrypt(&aad(&name, KeyAlg::MlDsa65, b"pK"), &ct).is_err());
    }

    #[test]
    fn expand_checks_the_public_key() {
        let kp = PqdsaKeyPair::from_seed(&aws_lc_rs::signature::ML_DSA_44_SIGNING, &[5; 32]).unwrap();
        assert!(expand(KeyAlg::MlDsa44, &[5; 32], kp.public_key().as_ref()).is_ok());
        assert!(expand(KeyAlg::MlDsa44, &[6; 32], kp.public_key().as_ref()).is_err());
        let dk = DecapsulationKey::generate(&aws_lc_rs::kem::ML_KEM_768).unwrap();
        let bytes = dk.key_bytes().unwrap();
        let ek = dk.encapsulation_key().unwrap().key_bytes().unwrap();
        assert!(expand(KeyAlg::MlKem768, bytes.as_ref(), ek.as_ref()).is_ok());
        assert!(expand(KeyAlg::MlKem768, bytes.as_ref(), &[0; 1184]).is_err());
    }

    #[test]
    fn digests_and_wrong_hashes_are_refused() {
        assert!(
            matches!(whole_message(SignInput::Digest(vec![0; 32]), KeyAlg::MlDsa65), Err(Error::InvalidArgument(m)) if m.to_string().contains("not digests"))
        );
        assert!(whole_message(SignInput::Message(vec![0; SignInput::MAX_MESSAGE + 1]), KeyAlg::MlDsa65).is_err());
        assert!(check_hash(Scheme::MlDsa, Some(HashAlg::Sha256)).is_err());
        assert!(check_hash(Scheme::Hybrid, Some(HashAlg::Sha384)).is_err());
        assert!(check_hash(Scheme::Hybrid, Some(HashAlg::Sha256)).is_ok());
    }
}
