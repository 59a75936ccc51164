//! The real `tpm-vaultd` binary over its Unix socket.
//!
//! Each round starts a fresh daemon on the shared swtpm (state directory shared with the
//! library phase, so the benchmark key exists), times start-to-ready (spawn until the socket
//! accepts a connection), reads its idle RSS, checks one signature with the Verify RPC, then
//! drives the Sign RPC from 1, 4, 16 and 64 concurrent clients, each on its own HTTP/2
//! connection, one request in flight per client. Afterwards it reads the RSS again and stops
//! the daemon with SIGTERM (which flushes its TPM objects and closes the TPM connection).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{bail, ensure, Context as _, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::key_service_client::KeyServiceClient;

use super::health::{self, channel};
use super::{CpuSnapshot, Pids, Timing, DIGEST, KEY_NAME};
use crate::procfs::{self, Proc};
use crate::stats::Measurement;

/// Longest wait for the socket to accept after spawning.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the daemon to exit after SIGTERM (its own grace is 10 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between "socket accepts" and reading the idle RSS.
const SETTLE: Duration = Duration::from_millis(200);

/// Where and how to run the daemon.
#[derive(Debug, Clone)]
pub struct Setup {
    /// `tpm-vaultd` binary.
    pub bin: PathBuf,
    /// TCTI of the shared swtpm.
    pub tcti: String,
    /// State directory (shared with the library phase).
    pub state_dir: PathBuf,
    /// Scratch directory for the socket, config, policies and logs (keep the path short:
    /// Unix socket paths are limited to 107 bytes).
    pub work: PathBuf,
    /// `RUST_LOG` of the daemon (`info` is what it ships with).
    pub rust_log: String,
    /// More command-line arguments (the device phase's `--resource-manager kernel`).
    pub args: Vec<String>,
}

/// One concurrency level of one round.
#[derive(Debug, Clone)]
pub struct Level {
    /// Concurrent clients (= connections = requests in flight).
    pub clients: usize,
    /// Requests completed, latencies (as the client sees them) and CPU use.
    pub m: Measurement,
    /// The daemon's CPU over the window by thread name (tokio workers share one name), sorted
    /// by name.
    pub threads: Vec<(String, Duration)>,
}

/// CPU used per thread name between two [`procfs::thread_cpu`] readings (threads that
/// started in between count from zero).
fn thread_delta(start: &[(u32, String, Duration)], end: &[(u32, String, Duration)]) -> Vec<(String, Duration)> {
    let mut by_name: BTreeMap<String, Duration> = BTreeMap::new();
    for (tid, name, cpu) in end {
        let before = start.iter().find(|(t, n, _)| t == tid && n == name).map_or(Duration::ZERO, |(_, _, c)| *c);
        *by_name.entry(name.clone()).or_default() += cpu.saturating_sub(before);
    }
    by_name.into_iter().collect()
}

/// What one daemon round measured.
#[derive(Debug, Clone)]
pub struct DaemonRound {
    /// Spawn until the socket accepts.
    pub ready: Duration,
    /// VmRSS after start, before any request, KiB.
    pub rss_idle_kib: u64,
    /// VmRSS after the last load level, KiB.
    pub rss_loaded_kib: u64,
    /// The load levels in the order run.
    pub levels: Vec<Level>,
    /// Requests the daemon answered in the round (warm-ups and the check included).
    pub requests: u64,
    /// Lines the daemon wrote to stdout/stderr in the round.
    pub log_lines: u64,
    /// Health checks from one client: the daemon's gRPC stack without a TPM job.
    pub health: Measurement,
}

/// A running daemon, killed on drop if it was not stopped. The other daemon phases (attestation,
/// sealing, bulk crypto, key-count scaling) start theirs through [`Daemon::start_with`].
pub struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").field("pid", &self.child.id()).field("socket", &self.socket).finish()
    }
}

impl Daemon {
    fn start(setup: &Setup, round: usize) -> Result<(Self, Duration)> {
        // Access is denied by default: allow this user to sign with (and verify against) the
        // benchmark key, nothing else.
        let policy = policy_toml(nix::unistd::getuid().as_raw());
        Self::start_with(setup, &format!("daemon-round{round}.log"), &policy)
    }

    /// Starts `tpm-vaultd` on `setup` with `policy` as its only access-policy file, logging to
    /// `setup.work/log_name`; returns once its socket accepts, with the time that took.
    ///
    /// # Errors
    /// When it cannot start, exits during start or does not accept in time (the error holds
    /// the end of its log).
    pub fn start_with(setup: &Setup, log_name: &str, policy: &str) -> Result<(Self, Duration)> {
        Self::start_configured(setup, log_name, policy, "")
    }

    /// [`Daemon::start_with`] with `config` as the text of its `config.toml` (for settings
    /// that have no flag in [`Setup`], such as `resource_manager = "kernel"` behind the
    /// device model).
    ///
    /// # Errors
    /// As [`Daemon::start_with`].
    pub fn start_configured(
        setup: &Setup,
        log_name: &str,
        policy: &str,
        config_text: &str,
    ) -> Result<(Self, Duration)> {
        let socket = setup.work.join("vault.sock");
        let policies = setup.work.join("policies");
        let config = setup.work.join("config.toml");
        let log = setup.work.join(log_name);
        if socket.exists() {
            std::fs::remove_file(&socket).with_context(|| format!("{}", socket.display()))?;
        }
        std::fs::create_dir_all(&policies).with_context(|| format!("{}", policies.display()))?;
        let policy_file = policies.join("bench.toml");
        std::fs::write(&policy_file, policy).with_context(|| format!("{}", policy_file.display()))?;
        // An explicit config (empty but for `config_text`) keeps /etc/tpm-vault/config.toml out of the
        // measurement.
        std::fs::write(&config, config_text).with_context(|| format!("{}", config.display()))?;
        let out = File::create(&log).with_context(|| format!("{}", log.display()))?;
        let err = out.try_clone()?;

        let mut cmd = Command::new(&setup.bin);
        cmd.close_inherited_fds();
        cmd.arg("--config")
            .arg(&config)
            .arg("--tcti")
            .arg(&setup.tcti)
            .arg("--state-dir")
            .arg(&setup.state_dir)
            .arg("--socket")
            .arg(&socket)
            .arg("--policies")
            .arg(&policies)
            .args(&setup.args)
            // Not inherited: a debug filter in the caller's environment would measure logging.
            .env("RUST_LOG", &setup.rust_log)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("TPM_VAULT_") {
                cmd.env_remove(key);
            }
        }
        let started = Instant::now();
        let child = cmd.spawn().with_context(|| format!("starting {}", setup.bin.display()))?;
        let mut daemon = Self { child, socket, log };
        loop {
            if UnixStream::connect(&daemon.socket).is_ok() {
                break;
            }
            if let Some(status) = daemon.child.try_wait()? {
                bail!("tpm-vaultd exited during start ({status}); its log:\n{}", daemon.log_tail());
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "tpm-vaultd did not accept on {} within {READY_TIMEOUT:?}; its log:\n{}",
                    daemon.socket.display(),
                    daemon.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let ready = started.elapsed();
        Ok((daemon, ready))
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The Unix socket it listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// SIGTERM, then wait for a clean exit.
    ///
    /// # Errors
    /// When it does not exit within [`STOP_TIMEOUT`] or exits with a failure status.
    pub fn stop(mut self) -> Result<()> {
        let pid = Pid::from_raw(i32::try_from(self.pid()).context("pid out of range")?);
        kill(pid, Signal::SIGTERM).context("sending SIGTERM to tpm-vaultd")?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                ensure!(
                    status.success(),
                    "tpm-vaultd exited with {status} after SIGTERM; its log:\n{}",
                    self.log_tail()
                );
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("tpm-vaultd still running {STOP_TIMEOUT:?} after SIGTERM; its log:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lines in the daemon's log so far.
    pub fn log_lines(&self) -> u64 {
        std::fs::read(&self.log).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count() as u64)
    }

    /// The last few KiB of the daemon's log, for error messages.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let len = f.metadata().map_or(0, |m| m.len());
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
            let _ = f.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// An access policy that allows `uid` every operation on every key: what the phases beyond
/// signing (attestation, sealing, bulk crypto, key counts) run under.
pub fn policy_allow_all(uid: u32) -> String {
    format!(
        "[[rule]]\nname = \"benchmark\"\nclients = [\"uid:{uid}\"]\nkeys = [\"*\"]\n\
         operations = [\"create\", \"sign\", \"public\", \"delete\", \"quote\", \"seal\", \"unseal\", \
         \"encrypt\", \"decrypt\", \"random\", \"admin\"]\n"
    )
}

/// The access policy the signing phase runs under.
fn policy_toml(uid: u32) -> String {
    format!(
        "[[rule]]\nname = \"benchmark\"\nclients = [\"uid:{uid}\"]\nkeys = [\"{KEY_NAME}\"]\n\
         operations = [\"sign\", \"public\"]\n"
    )
}

async fn connect(socket: &Path) -> Result<KeyServiceClient<Channel>> {
    Ok(KeyServiceClient::new(channel(socket).await?))
}

fn sign_request() -> pb::SignRequest {
    pb::SignRequest {
        name: KEY_NAME.into(),
        input: Some(pb::sign_request::Input::Digest(DIGEST.to_vec())),
        hash: pb::HashAlgorithm::Sha256 as i32,
        scheme: pb::SignatureScheme::Ecdsa as i32,
        ..Default::default()
    }
}

/// Adds a hint to the errors a benchmark can cause itself.
fn rpc_error(status: tonic::Status, policies: &Path) -> anyhow::Error {
    let hint = match status.code() {
        tonic::Code::PermissionDenied => {
            format!(" (the daemon's access policy denied the benchmark user; policies dir {})", policies.display())
        }
        tonic::Code::NotFound => " (the benchmark key is missing from the state dir)".into(),
        _ => String::new(),
    };
    anyhow::Error::new(status).context(format!("Sign/Verify RPC failed{hint}"))
}

/// One signature checked with the Verify RPC (in-core verification in the daemon).
// `..Default::default()` keeps this compiling when the proto gains fields.
#[allow(clippy::needless_update)]
async fn check_signature(socket: &Path, policies: &Path) -> Result<()> {
    let mut client = connect(socket).await?;
    let sig = client.sign(sign_request()).await.map_err(|s| rpc_error(s, policies))?.into_inner();
    let verdict = client
        .verify(pb::VerifyRequest {
            name: KEY_NAME.into(),
            input: Some(pb::verify_request::Input::Digest(DIGEST.to_vec())),
            signature: sig.signature,
            hash: pb::HashAlgorithm::Sha256 as i32,
            scheme: pb::SignatureScheme::Ecdsa as i32,
            ..Default::default()
        })
        .await
        .map_err(|s| rpc_error(s, policies))?
        .into_inner();
    ensure!(verdict.valid, "daemon signature does not verify");
    Ok(())
}

async fn client_loop(
    mut client: KeyServiceClient<Channel>,
    t0: Instant,
    t1: Instant,
    policies: PathBuf,
) -> Result<(Vec<Duration>, u64)> {
    let request = sign_request();
    let mut latencies = Vec::new();
    let mut total = 0;
    loop {
        let start = Instant::now();
        if start >= t1 {
            break;
        }
        client.sign(request.clone()).await.map_err(|s| rpc_error(s, &policies))?;
        total += 1;
        let end = Instant::now();
        if end >= t0 && end <= t1 {
            latencies.push(end - start);
        }
    }
    Ok((latencies, total))
}

/// Runs `clients` clients against the daemon for warm-up + window; also returns every request
/// completed, warm-up included.
async fn level(socket: &Path, policies: &Path, clients: usize, timing: Timing, pids: Pids) -> Result<(Level, u64)> {
    let daemon_pid = pids.daemon.context("no daemon pid")?;
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(connect(socket).await?);
    }
    CpuSnapshot::take(pids)?;
    let t0 = Instant::now() + timing.warmup;
    let t1 = t0 + timing.window;
    let mut tasks = JoinSet::new();
    for client in conns {
        tasks.spawn(client_loop(client, t0, t1, policies.to_owned()));
    }
    tokio::time::sleep_until(t0.into()).await;
    let cpu_start = CpuSnapshot::take(pids)?;
    let threads_start = procfs::thread_cpu(daemon_pid)?;
    tokio::time::sleep_until(t1.into()).await;
    let cpu_end = CpuSnapshot::take(pids)?;
    let threads_end = procfs::thread_cpu(daemon_pid)?;
    let mut latencies = Vec::new();
    let mut total = 0;
    while let Some(joined) = tasks.join_next().await {
        let (l, n) = joined.context("client task panicked")??;
        latencies.extend(l);
        total += n;
    }
    let m = Measurement::finish(latencies, timing.window, cpu_end.since(&cpu_start));
    let threads = thread_delta(&threads_start, &threads_end);
    Ok((Level { clients, m, threads }, total))
}

/// One daemon round: start, idle RSS, check, the load levels, loaded RSS, stop.
///
/// # Errors
/// Start/stop failures, RPC errors, a signature that does not verify.
pub fn run(
    setup: &Setup,
    round: usize,
    levels: &[usize],
    timing: Timing,
    swtpm_pid: u32,
    rt: &Runtime,
    mut progress: impl FnMut(&str),
) -> Result<DaemonRound> {
    let (daemon, ready) = Daemon::start(setup, round)?;
    progress(&format!("ready in {:.0} ms", ready.as_secs_f64() * 1e3));
    std::thread::sleep(SETTLE);
    let pid = daemon.pid();
    let rss_idle_kib = procfs::rss_kib(Proc::Pid(pid))?;
    let pids = Pids { swtpm: swtpm_pid, daemon: Some(pid) };
    let policies = setup.work.join("policies");
    rt.block_on(check_signature(&daemon.socket, &policies))?;
    let mut requests = 2;
    let mut done = Vec::with_capacity(levels.len());
    for &clients in levels {
        let (l, n) = rt.block_on(level(&daemon.socket, &policies, clients, timing, pids))?;
        requests += n;
        progress(&format!("{clients} clients: {:.0} req/s, p50 {:.0} µs", l.m.rate(), l.m.p50().as_secs_f64() * 1e6));
        done.push(l);
    }
    let rss_loaded_kib = procfs::rss_kib(Proc::Pid(pid))?;
    let health = rt.block_on(health::measure(&daemon.socket, health::timing(timing), pids))?;
    progress(&format!("health check: p50 {:.0} µs", health.p50().as_secs_f64() * 1e6));
    let log_lines = daemon.log_lines();
    daemon.stop()?;
    Ok(DaemonRound { ready, rss_idle_kib, rss_loaded_kib, levels: done, requests, log_lines, health })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_deltas_group_by_name() {
        let ms = Duration::from_millis;
        let start = vec![(1, "w".to_owned(), ms(10)), (2, "w".to_owned(), ms(5)), (3, "tpm".to_owned(), ms(1))];
        let end = vec![
            (1, "w".to_owned(), ms(30)),
            (2, "w".to_owned(), ms(6)),
            (3, "tpm".to_owned(), ms(4)),
            (4, "new".to_owned(), ms(2)),
        ];
        assert_eq!(
            thread_delta(&start, &end),
            vec![("new".to_owned(), ms(2)), ("tpm".to_owned(), ms(3)), ("w".to_owned(), ms(21))]
        );
    }
}
