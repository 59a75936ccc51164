//! TPM faults against a real swtpm: a TPM answering TPM_RC_RETRY (injected by a proxy), the
//! TPM dying under load and coming back, and a TPM cleared under the daemon. (A TPM in
//! dictionary-attack lockout, and the guard that keeps the vault from causing one, are in
//! `lockout.rs`.)

mod support;

use std::time::{Duration, Instant};

use support::proxy::{TpmProxy, CC_SIGN, CC_UNSEAL, RC_PCR_CHANGED};
use support::{DaemonEnv, TpmEnv};
use tonic::Code;
use tpm_vault_daemon::model::{KeyAlg, PcrBank, PcrSelection, SignInput};
use tpm_vault_daemon::{Error, VaultConfig};
use tpm_vault_daemon::{SealTarget, SignRequest};
use tpm_vault_proto::v1 as pb;

fn sign_req(name: &str) -> pb::SignRequest {
    pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Message(b"m".to_vec())),
        hash: 0,
        scheme: 0,
        auth: vec![],
        purpose: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_answers_are_retried_with_a_bound() {
    let env = TpmEnv::start();
    let proxy = TpmProxy::start(env.swtpm.port());
    let vault =
        tpm_vault_daemon::Vault::open(VaultConfig { tcti: proxy.tcti(), ..env.vault_config() }).await.expect("open");
    let name = support::key("k");
    vault.create_key(name.clone(), KeyAlg::EccP256, 0, None, None).await.expect("create");
    let req = || SignRequest { input: SignInput::Message(b"m".to_vec()), hash: None, scheme: None };
    // A few RETRY answers: the stack resubmits and the caller never notices.
    proxy.inject_retry(CC_SIGN, 3);
    vault.sign(&name, req(), None).await.expect("sign through RETRY answers");
    assert_eq!(proxy.injected(), 3);
    // A TPM that never stops answering RETRY: a bounded number of attempts, then "busy".
    proxy.inject_retry(CC_SIGN, 1_000);
    let start = Instant::now();
    let r = vault.sign(&name, req(), None).await;
    assert!(matches!(r, Err(Error::Tpm(tpm_vault_daemon::TpmError::Busy(_)))), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(5), "bounded: {:?}", start.elapsed());
    let attempts = proxy.injected() - 3;
    assert!((5..=100).contains(&attempts), "{attempts} attempts");
    proxy.inject_retry(CC_SIGN, 0);
    vault.sign(&name, req(), None).await.expect("works again");
    vault.shutdown(Duration::from_secs(5)).await;
}

/// TPM_RC_PCR_CHANGED (a PCR moved between TPM2_PolicyPCR and TPM2_Unseal) is retried from
/// a fresh policy session, so the unseal succeeds; past the bound it is "busy", not a policy
/// failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcr_changed_during_a_policy_session_is_retried_from_a_new_session() {
    let env = TpmEnv::start();
    let proxy = TpmProxy::start(env.swtpm.port());
    let vault =
        tpm_vault_daemon::Vault::open(VaultConfig { tcti: proxy.tcti(), ..env.vault_config() }).await.expect("open");
    let name = support::key("s");
    let selection = PcrSelection::new(PcrBank::Sha256, &[9]).expect("selection");
    let secret = zeroize::Zeroizing::new(b"boot-bound".to_vec());
    vault.seal(name.clone(), secret, SealTarget::Pcr { selection, values: None }, 0, false).await.expect("seal");
    let policy_pcr = 0x0000_017Fu32.to_be_bytes(); // TPM_CC_PolicyPCR
    let before = proxy.count(&policy_pcr);
    proxy.inject(CC_UNSEAL, RC_PCR_CHANGED, 2);
    let data = vault.unseal(&name, None).await.expect("unseal through PCR_CHANGED answers");
    assert_eq!(data.as_slice(), b"boot-bound");
    assert_eq!(proxy.injected(), 2);
    assert_eq!(proxy.count(&policy_pcr) - before, 3, "each attempt starts its own policy session");
    proxy.inject(CC_UNSEAL, RC_PCR_CHANGED, 1_000);
    let r = vault.unseal(&name, None).await;
    assert!(matches!(r, Err(Error::Tpm(tpm_vault_daemon::TpmError::Busy(_)))), "{r:?}");
    proxy.inject(CC_UNSEAL, RC_PCR_CHANGED, 0);
    assert_eq!(vault.unseal(&name, None).await.expect("works again").as_slice(), b"boot-bound");
    vault.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpm_death_under_load_is_unavailable_fast_and_recovers() {
    let mut env = DaemonEnv::start().await;
    let mut keys = env.keys().await;
    let mut status = pb::status_service_client::StatusServiceClient::new(env.channel().await);
    for i in 0..4 {
        keys.create_key(pb::CreateKeyRequest {
            name: format!("k{i}"),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            usages: vec![],
        })
        .await
        .expect("create");
    }
    // Load: 16 clients signing in a loop, recording (issued, finished, code).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..16 {
        let mut c = keys.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut log = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let issued = Instant::now();
                let r = c.sign(sign_req(&format!("k{}", w % 4))).await;
                log.push((issued, Instant::now(), r.err().map(|e| e.code())));
            }
            log
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed_at = Instant::now();
    env.tpm.swtpm.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = status.get_status(pb::GetStatusRequest {}).await.expect("status while TPM down").into_inner();
    assert_eq!(s.tpm_state, pb::TpmState::Down as i32, "status reports the TPM down");
    let mut health = tonic_health::pb::health_client::HealthClient::new(env.channel().await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let h = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.expect("health");
    assert_eq!(h.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::NotServing as i32);
    env.tpm.swtpm.restart().expect("restart swtpm");
    let restarted_at = Instant::now();
    // Recovery: the daemon reconnects by itself and keys sign again.
    let recovered = loop {
        if keys.sign(sign_req("k0")).await.is_ok() {
            break restarted_at.elapsed();
        }
        assert!(restarted_at.elapsed() < Duration::from_secs(15), "no recovery");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut failures_after_kill = 0;
    for w in workers {
        for (issued, finished, code) in w.await.expect("join") {
            if let Some(code) = code {
                assert_eq!(code, Code::Unavailable, "only UNAVAILABLE while the TPM is down");
                assert!(finished - issued < Duration::from_secs(2), "failed fast: {:?}", finished - issued);
                assert!(finished >= killed_at, "no failure before the kill");
                failures_after_kill += 1;
            }
        }
    }
    assert!(failures_after_kill > 0, "some requests hit the dead TPM");
    for i in 0..4 {
        keys.sign(sign_req(&format!("k{i}"))).await.expect("no key lost");
    }
    let s = status.get_status(pb::GetStatusRequest {}).await.expect("status").into_inner();
    assert_eq!(s.tpm_state, pb::TpmState::Ready as i32);
    let unavailable = s.metrics.iter().find(|m| m.name == "tpm_error/unavailable").map_or(0, |m| m.count);
    assert!(unavailable > 0, "TPM errors are counted by class: {:?}", s.metrics);
    eprintln!(
        "TPM down for {:?}; {failures_after_kill} requests failed UNAVAILABLE; recovered {recovered:?} after restart",
        restarted_at - killed_at
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tpm_cleared_under_the_daemon_is_refused_loudly() {
    let mut env = DaemonEnv::start().await;
    let mut keys = env.keys().await;
    let mut status = pb::status_service_client::StatusServiceClient::new(env.channel().await);
    keys.create_key(pb::CreateKeyRequest {
        name: "old".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("create");
    let srk_before = std::fs::read_to_string(env.tpm.state_dir().join("srk.name")).expect("srk.name");
    // Clear: the TPM restarts with fresh seeds (new state).
    env.tpm.swtpm.kill();
    for f in std::fs::read_dir(env.tpm.swtpm.state_dir()).expect("dir").flatten() {
        if f.file_name().to_string_lossy().starts_with("tpm2-") {
            std::fs::remove_file(f.path()).expect("wipe");
        }
    }
    env.tpm.swtpm.restart().expect("restart");
    let deadline = Instant::now() + Duration::from_secs(15);
    let err = loop {
        let e = keys.sign(sign_req("old")).await.expect_err("must not sign with a cleared TPM");
        if e.code() == Code::FailedPrecondition {
            break e;
        }
        assert!(Instant::now() < deadline, "never detected the mismatch: {e:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(err.message().contains("cleared or replaced"), "{}", err.message());
    let e = keys
        .create_key(pb::CreateKeyRequest {
            name: "shadow".into(),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            usages: vec![],
        })
        .await
        .expect_err("no new keys on a foreign TPM");
    assert_eq!(e.code(), Code::FailedPrecondition);
    let s = status.get_status(pb::GetStatusRequest {}).await.expect("status").into_inner();
    assert_eq!(s.tpm_state, pb::TpmState::Mismatch as i32);
    assert!(s.last_tpm_error.contains("mismatch"), "{}", s.last_tpm_error);
    assert_eq!(std::fs::read_to_string(env.tpm.state_dir().join("srk.name")).expect("srk.name"), srk_before);
    assert!(env.tpm.state_dir().join("keys/old.key").exists(), "no record lost");
    assert!(!env.tpm.state_dir().join("keys/shadow.key").exists());
    env.stop().await;
}
