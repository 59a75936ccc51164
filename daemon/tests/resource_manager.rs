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
        keys.create_key(pb::CreateKeyRequest { name: name.clone(), algorithm: 0, pcr_binding: None, auth: vec![] })
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
    drop(abrmd);
    env.stop().await;
}
