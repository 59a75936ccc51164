//! Request counters and latency histograms, per RPC and per TPM command; failed RPCs also by
//! their gRPC code.
//!
//! Cheap enough for the hot path: one short mutex section per observation, log2-spaced
//! microsecond buckets (so percentiles are accurate to a factor of two at worst, interpolated
//! inside the bucket). Read by `StatusService` and the Prometheus text endpoint; owns no I/O.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Number of log2 buckets: bucket `i` holds latencies in `[2^i, 2^(i+1))` microseconds.
const BUCKETS: usize = 32;

/// One series' counts.
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub count: u64,
    /// Failed observations.
    pub errors: u64,
    /// Sum of latencies, microseconds.
    pub sum_us: u64,
    /// Failed observations by error code (the gRPC code's name for RPCs, e.g. `NotFound`);
    /// empty where failures carry no code (TPM commands).
    pub codes: BTreeMap<String, u64>,
    buckets: [u64; BUCKETS],
}

impl Series {
    fn observe(&mut self, us: u64, ok: bool, code: Option<&str>) {
        self.count += 1;
        self.errors += u64::from(!ok);
        if let Some(code) = code {
            match self.codes.get_mut(code) {
                Some(n) => *n += 1,
                None => {
                    self.codes.insert(code.to_owned(), 1);
                }
            }
        }
        self.sum_us = self.sum_us.saturating_add(us);
        let i = (64 - us.max(1).leading_zeros() as usize - 1).min(BUCKETS - 1);
        self.buckets[i] += 1;
    }

    /// Approximate latency percentile `q` (0..=1), microseconds.
    pub fn percentile_us(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let target = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            if seen + n >= target {
                let lo = 1u64 << i;
                let frac = (target - seen) as f64 / n.max(1) as f64;
                return lo + (lo as f64 * frac) as u64;
            }
            seen += n;
        }
        1u64 << (BUCKETS - 1)
    }

    /// Upper bounds (µs) and cumulative counts, for Prometheus `_bucket` lines.
    pub fn cumulative(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut acc = 0;
        self.buckets.iter().enumerate().map(move |(i, &n)| {
            acc += n;
            (1u64 << (i + 1), acc)
        })
    }
}

/// A registry of named series.
#[derive(Debug, Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<String, Series>>,
}

impl Metrics {
    /// Records one observation of `name`.
    pub fn observe(&self, name: &str, elapsed: Duration, ok: bool) {
        self.record(name, elapsed, ok, None);
    }

    /// Records one observation of `name` that succeeded (`error` `None`) or failed with the
    /// error code `error` (counted by code as well).
    pub fn observe_outcome(&self, name: &str, elapsed: Duration, error: Option<&str>) {
        self.record(name, elapsed, error.is_none(), error);
    }

    fn record(&self, name: &str, elapsed: Duration, ok: bool, code: Option<&str>) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Ok(mut map) = self.series.lock() {
            match map.get_mut(name) {
                Some(s) => s.observe(us, ok, code),
                None => {
                    let mut s = Series::default();
                    s.observe(us, ok, code);
                    map.insert(name.to_owned(), s);
                }
            }
        }
    }

    /// A copy of every series, by name.
    pub fn snapshot(&self) -> BTreeMap<String, Series> {
        self.series.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_land_in_the_right_bucket() {
        let m = Metrics::default();
        for _ in 0..90 {
            m.observe("a", Duration::from_micros(100), true);
        }
        for _ in 0..10 {
            m.observe("a", Duration::from_micros(10_000), false);
        }
        let s = &m.snapshot()["a"];
        assert_eq!((s.count, s.errors), (100, 10));
        let p50 = s.percentile_us(0.5);
        assert!((64..=128).contains(&p50), "{p50}");
        let p99 = s.percentile_us(0.99);
        assert!((8192..=16384).contains(&p99), "{p99}");
        assert!(s.codes.is_empty(), "no codes without observe_outcome");
    }

    #[test]
    fn failures_are_counted_by_code() {
        let m = Metrics::default();
        m.observe_outcome("GetKey", Duration::from_micros(10), None);
        m.observe_outcome("GetKey", Duration::from_micros(10), Some("NotFound"));
        m.observe_outcome("GetKey", Duration::from_micros(10), Some("NotFound"));
        m.observe_outcome("GetKey", Duration::from_micros(10), Some("PermissionDenied"));
        let s = &m.snapshot()["GetKey"];
        assert_eq!((s.count, s.errors), (4, 3));
        let codes: Vec<(&str, u64)> = s.codes.iter().map(|(c, n)| (c.as_str(), *n)).collect();
        assert_eq!(codes, [("NotFound", 2), ("PermissionDenied", 1)]);
    }
}
