//! The OpenSSL peers of the TLS phase ([`crate::tls`]): `openssl s_server` with a software P-256
//! key, and with a P-256 key inside the benchmark's swtpm through the tpm2-openssl provider, once
//! as tpm2-openssl's documentation configures it (`-provider tpm2 -provider default`; through
//! tpm2-abrmd on a private D-Bus session bus, because straight on swtpm that configuration fails
//! with TPM error 0x902, out of object memory) and once in the best configuration found (straight
//! on swtpm, `-propquery` keeping digests and ciphers off the TPM, so only the CertificateVerify
//! signature runs there).
//!
//! Peers whose packages are missing are skipped, with the reason and the install command in the
//! report ([`Peers::detect`]). Every process started here (s_server, tpm2-abrmd, dbus-daemon) is
//! killed when its guard drops, also on errors; then the TPM objects a killed s_server left loaded
//! are flushed, so the harness's check after the phase finds the TPM clean.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{bail, ensure, Context as _, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// What to install for every OpenSSL peer (Debian/Ubuntu).
pub const INSTALL: &str = "apt-get install -y tpm2-openssl tpm2-abrmd libtss2-tcti-tabrmd0 dbus";
/// Longest wait for a server, the bus or the resource manager to come up.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The D-Bus name tpm2-abrmd owns once it serves.
const ABRMD_NAME: &str = "com.intel.tss2.Tabrmd";
/// TLS options of the software and best-configuration servers (the peer recipe's).
const TLS_OPTIONS: [&str; 6] = ["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256", "-groups", "X25519", "-www"];
/// Provider options of the best configuration found.
const BEST_PROVIDERS: [&str; 6] =
    ["-provider", "default", "-provider", "tpm2", "-propquery", "?provider=tpm2,tpm2.digest!=yes,tpm2.cipher!=yes"];

/// An OpenSSL server the TLS phase measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `openssl s_server` with a software P-256 key.
    OpensslSoftware,
    /// s_server + tpm2-openssl as its documentation shows, through tpm2-abrmd.
    Tpm2Documented,
    /// s_server + tpm2-openssl in the best configuration found, straight on swtpm.
    Tpm2Best,
}

impl Server {
    /// In the order they are measured and reported.
    pub const ALL: [Self; 3] = [Self::OpensslSoftware, Self::Tpm2Documented, Self::Tpm2Best];

    /// Short name for progress lines.
    pub fn short(self) -> &'static str {
        match self {
            Self::OpensslSoftware => "openssl s_server, software key",
            Self::Tpm2Documented => "s_server + tpm2-openssl as documented (tpm2-abrmd)",
            Self::Tpm2Best => "s_server + tpm2-openssl, best configuration (direct)",
        }
    }

    /// Row label of the report.
    pub fn label(self) -> &'static str {
        match self {
            Self::OpensslSoftware => "`openssl s_server -www -tls1_3` (OpenSSL's own TLS stack)",
            Self::Tpm2Documented => {
                "`openssl s_server` + tpm2-openssl **as its documentation shows**: `-provider tpm2 -provider default \
                 -www`, through tpm2-abrmd"
            }
            Self::Tpm2Best => {
                "`openssl s_server` + tpm2-openssl, **best configuration found**: `-provider default -provider tpm2 \
                 -propquery '?provider=tpm2,tpm2.digest!=yes,tpm2.cipher!=yes'`, straight on swtpm"
            }
        }
    }

    /// The server key column of the report.
    pub fn key(self) -> &'static str {
        match self {
            Self::OpensslSoftware => "software P-256",
            Self::Tpm2Documented | Self::Tpm2Best => "P-256 in swtpm",
        }
    }

    /// Whether its key is in the TPM.
    pub fn in_tpm(self) -> bool {
        self != Self::OpensslSoftware
    }

    /// The measured window: the documented configuration manages a few handshakes per second,
    /// so a few seconds are enough to count it.
    pub fn window(self, window: Duration) -> Duration {
        match self {
            Self::Tpm2Documented => window.min(Duration::from_secs(5)),
            Self::OpensslSoftware | Self::Tpm2Best => window,
        }
    }
}

/// Which peers run here, and why the others do not.
#[derive(Debug, Clone, Default)]
pub struct Peers {
    /// Servers to measure, in [`Server::ALL`] order.
    pub run: Vec<Server>,
    /// Servers skipped, with the reason.
    pub skipped: Vec<(Server, String)>,
}

impl Peers {
    /// Looks for the tpm2-openssl provider, tpm2-abrmd with its TCTI and D-Bus. `openssl` itself
    /// is there (the TLS phase does not run without it).
    pub fn detect() -> Self {
        let mut peers = Self::default();
        let provider = provider_missing();
        let abrmd = abrmd_missing();
        for server in Server::ALL {
            let why = match server {
                Server::OpensslSoftware => None,
                Server::Tpm2Best => provider.clone(),
                Server::Tpm2Documented => match (&provider, &abrmd) {
                    (Some(p), Some(a)) => Some(format!("{p}; {a}")),
                    (Some(w), None) | (None, Some(w)) => Some(w.clone()),
                    (None, None) => None,
                },
            };
            match why {
                None => peers.run.push(server),
                Some(why) => peers.skipped.push((server, format!("{why}: `{INSTALL}`"))),
            }
        }
        peers
    }
}

/// Why the tpm2 provider cannot be loaded, if it cannot.
fn provider_missing() -> Option<String> {
    let dir = std::env::var_os("OPENSSL_MODULES").map(PathBuf::from).or_else(|| {
        let out = Command::new("openssl")
            .close_inherited_fds()
            .args(["version", "-m"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let dir = text.split_once("MODULESDIR:")?.1.trim().trim_matches('"').to_owned();
        Some(PathBuf::from(dir))
    });
    match dir {
        Some(dir) if dir.join("tpm2.so").is_file() => None,
        _ => Some("the tpm2-openssl provider is not installed (no tpm2.so in OpenSSL's MODULESDIR)".into()),
    }
}

/// Why tpm2-abrmd cannot run on a private session bus, if it cannot.
pub(crate) fn abrmd_missing() -> Option<String> {
    let mut missing = Vec::new();
    for (cmd, package) in [("tpm2-abrmd", "tpm2-abrmd"), ("dbus-daemon", "dbus-daemon"), ("dbus-send", "dbus-bin")] {
        if !on_path(cmd) {
            missing.push(format!("`{cmd}` ({package})"));
        }
    }
    // ldconfig is in /sbin, which a user's PATH may lack.
    let libraries = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|ldconfig| Command::new(ldconfig).close_inherited_fds().arg("-p").stderr(Stdio::null()).output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !libraries.contains("libtss2-tcti-tabrmd.so") {
        missing.push("the tabrmd TCTI (libtss2-tcti-tabrmd0)".into());
    }
    (!missing.is_empty()).then(|| format!("not installed: {}", missing.join(", ")))
}

/// Whether an executable `cmd` is on `PATH`.
pub(crate) fn on_path(cmd: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(cmd)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Keys and certificates of the OpenSSL servers, in one directory.
#[derive(Debug, Clone)]
pub struct Files {
    dir: PathBuf,
}

impl Files {
    /// In `dir` (created).
    ///
    /// # Errors
    /// When `dir` cannot be created.
    pub fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        Ok(Self { dir: dir.to_owned() })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The key and certificate `server` presents, made on first use: a software key with
    /// `openssl req -newkey`, a TPM key with `openssl genpkey -provider tpm2` on the benchmark's
    /// swtpm (the key's TPM-wrapped blob is the file) and a certificate signed by it.
    pub(crate) fn prepare(&self, server: Server, tcti: &str) -> Result<(PathBuf, PathBuf)> {
        let (key, cert) = if server.in_tpm() {
            (self.path("tpm-key.pem"), self.path("tpm-cert.pem"))
        } else {
            (self.path("sw-key.pem"), self.path("sw-cert.pem"))
        };
        if key.is_file() && cert.is_file() {
            return Ok((key, cert));
        }
        let s = |p: &Path| p.display().to_string();
        if server.in_tpm() {
            openssl(
                &["genpkey", "-provider", "tpm2", "-provider", "base", "-algorithm", "EC", "-pkeyopt", "group:P-256"],
                &["-out", &s(&key)],
                tcti,
            )
            .context("creating the tpm2-openssl key")?;
            openssl(
                &["req", "-provider", "tpm2", "-provider", "default", "-propquery", "?provider=tpm2,tpm2.digest!=yes"],
                &["-x509", "-new", "-key", &s(&key), "-subj", "/CN=localhost", "-days", "30", "-out", &s(&cert)],
                tcti,
            )
            .context("self-signing the tpm2-openssl certificate")?;
        } else {
            openssl(
                &["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"],
                &["-keyout", &s(&key), "-out", &s(&cert), "-subj", "/CN=localhost", "-days", "30"],
                tcti,
            )
            .context("creating the software s_server key")?;
        }
        Ok((key, cert))
    }
}

/// Runs `openssl ARGS MORE` with the tpm2 provider pointed at `tcti`.
fn openssl(args: &[&str], more: &[&str], tcti: &str) -> Result<()> {
    let out = Command::new("openssl")
        .close_inherited_fds()
        .args(args)
        .args(more)
        .env("TPM2OPENSSL_TCTI", tcti)
        .stdin(Stdio::null())
        .output()
        .context("running openssl")?;
    ensure!(
        out.status.success(),
        "`openssl {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Starts `server` on the benchmark's swtpm (`tcti`), hands its address to `measure`, then stops
/// everything it started and flushes what the killed s_server left in the TPM. `work` holds the
/// logs and the bus socket. Returns what `measure` returned and the objects flushed.
///
/// # Errors
/// Start failures (with the server's log), `measure`'s errors, the flush.
pub fn with_server<T>(
    server: Server,
    files: &Files,
    tcti: &str,
    work: &Path,
    measure: impl FnOnce(SocketAddr) -> Result<T>,
) -> Result<(T, usize)> {
    let (key, cert) = files.prepare(server, tcti)?;
    let mut args: Vec<String> = vec!["s_server".into(), "-accept".into(), "127.0.0.1:0".into()];
    let mut env: Vec<(&str, String)> = Vec::new();
    // Declared before the server so that they drop after it: the server disconnects first.
    let mut bus = None;
    let mut abrmd = None;
    match server {
        Server::OpensslSoftware => args.extend(TLS_OPTIONS.map(String::from)),
        Server::Tpm2Best => {
            args.extend(TLS_OPTIONS.map(String::from));
            args.extend(BEST_PROVIDERS.map(String::from));
            env.push(("TPM2OPENSSL_TCTI", tcti.to_owned()));
        }
        Server::Tpm2Documented => {
            let b = Bus::start(work)?;
            let a = Abrmd::start(tcti, &b.address, &work.join("tpm2-abrmd.log"))?;
            args.extend(["-provider", "tpm2", "-provider", "default", "-www"].map(String::from));
            env.push(("TPM2OPENSSL_TCTI", "tabrmd:bus_type=session".to_owned()));
            env.push(("DBUS_SESSION_BUS_ADDRESS", b.address.clone()));
            bus = Some(b);
            abrmd = Some(a);
        }
    }
    args.extend(["-key".into(), key.display().to_string(), "-cert".into(), cert.display().to_string()]);
    let log = work.join(format!("s_server-{server:?}.log"));
    let result = SServer::start(&args, &env, &log).and_then(|s| {
        let r = measure(s.addr);
        drop(s);
        r
    });
    drop(abrmd);
    drop(bus);
    let flushed = if server.in_tpm() {
        crate::sign::raw::flush_leftovers(tcti).context("flushing what s_server left in the TPM")
    } else {
        Ok(0)
    };
    // The measurement's error first: a failed flush usually follows from it.
    let value = result?;
    Ok((value, flushed?))
}

/// A running `openssl s_server`, killed on drop.
struct SServer {
    child: Child,
    addr: SocketAddr,
}

impl SServer {
    /// Starts it with its output in `log`; waits for its `ACCEPT 127.0.0.1:PORT` line.
    fn start(args: &[String], env: &[(&str, String)], log: &Path) -> Result<Self> {
        let out = File::create(log).with_context(|| format!("{}", log.display()))?;
        let mut cmd = Command::new("openssl");
        cmd.close_inherited_fds();
        cmd.args(args).env_remove("TPM2OPENSSL_TCTI").stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().context("starting openssl s_server")?;
        let mut server = Self { child, addr: SocketAddr::from(([127, 0, 0, 1], 0)) };
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let found = text.lines().find_map(|l| l.strip_prefix("ACCEPT ").and_then(|a| a.trim().parse().ok()));
            if let Some(addr) = found {
                server.addr = addr;
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("openssl s_server exited during start ({status}): {}", text.trim());
            }
            ensure!(
                started.elapsed() < START_TIMEOUT,
                "openssl s_server did not start within {START_TIMEOUT:?}: {}",
                text.trim()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for SServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private D-Bus session bus for tpm2-abrmd, killed on drop.
pub(crate) struct Bus {
    child: Child,
    /// The bus address for `DBUS_SESSION_BUS_ADDRESS`.
    pub(crate) address: String,
}

impl Bus {
    /// Starts a private session bus with its socket in `work`.
    pub(crate) fn start(work: &Path) -> Result<Self> {
        let socket = work.join("bus");
        if socket.exists() {
            std::fs::remove_file(&socket).with_context(|| format!("{}", socket.display()))?;
        }
        let mut child = Command::new("dbus-daemon")
            .close_inherited_fds()
            .args(["--session", "--nofork", "--nopidfile", "--print-address=1"])
            .arg(format!("--address=unix:path={}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(work.join("dbus-daemon.log"))?)
            .spawn()
            .context("starting dbus-daemon")?;
        let mut line = String::new();
        let read = match child.stdout.take() {
            Some(stdout) => BufReader::new(stdout).read_line(&mut line).map_err(anyhow::Error::from),
            None => Err(anyhow::anyhow!("no stdout")),
        };
        let bus = Self { child, address: line.trim().to_owned() };
        read.context("reading dbus-daemon's address")?;
        ensure!(bus.address.starts_with("unix:"), "dbus-daemon did not print an address (printed {line:?})");
        Ok(bus)
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// tpm2-abrmd on the swtpm and a private bus; stopped (SIGTERM, then SIGKILL) on drop.
pub(crate) struct Abrmd {
    child: Child,
}

impl Abrmd {
    /// Starts tpm2-abrmd (`--flush-all`) on `tcti` and the bus at `bus`; returns once it serves.
    pub(crate) fn start(tcti: &str, bus: &str, log: &Path) -> Result<Self> {
        let out = File::create(log).with_context(|| format!("{}", log.display()))?;
        let mut cmd = Command::new("tpm2-abrmd");
        cmd.close_inherited_fds();
        cmd.args(["--session", "--flush-all"]).arg(format!("--tcti={tcti}"));
        if nix::unistd::geteuid().is_root() {
            cmd.arg("--allow-root");
        }
        let child = cmd
            .env("DBUS_SESSION_BUS_ADDRESS", bus)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting tpm2-abrmd")?;
        let mut abrmd = Self { child };
        let started = Instant::now();
        while !name_has_owner(bus)? {
            if let Some(status) = abrmd.child.try_wait()? {
                bail!(
                    "tpm2-abrmd exited during start ({status}): {}",
                    std::fs::read_to_string(log).unwrap_or_default().trim()
                );
            }
            ensure!(started.elapsed() < START_TIMEOUT, "tpm2-abrmd did not register on D-Bus within {START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(abrmd)
    }
}

/// Whether tpm2-abrmd owns its name on `bus` yet.
fn name_has_owner(bus: &str) -> Result<bool> {
    let out = Command::new("dbus-send")
        .close_inherited_fds()
        .args([
            "--session",
            "--print-reply",
            "--dest=org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus.NameHasOwner",
        ])
        .arg(format!("string:{ABRMD_NAME}"))
        .env("DBUS_SESSION_BUS_ADDRESS", bus)
        .stdin(Stdio::null())
        .output()
        .context("running dbus-send")?;
    Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("boolean true"))
}

impl Drop for Abrmd {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(5));
    }
}

/// Stops a child process: SIGTERM, up to `grace` to exit, then SIGKILL; always reaped.
pub(crate) fn stop_child(child: &mut std::process::Child, grace: Duration) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_documented_configuration_gets_a_short_window() {
        let w = Duration::from_secs(10);
        assert_eq!(Server::Tpm2Documented.window(w), Duration::from_secs(5));
        assert_eq!(Server::Tpm2Best.window(w), w);
        assert_eq!(Server::Tpm2Documented.window(Duration::from_secs(1)), Duration::from_secs(1));
    }

    #[test]
    fn detection_names_every_server_once() {
        let p = Peers::detect();
        assert_eq!(p.run.len() + p.skipped.len(), Server::ALL.len());
        assert!(p.run.contains(&Server::OpensslSoftware));
        assert!(p.skipped.iter().all(|(_, why)| why.contains(INSTALL)));
    }
}
