//! TLS 1.3 handshakes and PKCS#11 signing on the modelled Jetson Orin fTPM: the vault against
//! the device's ceiling and against tpm2-pkcs11, through the same model of the kernel's
//! resource manager (`/dev/tpmrm0`), in one run (issue #36, items 3 and 4).
//!
//! The phase owns its own swtpm, the TPM device model in front of it (profile `orin-ftpm`;
//! speed 1 in a full run, [`QUICK_SPEED`] with `--quick`) and a `tpm-vaultd` behind the model
//! with `resource_manager = "kernel"`, as on the device. It measures, in this order:
//! - **TLS handshakes** with an RSA-2048 and an ECDSA P-256 vault key, through the example
//!   server (`client/examples/tls_server.rs`) and through nginx with the vault's PKCS#11 module
//!   (libp11's engine, `master_process on`, [`NGINX_WORKERS`] forked workers): full TLS 1.3
//!   handshakes from 1 and [`CLIENTS`] concurrent clients, then resumed ones (a session
//!   ticket from the previous connection) from one client. The client is rustls in this
//!   process ([`drive`]): per connection TCP connect, handshake (timed: the handshake latency),
//!   `GET /`, the response; it checks the server's CertificateVerify signature against the
//!   certificate (and nothing else about the certificate).
//! - **`C_Sign`** (ECDSA P-256) through the vault's module and through tpm2-pkcs11, each
//!   driven by the same code ([`crate::p11_sign`]) at 1 and [`THREADS`] threads; tpm2-pkcs11's
//!   TCTI is its own space of the same model (the model is the resource manager, so no
//!   tpm2-abrmd). The daemon is stopped (its space closed) before tpm2-pkcs11 runs.
//! - **nginx with tpm2-pkcs11**, forked workers as with the vault's module, then one process
//!   (`master_process off`), recording whatever happens.
//!
//! Every figure of TPM commands comes from the model's counters, read at the start and the
//! end of each measured window (all spaces together: one client runs at a time), divided by
//! the handshakes or signatures completed inside it.
//!
//! tpm2-pkcs11's token is made once, untimed, on the bare swtpm through tpm2-abrmd (the
//! existing [`crate::p11_peer`] set-up) before the model starts: `tpm2_ptool` runs a
//! tpm2-tools process per step, each of which would get its own space from the kernel,
//! while the model has one space per endpoint, not per process, so the steps' leftovers
//! would fill it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, HandshakeKind, SignatureScheme};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::runtime::Runtime;
use tpm_vault_daemon::harness::Swtpm;
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::key_service_client::KeyServiceClient;
use tpm_vault_tpm_model::{Model, ModelBuilder, Profile};

use crate::nginx::{self, Conf, Key, Nginx, Workers};
use crate::p11_peer::{self, Tpm2Peer};
use crate::p11_sign::{self, Counted, SignRate};
use crate::sign::daemon::{policy_allow_all, Daemon, Setup};
use crate::sign::Timing;
use crate::stats::{Measurement, Spread};
use crate::table::{num, Align, Cell, Goal, Table};

/// Speed factor of the model with `--quick` (20 times faster than the device).
pub const QUICK_SPEED: f64 = 0.05;
/// Concurrent clients of the loaded handshake rows.
pub const CLIENTS: usize = 4;
/// Threads of the loaded `C_Sign` rows.
pub const THREADS: usize = 4;
/// nginx worker processes (forked from the master, as nginx runs by default).
pub const NGINX_WORKERS: usize = 2;
/// Goal: handshakes per second from [`CLIENTS`] clients ÷ the TPM's signature ceiling, P-256.
/// A full handshake costs the server one signature, so these are issue #36's signing goals.
pub const P256_GOAL: Goal = Goal::AtLeast(0.93);
/// The same for RSA-2048.
pub const RSA_GOAL: Goal = Goal::AtLeast(0.80);
/// Goal: the vault's `C_Sign` rate ÷ tpm2-pkcs11's, same model, same driver.
pub const PEER_RATE_GOAL: Goal = Goal::AtLeast(1.0);
/// Goal: the vault's TPM commands per signature ÷ tpm2-pkcs11's.
pub const PEER_COMMANDS_GOAL: Goal = Goal::Below(1.0);
/// Longest a handshake client waits for one connection.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(20);
/// Window of the resumed-handshake rows and of the nginx + tpm2-pkcs11 attempt, at most.
const SHORT_WINDOW: Duration = Duration::from_secs(3);
/// The request each handshake client sends after its handshake.
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
/// `resource_manager` of the daemon behind the model: the kernel's, as on the device.
const DAEMON_CONFIG: &str = "resource_manager = \"kernel\"\n";

/// What the phase runs with.
#[derive(Debug, Clone)]
pub struct DeviceTlsSetup {
    /// `tpm-vaultd`.
    pub daemon: PathBuf,
    /// `RUST_LOG` of the daemon.
    pub rust_log: String,
    /// The `tls_server` example, when it was built.
    pub example: Option<PathBuf>,
    /// The vault's PKCS#11 module, when it was built.
    pub module: Option<PathBuf>,
    /// libp11's engine, when nginx can run.
    pub engine: Option<PathBuf>,
    /// Scratch directory (short: the daemon's socket lives in it).
    pub work: PathBuf,
    /// Quick mode: the model at [`QUICK_SPEED`], short windows.
    pub quick: bool,
    /// Warm-up and window of the full-handshake and `C_Sign` rows.
    pub timing: Timing,
}

/// A key algorithm of the phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// RSA-2048 (RSA-PSS in TLS 1.3): the fTPM's faster signature.
    Rsa2048,
    /// ECDSA P-256.
    P256,
}

impl Alg {
    /// Both, RSA first (the one to choose on the Orin).
    pub const ALL: [Alg; 2] = [Alg::Rsa2048, Alg::P256];

    /// The vault key's name (and PKCS#11 label).
    pub fn key(self) -> &'static str {
        match self {
            Self::Rsa2048 => "dev-tls-rsa2048",
            Self::P256 => "dev-tls-p256",
        }
    }

    /// Row label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Rsa2048 => "RSA-2048",
            Self::P256 => "P-256",
        }
    }

    fn proto(self) -> pb::KeyAlgorithm {
        match self {
            Self::Rsa2048 => pb::KeyAlgorithm::Rsa2048,
            Self::P256 => pb::KeyAlgorithm::EccP256,
        }
    }

    /// The device's signature time at speed 1, ms.
    pub fn sign_ms(self, profile: &Profile) -> f64 {
        match self {
            Self::Rsa2048 => profile.rsa2048_private_us / 1000.0,
            Self::P256 => profile.ecdsa_p256_us / 1000.0,
        }
    }

    /// The ceiling's goal for handshakes.
    pub fn goal(self) -> Goal {
        match self {
            Self::Rsa2048 => RSA_GOAL,
            Self::P256 => P256_GOAL,
        }
    }
}

/// Which TLS server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `client/examples/tls_server.rs` (rustls, `VaultSigningKey` over gRPC).
    Example,
    /// nginx, forked workers, the vault's PKCS#11 module through libp11's engine.
    NginxVault,
}

impl Server {
    /// Short label, for tables.
    pub fn short(self) -> &'static str {
        match self {
            Self::Example => "`tls_server` example",
            Self::NginxVault => "nginx + vault module",
        }
    }

    /// Row label.
    pub fn label(self) -> String {
        match self {
            Self::Example => "`tls_server` example (rustls → `tpm-vaultd`)".to_owned(),
            Self::NginxVault => {
                format!("nginx, {NGINX_WORKERS} forked workers, vault PKCS#11 module (libp11 engine → `tpm-vaultd`)")
            }
        }
    }
}

/// One handshake measurement.
#[derive(Debug, Clone)]
pub struct Handshakes {
    /// Concurrent clients.
    pub clients: usize,
    /// Resumed (a ticket offered) rather than full handshakes.
    pub resume: bool,
    /// Handshake latencies (TCP connect to handshake done) of the connections completed in
    /// the window; its rate is connections per second.
    pub m: Measurement,
    /// Connections in the window that were resumptions.
    pub resumed: u64,
    /// Connections in the window that failed.
    pub failed: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// TPM commands during the window.
    pub commands: BTreeMap<String, u64>,
    /// Time the TPM was held for them.
    pub busy: Duration,
}

impl Handshakes {
    /// Milliseconds the TPM was held per completed connection.
    pub fn busy_ms(&self) -> f64 {
        self.busy.as_secs_f64() * 1e3 / self.ok().max(1) as f64
    }

    /// The share of the window the TPM was busy.
    pub fn busy_share(&self) -> f64 {
        self.busy.as_secs_f64() / self.m.window.as_secs_f64().max(1e-9)
    }

    /// Connections completed in the window.
    pub fn ok(&self) -> u64 {
        self.m.latencies.len() as u64
    }

    /// TPM commands per completed connection.
    pub fn per_handshake(&self) -> f64 {
        self.commands.values().sum::<u64>() as f64 / self.ok().max(1) as f64
    }

    /// `TPM2_Sign` commands per completed connection.
    pub fn signs_per_handshake(&self) -> f64 {
        self.commands.get("Sign").copied().unwrap_or(0) as f64 / self.ok().max(1) as f64
    }
}

/// One server and key: full handshakes at 1 and [`CLIENTS`] clients, resumed at 1.
#[derive(Debug, Clone)]
pub struct ServerRows {
    /// The server.
    pub server: Server,
    /// The key.
    pub alg: Alg,
    /// Full, 1 client.
    pub one: Handshakes,
    /// Full, [`CLIENTS`] clients.
    pub many: Handshakes,
    /// Resumed, 1 client.
    pub resumed: Handshakes,
}

/// `C_Sign` through one module: rates and the model's counts per thread count.
#[derive(Debug, Clone)]
pub struct SignRows {
    /// `C_Sign` at 1 and [`THREADS`] threads.
    pub rates: Vec<SignRate>,
    /// The model's counts of the same windows.
    pub counted: Vec<Counted>,
}

impl SignRows {
    /// The rate at `threads`.
    pub fn rate(&self, threads: usize) -> Option<&SignRate> {
        self.rates.iter().find(|r| r.threads == threads)
    }

    /// The counts at `threads`.
    pub fn counted(&self, threads: usize) -> Option<&Counted> {
        self.counted.iter().find(|c| c.threads == threads)
    }

    /// TPM commands per signature at `threads`.
    pub fn per_sign(&self, threads: usize) -> Option<f64> {
        let c = self.counted(threads)?;
        (c.signs > 0).then(|| c.commands.values().sum::<u64>() as f64 / c.signs as f64)
    }

    /// Milliseconds the TPM was held per signature at `threads`.
    pub fn busy_ms(&self, threads: usize) -> Option<f64> {
        let c = self.counted(threads)?;
        (c.signs > 0).then(|| c.busy_ms / c.signs as f64)
    }
}

/// nginx with tpm2-pkcs11: what happened.
#[derive(Debug, Clone)]
pub struct PeerNginx {
    /// The worker model tried.
    pub workers: Workers,
    /// Handshakes from 1 client, when nginx started.
    pub handshakes: Option<Handshakes>,
    /// Why nginx did not start, or what its error log said.
    pub outcome: String,
}

/// What the phase measured.
#[derive(Debug, Clone)]
pub struct DeviceTls {
    /// The model's profile.
    pub profile: Profile,
    /// The model's speed factor.
    pub speed: f64,
    /// Quick mode.
    pub quick: bool,
    /// Full-handshake and `C_Sign` timing.
    pub timing: Timing,
    /// Window of the resumed rows.
    pub short: Duration,
    /// The handshake rows.
    pub servers: Vec<ServerRows>,
    /// `C_Sign` through the vault's module.
    pub vault_sign: Option<SignRows>,
    /// `C_Sign` through tpm2-pkcs11.
    pub tpm2_sign: Option<SignRows>,
    /// nginx with tpm2-pkcs11.
    pub tpm2_nginx: Vec<PeerNginx>,
    /// The 1-, 5- and 15-minute load averages at the start and the end of the phase.
    pub load: (String, String),
    /// swtpm's scheduling priority, said in a sentence.
    pub tpm_priority: String,
    /// Parts skipped, and why.
    pub skipped: Vec<String>,
}

/// Runs the phase (see the module docs); `progress` gets a line per measurement.
///
/// # Errors
/// swtpm, model, daemon, key creation and the vault rows' failures (tpm2-pkcs11's are recorded,
/// not raised: they are the peer's).
pub fn run(setup: &DeviceTlsSetup, rt: &Runtime, mut progress: impl FnMut(&str)) -> Result<DeviceTls> {
    let load_start = crate::machine::loadavg();
    let profile = Profile::orin_ftpm();
    let speed = if setup.quick { QUICK_SPEED } else { 1.0 };
    let short = if setup.quick { setup.timing.window } else { SHORT_WINDOW.min(setup.timing.window) };
    let short_timing = Timing { warmup: setup.timing.warmup.min(Duration::from_millis(500)), window: short };
    std::fs::create_dir_all(&setup.work).with_context(|| format!("{}", setup.work.display()))?;
    let mut skipped = Vec::new();
    let swtpm = Swtpm::start(&setup.work.join("swtpm")).context("starting the device phase's swtpm")?;
    let swtpm_pid = crate::procfs::read_pid_file(&swtpm.state_dir().join("swtpm.pid"));
    // tpm2-pkcs11's token first: its set-up needs the bare swtpm (see the module docs).
    let peer = match p11_peer::missing() {
        Some(why) => {
            skipped.push(format!("tpm2-pkcs11 rows: {why}"));
            None
        }
        None => {
            progress("making the tpm2-pkcs11 token (untimed, on the bare swtpm through tpm2-abrmd)");
            match Tpm2Peer::setup(&swtpm.tcti(), &setup.work.join("tpm2")) {
                Ok(p) => Some(p),
                Err(e) => {
                    skipped.push(format!("tpm2-pkcs11 rows: its set-up failed: {e:#}"));
                    None
                }
            }
        }
    };
    // The model's threads (spawned by this thread when it builds the model and opens the
    // spaces) and swtpm at TPM_NICE; this thread, and so every process it starts later (the
    // daemon, the servers, the signing children), back at its own priority.
    let own_nice = nice_of(std::process::id());
    let tpm_priority = swtpm_pid
        .and_then(|swtpm| {
            renice(swtpm, TPM_NICE)?;
            renice(std::process::id(), TPM_NICE)
        })
        .map_or_else(
            |e| format!("swtpm and the model ran at normal priority (renice to {TPM_NICE} failed: {e:#})"),
            |()| format!("swtpm and the model ran at nice {TPM_NICE}: the device's TPM does not queue behind the host's jobs"),
        );
    let model = ModelBuilder::new(swtpm.port()).with_profile(profile.clone()).with_speed(speed).build();
    let spaces = model.as_ref().ok().map(|m| -> Result<_> { Ok((m.open()?, [m.open()?, m.open()?, m.open()?])) });
    if let Ok(n) = &own_nice {
        renice(std::process::id(), &n.to_string()).context("setting this process's priority back")?;
    }
    let model = model.context("starting the TPM device model")?;
    let (space, peer_spaces) = spaces.context("no model")?.context("model spaces")?;
    progress(&format!("device model: profile {}, speed {speed}", profile.name));

    let daemon_setup = Setup {
        bin: setup.daemon.clone(),
        tcti: space.tcti(),
        state_dir: setup.work.join("state"),
        work: setup.work.join("d"),
        rust_log: setup.rust_log.clone(),
        args: Vec::new(),
    };
    std::fs::create_dir_all(&daemon_setup.work).with_context(|| format!("{}", daemon_setup.work.display()))?;
    let uid = nix::unistd::getuid().as_raw();
    let (daemon, ready) =
        Daemon::start_configured(&daemon_setup, "daemon-device-tls.log", &policy_allow_all(uid), DAEMON_CONFIG)?;
    progress(&format!("tpm-vaultd behind the model ready in {} ms", num(ready.as_secs_f64() * 1e3, 0)));
    let mut certs = Vec::new();
    for alg in Alg::ALL {
        let pem = rt.block_on(create_certified(daemon.socket(), alg)).with_context(|| alg.label())?;
        let path = daemon_setup.work.join(format!("{}.pem", alg.key()));
        std::fs::write(&path, pem).with_context(|| format!("{}", path.display()))?;
        certs.push((alg, path));
    }

    let mut servers = Vec::new();
    let measure_server = |server: Server, alg: Alg, addr: SocketAddr, progress: &mut dyn FnMut(&str)| {
        let rows = server_rows(server, alg, addr, &model, setup.timing, short_timing, rt)?;
        progress(&describe_rows(&rows, &profile));
        Ok::<_, anyhow::Error>(rows)
    };
    match &setup.example {
        Some(example) => {
            for alg in Alg::ALL {
                let ex = crate::tls::Example::start_key(example, daemon.socket(), alg.key())?;
                servers.push(measure_server(Server::Example, alg, ex.addr, &mut progress)?);
            }
        }
        None => skipped.push("the `tls_server` example rows: the example was not built".to_owned()),
    }
    let vault_env: Vec<(String, String)> = match &setup.module {
        Some(_) => {
            let config = daemon_setup.work.join("pkcs11.toml");
            std::fs::write(&config, "").with_context(|| format!("{}", config.display()))?;
            vec![
                ("TPM_VAULT_SOCKET".into(), daemon.socket().display().to_string()),
                ("TPM_VAULT_PKCS11_CONFIG".into(), config.display().to_string()),
            ]
        }
        None => Vec::new(),
    };
    match (&setup.module, &setup.engine) {
        (Some(module), Some(engine)) => {
            let openssl_conf =
                nginx::openssl_conf(&daemon_setup.work.join("openssl-vault.cnf"), engine, module, false)?;
            for (alg, cert) in &certs {
                let key = Key::Engine {
                    uri: format!("pkcs11:object={};type=private", alg.key()),
                    openssl_conf: openssl_conf.clone(),
                    ssl_engine: true,
                };
                let conf = Conf {
                    dir: setup.work.join(format!("nginx-{}", alg.key())),
                    cert: cert.clone(),
                    key,
                    workers: Workers::Forked(NGINX_WORKERS),
                    env: vault_env.clone(),
                };
                let server = Nginx::start(&conf).context("nginx with the vault module")?;
                servers.push(measure_server(Server::NginxVault, *alg, server.addr, &mut progress)?);
            }
        }
        _ => skipped.push("nginx with the vault module: the module, nginx or libp11's engine is missing".to_owned()),
    }
    let vault_sign = match &setup.module {
        Some(module) => {
            let (rates, counted) = p11_sign::measure_on_model(
                module,
                Alg::P256.key(),
                None,
                &vault_env,
                &[1, THREADS],
                setup.timing,
                Some(model.stats_port()),
            )
            .context("C_Sign through the vault module on the model")?;
            let rows = SignRows { rates, counted };
            progress(&format!("C_Sign, vault module: {}", describe_sign(&rows)));
            Some(rows)
        }
        None => {
            skipped.push("`C_Sign` through the vault module: the module was not built".to_owned());
            None
        }
    };
    daemon.stop()?;
    drop(space);

    let (mut tpm2_sign, mut tpm2_nginx) = (None, Vec::new());
    let [sign_space, forked_space, single_space] = peer_spaces;
    if let Some(peer) = &peer {
        let space = sign_space;
        let env = peer_env(peer, &space.tcti());
        match p11_sign::measure_on_model(
            Path::new(p11_peer::MODULE),
            p11_peer::KEY,
            Some(p11_peer::PIN),
            &env,
            &[1, THREADS],
            setup.timing,
            Some(model.stats_port()),
        ) {
            Ok((rates, counted)) => {
                let rows = SignRows { rates, counted };
                progress(&format!("C_Sign, tpm2-pkcs11: {}", describe_sign(&rows)));
                tpm2_sign = Some(rows);
            }
            Err(e) => skipped.push(format!("`C_Sign` through tpm2-pkcs11 failed: {e:#}")),
        }
        space.close();
        if let (Some(engine), Some(cert)) = (&setup.engine, &peer.cert) {
            // A fresh space each time: the file of /dev/tpmrm0 nginx's master opened.
            for (workers, space) in [(Workers::Forked(NGINX_WORKERS), forked_space), (Workers::Single, single_space)] {
                let env = peer_env(peer, &space.tcti());
                let dir = setup.work.join(format!("nginx-tpm2-{}", matches!(workers, Workers::Single)));
                let r = peer_nginx(&dir, engine, cert, workers, env, &model, short_timing, rt);
                progress(&format!("nginx with tpm2-pkcs11, {}: {}", workers_label(workers), r.outcome));
                tpm2_nginx.push(r);
            }
        } else {
            skipped.push("nginx with tpm2-pkcs11: nginx, libp11's engine or `pkcs11-tool` is missing".to_owned());
        }
    }
    drop(model);
    drop(swtpm);
    Ok(DeviceTls {
        profile,
        speed,
        quick: setup.quick,
        timing: setup.timing,
        short,
        servers,
        vault_sign,
        tpm2_sign,
        tpm2_nginx,
        load: (load_start, crate::machine::loadavg()),
        tpm_priority,
        skipped,
    })
}

/// Nice value of the phase's swtpm: the device's TPM is its own processor (or OP-TEE's world),
/// it does not wait for the host's scheduler behind other jobs.
const TPM_NICE: &str = "-10";

/// `renice -n NICE -p TID`: on Linux the priority of that one thread (the main thread for a
/// process id); threads and processes it starts afterwards inherit it. Lowering a nice value
/// needs root.
fn renice(tid: u32, nice: &str) -> Result<()> {
    let out = std::process::Command::new("renice")
        .args(["-n", nice, "-p", &tid.to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .context("running renice")?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

/// The nice value of thread `tid` of this process (field 19 of its `stat`).
fn nice_of(tid: u32) -> Result<i32> {
    let path = format!("/proc/self/task/{tid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| path.clone())?;
    // The command name (field 2) may hold spaces: count from the closing parenthesis.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).context("no ')' in stat")?;
    after.split_whitespace().nth(16).context("short stat")?.parse().context("nice value")
}

/// tpm2-pkcs11's environment with its TCTI on a model space.
fn peer_env(peer: &Tpm2Peer, tcti: &str) -> Vec<(String, String)> {
    vec![
        ("TPM2_PKCS11_TCTI".into(), tcti.to_owned()),
        ("TPM2_PKCS11_STORE".into(), peer.store().display().to_string()),
        // Its logging off the measured path (warnings only, as by default).
        ("TPM2_PKCS11_LOG_LEVEL".into(), "0".into()),
    ]
}

fn workers_label(w: Workers) -> String {
    match w {
        Workers::Forked(n) => format!("{n} forked workers"),
        Workers::Single => "one process (`master_process off`)".to_owned(),
    }
}

/// nginx with tpm2-pkcs11's key: start it, drive one client for a short window, say what
/// happened.
#[allow(clippy::too_many_arguments)]
fn peer_nginx(
    dir: &Path,
    engine: &Path,
    cert: &Path,
    workers: Workers,
    env: Vec<(String, String)>,
    model: &Model,
    timing: Timing,
    rt: &Runtime,
) -> PeerNginx {
    let conf_path = dir.join("openssl-tpm2.cnf");
    let started = std::fs::create_dir_all(dir)
        .map_err(anyhow::Error::from)
        .and_then(|()| nginx::openssl_conf(&conf_path, engine, Path::new(p11_peer::MODULE), true))
        .and_then(|openssl_conf| {
            let key = Key::Engine { uri: p11_peer::engine_uri(), openssl_conf, ssl_engine: false };
            Nginx::start(&Conf { dir: dir.to_owned(), cert: cert.to_owned(), key, workers, env })
        });
    let server = match started {
        Ok(s) => s,
        Err(e) => {
            return PeerNginx { workers, handshakes: None, outcome: format!("nginx did not start: {e:#}") };
        }
    };
    let h = rt.block_on(drive(server.addr, 1, false, timing, model, true));
    drop(server);
    let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
    let first_log = log.lines().find(|l| l.contains("[error]") || l.contains("[alert]") || l.contains("[crit]"));
    match h {
        Ok(h) => {
            let mut outcome = format!("{} handshakes completed, {} failed", h.ok(), h.failed);
            if let Some(e) = &h.first_error {
                outcome.push_str(&format!("; first failure: {e}"));
            }
            if let Some(line) = first_log {
                outcome.push_str(&format!("; nginx's error log: {}", strip_log_prefix(line)));
            }
            PeerNginx { workers, handshakes: Some(h), outcome }
        }
        Err(e) => PeerNginx { workers, handshakes: None, outcome: format!("{e:#}") },
    }
}

/// `2026/12/03 20:00:00 [error] 123#123: *1 msg` → `[error] msg`.
fn strip_log_prefix(line: &str) -> String {
    let Some(at) = line.find('[') else { return line.to_owned() };
    let rest = &line[at..];
    let (level, tail) = rest.split_once(']').unwrap_or((rest, ""));
    let tail = tail.trim_start();
    let tail = tail.split_once(": ").map_or(tail, |(_, t)| t);
    let tail = tail.strip_prefix('*').map_or(tail, |t| t.split_once(' ').map_or(t, |(_, m)| m));
    let mut out = format!("{level}] {tail}");
    out.truncate(300);
    out
}

/// Creates `alg`'s key in the vault and a self-signed certificate for it; returns the PEM.
async fn create_certified(socket: &Path, alg: Alg) -> Result<String> {
    let mut client = KeyServiceClient::new(crate::sign::health::channel(socket).await?);
    let created = client
        .create_key(pb::CreateKeyRequest {
            name: alg.key().into(),
            algorithm: alg.proto() as i32,
            pcr_binding: None,
            auth: Vec::new(),
            usages: Vec::new(),
        })
        .await;
    match created {
        Ok(_) => {}
        Err(s) if s.code() == tonic::Code::AlreadyExists => {}
        Err(s) => return Err(anyhow::Error::new(s).context("CreateKey")),
    }
    crate::tls::self_sign_key(socket, alg.key()).await
}

/// Full handshakes at 1 and [`CLIENTS`] clients, then resumed ones at 1; a failed connection
/// fails the rows (the vault's servers must not fail).
fn server_rows(
    server: Server,
    alg: Alg,
    addr: SocketAddr,
    model: &Model,
    timing: Timing,
    short: Timing,
    rt: &Runtime,
) -> Result<ServerRows> {
    let what = format!("{} with the {} key", server.label(), alg.label());
    let one = rt.block_on(drive(addr, 1, false, timing, model, false)).with_context(|| what.clone())?;
    let many = rt.block_on(drive(addr, CLIENTS, false, timing, model, false)).with_context(|| what.clone())?;
    let resumed = rt.block_on(drive(addr, 1, true, short, model, false)).with_context(|| what.clone())?;
    Ok(ServerRows { server, alg, one, many, resumed })
}

/// `clients` tasks on the runtime each connecting back to back to `addr` for the warm-up and
/// the window; with `resume`, each offers the ticket of its previous connection. The model's
/// counters are read at the window's start and end. With `tolerate`, failed connections are
/// counted (and the task goes on after a pause), else the first one is the error.
///
/// # Errors
/// A failed connection (unless `tolerate`), a task that panicked.
pub async fn drive(
    addr: SocketAddr,
    clients: usize,
    resume: bool,
    timing: Timing,
    model: &Model,
    tolerate: bool,
) -> Result<Handshakes> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(resume)?));
    let t0 = Instant::now() + timing.warmup;
    let t1 = t0 + timing.window;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let connector = connector.clone();
        tasks.spawn(async move {
            let (mut latencies, mut resumed, mut failed, mut first_error) = (Vec::new(), 0u64, 0u64, None);
            loop {
                let start = Instant::now();
                if start >= t1 {
                    break;
                }
                let result = tokio::time::timeout(CONNECTION_TIMEOUT, connection(&connector, addr))
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {CONNECTION_TIMEOUT:?}")));
                let end = Instant::now();
                let counted = end >= t0 && end <= t1;
                match result {
                    Ok((handshake, was_resumed)) => {
                        if counted {
                            latencies.push(handshake);
                            resumed += u64::from(was_resumed);
                        }
                    }
                    Err(e) if tolerate => {
                        failed += u64::from(counted);
                        first_error.get_or_insert_with(|| format!("{e:#}"));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok((latencies, resumed, failed, first_error))
        });
    }
    tokio::time::sleep_until(t0.into()).await;
    let before = model.total();
    tokio::time::sleep_until(t1.into()).await;
    let window = model.total().since(&before);
    let (commands, busy) = (names(&window), window.time());
    let (mut latencies, mut resumed, mut failed, mut first_error) = (Vec::new(), 0, 0, None);
    while let Some(joined) = tasks.join_next().await {
        let (l, r, f, e) = joined.context("handshake task")??;
        latencies.extend(l);
        resumed += r;
        failed += f;
        first_error = first_error.or(e);
    }
    let m = Measurement::finish(latencies, timing.window, Default::default());
    Ok(Handshakes { clients, resume, m, resumed, failed, first_error, commands, busy })
}

/// A tally's counts by command name.
fn names(tally: &tpm_vault_tpm_model::Tally) -> BTreeMap<String, u64> {
    tally.iter().map(|(code, n, _)| (tpm_vault_tpm_model::wire::command_name(code), n)).collect()
}

/// One connection: TCP connect and TLS handshake (timed), `GET /`, the response (which also
/// brings the session tickets). Returns the handshake time and whether it was a resumption.
async fn connection(connector: &tokio_rustls::TlsConnector, addr: SocketAddr) -> Result<(Duration, bool)> {
    let start = Instant::now();
    let tcp = tokio::net::TcpStream::connect(addr).await.context("TCP connect")?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from("localhost").context("server name")?;
    let mut tls = connector.connect(name, tcp).await.context("TLS handshake")?;
    let handshake = start.elapsed();
    let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
    tls.write_all(REQUEST).await.context("sending the request")?;
    let mut response = Vec::new();
    // Servers may close without close_notify: what counts is the status line.
    let _ = tls.read_to_end(&mut response).await;
    ensure!(
        response.starts_with(b"HTTP/1.1 200"),
        "unexpected response: {:?}",
        String::from_utf8_lossy(&response[..response.len().min(80)])
    );
    Ok((handshake, resumed))
}

/// TLS 1.3 with aws-lc-rs; tickets kept for resumption only with `resume`.
fn client_config(resume: bool) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 client config")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SignatureOnly(provider)))
        .with_no_client_auth();
    config.resumption = if resume { Resumption::in_memory_sessions(64) } else { Resumption::disabled() };
    Ok(config)
}

/// Trusts any certificate but checks the handshake's signature against it: the servers'
/// certificates are self-signed, what is measured is the TPM's signature, which must verify.
#[derive(Debug)]
struct SignatureOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for SignatureOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn ms(d: Duration) -> String {
    num(d.as_secs_f64() * 1e3, 1)
}

fn describe_rows(r: &ServerRows, profile: &Profile) -> String {
    let ceiling = 1000.0 / r.alg.sign_ms(profile);
    let h = |h: &Handshakes| {
        format!(
            "{}/s (p50 {} ms, p99 {} ms, {} TPM commands holding it {} ms each)",
            num(h.m.rate(), 1),
            ms(h.m.p50()),
            ms(h.m.p99()),
            num(h.per_handshake(), 1),
            num(h.busy_ms(), 1)
        )
    };
    format!(
        "{}, {}: 1 client {}; {CLIENTS} clients {} = {}× the ceiling; resumed {} ({} of {} resumed)",
        r.server.label(),
        r.alg.label(),
        h(&r.one),
        h(&r.many),
        num(r.many.m.rate() / ceiling, 2),
        h(&r.resumed),
        r.resumed.resumed,
        r.resumed.ok()
    )
}

fn describe_sign(rows: &SignRows) -> String {
    rows.rates
        .iter()
        .map(|r| {
            format!(
                "{} thread(s) {}/s (p50 {} ms), {} TPM commands a signature",
                r.threads,
                num(r.rate, 1),
                num(r.p50_us / 1e3, 1),
                rows.per_sign(r.threads).map_or("?".into(), |c| num(c, 1))
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `ContextLoad 1, Sign 1` per operation.
fn breakdown(commands: &BTreeMap<String, u64>, ops: u64) -> String {
    if commands.is_empty() {
        return "none".into();
    }
    let ops = ops.max(1) as f64;
    commands
        .iter()
        .map(|(name, &n)| {
            let per = n as f64 / ops;
            let per = if (per - per.round()).abs() < 0.05 { format!("{per:.0}") } else { format!("{per:.1}") };
            format!("{name} {per}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn spread(v: f64) -> Spread {
    Spread { median: v, min: v, max: v }
}

/// A verdict row: what, the value (a ratio, `×`, or with `ratio` false a plain figure), the goal.
fn verdict_row(t: &mut Table, what: String, value: Option<f64>, goal: Goal, ratio: bool) {
    match value {
        Some(v) if v.is_finite() => t.push(vec![
            Cell::text(what),
            if ratio { Cell::Ratio { value: spread(v), mark: "" } } else { Cell::num(v, 2) },
            Cell::verdict(goal, v, 2, ""),
        ]),
        _ => t.push(vec![Cell::text(what), Cell::text("—"), Cell::maybe_verdict(goal, None)]),
    }
}

/// The phase's subsection of the device section of `docs/BENCHMARKS.md`.
pub fn markdown(d: &DeviceTls, command: &str) -> String {
    let mut out = String::new();
    let p = &d.profile;
    out.push_str("### TLS handshakes and tpm2-pkcs11 on the modelled Orin fTPM\n\n");
    out.push_str(&format!(
        "Measured, not projected: a `tpm-vaultd` with `resource_manager = \"kernel\"` behind the TPM device model \
         (`tpm-model`, profile `{}` at speed {}: ECDSA P-256 signature {} ms, RSA-2048 private operation {} ms, every \
         command at least {} ms; the kernel resource manager's 3 object and 3 session slots per open file, every \
         saved object and session loaded before and saved after each command) in front of its own swtpm. Ceilings: \
         one TPM signature per full handshake, so **{} handshakes/s with P-256** and **{} with RSA-2048**. Command: \
         `{command}` (this subsection's phase, `{}`). Load average (1, 5, 15 min) at the start of the phase {}, at \
         its end {}, on a machine shared with other jobs.{}\n\n",
        p.name,
        d.speed,
        num(p.ecdsa_p256_us / 1e3 * d.speed, 1),
        num(p.rsa2048_private_us / 1e3 * d.speed, 1),
        num(p.floor_us / 1e3 * d.speed, 3),
        num(1e3 / Alg::P256.sign_ms(p) / d.speed, 1),
        num(1e3 / Alg::Rsa2048.sign_ms(p) / d.speed, 1),
        "benches/src/device_tls.rs",
        d.load.0,
        d.load.1,
        if d.quick {
            " **QUICK MODE: the model runs 20 times faster than the device and the windows are short; the \
             figures only show that every path works.**"
        } else {
            ""
        }
    ));
    out.push_str(&format!(
        "**Handshakes.** rustls clients in the benchmark process, each connecting back to back: TCP connect + TLS 1.3 \
         handshake (timed: p50/p99), `GET /`, the response. Full handshakes ({}-second window after {} s of warm-up), \
         then resumed ones (the ticket of the previous connection offered; {}-second window). TPM commands per \
         handshake: the model's counters over the window ÷ the handshakes completed in it. *TPM busy*: the share of \
         the window the model held the TPM; *TPM ms*: the time it held it per handshake, the profile's time per \
         command or swtpm's own when that is longer (on a loaded host swtpm waits for a CPU; {}): at *TPM busy* \
         near 100% the TPM, not the vault, is the limit. Servers: {}; {}.\n\n",
        num(d.timing.window.as_secs_f64(), 1),
        num(d.timing.warmup.as_secs_f64(), 1),
        num(d.short.as_secs_f64(), 1),
        d.tpm_priority,
        Server::Example.label(),
        Server::NginxVault.label(),
    ));
    out.push_str(&handshake_table(d).markdown());
    out.push('\n');
    out.push_str(&format!(
        "**`C_Sign`**, ECDSA P-256 over a 32-byte digest, one session per thread, both modules driven by the same code \
         (`benches/src/p11_sign.rs`, `cryptoki`, a child process per module), {}-second windows. tpm2-pkcs11 1.9 \
         (Debian `libtpm2-pkcs11-1`) with `TPM2_PKCS11_TCTI` on its own space of the same model: the model is the \
         resource manager, so it runs without tpm2-abrmd; the vault's daemon was stopped first. Its token and key \
         were made beforehand on the bare swtpm (`tpm2_ptool` through tpm2-abrmd, untimed).\n\n",
        num(d.timing.window.as_secs_f64(), 1)
    ));
    out.push_str(&sign_table(d).markdown());
    out.push('\n');
    if !d.tpm2_nginx.is_empty() {
        out.push_str("**nginx with tpm2-pkcs11** on the same model (its own space, 1 client, full handshakes):\n\n");
        for n in &d.tpm2_nginx {
            out.push_str(&format!("- {}: {}\n", workers_label(n.workers), n.outcome.replace('\n', " ")));
        }
        out.push('\n');
    }
    out.push_str("**Verdicts**, each a ratio of figures of this run:\n\n");
    out.push_str(&verdict_table(d).markdown());
    out.push('\n');
    resumption_note(d, &mut out);
    for s in &d.skipped {
        out.push_str(&format!("- Skipped: {s}\n"));
    }
    if !d.skipped.is_empty() {
        out.push('\n');
    }
    out
}

/// Every server's rows.
fn handshake_table(d: &DeviceTls) -> Table {
    let (l, r) = (Align::Left, Align::Right);
    let mut t = Table::new([
        ("server", l),
        ("key", l),
        ("handshakes", l),
        ("handshakes/s", r),
        ("p50 ms", r),
        ("p99 ms", r),
        ("÷ ceiling", r),
        ("TPM busy", r),
        ("TPM ms / handshake", r),
        ("TPM commands / handshake", r),
        ("of which", l),
    ]);
    for rows in &d.servers {
        let ceiling = 1e3 / rows.alg.sign_ms(&d.profile) / d.speed;
        for h in [&rows.one, &rows.many, &rows.resumed] {
            let clients = if h.clients == 1 { "1 client".to_owned() } else { format!("{} clients", h.clients) };
            let label = if h.resume {
                format!("resumed, {clients} ({} of {} resumed)", h.resumed, h.ok())
            } else {
                format!("full, {clients}")
            };
            t.push(vec![
                Cell::text(rows.server.short()),
                Cell::text(rows.alg.label()),
                Cell::text(label),
                Cell::num(h.m.rate(), 1),
                Cell::text(ms(h.m.p50())),
                Cell::text(ms(h.m.p99())),
                if h.resume {
                    Cell::text("—")
                } else {
                    Cell::Ratio { value: spread(h.m.rate() / ceiling), mark: "" }
                },
                Cell::text(format!("{}%", num(h.busy_share() * 100.0, 0))),
                Cell::num(h.busy_ms(), 1),
                Cell::num(h.per_handshake(), 1),
                Cell::text(breakdown(&h.commands, h.ok())),
            ]);
        }
    }
    t
}

/// `C_Sign` through both modules.
fn sign_table(d: &DeviceTls) -> Table {
    let (l, r) = (Align::Left, Align::Right);
    let mut t = Table::new([
        ("module", l),
        ("threads", r),
        ("signs/s", r),
        ("p50 ms", r),
        ("p99 ms", r),
        ("÷ ceiling", r),
        ("TPM busy", r),
        ("TPM ms / signature", r),
        ("TPM commands / signature", r),
        ("of which", l),
    ]);
    let ceiling = 1e3 / Alg::P256.sign_ms(&d.profile) / d.speed;
    for (label, rows) in [
        ("vault (`libtpm_vault_pkcs11.so` → `tpm-vaultd`)", &d.vault_sign),
        ("tpm2-pkcs11 (`libtpm2_pkcs11.so`, no abrmd)", &d.tpm2_sign),
    ] {
        let Some(rows) = rows else {
            t.push(vec![Cell::text(label), Cell::text("—"), Cell::text("not measured (see below)")]);
            continue;
        };
        for rate in &rows.rates {
            let c = rows.counted(rate.threads);
            t.push(vec![
                Cell::text(label),
                Cell::num(rate.threads as f64, 0),
                Cell::num(rate.rate, 1),
                Cell::num(rate.p50_us / 1e3, 1),
                Cell::num(rate.p99_us / 1e3, 1),
                Cell::Ratio { value: spread(rate.rate / ceiling), mark: "" },
                c.map_or(Cell::text("?"), |c| {
                    Cell::text(format!("{}%", num(c.busy_ms / d.timing.window.as_secs_f64() / 10.0, 0)))
                }),
                rows.busy_ms(rate.threads).map_or(Cell::text("?"), |v| Cell::num(v, 1)),
                rows.per_sign(rate.threads).map_or(Cell::text("?"), |v| Cell::num(v, 1)),
                Cell::text(c.map_or("?".into(), |c| breakdown(&c.commands, c.signs))),
            ]);
        }
    }
    t
}

/// The verdict rows.
fn verdict_table(d: &DeviceTls) -> Table {
    let (l, r) = (Align::Left, Align::Right);
    let mut t = Table::new([("ratio", l), ("value", r), ("target", l)]);
    for rows in &d.servers {
        let ceiling = 1e3 / rows.alg.sign_ms(&d.profile) / d.speed;
        verdict_row(
            &mut t,
            format!(
                "{}, {}: full handshakes/s, {CLIENTS} clients ÷ the ceiling (the signing goal: one signature a handshake)",
                rows.server.short(),
                rows.alg.label()
            ),
            Some(rows.many.m.rate() / ceiling),
            rows.alg.goal(),
            true,
        );
    }
    for rows in &d.servers {
        verdict_row(
            &mut t,
            format!(
                "{}, {}: TPM signatures per resumed handshake (a full one: 1)",
                rows.server.short(),
                rows.alg.label()
            ),
            Some(rows.resumed.signs_per_handshake()),
            Goal::AtMost(0.0),
            false,
        );
    }
    let (vault, tpm2) = (d.vault_sign.as_ref(), d.tpm2_sign.as_ref());
    for threads in [1, THREADS] {
        let ratio = vault.zip(tpm2).and_then(|(v, p)| Some(v.rate(threads)?.rate / p.rate(threads)?.rate));
        verdict_row(
            &mut t,
            format!("`C_Sign` P-256, {threads} thread(s): vault signs/s ÷ tpm2-pkcs11 signs/s"),
            ratio,
            PEER_RATE_GOAL,
            true,
        );
    }
    for threads in [1, THREADS] {
        let ratio = vault.zip(tpm2).and_then(|(v, p)| Some(v.per_sign(threads)? / p.per_sign(threads)?));
        verdict_row(
            &mut t,
            format!("`C_Sign` P-256, {threads} thread(s): vault TPM commands per signature ÷ tpm2-pkcs11's"),
            ratio,
            PEER_COMMANDS_GOAL,
            true,
        );
    }
    let forked_ok = |h: Option<&Handshakes>| h.map(|h| h.ok() as f64 / (h.ok() + h.failed).max(1) as f64);
    let vault_nginx = d.servers.iter().filter(|r| r.server == Server::NginxVault).map(|r| &r.one).next();
    verdict_row(
        &mut t,
        format!("nginx, {NGINX_WORKERS} forked workers, vault module: share of handshakes that succeed"),
        forked_ok(vault_nginx).filter(|_| vault_nginx.is_some_and(|h| h.ok() > 0)),
        Goal::AtLeast(1.0),
        false,
    );
    if let Some(n) = d.tpm2_nginx.iter().find(|n| matches!(n.workers, Workers::Forked(_))) {
        let share = n.handshakes.as_ref().map_or(0.0, |h| h.ok() as f64 / (h.ok() + h.failed).max(1) as f64);
        t.push(vec![
            Cell::text(format!(
                "nginx, {NGINX_WORKERS} forked workers, tpm2-pkcs11: share of handshakes that succeed (no target: the peer)"
            )),
            Cell::num(share, 2),
            Cell::empty(),
        ]);
    }
    t
}

/// What session resumption spares, from the resumed rows.
fn resumption_note(d: &DeviceTls, out: &mut String) {
    let mut lines = Vec::new();
    for rows in &d.servers {
        let (full, res) = (&rows.one, &rows.resumed);
        if res.ok() == 0 || full.ok() == 0 {
            continue;
        }
        lines.push(format!(
            "{}, {}: a resumed handshake took {} ms (p50) and {} TPM commands ({} signatures) against {} ms and {} \
             for a full one",
            rows.server.short(),
            rows.alg.label(),
            ms(res.m.p50()),
            num(res.per_handshake(), 1),
            num(res.signs_per_handshake(), 2),
            ms(full.m.p50()),
            num(full.per_handshake(), 1)
        ));
    }
    if lines.is_empty() {
        return;
    }
    out.push_str(
        "**Session resumption.** A TLS 1.3 resumption (PSK with (EC)DHE) authenticates the server with the ticket's \
         key, not a signature: the TPM is not used at all, so reconnecting clients that keep their tickets cost the \
         device nothing and are limited by the CPU alone. Both servers issue tickets out of the box (the example \
         server's rustls keeps a session cache; nginx's OpenSSL issues tickets whose key is made in the master \
         before it forks, so every worker accepts them).\n\n",
    );
    for l in lines {
        out.push_str(&format!("- {l}.\n"));
    }
    out.push('\n');
}

/// Makes the phase's setup from what the rest of the run built, or builds it (standalone
/// mode).
///
/// # Errors
/// When the daemon cannot be found.
pub fn standalone_setup(workspace: &Path, work: &Path, quick: bool, notes: &mut Vec<String>) -> Result<DeviceTlsSetup> {
    let daemon = crate::binaries::daemon(None, workspace, notes)?;
    let example = crate::tls::example_binary(workspace).ok();
    let module = crate::binaries::pkcs11_module(workspace).ok();
    let engine = if Path::new(nginx::NGINX).is_file() { nginx::engine_path() } else { None };
    Ok(DeviceTlsSetup {
        daemon,
        rust_log: "info".into(),
        example,
        module,
        engine,
        work: work.to_owned(),
        quick,
        timing: timing(quick),
    })
}

/// The phase's timing: 1 s of warm-up and 5 s windows (quick: 0.1 s and 0.5 s).
pub fn timing(quick: bool) -> Timing {
    if quick {
        Timing { warmup: Duration::from_millis(100), window: Duration::from_millis(500) }
    } else {
        Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(5) }
    }
}

/// First argument of the standalone mode: `tpm-vault-bench --device-tls OUT.md [--quick]` runs
/// only this phase and writes its subsection to `OUT.md`.
pub const STANDALONE_FLAG: &str = "--device-tls";

/// The standalone mode's main (see [`STANDALONE_FLAG`]).
///
/// # Errors
/// Bad arguments, the phase's errors.
pub fn standalone(args: &[std::ffi::OsString]) -> Result<()> {
    let Some(out) = args.first() else { bail!("{STANDALONE_FLAG} needs an output path") };
    let quick = args.iter().skip(1).any(|a| a == "--quick");
    let workspace = crate::binaries::workspace_root();
    let tmp = tempfile::Builder::new().prefix("tpmvb-").tempdir().context("creating a temporary directory")?;
    let mut notes = Vec::new();
    let setup = standalone_setup(&workspace, &tmp.path().join("dt"), quick, &mut notes)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let d = run(&setup, &rt, |m| eprintln!("[device TLS] {m}"))?;
    let mut command = String::from("cargo run");
    if !cfg!(debug_assertions) {
        command.push_str(" --release");
    }
    command.push_str(&format!(" -p tpm-vault-bench -- {STANDALONE_FLAG} {}", Path::new(out).display()));
    if quick {
        command.push_str(" --quick");
    }
    let mut text = markdown(&d, &command);
    for n in notes {
        text.push_str(&format!("- Note: {n}\n"));
    }
    std::fs::write(out, &text).with_context(|| format!("writing {}", Path::new(out).display()))?;
    println!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_lose_their_prefix() {
        let line = "2026/12/03 20:00:00 [error] 123#123: *7 SSL_do_handshake() failed (SSL: error:1) while SSL \
                    handshaking, client: 127.0.0.1";
        assert_eq!(
            strip_log_prefix(line),
            "[error] SSL_do_handshake() failed (SSL: error:1) while SSL handshaking, client: 127.0.0.1"
        );
        assert_eq!(strip_log_prefix("no brackets"), "no brackets");
    }

    #[test]
    fn breakdowns_are_per_operation() {
        let c: BTreeMap<String, u64> =
            [("ContextLoad".to_owned(), 20), ("Sign".to_owned(), 10), ("FlushContext".to_owned(), 15)].into();
        assert_eq!(breakdown(&c, 10), "ContextLoad 2, FlushContext 1.5, Sign 1");
        assert_eq!(breakdown(&BTreeMap::new(), 3), "none");
    }

    #[test]
    fn ceilings_are_the_published_signature_times() {
        let p = Profile::orin_ftpm();
        assert!((1e3 / Alg::P256.sign_ms(&p) - 22.17).abs() < 0.01);
        assert!((1e3 / Alg::Rsa2048.sign_ms(&p) - 84.03).abs() < 0.01);
    }
}
