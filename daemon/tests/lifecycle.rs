//! The real `tpm-vaultd` binary, each test over its own swtpm: SIGTERM and SIGINT drain
//! in-flight requests, tell systemd (`READY=1` then `STOPPING=1`), exit 0 and leave no transient
//! object in the TPM; `--check-config` accepts good configs (the shipped example included) and
//! rejects bad ones with exit 64 and one line naming the field and line.

mod support;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use nix::sys::signal::Signal;
use support::{send_signal, wait_exit, KillOnDrop, ProcEnv};
use tonic::Code;
use tpm_vault_proto::v1 as pb;

/// Requests in flight when the signal arrives.
const IN_FLIGHT: usize = 100;
/// Client connections they are spread over.
const CHANNELS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_in_flight_requests_and_flushes_the_tpm() {
    drain_on(Signal::SIGTERM, None).await;
}

/// With a grace period too short for the queue, the rest fail UNAVAILABLE (retryable), and
/// the exit is still clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_with_a_short_grace_fails_the_rest_unavailable() {
    drain_on(Signal::SIGTERM, Some(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigint_drains_in_flight_requests_and_flushes_the_tpm() {
    drain_on(Signal::SIGINT, None).await;
}

async fn drain_on(signal: Signal, grace_ms: Option<u64>) {
    let mut env = ProcEnv::new();
    let mut cmd = env.command();
    if let Some(ms) = grace_ms {
        cmd.args(["--shutdown-grace-ms", &ms.to_string()]);
    }
    let mut child = KillOnDrop(cmd.spawn().expect("spawn tpm-vaultd"));
    assert!(env.wait_note("READY=1", Duration::from_secs(60)), "no READY=1; stderr:\n{}", env.stderr());
    let mut keys = env.keys().await;
    // RSA keeps each TPM2_Sign slow enough (a few ms on swtpm) that most of the 100 requests
    // are still queued at the TPM when the signal arrives.
    keys.create_key(pb::CreateKeyRequest {
        name: "drain".into(),
        algorithm: pb::KeyAlgorithm::Rsa2048 as i32,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("create key");
    let mut clients = Vec::new();
    for _ in 0..CHANNELS {
        clients.push(env.keys().await);
    }
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..IN_FLIGHT {
        let mut c = clients[i % CHANNELS].clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let r = c
                .sign(pb::SignRequest {
                    name: "drain".into(),
                    input: Some(pb::sign_request::Input::Digest(vec![i as u8; 32])),
                    hash: pb::HashAlgorithm::Sha256 as i32,
                    scheme: pb::SignatureScheme::RsaPkcs1 as i32,
                    auth: vec![],
                    purpose: 0,
                })
                .await;
            done.fetch_add(1, Ordering::SeqCst);
            r
        }));
    }
    // Signal once the first answers arrive: the server is busy with the rest.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    send_signal(&child.0, signal);
    let at_signal = done.load(Ordering::SeqCst);
    assert!(at_signal < IN_FLIGHT, "all requests finished before the signal; the test proves nothing");
    let (mut ok, mut unavailable) = (0, 0);
    for t in tasks {
        match t.await.expect("task") {
            Ok(resp) => {
                assert!(!resp.into_inner().signature.is_empty());
                ok += 1;
            }
            Err(status) => {
                // A connection closed by the draining server while this client still wrote on
                // it reaches tonic as UNKNOWN "broken pipe"; the client library reports it
                // UNAVAILABLE like gRPC does (tpm_vault_proto::status::normalize).
                let status = tpm_vault_proto::status::normalize(status);
                assert_eq!(status.code(), Code::Unavailable, "request failed other than UNAVAILABLE: {status:?}");
                unavailable += 1;
            }
        }
    }
    eprintln!("{signal:?}: {at_signal} done before the signal, then {ok} OK and {unavailable} UNAVAILABLE");
    if grace_ms.is_some() {
        assert!(unavailable > 0, "the short grace should have cut some requests");
    }
    drop(clients);
    drop(keys);
    let status = wait_exit(&mut child.0, Duration::from_secs(30));
    let stderr = env.stderr();
    assert_eq!(status.code(), Some(0), "exit status; stderr:\n{stderr}");
    env.read_notes(Duration::from_millis(50));
    let ready = env.notes.iter().position(|l| l == "READY=1");
    let stopping = env.notes.iter().position(|l| l == "STOPPING=1");
    assert!(
        matches!((ready, stopping), (Some(r), Some(s)) if r < s),
        "READY=1 then STOPPING=1 expected, got {:?}",
        env.notes
    );
    assert!(stderr.contains("draining in-flight requests") && stderr.contains("stopped"), "{stderr}");
    assert!(!env.socket.exists(), "the daemon removes the socket it bound");
    assert_eq!(env.transient_handles(), 0, "transient objects left in the TPM after exit");
}

fn check_config(config_text: Option<&str>, extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tpm-vaultd"));
    cmd.close_inherited_fds();
    cmd.arg("--check-config").env_remove("TPM_VAULT_CONFIG").env_remove("TPM_VAULT_METRICS_LISTEN");
    if let Some(text) = config_text {
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).expect("write config");
        cmd.arg("--config").arg(&path);
    }
    cmd.args(extra);
    let out = cmd.output().expect("run tpm-vaultd --check-config");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_accepts_a_good_config() {
    let policies = tempfile::tempdir().expect("tempdir");
    std::fs::write(policies.path().join("default.toml"), "# no rules\n").expect("policy");
    let p = policies.path().display().to_string();
    let good = "tcti = \"device:/dev/tpmrm0\"\nstate_dir = \"/var/lib/tpm-vault\"\n\
                socket = \"/run/tpm-vault/vault.sock\"\nmax_loaded_objects = 3\n\
                tpm_timeout_ms = 10000\nshutdown_grace_ms = 10000\nlog_format = \"json\"\n\
                metrics_listen = \"127.0.0.1:9464\"\n";
    let (code, stdout, stderr) = check_config(Some(good), &["--policies", &p]);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stdout.contains("configuration OK") && stdout.contains("1 file(s)"), "{stdout}");
}

#[test]
fn check_config_accepts_the_shipped_example() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/config.toml");
    let policies = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies");
    let (code, stdout, stderr) = check_config(None, &["--config", example, "--policies", policies]);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stdout.contains("configuration OK"), "{stdout}");
}

#[test]
fn check_config_rejects_an_unknown_field_with_its_line() {
    let (code, stdout, stderr) =
        check_config(Some("# tpm-vault\nsocket = \"/run/tpm-vault/vault.sock\"\nsocket_mode = 438\n"), &[]);
    assert_eq!(code, Some(64), "stdout: {stdout} stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("unknown field `socket_mode`") && stderr.contains("line 3"), "{stderr}");
}

#[test]
fn check_config_rejects_bad_values_and_flags() {
    let (code, _, stderr) = check_config(Some("max_loaded_objects = 1\n"), &[]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("max_loaded_objects"), "{stderr}");
    let (code, _, stderr) = check_config(Some("metrics_listen = \"0.0.0.0:9464\"\n"), &[]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("metrics_listen") && stderr.contains("loopback"), "{stderr}");
    let (code, _, stderr) = check_config(None, &["--metrics-listen", "not-an-address"]);
    assert_eq!(code, Some(64), "{stderr}");
    let (code, _, stderr) = check_config(None, &["--config", "/nonexistent/config.toml"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("/nonexistent/config.toml"), "{stderr}");
    let policies = tempfile::tempdir().expect("tempdir");
    std::fs::write(policies.path().join("bad.toml"), "[rule\n").expect("policy");
    let p = policies.path().display().to_string();
    let (code, _, stderr) = check_config(None, &["--policies", &p]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("bad.toml") && stderr.contains("line 1"), "{stderr}");
}

/// `--metrics-listen` serves Prometheus text with per-RPC and per-TPM-command series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_prometheus_text() {
    let mut env = ProcEnv::new();
    let mut cmd = env.command();
    cmd.args(["--metrics-listen", "127.0.0.1:0"]);
    let mut child = KillOnDrop(cmd.spawn().expect("spawn tpm-vaultd"));
    assert!(env.wait_note("READY=1", Duration::from_secs(60)), "stderr:\n{}", env.stderr());
    // Log lines are written by a background thread: give it a moment to catch up.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !env.stderr().contains("Prometheus metrics on http://") && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stderr = env.stderr();
    let addr = stderr
        .split("Prometheus metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split("/metrics").next())
        .unwrap_or_else(|| panic!("no metrics address in:\n{stderr}"))
        .to_owned();
    let mut keys = env.keys().await;
    keys.create_key(pb::CreateKeyRequest {
        name: "m".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("create");
    keys.sign(pb::SignRequest {
        name: "m".into(),
        input: Some(pb::sign_request::Input::Message(b"hi".to_vec())),
        hash: 0,
        scheme: 0,
        auth: vec![],
        purpose: 0,
    })
    .await
    .expect("sign");
    let missing = keys.get_key(pb::GetKeyRequest { name: "missing".into() }).await;
    assert_eq!(missing.map(|_| ()).map_err(|e| e.code()), Err(Code::NotFound));

    let page = http(&addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let (head, body) = page.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    for want in [
        "tpm_vault_rpc_requests_total{rpc=\"Sign\"} 1",
        "tpm_vault_rpc_requests_total{rpc=\"GetKey\"} 1",
        "tpm_vault_rpc_errors_total{rpc=\"GetKey\",code=\"NotFound\"} 1",
        "tpm_vault_rpc_latency_seconds_count{rpc=\"Sign\"} 1",
        "tpm_vault_rpc_latency_seconds_bucket{rpc=\"Sign\",le=\"+Inf\"} 1",
        "tpm_vault_tpm_commands_total{command=\"sign\"} 1",
        "tpm_vault_tpm_up 1",
        "tpm_vault_tpm_state{state=\"ready\"} 1",
        "tpm_vault_keys 1",
        "tpm_vault_tpm_queue_depth 0",
        "# TYPE tpm_vault_tpm_command_latency_seconds histogram",
    ] {
        assert!(body.lines().any(|l| l == want), "missing {want:?} in:\n{body}");
    }
    assert!(body.contains("tpm_vault_tpm_loaded_objects "), "{body}");
    assert!(!body.contains("tpm_vault_rpc_errors_total{rpc=\"Sign\""), "Sign never failed:\n{body}");
    let post = http(&addr, "POST /metrics HTTP/1.1\r\n\r\n").await;
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    let missing = http(&addr, "GET /nope HTTP/1.1\r\n\r\n").await;
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");

    drop(keys);
    send_signal(&child.0, Signal::SIGTERM);
    let status = wait_exit(&mut child.0, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", env.stderr());
}

async fn http(addr: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("response in time")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

/// Every key the config file accepts is documented in docs/CONFIG.md and shown in the example
/// file, and the example with every key uncommented is a valid configuration.
#[test]
fn every_config_key_is_documented_and_in_the_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let (code, _, stderr) = check_config(Some("no_such_key = 1\n"), &[]);
    assert_eq!(code, Some(64), "{stderr}");
    let keys: Vec<String> = stderr
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("no key list in {stderr}"))
        .split(", ")
        .map(|k| k.trim().trim_matches('`').to_owned())
        .collect();
    assert!(keys.len() >= 10 && keys.contains(&"metrics_listen".to_owned()), "{keys:?}");
    let docs = std::fs::read_to_string(format!("{root}/docs/CONFIG.md")).expect("CONFIG.md");
    let example = std::fs::read_to_string(format!("{root}/systemd/config.toml")).expect("example");
    for key in &keys {
        assert!(docs.contains(&format!("### `{key}`")), "docs/CONFIG.md lacks `{key}`");
        assert!(example.contains(&format!("\n#{key} = ")), "systemd/config.toml lacks #{key}");
    }
    let uncommented: String = example
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest) if rest.split(" = ").next().is_some_and(|k| keys.iter().any(|x| x == k)) => rest,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let policies = format!("{root}/policies");
    // The example's audit log is in /var/log/tpm-vault, which the package creates (tmpfiles.d)
    // and --check-config now checks: without it the check fails naming that directory.
    let (code, _, stderr) = check_config(Some(&uncommented), &["--policies", &policies]);
    if !std::path::Path::new("/var/log/tpm-vault").is_dir() {
        assert_eq!(code, Some(64), "{stderr}");
        assert!(stderr.contains("audit log /var/log/tpm-vault/audit.jsonl: directory /var/log/tpm-vault"), "{stderr}");
    }
    let logs = tempfile::tempdir().expect("tempdir");
    let audit = logs.path().join("audit.jsonl").display().to_string();
    let (code, stdout, stderr) = check_config(Some(&uncommented), &["--policies", &policies, "--audit-log", &audit]);
    assert_eq!(code, Some(0), "uncommented example: {stderr}\n{uncommented}");
    assert!(stdout.contains("rule(s)"), "{stdout}");
}

/// A policy file that does not load stops the daemon at start, before it binds anything, with
/// exit 64 and the file and line on stderr.
#[test]
fn a_bad_policy_stops_the_daemon_at_start() {
    let env = ProcEnv::new();
    std::fs::write(env.tpm.path().join("policies/zz-broken.toml"), "[[rule]]\nname = \"x\"\nclients = [\"uid:0\"\n")
        .expect("write policy");
    let mut child = KillOnDrop(env.command().spawn().expect("spawn tpm-vaultd"));
    let status = wait_exit(&mut child.0, Duration::from_secs(30));
    let stderr = env.stderr();
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("zz-broken.toml") && stderr.contains("line"), "{stderr}");
    assert!(!env.socket.exists(), "nothing may be bound");
}

/// An audit log whose directory is missing stops the daemon at start with exit 64 (a
/// configuration error) and a message about the audit log, not "socket ...".
#[test]
fn a_missing_audit_log_directory_stops_the_daemon_with_exit_64() {
    let env = ProcEnv::new();
    let audit = env.tpm.path().join("no-such-dir/audit.log");
    let mut child = KillOnDrop(env.command().arg("--audit-log").arg(&audit).spawn().expect("spawn tpm-vaultd"));
    let status = wait_exit(&mut child.0, Duration::from_secs(30));
    let stderr = env.stderr();
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains(&format!("audit log {}", audit.display())), "{stderr}");
    // The error lines (not the start-up INFO lines, which describe the socket's bounds) must
    // not blame the socket.
    let errors = stderr.lines().filter(|l| l.starts_with("tpm-vaultd:") || l.contains("ERROR"));
    assert!(errors.clone().count() >= 2, "{stderr}");
    assert!(errors.clone().all(|l| !l.contains("socket")), "{stderr}");
    assert!(!env.socket.exists(), "nothing may be bound");
}

/// Log rotation as logrotate does it: the audit file is renamed, then SIGHUP; the records that
/// follow go to a new file at the configured path, none into the renamed one. The same SIGHUP
/// loads a policy without rules: a loud warning, since every request is now denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reopens_the_audit_log_and_warns_when_no_rule_is_left() {
    let mut env = ProcEnv::new();
    let audit = env.tpm.path().join("audit.log");
    let rotated = env.tpm.path().join("audit.log.1");
    let mut child = KillOnDrop(env.command().arg("--audit-log").arg(&audit).spawn().expect("spawn tpm-vaultd"));
    assert!(env.wait_note("READY=1", Duration::from_secs(60)), "no READY=1; stderr:\n{}", env.stderr());
    let mut keys = env.keys().await;
    let create = |name: &str| pb::CreateKeyRequest {
        name: name.into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    };
    keys.create_key(create("before")).await.expect("create before the rotation");
    let audit_keys = |path: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["key"].as_str().map(str::to_owned))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !audit_keys(&audit).contains(&"before".to_owned()) {
        assert!(std::time::Instant::now() < deadline, "the first record never reached the audit file");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::rename(&audit, &rotated).expect("rotate");
    for entry in std::fs::read_dir(env.tpm.path().join("policies")).expect("policies") {
        std::fs::write(entry.expect("entry").path(), "# no rules\n").expect("empty the policy");
    }
    send_signal(&child.0, Signal::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !env.stderr().contains("NO rules") {
        assert!(std::time::Instant::now() < deadline, "no warning after the reload; stderr:\n{}", env.stderr());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        env.stderr().lines().any(|l| l.contains("WARN") && l.contains("every request will be denied")),
        "{}",
        env.stderr()
    );
    let denied = keys.create_key(create("after")).await.expect_err("no rule allows it");
    assert_eq!(denied.code(), Code::PermissionDenied);
    send_signal(&child.0, Signal::SIGTERM);
    let status = wait_exit(&mut child.0, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", env.stderr());
    assert_eq!(audit_keys(&rotated), ["before"], "the renamed file keeps only what came before");
    assert_eq!(audit_keys(&audit), ["after"], "the record after SIGHUP is in the new file");
}

/// `--check-config` catches what start-up would hit without the TPM: an audit log whose
/// directory is missing (exit 64, naming it); a policy rule's semantic error names its line;
/// a user the system does not know passes with a warning naming file and line.
#[test]
fn check_config_checks_the_audit_log_and_names_policy_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).expect("policies");
    std::fs::write(
        policies.join("a.toml"),
        "[[rule]]\nname = \"ok\"\nclients = [\"uid:0\"]\noperations = [\"sign\"]\n",
    )
    .expect("policy");
    let p = policies.display().to_string();
    let missing = dir.path().join("no-such-dir/audit.log").display().to_string();
    let (code, _, stderr) = check_config(None, &["--policies", &p, "--audit-log", &missing]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains(&format!("audit log {missing}: directory")), "{stderr}");
    let fine = dir.path().join("audit.log").display().to_string();
    let (code, stdout, stderr) = check_config(None, &["--policies", &p, "--audit-log", &fine]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("configuration OK") && !std::path::Path::new(&fine).exists(), "{stdout}");

    std::fs::write(
        policies.join("b.toml"),
        "[[rule]]\nname = \"typo\"\nclients = [\"uid:0\",\n  \"user:doesnotexist-4711\"]\noperations = [\"sign\"]\n",
    )
    .expect("policy");
    let (code, stdout, stderr) = check_config(None, &["--policies", &p]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("2 rule(s)"), "{stdout}");
    assert!(
        stderr.contains("warning: policy")
            && stderr.contains("b.toml: line 4: rule \"typo\": no user \"doesnotexist-4711\""),
        "{stderr}"
    );
    std::fs::write(
        policies.join("c.toml"),
        "[[rule]]\nname = \"bad\"\nclients = [\"uid:0\"]\n\noperations = [\"fly\"]\n",
    )
    .expect("policy");
    let (code, _, stderr) = check_config(None, &["--policies", &p]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("c.toml: line 5: rule \"bad\": unknown operation \"fly\""), "{stderr}");
}

/// `--check-config --user NAME` checks as the user the service runs as: a policy file only root
/// may read passes a check as root but fails as that user, as start-up under it would.
#[test]
fn check_config_as_the_service_user_catches_an_unreadable_policy() {
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(nix::unistd::getuid().as_raw(), 0, "this test checks as uid 65534: run as root");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).expect("policies");
    std::fs::set_permissions(&policies, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let file = policies.join("a.toml");
    std::fs::write(&file, "[[rule]]\nname = \"ok\"\nclients = [\"uid:0\"]\noperations = [\"sign\"]\n").expect("policy");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let p = policies.display().to_string();
    let (code, _, stderr) = check_config(None, &["--policies", &p]);
    assert_eq!(code, Some(0), "as root it passes: {stderr}");
    let (code, _, stderr) = check_config(None, &["--policies", &p, "--user", "nobody"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("a.toml") && stderr.contains("Permission denied"), "{stderr}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let (code, stdout, stderr) = check_config(None, &["--policies", &p, "--user", "nobody"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("(checked as user nobody)"), "{stdout}");
    let (code, _, stderr) = check_config(None, &["--policies", &p, "--user", "no-such-user-4711"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("no such user"), "{stderr}");
}

/// With no policy directory configured and none at the default path (a machine where only the
/// binary was installed), the daemon starts with the built-in default policy, says so, and
/// root may use it; `--check-config` says the same. (Skipped where /etc/tpm-vault/policies
/// exists: the default path cannot be moved for a test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_default_policy_directory_means_the_built_in_policy() {
    if std::path::Path::new("/etc/tpm-vault/policies").exists() {
        eprintln!("skipped: /etc/tpm-vault/policies exists on this machine");
        return;
    }
    let (code, stdout, stderr) = check_config(None, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("the built-in default policy (1 rule(s)) is in force"), "{stdout}");
    let (code, _, stderr) = check_config(None, &["--policies", "/etc/tpm-vault/policies"]);
    assert_eq!(code, Some(64), "a directory given explicitly must exist: {stderr}");

    let mut env = ProcEnv::new();
    let mut args = env.args();
    let at = args.iter().position(|a| a == "--policies").expect("--policies");
    args.drain(at..at + 2);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tpm-vaultd"));
    cmd.close_inherited_fds().args(&args);
    env.child_env(&mut cmd);
    let _child = KillOnDrop(cmd.spawn().expect("spawn tpm-vaultd"));
    assert!(env.wait_note("READY=1", Duration::from_secs(60)), "no READY=1; stderr:\n{}", env.stderr());
    assert!(env.stderr().contains("the built-in default policy is in force"), "{}", env.stderr());
    let mut keys = env.keys().await;
    keys.create_key(pb::CreateKeyRequest {
        name: "k".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("root may create under the built-in policy");
}
