//! Crash consistency: SIGKILL the real daemon at random points of create / delete / seal loops,
//! restart it, and check that every acknowledged operation is there, nothing is half-present,
//! and leftovers never break startup. 20 iterations in the default run; set
//! `TPM_VAULT_CRASH_ITERATIONS=100` for the long run (docs/RELIABILITY.md).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use rand::Rng;
use support::{KillOnDrop, ProcEnv};
use tpm_vault_proto::v1 as pb;

fn iterations() -> usize {
    std::env::var("TPM_VAULT_CRASH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(20)
}

fn start(env: &mut ProcEnv) -> KillOnDrop {
    let child = env.command().spawn().expect("spawn tpm-vaultd");
    assert!(env.wait_note("READY=1", Duration::from_secs(30)), "daemon not ready: {}", env.stderr());
    KillOnDrop(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_points_loses_nothing_acknowledged() {
    let mut env = ProcEnv::new();
    let mut rng = rand::thread_rng();
    let mut keys_acked: BTreeSet<String> = BTreeSet::new();
    let mut deleted_acked: BTreeSet<String> = BTreeSet::new();
    let mut sealed_acked: BTreeSet<String> = BTreeSet::new();
    let mut counter = 0usize;
    let n = iterations();
    for iteration in 0..n {
        let mut daemon = start(&mut env);
        let channel = env.channel().await;
        let mut keys = pb::key_service_client::KeyServiceClient::new(channel.clone());
        let mut seal = pb::seal_service_client::SealServiceClient::new(channel);
        // Everything acknowledged so far is intact after the previous crash.
        let listed: BTreeSet<String> = keys
            .list_keys(pb::ListKeysRequest::default())
            .await
            .expect("list after restart")
            .into_inner()
            .keys
            .into_iter()
            .map(|k| k.name)
            .collect();
        for k in &keys_acked {
            assert!(listed.contains(k), "iteration {iteration}: acknowledged key {k} lost");
        }
        for k in &deleted_acked {
            assert!(!listed.contains(k), "iteration {iteration}: acknowledged delete of {k} undone");
        }
        for k in &listed {
            // No half-present key: every listed key signs.
            let r = pb::SignRequest {
                name: k.clone(),
                input: Some(pb::sign_request::Input::Message(vec![1])),
                hash: 0,
                scheme: 0,
                auth: vec![],
                purpose: 0,
            };
            keys.sign(r).await.unwrap_or_else(|e| panic!("iteration {iteration}: listed key {k} does not sign: {e}"));
        }
        for s in &sealed_acked {
            let r = seal.unseal(pb::UnsealRequest { name: s.clone(), signed_policy: vec![] }).await;
            let secret =
                r.unwrap_or_else(|e| panic!("iteration {iteration}: sealed {s} lost: {e}")).into_inner().secret;
            assert_eq!(secret.as_slice(), s.as_bytes(), "sealed secret {s} intact");
        }
        // A burst of operations, killed at a random moment.
        let kill_after = Duration::from_millis(rng.gen_range(20..400));
        let deadline = tokio::time::Instant::now() + kill_after;
        let mut inflight = Vec::new();
        while tokio::time::Instant::now() < deadline {
            counter += 1;
            let name = format!("k{counter:05}");
            let mut k = keys.clone();
            inflight.push(tokio::spawn(async move {
                let r = k
                    .create_key(pb::CreateKeyRequest {
                        name: name.clone(),
                        algorithm: 0,
                        pcr_binding: None,
                        auth: vec![],
                        usages: vec![],
                    })
                    .await;
                (name, r.is_ok())
            }));
            if counter.is_multiple_of(3) {
                if let Some(victim) = keys_acked.iter().next().cloned() {
                    if keys.delete_key(pb::DeleteKeyRequest { name: victim.clone() }).await.is_ok() {
                        keys_acked.remove(&victim);
                        deleted_acked.insert(victim);
                    }
                }
            }
            if counter.is_multiple_of(5) {
                let s = format!("s{counter:05}");
                let mut sc = seal.clone();
                let r = sc
                    .seal(pb::SealRequest {
                        name: s.clone(),
                        secret: s.as_bytes().to_vec(),
                        pcr_binding: None,
                        authorized_by: vec![],
                        overwrite: false,
                    })
                    .await;
                if r.is_ok() {
                    sealed_acked.insert(s);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            // Collect finished creates.
            let mut still = Vec::new();
            for h in inflight.drain(..) {
                if h.is_finished() {
                    if let Ok((name, true)) = h.await {
                        keys_acked.insert(name);
                    }
                } else {
                    still.push(h);
                }
            }
            inflight = still;
        }
        support::send_signal(&daemon.0, nix::sys::signal::Signal::SIGKILL);
        let _ = daemon.0.wait();
        // Creates that returned OK before the kill count as acknowledged too.
        for h in inflight {
            if let Ok((name, true)) = h.await {
                keys_acked.insert(name);
            }
        }
    }
    eprintln!(
        "{n} crash iterations: {} keys, {} deletes, {} sealed acknowledged",
        keys_acked.len(),
        deleted_acked.len(),
        sealed_acked.len()
    );
    assert!(!keys_acked.is_empty(), "the test acknowledged some creates");
}
