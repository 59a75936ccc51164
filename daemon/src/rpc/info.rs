//! `tpmvault.v1.StatusService`: daemon and TPM state, counters and latencies.

use std::sync::atomic::Ordering;

use tonic::{Request, Response, Status};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::status_service_server::StatusService;

use super::Ctx;
use crate::tpm::TpmState;

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
    async fn get_status(&self, _req: Request<pb::GetStatusRequest>) -> Result<Response<pb::Status>, Status> {
        let vault = &self.ctx.vault;
        let shared = vault.tpm().shared();
        let info = vault.tpm_info();
        let key_count = vault.key_count().await.map_err(Status::from)? as u64;
        let tpm_state = match shared.state() {
            TpmState::Ready => pb::TpmState::Ready,
            TpmState::Down => pb::TpmState::Down,
            TpmState::Mismatch => pb::TpmState::Mismatch,
        };
        let mut metrics = Vec::new();
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
        Ok(Response::new(pb::Status {
            version: env!("CARGO_PKG_VERSION").into(),
            tcti: vault.tcti().into(),
            simulator: vault.is_simulator(),
            tpm_state: tpm_state as i32,
            tpm_manufacturer: info.manufacturer,
            tpm_firmware: info.firmware,
            srk_name: hex::encode(info.srk_name),
            key_count,
            loaded_objects: shared.loaded() as u32,
            uptime_seconds: vault.uptime().as_secs(),
            tpm_queue_depth: shared.queued.load(Ordering::Relaxed) as u32,
            metrics,
            last_tpm_error: shared.last_error().unwrap_or_default(),
        }))
    }
}
