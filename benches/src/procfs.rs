//! Process figures from `/proc`: CPU time (`utime + stime`, and the same for waited-for
//! children, from `/proc/PID/stat`) and resident memory (`VmRSS` from `/proc/PID/status`).

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{anyhow, bail, Context, Result};

/// Which process to read: this one or another by pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proc {
    /// The benchmark process.
    Current,
    /// Another process.
    Pid(u32),
}

impl Proc {
    fn dir(self) -> String {
        match self {
            Self::Current => "/proc/self".into(),
            Self::Pid(pid) => format!("/proc/{pid}"),
        }
    }
}

/// CPU time of a process: its own threads, and children it has waited for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// utime + stime.
    pub own: Duration,
    /// cutime + cstime.
    pub children: Duration,
}

/// Reads the CPU times of `p`.
///
/// # Errors
/// When the process is gone or its stat line does not parse.
pub fn cpu_times(p: Proc) -> Result<CpuTimes> {
    let path = format!("{}/stat", p.dir());
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_stat(&text, clock_ticks()).with_context(|| format!("parsing {path}"))
}

/// Parses a `/proc/PID/stat` line. Fields after the command name (which may contain spaces and
/// parentheses, hence the search for the last `)`) start with field 3, `state`.
fn parse_stat(text: &str, ticks_per_sec: u64) -> Result<CpuTimes> {
    let rest = text.rfind(')').map(|i| &text[i + 1..]).ok_or_else(|| anyhow!("no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field n (1-based, as in proc(5)) is fields[n - 3].
    let field = |n: usize| -> Result<u64> {
        fields
            .get(n - 3)
            .ok_or_else(|| anyhow!("field {n} missing"))?
            .parse::<u64>()
            .with_context(|| format!("field {n}"))
    };
    let ticks = |t: u64| Duration::from_secs_f64(t as f64 / ticks_per_sec.max(1) as f64);
    Ok(CpuTimes { own: ticks(field(14)? + field(15)?), children: ticks(field(16)? + field(17)?) })
}

/// CPU time (utime + stime) of every thread of process `pid`, with its name (`comm`), by
/// thread id. Threads that exit between listing and reading are skipped.
///
/// # Errors
/// When the process is gone.
pub fn thread_cpu(pid: u32) -> Result<Vec<(u32, String, Duration)>> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let entry = entry.with_context(|| format!("listing {dir}"))?;
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let name = thread_name(&text);
        let cpu = parse_stat(&text, clock_ticks()).with_context(|| format!("parsing {dir}/{tid}/stat"))?;
        out.push((tid, name, cpu.own));
    }
    Ok(out)
}

/// The command name between the first `(` and the last `)` of a stat line.
fn thread_name(stat: &str) -> String {
    match (stat.find('('), stat.rfind(')')) {
        (Some(a), Some(b)) if b > a => stat[a + 1..b].to_owned(),
        _ => "?".into(),
    }
}

/// Resident set size of `p` in KiB.
///
/// # Errors
/// When the process is gone or has no `VmRSS` line.
pub fn rss_kib(p: Proc) -> Result<u64> {
    let path = format!("{}/status", p.dir());
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_rss(&text).with_context(|| format!("no VmRSS in {path}"))
}

fn parse_rss(status: &str) -> Result<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).ok_or_else(|| anyhow!("VmRSS missing"))?;
    let mut parts = line.split_whitespace().skip(1);
    let value = parts.next().ok_or_else(|| anyhow!("empty VmRSS"))?;
    if parts.next() != Some("kB") {
        bail!("VmRSS not in kB: {line}");
    }
    Ok(value.parse()?)
}

/// The pid recorded in a pid file (swtpm writes one).
///
/// # Errors
/// When the file is missing or does not hold a number.
pub fn read_pid_file(path: &Path) -> Result<u32> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.trim().parse().with_context(|| format!("pid file {} holds {text:?}", path.display()))
}

/// `CLK_TCK` (from `getconf`; 100 on every Linux this runs on if that is unavailable).
fn clock_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .close_inherited_fds()
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_with_odd_command_name() {
        let line = "1234 (tpm (x) d) S 1 2 3 4 5 6 7 8 9 10 150 50 20 5 20 0 1 0 100 0 0";
        let t = parse_stat(line, 100).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(t.own, Duration::from_secs(2));
        assert_eq!(t.children, Duration::from_millis(250));
        assert!(parse_stat("garbage", 100).is_err());
    }

    #[test]
    fn thread_names() {
        assert_eq!(thread_name("12 (tpm (x)) S 1"), "tpm (x)");
        assert_eq!(thread_name("garbage"), "?");
        let threads = thread_cpu(std::process::id()).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(!threads.is_empty());
    }

    #[test]
    fn rss_line() {
        let s = "Name:\tx\nVmPeak:\t  100 kB\nVmRSS:\t    8152 kB\n";
        assert_eq!(parse_rss(s).unwrap_or_else(|e| panic!("{e:#}")), 8152);
        assert!(parse_rss("Name: x\n").is_err());
    }

    #[test]
    fn reads_own_process() {
        assert!(rss_kib(Proc::Current).unwrap_or_else(|e| panic!("{e:#}")) > 0);
        cpu_times(Proc::Current).unwrap_or_else(|e| panic!("{e:#}"));
    }
}
