//! The daemon's status report, converted from `tpmvault.v1.Status`.
//!
//! Named `DaemonStatus` so that it is never confused with `tonic::Status`. Plain data, no I/O.

use std::time::Duration;

use tpm_vault_proto::v1 as proto;

use crate::TpmState;

/// What the daemon reports about itself and its TPM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonStatus {
    /// Daemon version.
    pub version: String,
    /// The TCTI the daemon uses to reach the TPM.
    pub tcti: String,
    /// True when the daemon runs its own swtpm: keys are then not hardware-protected.
    pub simulator: bool,
    /// Whether the TPM is reachable and is the one the keys were made on.
    pub tpm_state: TpmState,
    /// TPM manufacturer, e.g. `IBM`.
    pub tpm_manufacturer: String,
    /// TPM firmware version, hex.
    pub tpm_firmware: String,
    /// Name of the storage root key, hex: changes when the TPM is cleared or replaced.
    pub srk_name: String,
    /// Number of stored keys.
    pub key_count: u64,
    /// Transient objects loaded in the TPM, the SRK included (a TPM has only a few slots).
    pub loaded_objects: u32,
    /// Time since the daemon started.
    pub uptime: Duration,
    /// Jobs waiting for the TPM: a growing queue means the TPM is the bottleneck.
    pub tpm_queue_depth: u32,
    /// Per-RPC and per-TPM-command counters.
    pub metrics: Vec<Metric>,
    /// The last TPM error, if there was one.
    pub last_tpm_error: Option<String>,
    /// TPM vendor string, e.g. `SW   TPM` for swtpm.
    pub tpm_vendor: String,
    /// Why the TPM is taken for a software TPM (its keys are then not hardware-protected);
    /// `None` when it looks like hardware.
    pub software_tpm: Option<String>,
    /// Reconnections to the TPM after it went away or was reset.
    pub tpm_reconnects: u64,
    /// The resource manager in front of the TPM: `kernel` (`/dev/tpmrm0`), `tabrmd` or `none`;
    /// empty from a daemon older than this field.
    pub resource_manager: String,
    /// True when the SRK is the persistent object at 0x81000001, false when the daemon derives
    /// it as a transient object.
    pub srk_persistent: bool,
    /// Access rules in force: 0 means every request is denied.
    pub policy_rules: u32,
    /// Where the rules came from (the policy directory, or the built-in default policy).
    pub policy_source: String,
}

/// A call counter with a latency summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metric {
    /// What is counted: `rpc/Sign`, `tpm/sign`, ...
    pub name: String,
    /// Calls.
    pub count: u64,
    /// Failed calls.
    pub errors: u64,
    /// Median latency.
    pub p50: Duration,
    /// 99th-percentile latency.
    pub p99: Duration,
}

impl From<proto::Status> for DaemonStatus {
    fn from(status: proto::Status) -> DaemonStatus {
        DaemonStatus {
            tpm_state: status.tpm_state(),
            version: status.version,
            tcti: status.tcti,
            simulator: status.simulator,
            tpm_manufacturer: status.tpm_manufacturer,
            tpm_firmware: status.tpm_firmware,
            srk_name: status.srk_name,
            key_count: status.key_count,
            loaded_objects: status.loaded_objects,
            uptime: Duration::from_secs(status.uptime_seconds),
            tpm_queue_depth: status.tpm_queue_depth,
            metrics: status.metrics.into_iter().map(Metric::from).collect(),
            last_tpm_error: Some(status.last_tpm_error).filter(|e| !e.is_empty()),
            tpm_vendor: status.tpm_vendor,
            software_tpm: status.software_tpm.then(|| {
                if status.software_tpm_reason.is_empty() {
                    "reason not given".to_owned()
                } else {
                    status.software_tpm_reason
                }
            }),
            tpm_reconnects: status.tpm_reconnects,
            resource_manager: status.resource_manager,
            srk_persistent: status.srk_persistent,
            policy_rules: status.policy_rules,
            policy_source: status.policy_source,
        }
    }
}

impl From<proto::Metric> for Metric {
    fn from(metric: proto::Metric) -> Metric {
        Metric {
            name: metric.name,
            count: metric.count,
            errors: metric.errors,
            p50: Duration::from_micros(metric.p50_us),
            p99: Duration::from_micros(metric.p99_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_from_proto() {
        let status = DaemonStatus::from(proto::Status {
            version: "0.1.0".into(),
            tpm_state: TpmState::Ready as i32,
            uptime_seconds: 61,
            metrics: vec![proto::Metric { name: "rpc/Sign".into(), count: 3, errors: 1, p50_us: 750, p99_us: 2000 }],
            ..Default::default()
        });
        assert_eq!(status.tpm_state, TpmState::Ready);
        assert_eq!(status.uptime, Duration::from_secs(61));
        assert_eq!(status.metrics[0].p50, Duration::from_micros(750));
        assert_eq!(status.last_tpm_error, None);
        assert_eq!(status.software_tpm, None);
        let software = DaemonStatus::from(proto::Status {
            software_tpm: true,
            software_tpm_reason: "TCTI swtpm: (swtpm's TCP protocol)".into(),
            ..Default::default()
        });
        assert_eq!(software.software_tpm.as_deref(), Some("TCTI swtpm: (swtpm's TCP protocol)"));
    }
}
