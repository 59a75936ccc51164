//! `tpm-vault status`: the daemon's and the TPM's state.

use std::io::{self, Write};
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use tpm_vault_client::{DaemonStatus, Named};

use super::error::CliError;
use super::output::{fields, latency, table, uptime, Report};
use super::Context;

/// `tpm-vault status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {}

impl StatusArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let status = ctx.client().await?.status().await?;
        ctx.emit(&StatusReport(status))
    }
}

/// The printed form of a [`DaemonStatus`].
pub(crate) struct StatusReport(pub(crate) DaemonStatus);

impl Report for StatusReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let s = &self.0;
        let simulator = if s.simulator { "yes (keys are NOT hardware-protected)" } else { "no" };
        let software = match &s.software_tpm {
            Some(reason) => format!("YES: {reason}. Keys are NOT hardware-protected"),
            None => "no".to_owned(),
        };
        let mut tpm = s.tpm_manufacturer.clone();
        if !s.tpm_vendor.is_empty() {
            tpm.push_str(&format!(" {:?}", s.tpm_vendor));
        }
        if !s.tpm_firmware.is_empty() {
            tpm.push_str(&format!(" (firmware {})", s.tpm_firmware));
        }
        // A daemon older than these fields reports no policy source: no row then.
        let policy = match (s.policy_rules, s.policy_source.as_str()) {
            (_, "") => None,
            (0, source) => Some(format!("NO rules in force: every request is denied ({source})")),
            (n, source) => Some(format!("{n} rule(s) from {source}")),
        };
        let mut rows = vec![
            ("version", s.version.clone()),
            ("tpm state", s.tpm_state.name().to_owned()),
            ("tpm", tpm),
            ("tcti", s.tcti.clone()),
            ("simulator", simulator.to_owned()),
            ("software tpm", software),
            ("srk name", s.srk_name.clone()),
            ("srk", if s.srk_persistent { "persistent (0x81000001)" } else { "transient" }.to_owned()),
            ("tpm reconnects", s.tpm_reconnects.to_string()),
            ("keys", s.key_count.to_string()),
            ("loaded objects", s.loaded_objects.to_string()),
            ("tpm queue depth", s.tpm_queue_depth.to_string()),
            ("uptime", uptime(s.uptime)),
        ];
        // A daemon older than the field reports none: no row then.
        let rm = match s.resource_manager.as_str() {
            "" => None,
            "kernel" => Some("the kernel's (/dev/tpmrm0: 3 object slots)".to_owned()),
            "tabrmd" => Some("tpm2-abrmd".to_owned()),
            other => Some(other.to_owned()),
        };
        if let Some(rm) = rm {
            rows.insert(4, ("tpm rm", rm));
        }
        if let Some(policy) = policy {
            rows.push(("policy", policy));
        }
        if let Some(error) = &s.last_tpm_error {
            rows.push(("last tpm error", error.clone()));
        }
        fields(out, &rows)?;
        if !s.metrics.is_empty() {
            writeln!(out)?;
            let rows: Vec<Vec<String>> = s
                .metrics
                .iter()
                .map(|m| {
                    vec![m.name.clone(), m.count.to_string(), m.errors.to_string(), latency(m.p50), latency(m.p99)]
                })
                .collect();
            table(out, &["METRIC", "CALLS", "ERRORS", "P50", "P99"], &rows)?;
        }
        Ok(())
    }

    fn json(&self) -> Value {
        let s = &self.0;
        let metrics: Vec<Value> = s
            .metrics
            .iter()
            .map(|m| {
                json!({
                    "name": m.name,
                    "count": m.count,
                    "errors": m.errors,
                    "p50_us": micros(m.p50),
                    "p99_us": micros(m.p99),
                })
            })
            .collect();
        json!({
            "version": s.version,
            "tcti": s.tcti,
            "simulator": s.simulator,
            "tpm_state": s.tpm_state.name(),
            "tpm_manufacturer": s.tpm_manufacturer,
            "tpm_firmware": s.tpm_firmware,
            "tpm_vendor": s.tpm_vendor,
            "software_tpm": s.software_tpm.is_some(),
            "software_tpm_reason": s.software_tpm,
            "tpm_reconnects": s.tpm_reconnects,
            "policy_rules": s.policy_rules,
            "policy_source": s.policy_source,
            "srk_name": s.srk_name,
            "srk_persistent": s.srk_persistent,
            "resource_manager": s.resource_manager,
            "key_count": s.key_count,
            "loaded_objects": s.loaded_objects,
            "uptime_seconds": s.uptime.as_secs(),
            "tpm_queue_depth": s.tpm_queue_depth,
            "last_tpm_error": s.last_tpm_error,
            "metrics": metrics,
        })
    }
}

/// Microseconds as a JSON-friendly integer.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
