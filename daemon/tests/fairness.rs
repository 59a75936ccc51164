//! Fairness: one client floods the vault with 64 concurrent signing requests while another
//! client (a different uid, re-executed under `setpriv`) signs one request at a time. With the
//! per-client limit of TPM requests in flight, the second client waits behind at most that many
//! of the flooder's jobs, so its latency stays well below the flooder's.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use support::{DaemonEnv, TpmEnv};
use tpm_vault_daemon::daemon::AuditLog;
use tpm_vault_daemon::daemon::{Access, Policy};
use tpm_vault_proto::v1 as pb;

const NOBODY: u32 = 65534;
const FLOOD: usize = 64;

fn sign(name: &str) -> pb::SignRequest {
    pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Message(vec![1])),
        hash: 0,
        scheme: 0,
        auth: vec![],
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_client_cannot_starve_another() {
    let tpm = TpmEnv::start();
    let mut policy = Policy::default();
    let text = format!(
        "{}\n[[rule]]\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"fair-*\"]\noperations = [\"sign\"]\n",
        support::allow_self_policy()
    );
    policy.add_file(Path::new("t.toml"), &text).expect("policy");
    let env = DaemonEnv::start_with(tpm, Arc::new(Access::with_policy(policy, AuditLog::tracing_only()))).await;
    let mut keys = env.keys().await;
    for n in ["fair-flood", "fair-victim"] {
        keys.create_key(pb::CreateKeyRequest { name: n.into(), algorithm: 0, pcr_binding: None, auth: vec![] })
            .await
            .expect("create");
    }
    std::fs::set_permissions(env.tpm.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flooders = Vec::new();
    for _ in 0..FLOOD {
        let mut c = keys.clone();
        let stop = stop.clone();
        flooders.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                c.sign(sign("fair-flood")).await.expect("flood sign");
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = tokio::process::Command::new("setpriv")
        .close_inherited_fds()
        .args(["--reuid", &NOBODY.to_string(), "--regid", &NOBODY.to_string(), "--clear-groups"])
        .arg(std::env::current_exe().expect("exe"))
        .args(["--ignored", "--exact", "victim", "--nocapture"])
        .env("TPM_VAULT_TEST_SOCKET", &env.socket)
        .output()
        .await
        .expect("setpriv");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut flood = Vec::new();
    for f in flooders {
        flood.extend(f.await.expect("join"));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "victim failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let victim_us: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("VICTIM_P50_US="))
        .and_then(|v| v.trim().parse().ok())
        .expect("victim p50 line");
    let flood_p50 = median(flood.clone());
    eprintln!(
        "fairness: flooder ({FLOOD} concurrent) p50 {} us over {} requests; other client p50 {victim_us} us",
        flood_p50.as_micros(),
        flood.len()
    );
    assert!(
        u128::from(victim_us) * 2 < flood_p50.as_micros(),
        "the other client waited {victim_us} us, the flooder {} us",
        flood_p50.as_micros()
    );
    env.stop().await;
}

/// The other client (runs as uid 65534 in a child process); ignored in normal runs.
#[tokio::test]
#[ignore = "helper: run by a_greedy_client_cannot_starve_another"]
async fn victim() {
    let socket = std::env::var("TPM_VAULT_TEST_SOCKET").expect("socket env");
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{socket}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut c = pb::key_service_client::KeyServiceClient::new(channel);
    let mut lat = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        c.sign(sign("fair-victim")).await.expect("victim sign");
        lat.push(t.elapsed());
    }
    println!("VICTIM_P50_US={}", median(lat).as_micros());
}
