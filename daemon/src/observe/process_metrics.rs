//! The daemon's own process figures for the Prometheus endpoint ([`crate::observe::telemetry`]): CPU
//! time, memory, file descriptors and start time, under the names and meanings of the
//! Prometheus client libraries' process collector (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, ...), so the dashboards and alerts written for any other
//! service work unchanged.
//!
//! Everything is read from procfs (`/proc/self/stat`, `/proc/self/status`, `/proc/self/fd`,
//! `/proc/self/limits`, `/proc/stat`) at each scrape, with plain blocking reads: callers on an
//! async runtime run [`ProcessSample::read`] on the blocking pool. It owns no state.

/// Clock ticks per second of the times in `/proc/self/stat`: Linux reports them in USER_HZ,
/// which is 100 on every architecture (the Prometheus client libraries assume it too).
const USER_HZ: f64 = 100.0;

/// One reading of the process's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident set size, bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: u64,
    /// Process start, seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors (`None`: unlimited or unreadable).
    pub max_fds: Option<u64>,
}

impl ProcessSample {
    /// Reads the figures of this process from procfs (blocking; a handful of small reads).
    /// `None` when procfs is not mounted or a file does not have the expected form.
    pub fn read() -> Option<Self> {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        Self::parse(
            &read("/proc/self/stat")?,
            &read("/proc/self/status")?,
            &read("/proc/stat")?,
            &read("/proc/self/limits")?,
            open_fds,
        )
    }

    /// The sample from the text of `/proc/self/stat`, `/proc/self/status`, `/proc/stat` and
    /// `/proc/self/limits`, and the count of `/proc/self/fd`.
    fn parse(stat: &str, status: &str, boot: &str, limits: &str, open_fds: u64) -> Option<Self> {
        // The command name (field 2) is in parentheses and may itself hold spaces and ')':
        // the numbered fields start after the last ')', with field 3 (the state).
        let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
        let field = |n: usize| -> Option<u64> { fields.get(n.checked_sub(3)?)?.parse().ok() };
        let (utime, stime, start_ticks, vsize) = (field(14)?, field(15)?, field(22)?, field(23)?);
        let rss_kib: u64 =
            status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
        let boot_time: u64 = boot.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
        let max_fds = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|soft| soft.parse().ok());
        Some(Self {
            cpu_seconds: (utime + stime) as f64 / USER_HZ,
            resident_bytes: rss_kib * 1024,
            virtual_bytes: vsize,
            start_time_seconds: boot_time as f64 + start_ticks as f64 / USER_HZ,
            open_fds,
            max_fds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc/self/stat` line whose command name holds a space and a ')'.
    const STAT: &str = "4242 (tpm-vaultd) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 6 0 \
                        123456 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";
    const STATUS: &str = "Name:\ttpm-vaultd\nVmPeak:\t  970000 kB\nVmSize:\t  964506 kB\nVmRSS:\t    8192 kB\n";
    const BOOT: &str = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1764700000\nprocesses 7\n";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
                          Max cpu time              unlimited            unlimited            seconds   \n\
                          Max open files            1024                 524288               files     \n";

    #[test]
    fn parses_procfs() {
        let s = ProcessSample::parse(STAT, STATUS, BOOT, LIMITS, 17).unwrap_or_else(|| panic!("parse"));
        assert_eq!(
            s,
            ProcessSample {
                cpu_seconds: 3.25,
                resident_bytes: 8192 * 1024,
                virtual_bytes: 987_654_321,
                start_time_seconds: 1_764_700_000.0 + 1234.56,
                open_fds: 17,
                max_fds: Some(1024),
            }
        );
        let unlimited = LIMITS.replace("1024     ", "unlimited");
        assert_eq!(ProcessSample::parse(STAT, STATUS, BOOT, &unlimited, 17).map(|s| s.max_fds), Some(None));
        assert_eq!(ProcessSample::parse("4242 (x) S 1", STATUS, BOOT, LIMITS, 1), None, "truncated");
        assert_eq!(ProcessSample::parse(STAT, "Name:\tx\n", BOOT, LIMITS, 1), None, "no VmRSS");
    }

    #[test]
    fn reads_this_process() {
        let s = ProcessSample::read().unwrap_or_else(|| panic!("procfs"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        assert!(s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0, "{s:?} now {now}");
        assert!(s.resident_bytes > 1 << 20 && s.virtual_bytes >= s.resident_bytes, "{s:?}");
        assert!(s.open_fds >= 3 && s.max_fds.is_none_or(|max| max >= s.open_fds), "{s:?}");
        assert!(s.cpu_seconds >= 0.0, "{s:?}");
    }
}
