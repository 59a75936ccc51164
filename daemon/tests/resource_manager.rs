//! The vault behind a resource manager that gives each client only a few object slots
//! (tpm2-abrmd limited to 3 transient objects and 3 sessions per client, standing in for the
//! kernel's `/dev/tpmrm0`, which has 3 of each per open file): running out of slots is
//! recovered from by evicting loaded keys, with any `max_loaded_objects`, and never taken for
//! a lost TPM (issue #36).

mod support;

use std::sync::Arc;

use support::abrmd::Abrmd;
use support::{sign_request, DaemonEnv, TpmEnv};
use tpm_vault_daemon::daemon::ServeLimits;
use tpm_vault_daemon::Vault;
use tpm_vault_proto::v1 as pb;

/// TPM2_Load.
const CC_LOAD: u32 = 0x157;
/// TPM2_Sign.
const CC_SIGN: u32 = 0x15D;

/// A daemon with `max_loaded_objects` over tpm2-abrmd limited to 3 objects and 3 sessions.
async fn daemon_behind_abrmd(max_loaded_objects: usize) -> (DaemonEnv, Abrmd) {
    let tpm = TpmEnv::start();
    let abrmd = Abrmd::start(&tpm, 3, 3);
    let mut cfg = tpm.vault_config();
    cfg.tcti = abrmd.tcti();
    cfg.max_loaded_objects = max_loaded_objects;
    let vault = Vault::open(cfg).await.expect("open the vault through tpm2-abrmd");
    let env = DaemonEnv::serve(tpm, vault, Arc::new(support::allow_self_access()), ServeLimits::default());
    (env, abrmd)
}

/// 45 signatures over 5 keys, round-robin, with `max_loaded_objects = 16` through a resource
/// manager that holds 3 objects for the vault: every one succeeds. Before the fix, abrmd's
/// out-of-memory answer to TPM2_Load (0xb0902, TSS2_RESMGR_RC_LAYER | TPM_RC_OBJECT_MEMORY)
/// was not recognised and 18 of the 45 failed.
#[tokio::test]
async fn signatures_over_more_keys_than_slots_all_succeed() {
    let (env, abrmd) = daemon_behind_abrmd(16).await;
    let mut keys = env.keys().await;
    let names: Vec<String> = (0..5).map(|i| format!("rr-{i}")).collect();
    for name in &names {
        keys.create_key(pb::CreateKeyRequest {
            name: name.clone(),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            ..Default::default()
        })
        .await
        .expect("create");
    }
    let mut failed = Vec::new();
    for i in 0..45 {
        let name = &names[i % names.len()];
        if let Err(status) = keys.sign(sign_request(name)).await {
            failed.push(format!("{name}: {status}"));
        }
    }
    assert!(failed.is_empty(), "{} of 45 signatures failed: {failed:?}", failed.len());
    let counts = abrmd.proxy.commands();
    assert_eq!(counts.get(&CC_SIGN).copied().unwrap_or(0), 45, "commands: {counts:x?}");
    // The TPM stayed "ready" throughout: running out of slots is no lost TPM.
    let mut info = pb::status_service_client::StatusServiceClient::new(env.channel().await);
    let status = info.get_status(pb::GetStatusRequest::default()).await.expect("status").into_inner();
    assert_eq!(status.tpm_reconnects, 0, "the vault reconnected: {}", status.last_tpm_error);
    let loads = counts.get(&CC_LOAD).copied().unwrap_or(0);
    assert!(loads <= 45 + 5, "{loads} TPM2_Load for 45 signatures: the vault kept failing to load");
    env.stop().await;
    drop(abrmd);
}

/// TPM commands that reach the TPM for `n` signatures with `key`, after a warm-up one.
async fn commands_per_signature(env: &DaemonEnv, abrmd: &Abrmd, key: &str, n: usize) -> f64 {
    let mut keys = env.keys().await;
    keys.sign(sign_request(key)).await.expect("warm-up signature");
    // abrmd saves and flushes an object after answering: let those arrive before counting.
    let settle = || tokio::time::sleep(std::time::Duration::from_millis(100));
    settle().await;
    let before = abrmd.proxy.commands();
    for _ in 0..n {
        keys.sign(sign_request(key)).await.expect("sign");
    }
    settle().await;
    let after = abrmd.proxy.commands();
    let diff: Vec<(u32, usize)> =
        after.iter().map(|(cc, k)| (*cc, k - before.get(cc).copied().unwrap_or(0))).filter(|(_, k)| *k > 0).collect();
    eprintln!("{n} signatures: {diff:x?}");
    diff.iter().map(|(_, k)| k).sum::<usize>() as f64 / n as f64
}

/// Told it is behind the kernel's resource manager (here tpm2-abrmd stands in, which like the
/// kernel saves and flushes an object around each command that uses it), the vault makes the
/// SRK persistent, keeps one key loaded and no session: a steady-state signature is at most 4
/// TPM commands (ContextLoad, Sign, ContextSave, FlushContext), and `status` says so. A seal
/// and an unseal in between (which need the salted session and the SRK) leave it so.
#[tokio::test]
async fn behind_the_kernel_rm_a_signature_costs_at_most_four_commands() {
    let tpm = TpmEnv::start();
    let abrmd = Abrmd::start(&tpm, 3, 3);
    let mut cfg = tpm.vault_config();
    cfg.tcti = abrmd.tcti();
    cfg.resource_manager = Some(tpm_vault_daemon::daemon::ResourceManager::Kernel);
    // Start-up: the first start makes the SRK persistent; a restart finds it.
    let first = Vault::open(cfg.clone()).await.expect("open");
    first.shutdown(std::time::Duration::from_secs(5)).await;
    drop(first);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let before = abrmd.proxy.commands();
    let vault = Vault::open(cfg).await.expect("open again");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let started: Vec<(u32, usize)> = abrmd
        .proxy
        .commands()
        .iter()
        .map(|(cc, k)| (*cc, k - before.get(cc).copied().unwrap_or(0)))
        .filter(|(_, k)| *k > 0)
        .collect();
    eprintln!("a restart behind the kernel RM: TPM commands by code {started:x?}");
    let env = DaemonEnv::serve(tpm, vault, Arc::new(support::allow_self_access()), ServeLimits::default());
    let mut info = pb::status_service_client::StatusServiceClient::new(env.channel().await);
    let status = info.get_status(pb::GetStatusRequest::default()).await.expect("status").into_inner();
    assert!(status.srk_persistent, "the SRK was not made persistent");
    assert_eq!(status.resource_manager, "kernel");
    let mut keys = env.keys().await;
    for name in ["hot", "cold"] {
        keys.create_key(pb::CreateKeyRequest {
            name: name.into(),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            ..Default::default()
        })
        .await
        .expect("create");
    }
    let per_sign = commands_per_signature(&env, &abrmd, "hot", 20).await;
    eprintln!("behind the kernel RM (abrmd stand-in): {per_sign:.2} TPM commands per signature");
    assert!(per_sign <= 4.0, "{per_sign} TPM commands per signature");
    // Round-robin over two keys: each signature loads its key (the other one goes).
    let before = abrmd.proxy.total_commands();
    for i in 0..10 {
        keys.sign(sign_request(["hot", "cold"][i % 2])).await.expect("sign");
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let rr = (abrmd.proxy.total_commands() - before) as f64 / 10.0;
    eprintln!("round-robin over 2 keys: {rr:.2} TPM commands per signature");
    // A seal and an unseal (salted session, SRK) leave nothing behind that costs the next
    // signatures anything.
    let mut seal = pb::seal_service_client::SealServiceClient::new(env.channel().await);
    seal.seal(pb::SealRequest { name: "s".into(), secret: b"secret".to_vec(), ..Default::default() })
        .await
        .expect("seal");
    let unsealed = seal.unseal(pb::UnsealRequest { name: "s".into(), ..Default::default() }).await.expect("unseal");
    assert_eq!(unsealed.into_inner().secret.as_slice(), b"secret");
    let per_sign = commands_per_signature(&env, &abrmd, "hot", 10).await;
    assert!(per_sign <= 4.0, "{per_sign} TPM commands per signature after a seal and an unseal");
    env.stop().await;
    drop(abrmd);
}

/// The same daemon without being told (resource manager detected as tpm2-abrmd): what the
/// defaults cost there, for comparison (printed; abrmd loads only the objects a command names,
/// so it is cheaper than the kernel's for a kept SRK and session).
#[tokio::test]
async fn behind_tabrmd_signatures_cost_what_the_objects_they_use_cost() {
    let (env, abrmd) = daemon_behind_abrmd(3).await;
    let mut keys = env.keys().await;
    keys.create_key(pb::CreateKeyRequest {
        name: "hot".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        ..Default::default()
    })
    .await
    .expect("create");
    let per_sign = commands_per_signature(&env, &abrmd, "hot", 20).await;
    eprintln!("behind tpm2-abrmd, defaults: {per_sign:.2} TPM commands per signature");
    assert!(per_sign <= 4.0, "{per_sign} TPM commands per signature");
    env.stop().await;
    drop(abrmd);
}

/// Behind the kernel's resource manager, running out of the open file's slots fails `write()`
/// with -ENOMEM and the TCTI answers an I/O error (ESYS's context is then unusable). A proxy
/// closes the connection of the next TPM2_Load the same way: told the resource manager is
/// the kernel's, the vault reopens the TPM at once and the signature succeeds; without it
/// (`none`), the same fault is a lost TPM and the signature fails UNAVAILABLE.
#[tokio::test]
async fn out_of_kernel_slots_is_recovered_not_a_lost_tpm() {
    use tpm_vault_daemon::daemon::ResourceManager;
    for (rm, recovers) in [(ResourceManager::Kernel, true), (ResourceManager::None, false)] {
        let tpm = TpmEnv::start();
        let proxy = support::proxy::TpmProxy::start(tpm.swtpm.port());
        let mut cfg = tpm.vault_config();
        cfg.tcti = proxy.tcti();
        cfg.resource_manager = Some(rm);
        cfg.max_loaded_objects = 2;
        let vault = Vault::open(cfg).await.expect("open");
        let env = DaemonEnv::serve(tpm, vault, Arc::new(support::allow_self_access()), ServeLimits::default());
        let mut keys = env.keys().await;
        for name in ["a", "b"] {
            keys.create_key(pb::CreateKeyRequest {
                name: name.into(),
                algorithm: 0,
                pcr_binding: None,
                auth: vec![],
                ..Default::default()
            })
            .await
            .expect("create");
            keys.sign(sign_request(name)).await.expect("sign");
        }
        // "a" was evicted for "b" (one key kept): signing with it loads it, and that load fails.
        proxy.inject_close(CC_LOAD, 1);
        let signed = keys.sign(sign_request("a")).await;
        assert_eq!(proxy.injected(), 1, "{rm:?}: the load was not attempted");
        if recovers {
            signed.unwrap_or_else(|e| panic!("{rm:?}: the signature failed: {e}"));
        } else {
            let err = signed.expect_err("without kernel mode the fault is a lost TPM");
            assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
        }
        env.stop().await;
    }
}

/// Behind a resource manager the vault is one TPM user of several, and the kernel's does not
/// virtualise session handles: when it connects the vault flushes only transient objects,
/// never another process's session (here a policy session another client holds across the
/// vault's start). tpm2-abrmd refuses a flush of another client's session by itself, so this
/// passed through it before too; behind the kernel's (or the device model) the old flush of
/// every listed session handle ended such sessions.
#[tokio::test]
async fn connecting_leaves_other_clients_sessions_alone() {
    use std::str::FromStr;
    use tss_esapi::constants::SessionType;
    use tss_esapi::interface_types::algorithm::HashingAlgorithm;
    use tss_esapi::interface_types::session_handles::PolicySession;
    use tss_esapi::structures::SymmetricDefinition;
    let tpm = TpmEnv::start();
    let abrmd = Abrmd::start(&tpm, 3, 3);
    let tcti = tss_esapi::tcti_ldr::TctiNameConf::from_str(&abrmd.tcti()).expect("tcti");
    let mut other = tss_esapi::Context::new(tcti).expect("another client");
    let session = other
        .start_auth_session(None, None, None, SessionType::Policy, SymmetricDefinition::Null, HashingAlgorithm::Sha256)
        .expect("start session")
        .expect("session");
    let policy = PolicySession::try_from(session).expect("policy session");
    let mut cfg = tpm.vault_config();
    cfg.tcti = abrmd.tcti();
    cfg.resource_manager = Some(tpm_vault_daemon::daemon::ResourceManager::Kernel);
    let vault = Vault::open(cfg).await.expect("open");
    other.policy_get_digest(policy).expect("the other client's session survived the vault's start");
    vault.shutdown(std::time::Duration::from_secs(5)).await;
    drop(other);
    drop(abrmd);
}
