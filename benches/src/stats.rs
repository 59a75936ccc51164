//! Small statistics: per-phase measurements (completions in a fixed window, per-operation
//! latencies, CPU use) and the median/min/max spread across repeated rounds.

use std::time::Duration;

/// CPU time consumed by the processes that take part in a phase, over its measured window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUse {
    /// The benchmark process itself (the in-process caller, or the gRPC clients).
    pub bench: Duration,
    /// Children of the benchmark that exited during the window (tpm2-tools processes).
    pub children: Duration,
    /// The daemon process, when one runs.
    pub daemon: Option<Duration>,
    /// The swtpm process (the "TPM").
    pub swtpm: Duration,
}

/// One measured phase: operations completed inside a fixed window and their latencies.
#[derive(Debug, Clone, Default)]
pub struct Measurement {
    /// Operations that completed inside the window.
    pub ops: u64,
    /// Length of the window.
    pub window: Duration,
    /// Latency of every counted operation, sorted ascending once [`Measurement::finish`] ran.
    pub latencies: Vec<Duration>,
    /// CPU used during the window.
    pub cpu: CpuUse,
}

impl Measurement {
    /// Builds a measurement from raw latencies (any order) over `window`.
    pub fn finish(mut latencies: Vec<Duration>, window: Duration, cpu: CpuUse) -> Self {
        latencies.sort_unstable();
        Self { ops: latencies.len() as u64, window, latencies, cpu }
    }

    /// Joins measurements of the same path taken in several slices: operations, windows,
    /// latencies and CPU add up.
    pub fn merge(parts: Vec<Measurement>) -> Self {
        let mut latencies = Vec::new();
        let mut window = Duration::ZERO;
        let mut cpu = CpuUse::default();
        for p in parts {
            latencies.extend(p.latencies);
            window += p.window;
            cpu.bench += p.cpu.bench;
            cpu.children += p.cpu.children;
            cpu.swtpm += p.cpu.swtpm;
            cpu.daemon = match (cpu.daemon, p.cpu.daemon) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
        }
        Self::finish(latencies, window, cpu)
    }

    /// Operations per second.
    pub fn rate(&self) -> f64 {
        let secs = self.window.as_secs_f64();
        if secs > 0.0 {
            self.ops as f64 / secs
        } else {
            0.0
        }
    }

    /// Median latency.
    pub fn p50(&self) -> Duration {
        percentile(&self.latencies, 50.0)
    }

    /// 99th-percentile latency.
    pub fn p99(&self) -> Duration {
        percentile(&self.latencies, 99.0)
    }

    /// CPU milliseconds per 1,000 operations for a CPU figure of this window.
    pub fn cpu_per_1000(&self, cpu: Duration) -> f64 {
        if self.ops == 0 {
            return 0.0;
        }
        cpu.as_secs_f64() * 1000.0 * 1000.0 / self.ops as f64
    }
}

/// Nearest-rank percentile of an ascending slice (zero for an empty one).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median and range of one figure over the rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` when there are none (or any is not a number).
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Self { median, min: v[0], max: v[n - 1] })
    }

    /// Whether the rounds disagree (more than one distinct value).
    pub fn varies(&self) -> bool {
        self.max > self.min
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_millis(x)).collect()
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let m = Measurement::finish(ms(&[5, 1, 4, 2, 3, 6, 7, 8, 9, 10]), Duration::from_secs(2), CpuUse::default());
        assert_eq!(m.ops, 10);
        assert_eq!(m.p50(), Duration::from_millis(5));
        assert_eq!(m.p99(), Duration::from_millis(10));
        assert!((m.rate() - 5.0).abs() < 1e-9);
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        assert_eq!(percentile(&ms(&[7]), 1.0), Duration::from_millis(7));
    }

    #[test]
    fn merge_adds_up() {
        let cpu = CpuUse { bench: Duration::from_millis(10), swtpm: Duration::from_millis(5), ..CpuUse::default() };
        let a = Measurement::finish(ms(&[3, 1]), Duration::from_secs(1), cpu);
        let b = Measurement::finish(ms(&[2]), Duration::from_secs(2), cpu);
        let m = Measurement::merge(vec![a, b]);
        assert_eq!(m.ops, 3);
        assert_eq!(m.window, Duration::from_secs(3));
        assert_eq!(m.latencies, ms(&[1, 2, 3]));
        assert_eq!(m.cpu.bench, Duration::from_millis(20));
        assert_eq!(m.cpu.daemon, None);
        assert!((m.rate() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn cpu_per_thousand() {
        let m = Measurement::finish(ms(&[1; 500]), Duration::from_secs(1), CpuUse::default());
        assert!((m.cpu_per_1000(Duration::from_millis(250)) - 500.0).abs() < 1e-9);
        assert_eq!(Measurement::default().cpu_per_1000(Duration::from_secs(1)), 0.0);
    }

    #[test]
    fn spread_median_and_range() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap_or_else(|| panic!("spread"));
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert!(s.varies());
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap_or_else(|| panic!("spread"));
        assert_eq!(s.median, 2.5);
        assert!(Spread::of(&[]).is_none());
        assert!(Spread::of(&[1.0, f64::NAN]).is_none());
        assert!(!Spread::of(&[1.0]).unwrap_or_else(|| panic!("spread")).varies());
    }
}
