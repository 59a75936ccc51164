//! Attestation: the device's attestation key, PCR quotes and PCR values, and checking a quote.
//!
//! Owns the [`Client`] methods of `tpmvault.v1.AttestationService` (the event log's too; it is
//! parsed by [`crate::eventlog`]), the plain-data types they
//! return ([`AttestationKey`], [`Quote`], [`PcrValues`]), the in-core quote verifier (`verify`: TPMS_ATTEST and
//! TPMT_SIGNATURE parsing, ECDSA P-256 check, nonce, PCR digest and expected values), the
//! tpm2-tools file formats (`tpm2_tools`: `quote.pcrs`, credential files) and the offline check
//! of an SRK certification (`certify_srk`). It does not touch
//! the file system (the CLI does).

mod certify_srk;
mod tpm2_tools;
mod verify;

pub use certify_srk::{CertifiedSrk, SrkCertError};
pub use tpm2_tools::{decode_pcrs, encode_pcrs, CredentialFile};
pub(crate) use verify::bank_alg;
pub use verify::{ParseError, QuoteError, QuoteInfo};

use p256::pkcs8::der::pem::LineEnding;
use tpm_vault_proto::v1 as proto;
use zeroize::Zeroizing;

use crate::{Client, Error, PcrBinding};

/// PCRs a quote covers when none are named: the firmware and boot loader PCRs, sha256:0-9.
pub const DEFAULT_QUOTE_PCRS: [u32; 10] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];

/// The device's attestation key (AK) and endorsement key (EK).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttestationKey {
    /// AK public key, DER SubjectPublicKeyInfo (ECC P-256, signs quotes with ECDSA-SHA256).
    pub ak_public_der: Vec<u8>,
    /// AK public key, PEM: what `tpm2_checkquote -u` reads.
    pub ak_public_pem: String,
    /// AK TPM name (nameAlg || digest of the public area): what `tpm2_makecredential -n` binds to.
    pub ak_name: Vec<u8>,
    /// EK public key (RSA 2048, TCG default template), DER SubjectPublicKeyInfo.
    pub ek_public_der: Vec<u8>,
    /// EK public key, PEM: what `tpm2_makecredential -u` reads.
    pub ek_public_pem: String,
    /// The EK certificate (DER) from the TPM's NV, if the manufacturer provisioned one.
    pub ek_certificate: Option<Vec<u8>>,
    /// The daemon's remark, e.g. why there is no EK certificate; empty if none.
    pub note: String,
    /// AK public area, marshalled TPM2B_PUBLIC (what a Keylime registrar takes as `aik_tpm`).
    pub ak_tpm2b_public: Vec<u8>,
    /// EK public area, marshalled TPM2B_PUBLIC (a Keylime registrar's `ek_tpm`).
    pub ek_tpm2b_public: Vec<u8>,
}

/// Which of the device's attestation keys an attestation call uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AkAlg {
    /// The default AK: restricted ECC P-256, ECDSA-SHA256.
    #[default]
    EccP256,
    /// A restricted RSA 2048 AK, RSASSA-SHA256, created on first use: the AK type a stock
    /// Keylime verifier accepts (its proof of possession and default signing algorithms).
    Rsa2048,
}

impl AkAlg {
    /// The name the API uses (`ecc-p256`, `rsa-2048`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EccP256 => "ecc-p256",
            Self::Rsa2048 => "rsa-2048",
        }
    }
}

/// A TPM2_Certify of the attestation key by itself (its proof of possession).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Certification {
    /// The marshalled TPMS_ATTEST (type TPM_ST_ATTEST_CERTIFY) the TPM signed.
    pub attest: Vec<u8>,
    /// The marshalled TPMT_SIGNATURE over `attest`.
    pub signature: Vec<u8>,
}

impl From<proto::AttestationKey> for AttestationKey {
    fn from(key: proto::AttestationKey) -> AttestationKey {
        AttestationKey {
            ak_public_der: key.ak_public_der,
            ak_public_pem: key.ak_public_pem,
            ak_name: key.ak_name,
            ek_public_der: key.ek_public_der,
            ek_public_pem: key.ek_public_pem,
            ek_certificate: Some(key.ek_certificate).filter(|cert| !cert.is_empty()),
            note: key.note,
            ak_tpm2b_public: key.ak_tpm2b_public,
            ek_tpm2b_public: key.ek_tpm2b_public,
        }
    }
}

/// PCR values of one bank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcrValues {
    /// Bank name, e.g. `sha256`.
    pub bank: String,
    /// Indices, ascending (the order the TPM hashes them in a quote).
    pub pcrs: Vec<u32>,
    /// Values, one per index.
    pub values: Vec<Vec<u8>>,
}

impl PcrValues {
    /// The value of PCR `pcr`, if it is among these.
    pub fn value(&self, pcr: u32) -> Option<&[u8]> {
        self.pcrs.iter().position(|&p| p == pcr).and_then(|at| self.values.get(at)).map(Vec::as_slice)
    }

    /// `(index, value)` pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u8])> {
        self.pcrs.iter().copied().zip(self.values.iter().map(Vec::as_slice))
    }

    /// These values as a binding to exactly them (e.g. to seal to the current values).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if the bank or a value's length is
    /// not one the API accepts.
    pub fn to_binding(&self) -> Result<PcrBinding, Error> {
        PcrBinding::expected(&self.bank, self.pcrs.iter().copied().zip(self.values.iter().cloned()))
    }

    /// The selection, without values: `sha256:0,1,9`.
    pub fn selection(&self) -> String {
        let pcrs: Vec<String> = self.pcrs.iter().map(u32::to_string).collect();
        format!("{}:{}", self.bank, pcrs.join(","))
    }
}

impl From<proto::ReadPcrsResponse> for PcrValues {
    fn from(r: proto::ReadPcrsResponse) -> PcrValues {
        PcrValues { bank: r.pcr_bank, pcrs: r.pcrs, values: r.pcr_values }
    }
}

/// A TPM quote: PCR values signed by the attestation key over a verifier's nonce.
///
/// Check it with [`Quote::verify`]; write it for tpm2-tools with `attest` (TPMS_ATTEST,
/// `quote.msg`), `signature` (TPMT_SIGNATURE, `quote.sig`), [`encode_pcrs`] (`quote.pcrs`) and
/// [`Quote::ak_public_pem`] (`ak.pub.pem`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quote {
    /// The marshalled TPMS_ATTEST the TPM signed.
    pub attest: Vec<u8>,
    /// The marshalled TPMT_SIGNATURE over `attest`.
    pub signature: Vec<u8>,
    /// The quoted PCRs and their values, read in the same operation as the quote.
    pub pcrs: PcrValues,
    /// The attestation key's public part, DER SubjectPublicKeyInfo.
    pub ak_public_der: Vec<u8>,
}

impl From<proto::QuoteResponse> for Quote {
    fn from(q: proto::QuoteResponse) -> Quote {
        Quote {
            attest: q.attest,
            signature: q.signature,
            pcrs: PcrValues { bank: q.pcr_bank, pcrs: q.pcrs, values: q.pcr_values },
            ak_public_der: q.ak_public_der,
        }
    }
}

impl Quote {
    /// The attestation key as PEM "PUBLIC KEY" (what `tpm2_checkquote -u` and `openssl` read).
    ///
    /// # Errors
    /// [`ParseError`] if the DER is too large to encode (it never is for a real key).
    pub fn ak_public_pem(&self) -> Result<String, ParseError> {
        public_key_pem(&self.ak_public_der)
    }
}

impl Client {
    /// The device's attestation key (created inside the TPM on first use, then kept) and its
    /// endorsement key, with the EK certificate if the TPM has one.
    ///
    /// # Errors
    /// `PermissionDenied` (the `quote` operation), `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::Client;
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let keys = client.attestation_key().await?;
    /// println!("AK name {}", hex::encode(&keys.ak_name));
    /// if keys.ek_certificate.is_none() {
    ///     println!("no EK certificate: {}", keys.note);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn attestation_key(&self) -> Result<AttestationKey, Error> {
        self.attestation_key_of(AkAlg::EccP256).await
    }

    /// The attestation key `alg` (created on first use) and the endorsement key.
    ///
    /// # Errors
    /// As [`Client::attestation_key`].
    pub async fn attestation_key_of(&self, alg: AkAlg) -> Result<AttestationKey, Error> {
        let request = self.request(proto::GetAttestationKeyRequest { ak_alg: alg.as_str().into() });
        let key = self.attestation.clone().get_attestation_key(request).await?;
        Ok(key.into_inner().into())
    }

    /// Quotes PCRs (indices only: a binding with values is refused) over a verifier's nonce
    /// (1 to 64 bytes). Check the result with [`Quote::verify`].
    ///
    /// # Errors
    /// `InvalidArgument` (nonce size, PCR values given, a bank the TPM lacks),
    /// `PermissionDenied` (the `quote` operation), `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::Client;
    ///
    /// # async fn demo(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let nonce = b"from the verifier".to_vec();
    /// let quote = client.quote(&"sha256:0,1,2,3,4,5,6,7,8,9".parse()?, &nonce).await?;
    /// quote.verify(&nonce, &[])?;
    /// # Ok(()) }
    /// ```
    pub async fn quote(&self, pcrs: &PcrBinding, nonce: &[u8]) -> Result<Quote, Error> {
        self.quote_with(AkAlg::EccP256, pcrs, nonce).await
    }

    /// Quotes PCRs with the attestation key `alg`.
    ///
    /// # Errors
    /// As [`Client::quote`].
    pub async fn quote_with(&self, alg: AkAlg, pcrs: &PcrBinding, nonce: &[u8]) -> Result<Quote, Error> {
        let request = self.request(proto::QuoteRequest {
            pcrs: Some(pcrs.to_proto()),
            nonce: nonce.to_vec(),
            ak_alg: alg.as_str().into(),
        });
        let quote = self.attestation.clone().quote(request).await?;
        Ok(quote.into_inner().into())
    }

    /// Reads PCR values; `None` reads sha256:0-23.
    ///
    /// # Errors
    /// `InvalidArgument` (values given, a bank the TPM lacks), `PermissionDenied` (the `quote`
    /// operation), `Unavailable`.
    pub async fn read_pcrs(&self, pcrs: Option<&PcrBinding>) -> Result<PcrValues, Error> {
        let request = self.request(proto::ReadPcrsRequest { pcrs: pcrs.map(PcrBinding::to_proto) });
        let values = self.attestation.clone().read_pcrs(request).await?;
        Ok(values.into_inner().into())
    }

    /// TPM2_ActivateCredential: recovers the secret a verifier bound to the AK's name and
    /// encrypted to the EK (`tpm2_makecredential`), which proves the AK and the EK live in the
    /// same TPM. Both arguments keep their TPM2B size prefix ([`CredentialFile`] parses the
    /// tpm2-tools file).
    ///
    /// # Errors
    /// `PermissionDenied` when the credential is not for this AK/EK (or the `quote` operation
    /// is not allowed), `InvalidArgument` for malformed blobs, `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::attest::CredentialFile;
    /// use tpm_vault_client::Client;
    ///
    /// # async fn demo(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let file = CredentialFile::parse(&std::fs::read("cred.out")?)?;
    /// let secret = client.activate_credential(&file.credential_blob, &file.encrypted_secret).await?;
    /// println!("{} secret bytes", secret.len());
    /// # Ok(()) }
    /// ```
    pub async fn activate_credential(
        &self,
        credential_blob: &[u8],
        encrypted_secret: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        self.activate_credential_with(AkAlg::EccP256, credential_blob, encrypted_secret).await
    }

    /// TPM2_ActivateCredential for a credential made for the attestation key `alg`.
    ///
    /// # Errors
    /// As [`Client::activate_credential`].
    pub async fn activate_credential_with(
        &self,
        alg: AkAlg,
        credential_blob: &[u8],
        encrypted_secret: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        let request = self.request(proto::ActivateCredentialRequest {
            credential_blob: credential_blob.to_vec(),
            encrypted_secret: encrypted_secret.to_vec(),
            ak_alg: alg.as_str().into(),
        });
        let response = self.attestation.clone().activate_credential(request).await?;
        Ok(response.into_inner().secret)
    }

    /// TPM2_Certify of the attestation key `alg` by itself over `nonce` (1 to 64 bytes): the
    /// proof of possession a Keylime verifier asks for.
    ///
    /// # Errors
    /// `InvalidArgument` (nonce size), `PermissionDenied` (the `quote` operation),
    /// `Unavailable`.
    pub async fn certify_attestation_key(&self, alg: AkAlg, nonce: &[u8]) -> Result<Certification, Error> {
        let request =
            self.request(proto::CertifyAttestationKeyRequest { nonce: nonce.to_vec(), ak_alg: alg.as_str().into() });
        let c = self.attestation.clone().certify_attestation_key(request).await?.into_inner();
        Ok(Certification { attest: c.attest, signature: c.signature })
    }

    /// The device's measured-boot event log, raw, and the path the daemon read it from.
    /// Parse it with [`EventLog::parse`](crate::eventlog::EventLog::parse).
    ///
    /// # Errors
    /// `NotFound` when the device has no log (swtpm, containers), `FailedPrecondition` when
    /// the daemon cannot read it, `PermissionDenied` (the `quote` operation), `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::eventlog::EventLog;
    /// use tpm_vault_client::Client;
    ///
    /// # async fn demo(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let (bytes, path) = client.event_log().await?;
    /// let log = EventLog::parse(&bytes)?;
    /// println!("{path}: {} events", log.events.len());
    /// # Ok(()) }
    /// ```
    pub async fn event_log(&self) -> Result<(Vec<u8>, String), Error> {
        let request = self.request(proto::GetEventLogRequest {});
        let log = self.attestation.clone().get_event_log(request).await?.into_inner();
        Ok((log.log, log.path))
    }
}

/// DER SubjectPublicKeyInfo as PEM "PUBLIC KEY", with LF line endings.
///
/// # Errors
/// [`ParseError::Invalid`] if the DER cannot be PEM-encoded (longer than PEM allows).
pub fn public_key_pem(der: &[u8]) -> Result<String, ParseError> {
    p256::pkcs8::der::pem::encode_string("PUBLIC KEY", LineEnding::LF, der)
        .map_err(|_| ParseError::Invalid { what: "public key", reason: "cannot be PEM-encoded" })
}

/// A public key file's DER: PEM "PUBLIC KEY" or raw DER SubjectPublicKeyInfo.
///
/// # Errors
/// [`ParseError::Invalid`] for PEM with another label or broken base64.
pub fn public_key_der(file: &[u8]) -> Result<Vec<u8>, ParseError> {
    let text = match std::str::from_utf8(file) {
        Ok(text) if text.trim_start().starts_with("-----BEGIN") => text,
        _ => return Ok(file.to_vec()),
    };
    let (label, der) = p256::pkcs8::der::pem::decode_vec(text.trim().as_bytes())
        .map_err(|_| ParseError::Invalid { what: "public key PEM", reason: "not valid PEM" })?;
    if label != "PUBLIC KEY" {
        return Err(ParseError::Invalid { what: "public key PEM", reason: "expected a \"PUBLIC KEY\" block" });
    }
    Ok(der)
}

#[cfg(test)]
mod tests;
