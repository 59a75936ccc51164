//! The signing benchmarks: ECDSA P-256 over a fixed 32-byte digest, measured four ways on the
//! same swtpm, one after another (swtpm serves one connection at a time):
//!
//! - [`raw`]: tss-esapi `Context` in this process, key loaded, one `TPM2_Sign` per signature
//!   (the floor every other path is compared with);
//! - [`actor`]: the vault library (`Vault::sign`) through its TPM actor thread;
//! - [`daemon`]: the `tpm-vaultd` binary over its Unix socket, driven by gRPC clients;
//! - [`tools`]: tpm2-tools' `tpm2_sign`, one process per signature as a shell script would.
//!
//! Every phase counts the operations that *complete* inside a fixed window after a warm-up, so
//! rates from different phases are directly comparable; it also records each counted
//! operation's latency and the CPU time of the processes involved over the window.

pub mod actor;
pub mod daemon;
pub mod health;
pub mod raw;
pub mod tools;

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::procfs::{self, CpuTimes, Proc};
use crate::stats::{CpuUse, Measurement};

/// The digest every phase signs (any 32 bytes will do for ECDSA over SHA-256).
pub const DIGEST: [u8; 32] = *b"tpm-vault benchmark digest 32 B!";

/// Name of the vault key the library and daemon phases sign with.
pub const KEY_NAME: &str = "bench";

/// How long a phase warms up and then measures.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Run but not counted (connections, caches, first-use costs).
    pub warmup: Duration,
    /// Counted window.
    pub window: Duration,
}

/// Processes whose CPU time a phase records besides this one.
#[derive(Debug, Clone, Copy)]
pub struct Pids {
    /// The swtpm serving the TPM.
    pub swtpm: u32,
    /// The daemon, while one runs.
    pub daemon: Option<u32>,
}

/// CPU counters at one instant.
#[derive(Debug, Clone, Copy)]
pub struct CpuSnapshot {
    bench: CpuTimes,
    daemon: Option<Duration>,
    swtpm: Duration,
}

impl CpuSnapshot {
    /// Reads the counters of this process, its waited-for children, the daemon and swtpm.
    ///
    /// # Errors
    /// When one of the processes is gone.
    pub fn take(pids: Pids) -> Result<Self> {
        Ok(Self {
            bench: procfs::cpu_times(Proc::Current)?,
            daemon: match pids.daemon {
                Some(pid) => Some(procfs::cpu_times(Proc::Pid(pid))?.own),
                None => None,
            },
            swtpm: procfs::cpu_times(Proc::Pid(pids.swtpm))?.own,
        })
    }

    /// CPU used between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Self) -> CpuUse {
        CpuUse {
            bench: self.bench.own.saturating_sub(earlier.bench.own),
            children: self.bench.children.saturating_sub(earlier.bench.children),
            daemon: match (self.daemon, earlier.daemon) {
                (Some(a), Some(b)) => Some(a.saturating_sub(b)),
                _ => None,
            },
            swtpm: self.swtpm.saturating_sub(earlier.swtpm),
        }
    }
}

/// Runs `op` back to back, one at a time, for `timing.warmup + timing.window` and measures the
/// operations that complete inside the window.
///
/// # Errors
/// The first error `op` returns, or a vanished process.
pub fn timed_loop(timing: Timing, pids: Pids, mut op: impl FnMut() -> Result<()>) -> Result<Measurement> {
    // First reads spawn `getconf` and open files: keep that out of the window.
    CpuSnapshot::take(pids)?;
    let t0 = Instant::now() + timing.warmup;
    let t1 = t0 + timing.window;
    let mut latencies = Vec::new();
    let mut first = None;
    loop {
        let start = Instant::now();
        if start >= t1 {
            break;
        }
        if first.is_none() && start >= t0 {
            first = Some(CpuSnapshot::take(pids)?);
        }
        op()?;
        let end = Instant::now();
        if end >= t0 && end <= t1 {
            latencies.push(end - start);
        }
    }
    let last = CpuSnapshot::take(pids)?;
    let cpu = first.map(|f| last.since(&f)).unwrap_or_default();
    Ok(Measurement::finish(latencies, timing.window, cpu))
}

/// Like [`timed_loop`], for an async operation.
///
/// # Errors
/// The first error `op` returns, or a vanished process.
pub async fn timed_async<F, Fut>(timing: Timing, pids: Pids, mut op: F) -> Result<Measurement>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    CpuSnapshot::take(pids)?;
    let t0 = Instant::now() + timing.warmup;
    let t1 = t0 + timing.window;
    let mut latencies = Vec::new();
    let mut cpu_start = None;
    loop {
        let start = Instant::now();
        if start >= t1 {
            break;
        }
        if cpu_start.is_none() && start >= t0 {
            cpu_start = Some(CpuSnapshot::take(pids)?);
        }
        op().await?;
        let end = Instant::now();
        if end >= t0 && end <= t1 {
            latencies.push(end - start);
        }
    }
    let cpu_end = CpuSnapshot::take(pids)?;
    let cpu = cpu_start.map(|s| cpu_end.since(&s)).unwrap_or_default();
    Ok(Measurement::finish(latencies, timing.window, cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_loop_counts_completions_in_the_window() {
        let pids = Pids { swtpm: std::process::id(), daemon: None };
        let timing = Timing { warmup: Duration::from_millis(20), window: Duration::from_millis(100) };
        let mut calls = 0u64;
        let m = timed_loop(timing, pids, || {
            calls += 1;
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert!(m.ops > 5 && m.ops <= 20, "{} ops", m.ops);
        assert!(calls > m.ops, "warm-up calls are not counted");
        assert!(m.p50() >= Duration::from_millis(5));
        let failing = timed_loop(timing, pids, || anyhow::bail!("boom"));
        assert!(failing.is_err());
    }
}
