//! gRPC health checks (`grpc.health.v1`) back to back from one client: what one unary gRPC
//! round trip costs against a server that does no work for it. The floor phase ([`crate::floor`])
//! checks a bare tonic server; the daemon phase ([`super::daemon`]) checks `tpm-vaultd`, its
//! gRPC stack without a TPM job. Also the gRPC channel to a Unix socket every client here uses.
//!
//! This module sits below both of them, so neither imports the other.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::{timed_async, Pids, Timing};
use crate::stats::Measurement;

/// A gRPC channel to the Unix socket `socket`, connected now.
///
/// # Errors
/// The socket not accepting.
pub async fn channel(socket: &Path) -> Result<Channel> {
    Endpoint::from_shared(format!("unix://{}", socket.display()))?
        .connect()
        .await
        .with_context(|| format!("connecting to {}", socket.display()))
}

/// The timing of a floor measurement: a fifth of the window, at least 0.5 s.
pub fn timing(window: Timing) -> Timing {
    Timing { warmup: Duration::from_millis(200), window: (window.window / 5).max(Duration::from_millis(500)) }
}

/// Health checks back to back from one client on its own connection to `socket`.
///
/// # Errors
/// Connection failures, or a check that fails or does not answer `SERVING`.
pub async fn measure(socket: &Path, timing: Timing, pids: Pids) -> Result<Measurement> {
    let client = HealthClient::new(channel(socket).await?);
    timed_async(timing, pids, || {
        let mut client = client.clone();
        async move {
            let status = client.check(HealthCheckRequest { service: String::new() }).await?.into_inner().status;
            anyhow::ensure!(
                status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
                "health check answered status {status}"
            );
            Ok(())
        }
    })
    .await
}
