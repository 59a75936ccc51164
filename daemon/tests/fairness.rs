//! Fairness: one client floods the vault with 64 concurrent signing requests while another
//! client (a different uid, re-executed under `setpriv`) signs one request at a time. With the
//! per-client limit of TPM requests in flight, the second client waits behind at most that many
//! of the flooder's jobs, so its latency stays well below the flooder's.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::sign_request;
use tpm_vault_proto::v1 as pb;

const FLOOD: usize = 64;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_client_cannot_starve_another() {
    let env = support::daemon_where_nobody_signs("fair-*").await;
    let mut keys = env.keys().await;
    for n in ["fair-flood", "fair-victim"] {
        keys.create_key(pb::CreateKeyRequest {
            name: n.into(),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            usages: vec![],
        })
        .await
        .expect("create");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flooders = Vec::new();
    for _ in 0..FLOOD {
        let mut c = keys.clone();
        let stop = stop.clone();
        flooders.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                c.sign(sign_request("fair-flood")).await.expect("flood sign");
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = support::run_as_nobody(&env, "victim").await;
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
    let mut c = pb::key_service_client::KeyServiceClient::new(support::nobody_channel().await);
    let mut lat = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        c.sign(sign_request("fair-victim")).await.expect("victim sign");
        lat.push(t.elapsed());
    }
    println!("VICTIM_P50_US={}", median(lat).as_micros());
}
