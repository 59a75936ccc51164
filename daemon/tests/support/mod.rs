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
