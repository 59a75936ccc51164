//! Attestation: the attestation keys (an ECC one and, on request, an RSA one for Keylime; each
//! created once, kept like other keys), quotes over caller nonces with the PCR values that match
//! them, the AK's certification of itself (proof of possession), the endorsement key, and
//! credential activation.

use std::sync::Arc;

use zeroize::Zeroizing;

use super::{blocking, parse_record, unix_now, Loaded, Vault};
use crate::error::{Error, Invalid};
use crate::model::{KeyAlg, PcrSelection};
use crate::store::record::RECORD_VERSION;
use crate::store::{ak_name, KeyRecord};
use crate::tpm::convert;

/// Largest nonce accepted (TPM2B_DATA holds at most a digest of the largest hash, 64 bytes).
pub const MAX_NONCE: usize = 64;

/// Which attestation key: the vault keeps one of each kind, each created on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AkKind {
    /// Restricted ECC P-256, ECDSA-SHA256 (`ak.key`): the default.
    #[default]
    Ecc,
    /// Restricted RSA 2048, RSASSA-SHA256 (`ak-rsa.key`): what Keylime expects by default.
    Rsa,
}

impl AkKind {
    /// Parses the `ak_alg` field of the attestation RPCs: empty or `ecc-p256`, or `rsa-2048`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for anything else.
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "" | "ecc-p256" => Ok(Self::Ecc),
            "rsa-2048" => Ok(Self::Rsa),
            other => Err(Error::invalid(format!(
                "unknown attestation key algorithm {other:?}: expected ecc-p256 or rsa-2048"
            ))),
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Ecc => 0,
            Self::Rsa => 1,
        }
    }

    fn record_name(self) -> crate::model::KeyName {
        match self {
            Self::Ecc => ak_name(),
            Self::Rsa => crate::model::KeyName::attestation_key_rsa(),
        }
    }

    fn alg(self) -> KeyAlg {
        match self {
            Self::Ecc => KeyAlg::EccP256,
            Self::Rsa => KeyAlg::Rsa2048,
        }
    }
}

/// The attestation key's public facts.
#[derive(Debug, Clone)]
pub struct AkInfo {
    /// DER SubjectPublicKeyInfo.
    pub spki: Vec<u8>,
    /// TPM name.
    pub name: Vec<u8>,
    /// Marshalled TPM2B_PUBLIC (what a Keylime registrar takes as `aik_tpm`).
    pub tpm2b_public: Vec<u8>,
}

impl AkInfo {
    fn of(loaded: &Loaded) -> Self {
        Self {
            spki: loaded.spki.clone(),
            name: loaded.record.object.tpm_name.clone(),
            tpm2b_public: loaded.record.object.public.clone(),
        }
    }
}

/// The storage root key's public parts.
#[derive(Debug, Clone)]
pub struct SrkInfo {
    /// `TPM2B_PUBLIC`.
    pub tpm2b: Vec<u8>,
    /// DER SubjectPublicKeyInfo.
    pub spki: Vec<u8>,
    /// TPM name.
    pub name: Vec<u8>,
}

/// A quote with the PCR values it covers.
#[derive(Debug, Clone)]
pub struct QuoteOutput {
    /// Marshalled TPMS_ATTEST.
    pub attest: Vec<u8>,
    /// Marshalled TPMT_SIGNATURE.
    pub signature: Vec<u8>,
    /// PCR values in selection order.
    pub values: Vec<Vec<u8>>,
    /// The AK.
    pub ak: AkInfo,
}

impl Vault {
    /// The attestation key, created under the SRK on first use and stored in `ak.key`.
    ///
    /// # Errors
    /// TPM and store errors.
    pub async fn attestation_key(&self) -> Result<AkInfo, Error> {
        self.attestation_key_of(AkKind::Ecc).await
    }

    /// The attestation key of `kind`, created under the SRK on first use.
    ///
    /// # Errors
    /// TPM and store errors.
    pub async fn attestation_key_of(&self, kind: AkKind) -> Result<AkInfo, Error> {
        Ok(AkInfo::of(&*self.ak(kind).await?))
    }

    /// The attestation key's parsed record: read (or created) once, then kept in memory, so a
    /// quote costs its TPM commands and no file read.
    async fn ak(&self, kind: AkKind) -> Result<Arc<Loaded>, Error> {
        if let Some(ak) = self.inner.ak.lock().ok().and_then(|a| a[kind.index()].clone()) {
            return Ok(ak);
        }
        let loaded = Arc::new(parse_record(self.ak_record(kind).await?)?);
        if let Ok(mut slot) = self.inner.ak.lock() {
            slot[kind.index()] = Some(loaded.clone());
        }
        Ok(loaded)
    }

    async fn ak_record(&self, kind: AkKind) -> Result<KeyRecord, Error> {
        let store = self.store().clone();
        if let Some(r) = blocking(move || store.attestation_key(&kind.record_name())).await? {
            return Ok(r);
        }
        let object = match kind {
            AkKind::Ecc => self.tpm().call(self.client, "create_ak", |tpm| tpm.create_attestation_key()).await?,
            AkKind::Rsa => self.tpm().call(self.client, "create_ak", |tpm| tpm.create_attestation_key_rsa()).await?,
        };
        let record = KeyRecord {
            version: RECORD_VERSION,
            name: kind.record_name(),
            alg: kind.alg(),
            created_unix: unix_now(),
            owner_uid: 0,
            owner_certificate: None,
            object,
            has_auth: false,
            pcr_policy: None,
            cert_chain_pem: None,
            cert_version: 0,
            pq: None,
            // Never reachable through Sign (it quotes and certifies only).
            usages: Some(crate::model::Usages::DEFAULT),
        };
        let store = self.store().clone();
        let r = record.clone();
        match blocking(move || store.insert_attestation_key(&r)).await {
            Ok(()) => {
                tracing::info!(name = %hex::encode(&record.object.tpm_name), "attestation key created");
                Ok(record)
            }
            // A concurrent first use created it: use that one.
            Err(Error::KeyExists(_)) => {
                let store = self.store().clone();
                blocking(move || store.attestation_key(&kind.record_name()))
                    .await?
                    .ok_or_else(|| Error::Internal("AK vanished".into()))
            }
            Err(e) => Err(e),
        }
    }

    /// Quotes `selection` over `nonce` and returns the PCR values the quote covers.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty or oversize nonce; TPM errors.
    pub async fn quote(&self, selection: PcrSelection, nonce: Vec<u8>) -> Result<QuoteOutput, Error> {
        self.quote_with(AkKind::Ecc, selection, nonce).await
    }

    /// Quotes `selection` over `nonce` with the attestation key of `kind`.
    ///
    /// # Errors
    /// As [`Vault::quote`].
    pub async fn quote_with(
        &self,
        kind: AkKind,
        selection: PcrSelection,
        nonce: Vec<u8>,
    ) -> Result<QuoteOutput, Error> {
        check_nonce(&nonce)?;
        let loaded = self.ak(kind).await?;
        let ak = loaded.clone();
        let (quote, values) =
            self.tpm().call(self.client, "quote", move |tpm| tpm.quote(&ak.blob, &nonce, &selection)).await?;
        Ok(QuoteOutput { attest: quote.attest, signature: quote.signature, values, ak: AkInfo::of(&loaded) })
    }

    /// TPM2_Certify of the attestation key by itself over `nonce`: the proof of possession a
    /// Keylime verifier asks for. Returns the marshalled TPMS_ATTEST and TPMT_SIGNATURE.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty or oversize nonce; TPM errors.
    pub async fn certify_attestation_key(&self, kind: AkKind, nonce: Vec<u8>) -> Result<(Vec<u8>, Vec<u8>), Error> {
        check_nonce(&nonce)?;
        let ak = self.ak(kind).await?;
        Ok(self.tpm().call(self.client, "certify", move |tpm| tpm.certify_attestation_key(&ak.blob, &nonce)).await?)
    }

    /// The SRK's public area as `TPM2B_PUBLIC`, its DER SubjectPublicKeyInfo and TPM name.
    ///
    /// # Errors
    /// TPM errors; [`Error::Internal`] if the SRK is not an ECC P-256 key.
    pub async fn srk_public(&self) -> Result<SrkInfo, Error> {
        let tpm2b = self.tpm().call(self.client, "srk_public", |tpm| tpm.srk_public()).await?;
        let srk = tpm_vault_proto::sealed_blob::StorageKey::from_public(&tpm2b)
            .map_err(|e| Error::Internal(format!("SRK public area: {e}")))?;
        let spki = p256::PublicKey::from_sec1_bytes(&srk.point)
            .ok()
            .and_then(|k| p256::pkcs8::EncodePublicKey::to_public_key_der(&k).ok())
            .ok_or_else(|| Error::Internal("SRK public key does not encode".into()))?;
        Ok(SrkInfo { tpm2b, spki: spki.as_bytes().to_vec(), name: srk.name })
    }

    /// TPM2_Certify of the SRK by the attestation key `kind` over `nonce`: (TPMS_ATTEST,
    /// TPMT_SIGNATURE, SRK `TPM2B_PUBLIC`, AK).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a nonce of the wrong size; TPM errors.
    pub async fn certify_srk(
        &self,
        kind: AkKind,
        nonce: Vec<u8>,
    ) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>, AkInfo), Error> {
        if nonce.is_empty() || nonce.len() > MAX_NONCE {
            return Err(Invalid::Nonce { max: MAX_NONCE, got: nonce.len() }.into());
        }
        let loaded = self.ak(kind).await?;
        let ak = loaded.clone();
        let (attest, signature) =
            self.tpm().call(self.client, "certify_srk", move |tpm| tpm.certify_srk(&ak.blob, &nonce)).await?;
        let srk = self.tpm().call(self.client, "srk_public", |tpm| tpm.srk_public()).await?;
        let info = AkInfo::of(&loaded);
        Ok((attest, signature, srk, info))
    }

    /// The EK's DER SubjectPublicKeyInfo and its certificate, if the TPM has one.
    ///
    /// # Errors
    /// TPM errors.
    pub async fn endorsement_key(&self) -> Result<(Vec<u8>, Option<Vec<u8>>), Error> {
        let ek = self.endorsement_key_info().await?;
        Ok((ek.spki, ek.certificate))
    }

    /// The EK's public key in both forms and its certificate, if the TPM has one.
    ///
    /// # Errors
    /// TPM errors.
    pub async fn endorsement_key_info(&self) -> Result<EkInfo, Error> {
        let (public, cert) = self.tpm().call(self.client, "endorsement", |tpm| tpm.endorsement()).await?;
        let tpm2b_public = tss_esapi::structures::PublicBuffer::try_from(public.clone())
            .and_then(|b| tss_esapi::traits::Marshall::marshall(&b))
            .map_err(|e| Error::Internal(format!("marshal EK public: {e}")))?;
        Ok(EkInfo { spki: convert::public_key_der(KeyAlg::Rsa2048, &public)?, tpm2b_public, certificate: cert })
    }

    /// TPM2_ActivateCredential with the AK and EK. Inputs are the marshalled TPM2B_ID_OBJECT
    /// and TPM2B_ENCRYPTED_SECRET (with their size prefixes) from TPM2_MakeCredential.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for malformed blobs; [`TpmError::CredentialRejected`](crate::tpm::TpmError::CredentialRejected)
    /// (PERMISSION_DENIED) when the credential was not made for this TPM's AK and EK; other TPM
    /// errors as for any command.
    pub async fn activate_credential(&self, blob: &[u8], secret: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        self.activate_credential_with(AkKind::Ecc, blob, secret).await
    }

    /// TPM2_ActivateCredential with the attestation key of `kind` and the EK.
    ///
    /// # Errors
    /// As [`Vault::activate_credential`].
    pub async fn activate_credential_with(
        &self,
        kind: AkKind,
        blob: &[u8],
        secret: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        let (blob, secret) = credential_inputs(blob, secret)?;
        let ak = self.ak(kind).await?;
        Ok(self
            .tpm()
            .call(self.client, "activate", move |tpm| tpm.activate_credential(&ak.blob, &blob, &secret))
            .await?)
    }
}

/// The endorsement key's public facts.
#[derive(Debug, Clone)]
pub struct EkInfo {
    /// DER SubjectPublicKeyInfo.
    pub spki: Vec<u8>,
    /// Marshalled TPM2B_PUBLIC (what a Keylime registrar takes as `ek_tpm`).
    pub tpm2b_public: Vec<u8>,
    /// The EK certificate (DER) from NV, if the TPM has one.
    pub certificate: Option<Vec<u8>>,
}

fn check_nonce(nonce: &[u8]) -> Result<(), Error> {
    if nonce.is_empty() || nonce.len() > MAX_NONCE {
        return Err(Invalid::Nonce { max: MAX_NONCE, got: nonce.len() }.into());
    }
    Ok(())
}

/// ActivateCredential's inputs without their TPM2B size prefixes, within the sizes the TPM
/// layer's buffers take.
///
/// # Errors
/// [`Error::InvalidArgument`] for a missing or wrong size prefix, or a blob too large.
pub(crate) fn credential_inputs(blob: &[u8], secret: &[u8]) -> Result<(Vec<u8>, Vec<u8>), Error> {
    // TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET maximum sizes (tss-esapi's buffers).
    Ok((strip_tpm2b(blob, "credential blob", 132)?, strip_tpm2b(secret, "encrypted secret", 512)?))
}

/// Strips and checks the 2-byte size prefix of a marshalled TPM2B.
fn strip_tpm2b(b: &[u8], what: &str, max: usize) -> Result<Vec<u8>, Error> {
    match b.split_first_chunk::<2>() {
        Some((len, rest)) if usize::from(u16::from_be_bytes(*len)) == rest.len() && !rest.is_empty() => {
            if rest.len() > max {
                return Err(Error::invalid(format!("{what} is {} bytes; at most {max}", rest.len())));
            }
            Ok(rest.to_vec())
        }
        _ => Err(Error::invalid(format!("{what} is not a size-prefixed TPM2B"))),
    }
}
