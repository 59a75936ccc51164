//! A quick check of the TPM actor's overhead: raw in-process ESAPI signing vs. the vault's sign
//! through the actor, alternating on one swtpm. Ignored by default (a measurement, not a test);
//! the full comparison is `cargo run --release -p tpm-vault-bench` (docs/BENCHMARKS.md).
//! Run: `cargo test --release -p tpm-vault-daemon --test actor_overhead -- --ignored --nocapture`.

mod support;

use std::str::FromStr;
use std::time::{Duration, Instant};

use support::TpmEnv;
use tpm_vault_daemon::model::{KeyAlg, SignInput};
use tpm_vault_daemon::tpm::templates;
use tpm_vault_daemon::vault::SignRequest;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::structures::{Digest, HashScheme, HashcheckTicket, SignatureScheme};

fn raw_rate(tcti: &str, window: Duration) -> f64 {
    let mut ctx = tss_esapi::Context::new(tss_esapi::TctiNameConf::from_str(tcti).expect("tcti")).expect("ctx");
    let srk = ctx
        .execute_with_session(Some(AuthSession::Password), |c| {
            c.create_primary(Hierarchy::Owner, templates::srk().expect("srk"), None, None, None, None)
        })
        .expect("srk")
        .key_handle;
    let key = ctx
        .execute_with_session(Some(AuthSession::Password), |c| {
            let k = c.create(
                srk,
                templates::signing_key(KeyAlg::EccP256, None, false).expect("t"),
                None,
                None,
                None,
                None,
            )?;
            c.load(srk, k.out_private, k.out_public)
        })
        .expect("key");
    let ticket = HashcheckTicket::try_from(tss_esapi::tss2_esys::TPMT_TK_HASHCHECK {
        tag: tss_esapi::constants::tss::TPM2_ST_HASHCHECK,
        hierarchy: tss_esapi::constants::tss::TPM2_RH_NULL,
        digest: Default::default(),
    })
    .expect("ticket");
    let scheme = SignatureScheme::EcDsa {
        hash_scheme: HashScheme::new(tss_esapi::interface_types::algorithm::HashingAlgorithm::Sha256),
    };
    let digest = Digest::try_from(vec![7u8; 32]).expect("digest");
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < window {
        ctx.execute_with_session(Some(AuthSession::Password), |c| c.sign(key, digest.clone(), scheme, ticket.clone()))
            .expect("sign");
        n += 1;
    }
    let _ = ctx.flush_context(key.into());
    let _ = ctx.flush_context(srk.into());
    f64::from(n) / start.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run explicitly"]
async fn actor_overhead() {
    let env = TpmEnv::start();
    let window = Duration::from_secs(3);
    for round in 0..3 {
        let tcti = env.swtpm.tcti();
        let raw = tokio::task::spawn_blocking(move || raw_rate(&tcti, window)).await.expect("raw");
        let vault = env.vault().await;
        let name = support::key(&format!("bench{round}"));
        vault.create_key(name.clone(), KeyAlg::EccP256, 0, None, None).await.expect("create");
        let req = || SignRequest { input: SignInput::Digest(vec![7u8; 32]), hash: None, scheme: None };
        vault.sign(&name, req(), None).await.expect("warm");
        let start = Instant::now();
        let mut n = 0u32;
        while start.elapsed() < window {
            vault.sign(&name, req(), None).await.expect("sign");
            n += 1;
        }
        let actor = f64::from(n) / start.elapsed().as_secs_f64();
        // Two callers: the next job waits in the queue while the TPM works on this one.
        let start = Instant::now();
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let (vault, name) = (vault.clone(), name.clone());
                tokio::spawn(async move {
                    let mut n = 0u32;
                    while start.elapsed() < window {
                        vault.sign(&name, req(), None).await.expect("sign");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut n = 0u32;
        for c in callers {
            n += c.await.expect("join");
        }
        let piped = f64::from(n) / start.elapsed().as_secs_f64();
        vault.shutdown(Duration::from_secs(5)).await;
        eprintln!(
            "round {round}: raw {raw:.0}/s, actor {actor:.0}/s (ratio {:.3}), 2 callers {piped:.0}/s (ratio {:.3})",
            actor / raw,
            piped / raw
        );
    }
}
