//! A full or read-only state directory (a small tmpfs, then remounted read-only): operations
//! that must write fail with a clear error, and nothing already stored is damaged. Needs root
//! (mount), as the CI runs.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use support::{DaemonEnv, TpmEnv};
use tonic::Code;
use tpm_vault_proto::v1 as pb;

/// A tmpfs mounted for the test, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        let out = Command::new("mount")
            .close_inherited_fds()
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(at)
            .output()
            .expect("mount");
        assert!(out.status.success(), "mounting a tmpfs needs root: {}", String::from_utf8_lossy(&out.stderr));
        Self(at.to_owned())
    }

    fn remount_read_only(&self) {
        let out = Command::new("mount")
            .close_inherited_fds()
            .args(["-o", "remount,ro"])
            .arg(&self.0)
            .output()
            .expect("remount");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").close_inherited_fds().arg("-l").arg(&self.0).status();
    }
}

fn create(name: &str) -> pb::CreateKeyRequest {
    pb::CreateKeyRequest { name: name.into(), algorithm: 0, pcr_binding: None, auth: vec![], usages: vec![] }
}

fn sign(name: &str) -> pb::SignRequest {
    pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Message(vec![7])),
        hash: 0,
        scheme: 0,
        auth: vec![],
        purpose: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_then_read_only_state_dir_fails_clearly_and_damages_nothing() {
    let tpm = TpmEnv::start();
    let fs = Tmpfs::mount(&tpm.state_dir(), "96k");
    let env = DaemonEnv::start_with(tpm, Arc::new(support::allow_self_access())).await;
    let mut keys = env.keys().await;
    // Fill the disk with keys until a create fails.
    let mut created = Vec::new();
    let full = loop {
        let name = format!("k{:04}", created.len());
        match keys.create_key(create(&name)).await {
            Ok(_) => created.push(name),
            Err(e) => break e,
        }
        assert!(created.len() < 1000, "tmpfs never filled up");
    };
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    assert!(full.message().contains("disk full or read-only"), "{}", full.message());
    assert!(!created.is_empty());
    // Nothing stored is damaged, and no temp files are left behind.
    for name in &created {
        keys.sign(sign(name)).await.unwrap_or_else(|e| panic!("{name} after disk full: {e}"));
    }
    let leftovers: Vec<_> = std::fs::read_dir(env.tpm.state_dir().join("keys"))
        .expect("keys dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
    // Read-only: writes fail clearly, reads and signatures still work, nothing is lost.
    fs.remount_read_only();
    let e = keys.create_key(create("after-ro")).await.expect_err("read-only");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    let e = keys.delete_key(pb::DeleteKeyRequest { name: created[0].clone() }).await.expect_err("read-only delete");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    let list = keys.list_keys(pb::ListKeysRequest::default()).await.expect("list").into_inner();
    assert_eq!(list.keys.len(), created.len(), "every stored key still listed");
    keys.sign(sign(&created[0])).await.expect("sign on a read-only state dir");
    env.stop().await;
    drop(fs);
}
