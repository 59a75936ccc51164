//! Helpers for the PKCS#11 module's integration tests: the built artifacts (module `.so`,
//! `tpm-vaultd`, `tpm-vault`), a `tpm-vaultd` child process over its own swtpm in a temp dir,
//! external programs killed by PID on drop, commands run with a timeout, free loopback ports,
//! and the OpenSSL config that loads libp11's engine with this module.
//!
//! Every wait is bounded ([`TIMEOUT`]): a hang fails the test instead of blocking CI.
#![allow(dead_code, missing_docs)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tpm_vault_daemon::harness::CloseInheritedFds as _;
use tpm_vault_daemon::harness::Swtpm;

/// Upper bound for every wait (process exit, socket up, port open).
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// libp11's OpenSSL 3 engine (Debian `libengine-pkcs11-openssl`).
pub const ENGINE_PATH: &str = "/usr/lib/x86_64-linux-gnu/engines-3/pkcs11.so";

/// Token label the tests give the module (`TPM_VAULT_PKCS11_TOKEN_LABEL`).
pub const TOKEN_LABEL: &str = "tpm-vault-test";

/// Policy letting uid 0 and this process's uid do everything.
pub fn allow_all_policy() -> String {
    format!(
        "[[rule]]\nname = \"t\"\nclients = [\"uid:0\", \"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n",
        nix::unistd::getuid().as_raw()
    )
}

// ---- Build artifacts ----

/// `target/debug` (the test executable lives in `target/debug/deps`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(Path::parent).expect("target/debug above the test executable").to_owned()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned()
}

/// Builds the daemon and the CLI when they are missing or older than this test executable
/// (which cargo rebuilds whenever the daemon library changes, so an older binary may speak an
/// older protocol), and the module when it is missing; once per test process.
fn ensure_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = target_dir();
        let exe_time = std::fs::metadata(std::env::current_exe().expect("current_exe"))
            .and_then(|m| m.modified())
            .expect("test executable mtime");
        let stale =
            |name: &str| std::fs::metadata(dir.join(name)).and_then(|m| m.modified()).map_or(true, |t| t < exe_time);
        let build = |args: &[&str]| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .arg("build")
                .args(args)
                .current_dir(workspace_root())
                .status()
                .expect("run cargo build");
            assert!(status.success(), "cargo build {args:?} failed: {status}");
        };
        if stale("tpm-vaultd") || stale("tpm-vault") {
            build(&["-p", "tpm-vault-daemon", "-p", "tpm-vault-cli", "--bins"]);
        }
        if !dir.join("deps/libtpm_vault_pkcs11.so").exists() && !dir.join("libtpm_vault_pkcs11.so").exists() {
            build(&["-p", "tpm-vault-pkcs11"]);
        }
    });
}

/// Absolute path of the PKCS#11 module. Building this crate's tests writes the cdylib to
/// `target/debug/deps/` (only `cargo build` copies it up to `target/debug/`), so the copy in
/// `deps/`, built with the test executable, is preferred.
pub fn module() -> PathBuf {
    ensure_built();
    let fresh = target_dir().join("deps/libtpm_vault_pkcs11.so");
    if fresh.exists() {
        fresh
    } else {
        target_dir().join("libtpm_vault_pkcs11.so")
    }
}

/// Absolute path of a binary in `target/debug`.
pub fn bin(name: &str) -> PathBuf {
    ensure_built();
    target_dir().join(name)
}

// ---- Processes ----

/// Removes every `TPM_VAULT_*` variable of the test's environment from `cmd`.
pub fn clean_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TPM_VAULT_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs `cmd` to completion (stdin from `input` or /dev/null), killing it after [`TIMEOUT`].
pub fn run_input(cmd: &mut Command, input: Option<&[u8]>) -> Output {
    cmd.close_inherited_fds();
    cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    if let Some(data) = input {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let reader = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("stdout")));
    let err = reader(Box::new(child.stderr.take().expect("stderr")));
    let status = wait_timeout(&mut child, TIMEOUT).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{cmd:?} did not finish within {TIMEOUT:?}");
    });
    Output { status, stdout: out.join().expect("stdout reader"), stderr: err.join().expect("stderr reader") }
}

/// [`run_input`] without input.
pub fn run(cmd: &mut Command) -> Output {
    run_input(cmd, None)
}

/// Runs `cmd` and asserts exit status 0; returns its output.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?} failed: {}", describe(&out));
    out
}

/// Status, stdout and stderr of an output, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Stdout as a string.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits for `child` to exit for up to `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A long-running child (server, agent): SIGTERM, then SIGKILL after 5 s, on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    /// Starts `cmd` (stdin /dev/null; stdout and stderr appended to `log`).
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Self {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
        cmd.close_inherited_fds().stdin(Stdio::null()).stdout(file.try_clone().expect("dup log")).stderr(file);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Self { child, name: name.to_owned() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics (with `log`'s text) if the process has exited.
    pub fn assert_running(&mut self, log: &Path) {
        if let Some(s) = self.child.try_wait().expect("try_wait") {
            panic!("{} exited ({s}):\n{}", self.name, std::fs::read_to_string(log).unwrap_or_default());
        }
    }

    /// SIGTERM, then SIGKILL if it is still there after 5 s; waits for it. Its direct
    /// children (nginx workers, sshd sessions, ssh-agent's PKCS#11 helper) that outlive it are
    /// then SIGKILLed by PID (each checked to still be the same program).
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let children = children_of(self.child.id());
            let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            if wait_timeout(&mut self.child, Duration::from_secs(5)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
            for (child, comm) in children {
                if std::fs::read_to_string(format!("/proc/{child}/comm")).is_ok_and(|c| c == comm) {
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
    }

    /// SIGKILL (a crash) and wait.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The direct children of `pid` with their `comm` names, from /proc.
fn children_of(pid: u32) -> Vec<(i32, String)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| list.split_whitespace().filter_map(|c| c.parse::<i32>().ok()).collect::<Vec<_>>())
        .filter_map(|c| Some((c, std::fs::read_to_string(format!("/proc/{c}/comm")).ok()?)))
        .collect()
}

/// A free TCP port on 127.0.0.1 (bound once, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0").local_addr().expect("addr").port()
}

/// Waits until `check` is true, for up to [`TIMEOUT`]; panics with `what` otherwise.
pub fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out after {TIMEOUT:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a loopback server on a free port: `command(port)` builds it (output appended to
/// `log`), and this waits until the port accepts connections. The port is free when picked but
/// another test's client may take it before the server binds: if the server exits and its
/// `log` or one of `other_logs` says "in use", this tries again with a new port (5 tries).
pub fn serve_on_free_port(
    name: &str,
    log: &Path,
    other_logs: &[&Path],
    mut command: impl FnMut(u16) -> Command,
) -> (Proc, u16) {
    let logs = || {
        std::iter::once(log)
            .chain(other_logs.iter().copied())
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    };
    for attempt in 1.. {
        let port = free_port();
        let mut proc = Proc::spawn(name, &mut command(port), log);
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = proc.child.try_wait().expect("try_wait") {
                let text = logs();
                assert!(attempt < 5 && text.contains("in use"), "{name} exited ({status}):\n{text}");
                break;
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return (proc, port);
            }
            assert!(Instant::now() < deadline, "{name} not listening on port {port} after {TIMEOUT:?}:\n{}", logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    unreachable!()
}

// ---- The daemon ----

/// A `tpm-vaultd` child over its own swtpm, everything in one temp dir. Paths: `state/`,
/// `vault.sock`, `policies/`, `config.toml`, `daemon.stderr`, `audit.log`.
pub struct Daemon {
    pub proc: Option<Proc>,
    /// The TPM device model between the daemon and swtpm, when started through it.
    pub model: Option<(tpm_vault_tpm_model::Endpoint, tpm_vault_tpm_model::Model)>,
    pub swtpm: Swtpm,
    pub socket: PathBuf,
    /// Passed with `--audit-log` when set.
    pub audit_log: Option<PathBuf>,
    pub dir: TempDir,
}

impl Daemon {
    /// Starts a daemon allowing root and this process everything.
    pub fn start() -> Self {
        Self::start_with(&allow_all_policy(), false)
    }

    /// Starts a daemon with `policy` as its only policy file (and an audit log file if `audit`).
    pub fn start_with(policy: &str, audit: bool) -> Self {
        Self::start_on(policy, audit, None)
    }

    /// [`Daemon::start_with`], reaching swtpm through the TPM device model: the kernel's
    /// `/dev/tpmrm0` resource manager and the Jetson Orin fTPM's command times multiplied by
    /// `speed`.
    pub fn start_modeled_with(policy: &str, audit: bool, speed: f64) -> Self {
        Self::start_on(policy, audit, Some(speed))
    }

    fn start_on(policy: &str, audit: bool, model_speed: Option<f64>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let swtpm = Swtpm::start(&dir.path().join("swtpm")).expect("swtpm");
        std::fs::create_dir_all(dir.path().join("policies")).expect("policies dir");
        std::fs::write(dir.path().join("policies/test.toml"), policy).expect("policy file");
        // Through the model the daemon is configured as on the device (the kernel's resource
        // manager).
        let config = match model_speed {
            Some(_) => "log_format = \"plain\"\nresource_manager = \"kernel\"\n",
            None => "log_format = \"plain\"\n",
        };
        std::fs::write(dir.path().join("config.toml"), config).expect("config");
        let audit_log = audit.then(|| dir.path().join("audit.log"));
        let socket = dir.path().join("vault.sock");
        let model = model_speed.map(|speed| {
            let model = tpm_vault_tpm_model::ModelBuilder::new(swtpm.port())
                .with_profile(tpm_vault_tpm_model::Profile::orin_ftpm())
                .with_speed(speed)
                .build()
                .expect("device model");
            (model.open().expect("model endpoint"), model)
        });
        let mut d = Self { proc: None, model, swtpm, socket, audit_log, dir };
        d.spawn();
        d
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn stderr_path(&self) -> PathBuf {
        self.path().join("daemon.stderr")
    }

    /// The daemon's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let p = |s: &str| self.path().join(s);
        let mut cmd = Command::new(bin("tpm-vaultd"));
        clean_env(&mut cmd)
            .arg("--config")
            .arg(p("config.toml"))
            .arg("--tcti")
            .arg(self.model.as_ref().map_or_else(|| self.swtpm.tcti(), |(endpoint, _)| endpoint.tcti()))
            .arg("--state-dir")
            .arg(p("state"))
            .arg("--socket")
            .arg(&self.socket)
            .arg("--policies")
            .arg(p("policies"))
            .env("TSS2_LOG", "all+NONE")
            .env("RUST_LOG", "info")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID");
        if let Some(a) = &self.audit_log {
            cmd.arg("--audit-log").arg(a);
        }
        let mut proc = Proc::spawn("tpm-vaultd", &mut cmd, &self.stderr_path());
        let socket = self.socket.clone();
        let log = self.stderr_path();
        wait_until("the daemon's socket", || {
            proc.assert_running(&log);
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        self.proc = Some(proc);
    }

    /// Kills the daemon (SIGKILL, like a crash) and starts it again on the same swtpm and state.
    pub fn restart(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
        // The killed process's file of /dev/tpmrm0 closed with it.
        if let Some((endpoint, _)) = &self.model {
            endpoint.reopen();
        }
        self.spawn();
    }

    /// Stops the daemon (SIGTERM) and leaves it down.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop();
        }
    }

    /// `tpm-vault --socket S ARGS...`.
    pub fn cli(&self) -> Command {
        let mut cmd = Command::new(bin("tpm-vault"));
        clean_env(&mut cmd).arg("--socket").arg(&self.socket);
        cmd
    }

    /// Creates a key (`alg`: the CLI's `--alg`, e.g. `ecc-p256`).
    pub fn create_key(&self, name: &str, alg: &str) {
        run_ok(self.cli().args(["key", "create", name, "--alg", alg]));
    }

    /// Writes the key's SPKI PEM to `DIR/NAME.pub.pem` and returns that path.
    pub fn public_pem(&self, name: &str) -> PathBuf {
        let out = run_ok(self.cli().args(["key", "public", name]));
        let path = self.path().join(format!("{name}.pub.pem"));
        std::fs::write(&path, &out.stdout).expect("write public key");
        path
    }

    /// Self-signs a certificate for `CN=localhost`, stores it as the key's chain, writes it
    /// to `DIR/NAME.cert.pem` and returns that path.
    pub fn self_sign(&self, name: &str) -> PathBuf {
        let out =
            run_ok(self.cli().args(["cert", "self-sign", name, "--subject", "CN=localhost", "--san", "dns:localhost"]));
        let path = self.path().join(format!("{name}.cert.pem"));
        std::fs::write(&path, &out.stdout).expect("write certificate");
        path
    }

    /// Names from `tpm-vault key list`.
    pub fn key_names(&self) -> Vec<String> {
        let out = run_ok(self.cli().args(["key", "list"]));
        stdout(&out).lines().skip(1).filter_map(|l| l.split_whitespace().next().map(str::to_owned)).collect()
    }

    /// Sets the module's environment on `cmd`: this daemon's socket, the test token label,
    /// and an empty config file of the test's own (so `/etc/tpm-vault/pkcs11.toml` never
    /// leaks in; an explicit config path that does not exist is an error for the module).
    pub fn module_env<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        let config = self.path().join("pkcs11.toml");
        if !config.exists() {
            std::fs::write(&config, "").expect("write pkcs11.toml");
        }
        clean_env(cmd)
            .env("TPM_VAULT_SOCKET", &self.socket)
            .env("TPM_VAULT_PKCS11_TOKEN_LABEL", TOKEN_LABEL)
            .env("TPM_VAULT_PKCS11_CONFIG", config)
    }

    /// `pkcs11-tool --module M` with [`Daemon::module_env`].
    pub fn pkcs11_tool(&self) -> Command {
        let mut cmd = Command::new("pkcs11-tool");
        self.module_env(&mut cmd).arg("--module").arg(module());
        cmd
    }

    /// An OpenSSL config loading libp11's engine with this module; returns its path.
    pub fn openssl_conf(&self) -> PathBuf {
        let path = self.path().join("openssl.cnf");
        let text = format!(
            "openssl_conf = openssl_init\n\n[openssl_init]\nengines = engine_section\n\n\
             [engine_section]\npkcs11 = pkcs11_section\n\n[pkcs11_section]\nengine_id = pkcs11\n\
             dynamic_path = {ENGINE_PATH}\nMODULE_PATH = {}\ninit = 0\n",
            module().display()
        );
        std::fs::write(&path, text).expect("write openssl.cnf");
        path
    }

    /// `openssl ARGS` with [`Daemon::module_env`] and `OPENSSL_CONF` = [`Daemon::openssl_conf`].
    pub fn openssl(&self) -> Command {
        let conf = self.openssl_conf();
        let mut cmd = Command::new("openssl");
        self.module_env(&mut cmd).env("OPENSSL_CONF", conf);
        cmd
    }
}

/// The uid the tests use as an unprivileged client (`nobody`).
pub const NOBODY: u32 = 65534;

impl Daemon {
    /// Lets uid [`NOBODY`] reach the daemon and the module: the temp dir becomes 0755, the
    /// socket 0666 (the daemon makes it 0660), and the module is copied into the temp dir
    /// (the build tree may not be reachable by nobody). Returns the copy's path. Call it again
    /// after [`Daemon::restart`] (the new socket is 0660 again).
    pub fn open_to_nobody(&self) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(self.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
        std::fs::set_permissions(&self.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
        let copy = self.path().join("libtpm_vault_pkcs11.so");
        std::fs::copy(module(), &copy).expect("copy the module");
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod module");
        copy
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---- Keys and signatures ----

/// The DER SubjectPublicKeyInfo of a PEM public key, certificate or request, through openssl.
pub fn spki_der_of(path: &Path, kind: &str) -> Vec<u8> {
    let out = match kind {
        "pub" => run_ok(Command::new("openssl").args(["pkey", "-pubin", "-outform", "DER", "-in"]).arg(path)),
        "cert" => {
            let pem = run_ok(Command::new("openssl").args(["x509", "-noout", "-pubkey", "-in"]).arg(path));
            run_input(Command::new("openssl").args(["pkey", "-pubin", "-outform", "DER"]), Some(&pem.stdout))
        }
        other => panic!("unknown kind {other}"),
    };
    assert!(out.status.success(), "openssl pkey: {}", describe(&out));
    out.stdout
}

/// `openssl dgst -sha256|-sha384 -verify PUB -signature SIG DATA` (extra `-sigopt`s for PSS).
pub fn openssl_verify(digest: &str, public: &Path, sig: &Path, data: &Path, sigopts: &[&str]) {
    let mut cmd = Command::new("openssl");
    cmd.args(["dgst", &format!("-{digest}"), "-verify"]).arg(public).arg("-signature").arg(sig);
    for o in sigopts {
        cmd.args(["-sigopt", o]);
    }
    cmd.arg(data);
    let out = run(&mut cmd);
    assert!(
        out.status.success() && stdout(&out).contains("Verified OK"),
        "signature did not verify ({cmd:?}): {}",
        describe(&out)
    );
}
