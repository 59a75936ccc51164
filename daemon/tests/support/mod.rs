//! Test helpers: a per-test swtpm in a temp dir, a vault or a whole daemon on top of it.
#![allow(dead_code, missing_docs)]

pub mod abrmd;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::time::Duration;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use tempfile::TempDir;
use tpm_vault_daemon::harness::Swtpm;
use tpm_vault_daemon::model::KeyName;
use tpm_vault_daemon::QueueConfig;
use tpm_vault_daemon::{Vault, VaultConfig};

/// A temp dir with a running swtpm; both go away on drop. With [`TpmEnv::start_modeled`] the
/// vault reaches swtpm through the TPM device model (the kernel's resource manager and a
/// device profile, crate `tpm-vault-tpm-model`).
pub struct TpmEnv {
    pub swtpm: Swtpm,
    pub dir: TempDir,
    /// The device model and the vault's space in it (declared first: dropped before swtpm).
    pub model: Option<(tpm_vault_tpm_model::Endpoint, tpm_vault_tpm_model::Model)>,
}

impl TpmEnv {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let swtpm = Swtpm::start(&dir.path().join("swtpm")).expect("swtpm");
        Self { swtpm, dir, model: None }
    }

    /// swtpm behind the device model: `/dev/tpmrm0`'s resource manager and `profile`'s
    /// command times multiplied by `speed`.
    pub fn start_modeled(profile: tpm_vault_tpm_model::Profile, speed: f64) -> Self {
        let mut env = Self::start();
        let model = tpm_vault_tpm_model::ModelBuilder::new(env.swtpm.port())
            .with_profile(profile)
            .with_speed(speed)
            .build()
            .expect("device model");
        let endpoint = model.open().expect("model endpoint");
        env.model = Some((endpoint, model));
        env
    }

    /// The vault's TCTI: the model's endpoint when there is one, else swtpm.
    pub fn tcti(&self) -> String {
        match &self.model {
            Some((endpoint, _)) => endpoint.tcti(),
            None => self.swtpm.tcti(),
        }
    }

    /// The vault's space in the device model.
    pub fn space(&self) -> &tpm_vault_tpm_model::Endpoint {
        &self.model.as_ref().expect("a modeled TPM").0
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn vault_config(&self) -> VaultConfig {
        VaultConfig {
            queue: QueueConfig { capacity: 1024, timeout: Duration::from_secs(30) },
            simulator: true,
            // Through the model the vault is configured as on the device: `auto` takes
            // `device:/dev/tpmrm0` for the kernel's resource manager, and here the TCTI is the
            // model's swtpm endpoint.
            resource_manager: self.model.as_ref().map(|_| tpm_vault_daemon::daemon::ResourceManager::Kernel),
            ..VaultConfig::new(self.state_dir(), self.tcti())
        }
    }

    pub async fn vault(&self) -> Vault {
        Vault::open(self.vault_config()).await.expect("open vault")
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A credential for `secret` bound to the AK named `ak_name` and encrypted to the EK
/// (`ek_der`, DER SubjectPublicKeyInfo), made in software by `tpm2_makecredential --tcti none`
/// in `dir`: the marshalled TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET that
/// `Vault::activate_credential` takes.
pub fn make_credential(dir: &Path, ek_der: &[u8], ak_name: &[u8], secret: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let ek_pem =
        p256::pkcs8::der::pem::encode_string("PUBLIC KEY", p256::pkcs8::der::pem::LineEnding::LF, ek_der).expect("pem");
    std::fs::write(dir.join("ek.pem"), ek_pem).expect("write");
    std::fs::write(dir.join("secret.bin"), secret).expect("write");
    let out = std::process::Command::new("tpm2_makecredential")
        .close_inherited_fds()
        .args(["--tcti", "none", "-G", "rsa", "-u"])
        .arg(dir.join("ek.pem"))
        .arg("-s")
        .arg(dir.join("secret.bin"))
        .args(["-n", &hex::encode(ak_name), "-o"])
        .arg(dir.join("cred.out"))
        .output()
        .expect("tpm2_makecredential");
    assert!(out.status.success(), "makecredential: {}", String::from_utf8_lossy(&out.stderr));
    let cred = std::fs::read(dir.join("cred.out")).expect("cred");
    // tpm2-tools credential file: magic 0xBADCC0DE, version 1, TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET.
    assert_eq!(&cred[..4], &[0xBA, 0xDC, 0xC0, 0xDE]);
    let blob_len = usize::from(u16::from_be_bytes([cred[8], cred[9]]));
    (cred[8..10 + blob_len].to_vec(), cred[10 + blob_len..].to_vec())
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
        Self::start_with(TpmEnv::start(), std::sync::Arc::new(allow_self_access())).await
    }

    /// A daemon over `tpm` with the given access policy.
    pub async fn start_with(tpm: TpmEnv, access: std::sync::Arc<tpm_vault_daemon::daemon::Access>) -> Self {
        Self::start_limited(tpm, access, tpm_vault_daemon::daemon::ServeLimits::default()).await
    }

    /// A daemon over `tpm` with the given access policy and connection bounds.
    pub async fn start_limited(
        tpm: TpmEnv,
        access: std::sync::Arc<tpm_vault_daemon::daemon::Access>,
        limits: tpm_vault_daemon::daemon::ServeLimits,
    ) -> Self {
        let vault = tpm.vault().await;
        Self::serve(tpm, vault, access, limits)
    }

    /// A daemon serving `vault` (opened over `tpm`) with the given access policy and bounds.
    pub fn serve(
        tpm: TpmEnv,
        vault: Vault,
        access: std::sync::Arc<tpm_vault_daemon::daemon::Access>,
        limits: tpm_vault_daemon::daemon::ServeLimits,
    ) -> Self {
        let socket = tpm.path().join("vault.sock");
        let listener = tpm_vault_daemon::daemon::bind_unix(&socket).expect("bind");
        let listener = tokio::net::UnixListener::from_std(listener).expect("listener");
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let v = vault.clone();
        let task = tokio::spawn(async move {
            tpm_vault_daemon::daemon::serve_with_limits(
                v,
                access,
                listener,
                async {
                    let _ = rx.await;
                },
                Duration::from_secs(5),
                &limits,
            )
            .await
            .expect("serve");
        });
        Self { tpm, socket, vault, stop: Some(stop), task: Some(task) }
    }

    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("unix://{}", self.socket.display()))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn keys(&self) -> tpm_vault_proto::v1::key_service_client::KeyServiceClient<tonic::transport::Channel> {
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

// ---- The real `tpm-vaultd` binary as a child process (lifecycle and systemd tests). ----

/// Lets every client do everything (the lifecycle tests are not about access control).
pub const ALLOW_ALL_POLICY: &str =
    "[[rule]]\nname = \"tests\"\nclients = [\"any\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n";

/// Everything a `tpm-vaultd` child process needs, in one temp dir over its own swtpm: config
/// file, state dir, socket, policy dir, a `NOTIFY_SOCKET` to watch `READY=1` / `STOPPING=1` /
/// `WATCHDOG=1`, and a file collecting its stderr.
pub struct ProcEnv {
    pub tpm: TpmEnv,
    pub socket: PathBuf,
    pub notify: std::os::unix::net::UnixDatagram,
    pub notify_path: PathBuf,
    /// Every notify line received so far, in order.
    pub notes: Vec<String>,
}

impl ProcEnv {
    pub fn new() -> Self {
        let tpm = TpmEnv::start();
        let socket = tpm.path().join("vault.sock");
        let notify_path = tpm.path().join("notify.sock");
        let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("notify socket");
        std::fs::create_dir_all(tpm.path().join("policies")).expect("policies dir");
        std::fs::write(tpm.path().join("policies/tests.toml"), ALLOW_ALL_POLICY).expect("policy");
        std::fs::write(tpm.path().join("policies/test.toml"), allow_self_policy()).expect("policy file");
        std::fs::write(tpm.path().join("config.toml"), "log_format = \"plain\"\n").expect("config");
        Self { tpm, socket, notify, notify_path, notes: Vec::new() }
    }

    pub fn stderr_path(&self) -> PathBuf {
        self.tpm.path().join("daemon.stderr")
    }

    /// The daemon's arguments: explicit config, TCTI, state dir, socket and policies.
    pub fn args(&self) -> Vec<String> {
        let p = |s: &str| self.tpm.path().join(s).display().to_string();
        vec![
            "--config".into(),
            p("config.toml"),
            "--tcti".into(),
            self.tpm.swtpm.tcti(),
            "--state-dir".into(),
            self.tpm.state_dir().display().to_string(),
            "--socket".into(),
            self.socket.display().to_string(),
            "--policies".into(),
            p("policies"),
        ]
    }

    /// `tpm-vaultd` with [`ProcEnv::args`], `NOTIFY_SOCKET` and stderr into a file.
    pub fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tpm-vaultd"));
        cmd.close_inherited_fds();
        cmd.args(self.args());
        self.child_env(&mut cmd);
        cmd
    }

    /// Environment and stdio for a daemon child (also used under systemd-socket-activate).
    pub fn child_env(&self, cmd: &mut std::process::Command) {
        let stderr = std::fs::File::create(self.stderr_path()).expect("stderr file");
        cmd.env("NOTIFY_SOCKET", &self.notify_path)
            .env("TSS2_LOG", "all+NONE")
            .env("RUST_LOG", "info")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("TPM_VAULT_CONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr);
    }

    /// The daemon's stderr so far (for assertion messages).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    /// Waits until a notify line equal to `line` arrives; returns false on timeout.
    pub fn wait_note(&mut self, line: &str, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut seen = self.notes.len();
        loop {
            if self.notes[seen..].iter().any(|l| l == line) {
                return true;
            }
            seen = self.notes.len();
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            self.read_notes(left.min(Duration::from_millis(100)));
        }
    }

    /// Reads notify datagrams for up to `timeout` (returns early after one arrives).
    pub fn read_notes(&mut self, timeout: Duration) {
        self.notify.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))).expect("timeout");
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.notify.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            self.notes.extend(text.lines().map(str::to_owned));
            self.notify.set_nonblocking(true).expect("nonblocking");
        }
        self.notify.set_nonblocking(false).expect("blocking");
    }

    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("unix://{}", self.socket.display()))
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect")
    }

    pub async fn keys(&self) -> tpm_vault_proto::v1::key_service_client::KeyServiceClient<tonic::transport::Channel> {
        tpm_vault_proto::v1::key_service_client::KeyServiceClient::new(self.channel().await)
    }

    /// Transient objects left in the swtpm, counted over a fresh ESAPI connection (swtpm serves
    /// one client at a time: call it after the daemon exited).
    pub fn transient_handles(&self) -> usize {
        use std::str::FromStr;
        use tss_esapi::constants::CapabilityType;
        use tss_esapi::structures::CapabilityData;
        let tcti = tss_esapi::tcti_ldr::TctiNameConf::from_str(&self.tpm.swtpm.tcti()).expect("tcti");
        let mut ctx = tss_esapi::Context::new(tcti).expect("ESAPI context on the swtpm");
        let (data, _more) =
            ctx.get_capability(CapabilityType::Handles, 0x8000_0000, 64).expect("GetCapability(handles)");
        match data {
            CapabilityData::Handles(list) => list.len(),
            other => panic!("unexpected capability data {other:?}"),
        }
    }
}

/// Sends `signal` to a child process.
pub fn send_signal(child: &std::process::Child, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, signal).expect("kill");
}

/// Waits for a child to exit, killing it after `timeout`.
pub fn wait_exit(child: &mut std::process::Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("process {} did not exit within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the child on drop (a failed assertion must not leave a daemon behind).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// uid 65534 (`nobody`), the other client of the tests that need two uids.
pub const NOBODY: u32 = 65534;

/// A request to sign a one-byte message with `name`.
pub fn sign_request(name: &str) -> tpm_vault_proto::v1::SignRequest {
    tpm_vault_proto::v1::SignRequest {
        name: name.into(),
        input: Some(tpm_vault_proto::v1::sign_request::Input::Message(vec![1])),
        hash: 0,
        scheme: 0,
        auth: vec![],
        purpose: 0,
    }
}

/// Runs the ignored test `helper` of the calling test binary as uid [`NOBODY`] (no
/// supplementary groups), with `env`'s socket in `TPM_VAULT_TEST_SOCKET` and made reachable
/// for it; returns its output.
pub async fn run_as_nobody(env: &DaemonEnv, helper: &str) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.tpm.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
    tokio::process::Command::new("setpriv")
        .close_inherited_fds()
        .args(["--reuid", &NOBODY.to_string(), "--regid", &NOBODY.to_string(), "--clear-groups"])
        .arg(std::env::current_exe().expect("exe"))
        .args(["--ignored", "--exact", helper, "--nocapture"])
        .env("TPM_VAULT_TEST_SOCKET", &env.socket)
        .output()
        .await
        .expect("setpriv")
}

/// A daemon where this process may do everything and uid [`NOBODY`] may sign with the keys
/// `glob` matches.
pub async fn daemon_where_nobody_signs(glob: &str) -> DaemonEnv {
    DaemonEnv::start_with(TpmEnv::start(), std::sync::Arc::new(nobody_signs_access(glob))).await
}

/// The access policy of [`daemon_where_nobody_signs`].
pub fn nobody_signs_access(glob: &str) -> tpm_vault_daemon::daemon::Access {
    let text = format!(
        "{}\n[[rule]]\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"{glob}\"]\noperations = [\"sign\"]\n",
        allow_self_policy()
    );
    let mut policy = tpm_vault_daemon::daemon::Policy::default();
    policy.add_file(Path::new("t.toml"), &text).expect("policy");
    let audit = tpm_vault_daemon::daemon::AuditLog::tracing_only();
    tpm_vault_daemon::daemon::Access::with_policy(policy, audit)
}

/// In a child [`run_as_nobody`] started: a channel to the parent's daemon.
pub async fn nobody_channel() -> tonic::transport::Channel {
    let socket = std::env::var("TPM_VAULT_TEST_SOCKET").expect("socket env");
    assert_eq!(nix::unistd::getuid().as_raw(), NOBODY);
    tonic::transport::Endpoint::from_shared(format!("unix://{socket}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

/// A policy file granting the test process's own uid every operation on every key (the
/// daemon denies by default).
pub fn allow_self_policy() -> String {
    format!(
        "[[rule]]\nname = \"test-self\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n",
        nix::unistd::getuid().as_raw()
    )
}

/// [`allow_self_policy`] as a loaded access policy.
pub fn allow_self_access() -> tpm_vault_daemon::daemon::Access {
    let mut policy = tpm_vault_daemon::daemon::Policy::default();
    policy.add_file(Path::new("test.toml"), &allow_self_policy()).expect("policy");
    tpm_vault_daemon::daemon::Access::with_policy(policy, tpm_vault_daemon::daemon::AuditLog::tracing_only())
}
