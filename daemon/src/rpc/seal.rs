//! `tpmvault.v1.SealService`: sealing secrets to PCR values and signed PCR policies.

use prost::Message;
use tonic::{Request, Response, Status};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::seal_service_server::SealService;
use zeroize::Zeroizing;

use super::{pcr_binding, Call, Ctx};
use crate::auth::{owner_of, Operation};
use crate::error::{Error, Invalid, PcrArg};
use crate::model::{KeyName, PcrBank, PcrSelection, PcrTarget};
use crate::vault::seal::{authority_der, SealTarget, SignedPolicy};
use crate::vault::Resource;

/// Largest sealed secret (the message limit of this service).
pub const MAX_SECRET: usize = 64 * 1024 * 1024;

// The record of the largest secret (its ciphertext and tag in hex, the sealed object and
// policy beside it) stays within what the state directory reads back.
const _: () =
    assert!(2 * (MAX_SECRET as u64 + 16) + 64 * 1024 <= <crate::store::SealedRecord as crate::store::Record>::MAX_FILE);

/// The SealService implementation.
#[derive(Debug, Clone)]
pub struct SealRpc {
    ctx: Ctx,
}

impl SealRpc {
    /// A service over `ctx`.
    pub fn new(ctx: Ctx) -> Self {
        Self { ctx }
    }
}

fn default_selection() -> PcrSelection {
    PcrSelection::default_in(PcrBank::Sha256)
}

#[tonic::async_trait]
impl SealService for SealRpc {
    async fn seal(&self, req: Request<pb::SealRequest>) -> Result<Response<pb::SealResponse>, Status> {
        let owner = owner_of(&req);
        let mut call = Call::start(&self.ctx, "Seal", Operation::Seal, &req);
        let r = req.into_inner();
        let secret = Zeroizing::new(r.secret);
        let result = async {
            let name = KeyName::try_from(r.name.as_str())?;
            let vault = call.authorize(Some((&name, Resource::Sealed))).await?;
            let (selection, values) = match r.pcr_binding {
                Some(b) => {
                    let t = pcr_binding(b)?;
                    (t.selection, t.values)
                }
                None => (default_selection(), None),
            };
            let target = if r.authorized_by.is_empty() {
                SealTarget::Pcr { selection, values }
            } else {
                SealTarget::Authorized { selection, authority_spki: authority_der(&r.authorized_by)? }
            };
            // Replacing a secret is decided again under the store's write lock, with the owner
            // on disk then (another client may have sealed the name meanwhile).
            let overwrite = r.overwrite.then(|| call.recheck(Operation::Seal, &name));
            let info = vault.seal_checked(name.clone(), secret, target, owner?, overwrite).await?;
            Ok(pb::SealResponse {
                name: name.to_string(),
                policy_digest: hex::encode(info.policy_digest),
                pcrs: info.selection.to_string(),
            })
        }
        .await;
        call.end(result)
    }

    async fn import_sealed(&self, req: Request<pb::ImportSealedRequest>) -> Result<Response<pb::SealResponse>, Status> {
        let owner = owner_of(&req);
        let mut call = Call::start(&self.ctx, "ImportSealed", Operation::Seal, &req);
        let r = req.into_inner();
        let result = async {
            let name = KeyName::try_from(r.name.as_str())?;
            let vault = call.authorize(Some((&name, Resource::Sealed))).await?;
            let info = vault.import_sealed(name.clone(), &r.blob, owner?).await?;
            Ok(pb::SealResponse {
                name: name.to_string(),
                policy_digest: hex::encode(info.policy_digest),
                pcrs: info.selection.to_string(),
            })
        }
        .await;
        call.end(result)
    }

    async fn unseal(&self, req: Request<pb::UnsealRequest>) -> Result<Response<pb::UnsealResponse>, Status> {
        self.ctx
            .on_named(
                "Unseal",
                req,
                (Operation::Unseal, Resource::Sealed),
                |r| &r.name,
                |r, name, vault| async move {
                    let approval = if r.signed_policy.is_empty() {
                        None
                    } else {
                        Some(
                            pb::SignedPolicy::decode(r.signed_policy.as_slice())
                                .map_err(|e| Error::invalid(format!("signed policy does not decode: {e}")))?,
                        )
                    };
                    let approval = approval.map(SignedPolicy::from);
                    // The zeroizing buffer moves into the response (`tpm_vault_proto::secret`).
                    let secret = vault.unseal(&name, approval.as_ref()).await?;
                    Ok(pb::UnsealResponse { secret })
                },
            )
            .await
    }

    async fn sign_policy(&self, req: Request<pb::SignPolicyRequest>) -> Result<Response<pb::SignedPolicy>, Status> {
        self.ctx
            .on_key(
                "SignPolicy",
                req,
                Operation::Sign,
                |r| &r.key_name,
                |r, key, vault| async move {
                    let binding = r.pcrs.ok_or(Invalid::Pcr(PcrArg::BindingRequired))?;
                    let PcrTarget { selection, values } = pcr_binding(binding)?;
                    let values = values.ok_or(Invalid::Pcr(PcrArg::ValuesRequired))?;
                    let signed = vault.sign_policy(&key, selection, values, r.policy_version, r.expires_unix);
                    signed.await.map(pb::SignedPolicy::from)
                },
            )
            .await
    }

    async fn delete_sealed(
        &self,
        req: Request<pb::DeleteSealedRequest>,
    ) -> Result<Response<pb::DeleteSealedResponse>, Status> {
        self.ctx
            .on_named_write(
                "DeleteSealed",
                req,
                (Operation::Seal, Resource::Sealed),
                |r| &r.name,
                |_, name, check, vault| async move {
                    vault.delete_sealed_checked(&name, check).await.map(|()| pb::DeleteSealedResponse {})
                },
            )
            .await
    }
}

/// The approval at the edge: field for field the API's message, both ways.
macro_rules! same_fields {
    ($from:ty => $to:ty) => {
        impl From<$from> for $to {
            fn from(p: $from) -> Self {
                Self {
                    format_version: p.format_version,
                    pcr_bank: p.pcr_bank,
                    pcrs: p.pcrs,
                    pcr_values: p.pcr_values,
                    approved_policy: p.approved_policy,
                    policy_ref: p.policy_ref,
                    signature: p.signature,
                    policy_version: p.policy_version,
                    expires_unix: p.expires_unix,
                    envelope_signature: p.envelope_signature,
                    authority_spki: p.authority_spki,
                }
            }
        }
    };
}

same_fields!(pb::SignedPolicy => SignedPolicy);
same_fields!(SignedPolicy => pb::SignedPolicy);
