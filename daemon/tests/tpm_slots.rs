//! Every RPC that can reach the TPM holds one of its client's TPM slots for the whole call
//! (issue #19), and the TPM queue serves clients in turn: a flood of Decrypt calls whose data
//! key must be unsealed on each call (it is PCR-bound and the PCR moved, so nothing is cached)
//! leaves another client's signatures fast, with the default slot limit and without one; and a
//! call that needs two operations (a self-signed certificate: sign and create) takes one slot,
//! so the client's whole limit of them in flight cannot deadlock, and writes one audit record.
//! The vault a call works through queues its TPM jobs in the call's client's lane.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{sign_request, DaemonEnv, TpmEnv};
use tonic::Code;
use tpm_vault_daemon::daemon::AuditLog;
use tpm_vault_daemon::daemon::{Access, Policy};
use tpm_vault_daemon::daemon::{ClientLimits, DEFAULT_PER_CLIENT};
use tpm_vault_daemon::model::PcrBank;
use tpm_vault_proto::v1 as pb;

/// Connections of the flooding client, and Decrypt calls in flight on each.
const FLOOD_CONNECTIONS: usize = 8;
const FLOOD_PER_CONNECTION: usize = 64;
/// The other client's signatures, one at a time.
const VICTIM_SIGNS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decrypt_flood_leaves_another_clients_signatures_fast() {
    let env = support::daemon_where_nobody_signs("victim").await;
    let (p50_us, max_us) = decrypt_flood(&env, "default slots").await;
    // Measured over ten runs: p50 13-33 ms, slowest 20-79 ms (debug build, shared cores): the
    // other client's signature waits behind about one of the flooder's jobs (~5-20 ms of TPM
    // work each), as the TPM queue serves clients in turn. With one FIFO for everyone it waited
    // behind up to the flooder's 16 slots of them: p50 69-95 ms, slowest 108-178 ms on a quiet
    // machine (which passes 0.5 s), 0.30-0.43 s and 0.80-0.96 s on a loaded one.
    assert!(
        max_us < 500_000,
        "the other client's slowest signature took {max_us} us under the flood (p50 {p50_us} us)"
    );
    env.stop().await;
}

/// The TPM queue alone keeps the clients apart: with a slot limit as large as the flood (every
/// one of its calls queues its TPM job at once), the other client's signatures stay as fast.
/// With one FIFO for everyone they waited behind all 512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tpm_queue_serves_clients_in_turn_without_a_slot_limit() {
    let slots = ClientLimits::new(FLOOD_CONNECTIONS * FLOOD_PER_CONNECTION, Duration::from_secs(30));
    let access = support::nobody_signs_access("victim").with_client_limits(slots);
    let env = DaemonEnv::start_with(TpmEnv::start(), Arc::new(access)).await;
    let (p50_us, max_us) = decrypt_flood(&env, "512 slots").await;
    assert!(
        max_us < 500_000,
        "the other client's slowest signature took {max_us} us under the flood (p50 {p50_us} us)"
    );
    env.stop().await;
}

/// One flood at a time in this binary (each takes both cores).
static FLOODING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Floods `env`'s daemon from this uid with Decrypt calls whose data key must be unsealed by
/// the TPM on each call, while uid 65534 signs [`VICTIM_SIGNS`] times with the key "victim",
/// one at a time. Returns the median and slowest of those signatures, in microseconds.
async fn decrypt_flood(env: &DaemonEnv, what: &str) -> (u64, u64) {
    let _one_flood = FLOODING.lock().await;
    let channel = env.channel().await;
    let mut keys = pb::key_service_client::KeyServiceClient::new(channel.clone());
    keys.create_key(pb::CreateKeyRequest {
        name: "victim".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("create victim");
    // A data key bound to PCR 9 as it is now; a stream header under it; then PCR 9 moves, so
    // every Decrypt of that stream must try (and fail) to unseal the key in the TPM.
    let mut crypto = pb::crypto_service_client::CryptoServiceClient::new(channel);
    let binding = pb::PcrBinding { bank: "sha256".into(), pcrs: vec![9], values: vec![] };
    crypto
        .create_data_key(pb::CreateDataKeyRequest { name: "bound".into(), pcr_binding: Some(binding) })
        .await
        .expect("create data key");
    let header = crypto
        .create_stream_key(pb::CreateStreamKeyRequest { key_name: "bound".into(), context: vec![] })
        .await
        .expect("stream key")
        .into_inner()
        .header;
    env.vault.evict_data_keys();
    env.vault.pcr_extend(PcrBank::Sha256, 9, vec![0x42; 32]).await.expect("extend");
    let first = pb::DecryptRequest { context: vec![], data: header.into() };
    let e = decrypt_error(&mut crypto, &first).await;
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let flooded = Arc::new(AtomicU64::new(0));
    let mut flooders = Vec::new();
    for _ in 0..FLOOD_CONNECTIONS {
        let channel = env.channel().await;
        for _ in 0..FLOOD_PER_CONNECTION {
            let mut c = pb::crypto_service_client::CryptoServiceClient::new(channel.clone());
            let (stop, flooded, first) = (stop.clone(), flooded.clone(), first.clone());
            flooders.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let e = decrypt_error(&mut c, &first).await;
                    assert!(
                        matches!(e.code(), Code::FailedPrecondition | Code::ResourceExhausted | Code::Unavailable),
                        "flood decrypt: {e:?}"
                    );
                    flooded.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = support::run_as_nobody(env, "victim_signs").await;
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.await.expect("flooder");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "victim failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let value = |key: &str| -> u64 {
        stdout.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok()).expect(key)
    };
    let (max_us, p50_us) = (value("VICTIM_MAX_US="), value("VICTIM_P50_US="));
    eprintln!(
        "tpm slots ({what}): {} Decrypt calls in flight from one uid ({} done); the other uid's {VICTIM_SIGNS} \
         signatures: p50 {p50_us} us, slowest {max_us} us",
        FLOOD_CONNECTIONS * FLOOD_PER_CONNECTION,
        flooded.load(Ordering::Relaxed)
    );
    (p50_us, max_us)
}

/// The status a Decrypt call of the stream that starts with `first` fails with.
async fn decrypt_error(
    c: &mut pb::crypto_service_client::CryptoServiceClient<tonic::transport::Channel>,
    first: &pb::DecryptRequest,
) -> tonic::Status {
    match c.decrypt(tokio_stream::iter(vec![first.clone()])).await {
        Ok(_) => panic!("a Decrypt under a data key whose PCRs moved was answered"),
        Err(e) => e,
    }
}

/// The other client (runs as uid 65534 in a child process); ignored in normal runs.
#[tokio::test]
#[ignore = "helper: run by a_decrypt_flood_leaves_another_clients_signatures_fast"]
async fn victim_signs() {
    let mut c = pb::key_service_client::KeyServiceClient::new(support::nobody_channel().await);
    let mut lat = Vec::new();
    for _ in 0..VICTIM_SIGNS {
        let t = Instant::now();
        c.sign(sign_request("victim")).await.expect("victim sign");
        lat.push(t.elapsed());
    }
    lat.sort();
    println!("VICTIM_P50_US={}", lat[lat.len() / 2].as_micros());
    println!("VICTIM_MAX_US={}", lat.last().map_or(0, Duration::as_micros));
}

/// More self-signed certificates in flight from one client than it has TPM slots: each call
/// holds one slot (it used to take two in turn, so the client's whole limit deadlocked on the
/// second until the 30 s wait ran out), and writes one audit record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_self_signed_certificates_finish_with_one_slot_and_one_record_each() {
    const CALLS: usize = DEFAULT_PER_CLIENT + 8;
    let tpm = TpmEnv::start();
    let audit_path = tpm.path().join("audit.jsonl");
    let mut policy = Policy::default();
    policy.add_file(Path::new("self.toml"), &support::allow_self_policy()).expect("policy");
    let access = Access::with_policy(policy, AuditLog::with_file(&audit_path).expect("audit file"));
    let env = DaemonEnv::start_with(tpm, Arc::new(access)).await;
    let keys = env.keys().await;
    keys.clone()
        .create_key(pb::CreateKeyRequest {
            name: "device".into(),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            usages: vec![],
        })
        .await
        .expect("create");
    let started = Instant::now();
    let mut calls = Vec::new();
    for i in 0..CALLS {
        let mut c = keys.clone();
        calls.push(tokio::spawn(async move {
            let request = pb::CreateSelfSignedCertificateRequest {
                name: "device".into(),
                subject: Some(pb::CertificateSubject { subject: format!("CN=device-{i}"), ..Default::default() }),
                days: 1,
                auth: vec![],
            };
            c.create_self_signed_certificate(request).await.map(|_| ())
        }));
    }
    let mut failures = Vec::new();
    for c in calls {
        if let Err(e) = c.await.expect("join") {
            failures.push(e);
        }
    }
    let took = started.elapsed();
    eprintln!("tpm slots: {CALLS} concurrent self-signed certificates from one client in {} ms", took.as_millis());
    assert!(failures.is_empty(), "{} of {CALLS} failed, first: {:?}", failures.len(), failures.first());
    assert!(took < Duration::from_secs(20), "took {took:?}");
    // One record per call, naming the call's operation (create) and its outcome.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = std::fs::read_to_string(&audit_path).expect("audit log");
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .filter(|e: &serde_json::Value| e["key"] == "device")
        .collect();
    let certificates = records.iter().filter(|e| e["op"] == "create" && e["outcome"] == "ok").count();
    // The key's own creation is one of the create records.
    assert_eq!((records.len(), certificates), (CALLS + 1, CALLS + 1), "{log}");
    env.stop().await;
}

/// The vault a call works through queues its TPM jobs as the call's client (`Vault::for_client`,
/// the key the RPC layer passes down): a client's PCR read overtakes a backlog of the daemon's
/// own jobs instead of waiting behind all of it. With the key lost on the way (every job in
/// the daemon's lane) the read waits for the whole backlog, 20 × 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_jobs_queue_in_its_own_lane() {
    use tpm_vault_daemon::model::PcrSelection;
    use tpm_vault_daemon::ClientKey;
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let backlog: Vec<_> = (0..20)
        .map(|_| {
            let tpm = vault.tpm().clone();
            tokio::spawn(async move {
                tpm.call(ClientKey::DAEMON, "backlog", |_| {
                    std::thread::sleep(Duration::from_millis(50));
                    Ok(())
                })
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let selection = PcrSelection::new(PcrBank::Sha256, &[9]).expect("selection");
    let start = Instant::now();
    vault.for_client(ClientKey::new(7)).pcr_read(&selection).await.expect("pcr read");
    let took = start.elapsed();
    for job in backlog {
        job.await.expect("backlog task").expect("backlog job");
    }
    assert!(took < Duration::from_millis(500), "the client's read waited {took:?} behind the daemon's backlog");
    vault.shutdown(Duration::from_secs(5)).await;
}
