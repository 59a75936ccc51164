//! Facts about the machine and software a report was measured on: CPU model and core count
//! from `/proc/cpuinfo`, kernel, date, swtpm/tpm2-tools versions and the source revision.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

/// What a report records about where it ran.
#[derive(Debug, Clone)]
pub struct Machine {
    /// `model name` of the first CPU.
    pub cpu_model: String,
    /// Logical CPUs listed in `/proc/cpuinfo`.
    pub cores: usize,
    /// CPUs this process may run on.
    pub usable_cores: usize,
    /// Kernel release.
    pub kernel: String,
    /// Start of the run, UTC, `YYYY-MM-DD HH:MM UTC`.
    pub date: String,
    /// `swtpm --version`, first line.
    pub swtpm: String,
    /// tpm2-tools version, if installed.
    pub tpm2_tools: Option<String>,
    /// `git describe`-like revision of the workspace, `+dirty` when the tree has changes.
    pub revision: String,
    /// `release` or `debug`.
    pub profile: &'static str,
    /// 1/5/15-minute load averages when the run started.
    pub load_start: String,
}

impl Machine {
    /// Gathers the facts (unknown values become `"unknown"`).
    pub fn detect(workspace: &Path) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Self {
            cpu_model: cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
            cores: cpuinfo.lines().filter(|l| l.starts_with("processor")).count(),
            usable_cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".into()),
            date: utc_date(now_unix()),
            swtpm: first_line("swtpm", &["--version"])
                .map(|l| swtpm_version(&l))
                .unwrap_or_else(|| "swtpm (version unknown)".into()),
            tpm2_tools: tpm2_tools_version(),
            revision: revision(workspace),
            profile: if cfg!(debug_assertions) { "debug" } else { "release" },
            load_start: loadavg(),
        }
    }
}

fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

fn first_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).close_inherited_fds().args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().next().map(|l| l.trim().to_owned())
}

/// `TPM emulator version 0.7.1, Copyright (c) ...` → `swtpm 0.7.1`.
fn swtpm_version(line: &str) -> String {
    match line.split("version ").nth(1) {
        Some(rest) => format!("swtpm {}", rest.split([',', ' ']).next().unwrap_or(rest)),
        None => line.to_owned(),
    }
}

/// tpm2-tools prints `tool="tpm2_sign" version="5.4" ...`.
fn tpm2_tools_version() -> Option<String> {
    let line = first_line("tpm2_sign", &["--version"])?;
    let v = line.split("version=\"").nth(1)?.split('"').next()?;
    Some(v.to_owned())
}

fn revision(workspace: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .close_inherited_fds()
            .arg("-C")
            .arg(workspace)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(rev) => {
            let dirty = git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{rev}+dirty")
            } else {
                rev
            }
        }
        None => "unknown".into(),
    }
}

/// The 1/5/15-minute load averages from `/proc/loadavg`, e.g. `0.52 0.31 0.20`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// `YYYY-MM-DD HH:MM UTC` for a Unix time (proleptic Gregorian, H. Hinnant's civil_from_days).
pub fn utc_date(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", secs / 3600, (secs % 3600) / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_date(1_764_460_800 + 3_660), "2025-11-30 01:01 UTC");
        assert_eq!(utc_date(-86_400), "1969-12-31 00:00 UTC");
    }

    #[test]
    fn swtpm_versions() {
        assert_eq!(swtpm_version("TPM emulator version 0.7.1, Copyright (c) 2014-2021 IBM Corp."), "swtpm 0.7.1");
        assert_eq!(swtpm_version("odd"), "odd");
    }

    #[test]
    fn cpuinfo_model() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model(text).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_model("processor: 0\n"), None);
    }
}
