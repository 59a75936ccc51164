//! Test helpers: a per-test swtpm in a temp dir, a vault or a whole daemon on top of it.
#![allow(dead_code, missing_docs)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tpm_vault_daemon::model::KeyName;
use tpm_vault_daemon::simulator::Swtpm;
use tpm_vault_daemon::tpm::QueueConfig;
use tpm_vault_daemon::{Vault, VaultConfig};

/// A temp dir with a running swtpm; both go away on drop.
pub struct TpmEnv {
    pub swtpm: Swtpm,
    pub dir: TempDir,
}

impl TpmEnv {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let swtpm = Swtpm::start(&dir.path().join("swtpm")).expect("swtpm");
        Self { swtpm, dir }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn vault_config(&self) -> VaultConfig {
        VaultConfig {
            state_dir: self.state_dir(),
            tcti: self.swtpm.tcti(),
            max_loaded_objects: 3,
            queue: QueueConfig {
                capacity: 1024,
                timeout: Duration::from_secs(30),
            },
            simulator: true,
        }
    }

    pub async fn vault(&self) -> Vault {
        Vault::open(self.vault_config()).await.expect("open vault")
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A key name derived from the test's name and a suffix.
pub fn key(name: &str) -> KeyName {
    KeyName::try_from(name).expect("valid test key name")
}

/// A daemon serving on a temp Unix socket, in-process, over its own swtpm.
pub struct DaemonEnv {
    pub tpm: TpmEnv,
    pub socket: PathBuf,
    pub vault: Vault,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl DaemonEnv {
    pub async fn start() -> Self {
        let tpm = TpmEnv::start();
        let vault = tpm.vault().await;
        let socket = tpm.path().join("vault.sock");
        let listener = tpm_vault_daemon::server::bind_unix(&socket).expect("bind");
        let listener = tokio::net::UnixListener::from_std(listener).expect("listener");
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let v = vault.clone();
        let task = tokio::spawn(async move {
            tpm_vault_daemon::server::serve(
                v,
                listener,
                async {
                    let _ = rx.await;
                },
                Duration::from_secs(5),
            )
            .await
            .expect("serve");
        });
        Self {
            tpm,
            socket,
            vault,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("unix://{}", self.socket.display()))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn keys(
        &self,
    ) -> tpm_vault_proto::v1::key_service_client::KeyServiceClient<tonic::transport::Channel> {
        tpm_vault_proto::v1::key_service_client::KeyServiceClient::new(self.channel().await)
    }

    /// Stops serving and re-raises a panic of the server task.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            if let Err(e) = t.await {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
        self.vault.shutdown(Duration::from_secs(5)).await;
    }
}
