//! Owner checks are atomic with the writes they guard (issue #19): Seal with overwrite and
//! DeleteKey decide again under the store's write lock, with the policy in force and the owner
//! on disk then. The window between authorization and the write (a TPM seal, a policy reload
//! on SIGHUP, another client's write) is made deterministic here by doing its steps in order
//! through the library: authorize, let the other writer or the reload land, then write with the
//! check the RPC layer builds (`Access::allows` for the caller, as `rpc/call.rs` does).

mod support;

use std::path::Path;
use std::sync::Arc;

use support::{key, TpmEnv};
use tpm_vault_daemon::daemon::AuditLog;
use tpm_vault_daemon::daemon::OwnerCheck;
use tpm_vault_daemon::daemon::{Access, GroupsSource, Identity, Operation, Policy, UnixIdentity};
use tpm_vault_daemon::model::{KeyAlg, KeyName, Owner, PcrBank, PcrSelection};
use tpm_vault_daemon::Error;
use tpm_vault_daemon::SealTarget;
use zeroize::Zeroizing;

const ALICE: u32 = 1000;
const BOB: u32 = 1001;

fn unix(uid: u32) -> Identity {
    Identity::Unix(UnixIdentity {
        uid,
        gid: uid,
        pid: None,
        user: None,
        groups: vec![],
        groups_source: GroupsSource::Nss,
    })
}

/// The check the RPC layer hands the store for `who` doing `op` on `name`.
fn recheck(access: &Arc<Access>, who: Identity, op: Operation, name: &KeyName) -> OwnerCheck {
    let (access, name) = (access.clone(), name.clone());
    OwnerCheck::new(move |owner| access.allows(&who, op, &name, owner))
}

fn target() -> SealTarget {
    SealTarget::Pcr { selection: PcrSelection::default_in(PcrBank::Sha256), values: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seal_over_a_name_another_user_sealed_meanwhile_is_refused() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let mut policy = Policy::default();
    let text = "[[rule]]\nname = \"own\"\nclients = [\"any\"]\nkeys = [\"*\"]\n\
                operations = [\"seal\", \"unseal\"]\nowner_only = true\n";
    policy.add_file(Path::new("own.toml"), text).expect("policy");
    let access = Arc::new(Access::with_policy(policy, AuditLog::tracing_only()));
    let name = key("disk");
    // Alice asks to seal "disk" with overwrite: nobody owns it yet, so she may.
    let grant = access.authorize(Some(unix(ALICE)), Operation::Seal, Some(&name), None);
    assert!(grant.is_ok(), "{grant:?}");
    // Meanwhile Bob seals "disk" (his secret).
    vault.seal(name.clone(), Zeroizing::new(b"bob's".to_vec()), target(), BOB, false).await.expect("bob seals");
    // Alice's write repeats the decision under the lock and finds Bob's record: refused.
    let check = recheck(&access, unix(ALICE), Operation::Seal, &name);
    let r = vault.seal_checked(name.clone(), Zeroizing::new(b"alice's".to_vec()), target(), ALICE.into(), Some(check));
    match r.await {
        Err(Error::PermissionDenied(m)) => assert!(m.to_string().contains("disk"), "{m}"),
        other => panic!("alice overwrote bob's secret: {other:?}"),
    }
    assert_eq!(vault.unseal(&name, None).await.expect("unseal").as_slice(), b"bob's");
    // Bob's own overwrite passes the same check.
    let check = recheck(&access, unix(BOB), Operation::Seal, &name);
    let r = vault.seal_checked(name.clone(), Zeroizing::new(b"bob's 2".to_vec()), target(), BOB.into(), Some(check));
    r.await.expect("bob overwrites his own");
    assert_eq!(vault.unseal(&name, None).await.expect("unseal").as_slice(), b"bob's 2");
    vault.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_after_a_policy_reload_that_revoked_it_is_refused() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let dir = env.path().join("policies");
    std::fs::create_dir_all(&dir).expect("dir");
    let rule = |ops: &str| {
        format!("[[rule]]\nname = \"alice\"\nclients = [\"uid:{ALICE}\"]\nkeys = [\"*\"]\noperations = [{ops}]\n")
    };
    std::fs::write(dir.join("alice.toml"), rule("\"delete\", \"public\"")).expect("write");
    let access = Arc::new(Access::load(&dir, true, AuditLog::tracing_only()).expect("load"));
    let name = key("web");
    vault.create_key(name.clone(), KeyAlg::EccP256, Owner::Uid(0), None, None).await.expect("create");
    // Alice is allowed to delete "web"...
    assert!(access.authorize(Some(unix(ALICE)), Operation::Delete, Some(&name), Some(&Owner::Uid(0))).is_ok());
    // ...then the administrator takes the right away (SIGHUP) before her delete lands.
    std::fs::write(dir.join("alice.toml"), rule("\"public\"")).expect("write");
    access.reload().expect("reload");
    let check = recheck(&access, unix(ALICE), Operation::Delete, &name);
    match vault.delete_checked(&name, check).await {
        Err(Error::PermissionDenied(_)) => {}
        other => panic!("a revoked delete went through: {other:?}"),
    }
    vault.key(&name).await.expect("the key is still there");
    vault.shutdown(std::time::Duration::from_secs(5)).await;
}
