//! Test helpers: the real daemon (the `tpm-vault-daemon` library, in-process) over a per-test
//! swtpm, served on a temp Unix socket from its own thread and runtime, so that tests can run
//! the `tpm-vault` binary with blocking calls or use the async client, alike.
#![allow(dead_code, missing_docs)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use tempfile::TempDir;
use tokio::sync::oneshot;
use tpm_vault_client::Client;
use tpm_vault_daemon::daemon::Ctx;
use tpm_vault_daemon::daemon::Metrics;
use tpm_vault_daemon::daemon::{Access, AuditLog, Policy};
use tpm_vault_daemon::harness::Swtpm;
use tpm_vault_daemon::QueueConfig;
use tpm_vault_daemon::{Vault, VaultConfig};

/// The file (in the daemon's temp dir) the daemon serves as the device's event log; absent
/// until a test writes it.
pub const EVENT_LOG: &str = "binary_bios_measurements";

/// A daemon serving the test's own uid on `socket`, over its own swtpm; stopped on drop.
pub struct Daemon {
    /// Socket, state dir and swtpm state live here.
    pub dir: TempDir,
    /// The daemon's Unix socket.
    pub socket: PathBuf,
    /// Tells the server to stop.
    stop: Option<oneshot::Sender<()>>,
    /// The thread running the server's runtime.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Dropped after the daemon has stopped.
    swtpm: Option<Swtpm>,
    /// The TPM device model between the daemon and swtpm, when started through it.
    model: Option<(tpm_vault_tpm_model::Endpoint, tpm_vault_tpm_model::Model)>,
    /// The daemon's vault and runtime, for what only the TPM's owner can do (extend a PCR).
    vault: Option<(Vault, tokio::runtime::Handle)>,
}

impl Daemon {
    /// A daemon whose policy grants the test's uid everything.
    pub fn start() -> Daemon {
        Daemon::start_with_policy(&format!(
            "[[rule]]\nname = \"test-self\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n",
            nix::unistd::getuid().as_raw()
        ))
    }

    /// A daemon with the access policy `rules` (TOML, as in `policies/`).
    pub fn start_with_policy(rules: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        Daemon::start_in(dir, rules, "swtpm", "state")
    }

    /// A daemon over a copy of `fixture` (a state directory whose private swtpm's state is in
    /// its `swtpm/`, as `tpm-vaultd --simulator` leaves it), so a fixture made by an earlier
    /// release is opened by this code without being changed.
    pub fn start_on_copy_of(fixture: &Path, rules: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_dir(fixture, &dir.path().join("state"));
        Daemon::start_in(dir, rules, "state/swtpm", "state")
    }

    /// A daemon granting the test's uid everything over the swtpm state already in
    /// `dir/swtpm` (e.g. made by `swtpm_setup`, with an EK certificate).
    pub fn start_in_dir(dir: TempDir) -> Daemon {
        let rules = format!(
            "[[rule]]\nname = \"test-self\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n",
            nix::unistd::getuid().as_raw()
        );
        Daemon::start_in(dir, &rules, "swtpm", "state")
    }

    /// A daemon with the access policy `rules` (TOML) over the swtpm state already in
    /// `dir/swtpm`.
    pub fn start_in_dir_with_policy(dir: TempDir, rules: &str) -> Daemon {
        Daemon::start_in(dir, rules, "swtpm", "state")
    }

    /// A daemon in `dir` with the access policy `rules`, its swtpm's state in `dir/swtpm_dir`
    /// and its own in `dir/state_dir`.
    fn start_in(dir: TempDir, rules: &str, swtpm_dir: &str, state_dir: &str) -> Daemon {
        Daemon::start_in_with_access(dir, policy(rules), swtpm_dir, state_dir)
    }

    /// A daemon whose policy grants the test's uid everything, reaching swtpm through the TPM
    /// device model: the kernel's `/dev/tpmrm0` resource manager and the Jetson Orin fTPM's
    /// command times multiplied by `speed`.
    pub fn start_modeled(speed: f64) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let rules = format!(
            "[[rule]]\nname = \"test-self\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n",
            nix::unistd::getuid().as_raw()
        );
        Daemon::start_in_on(dir, policy(&rules), "swtpm", "state", Some(speed))
    }

    /// The daemon's space in the device model (daemons from [`Daemon::start_modeled`]).
    pub fn space(&self) -> &tpm_vault_tpm_model::Endpoint {
        &self.model.as_ref().expect("a modeled TPM").0
    }

    /// A daemon in `dir` with the access policy and audit log `access`.
    fn start_in_with_access(dir: TempDir, access: Access, swtpm_dir: &str, state_dir: &str) -> Daemon {
        Daemon::start_in_on(dir, access, swtpm_dir, state_dir, None)
    }

    /// A daemon in `dir` with `access`, on swtpm directly or, with `model_speed`, through the
    /// device model.
    fn start_in_on(dir: TempDir, access: Access, swtpm_dir: &str, state_dir: &str, model_speed: Option<f64>) -> Daemon {
        let swtpm = Swtpm::start(&dir.path().join(swtpm_dir)).expect("start swtpm");
        let model = model_speed.map(|speed| {
            let model = tpm_vault_tpm_model::ModelBuilder::new(swtpm.port())
                .with_profile(tpm_vault_tpm_model::Profile::orin_ftpm())
                .with_speed(speed)
                .build()
                .expect("device model");
            (model.open().expect("model endpoint"), model)
        });
        let tcti = model.as_ref().map_or_else(|| swtpm.tcti(), |(endpoint, _)| endpoint.tcti());
        let config = VaultConfig {
            queue: QueueConfig { capacity: 1024, timeout: Duration::from_secs(30) },
            simulator: true,
            // Through the model, configured as on the device (the kernel's resource manager).
            resource_manager: model.as_ref().map(|_| tpm_vault_daemon::daemon::ResourceManager::Kernel),
            ..VaultConfig::new(dir.path().join(state_dir), tcti)
        };
        let socket = dir.path().join("vault.sock");
        let event_log = dir.path().join(EVENT_LOG);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<(Vault, tokio::runtime::Handle)>();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let path = socket.clone();
        let thread = std::thread::Builder::new()
            .name("daemon".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("daemon runtime");
                runtime.block_on(async move {
                    let vault = Vault::open(config).await.expect("open vault");
                    let listener = tpm_vault_daemon::daemon::bind_unix(&path).expect("bind");
                    let listener = tokio::net::UnixListener::from_std(listener).expect("listener");
                    let _ = ready_tx.send((vault.clone(), tokio::runtime::Handle::current()));
                    let shutdown = async {
                        let _ = stop_rx.await;
                    };
                    let ctx = Ctx::new(vault.clone(), Arc::new(Metrics::default()), Arc::new(access))
                        .with_event_log(Some(&event_log));
                    tpm_vault_daemon::daemon::serve_ctx(ctx, listener, shutdown, Duration::from_secs(5))
                        .await
                        .expect("serve");
                    vault.shutdown(Duration::from_secs(5)).await;
                });
            })
            .expect("daemon thread");
        let mut daemon =
            Daemon { dir, socket, stop: Some(stop), thread: Some(thread), swtpm: Some(swtpm), model, vault: None };
        match ready_rx.recv_timeout(Duration::from_secs(120)) {
            Ok(vault) => daemon.vault = Some(vault),
            Err(_) => {
                // The thread died (its panic is re-raised) or hangs.
                daemon.join();
                panic!("the daemon did not start");
            }
        }
        daemon
    }

    /// A daemon with the access policy `rules` whose audit log is also written, as JSON lines,
    /// to `dir/audit.jsonl` (see [`Daemon::audit_log`]).
    pub fn start_with_policy_and_audit(rules: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut policy = Policy::default();
        policy.add_file(Path::new("test.toml"), rules).expect("policy");
        let audit = AuditLog::with_file(&dir.path().join("audit.jsonl")).expect("audit file");
        Daemon::start_in_with_access(dir, Access::with_policy(policy, audit), "swtpm", "state")
    }

    /// The audit records written so far by a daemon from [`Daemon::start_with_policy_and_audit`].
    pub fn audit_log(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Kills the swtpm (like a TPM that went away); the daemon keeps running.
    pub fn kill_tpm(&mut self) {
        if let Some(swtpm) = &mut self.swtpm {
            swtpm.kill();
        }
    }

    /// A connected async client (call from a runtime of the test's own).
    pub async fn client(&self) -> Client {
        Client::connect(&self.socket).await.expect("connect")
    }

    /// `tpm-vault --socket SOCKET ARGS...` with empty stdin.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_in(args, b"")
    }

    /// `tpm-vault --socket SOCKET ARGS...` with `stdin` as its standard input.
    pub fn cli_in(&self, args: &[&str], stdin: &[u8]) -> Output {
        run_cli(&self.socket, args, stdin, self.dir.path())
    }

    /// Drops every unsealed data key from the daemon's memory, as the idle timer does.
    pub fn evict_data_keys(&self) -> usize {
        let (vault, _) = self.vault.as_ref().expect("daemon running");
        vault.evict_data_keys()
    }

    /// Extends sha256 PCR `pcr` with SHA-256(`measurement`), as a boot loader measures a kernel.
    pub fn extend_pcr(&self, pcr: u8, measurement: &[u8]) {
        use sha2::Digest as _;
        let (vault, handle) = self.vault.as_ref().expect("daemon running");
        let digest = sha2::Sha256::digest(measurement).to_vec();
        handle.block_on(vault.pcr_extend(tpm_vault_daemon::model::PcrBank::Sha256, pcr, digest)).expect("PCR extend");
    }

    /// Extends PCR `pcr` of `bank` with `digest` as given (one bank: the others are untouched).
    pub fn extend_pcr_digest(&self, bank: tpm_vault_daemon::model::PcrBank, pcr: u8, digest: &[u8]) {
        let (vault, handle) = self.vault.as_ref().expect("daemon running");
        handle.block_on(vault.pcr_extend(bank, pcr, digest.to_vec())).expect("PCR extend");
    }

    /// Power-cycles the TPM (swtpm restarted with TPM2_Startup(CLEAR): PCRs back to zero,
    /// persistent state kept), like a reboot, and waits until the daemon uses it again.
    pub fn reboot_tpm(&mut self) {
        self.swtpm.as_mut().expect("swtpm").restart().expect("restart swtpm");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if self.cli(&["pcr", "read", "--pcrs", "sha256:0"]).status.success() {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the daemon did not recover after the TPM restart");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the server and re-raises a panic of its thread.
    pub fn join(&mut self) {
        self.vault.take();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if let Err(panic) = thread.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
        self.model.take();
        self.swtpm.take();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.join();
    }
}

/// Copies the directory tree `from` to `to` (regular files and directories only).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Runs the `tpm-vault` binary against `socket` in `cwd`, feeding `stdin` from a thread (so
/// large inputs cannot deadlock against a full stdout pipe).
pub fn run_cli(socket: &Path, args: &[&str], stdin: &[u8], cwd: &Path) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tpm-vault"))
        .close_inherited_fds()
        .arg("--socket")
        .arg(socket)
        .args(args)
        .current_dir(cwd)
        .env_remove("TPM_VAULT_SOCKET")
        .env_remove("TPM_VAULT_KEY_AUTH")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tpm-vault");
    let mut pipe = child.stdin.take().expect("stdin");
    let input = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        // The command may exit without reading everything (an error): a broken pipe is fine.
        let _ = pipe.write_all(&input);
    });
    let output = child.wait_with_output().expect("wait for tpm-vault");
    feeder.join().expect("stdin feeder");
    output
}

/// Asserts success and returns stdout.
#[track_caller]
pub fn ok(output: Output) -> Vec<u8> {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Asserts failure with `code` and returns the single stderr line.
#[track_caller]
pub fn fails(output: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr:?}");
    stderr.trim_end().to_owned()
}

/// The access policy `rules`.
fn policy(rules: &str) -> Access {
    let mut policy = Policy::default();
    policy.add_file(Path::new("test.toml"), rules).expect("policy");
    Access::with_policy(policy, AuditLog::tracing_only())
}

/// Deterministic test data of `len` bytes (not all zero, not periodic at chunk size).
pub fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) % 253) as u8).collect()
}

/// The example server as a child process; killed on drop.
pub struct ExampleServer {
    pub child: Child,
    pub addr: SocketAddr,
}

impl ExampleServer {
    pub fn start(daemon: &Daemon, key: &str, current_thread: bool) -> ExampleServer {
        let mut cmd = Command::new(example_binary());
        cmd.close_inherited_fds();
        cmd.args(["--key", key, "--listen", "127.0.0.1:0", "--refresh-secs", "1", "--socket"])
            .arg(&daemon.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if current_thread {
            cmd.arg("--current-thread");
        }
        let mut child = cmd.spawn().expect("spawn tls_server");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read address");
        let Some(addr) = line.trim().strip_prefix("listening on https://") else {
            let _ = child.kill();
            let out = child.wait_with_output().map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
            panic!("tls_server did not start: {line:?} {out:?}")
        };
        let addr = addr.parse().expect("address");
        ExampleServer { child, addr }
    }

    /// Fails the test if the server died (a panic, for instance).
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            let mut stderr = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            panic!("tls_server exited with {status}: {stderr}");
        }
    }
}

impl Drop for ExampleServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `target/<profile>/examples/tls_server`, built if `cargo test` was asked for this test only.
pub fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = profile_dir.join("examples").join("tls_server");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .close_inherited_fds()
            .args(["build", "-p", "tpm-vault-client", "--example", "tls_server"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build --example tls_server");
        assert!(status.success());
    }
    path
}

/// A free TCP port on loopback (bound and released: another process may take it first).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Runs a tool (openssl, curl...) with empty stdin and returns its output.
pub fn run_tool(cmd: &mut Command) -> Output {
    cmd.close_inherited_fds().stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Asserts success (showing both streams otherwise) and returns stdout as text.
#[track_caller]
pub fn ok_text(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
