//! Attestation: the attestation key (created once, kept like other keys), quotes over caller
//! nonces with the PCR values that match them, the endorsement key, and credential activation.

use std::sync::Arc;

use zeroize::Zeroizing;

use super::{blocking, parse_record, unix_now, Loaded, Vault};
use crate::error::Error;
use crate::model::{KeyAlg, PcrSelection};
use crate::store::record::RECORD_VERSION;
use crate::store::{ak_name, KeyRecord};
use crate::tpm::convert;

/// Largest nonce accepted (TPM2B_DATA holds at most a digest of the largest hash, 64 bytes).
pub const MAX_NONCE: usize = 64;

/// The attestation key's public facts.
#[derive(Debug, Clone)]
pub struct AkInfo {
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
        let loaded = self.ak().await?;
        Ok(AkInfo { spki: loaded.spki.clone(), name: loaded.record.object.tpm_name.clone() })
    }

    /// The attestation key's parsed record: read (or created) once, then kept in memory, so a
    /// quote costs its TPM commands and no file read.
    async fn ak(&self) -> Result<Arc<Loaded>, Error> {
        if let Some(ak) = self.inner.ak.lock().ok().and_then(|a| a.clone()) {
            return Ok(ak);
        }
        let loaded = Arc::new(parse_record(self.ak_record().await?)?);
        if let Ok(mut slot) = self.inner.ak.lock() {
            *slot = Some(loaded.clone());
        }
        Ok(loaded)
    }

    async fn ak_record(&self) -> Result<KeyRecord, Error> {
        let store = self.store().clone();
        if let Some(r) = blocking(move || store.attestation_key()).await? {
            return Ok(r);
        }
        let object = self.tpm().call("create_ak", |tpm| tpm.create_attestation_key()).await?;
        let record = KeyRecord {
            version: RECORD_VERSION,
            name: ak_name(),
            alg: KeyAlg::EccP256,
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
                blocking(move || store.attestation_key()).await?.ok_or_else(|| Error::Internal("AK vanished".into()))
            }
            Err(e) => Err(e),
        }
    }

    /// Quotes `selection` over `nonce` and returns the PCR values the quote covers.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty or oversize nonce; TPM errors.
    pub async fn quote(&self, selection: PcrSelection, nonce: Vec<u8>) -> Result<QuoteOutput, Error> {
        if nonce.is_empty() || nonce.len() > MAX_NONCE {
            return Err(Error::InvalidArgument(format!("nonce must be 1 to {MAX_NONCE} bytes, got {}", nonce.len())));
        }
        let loaded = self.ak().await?;
        let ak = loaded.clone();
        let (quote, values) = self.tpm().call("quote", move |tpm| tpm.quote(&ak.blob, &nonce, &selection)).await?;
        Ok(QuoteOutput {
            attest: quote.attest,
            signature: quote.signature,
            values,
            ak: AkInfo { spki: loaded.spki.clone(), name: loaded.record.object.tpm_name.clone() },
        })
    }

    /// The EK's DER SubjectPublicKeyInfo and its certificate, if the TPM has one.
    ///
    /// # Errors
    /// TPM errors.
    pub async fn endorsement_key(&self) -> Result<(Vec<u8>, Option<Vec<u8>>), Error> {
        let (public, cert) = self.tpm().call("endorsement", |tpm| tpm.endorsement()).await?;
        Ok((convert::public_key_der(KeyAlg::Rsa2048, &public)?, cert))
    }

    /// TPM2_ActivateCredential with the AK and EK. Inputs are the marshalled TPM2B_ID_OBJECT
    /// and TPM2B_ENCRYPTED_SECRET (with their size prefixes) from TPM2_MakeCredential.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for malformed blobs; [`TpmError::CredentialRejected`](crate::tpm::TpmError::CredentialRejected)
    /// (PERMISSION_DENIED) when the credential was not made for this TPM's AK and EK; other TPM
    /// errors as for any command.
    pub async fn activate_credential(&self, blob: &[u8], secret: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        let (blob, secret) = credential_inputs(blob, secret)?;
        let ak = self.ak().await?;
        Ok(self.tpm().call("activate", move |tpm| tpm.activate_credential(&ak.blob, &blob, &secret)).await?)
    }
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
                return Err(Error::InvalidArgument(format!("{what} is {} bytes; at most {max}", rest.len())));
            }
            Ok(rest.to_vec())
        }
        _ => Err(Error::InvalidArgument(format!("{what} is not a size-prefixed TPM2B"))),
    }
}
