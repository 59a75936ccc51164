//! Load: 64 concurrent clients for a bounded time (10 s by default; `TPM_VAULT_LOAD_SECS=60`
//! for the long run) mixing create, sign, public, quote, seal/unseal, encrypt/decrypt and
//! random against the real daemon binary: zero unexpected errors, every signature verifies,
//! no TPM objects left behind, daemon RSS flat.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use p256::ecdsa::signature::Verifier;
use p256::pkcs8::DecodePublicKey;
use rand::Rng;
use support::{KillOnDrop, ProcEnv};
use tpm_vault_proto::v1 as pb;

const CLIENTS: usize = 64;
const KEYS: usize = 8;

fn secs() -> u64 {
    std::env::var("TPM_VAULT_LOAD_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(10)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[derive(Default, Debug)]
struct Tally {
    ok: BTreeMap<&'static str, u64>,
    errors: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_mixed_load() {
    let mut env = ProcEnv::new();
    let mut daemon = KillOnDrop(env.command().spawn().expect("spawn"));
    assert!(env.wait_note("READY=1", Duration::from_secs(30)), "{}", env.stderr());
    let pid = daemon.0.id();
    let channel = env.channel().await;
    let mut keys = pb::key_service_client::KeyServiceClient::new(channel.clone());
    let mut crypto = pb::crypto_service_client::CryptoServiceClient::new(channel.clone());
    let mut publics = Vec::new();
    for i in 0..KEYS {
        let name = format!("load-{i}");
        keys.create_key(pb::CreateKeyRequest {
            name: name.clone(),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            usages: vec![],
        })
        .await
        .expect("create");
        let der =
            keys.get_public_key(pb::GetPublicKeyRequest { name: name.clone() }).await.expect("public").into_inner().der;
        publics.push((name, p256::ecdsa::VerifyingKey::from_public_key_der(&der).expect("spki")));
    }
    crypto.create_data_key(pb::CreateDataKeyRequest { name: "load-dk".into(), pcr_binding: None }).await.expect("dk");
    let publics = Arc::new(publics);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let deadline = Instant::now() + Duration::from_secs(secs());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_start = rss_kib(pid);
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let channel = channel.clone();
        let publics = publics.clone();
        let tally = tally.clone();
        tasks.push(tokio::spawn(async move {
            let mut keys = pb::key_service_client::KeyServiceClient::new(channel.clone());
            let mut attest = pb::attestation_service_client::AttestationServiceClient::new(channel.clone());
            let mut seal = pb::seal_service_client::SealServiceClient::new(channel.clone());
            let mut crypto = pb::crypto_service_client::CryptoServiceClient::new(channel.clone());
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let pick = rand::thread_rng().gen_range(0..100);
                let (op, result): (&'static str, Result<(), String>) = match pick {
                    0..=49 => {
                        let (name, vk) = &publics[(n as usize + client) % KEYS];
                        let msg = format!("{client}-{n}").into_bytes();
                        let r = keys
                            .sign(pb::SignRequest {
                                name: name.clone(),
                                input: Some(pb::sign_request::Input::Message(msg.clone())),
                                hash: 0,
                                scheme: 0,
                                auth: vec![],
                                purpose: 0,
                            })
                            .await;
                        (
                            "sign",
                            match r {
                                Ok(s) => p256::ecdsa::Signature::from_der(&s.into_inner().signature)
                                    .map_err(|e| e.to_string())
                                    .and_then(|sig| {
                                        vk.verify(&msg, &sig).map_err(|e| format!("signature does not verify: {e}"))
                                    }),
                                Err(e) => Err(e.to_string()),
                            },
                        )
                    }
                    50..=59 => {
                        let r = keys
                            .get_public_key(pb::GetPublicKeyRequest { name: publics[n as usize % KEYS].0.clone() })
                            .await;
                        ("public", r.map(|_| ()).map_err(|e| e.to_string()))
                    }
                    60..=64 => {
                        let name = format!("tmp-{client}-{n}");
                        let r = keys
                            .create_key(pb::CreateKeyRequest {
                                name: name.clone(),
                                algorithm: 0,
                                pcr_binding: None,
                                auth: vec![],
                                usages: vec![],
                            })
                            .await;
                        let r = match r {
                            Ok(_) => keys.delete_key(pb::DeleteKeyRequest { name }).await.map(|_| ()),
                            Err(e) => Err(e),
                        };
                        ("create+delete", r.map_err(|e| e.to_string()))
                    }
                    65..=72 => {
                        let nonce: [u8; 16] = rand::random();
                        let r = attest
                            .quote(pb::QuoteRequest { pcrs: None, nonce: nonce.to_vec(), ..Default::default() })
                            .await;
                        ("quote", r.map(|_| ()).map_err(|e| e.to_string()))
                    }
                    73..=80 => {
                        let name = format!("sec-{client}-{n}");
                        let secret = name.clone().into_bytes();
                        let r = seal
                            .seal(pb::SealRequest {
                                name: name.clone(),
                                secret: secret.clone(),
                                pcr_binding: None,
                                authorized_by: vec![],
                                overwrite: false,
                            })
                            .await;
                        let r = match r {
                            Ok(_) => {
                                match seal.unseal(pb::UnsealRequest { name: name.clone(), signed_policy: vec![] }).await
                                {
                                    Ok(u) if u.get_ref().secret.as_slice() == secret.as_slice() => seal
                                        .delete_sealed(pb::DeleteSealedRequest { name })
                                        .await
                                        .map(|_| ())
                                        .map_err(|e| e.to_string()),
                                    Ok(_) => Err("unsealed a different secret".into()),
                                    Err(e) => Err(e.to_string()),
                                }
                            }
                            Err(e) => Err(e.to_string()),
                        };
                        ("seal+unseal", r)
                    }
                    81..=92 => {
                        let plain = vec![(n % 251) as u8; 70_000];
                        let r = round_trip(&mut crypto, &plain).await;
                        ("encrypt+decrypt", r)
                    }
                    _ => {
                        let r = crypto.get_random(pb::GetRandomRequest { length: 4096 }).await;
                        ("random", r.map(|_| ()).map_err(|e| e.to_string()))
                    }
                };
                let mut t = tally.lock().expect("tally");
                match result {
                    Ok(()) => *t.ok.entry(op).or_default() += 1,
                    Err(e) => t.errors.push(format!("{op}: {e}")),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    let rss_end = rss_kib(pid);
    let t = tally.lock().expect("tally");
    let total: u64 = t.ok.values().sum();
    eprintln!(
        "load: {CLIENTS} clients, {}s, {total} ok operations {:?}, {} errors; daemon RSS {} -> {} KiB",
        secs(),
        t.ok,
        t.errors.len(),
        rss_start,
        rss_end
    );
    assert!(t.errors.is_empty(), "unexpected errors: {:?}", &t.errors[..t.errors.len().min(5)]);
    assert!(t.ok.get("sign").copied().unwrap_or(0) > 0 && t.ok.len() == 7, "every operation ran: {:?}", t.ok);
    // Stated bound: the daemon's RSS grows by less than 32 MiB over the run.
    assert!(rss_end < rss_start + 32 * 1024, "RSS grew from {rss_start} to {rss_end} KiB");
    // Loaded objects stay within the budget; after exit none are left.
    support::send_signal(&daemon.0, nix::sys::signal::Signal::SIGTERM);
    let status = support::wait_exit(&mut daemon.0, Duration::from_secs(30));
    assert!(status.success(), "daemon exit: {status:?}\n{}", env.stderr());
    assert_eq!(env.transient_handles(), 0, "transient objects left in the TPM");
}

async fn round_trip(
    c: &mut pb::crypto_service_client::CryptoServiceClient<tonic::transport::Channel>,
    plain: &[u8],
) -> Result<(), String> {
    let reqs = vec![
        pb::EncryptRequest { key_name: "load-dk".into(), context: b"load".to_vec(), data: Default::default() },
        pb::EncryptRequest { key_name: String::new(), context: vec![], data: plain.to_vec().into() },
    ];
    let mut s = c.encrypt(tokio_stream::iter(reqs)).await.map_err(|e| e.to_string())?.into_inner();
    let mut sealed = Vec::new();
    while let Some(m) = s.message().await.map_err(|e| e.to_string())? {
        sealed.extend_from_slice(&m.data);
    }
    let reqs = vec![pb::DecryptRequest { context: b"load".to_vec(), data: sealed.into() }];
    let mut s = c.decrypt(tokio_stream::iter(reqs)).await.map_err(|e| e.to_string())?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.message().await.map_err(|e| e.to_string())? {
        out.extend_from_slice(&m.data);
    }
    if out == plain {
        Ok(())
    } else {
        Err("decrypted data differs".into())
    }
}
