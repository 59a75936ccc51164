//! `tpmvault.v1.AttestationService`: the attestation key, quotes and PCR reads.

use tonic::{Request, Response, Status};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::attestation_service_server::AttestationService;

use super::key::pem_public_key;
use super::{pcr_binding, Ctx};
use crate::auth::Operation;
use crate::error::Error;
use crate::model::{PcrBank, PcrSelection};

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
                return Err(Error::InvalidArgument("PCR values are not accepted here".into()));
            }
            Ok(pcr_binding(b)?.selection)
        }
        Some(b) => Ok(PcrSelection::new(b.bank.parse()?, default)?),
        None => Ok(PcrSelection::new(PcrBank::Sha256, default)?),
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
            .on_vault("GetAttestationKey", req, Operation::Quote, |_| async move {
                let ak = self.ctx.vault.attestation_key().await?;
                let (ek, cert) = self.ctx.vault.endorsement_key().await?;
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
                    ek_public_pem: pem_public_key(&ek),
                    ek_public_der: ek,
                    ek_certificate: cert.unwrap_or_default(),
                    note,
                })
            })
            .await
    }

    async fn quote(&self, req: Request<pb::QuoteRequest>) -> Result<Response<pb::QuoteResponse>, Status> {
        self.ctx
            .on_vault("Quote", req, Operation::Quote, |r| async move {
                let sel = selection(r.pcrs, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9])?;
                let q = self.ctx.vault.quote(sel.clone(), r.nonce).await?;
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
            .on_vault("ReadPcrs", req, Operation::Quote, |r| async move {
                let all: Vec<u32> = (0..24).collect();
                let sel = selection(r.pcrs, &all)?;
                let values = self.ctx.vault.pcr_read(&sel).await?;
                Ok(pb::ReadPcrsResponse { pcr_bank: sel.bank.as_str().into(), pcrs: indices(&sel), pcr_values: values })
            })
            .await
    }

    async fn activate_credential(
        &self,
        req: Request<pb::ActivateCredentialRequest>,
    ) -> Result<Response<pb::ActivateCredentialResponse>, Status> {
        self.ctx
            .on_vault("ActivateCredential", req, Operation::Quote, |r| async move {
                let secret = self.ctx.vault.activate_credential(&r.credential_blob, &r.encrypted_secret).await?;
                Ok(pb::ActivateCredentialResponse { secret })
            })
            .await
    }
}
