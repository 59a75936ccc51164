//! The metrics an SRE alerts on, scraped from the real `tpm-vaultd` over its own swtpm (reached
//! by hand through the `swtpm:` TCTI, as a drop-in would) and parsed by a strict parser of the
//! Prometheus text format: failures by gRPC code, denials by operation (every operation listed
//! from 0), GetStatus and CheckAccess counted, the rules in force, the software-TPM flag (also
//! warned about at start and shown by status), TPM reconnections after swtpm died and came
//! back, and the `process_*` family. A reload to zero rules shows in the metrics and in what a
//! status request is told. docs/alerts.yml passes `promtool check rules` and `promtool test
//! rules`, and names no metric a real scrape lacks.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::{send_signal, wait_exit, KillOnDrop, ProcEnv};
use tonic::Code;
use tpm_vault_daemon::harness::CloseInheritedFds as _;
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::seal_service_client::SealServiceClient;
use tpm_vault_proto::v1::status_service_client::StatusServiceClient;

/// The repository root.
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_an_sre_can_alert_on() {
    let mut env = ProcEnv::new();
    // This client may create, sign, read and administer; delete and unseal are denied.
    limit_policy(&env, &["create", "sign", "public", "admin"]);
    let (mut child, addr) = start_with_metrics(&mut env);
    let stderr = env.stderr();
    assert!(
        stderr.lines().any(|l| l.contains("WARN")
            && l.contains("the TPM is a software TPM (TCTI swtpm: (swtpm's TCP protocol); the TPM reports manufacturer IBM and vendor \"SW   TPM\" (swtpm/libtpms))")
            && l.contains("Keys are NOT hardware-protected")),
        "no software-TPM warning at start:\n{stderr}"
    );

    let channel = env.channel().await;
    let mut keys = pb::key_service_client::KeyServiceClient::new(channel.clone());
    let mut status = StatusServiceClient::new(channel.clone());
    let mut seal = SealServiceClient::new(channel);
    keys.create_key(pb::CreateKeyRequest {
        name: "m".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("create");
    keys.sign(sign_request("m")).await.expect("sign");
    let missing = keys.get_key(pb::GetKeyRequest { name: "missing".into() }).await;
    assert_eq!(missing.map(|_| ()).map_err(|e| e.code()), Err(Code::NotFound));
    for _ in 0..2 {
        let denied = keys.delete_key(pb::DeleteKeyRequest { name: "m".into() }).await;
        assert_eq!(denied.map(|_| ()).map_err(|e| e.code()), Err(Code::PermissionDenied));
    }
    let denied = seal.unseal(pb::UnsealRequest { name: "s".into(), signed_policy: vec![] }).await;
    assert_eq!(denied.map(|_| ()).map_err(|e| e.code()), Err(Code::PermissionDenied));
    let check = pb::CheckAccessRequest { uid: 0, operation: "sign".into(), key: "m".into() };
    status.check_access(check).await.expect("check access");
    let s = status.get_status(pb::GetStatusRequest {}).await.expect("status").into_inner();
    assert!(s.software_tpm && !s.simulator, "{s:?}");
    assert!(s.software_tpm_reason.starts_with("TCTI swtpm: "), "{}", s.software_tpm_reason);
    assert_eq!(s.tpm_vendor, "SW   TPM");
    assert_eq!(s.tpm_manufacturer, "IBM");
    assert_eq!(s.policy_rules, 1);
    assert_eq!(s.policy_source, format!("{} (1 file(s))", env.tpm.path().join("policies").display()));
    assert_eq!(s.tpm_reconnects, 0);

    let scraped_at = Instant::now();
    let m = scrape(&addr).await;
    eprintln!(
        "scrape: {} bytes, {} families, {} samples in {:?}",
        m.text.len(),
        m.families.len(),
        m.samples.len(),
        scraped_at.elapsed()
    );
    let mut wrong = Vec::new();
    for (name, labels, want) in [
        ("tpm_vault_rpc_errors_total", &[("rpc", "GetKey"), ("code", "NotFound")][..], 1.0),
        ("tpm_vault_rpc_errors_total", &[("rpc", "DeleteKey"), ("code", "PermissionDenied")], 2.0),
        ("tpm_vault_rpc_errors_total", &[("rpc", "Unseal"), ("code", "PermissionDenied")], 1.0),
        ("tpm_vault_rpc_requests_total", &[("rpc", "Sign")], 1.0),
        ("tpm_vault_rpc_requests_total", &[("rpc", "CheckAccess")], 1.0),
        // The scrape follows one GetStatus.
        ("tpm_vault_rpc_requests_total", &[("rpc", "GetStatus")], 1.0),
        ("tpm_vault_rpc_latency_seconds_count", &[("rpc", "GetStatus")], 1.0),
        ("tpm_vault_access_denied_total", &[("operation", "delete")], 2.0),
        ("tpm_vault_access_denied_total", &[("operation", "unseal")], 1.0),
        ("tpm_vault_access_denied_total", &[("operation", "sign")], 0.0),
        ("tpm_vault_policy_rules", &[], 1.0),
        ("tpm_vault_software_tpm", &[], 1.0),
        ("tpm_vault_simulator", &[], 0.0),
        ("tpm_vault_tpm_reconnects_total", &[], 0.0),
        ("tpm_vault_tpm_up", &[], 1.0),
    ] {
        if m.value(name, labels) != Some(want) {
            wrong.push(format!("{name}{labels:?}: {:?}, not {want}", m.value(name, labels)));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}\nin:\n{}", m.text);
    // Calls that never failed have no error series; every operation has a denial series.
    assert!(m.series("tpm_vault_rpc_errors_total").all(|s| s.label("rpc") != Some("Sign")), "{}", m.text);
    let operations: BTreeSet<&str> =
        m.series("tpm_vault_access_denied_total").filter_map(|s| s.label("operation")).collect();
    assert_eq!(operations.len(), tpm_vault_daemon::daemon::Operation::ALL.len(), "{operations:?}");

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    let v = |name: &str| m.value(name, &[]).unwrap_or_else(|| panic!("no {name} in:\n{}", m.text));
    let started = v("process_start_time_seconds");
    assert!(started > now - 300.0 && started <= now + 1.0, "started {started}, now {now}");
    assert!(v("process_cpu_seconds_total") > 0.0);
    assert!(v("process_resident_memory_bytes") > f64::from(1 << 20));
    assert!(v("process_virtual_memory_bytes") >= v("process_resident_memory_bytes"));
    assert!(v("process_open_fds") >= 5.0 && v("process_open_fds") < v("process_max_fds"), "{}", m.text);
    assert_eq!(m.kind("process_cpu_seconds_total"), Some("counter"));
    assert_eq!(m.kind("tpm_vault_tpm_reconnects_total"), Some("counter"));

    // The TPM dies and comes back: one reconnection, counted and shown by status.
    env.tpm.swtpm.kill();
    let gone = keys.sign(sign_request("m")).await;
    assert_eq!(gone.map(|_| ()).map_err(|e| e.code()), Err(Code::Unavailable));
    env.tpm.swtpm.restart().expect("restart swtpm");
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(20);
    while keys.sign(sign_request("m")).await.is_err() {
        assert!(Instant::now() < deadline, "no recovery after the swtpm restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("signing again {:?} after the swtpm restart", restarted.elapsed());
    let m = scrape(&addr).await;
    assert_eq!(m.value("tpm_vault_tpm_reconnects_total", &[]), Some(1.0), "{}", m.text);
    let s = status.get_status(pb::GetStatusRequest {}).await.expect("status").into_inner();
    assert_eq!(s.tpm_reconnects, 1);

    drop((keys, status, seal));
    send_signal(&child.0, Signal::SIGTERM);
    let exit = wait_exit(&mut child.0, Duration::from_secs(30));
    assert_eq!(exit.code(), Some(0), "stderr:\n{}", env.stderr());
}

/// A SIGHUP that leaves no rule: the metrics say 0 rules, and a status request (now denied like
/// every other) is told plainly why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_zero_rules_shows_in_metrics_and_status() {
    let mut env = ProcEnv::new();
    let (mut child, addr) = start_with_metrics(&mut env);
    let mut status = StatusServiceClient::new(env.channel().await);
    let s = status.get_status(pb::GetStatusRequest {}).await.expect("status").into_inner();
    assert_eq!(s.policy_rules, 2, "tests.toml and test.toml: {s:?}");
    assert_eq!(scrape(&addr).await.value("tpm_vault_policy_rules", &[]), Some(2.0));

    for entry in std::fs::read_dir(env.tpm.path().join("policies")).expect("policies") {
        std::fs::write(entry.expect("entry").path(), "# no rules\n").expect("empty the policy");
    }
    send_signal(&child.0, Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while scrape(&addr).await.value("tpm_vault_policy_rules", &[]) != Some(0.0) {
        assert!(Instant::now() < deadline, "the reload never showed; stderr:\n{}", env.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let denied = status.get_status(pb::GetStatusRequest {}).await.expect_err("no rule allows status either");
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(
        denied.message().ends_with("no access rules are in force, so every request is denied"),
        "{}",
        denied.message()
    );
    let m = scrape(&addr).await;
    assert_eq!(m.value("tpm_vault_access_denied_total", &[("operation", "admin")]), Some(1.0), "{}", m.text);
    let stderr = env.stderr();
    assert!(
        stderr.lines().any(|l| l.contains("WARN") && l.contains("every request will be denied")),
        "the reload to zero rules is a warning:\n{stderr}"
    );
    send_signal(&child.0, Signal::SIGTERM);
    assert_eq!(wait_exit(&mut child.0, Duration::from_secs(30)).code(), Some(0), "{}", env.stderr());
}

/// The example alert rules load in Prometheus (promtool), fire on what they are meant for, and
/// every metric they name is in a scrape of the real daemon (save the DA metrics, which arrive
/// with the DA throttle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_rules_pass_promtool_and_name_only_real_metrics() {
    let rules = format!("{ROOT}/docs/alerts.yml");
    for args in [&["check", "rules", rules.as_str()][..], &["test", "rules", &format!("{ROOT}/docs/alerts-test.yml")]] {
        let out = Command::new("promtool")
            .close_inherited_fds()
            .args(args)
            .output()
            .expect("run promtool (Debian package prometheus)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let named = metric_names(&std::fs::read_to_string(&rules).expect("alerts.yml"));
    assert!(named.len() >= 15, "{named:?}");
    let mut env = ProcEnv::new();
    let (mut child, addr) = start_with_metrics(&mut env);
    // One failed call, so that the error family has a series.
    let mut keys = env.keys().await;
    let missing = keys.get_key(pb::GetKeyRequest { name: "missing".into() }).await;
    assert_eq!(missing.map(|_| ()).map_err(|e| e.code()), Err(Code::NotFound));
    let m = scrape(&addr).await;
    let scraped: BTreeSet<&str> = m.samples.iter().map(|s| s.name.as_str()).collect();
    let absent: Vec<&String> = named.iter().filter(|n| !scraped.contains(n.as_str())).collect();
    assert!(absent.is_empty(), "docs/alerts.yml names metrics a scrape lacks: {absent:?}\n{}", m.text);
    // And docs/METRICS.md documents every metric family a scrape has.
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/METRICS.md")).expect("METRICS.md");
    for family in m.families.keys() {
        assert!(doc.contains(&format!("`{family}`")), "docs/METRICS.md lacks `{family}`");
    }
    drop(keys);
    send_signal(&child.0, Signal::SIGTERM);
    assert_eq!(wait_exit(&mut child.0, Duration::from_secs(30)).code(), Some(0), "{}", env.stderr());
}

/// The parser rejects what Prometheus would (or what breaks the conventions we promise).
#[test]
fn the_strict_parser_rejects_malformed_expositions() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n";
    assert!(Exposition::parse(ok).is_ok());
    for (bad, why) in [
        ("a_total 1\n", "no TYPE"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total 1", "no final newline"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 1\na_total{x=\"1\"} 2\n", "duplicate series"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total{x=1} 1\n", "unquoted label"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\",x=\"2\"} 1\n", "duplicate label"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total -1\n", "negative counter"),
        ("# HELP a A.\n# TYPE a counter\na 1\n", "counter without _total"),
        ("# HELP a A.\n# TYPE a gauge\na one\n", "bad value"),
        ("# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\nb 1\na 1\n", "interleaved families"),
        ("# HELP a A.\n# TYPE a gauge\n# TYPE a gauge\na 1\n", "second TYPE"),
        (
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
            "decreasing buckets",
        ),
        ("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n", "+Inf != count"),
        ("# HELP a A.\n# TYPE a gauge\na{x=\"\\q\"} 1\n", "bad escape"),
    ] {
        assert!(Exposition::parse(bad).is_err(), "accepted ({why}):\n{bad}");
    }
}

// ---- helpers ----

fn sign_request(name: &str) -> pb::SignRequest {
    pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Digest(vec![7; 32])),
        hash: 0,
        scheme: 0,
        auth: vec![],
        purpose: 0,
    }
}

/// Replaces the test policies with one rule: this process's uid may do `operations`.
fn limit_policy(env: &ProcEnv, operations: &[&str]) {
    let dir = env.tpm.path().join("policies");
    std::fs::remove_file(dir.join("tests.toml")).expect("remove the allow-all policy");
    let ops: Vec<String> = operations.iter().map(|o| format!("{o:?}")).collect();
    std::fs::write(
        dir.join("test.toml"),
        format!(
            "[[rule]]\nname = \"limited\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\noperations = [{}]\n",
            nix::unistd::getuid().as_raw(),
            ops.join(", ")
        ),
    )
    .expect("policy");
}

/// Starts the daemon with `--metrics-listen 127.0.0.1:0` and waits for READY=1 and the
/// endpoint's address in its log.
fn start_with_metrics(env: &mut ProcEnv) -> (KillOnDrop, String) {
    let mut cmd = env.command();
    cmd.args(["--metrics-listen", "127.0.0.1:0"]);
    let child = KillOnDrop(cmd.spawn().expect("spawn tpm-vaultd"));
    assert!(env.wait_note("READY=1", Duration::from_secs(60)), "no READY=1; stderr:\n{}", env.stderr());
    // Log lines are written by a background thread: give it a moment to catch up.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stderr = env.stderr();
        if let Some(addr) =
            stderr.split("Prometheus metrics on http://").nth(1).and_then(|rest| rest.split("/metrics").next())
        {
            return (child, addr.to_owned());
        }
        assert!(Instant::now() < deadline, "no metrics address in:\n{stderr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET /metrics`, checked to be a 200 of the text format, parsed strictly.
async fn scrape(addr: &str) -> Exposition {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("response in time")
        .expect("read");
    let page = String::from_utf8(out).expect("UTF-8");
    let (head, body) = page.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"), "{head}");
    Exposition::parse(body).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{body}"))
}

/// Metric names in the rules' expressions: the `tpm_vault_*` and `process_*` identifiers.
fn metric_names(rules: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in rules.lines().map(str::trim_start).filter(|l| !l.starts_with('#')) {
        let mut rest = line;
        while let Some(at) = ["tpm_vault_", "process_"].iter().filter_map(|p| rest.find(p)).min() {
            let preceded = rest[..at].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let tail = &rest[at..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
            if !preceded {
                names.insert(tail[..end].to_owned());
            }
            rest = &tail[end.max(1)..];
        }
    }
    names
}

/// One sample line.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// A scrape parsed by the text format 0.0.4 rules, strictly: every family has HELP and TYPE
/// before its samples and appears once, in one block; names and label names are valid, label
/// values quoted with only the three escapes; no duplicate series or label; values are floats;
/// counters end in `_total` and are not negative; histogram buckets are cumulative and the
/// `+Inf` bucket equals `_count`.
#[derive(Debug)]
struct Exposition {
    text: String,
    /// Family name → (type, help).
    families: BTreeMap<String, (String, String)>,
    samples: Vec<Sample>,
}

impl Exposition {
    fn parse(text: &str) -> Result<Self, String> {
        if !text.ends_with('\n') {
            return Err("the exposition does not end with a newline".into());
        }
        let mut families: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut samples = Vec::new();
        let mut done: BTreeSet<String> = BTreeSet::new();
        let mut current: Option<String> = None;
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut switch = |family: &str, current: &mut Option<String>| -> Result<(), String> {
            if current.as_deref() != Some(family) {
                if let Some(previous) = current.take() {
                    done.insert(previous);
                }
                if done.contains(family) {
                    return Err(format!("family {family} appears in two blocks"));
                }
                *current = Some(family.to_owned());
            }
            Ok(())
        };
        for (n, line) in text.lines().enumerate() {
            let err = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').ok_or_else(|| err("HELP without text"))?;
                check_name(name).map_err(|e| err(&e))?;
                switch(name, &mut current).map_err(|e| err(&e))?;
                let entry = families.entry(name.to_owned()).or_default();
                if !entry.1.is_empty() {
                    return Err(err("second HELP"));
                }
                entry.1 = help.to_owned();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or_else(|| err("TYPE without a type"))?;
                check_name(name).map_err(|e| err(&e))?;
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(err("unknown type"));
                }
                switch(name, &mut current).map_err(|e| err(&e))?;
                let entry = families.entry(name.to_owned()).or_default();
                if !entry.0.is_empty() {
                    return Err(err("second TYPE"));
                }
                entry.0 = kind.to_owned();
            } else if line.starts_with('#') || line.is_empty() {
                return Err(err("stray comment or blank line"));
            } else {
                let sample = parse_sample(line).map_err(|e| err(&e))?;
                let family = family_of(&sample.name, &families).ok_or_else(|| err("sample before its TYPE"))?;
                switch(&family, &mut current).map_err(|e| err(&e))?;
                let (kind, help) = &families[&family];
                if help.is_empty() {
                    return Err(err("family without HELP"));
                }
                if kind == "counter" && (!family.ends_with("_total") || sample.value < 0.0) {
                    return Err(err("a counter is named *_total and is not negative"));
                }
                let mut key: Vec<String> = sample.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
                key.sort();
                if !seen.insert(format!("{}{{{}}}", sample.name, key.join(","))) {
                    return Err(err("duplicate series"));
                }
                samples.push(sample);
            }
        }
        let exposition = Self { text: text.to_owned(), families, samples };
        exposition.check_histograms()?;
        Ok(exposition)
    }

    /// Buckets cumulative in `le` order, `+Inf` present and equal to `_count`, `_sum` present.
    fn check_histograms(&self) -> Result<(), String> {
        for (family, (kind, _)) in &self.families {
            if kind != "histogram" {
                continue;
            }
            // Each series has one `_count`; its buckets carry the same labels plus `le`.
            let bucket_name = format!("{family}_bucket");
            let mut matched = 0;
            for count in self.series(&format!("{family}_count")) {
                let mut buckets = Vec::new();
                for s in self.series(&bucket_name) {
                    let le = s.label("le").ok_or_else(|| format!("{bucket_name} without le"))?;
                    let rest: Vec<&(String, String)> = s.labels.iter().filter(|(k, _)| k != "le").collect();
                    if rest.len() == count.labels.len() && rest.iter().all(|l| count.labels.contains(l)) {
                        let le: f64 =
                            if le == "+Inf" { f64::INFINITY } else { le.parse().map_err(|_| format!("le {le:?}"))? };
                        buckets.push((le, s.value));
                    }
                }
                matched += buckets.len();
                buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                let labels = &count.labels;
                if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                    return Err(format!("{family}{labels:?}: buckets are not cumulative"));
                }
                let inf = buckets.last().filter(|b| b.0.is_infinite()).map(|b| b.1);
                let refs: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                if inf != Some(count.value) || self.value(&format!("{family}_sum"), &refs).is_none() {
                    return Err(format!("{family}{labels:?}: +Inf bucket {inf:?}, count {}, or no sum", count.value));
                }
            }
            if matched != self.series(&bucket_name).count() {
                return Err(format!("{bucket_name}: buckets of a series without _count"));
            }
        }
        Ok(())
    }

    /// The value of the series `name` with exactly `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name && s.labels.len() == labels.len() && labels.iter().all(|(k, v)| s.label(k) == Some(*v))
            })
            .map(|s| s.value)
    }

    fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    fn kind(&self, family: &str) -> Option<&str> {
        self.families.get(family).map(|(kind, _)| kind.as_str())
    }
}

/// The family a sample belongs to: its own name, or a histogram's or summary's.
fn family_of(name: &str, families: &BTreeMap<String, (String, String)>) -> Option<String> {
    if families.contains_key(name) {
        return Some(name.to_owned());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        let (kind, _) = families.get(base)?;
        (kind == "histogram" || (kind == "summary" && *suffix != "_bucket")).then(|| base.to_owned())
    })
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        Ok(())
    } else {
        Err(format!("invalid metric name {name:?}"))
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    check_name(name)?;
    let mut rest = &line[name_end..];
    let mut labels: Vec<(String, String)> = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        loop {
            // A label name, '=', a quoted value, then ',' or '}'.
            let start = chars.peek().map(|(i, _)| *i).ok_or("unterminated labels")?;
            if inner[start..].starts_with('}') {
                chars.next();
                break;
            }
            let eq = inner[start..].find('=').ok_or("label without '='")? + start;
            let key = &inner[start..eq];
            let key_ok = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !key_ok {
                return Err(format!("invalid label name {key:?}"));
            }
            while chars.peek().is_some_and(|(i, _)| *i <= eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {key} is not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => return Err(format!("bad escape \\{other:?}")),
                    },
                    Some('\n') | None => return Err("unterminated label value".into()),
                    Some(c) => value.push(c),
                }
            }
            if labels.iter().any(|(k, _)| k == key) {
                return Err(format!("duplicate label {key}"));
            }
            labels.push((key.to_owned(), value));
            match chars.next().map(|(_, c)| c) {
                Some(',') => {}
                Some('}') => break,
                _ => return Err("expected ',' or '}' after a label".into()),
            }
        }
        let consumed = chars.peek().map_or(inner.len(), |(i, _)| *i);
        rest = &inner[consumed..];
    }
    let mut parts = rest.strip_prefix(' ').ok_or("no space before the value")?.split(' ');
    let value = match parts.next().ok_or("no value")? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse::<f64>().map_err(|_| format!("bad value {v:?}"))?,
    };
    if let Some(ts) = parts.next() {
        ts.parse::<i64>().map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    if parts.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample { name: name.to_owned(), labels, value })
}
