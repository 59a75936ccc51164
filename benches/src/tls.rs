//! TLS 1.3 handshakes per second with the server key in the TPM, against the ceiling, the model
//! limit and OpenSSL with the tpm2-openssl provider, measured with `openssl s_time -connect
//! 127.0.0.1:PORT -new -time N` (full handshakes; the rate is connections per *elapsed* second).
//! Every server is measured twice: with one `s_time` (it opens one connection at a time, so this
//! is 1 / handshake latency) and with [`CLIENTS`] `s_time` processes at once (throughput).
//!
//! Per round, after the signing phases (and so with that round's raw ESAPI sign rate):
//! - **vault**: a fresh `tpm-vaultd` on the shared swtpm, and the example HTTPS server
//!   (`client/examples/tls_server.rs`, multi-thread runtime) whose `VaultSigningKey` signs every
//!   CertificateVerify through the daemon with the benchmark's ECC P-256 key (self-signed
//!   certificate, issued once through the daemon, untimed);
//! - **software**: a rustls server in this process with a software ECC P-256 key, the same TLS
//!   configuration ([`tpm_vault_client::tls::server_config`]) and the same connection handling:
//!   the ceiling without a TPM;
//! - **OpenSSL peers** ([`crate::tls_peers`]): `openssl s_server` with a software key, and with a
//!   key in the same swtpm through tpm2-openssl, as documented and in its best configuration
//!   (skipped, with a note, where their packages are missing);
//! - **model limit**: a handshake costs the software handshake plus one TPM signature, so the
//!   best a TPM-backed server can do is `1 / (1/software + 1/raw_sign)`. The vault's figure is
//!   reported as a ratio to that limit (target ≥ 0.85) and to the best tpm2-openssl
//!   configuration (target ≥ 1.3), both with one client.

use std::io::{BufRead, BufReader, Read as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{bail, ensure, Context as _, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::key_service_client::KeyServiceClient;

use crate::sign::daemon::{Daemon, Setup};
use crate::sign::{Timing, KEY_NAME};
use crate::stats::Spread;
use crate::summary::Check;
use crate::table::Goal;
use crate::table::{num, Align, Cell, Table};
use crate::tls_peers::{self, Files, Peers, Server};

/// The target: the vault's rate ÷ the model limit (one client).
pub const GOAL: Goal = Goal::AtLeast(0.85);
/// The target: the vault's rate ÷ the best OpenSSL + tpm2-openssl configuration (one client).
pub const PEER_GOAL: Goal = Goal::AtLeast(1.3);
/// `s_time` processes at once in the concurrent variant.
pub const CLIENTS: usize = 4;

/// Handshakes per elapsed second of one server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// One `s_time`: one connection at a time, so 1 / handshake latency.
    pub one: f64,
    /// [`CLIENTS`] `s_time` processes at once: their connections together.
    pub many: f64,
}

/// What one round measured.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsRound {
    /// Example server with the vault key.
    pub vault: Rate,
    /// rustls with a software key.
    pub software: Rate,
    /// The OpenSSL peers that ran.
    pub peers: Vec<(Server, Rate)>,
    /// Raw ESAPI signatures per second, same round.
    pub raw_sign: f64,
}

impl TlsRound {
    /// `1 / (1/software + 1/raw_sign)`, one client.
    pub fn model(&self) -> f64 {
        1.0 / (1.0 / self.software.one + 1.0 / self.raw_sign)
    }

    /// vault ÷ model, one client.
    pub fn ratio(&self) -> f64 {
        self.vault.one / self.model()
    }

    /// One peer's rate, if it ran.
    pub fn peer(&self, server: Server) -> Option<Rate> {
        self.peers.iter().find(|(s, _)| *s == server).map(|(_, r)| *r)
    }

    /// The best of the tpm2-openssl configurations measured, per variant.
    pub fn best_tpm2(&self) -> Option<Rate> {
        self.peers
            .iter()
            .filter(|(s, _)| s.in_tpm())
            .map(|(_, r)| *r)
            .reduce(|a, b| Rate { one: a.one.max(b.one), many: a.many.max(b.many) })
    }
}

/// Everything the TLS phase needs besides the daemon setup.
#[derive(Debug, Clone)]
pub struct TlsSetup {
    /// The daemon (binary, TCTI, state dir); its `work` is this phase's scratch directory.
    pub daemon: Setup,
    /// `tls_server` example binary.
    pub example: PathBuf,
    /// The OpenSSL peers that can run here.
    pub peers: Peers,
}

/// Builds (with this benchmark's profile) and locates the example server binary.
///
/// # Errors
/// When it cannot be built and is not there.
pub fn example_binary(workspace: &Path) -> Result<PathBuf> {
    crate::binaries::client(
        workspace,
        "tpm-vault-client",
        &["--example", "tls_server"],
        Path::new("examples/tls_server"),
    )
}

/// The OpenSSL peers that can run here, and a note for each one that cannot.
pub fn detect_peers() -> (Peers, Vec<String>) {
    let peers = Peers::detect();
    let notes = peers.skipped.iter().map(|(s, why)| format!("TLS peer skipped, {}: {why}", s.short())).collect();
    (peers, notes)
}

/// One round: the vault server, the software server, then the OpenSSL peers.
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
        std::fs::create_dir_all(&setup.daemon.work).with_context(|| format!("{}", setup.daemon.work.display()))?;
        // The benchmark key may be used for signing, read, and given a certificate.
        let uid = nix::unistd::getuid().as_raw();
        let policy = format!(
            "[[rule]]\nname = \"tls-benchmark\"\nclients = [\"uid:{uid}\"]\nkeys = [\"{KEY_NAME}\"]\n\
             operations = [\"sign\", \"public\", \"create\"]\n"
        );
        let (daemon, _) = Daemon::start_with(&setup.daemon, &format!("daemon-tls-round{round}.log"), &policy)?;
        if round == 1 {
            rt.block_on(self_sign(daemon.socket()))?;
        }
        let server = Example::start(&setup.example, daemon.socket())?;
        let rate = measure(server.addr, timing).context("s_time against the vault example server")?;
        drop(server);
        daemon.stop()?;
        rate
    };
    progress(&format!("vault key (example server): {}", describe(vault)));
    let software = {
        let (addr, stop) = rt.block_on(software_server())?;
        let rate = measure(addr, timing).context("s_time against the software-key server");
        let _ = stop.send(());
        rate?
    };
    progress(&format!("software key (rustls): {}", describe(software)));
    let mut peers = Vec::new();
    if !setup.peers.run.is_empty() {
        let files = Files::new(&setup.daemon.work.join("openssl"))?;
        for &server in &setup.peers.run {
            let t = Timing { window: server.window(timing.window), ..timing };
            let (rate, flushed) =
                tls_peers::with_server(server, &files, &setup.daemon.tcti, &setup.daemon.work, |addr| measure(addr, t))
                    .with_context(|| format!("TLS peer: {}", server.short()))?;
            let flushed =
                if flushed > 0 { format!(" (flushed {flushed} TPM object(s) it left)") } else { String::new() };
            progress(&format!("{}: {}{flushed}", server.short(), describe(rate)));
            peers.push((server, rate));
        }
    }
    let r = TlsRound { vault, software, peers, raw_sign };
    progress(&format!("model limit {} handshakes/s; vault ÷ model {}", num(r.model(), 0), num(r.ratio(), 2)));
    if let Some(best) = r.best_tpm2() {
        progress(&format!("vault ÷ best tpm2-openssl {}", num(r.vault.one / best.one, 2)));
    }
    Ok(r)
}

fn describe(r: Rate) -> String {
    format!("{} handshakes/s with 1 client, {} with {CLIENTS}", num(r.one, 0), num(r.many, 0))
}

/// Issues the self-signed certificate the example server presents (stored with the key);
/// returns it (PEM).
pub(crate) async fn self_sign(socket: &Path) -> Result<String> {
    self_sign_key(socket, KEY_NAME).await
}

/// A self-signed certificate for `localhost` (DNS and 127.0.0.1) over the vault key `name`,
/// valid 30 days (PEM).
pub(crate) async fn self_sign_key(socket: &Path, name: &str) -> Result<String> {
    let chain = KeyServiceClient::new(crate::sign::health::channel(socket).await?)
        .create_self_signed_certificate(pb::CreateSelfSignedCertificateRequest {
            name: name.into(),
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
    Ok(chain.into_inner().chain_pem)
}

/// Runs a warm-up `s_time` (none in quick mode), then the measured one, then [`CLIENTS`] at once;
/// returns connections per elapsed second of each.
pub(crate) fn measure(addr: SocketAddr, timing: Timing) -> Result<Rate> {
    let window = timing.window.as_secs().max(1);
    if let Some(warmup) = warmup_secs(timing) {
        s_time(addr, warmup, 1)?;
    }
    Ok(Rate { one: s_time(addr, window, 1)?, many: s_time(addr, window, CLIENTS)? })
}

/// Seconds of the warm-up `s_time` (it counts whole seconds): the warm-up rounded, none if that
/// is 0 (quick mode's 0.25 s).
pub(crate) fn warmup_secs(timing: Timing) -> Option<u64> {
    Some(timing.warmup.as_secs_f64().round() as u64).filter(|&s| s > 0)
}

/// `clients` × `openssl s_time -connect ADDR -new -time SECS` at once; returns their connections
/// together per second of wall time (from starting the first to the last one's exit).
fn s_time(addr: SocketAddr, secs: u64, clients: usize) -> Result<f64> {
    let started = Instant::now();
    let mut kids = Kids(Vec::with_capacity(clients));
    let mut readers = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut child = Command::new("openssl")
            .close_inherited_fds()
            .args(["s_time", "-connect", &addr.to_string(), "-new", "-time", &secs.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running openssl s_time")?;
        let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
        kids.0.push(child);
        // Drained while it runs (it prints one character per connection).
        readers.push(std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(out) = stdout.as_mut() {
                let _ = out.read_to_string(&mut text);
            }
            if let Some(err) = stderr.as_mut() {
                let _ = err.read_to_string(&mut text);
            }
            text
        }));
    }
    let mut connections = 0;
    for (child, reader) in kids.0.iter_mut().zip(readers) {
        let status = child.wait().context("waiting for openssl s_time")?;
        let text = reader.join().unwrap_or_default();
        ensure!(status.success(), "openssl s_time failed: {text}");
        connections += parse_s_time(&text).with_context(|| format!("unexpected s_time output: {text}"))?;
    }
    Ok(connections as f64 / started.elapsed().as_secs_f64())
}

/// Child processes killed on drop (those that already exited are reaped).
struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
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

/// The example server, killed on drop.
pub(crate) struct Example {
    child: Child,
    /// Where it listens.
    pub(crate) addr: SocketAddr,
}

impl Example {
    /// Starts the example at `bin` serving the vault key [`KEY_NAME`] of the daemon on `socket`.
    pub(crate) fn start(bin: &Path, socket: &Path) -> Result<Self> {
        Self::start_key(bin, socket, KEY_NAME)
    }

    /// Starts the example at `bin` serving the vault key `key` of the daemon on `socket`.
    pub(crate) fn start_key(bin: &Path, socket: &Path, key: &str) -> Result<Self> {
        let mut child = Command::new(bin)
            .close_inherited_fds()
            .args(["--key", key, "--listen", "127.0.0.1:0", "--socket"])
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

/// The median over the rounds of what `f` gives (rounds where it gives nothing are left out).
fn col(rounds: &[TlsRound], f: impl Fn(&TlsRound) -> Option<f64>) -> Option<Spread> {
    Spread::of(&rounds.iter().filter_map(f).collect::<Vec<_>>())
}

/// The TLS lines of the Targets table: vault ÷ model limit, and vault ÷ the best OpenSSL +
/// tpm2-openssl configuration when one ran; both with one client, per round, then the median.
pub fn checks(rounds: &[TlsRound]) -> Vec<Check> {
    let targets: [(&str, Goal, Option<Spread>); 2] = [
        ("model limit", GOAL, col(rounds, |r| Some(r.ratio()))),
        (
            "best OpenSSL + tpm2-openssl configuration",
            PEER_GOAL,
            col(rounds, |r| r.best_tpm2().map(|b| r.vault.one / b.one)),
        ),
    ];
    targets
        .into_iter()
        .filter_map(|(peer, goal, value)| {
            Some(Check {
                what: format!("TLS 1.3 handshakes/s, 1 client: vault `tls_server` ÷ {peer}"),
                value: value?.median,
                unit: "×",
                decimals: 2,
                goal,
                suspect: false,
            })
        })
        .collect()
}

/// The TLS section of `docs/BENCHMARKS.md`; `skipped` are the peers that could not run.
pub fn markdown(rounds: &[TlsRound], timing: Timing, skipped: &[(Server, String)]) -> String {
    if rounds.is_empty() {
        return String::new();
    }
    let window = timing.window.as_secs().max(1);
    let mut out = String::new();
    out.push_str("## TLS 1.3 handshakes with the server key in the TPM\n\n");
    out.push_str(&format!(
        "`openssl s_time -connect 127.0.0.1:PORT -new -time {window}` {}: full TLS 1.3 \
         handshakes (ECDSA P-256 server key, X25519 key exchange as OpenSSL {} offers it), counted per **elapsed** \
         second (connections ÷ wall time). **1 client** is one `s_time`, which opens one connection at a time: its \
         rate is 1 / handshake latency. **{CLIENTS} clients** are {CLIENTS} `s_time` processes started together on \
         the same server for the same window, their connections added up: throughput under load. The \
         tpm2-openssl configuration as documented gets a {}-second window (it manages a few handshakes per \
         second).\n\n",
        warmup_secs(timing).map_or_else(|| "without warm-up".to_owned(), |s| format!("after a {s}-second warm-up")),
        openssl_version(),
        Server::Tpm2Documented.window(timing.window).as_secs().max(1),
    ));
    out.push_str(&rates_table(rounds, skipped).markdown());
    out.push('\n');
    out.push_str("The vault's `tls_server` divided by each peer, per round:\n\n");
    out.push_str(&ratios_table(rounds).markdown());
    out.push('\n');
    explanations(&mut out);
    out
}

/// Handshakes per second of every server, and the model limit.
fn rates_table(rounds: &[TlsRound], skipped: &[(Server, String)]) -> Table {
    let many_title = format!("handshakes/s, {CLIENTS} clients");
    let (l, r) = (Align::Left, Align::Right);
    let mut t = Table::new([("server", l), ("key", l), ("handshakes/s, 1 client", r), (many_title.as_str(), r)]);
    let rates = |f: &dyn Fn(&TlsRound) -> Option<Rate>| {
        [
            Cell::maybe(col(rounds, |r| f(r).map(|x| x.one)), 0, ""),
            Cell::maybe(col(rounds, |r| f(r).map(|x| x.many)), 0, ""),
        ]
    };
    let row = |server: &str, key: &str, [one, many]: [Cell; 2]| vec![Cell::text(server), Cell::text(key), one, many];
    let peer_row = |server: Server| match skipped.iter().find(|(s, _)| *s == server) {
        Some((_, why)) => row(server.label(), server.key(), [Cell::Text(format!("skipped: {why}")), Cell::text("—")]),
        None => row(server.label(), server.key(), rates(&|r| r.peer(server))),
    };
    let bold = |[one, many]: [Cell; 2]| [one, many].map(|c| Cell::Text(format!("**{}**", c.render())));
    t.push(row(
        "rustls (tokio-rustls, aws-lc-rs) in the benchmark process: the ceiling",
        "software P-256",
        rates(&|r| Some(r.software)),
    ));
    t.push(peer_row(Server::OpensslSoftware));
    t.push(row(
        "**`tls_server` example**: tokio-rustls + `VaultSigningKey` via `tpm-vaultd`",
        "vault P-256 (swtpm)",
        bold(rates(&|r| Some(r.vault))),
    ));
    t.push(peer_row(Server::Tpm2Documented));
    t.push(peer_row(Server::Tpm2Best));
    t.push(row(
        "raw ESAPI `TPM2_Sign`, same round (signs/s, one caller, key loaded)",
        "P-256 in swtpm",
        [Cell::maybe(col(rounds, |r| Some(r.raw_sign)), 0, ""), Cell::text("—")],
    ));
    t.push(row(
        "model limit `1 / (1/rustls software + 1/raw sign)`",
        "",
        [Cell::maybe(col(rounds, |r| Some(r.model())), 0, ""), Cell::text("—")],
    ));
    t
}

/// The vault's example server divided by the model limit and by each peer, with the targets.
fn ratios_table(rounds: &[TlsRound]) -> Table {
    let (l, r) = (Align::Left, Align::Right);
    let many_title = format!("{CLIENTS} clients");
    let mut t =
        Table::new([("vault `tls_server` ÷", l), ("1 client", r), (many_title.as_str(), r), ("target (1 client)", l)]);
    let model = col(rounds, |r| Some(r.ratio()));
    t.push(vec![
        Cell::text("model limit"),
        Cell::maybe(model, 2, "×"),
        Cell::text("—"),
        Cell::maybe_verdict(GOAL, model),
    ]);
    let ratio = |f: fn(&TlsRound) -> Option<Rate>| {
        let one = col(rounds, |r| f(r).map(|p| r.vault.one / p.one));
        let many = col(rounds, |r| f(r).map(|p| r.vault.many / p.many));
        (one, Cell::maybe(one, 2, "×"), Cell::maybe(many, 2, "×"))
    };
    let (best, one, many) = ratio(TlsRound::best_tpm2);
    t.push(vec![
        Cell::text("best OpenSSL + tpm2-openssl configuration (the faster of the two, per round and column)"),
        one,
        many,
        Cell::maybe_verdict(PEER_GOAL, best),
    ]);
    type Peer = fn(&TlsRound) -> Option<Rate>;
    let others: [(&str, Peer); 3] = [
        ("OpenSSL + tpm2-openssl as documented", |r| r.peer(Server::Tpm2Documented)),
        ("rustls, software key (the ceiling)", |r| Some(r.software)),
        ("`openssl s_server`, software key", |r| r.peer(Server::OpensslSoftware)),
    ];
    for (label, f) in others {
        let (_, one, many) = ratio(f);
        t.push(vec![Cell::text(label), one, many, Cell::empty()]);
    }
    t
}

/// What the figures mean, the OpenSSL peers, what the rows need.
fn explanations(out: &mut String) {
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
    out.push_str(
        "**The OpenSSL peers.** Both tpm2-openssl servers use a P-256 key made by `openssl genpkey -provider tpm2` \
         in the same swtpm (untimed, once) and are measured in the same round as the vault, on the same TPM. *As \
         documented* is tpm2-openssl's own TLS example (`openssl s_server -provider tpm2 -provider default -www`): \
         with the tpm2 provider first, OpenSSL also fetches its digests from the TPM, so every handshake's \
         transcript hashing becomes hundreds of TPM commands; run straight on swtpm it fails (TPM error 0x902, out \
         of object memory, as its hash sequences pile up), so it runs through tpm2-abrmd (`--flush-all`, on a \
         private D-Bus session bus), the resource manager its set-ups assume. The *best configuration found* loads the default \
         provider first and keeps digests and ciphers off the TPM with `-propquery`, so only the signature runs \
         there, straight on swtpm with no resource manager; the faster of the two is the peer of the ≥ 1.3× target. \
         `s_server` serves one connection at a time, so more clients add little to its throughput (the vault's \
         example server runs handshakes on a multi-thread runtime and the daemon queues their signatures for the \
         TPM). The concurrent `s_time` processes run on the same CPUs as the servers, the daemon and swtpm, so on \
         a small machine they take CPU from the server: the concurrent column is this machine's throughput, not a \
         TPM limit. The killed `s_server` leaves its key loaded in the TPM; the phase flushes it before the \
         harness checks that the TPM is clean.\n\n",
    );
    out.push_str(&format!(
        "The OpenSSL rows need `openssl` and, for the tpm2-openssl ones, `{}`; where a package is missing its row \
         says *skipped* and the run notes why.\n\n",
        tls_peers::INSTALL
    ));
}

/// `3.0.13` from `openssl version`, or `3` if it cannot be read.
fn openssl_version() -> String {
    Command::new("openssl")
        .close_inherited_fds()
        .arg("version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "3".into())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn s_time_output_parses() {
        let text = "Collecting connection statistics for 10 seconds\ntttt\n\n4321 connections in 2.53s; \
                    1707.91 connections/user sec, bytes read 0\n4321 connections in 11 real seconds, 0 bytes read per connection\n";
        assert_eq!(parse_s_time(text), Some(4321));
        assert_eq!(parse_s_time("nothing"), None);
    }

    fn rate(one: f64, many: f64) -> Rate {
        Rate { one, many }
    }

    #[test]
    fn model_ratios_and_targets() {
        let r = TlsRound {
            vault: rate(400.0, 600.0),
            software: rate(1000.0, 1200.0),
            peers: vec![
                (Server::OpensslSoftware, rate(700.0, 700.0)),
                (Server::Tpm2Documented, rate(8.0, 9.0)),
                (Server::Tpm2Best, rate(400.0, 420.0)),
            ],
            raw_sign: 1000.0,
        };
        assert!((r.model() - 500.0).abs() < 1e-9);
        assert!((r.ratio() - 0.8).abs() < 1e-9);
        assert_eq!(r.best_tpm2(), Some(rate(400.0, 420.0)));
        let timing = Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(10) };
        let md = markdown(std::slice::from_ref(&r), timing, &[]);
        assert!(md.contains("0.80×") && md.contains("≥ 0.85: **MISS**"), "{md}");
        assert!(md.contains("| 1.00× | 1.43× | ≥ 1.30: **MISS** |"), "{md}");
        assert!(md.contains("| 50.00× | 66.67× |"), "{md}");
        let checks = checks(&[r]);
        assert_eq!(checks.len(), 2);
        assert!(checks.iter().all(|c| c.verdict() == "MISS"));
    }

    #[test]
    fn skipped_peers_are_said_and_have_no_target() {
        let r = TlsRound { vault: rate(500.0, 800.0), software: rate(900.0, 1500.0), peers: vec![], raw_sign: 1800.0 };
        let skipped: Vec<(Server, String)> =
            [Server::Tpm2Documented, Server::Tpm2Best].map(|s| (s, "not installed".to_owned())).into();
        let timing = Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(10) };
        let md = markdown(std::slice::from_ref(&r), timing, &skipped);
        assert_eq!(md.matches("skipped: not installed").count(), 2, "{md}");
        assert!(md.contains("≥ 1.30: not measured"), "{md}");
        assert_eq!(checks(&[r]).len(), 1);
    }
}
