//! Sealing: secrets that open only while PCRs hold approved values, and PCR reads.
//!
//! A sealed secret is a TPM sealed-data object holding a fresh 256-bit key, under a PolicyPCR
//! (or PolicyPCR + PolicyAuthorize) policy, plus the secret AES-256-GCM-encrypted in-core with
//! that key; both live in one record written atomically. Policy digests are computed in
//! software, so a secret can be sealed to PCR values the device only has after the next boot.
//! Create and unseal run in encrypted sessions: the key never crosses the TPM bus in clear.

use p256::pkcs8::DecodePublicKey;
use tpm_vault_proto::policy_digest;
use tpm_vault_proto::sealed_blob::{BlobError, BlobPolicy, SealedBlob};
use tpm_vault_proto::signed_policy;
use zeroize::Zeroizing;

use super::{blocking, unix_now, Vault};
use crate::auth::Denied;
use crate::crypto::aead;
use crate::error::{Error, Invalid};
use crate::model::{HashAlg, KeyAlg, KeyName, Owner, PcrBank, PcrSelection, Scheme, SignInput, Usage};
use crate::store::record::RECORD_VERSION;
use crate::store::{OwnerCheck, PcrPolicy, SealPolicy, SealedRecord, TpmObject};
use crate::tpm::{pcr, KeyBlob, PolicyAuth, TpmError};

/// What a secret is sealed to.
#[derive(Debug, Clone)]
pub enum SealTarget {
    /// These PCRs, at the given values or (None) their current values.
    Pcr {
        /// The bank and the PCRs of it the secret is bound to.
        selection: PcrSelection,
        /// Values to seal to, in selection order; `None` = current.
        values: Option<Vec<Vec<u8>>>,
    },
    /// Any values of these PCRs that the authority (ECC P-256 SPKI, DER) approves.
    Authorized {
        /// The bank and the PCRs of it the authority's approvals cover.
        selection: PcrSelection,
        /// Authority public key, DER SubjectPublicKeyInfo.
        authority_spki: Vec<u8>,
    },
}

/// A payload sealed by [`Vault::seal_envelope`]: what a record keeps of it.
pub(super) struct Envelope {
    /// The sealed object holding the payload's key.
    pub(super) object: TpmObject,
    /// The AES-256-GCM nonce.
    pub(super) nonce: [u8; aead::NONCE_LEN],
    /// Ciphertext and tag.
    pub(super) ciphertext: Vec<u8>,
}

/// The PolicyPCR digest of a PCR binding, the auth policy of an object bound to it.
///
/// # Errors
/// [`TpmError::Malformed`] for values that do not fit the bank.
pub(super) fn auth_policy(pcr: Option<&PcrPolicy>) -> Result<Option<Vec<u8>>, TpmError> {
    pcr.map(|p| pcr::policy_pcr_digest(&p.selection, &p.values)).transpose()
}

/// An unsealed 256-bit key, copied straight into a wiped-on-drop buffer (no stack copy).
fn key256(unsealed: &[u8], what: &str) -> Result<Zeroizing<[u8; 32]>, Error> {
    if unsealed.len() != 32 {
        return Err(Error::Internal(format!("{what}: unsealed {} bytes", unsealed.len())));
    }
    let mut key = Zeroizing::new([0u8; 32]);
    key.copy_from_slice(unsealed);
    Ok(key)
}

/// An approval of PCR values by a policy authority (the `SignedPolicy` of the API, which
/// `rpc/seal.rs` converts): see `tpm_vault_proto::signed_policy` for the messages signed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SignedPolicy {
    /// Format version (1).
    pub format_version: u32,
    /// PCR bank name.
    pub pcr_bank: String,
    /// PCR indices.
    pub pcrs: Vec<u32>,
    /// Approved values, one per PCR.
    pub pcr_values: Vec<Vec<u8>>,
    /// PolicyPCR digest of the values.
    pub approved_policy: Vec<u8>,
    /// Policy reference (empty).
    pub policy_ref: Vec<u8>,
    /// DER ECDSA signature over the approval message (what the TPM checks).
    pub signature: Vec<u8>,
    /// Version; approvals older than the newest used are revoked.
    pub policy_version: u64,
    /// Expiry, Unix seconds; 0 = never.
    pub expires_unix: i64,
    /// DER ECDSA signature over the envelope message (version and expiry included).
    pub envelope_signature: Vec<u8>,
    /// The authority's DER SubjectPublicKeyInfo.
    pub authority_spki: Vec<u8>,
}

/// What sealing produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealInfo {
    /// The sealed object's policy digest.
    pub policy_digest: Vec<u8>,
    /// PCRs it is bound to.
    pub selection: PcrSelection,
}

impl Vault {
    /// Reads PCR values (selection order).
    ///
    /// # Errors
    /// TPM errors.
    pub async fn pcr_read(&self, selection: &PcrSelection) -> Result<Vec<Vec<u8>>, Error> {
        let sel = selection.clone();
        let (_, values) = self.tpm().call(self.client, "pcr_read", move |tpm| tpm.pcr_read(&sel)).await?;
        Ok(values)
    }

    /// Extends a PCR (what a boot loader does with its kernel measurement). For tools and tests;
    /// not exposed over gRPC.
    ///
    /// # Errors
    /// TPM errors.
    pub async fn pcr_extend(&self, bank: PcrBank, index: u8, digest: Vec<u8>) -> Result<(), Error> {
        self.tpm().call(self.client, "pcr_extend", move |tpm| tpm.pcr_extend(bank, index, &digest)).await?;
        Ok(())
    }

    /// Computes the PolicyPCR digest for `target`, reading current values when none are given.
    pub(super) async fn pcr_policy(
        &self,
        selection: &PcrSelection,
        values: Option<Vec<Vec<u8>>>,
    ) -> Result<PcrPolicy, Error> {
        let values = match values {
            Some(v) => v,
            None => self.pcr_read(selection).await?,
        };
        pcr::policy_pcr_digest(selection, &values).map_err(|e| Error::invalid(e.to_string()))?;
        Ok(PcrPolicy { selection: selection.clone(), values })
    }

    /// Seals `secret` (any size) to `target`.
    ///
    /// # Errors
    /// [`Error::KeyExists`] unless `overwrite`; [`Error::InvalidArgument`] for bad PCR values or
    /// authority keys; TPM and store errors.
    pub async fn seal(
        &self,
        name: KeyName,
        secret: Zeroizing<Vec<u8>>,
        target: SealTarget,
        owner: impl Into<Owner>,
        overwrite: bool,
    ) -> Result<SealInfo, Error> {
        let overwrite = overwrite.then(OwnerCheck::any);
        self.seal_checked(name, secret, target, owner.into(), overwrite).await
    }

    /// [`Vault::seal`]; with `overwrite`, an existing secret is replaced only when the check
    /// allows it for that secret's owner, checked under the store's write lock (see
    /// [`crate::store::Table::replace_checked`]).
    ///
    /// # Errors
    /// As [`Vault::seal`]; [`Error::PermissionDenied`] when the check refuses.
    pub async fn seal_checked(
        &self,
        name: KeyName,
        secret: Zeroizing<Vec<u8>>,
        target: SealTarget,
        owner: Owner,
        overwrite: Option<OwnerCheck>,
    ) -> Result<SealInfo, Error> {
        let (owner_uid, owner_certificate) = owner.to_fields();
        let (policy, policy_digest, selection) = match target {
            SealTarget::Pcr { selection, values } => {
                let p = self.pcr_policy(&selection, values).await?;
                let digest = pcr::policy_pcr_digest(&p.selection, &p.values)?;
                (SealPolicy::Pcr { pcr: p }, digest, selection)
            }
            SealTarget::Authorized { selection, authority_spki } => {
                let authority = authority_key(&authority_spki)?;
                let key_name =
                    self.tpm().call(self.client, "load_external", move |tpm| tpm.external_name(&authority)).await?;
                let digest = pcr::policy_authorize_digest(&key_name, &[]);
                let policy =
                    SealPolicy::Authorized { selection: selection.clone(), authority_spki, min_policy_version: 0 };
                (policy, digest, selection)
            }
        };
        let envelope =
            self.seal_envelope("seal_create", Some(policy_digest.clone()), name.as_str().as_bytes(), &secret).await?;
        let record = SealedRecord {
            version: RECORD_VERSION,
            name: name.clone(),
            created_unix: unix_now(),
            owner_uid,
            owner_certificate,
            policy,
            policy_digest: policy_digest.clone(),
            object: envelope.object,
            nonce: envelope.nonce.to_vec(),
            ciphertext: envelope.ciphertext,
            direct: false,
        };
        let store = self.store().clone();
        blocking(move || match overwrite {
            Some(check) => store.sealed().replace_checked(&record, &check),
            None => store.sealed().insert(&record),
        })
        .await?;
        tracing::info!(secret = %name, pcrs = %selection, "secret sealed");
        Ok(SealInfo { policy_digest, selection })
    }

    /// Unseals a secret. Authorized-policy secrets need a [`SignedPolicy`] approving the
    /// current PCR values.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::PcrMismatch`] naming the PCRs that differ;
    /// [`Error::InvalidArgument`] / [`Error::PermissionDenied`] for a missing, malformed,
    /// expired, revoked or foreign approval; TPM errors.
    pub async fn unseal(&self, name: &KeyName, approval: Option<&SignedPolicy>) -> Result<Zeroizing<Vec<u8>>, Error> {
        let store = self.store().clone();
        let n = name.clone();
        let record = blocking(move || store.sealed().get(&n)).await?.ok_or_else(|| Error::not_found(name))?;
        // The plaintext and the response that carries it count against the caller's budget of
        // response bytes in flight before they are made (a large secret waits for the
        // caller's unread responses instead of adding to them).
        crate::auth::limits::reserve(record.ciphertext.len().saturating_add(64)).await?;
        let blob = KeyBlob::try_from(&record.object)?;
        let (auth, raise_to) = match &record.policy {
            SealPolicy::Pcr { pcr } => (PolicyAuth::Pcr(pcr.selection.clone()), None),
            SealPolicy::Authorized { selection, authority_spki, min_policy_version } => {
                let approval = approval.ok_or_else(|| {
                    Error::invalid(format!("{name} is sealed to an authorized policy: a signed policy is required"))
                })?;
                let auth = check_approval(approval, selection, authority_spki, *min_policy_version)?;
                // Name the mismatch before the TPM refuses without saying why.
                let current = self.pcr_read(selection).await?;
                if let Some(diff) = describe_mismatch(selection, &current, &approval.pcr_values) {
                    return Err(Error::PcrMismatch(format!(
                        "the signed policy does not approve the current PCRs: {diff}"
                    )));
                }
                let raise = (approval.policy_version > *min_policy_version).then_some(approval.policy_version);
                (auth, raise)
            }
        };
        let result = self.tpm().call(self.client, "unseal", move |tpm| tpm.unseal(&blob, Some(&auth))).await;
        let data_key = match result {
            Ok(k) => k,
            Err(e @ (TpmError::PolicyFailed | TpmError::Command { .. }))
                if matches!(record.policy, SealPolicy::Pcr { .. }) =>
            {
                return Err(self.pcr_mismatch_error(&record.policy, e).await);
            }
            Err(e) => return Err(e.into()),
        };
        if record.direct {
            // An imported small secret: the object held the secret itself.
            if let Some(v) = raise_to {
                let store = self.store().clone();
                let n = name.clone();
                blocking(move || store.raise_min_policy_version(&n, &record.object.tpm_name, v)).await?;
            }
            return Ok(data_key);
        }
        let data_key = key256(&data_key, "sealed secret")?;
        let plain =
            aead::open(&data_key, &record.nonce, name.as_str().as_bytes(), &record.ciphertext, "sealed ciphertext")?;
        if let Some(v) = raise_to {
            // Once a newer approval has been used, older ones are revoked for this secret.
            let store = self.store().clone();
            let n = name.clone();
            blocking(move || store.raise_min_policy_version(&n, &record.object.tpm_name, v)).await?;
        }
        Ok(plain)
    }

    /// Imports a secret sealed for this device elsewhere (a [`SealedBlob`]): checks that the
    /// blob's policy description is its object's policy, TPM2_Import under the SRK, and stores
    /// it as a sealed secret that [`Vault::unseal`] opens like any other. Nothing is stored
    /// when any step fails.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed blob, a policy that does not match the
    /// object, a payload sealed under another name; [`Error::KeyExists`]; a TPM refusal
    /// ([`TpmError::ImportRejected`]: another TPM's blob, or altered); store errors.
    pub async fn import_sealed(&self, name: KeyName, blob: &[u8], owner: Owner) -> Result<SealInfo, Error> {
        let bad = |e: BlobError| Error::invalid(format!("sealed blob: {e}"));
        let blob = SealedBlob::parse(blob).map_err(bad)?;
        if blob.payload.is_some() && blob.name != name.as_str() {
            return Err(Error::invalid(format!(
                "this blob was sealed as {:?}: import it under that name (its encrypted payload is bound to it)",
                blob.name
            )));
        }
        let policy_digest = blob.policy.digest().map_err(bad)?;
        if blob.object_auth_policy().map_err(bad)? != policy_digest {
            return Err(Error::invalid(
                "sealed blob: its policy description does not match the sealed object's policy",
            ));
        }
        let (policy, selection) = match blob.policy.clone() {
            BlobPolicy::Pcr { bank, pcrs, values } => {
                let selection = blob_selection(bank, &pcrs)?;
                (SealPolicy::Pcr { pcr: PcrPolicy { selection: selection.clone(), values } }, selection)
            }
            BlobPolicy::Authorized { bank, pcrs, authority_spki } => {
                let selection = blob_selection(bank, &pcrs)?;
                let authority_spki = authority_der(&authority_spki)?;
                (
                    SealPolicy::Authorized { selection: selection.clone(), authority_spki, min_policy_version: 0 },
                    selection,
                )
            }
        };
        // A name in use is refused before the TPM works (and again by the insert, atomically).
        let store = self.store().clone();
        let n = name.clone();
        if blocking(move || store.sealed().get(&n)).await?.is_some() {
            return Err(Error::KeyExists(name));
        }
        let (public, duplicate, seed) = (blob.public.clone(), blob.duplicate.clone(), blob.encrypted_seed.clone());
        let object = self.tpm().call(self.client, "import", move |tpm| tpm.import(&public, &duplicate, &seed)).await?;
        let (owner_uid, owner_certificate) = owner.to_fields();
        let (nonce, ciphertext) = blob.payload.map(|(n, c)| (n.to_vec(), c)).unwrap_or_default();
        let record = SealedRecord {
            version: RECORD_VERSION,
            name: name.clone(),
            created_unix: unix_now(),
            owner_uid,
            owner_certificate,
            policy,
            policy_digest: policy_digest.clone(),
            object,
            direct: nonce.is_empty(),
            nonce,
            ciphertext,
        };
        let store = self.store().clone();
        blocking(move || store.sealed().insert(&record)).await?;
        tracing::info!(secret = %name, pcrs = %selection, "sealed secret imported");
        Ok(SealInfo { policy_digest, selection })
    }

    /// Deletes a sealed secret.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], store errors.
    pub async fn delete_sealed(&self, name: &KeyName) -> Result<(), Error> {
        self.delete_sealed_checked(name, OwnerCheck::any()).await
    }

    /// [`Vault::delete_sealed`] when `check` allows it for the secret's owner, checked under the
    /// store's write lock.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::PermissionDenied`] when the check refuses; store errors.
    pub async fn delete_sealed_checked(&self, name: &KeyName, check: OwnerCheck) -> Result<(), Error> {
        let store = self.store().clone();
        let n = name.clone();
        if blocking(move || store.sealed().remove_checked(&n, &check)).await? {
            Ok(())
        } else {
            Err(Error::not_found(name))
        }
    }

    /// Approves PCR values, signing with a vault ECC P-256 key that has the `policy` usage.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a non-P-256 key or missing values;
    /// [`Error::PermissionDenied`] for a key without the `policy` usage; sign errors.
    pub async fn sign_policy(
        &self,
        key: &KeyName,
        selection: PcrSelection,
        values: Vec<Vec<u8>>,
        policy_version: u64,
        expires_unix: i64,
    ) -> Result<SignedPolicy, Error> {
        let (alg, spki) = self.public_key(key).await?;
        if alg != KeyAlg::EccP256 {
            return Err(Error::invalid(format!("policy authority {key} must be an ecc-p256 key")));
        }
        let approved = pcr::policy_pcr_digest(&selection, &values).map_err(|e| Error::invalid(e.to_string()))?;
        let sign = |msg: Vec<u8>| crate::vault::SignRequest {
            input: SignInput::Message(msg),
            hash: Some(HashAlg::Sha256),
            scheme: Some(Scheme::Ecdsa),
        };
        let approval = sign(signed_policy::approval_message(&approved, &[]));
        let signature = self.sign_as(key, approval, None, Usage::Policy).await?.signature;
        let envelope = signed_policy::envelope_message(&approved, &[], policy_version, expires_unix);
        let envelope_signature = self.sign_as(key, sign(envelope), None, Usage::Policy).await?.signature;
        Ok(SignedPolicy {
            format_version: 1,
            pcr_bank: selection.bank.as_str().into(),
            pcrs: selection.pcrs.iter().map(|&p| u32::from(p)).collect(),
            pcr_values: values,
            approved_policy: approved,
            policy_ref: vec![],
            signature,
            policy_version,
            expires_unix,
            envelope_signature,
            authority_spki: spki,
        })
    }

    /// Unseals a 256-bit key the vault sealed to itself (a data key, a post-quantum key's
    /// wrapping key), under its PCR policy if it has one. `what` names it in errors.
    ///
    /// # Errors
    /// [`Error::PcrMismatch`] naming the PCRs that differ when the policy does not hold; TPM
    /// errors; [`Error::Internal`] if the sealed object is not 32 bytes.
    pub(super) async fn unseal_key256(
        &self,
        what: &str,
        blob: KeyBlob,
        pcr_policy: Option<&PcrPolicy>,
    ) -> Result<Zeroizing<[u8; 32]>, Error> {
        let auth = pcr_policy.map(|p| PolicyAuth::Pcr(p.selection.clone()));
        let unsealed =
            match self.tpm().call(self.client, "unseal_key256", move |tpm| tpm.unseal(&blob, auth.as_ref())).await {
                Ok(k) => k,
                Err(e @ (TpmError::PolicyFailed | TpmError::Command { .. })) => {
                    return Err(match pcr_policy {
                        Some(pcr) => self.pcr_mismatch_error(&SealPolicy::Pcr { pcr: pcr.clone() }, e).await,
                        None => e.into(),
                    });
                }
                Err(e) => return Err(e.into()),
            };
        key256(&unsealed, what)
    }

    /// Seals a fresh 256-bit key from the DRBG in a new TPM sealed object, bound to
    /// `auth_policy` (a PolicyPCR or PolicyAuthorize digest) or to none. Returns the object to
    /// store and the key. The counterpart of [`Vault::unseal_key256`].
    ///
    /// # Errors
    /// TPM and DRBG errors.
    pub(super) async fn seal_key256(
        &self,
        label: &'static str,
        auth_policy: Option<Vec<u8>>,
    ) -> Result<(TpmObject, Zeroizing<[u8; 32]>), Error> {
        let mut key = Zeroizing::new([0u8; 32]);
        self.random(key.as_mut())?;
        let sealed = key.clone();
        let object = self
            .tpm()
            .call(self.client, label, move |tpm| tpm.seal_key(auth_policy.as_deref(), sealed.as_slice()))
            .await?;
        Ok((object, key))
    }

    /// The vault's one envelope: a fresh key sealed in the TPM ([`Vault::seal_key256`]) and
    /// `plain` AES-256-GCM-encrypted in-core under it ([`aead`]) with `aad` as associated data
    /// and a nonce from the DRBG. Opened with [`Vault::unseal_key256`] (or a policy unseal) and
    /// [`aead::open`].
    ///
    /// # Errors
    /// TPM, DRBG and cipher errors.
    pub(super) async fn seal_envelope(
        &self,
        label: &'static str,
        auth_policy: Option<Vec<u8>>,
        aad: &[u8],
        plain: &[u8],
    ) -> Result<Envelope, Error> {
        let (object, key) = self.seal_key256(label, auth_policy).await?;
        let mut nonce = [0u8; aead::NONCE_LEN];
        self.random(&mut nonce)?;
        let ciphertext = aead::seal(&key, nonce, aad, plain)?;
        Ok(Envelope { object, nonce, ciphertext })
    }

    /// Explains `cause`, the TPM's refusal of a PCR-bound object: the FAILED_PRECONDITION error
    /// naming the PCRs that differ (current vs sealed values) when they do, else `cause` itself
    /// unless it was a policy failure.
    pub(super) async fn pcr_mismatch_error(&self, policy: &SealPolicy, cause: TpmError) -> Error {
        let SealPolicy::Pcr { pcr } = policy else {
            return cause.into();
        };
        match self.pcr_read(&pcr.selection).await {
            Ok(current) => match describe_mismatch(&pcr.selection, &current, &pcr.values) {
                Some(diff) => Error::PcrMismatch(format!("PCR values differ from the sealed ones: {diff}")),
                // Same values now, and the TPM failed the policy: a PCR changed and changed back
                // between the two reads; the caller may retry.
                None if matches!(cause, TpmError::PolicyFailed) => {
                    Error::PcrMismatch(format!("the PCR policy over {} was not satisfied; retry", pcr.selection))
                }
                // The PCRs are as sealed: the TPM refused for another reason (a damaged blob, an
                // object of another TPM), which the caller must see as it is.
                None => cause.into(),
            },
            Err(e) => e,
        }
    }
}

/// The PCR selection of a blob's policy (bank by `TPM_ALG_ID`).
fn blob_selection(bank: u16, pcrs: &[u8]) -> Result<PcrSelection, Error> {
    let bank = match bank {
        policy_digest::ALG_SHA1 => PcrBank::Sha1,
        policy_digest::ALG_SHA256 => PcrBank::Sha256,
        policy_digest::ALG_SHA384 => PcrBank::Sha384,
        other => return Err(Error::invalid(format!("sealed blob: unsupported PCR bank 0x{other:04x}"))),
    };
    let pcrs: Vec<u32> = pcrs.iter().map(|&p| u32::from(p)).collect();
    Ok(PcrSelection::new(bank, &pcrs)?)
}

/// "sha256:9 is ab…, expected cd…" for each PCR whose value differs; None if all match.
pub(super) fn describe_mismatch(sel: &PcrSelection, current: &[Vec<u8>], expected: &[Vec<u8>]) -> Option<String> {
    let diffs: Vec<String> = sel
        .pcrs
        .iter()
        .zip(current.iter().zip(expected))
        .filter(|(_, (c, e))| c != e)
        .map(|(p, (c, e))| format!("{}:{p} is {}, expected {}", sel.bank.as_str(), hex::encode(c), hex::encode(e)))
        .collect();
    (!diffs.is_empty()).then(|| diffs.join("; "))
}

/// Checks an approval against the recorded authority in software (so a foreign, expired or
/// revoked approval gets a clear error) and converts it for the TPM, which checks it again.
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed approval or one for other PCRs;
/// [`Error::PermissionDenied`] for a foreign, expired or revoked one.
pub fn check_approval(
    approval: &SignedPolicy,
    selection: &PcrSelection,
    authority_spki: &[u8],
    min_version: u64,
) -> Result<PolicyAuth, Error> {
    use p256::ecdsa::signature::Verifier;
    let bad = |m: &str| Error::from(Invalid::SignedPolicy(m.to_owned()));
    if approval.format_version != 1 {
        return Err(bad("unsupported format version"));
    }
    let bank: PcrBank = approval.pcr_bank.parse()?;
    let approved_sel = PcrSelection::new(bank, &approval.pcrs)?;
    if &approved_sel != selection {
        return Err(bad(&format!("approves {approved_sel}, but the secret is sealed to {selection}")));
    }
    let digest = pcr::policy_pcr_digest(&approved_sel, &approval.pcr_values).map_err(|e| bad(&e.to_string()))?;
    if digest != approval.approved_policy {
        return Err(bad("approved_policy does not match the approved PCR values"));
    }
    let vk = p256::ecdsa::VerifyingKey::from_public_key_der(authority_spki)
        .map_err(|e| Error::Internal(format!("recorded authority key: {e}")))?;
    let sig = p256::ecdsa::Signature::from_der(&approval.signature).map_err(|_| bad("malformed signature"))?;
    let env = p256::ecdsa::Signature::from_der(&approval.envelope_signature).map_err(|_| bad("malformed signature"))?;
    let approval_msg = signed_policy::approval_message(&approval.approved_policy, &approval.policy_ref);
    let envelope_msg = signed_policy::envelope_message(
        &approval.approved_policy,
        &approval.policy_ref,
        approval.policy_version,
        approval.expires_unix,
    );
    if vk.verify(&approval_msg, &sig).is_err() || vk.verify(&envelope_msg, &env).is_err() {
        return Err(Error::from(Denied::ForeignAuthority));
    }
    if approval.expires_unix != 0 && approval.expires_unix < unix_now() {
        return Err(Error::from(Denied::Expired(approval.expires_unix)));
    }
    if approval.policy_version < min_version {
        return Err(Error::from(Denied::Revoked { version: approval.policy_version, minimum: min_version }));
    }
    Ok(PolicyAuth::Authorized {
        selection: selection.clone(),
        authority: authority_key(authority_spki)?,
        approved_policy: approval.approved_policy.clone(),
        policy_ref: approval.policy_ref.clone(),
        signature: sig,
    })
}

/// An ECC P-256 authority key given as DER (or PEM) SPKI.
fn authority_key(spki: &[u8]) -> Result<p256::PublicKey, Error> {
    p256::PublicKey::from_public_key_der(spki)
        .or_else(|_| {
            std::str::from_utf8(spki)
                .map_err(|_| ())
                .and_then(|pem| p256::PublicKey::from_public_key_pem(pem).map_err(|_| ()))
        })
        .map_err(|()| Error::invalid("policy authority must be an ECC P-256 public key (SPKI DER or PEM)"))
}

/// Normalises an authority key to DER SPKI.
///
/// # Errors
/// [`Error::InvalidArgument`] if it is not an ECC P-256 key.
pub fn authority_der(spki_der_or_pem: &[u8]) -> Result<Vec<u8>, Error> {
    use p256::pkcs8::EncodePublicKey;
    authority_key(spki_der_or_pem)?
        .to_public_key_der()
        .map(|d| d.as_bytes().to_vec())
        .map_err(|e| Error::Internal(format!("encode authority key: {e}")))
}
