//! `tpmvault.v1.AttestationService`: the attestation keys, quotes, PCR reads, credential
//! activation, the AK's certification of itself (proof of possession) and the device's
//! measured-boot event log.

use tonic::{Request, Response, Status};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::attestation_service_server::AttestationService;

use super::key::pem_public_key;
use super::{pcr_binding, Ctx};
use crate::auth::Operation;
use crate::error::{Error, Invalid, PcrArg};
use crate::model::{PcrBank, PcrSelection};
use crate::vault::attest::AkKind;

/// The AttestationService implementation.
#[derive(Debug, Clone)]
pub struct AttestRpc {
    ctx: Ctx,
}

impl AttestRpc {
    /// A service over `ctx`.
    pub fn new(ctx: Ctx) -> Self {
        Self { ctx }
    }
}

fn selection(b: Option<pb::PcrBinding>, default: &[u32]) -> Result<PcrSelection, Error> {
    match b {
        Some(b) if !b.pcrs.is_empty() => {
            if !b.values.is_empty() {
                return Err(Invalid::from(PcrArg::ValuesNotAccepted).into());
            }
            Ok(pcr_binding(b)?.selection)
        }
        Some(b) => Ok(PcrSelection::new(b.bank.parse()?, default)?),
        None => Ok(PcrSelection::new(PcrBank::Sha256, default)?),
    }
}

/// Largest event log served (real logs are 10-200 KiB), under the 4 MiB a gRPC client
/// decodes by default.
pub const MAX_EVENT_LOG: u64 = 3 * 1024 * 1024;

/// Reads the event log at `path` (off the async workers), bounded by [`MAX_EVENT_LOG`].
/// sysfs reports a size of 0 for the log, so the bound is applied while reading.
async fn read_event_log(path: Option<&std::path::Path>) -> Result<pb::EventLog, Error> {
    use std::io::Read as _;
    let Some(path) = path.map(std::path::Path::to_owned) else {
        return Err(Error::NoEventLog(
            "this daemon serves no event log (none configured: `event_log` is off, or it runs the simulator)".into(),
        ));
    };
    let shown = path.display().to_string();
    let read = tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&path)?;
        let mut log = Vec::new();
        file.take(MAX_EVENT_LOG + 1).read_to_end(&mut log)?;
        Ok::<_, std::io::Error>(log)
    })
    .await
    .map_err(|e| Error::Internal(format!("event log reader: {e}")))?;
    match read {
        Ok(log) if log.len() as u64 > MAX_EVENT_LOG => {
            Err(Error::EventLogUnreadable(format!("event log {shown} is larger than {MAX_EVENT_LOG} bytes")))
        }
        Ok(log) if log.is_empty() => Err(Error::NoEventLog(format!("event log {shown} is empty"))),
        Ok(log) => Ok(pb::EventLog { log, path: shown }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NoEventLog(format!(
            "no event log at {shown} (no TPM firmware log on this device: swtpm, a container, or firmware \
             without TCG2 support)"
        ))),
        Err(e) => Err(Error::EventLogUnreadable(format!("cannot read event log {shown}: {e}"))),
    }
}

fn indices(sel: &PcrSelection) -> Vec<u32> {
    sel.pcrs.iter().map(|&p| u32::from(p)).collect()
}

#[tonic::async_trait]
impl AttestationService for AttestRpc {
    async fn get_attestation_key(
        &self,
        req: Request<pb::GetAttestationKeyRequest>,
    ) -> Result<Response<pb::AttestationKey>, Status> {
        self.ctx
            .on_vault("GetAttestationKey", req, Operation::Quote, |r, vault| async move {
                let ak = vault.attestation_key_of(AkKind::parse(&r.ak_alg)?).await?;
                let ek = vault.endorsement_key_info().await?;
                let cert = ek.certificate;
                let note = if cert.is_none() {
                    "this TPM has no EK certificate in NV (common for firmware TPMs and swtpm without swtpm_setup): \
                     bind the EK out of band or by a first-use trust decision"
                        .to_owned()
                } else {
                    String::new()
                };
                Ok(pb::AttestationKey {
                    ak_public_pem: pem_public_key(&ak.spki),
                    ak_public_der: ak.spki,
                    ak_name: ak.name,
                    ak_tpm2b_public: ak.tpm2b_public,
                    ek_public_pem: pem_public_key(&ek.spki),
                    ek_public_der: ek.spki,
                    ek_tpm2b_public: ek.tpm2b_public,
                    ek_certificate: cert.unwrap_or_default(),
                    note,
                })
            })
            .await
    }

    async fn quote(&self, req: Request<pb::QuoteRequest>) -> Result<Response<pb::QuoteResponse>, Status> {
        self.ctx
            .on_vault("Quote", req, Operation::Quote, |r, vault| async move {
                let sel = selection(r.pcrs, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9])?;
                let kind = AkKind::parse(&r.ak_alg)?;
                let q = vault.quote_with(kind, sel.clone(), r.nonce).await?;
                Ok(pb::QuoteResponse {
                    attest: q.attest,
                    signature: q.signature,
                    pcr_bank: sel.bank.as_str().into(),
                    pcrs: indices(&sel),
                    pcr_values: q.values,
                    ak_public_der: q.ak.spki,
                })
            })
            .await
    }

    async fn read_pcrs(&self, req: Request<pb::ReadPcrsRequest>) -> Result<Response<pb::ReadPcrsResponse>, Status> {
        self.ctx
            .on_vault("ReadPcrs", req, Operation::Quote, |r, vault| async move {
                let all: Vec<u32> = (0..24).collect();
                let sel = selection(r.pcrs, &all)?;
                let values = vault.pcr_read(&sel).await?;
                Ok(pb::ReadPcrsResponse { pcr_bank: sel.bank.as_str().into(), pcrs: indices(&sel), pcr_values: values })
            })
            .await
    }

    async fn activate_credential(
        &self,
        req: Request<pb::ActivateCredentialRequest>,
    ) -> Result<Response<pb::ActivateCredentialResponse>, Status> {
        self.ctx
            .on_vault("ActivateCredential", req, Operation::Quote, |r, vault| async move {
                // The zeroizing buffer moves into the response (`tpm_vault_proto::secret`).
                let kind = AkKind::parse(&r.ak_alg)?;
                let secret = vault.activate_credential_with(kind, &r.credential_blob, &r.encrypted_secret).await?;
                Ok(pb::ActivateCredentialResponse { secret })
            })
            .await
    }

    async fn certify_attestation_key(
        &self,
        req: Request<pb::CertifyAttestationKeyRequest>,
    ) -> Result<Response<pb::CertifyAttestationKeyResponse>, Status> {
        self.ctx
            .on_vault("CertifyAttestationKey", req, Operation::Quote, |r, vault| async move {
                let kind = AkKind::parse(&r.ak_alg)?;
                let (attest, signature) = vault.certify_attestation_key(kind, r.nonce).await?;
                Ok(pb::CertifyAttestationKeyResponse { attest, signature })
            })
            .await
    }

    async fn get_event_log(&self, req: Request<pb::GetEventLogRequest>) -> Result<Response<pb::EventLog>, Status> {
        self.ctx
            .on_vault("GetEventLog", req, Operation::Quote, |_, _| async move {
                // Room for the largest log served, before reading it (the frame then keeps
                // what the real one needs).
                if self.ctx.event_log.is_some() {
                    crate::auth::limits::reserve(MAX_EVENT_LOG as usize + 4096).await?;
                }
                read_event_log(self.ctx.event_log.as_deref()).await
            })
            .await
    }

    async fn get_srk_public(&self, req: Request<pb::GetSrkPublicRequest>) -> Result<Response<pb::SrkPublic>, Status> {
        self.ctx
            .on_vault("GetSrkPublic", req, Operation::Public, |_, vault| async move {
                let srk = vault.srk_public().await?;
                Ok(pb::SrkPublic {
                    tpm2b_public: srk.tpm2b,
                    public_pem: pem_public_key(&srk.spki),
                    public_der: srk.spki,
                    name: srk.name,
                })
            })
            .await
    }

    async fn certify_srk(
        &self,
        req: Request<pb::CertifySrkRequest>,
    ) -> Result<Response<pb::CertifySrkResponse>, Status> {
        self.ctx
            .on_vault("CertifySrk", req, Operation::Quote, |r, vault| async move {
                let kind = AkKind::parse(&r.ak_alg)?;
                let (attest, signature, srk, ak) = vault.certify_srk(kind, r.nonce).await?;
                Ok(pb::CertifySrkResponse { attest, signature, srk_tpm2b_public: srk, ak_public_der: ak.spki })
            })
            .await
    }
}
