//! The optional Prometheus endpoint (`metrics_listen`): renders the daemon's counters in the
//! Prometheus text exposition format (0.0.4) and serves them with a minimal HTTP/1.1 responder.
//!
//! It owns no counters: per-RPC series (failures by gRPC code) come from the [`Metrics`] the
//! RPC layer records into, per-TPM-command series, queue depth, loaded objects, TPM state,
//! reconnections and the TPM's dictionary-attack counter from the TPM actor's
//! [`Shared`](crate::tpm::Shared) state, the key count, whether the TPM is a software TPM and
//! the dictionary-attack guard's counters from the [`Vault`], the rules in force and the denials
//! by operation from the [`Access`] policy, and the `process_*` figures from procfs
//! ([`crate::observe::process_metrics`]). `tpm-vault status` shows most of the same numbers over gRPC
//! (`StatusService`). docs/METRICS.md lists every metric; docs/alerts.yml alerts on them.
//!
//! The endpoint is plain HTTP without authentication, so [`crate::config`] only accepts a
//! loopback address for it. The responder answers `GET`/`HEAD` of `/metrics` (and `/`), one
//! request per connection (`Connection: close`), with a bounded request head, a per-connection
//! deadline and a cap on concurrent connections, so a misbehaving local client cannot tie up the
//! daemon. It is not a general web server and does not try to be.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::auth::Access;
use crate::observe::metrics::{Metrics, Series};
use crate::observe::process_metrics::ProcessSample;
use crate::serve::bounds::Tally;
use crate::tpm::{DaState, TpmState};
use crate::vault::Vault;

/// Content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Largest request head accepted (request line and headers).
const MAX_HEAD: usize = 8 * 1024;
/// Deadline for reading a request and writing its response.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Concurrent scrapes served; further connections are closed at once.
const MAX_CONNECTIONS: usize = 16;
/// Histogram buckets exported, as indexes into [`Series::cumulative`]: upper bounds from 16 µs
/// (index 3) to about 33.5 s (index 24); slower observations land in `+Inf` only.
const BUCKET_RANGE: std::ops::RangeInclusive<usize> = 3..=24;

/// Where the numbers come from.
#[derive(Debug, Clone)]
pub struct MetricsSource {
    /// Per-RPC series (recorded by the RPC layer).
    pub rpc: Arc<Metrics>,
    /// The vault: TPM actor state and per-command series, key count, uptime.
    pub vault: Vault,
    /// The access policy: rules in force, denials by operation.
    pub access: Arc<Access>,
}

impl MetricsSource {
    /// Renders every metric in the Prometheus text format.
    pub async fn render(&self) -> String {
        let keys = self.vault.key_count().await.ok();
        let process = tokio::task::spawn_blocking(ProcessSample::read).await.ok().flatten();
        let shared = self.vault.tpm().shared();
        let snapshot = Snapshot {
            rpc: self.rpc.snapshot(),
            tpm: shared.metrics.snapshot(),
            queue_depth: shared.queued.load(Ordering::Relaxed),
            loaded_objects: shared.loaded(),
            state: shared.state(),
            tpm_errors: shared.errors_by_class(),
            keys,
            corrupt_records: self.vault.corrupt_records(),
            uptime: self.vault.uptime(),
            simulator: self.vault.is_simulator(),
            software_tpm: self.vault.software_tpm().is_some(),
            reconnects: shared.reconnects(),
            policy_rules: self.access.current().len(),
            denied: self.access.denials().map(|(op, n)| (op.as_str(), n)).collect(),
            process,
            da: shared.da(),
            da_failures: self.vault.lockout().failures_total(),
            da_refused: self.vault.lockout().refused_total(),
        };
        snapshot.render()
    }
}

/// Binds the metrics listener (before readiness, so a bad address fails the start).
///
/// # Errors
/// The bind error.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `GET /metrics` on `listener` until the returned task is aborted.
pub fn spawn(listener: TcpListener, source: MetricsSource) -> JoinHandle<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "Prometheus metrics on http://{addr}/metrics");
    }
    tokio::spawn(async move {
        let slots = Tally::up_to(MAX_CONNECTIONS);
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    crate::serve::fdlimit::accept_failed("metrics endpoint", &e).await;
                    continue;
                }
            };
            let Ok(held) = slots.try_take(()) else {
                tracing::debug!("metrics endpoint: too many connections; closing one");
                continue;
            };
            let source = source.clone();
            tokio::spawn(async move {
                let _held = held;
                match tokio::time::timeout(CONNECTION_TIMEOUT, handle(stream, &source)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(error = %e, "metrics endpoint: I/O error"),
                    Err(_) => tracing::debug!("metrics endpoint: client too slow; closed"),
                }
            });
        }
    })
}

/// Reads one request head, answers it, closes the connection.
async fn handle(mut stream: TcpStream, source: &MetricsSource) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let request = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if let Some(request) = Request::parse(&head) {
            break request;
        }
        if head.len() > MAX_HEAD {
            break Request::TooLarge;
        }
    };
    let response = match request {
        Request::Get { path, head_only } => {
            let body = match path.as_str() {
                "/metrics" => Some(source.render().await),
                "/" => Some("tpm-vault metrics: see /metrics\n".to_owned()),
                _ => None,
            };
            match body {
                Some(body) => Response::new("200 OK", CONTENT_TYPE, body, head_only),
                None => Response::text("404 Not Found", "not found\n", head_only),
            }
        }
        Request::OtherMethod => Response::text("405 Method Not Allowed", "use GET\n", false),
        Request::Malformed => Response::text("400 Bad Request", "bad request\n", false),
        Request::TooLarge => Response::text("431 Request Header Fields Too Large", "too large\n", false),
    };
    stream.write_all(&response.to_bytes()).await?;
    stream.shutdown().await
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// `GET` or `HEAD` of `path` (query string dropped).
    Get { path: String, head_only: bool },
    /// Any other method.
    OtherMethod,
    /// Not an HTTP/1.x request line.
    Malformed,
    /// The head exceeded [`MAX_HEAD`].
    TooLarge,
}

impl Request {
    /// Parses a complete request head; `None` while the blank line ending it has not arrived.
    pub(crate) fn parse(buf: &[u8]) -> Option<Self> {
        let end = find(buf, b"\r\n\r\n").or_else(|| find(buf, b"\n\n"))?;
        let head = String::from_utf8_lossy(buf.get(..end).unwrap_or_default());
        let line = head.lines().next().unwrap_or_default();
        let mut parts = line.split_ascii_whitespace();
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Some(Self::Malformed);
        };
        if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
            return Some(Self::Malformed);
        }
        let path = target.split('?').next().unwrap_or(target).to_owned();
        Some(match method {
            "GET" => Self::Get { path, head_only: false },
            "HEAD" => Self::Get { path, head_only: true },
            _ => Self::OtherMethod,
        })
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// An HTTP/1.1 response that closes the connection.
struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
    head_only: bool,
}

impl Response {
    fn new(status: &'static str, content_type: &'static str, body: String, head_only: bool) -> Self {
        Self { status, content_type, body, head_only }
    }

    fn text(status: &'static str, body: &str, head_only: bool) -> Self {
        Self::new(status, "text/plain; charset=utf-8", body.to_owned(), head_only)
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{}Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len(),
            if self.status.starts_with("405") {
                "Allow: GET, HEAD\r\n"
            } else {
                ""
            },
        )
        .into_bytes();
        if !self.head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// A consistent copy of everything rendered, taken before formatting.
#[derive(Debug)]
struct Snapshot {
    rpc: BTreeMap<String, Series>,
    tpm: BTreeMap<String, Series>,
    queue_depth: usize,
    loaded_objects: usize,
    state: TpmState,
    tpm_errors: BTreeMap<&'static str, u64>,
    keys: Option<usize>,
    corrupt_records: u64,
    uptime: Duration,
    simulator: bool,
    software_tpm: bool,
    reconnects: u64,
    policy_rules: usize,
    /// Denials by operation name, every operation listed.
    denied: Vec<(&'static str, u64)>,
    process: Option<ProcessSample>,
    /// The TPM's dictionary-attack state as last read.
    da: Option<DaState>,
    /// Wrong key passwords the TPM rejected.
    da_failures: u64,
    /// Key-password attempts refused before the TPM.
    da_refused: u64,
}

impl Snapshot {
    fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let o = &mut out;
        header(o, "tpm_vault_build_info", "gauge", "Daemon version.");
        line(o, "tpm_vault_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1);
        gauge(o, "tpm_vault_uptime_seconds", "Seconds since the vault was opened.", self.uptime.as_secs());
        gauge(
            o,
            "tpm_vault_simulator",
            "1 when the TPM is the daemon's own swtpm (keys NOT hardware-protected).",
            u64::from(self.simulator),
        );
        gauge(
            o,
            "tpm_vault_software_tpm",
            "1 when the TPM is a software TPM (--simulator, a swtpm:/mssim: TCTI, or swtpm's identity): keys NOT hardware-protected.",
            u64::from(self.software_tpm),
        );
        gauge(
            o,
            "tpm_vault_policy_rules",
            "Access rules in force (0: every request is denied).",
            self.policy_rules as u64,
        );
        header(o, "tpm_vault_access_denied_total", "counter", "Requests denied by the access policy, by operation.");
        for (op, n) in &self.denied {
            line(o, "tpm_vault_access_denied_total", &[("operation", op)], *n);
        }
        if let Some(keys) = self.keys {
            gauge(o, "tpm_vault_keys", "Keys in the state directory.", keys as u64);
        }
        counter(
            o,
            "tpm_vault_store_corrupt_records_total",
            "Key records a listing skipped because they do not parse.",
            self.corrupt_records,
        );
        let up = "1 when the TPM is connected and its storage root key checked.";
        gauge(o, "tpm_vault_tpm_up", up, u64::from(self.state == TpmState::Ready));
        header(o, "tpm_vault_tpm_state", "gauge", "TPM connection state (1 for the current state).");
        for (name, state) in [("ready", TpmState::Ready), ("down", TpmState::Down), ("mismatch", TpmState::Mismatch)] {
            line(o, "tpm_vault_tpm_state", &[("state", name)], u64::from(self.state == state));
        }
        gauge(o, "tpm_vault_tpm_queue_depth", "TPM jobs queued or running.", self.queue_depth as u64);
        gauge(
            o,
            "tpm_vault_tpm_loaded_objects",
            "Transient objects the vault holds loaded in the TPM.",
            self.loaded_objects as u64,
        );
        header(o, "tpm_vault_tpm_errors_total", "counter", "TPM errors seen by callers, by class.");
        for (class, n) in &self.tpm_errors {
            line(o, "tpm_vault_tpm_errors_total", &[("class", class)], *n);
        }
        counter(
            o,
            "tpm_vault_tpm_reconnects_total",
            "Reconnections to the TPM after it went away or was reset.",
            self.reconnects,
        );
        if let Some(da) = self.da {
            let counter = "The TPM's dictionary-attack failure counter (TPM_PT_LOCKOUT_COUNTER), as last read.";
            gauge(o, "tpm_vault_tpm_lockout_counter", counter, u64::from(da.failures));
            let max = "Failures at which the TPM locks out DA-protected objects (TPM_PT_MAX_AUTH_FAIL), as last read.";
            gauge(o, "tpm_vault_tpm_lockout_max", max, u64::from(da.max_tries));
        }
        counter(o, "tpm_vault_da_failures_total", "Wrong key passwords the TPM rejected.", self.da_failures);
        let refused = "Key-password attempts refused without reaching the TPM (throttled, or the TPM's reserve).";
        counter(o, "tpm_vault_da_refused_total", refused, self.da_refused);
        family(o, &RPC, &self.rpc);
        family(o, &TPM, &self.tpm);
        if let Some(p) = &self.process {
            process(o, p);
        }
        out
    }
}

/// Metric names of one family of series.
struct Family {
    /// Counter of completed requests.
    requests: &'static str,
    /// Counter of failed requests.
    errors: &'static str,
    /// Latency histogram.
    latency: &'static str,
    /// Label naming the series (`rpc`, `command`).
    label: &'static str,
    /// Failures are counted by error code, under this label (`code`), not per series only.
    code_label: Option<&'static str>,
    /// What is counted, for the HELP lines.
    what: &'static str,
}

const RPC: Family = Family {
    requests: "tpm_vault_rpc_requests_total",
    errors: "tpm_vault_rpc_errors_total",
    latency: "tpm_vault_rpc_latency_seconds",
    label: "rpc",
    code_label: Some("code"),
    what: "gRPC requests",
};

const TPM: Family = Family {
    requests: "tpm_vault_tpm_commands_total",
    errors: "tpm_vault_tpm_command_errors_total",
    latency: "tpm_vault_tpm_command_latency_seconds",
    label: "command",
    code_label: None,
    what: "TPM actor jobs (queueing excluded)",
};

/// Counters and a latency histogram for every series of one family.
fn family(o: &mut String, f: &Family, series: &BTreeMap<String, Series>) {
    let label = f.label;
    header(o, f.requests, "counter", &format!("{} completed.", f.what));
    for (name, s) in series {
        line(o, f.requests, &[(label, name)], s.count);
    }
    match f.code_label {
        Some(code_label) => {
            header(o, f.errors, "counter", &format!("{} that failed, by gRPC code (as tonic::Code names it).", f.what));
            for (name, s) in series {
                for (code, n) in &s.codes {
                    line(o, f.errors, &[(label, name), (code_label, code)], *n);
                }
            }
        }
        None => {
            header(o, f.errors, "counter", &format!("{} that failed.", f.what));
            for (name, s) in series {
                line(o, f.errors, &[(label, name)], s.errors);
            }
        }
    }
    header(o, f.latency, "histogram", &format!("{}: latency in seconds.", f.what));
    let bucket = format!("{}_bucket", f.latency);
    for (name, s) in series {
        for (i, (upper_us, cumulative)) in s.cumulative().enumerate() {
            if BUCKET_RANGE.contains(&i) {
                let le = format!("{}", upper_us as f64 / 1e6);
                line(o, &bucket, &[(label, name), ("le", &le)], cumulative);
            }
        }
        line(o, &bucket, &[(label, name), ("le", "+Inf")], s.count);
        let _ = writeln!(o, "{}_sum{{{label}=\"{}\"}} {}", f.latency, escape(name), s.sum_us as f64 / 1e6);
        line(o, &format!("{}_count", f.latency), &[(label, name)], s.count);
    }
}

/// The `process_*` family of the Prometheus client libraries.
fn process(o: &mut String, p: &ProcessSample) {
    single(
        o,
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        p.cpu_seconds,
    );
    gauge(o, "process_resident_memory_bytes", "Resident memory size in bytes.", p.resident_bytes);
    gauge(o, "process_virtual_memory_bytes", "Virtual memory size in bytes.", p.virtual_bytes);
    gauge(o, "process_open_fds", "Number of open file descriptors.", p.open_fds);
    if let Some(max) = p.max_fds {
        gauge(o, "process_max_fds", "Maximum number of open file descriptors.", max);
    }
    single(
        o,
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        p.start_time_seconds,
    );
}

fn header(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

fn gauge(o: &mut String, name: &str, help: &str, value: u64) {
    single(o, name, "gauge", help, value);
}

fn counter(o: &mut String, name: &str, help: &str, value: u64) {
    single(o, name, "counter", help, value);
}

/// A family of one series without labels.
fn single(o: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    header(o, name, kind, help);
    let _ = writeln!(o, "{name} {value}");
}

fn line(o: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    let _ = write!(o, "{name}");
    if !labels.is_empty() {
        let _ = write!(o, "{{");
        for (i, (k, v)) in labels.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(o, "{sep}{k}=\"{}\"", escape(v));
        }
        let _ = write!(o, "}}");
    }
    let _ = writeln!(o, " {}", value);
}

/// Escapes a label value (backslash, double quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Option<Request> {
        Request::parse(s.as_bytes())
    }

    #[test]
    fn request_heads() {
        assert_eq!(parse("GET /metrics HTTP/1.1\r\nHost: x"), None, "incomplete");
        assert_eq!(
            parse("GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(Request::Get { path: "/metrics".into(), head_only: false })
        );
        assert_eq!(parse("HEAD / HTTP/1.0\n\n"), Some(Request::Get { path: "/".into(), head_only: true }));
        assert_eq!(parse("POST /metrics HTTP/1.1\r\n\r\n"), Some(Request::OtherMethod));
        assert_eq!(parse("GET /metrics\r\n\r\n"), Some(Request::Malformed));
        assert_eq!(parse("GET http://x/ HTTP/1.1\r\n\r\n"), Some(Request::Malformed));
        let r = Response::text("405 Method Not Allowed", "use GET\n", false).to_bytes();
        let r = String::from_utf8_lossy(&r);
        assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{r}");
        assert!(r.contains("Allow: GET, HEAD\r\n") && r.ends_with("\r\n\r\nuse GET\n"));
        let h = Response::text("200 OK", "abc", true).to_bytes();
        assert!(String::from_utf8_lossy(&h)
            .ends_with("Content-Length: 3\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"));
    }

    #[test]
    fn renders_prometheus_text() {
        let rpc = Metrics::default();
        rpc.observe_outcome("Sign", Duration::from_micros(100), None);
        rpc.observe_outcome("Sign", Duration::from_micros(3000), Some("PermissionDenied"));
        rpc.observe_outcome("GetStatus", Duration::from_micros(50), None);
        let tpm = Metrics::default();
        tpm.observe("sign", Duration::from_micros(700), true);
        let text = Snapshot {
            rpc: rpc.snapshot(),
            tpm: tpm.snapshot(),
            queue_depth: 2,
            loaded_objects: 3,
            state: TpmState::Ready,
            tpm_errors: [("unavailable", 4u64)].into_iter().collect(),
            keys: Some(5),
            corrupt_records: 6,
            uptime: Duration::from_secs(7),
            simulator: true,
            software_tpm: true,
            reconnects: 2,
            policy_rules: 0,
            denied: vec![("sign", 1), ("seal", 0)],
            process: Some(ProcessSample {
                cpu_seconds: 1.5,
                resident_bytes: 4096,
                virtual_bytes: 8192,
                start_time_seconds: 1_764_700_000.25,
                open_fds: 9,
                max_fds: Some(1024),
            }),
            da: Some(DaState { failures: 2, max_tries: 32, interval_s: 600 }),
            da_failures: 6,
            da_refused: 44,
        }
        .render();
        for want in [
            "# TYPE tpm_vault_rpc_requests_total counter\n",
            "tpm_vault_rpc_requests_total{rpc=\"Sign\"} 2\n",
            "# TYPE tpm_vault_rpc_errors_total counter\n",
            "tpm_vault_rpc_errors_total{rpc=\"Sign\",code=\"PermissionDenied\"} 1\n",
            "# TYPE tpm_vault_rpc_latency_seconds histogram\n",
            "tpm_vault_rpc_latency_seconds_bucket{rpc=\"Sign\",le=\"0.000016\"} 0\n",
            "tpm_vault_rpc_latency_seconds_bucket{rpc=\"Sign\",le=\"0.000128\"} 1\n",
            "tpm_vault_rpc_latency_seconds_bucket{rpc=\"Sign\",le=\"0.004096\"} 2\n",
            "tpm_vault_rpc_latency_seconds_bucket{rpc=\"Sign\",le=\"+Inf\"} 2\n",
            "tpm_vault_rpc_latency_seconds_sum{rpc=\"Sign\"} 0.0031\n",
            "tpm_vault_rpc_latency_seconds_count{rpc=\"Sign\"} 2\n",
            "tpm_vault_tpm_commands_total{command=\"sign\"} 1\n",
            "tpm_vault_tpm_command_errors_total{command=\"sign\"} 0\n",
            "tpm_vault_tpm_command_latency_seconds_count{command=\"sign\"} 1\n",
            "tpm_vault_tpm_queue_depth 2\n",
            "tpm_vault_tpm_errors_total{class=\"unavailable\"} 4\n",
            "tpm_vault_tpm_loaded_objects 3\n",
            "tpm_vault_tpm_state{state=\"ready\"} 1\n",
            "tpm_vault_tpm_state{state=\"down\"} 0\n",
            "tpm_vault_tpm_up 1\n",
            "tpm_vault_keys 5\n",
            "# TYPE tpm_vault_store_corrupt_records_total counter\n",
            "tpm_vault_store_corrupt_records_total 6\n",
            "tpm_vault_simulator 1\n",
            "tpm_vault_uptime_seconds 7\n",
            "tpm_vault_software_tpm 1\n",
            "tpm_vault_policy_rules 0\n",
            "# TYPE tpm_vault_access_denied_total counter\n",
            "tpm_vault_access_denied_total{operation=\"sign\"} 1\n",
            "tpm_vault_access_denied_total{operation=\"seal\"} 0\n",
            "# TYPE tpm_vault_tpm_reconnects_total counter\n",
            "tpm_vault_tpm_reconnects_total 2\n",
            "tpm_vault_rpc_requests_total{rpc=\"GetStatus\"} 1\n",
            "# TYPE process_cpu_seconds_total counter\n",
            "process_cpu_seconds_total 1.5\n",
            "process_resident_memory_bytes 4096\n",
            "process_virtual_memory_bytes 8192\n",
            "process_open_fds 9\n",
            "process_max_fds 1024\n",
            "process_start_time_seconds 1764700000.25\n",
            "# TYPE tpm_vault_tpm_lockout_counter gauge\ntpm_vault_tpm_lockout_counter 2\n",
            "tpm_vault_tpm_lockout_max 32\n",
            "# TYPE tpm_vault_da_failures_total counter\ntpm_vault_da_failures_total 6\n",
            "# TYPE tpm_vault_da_refused_total counter\ntpm_vault_da_refused_total 44\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Buckets are cumulative and non-decreasing.
        let mut last = 0u64;
        for l in text.lines().filter(|l| l.starts_with("tpm_vault_rpc_latency_seconds_bucket{rpc=\"Sign\"")) {
            let v: u64 = l.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
            assert!(v >= last, "{l}");
            last = v;
        }
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        // A call without failures has no error series; the TPM family keeps one per command.
        assert!(!text.contains("tpm_vault_rpc_errors_total{rpc=\"GetStatus\""), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("tpm_vault_rpc_errors_total{rpc=\"Sign\"}")), "{text}");
    }
}
