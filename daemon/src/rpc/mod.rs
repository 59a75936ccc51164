//! The gRPC front end: one file per service family, plus `status.rs`, the single place where
//! errors become `tonic::Status`. Handlers parse proto input into `model` types, call the
//! [`Vault`], and never block (no TPM or file I/O on the async workers).

pub mod info;
pub mod key;
pub mod status;

use std::sync::Arc;
use std::time::Instant;

use tonic::service::Routes;
use tonic::{Response, Status};
use tpm_vault_proto::v1::key_service_server::KeyServiceServer;
use tpm_vault_proto::v1::status_service_server::StatusServiceServer;

use crate::error::Error;
use crate::metrics::Metrics;
use crate::vault::Vault;

/// Largest request or response message (a message to sign is at most 4 MiB).
pub const MAX_MESSAGE_SIZE: usize = 8 * 1024 * 1024;

/// What every handler needs.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The vault.
    pub vault: Vault,
    /// Per-RPC metrics.
    pub metrics: Arc<Metrics>,
}

/// Records an RPC's latency and outcome and converts its result into a response.
fn observe<T>(
    ctx: &Ctx,
    rpc: &'static str,
    start: Instant,
    result: Result<T, Error>,
) -> Result<Response<T>, Status> {
    ctx.metrics.observe(rpc, start.elapsed(), result.is_ok());
    match result {
        Ok(v) => Ok(Response::new(v)),
        Err(e) => {
            tracing::debug!(rpc, error = %e, "request failed");
            Err(Status::from(&e))
        }
    }
}

/// Every service of the API, plus gRPC health and reflection.
///
/// # Errors
/// If the reflection descriptors do not parse (a build problem).
pub fn routes(ctx: Ctx) -> Result<Routes, Error> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tpm_vault_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| Error::Internal(format!("reflection: {e}")))?;
    let keys = KeyServiceServer::new(key::KeyRpc::new(ctx.clone()))
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let status = StatusServiceServer::new(info::StatusRpc::new(ctx.clone()));
    health::spawn_reporter(health_reporter, ctx.vault.clone());
    Ok(Routes::new(health)
        .add_service(reflection)
        .add_service(keys)
        .add_service(status))
}

mod health {
    //! Keeps `grpc.health.v1` in step with the TPM: SERVING while the TPM is reachable.

    use std::time::Duration;

    use tonic_health::server::HealthReporter;
    use tonic_health::ServingStatus;

    use crate::tpm::TpmState;
    use crate::vault::Vault;

    pub fn spawn_reporter(reporter: HealthReporter, vault: Vault) {
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let state = vault.tpm().shared().state();
                if last != Some(state) {
                    let status = if state == TpmState::Ready {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    reporter.set_service_status("", status).await;
                    reporter
                        .set_service_status("tpmvault.v1.KeyService", status)
                        .await;
                    last = Some(state);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
}
