//! TLS 1.3 handshakes per second with the server key in the TPM, against the ceiling and the
//! model limit, measured with `openssl s_time -connect 127.0.0.1:PORT -new -time N` (full
//! handshakes, one connection at a time; the rate is connections per *elapsed* second).
//!
//! Per round, after the signing phases (and so with that round's raw ESAPI sign rate):
//! - **vault**: a fresh `tpm-vaultd` on the shared swtpm, and the example HTTPS server
//!   (`client/examples/tls_server.rs`, multi-thread runtime) whose `VaultSigningKey` signs every
//!   CertificateVerify through the daemon with the benchmark's ECC P-256 key (self-signed
//!   certificate, issued once through the daemon, untimed);
//! - **software**: a rustls server in this process with a software ECC P-256 key, the same TLS
//!   configuration ([`tpm_vault_client::tls::server_config`]) and the same connection handling:
//!   the ceiling without a TPM;
//! - **model limit**: a handshake costs the software handshake plus one TPM signature, so the
//!   best a TPM-backed server can do is `1 / (1/software + 1/raw_sign)`. The vault's figure is
//!   reported as a ratio to that limit (target ≥ 0.85).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::key_service_client::KeyServiceClient;

use crate::report::{num, spread};
use crate::sign::daemon::Setup;
use crate::sign::{Timing, KEY_NAME};
use crate::stats::Spread;
use crate::summary::Goal;

/// The target: the vault's rate ÷ the model limit.
pub const GOAL: Goal = Goal::AtLeast(0.85);
/// Longest wait for the daemon or the example server to come up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What one round measured.
#[derive(Debug, Clone, Copy)]
pub struct TlsRound {
    /// Example server with the vault key: handshakes per elapsed second.
    pub vault: f64,
    /// rustls with a software key: handshakes per elapsed second.
    pub software: f64,
    /// Raw ESAPI signatures per second, same round.
    pub raw_sign: f64,
}

impl TlsRound {
    /// `1 / (1/software + 1/raw_sign)`.
    pub fn model(&self) -> f64 {
        1.0 / (1.0 / self.software + 1.0 / self.raw_sign)
    }

    /// vault ÷ model.
    pub fn ratio(&self) -> f64 {
        self.vault / self.model()
    }
}

/// Everything the TLS phase needs besides the daemon setup.
#[derive(Debug, Clone)]
pub struct TlsSetup {
    /// The daemon (binary, TCTI, state dir); its `work` is this phase's scratch directory.
    pub daemon: Setup,
    /// `tls_server` example binary.
    pub example: PathBuf,
}

/// Builds (with this benchmark's profile) and locates the example server binary.
///
/// # Errors
/// When it cannot be built and is not there.
pub fn example_binary(workspace: &Path) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().context("this executable has no parent directory")?;
    let candidate = dir.join("examples").join("tls_server");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "-p", "tpm-vault-client", "--example", "tls_server"]).current_dir(workspace);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let built = build.status().map(|s| s.success()).unwrap_or(false);
    ensure!(
        candidate.is_file(),
        "the tls_server example is not at {} (cargo build {}); build it with `cargo build -p tpm-vault-client --example tls_server`",
        candidate.display(),
        if built { "succeeded" } else { "failed" }
    );
    Ok(candidate)
}

/// Whether `openssl s_time` can run.
pub fn available() -> bool {
    Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One round: the vault server, then the software server.
///
/// # Errors
/// Process start failures, RPC errors, s_time failures.
pub fn run(
    setup: &TlsSetup,
    round: usize,
    timing: Timing,
    raw_sign: f64,
    rt: &Runtime,
    mut progress: impl FnMut(&str),
) -> Result<TlsRound> {
    let vault = {
        let daemon = Daemon::start(&setup.daemon, round)?;
        if round == 1 {
            rt.block_on(self_sign(&daemon.socket))?;
        }
        let server = Example::start(&setup.example, &daemon.socket)?;
        let rate = s_time(server.addr, timing).context("s_time against the vault example server")?;
        drop(server);
        daemon.stop()?;
        rate
    };
    progress(&format!("vault key (example server): {} handshakes/s", num(vault, 0)));
    let software = {
        let (addr, stop) = rt.block_on(software_server())?;
        let rate = s_time(addr, timing).context("s_time against the software-key server");
        let _ = stop.send(());
        rate?
    };
    progress(&format!("software key (rustls): {} handshakes/s", num(software, 0)));
    let r = TlsRound { vault, software, raw_sign };
    progress(&format!("model limit {} handshakes/s; vault ÷ model {}", num(r.model(), 0), num(r.ratio(), 2)));
    Ok(r)
}

/// Issues the self-signed certificate the example server presents (stored with the key).
async fn self_sign(socket: &Path) -> Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))?
        .connect()
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    KeyServiceClient::new(channel)
        .create_self_signed_certificate(pb::CreateSelfSignedCertificateRequest {
            name: KEY_NAME.into(),
            subject: Some(pb::CertificateSubject {
                subject: "CN=localhost".into(),
                dns_names: vec!["localhost".into()],
                ip_addresses: vec!["127.0.0.1".into()],
                uris: Vec::new(),
            }),
            days: 30,
            auth: Vec::new(),
        })
        .await
        .context("CreateSelfSignedCertificate")?;
    Ok(())
}

/// Runs a warm-up `s_time`, then the measured one; returns connections per elapsed second.
fn s_time(addr: SocketAddr, timing: Timing) -> Result<f64> {
    let warmup = timing.warmup.as_secs().max(1);
    let window = timing.window.as_secs().max(1);
    s_time_once(addr, warmup)?;
    let started = Instant::now();
    let connections = s_time_once(addr, window)?;
    let elapsed = started.elapsed().as_secs_f64();
    Ok(connections as f64 / elapsed)
}

/// `openssl s_time -connect ADDR -new -time SECS`; returns the connections it completed.
fn s_time_once(addr: SocketAddr, secs: u64) -> Result<u64> {
    let out = Command::new("openssl")
        .args(["s_time", "-connect", &addr.to_string(), "-new", "-time", &secs.to_string()])
        .stdin(Stdio::null())
        .output()
        .context("running openssl s_time")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "openssl s_time failed: {}{}", stdout, String::from_utf8_lossy(&out.stderr));
    parse_s_time(&stdout).with_context(|| format!("unexpected s_time output: {stdout}"))
}

/// The count from `N connections in X.XXs; ...`.
fn parse_s_time(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.split_once(" connections in ").and_then(|(n, _)| n.trim().parse().ok()))
}

/// A rustls server with a software P-256 key on this process's runtime; answers like the
/// example server. Returns its address and a stop switch.
async fn software_server() -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let key = rcgen::KeyPair::generate().context("software key")?;
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).context("certificate params")?;
    let cert = params.self_signed(&key).context("self-signed certificate")?;
    let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let signing = rustls::crypto::aws_lc_rs::sign::any_ecdsa_type(&der).context("software signing key")?;
    let certified = rustls::sign::CertifiedKey::new(vec![cert.der().clone()], signing);
    let resolver = Arc::new(rustls::sign::SingleCertAndKey::from(certified));
    let mut config = tpm_vault_client::tls::server_config(resolver)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                _ = &mut stop_rx => return,
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(_) => continue,
                },
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut buf = [0u8; 2048];
                // s_time sends nothing and closes: read until EOF or a request head.
                if let Ok(n) = tls.read(&mut buf).await {
                    if n > 0 {
                        let body = "hello from a software key\n";
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = tls.write_all(response.as_bytes()).await;
                    }
                }
                let _ = tls.shutdown().await;
            });
        }
    });
    Ok((addr, stop_tx))
}

/// A `tpm-vaultd` for this phase (its own socket and policy: the benchmark key may be used for
/// signing, read, and given a certificate); killed on drop if not stopped.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(setup: &Setup, round: usize) -> Result<Self> {
        std::fs::create_dir_all(&setup.work).with_context(|| format!("{}", setup.work.display()))?;
        let socket = setup.work.join("vault.sock");
        let policies = setup.work.join("policies");
        let config = setup.work.join("config.toml");
        if socket.exists() {
            std::fs::remove_file(&socket).with_context(|| format!("{}", socket.display()))?;
        }
        std::fs::create_dir_all(&policies)?;
        let uid = nix::unistd::getuid().as_raw();
        std::fs::write(
            policies.join("bench.toml"),
            format!(
                "[[rule]]\nname = \"tls-benchmark\"\nclients = [\"uid:{uid}\"]\nkeys = [\"{KEY_NAME}\"]\n\
                 operations = [\"sign\", \"public\", \"create\"]\n"
            ),
        )?;
        std::fs::write(&config, "")?;
        let log = File::create(setup.work.join(format!("daemon-tls-round{round}.log")))?;
        let mut cmd = Command::new(&setup.bin);
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
            .env("RUST_LOG", &setup.rust_log)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("TPM_VAULT_") {
                cmd.env_remove(key);
            }
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", setup.bin.display()))?;
        let mut daemon = Self { child, socket };
        let started = Instant::now();
        while UnixStream::connect(&daemon.socket).is_err() {
            if let Some(status) = daemon.child.try_wait()? {
                bail!("tpm-vaultd exited during start ({status})");
            }
            ensure!(started.elapsed() < START_TIMEOUT, "tpm-vaultd did not start within {START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(daemon)
    }

    fn stop(mut self) -> Result<()> {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).context("pid")?);
        kill(pid, Signal::SIGTERM).context("SIGTERM to tpm-vaultd")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait()? {
                ensure!(status.success(), "tpm-vaultd exited with {status} after SIGTERM");
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "tpm-vaultd still running 20 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
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

/// The example server, killed on drop.
struct Example {
    child: Child,
    addr: SocketAddr,
}

impl Example {
    fn start(bin: &Path, socket: &Path) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(["--key", KEY_NAME, "--listen", "127.0.0.1:0", "--socket"])
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("example stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).context("reading the example's address")?;
        let Some(addr) = line.trim().strip_prefix("listening on https://") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the tls_server example did not start (printed {line:?})");
        };
        let addr = addr.parse().with_context(|| format!("address {addr:?}"))?;
        Ok(Self { child, addr })
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The TLS section of `docs/BENCHMARKS.md`.
pub fn markdown(rounds: &[TlsRound], timing: Timing) -> String {
    let col = |f: fn(&TlsRound) -> f64| Spread::of(&rounds.iter().map(f).collect::<Vec<_>>());
    let (Some(vault), Some(software), Some(raw), Some(model), Some(ratio), Some(vs_software)) = (
        col(|r| r.vault),
        col(|r| r.software),
        col(|r| r.raw_sign),
        col(TlsRound::model),
        col(TlsRound::ratio),
        col(|r| r.vault / r.software),
    ) else {
        return String::new();
    };
    let verdict = if GOAL.met(ratio.median) { "PASS" } else { "MISS" };
    let mut out = String::new();
    out.push_str("## TLS 1.3 handshakes with the server key in the TPM\n\n");
    out.push_str(&format!(
        "`openssl s_time -connect 127.0.0.1:PORT -new -time {}` after a {}-second warm-up: full TLS 1.3 handshakes \
         (ECDSA P-256 server key, X25519 key exchange as OpenSSL 3.0 offers it), one connection at a time, counted \
         per **elapsed** second (connections ÷ wall time of the `s_time` process).\n\n",
        timing.window.as_secs().max(1),
        timing.warmup.as_secs().max(1)
    ));
    out.push_str("| server | handshakes/s | ratio | peer | target |\n|---|---:|---:|---|---|\n");
    out.push_str(&format!(
        "| rustls (tokio-rustls, aws-lc-rs), software P-256 key, in the benchmark process: the ceiling | {} | 1.00× | (reference) |  |\n",
        spread(&software, 0, "")
    ));
    out.push_str(&format!("| raw ESAPI `TPM2_Sign`, same round (signs/s) | {} | — | — |  |\n", spread(&raw, 0, "")));
    out.push_str(&format!("| model limit `1 / (1/software + 1/raw sign)` | {} | — | — |  |\n", spread(&model, 0, "")));
    out.push_str(&format!(
        "| `tls_server` example: tokio-rustls + `VaultSigningKey`, vault P-256 key via `tpm-vaultd` | {} | {} | model limit | {}: **{verdict}** |\n",
        spread(&vault, 0, ""),
        spread(&ratio, 2, "×"),
        GOAL.describe(2),
    ));
    out.push_str(&format!(
        "| same, against the software ceiling | {} | {} | software key |  |\n\n",
        spread(&vault, 0, ""),
        spread(&vs_software, 2, "×")
    ));
    out.push_str(
        "Each handshake costs the server one CertificateVerify signature. With a software key that is microseconds; \
         with the vault key it is a `Sign` RPC to `tpm-vaultd` over its Unix socket (made by the signing client on its \
         own thread while the handshake's runtime worker waits in `block_in_place`), one `TPM2_Sign` on swtpm, and the \
         reply. Nothing else in the handshake changes, so a TPM-backed server should at best do one software \
         handshake plus one raw TPM signature per connection: the model limit. The ratio to it is what the vault's \
         path (example server → gRPC → daemon → TPM actor) costs on top. Every figure is per round (the model uses \
         that round's raw rate), then summarised as median (min..max). A ratio above 1.00× means no measurable loss: \
         the model adds figures taken minutes apart, each with its own share of a shared machine's load (see the \
         load average above), so on a busy machine it is pessimistic; the software ceiling is the noisiest figure.\n\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s_time_output_parses() {
        let text = "Collecting connection statistics for 10 seconds\ntttt\n\n4321 connections in 2.53s; \
                    1707.91 connections/user sec, bytes read 0\n4321 connections in 11 real seconds, 0 bytes read per connection\n";
        assert_eq!(parse_s_time(text), Some(4321));
        assert_eq!(parse_s_time("nothing"), None);
    }

    #[test]
    fn model_and_ratio() {
        let r = TlsRound { vault: 400.0, software: 1000.0, raw_sign: 1000.0 };
        assert!((r.model() - 500.0).abs() < 1e-9);
        assert!((r.ratio() - 0.8).abs() < 1e-9);
        let md = markdown(&[r], Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(10) });
        assert!(md.contains("0.80×") && md.contains("MISS"), "{md}");
    }
}
