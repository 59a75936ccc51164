//! `tpmvault.v1.StatusService`: daemon and TPM state, counters and latencies.

use std::sync::atomic::Ordering;

use tonic::{Request, Response, Status};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::status_service_server::StatusService;

use super::Ctx;
use crate::auth::{Decision, Identity, Operation, UnixIdentity};
use crate::error::Error;
use crate::model::KeyName;
use crate::tpm::TpmState;
use crate::vault::Resource;

/// The StatusService implementation.
#[derive(Debug, Clone)]
pub struct StatusRpc {
    ctx: Ctx,
}

impl StatusRpc {
    /// A service over `ctx`.
    pub fn new(ctx: Ctx) -> Self {
        Self { ctx }
    }
}

#[tonic::async_trait]
impl StatusService for StatusRpc {
    async fn get_status(&self, req: Request<pb::GetStatusRequest>) -> Result<Response<pb::Status>, Status> {
        self.ctx.on_vault("GetStatus", req, Operation::Admin, |_, _| self.status()).await
    }

    async fn check_access(
        &self,
        req: Request<pb::CheckAccessRequest>,
    ) -> Result<Response<pb::CheckAccessResponse>, Status> {
        self.ctx.on_vault("CheckAccess", req, Operation::Admin, |r, _| self.check(r)).await
    }
}

impl StatusRpc {
    /// The answer of CheckAccess: what the policy decides for another client.
    async fn check(&self, r: pb::CheckAccessRequest) -> Result<pb::CheckAccessResponse, Error> {
        let op = r.operation.parse::<Operation>().map_err(|e| Error::invalid(e.to_string()))?;
        let key = if r.key.is_empty() { None } else { Some(KeyName::try_from(r.key.as_str())?) };
        // The record the operation acts on: sealed secrets and data keys are namespaces of
        // their own (delete and create are answered for signing keys).
        let kind = match op {
            Operation::Seal | Operation::Unseal => Resource::Sealed,
            Operation::Encrypt | Operation::Decrypt => Resource::DataKey,
            _ => Resource::Key,
        };
        let owner = match &key {
            Some(k) => self.ctx.vault.owner(k, kind).await?,
            None => None,
        };
        let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(r.uid))
            .ok()
            .flatten()
            .map_or(r.uid, |u| u.gid.as_raw());
        let who = Identity::Unix(UnixIdentity::resolve(r.uid, gid, None, None));
        let decision = self.ctx.access.current().decide(&who, op, key.as_ref(), owner.as_ref());
        let (allowed, rule) = match decision {
            Decision::Allow(rule) => (true, rule),
            Decision::Deny => (false, String::new()),
        };
        Ok(pb::CheckAccessResponse { allowed, rule, identity: who.to_string() })
    }

    /// The answer of GetStatus.
    async fn status(&self) -> Result<pb::Status, Error> {
        let vault = &self.ctx.vault;
        let shared = vault.tpm().shared();
        let info = vault.tpm_info();
        let key_count = vault.key_count().await? as u64;
        let software = vault.software_tpm();
        let policy = self.ctx.access.current();
        let tpm_state = match shared.state() {
            TpmState::Ready => pb::TpmState::Ready,
            TpmState::Down => pb::TpmState::Down,
            TpmState::Mismatch => pb::TpmState::Mismatch,
        };
        let mut metrics: Vec<pb::Metric> = shared
            .errors_by_class()
            .into_iter()
            .map(|(class, n)| pb::Metric {
                name: format!("tpm_error/{class}"),
                count: n,
                errors: n,
                p50_us: 0,
                p99_us: 0,
            })
            .collect();
        for (prefix, snapshot) in [("rpc/", self.ctx.metrics.snapshot()), ("tpm/", shared.metrics.snapshot())] {
            for (name, s) in snapshot {
                metrics.push(pb::Metric {
                    name: format!("{prefix}{name}"),
                    count: s.count,
                    errors: s.errors,
                    p50_us: s.percentile_us(0.5),
                    p99_us: s.percentile_us(0.99),
                });
            }
        }
        Ok(pb::Status {
            version: env!("CARGO_PKG_VERSION").into(),
            tcti: vault.tcti().into(),
            simulator: vault.is_simulator(),
            tpm_state: tpm_state as i32,
            tpm_manufacturer: info.manufacturer,
            tpm_firmware: info.firmware,
            tpm_vendor: info.vendor,
            srk_name: hex::encode(info.srk_name),
            srk_persistent: info.srk_persistent,
            resource_manager: vault.resource_manager().as_str().into(),
            key_count,
            loaded_objects: shared.loaded() as u32,
            uptime_seconds: vault.uptime().as_secs(),
            tpm_queue_depth: shared.queued.load(Ordering::Relaxed) as u32,
            metrics,
            last_tpm_error: shared.last_error().unwrap_or_default(),
            policy_rules: u32::try_from(policy.len()).unwrap_or(u32::MAX),
            policy_source: self.ctx.access.source(),
            software_tpm: software.is_some(),
            software_tpm_reason: software.map(|s| s.to_string()).unwrap_or_default(),
            tpm_reconnects: shared.reconnects(),
        })
    }
}
