//! The PKCS#11 phase: the vault's module (`tpm-vault-pkcs11`, a thin client of `tpm-vaultd`)
//! against the daemon's own gRPC `Sign` and against tpm2-pkcs11 on the same swtpm, and nginx
//! serving TLS 1.3 with the key behind each module.
//!
//! Per round, after the TLS phase:
//! - **`C_Sign`** ([`crate::p11_sign`]): a fresh daemon, then ECDSA P-256 `C_Sign` through the
//!   module at [`THREADS`] threads (one session each, one `C_Initialize`), set against the
//!   daemon phase's `Sign` RPC at the same concurrency in the same round;
//! - **nginx** ([`crate::nginx`]): with the vault module through libp11's engine
//!   (`master_process on; worker_processes 2;`), then with a software P-256 key file (the same
//!   configuration otherwise), each measured with `openssl s_time -new` at 1 and
//!   [`CLIENTS`] clients ([`crate::tls::measure`]); the model limit is
//!   `1 / (1/nginx software + 1/daemon Sign)` at the same concurrency, same round;
//! - **tpm2-pkcs11** ([`crate::p11_peer`]): the daemon stopped, tpm2-abrmd on the swtpm, the same
//!   `C_Sign` measurement with its token (user PIN login), then nginx with its key, with
//!   `master_process off` (its forked workers fail their handshakes).
//!
//! Parts whose packages are missing are skipped with a note ([`P11Setup::new`]).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use tokio::runtime::Runtime;
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::key_service_client::KeyServiceClient;

use crate::nginx::{self, Conf, Key, Nginx, Workers};
use crate::p11_peer::{self, Tpm2Peer};
use crate::p11_sign::{self, SignRate};
use crate::sign::daemon::{Daemon, Setup};
use crate::sign::{Timing, KEY_NAME};
use crate::tls::{self, Rate, CLIENTS};
use crate::tls_peers::{Files, Server};

/// Thread counts of the `C_Sign` measurement.
pub const THREADS: [usize; 2] = [1, 16];
/// nginx worker processes with the vault module.
pub const WORKERS: usize = 2;

/// Warm-up and window of the `C_Sign` measurement and of the nginx one (`s_time` counts whole
/// seconds).
#[derive(Debug, Clone, Copy)]
pub struct P11Timing {
    /// `C_Sign`.
    pub sign: Timing,
    /// nginx.
    pub tls: Timing,
}

/// What the phase runs with, made once per run.
#[derive(Debug, Clone)]
pub struct P11Setup {
    /// The daemon; its `work` is this phase's scratch directory.
    daemon: Setup,
    /// The vault module (`libtpm_vault_pkcs11.so`).
    pub module: PathBuf,
    /// libp11's engine, when nginx can run.
    pub engine: Option<PathBuf>,
    /// The tpm2-pkcs11 token, when that peer can run.
    peer: Option<Tpm2Peer>,
    /// Software key and certificate of the nginx software server.
    soft: Option<(PathBuf, PathBuf)>,
    /// Parts skipped, with the reason (also in the run's notes).
    pub skipped: Vec<String>,
}

impl P11Setup {
    /// Builds the module, looks for nginx, libp11's engine and tpm2-pkcs11, makes the peer's
    /// token (untimed; needs the swtpm free) and the software key. `None` when the module
    /// itself is not there (the note says why).
    ///
    /// # Errors
    /// When the software key cannot be made.
    pub fn new(workspace: &Path, daemon: Setup, notes: &mut Vec<String>) -> Result<Option<Self>> {
        let module = match crate::binaries::pkcs11_module(workspace) {
            Ok(m) => m,
            Err(e) => {
                let note = format!("the PKCS#11 phase was skipped: {e:#}");
                eprintln!("warning: {note}");
                notes.push(note);
                return Ok(None);
            }
        };
        std::fs::create_dir_all(&daemon.work).with_context(|| format!("{}", daemon.work.display()))?;
        let mut skipped = Vec::new();
        let openssl = crate::bulk::openssl_available();
        let engine = match (Path::new(nginx::NGINX).is_file(), nginx::engine_path()) {
            (true, Some(engine)) if openssl => Some(engine),
            (nginx, engine) => {
                let mut missing = Vec::new();
                for (gone, what) in [
                    (!openssl, "openssl"),
                    (!nginx, "nginx (nginx-light)"),
                    (engine.is_none(), "libp11's engine (libengine-pkcs11-openssl)"),
                ] {
                    if gone {
                        missing.push(what);
                    }
                }
                skipped.push(format!(
                    "nginx rows skipped, not installed: {}: `apt-get install -y nginx-light libengine-pkcs11-openssl`",
                    missing.join(", ")
                ));
                None
            }
        };
        let peer = match p11_peer::missing() {
            Some(why) => {
                skipped.push(format!("tpm2-pkcs11 rows skipped, {why}"));
                None
            }
            None => match Tpm2Peer::setup(&daemon.tcti, &daemon.work.join("tpm2")) {
                Ok(p) => {
                    if p.cert.is_none() {
                        skipped.push(
                            "nginx with tpm2-pkcs11 skipped, `pkcs11-tool` is not installed (it reads the key's \
                             public key for the certificate): `apt-get install -y opensc`"
                                .to_owned(),
                        );
                    }
                    Some(p)
                }
                Err(e) => {
                    skipped.push(format!("tpm2-pkcs11 rows skipped, its set-up failed: {e:#}"));
                    None
                }
            },
        };
        let soft = match engine {
            Some(_) => Some(Files::new(&daemon.work.join("sw"))?.prepare(Server::OpensslSoftware, &daemon.tcti)?),
            None => None,
        };
        for s in &skipped {
            let note = format!("PKCS#11 phase: {s}");
            eprintln!("warning: {note}");
            notes.push(note);
        }
        Ok(Some(Self { daemon, module, engine, peer, soft, skipped }))
    }
}

/// What one round measured.
#[derive(Debug, Clone, PartialEq)]
pub struct P11Round {
    /// `C_Sign` through the vault module, per [`THREADS`].
    pub vault: Vec<SignRate>,
    /// `C_Sign` through tpm2-pkcs11, when it ran.
    pub tpm2: Option<Vec<SignRate>>,
    /// The daemon phase's `Sign` RPC rate by clients, same round.
    pub daemon: Vec<(usize, f64)>,
    /// nginx with the vault module, with a software key, with tpm2-pkcs11 (when they ran).
    pub nginx_vault: Option<Rate>,
    /// See `nginx_vault`.
    pub nginx_soft: Option<Rate>,
    /// See `nginx_vault`.
    pub nginx_tpm2: Option<Rate>,
}

impl P11Round {
    /// The daemon's `Sign` rate at `clients`.
    pub fn daemon_at(&self, clients: usize) -> Option<f64> {
        self.daemon.iter().find(|(c, _)| *c == clients).map(|(_, r)| *r)
    }

    /// `C_Sign` rate of `rates` at `threads`.
    pub fn at(rates: &[SignRate], threads: usize) -> Option<f64> {
        rates.iter().find(|r| r.threads == threads).map(|r| r.rate)
    }

    /// `1 / (1/nginx software + 1/daemon Sign)` at 1 client and at [`CLIENTS`].
    pub fn model(&self) -> Option<Rate> {
        let soft = self.nginx_soft?;
        let f = |s: f64, d: f64| 1.0 / (1.0 / s + 1.0 / d);
        Some(Rate { one: f(soft.one, self.daemon_at(1)?), many: f(soft.many, self.daemon_at(CLIENTS)?) })
    }
}

/// The daemon's certificate of the benchmark key (PEM), issued first if it has none.
async fn certificate(socket: &Path) -> Result<String> {
    let mut client = KeyServiceClient::new(crate::sign::health::channel(socket).await?);
    match client.get_certificate(pb::GetCertificateRequest { name: KEY_NAME.into() }).await {
        Ok(chain) => Ok(chain.into_inner().chain_pem),
        Err(s) if s.code() == tonic::Code::NotFound => tls::self_sign(socket).await,
        Err(s) => Err(anyhow::Error::new(s).context("GetCertificate")),
    }
}

/// `s_time` at 1 and [`CLIENTS`] clients against nginx started with `conf`.
fn nginx_rate(conf: &Conf, timing: Timing) -> Result<Rate> {
    let server = Nginx::start(conf)?;
    tls::measure(server.addr, timing)
}

/// One round (see the module docs). `daemon` are the daemon phase's Sign rates by clients.
///
/// # Errors
/// Daemon, module, nginx or s_time failures (the tpm2-pkcs11 nginx's failure is only noted).
pub fn run(
    setup: &P11Setup,
    round: usize,
    timing: P11Timing,
    daemon: Vec<(usize, f64)>,
    rt: &Runtime,
    notes: &mut Vec<String>,
    mut progress: impl FnMut(&str),
) -> Result<P11Round> {
    let work = &setup.daemon.work;
    let uid = nix::unistd::getuid().as_raw();
    let policy = format!(
        "[[rule]]\nname = \"pkcs11-benchmark\"\nclients = [\"uid:{uid}\"]\nkeys = [\"{KEY_NAME}\"]\n\
         operations = [\"sign\", \"public\", \"create\"]\n"
    );
    let (d, _) = Daemon::start_with(&setup.daemon, &format!("daemon-pkcs11-round{round}.log"), &policy)?;
    let config = work.join("pkcs11.toml");
    std::fs::write(&config, "").with_context(|| format!("{}", config.display()))?;
    let env: Vec<(String, String)> = vec![
        ("TPM_VAULT_SOCKET".into(), d.socket().display().to_string()),
        ("TPM_VAULT_PKCS11_CONFIG".into(), config.display().to_string()),
    ];
    let vault = p11_sign::measure(&setup.module, KEY_NAME, None, &env, &THREADS, timing.sign)?;
    progress(&format!("C_Sign through the vault module: {}", describe(&vault)));
    let nginx_vault = match &setup.engine {
        Some(engine) => {
            let cert = work.join("vault-cert.pem");
            std::fs::write(&cert, rt.block_on(certificate(d.socket()))?)?;
            let openssl_conf = nginx::openssl_conf(&work.join("openssl-vault.cnf"), engine, &setup.module, false)?;
            let uri = format!("pkcs11:object={KEY_NAME};type=private");
            let key = Key::Engine { uri, openssl_conf, ssl_engine: true };
            let conf = Conf { dir: work.join("nginx-vault"), cert, key, workers: Workers::Forked(WORKERS), env };
            let rate = nginx_rate(&conf, timing.tls).context("nginx with the vault module")?;
            progress(&format!("nginx, vault module: {}", describe_tls(rate)));
            Some(rate)
        }
        None => None,
    };
    d.stop()?;
    let nginx_soft = match &setup.soft {
        Some((key, cert)) => {
            let conf = Conf {
                dir: work.join("nginx-soft"),
                cert: cert.clone(),
                key: Key::File(key.clone()),
                workers: Workers::Forked(WORKERS),
                env: Vec::new(),
            };
            let rate = nginx_rate(&conf, timing.tls).context("nginx with a software key")?;
            progress(&format!("nginx, software key: {}", describe_tls(rate)));
            Some(rate)
        }
        None => None,
    };
    let (tpm2, nginx_tpm2) = match &setup.peer {
        Some(peer) => run_peer(setup, peer, timing, notes, &mut progress)?,
        None => (None, None),
    };
    Ok(P11Round { vault, tpm2, daemon, nginx_vault, nginx_soft, nginx_tpm2 })
}

/// The tpm2-pkcs11 part of a round: `C_Sign`, then nginx with one process (its failure is
/// noted, not fatal: it is the peer's limitation).
fn run_peer(
    setup: &P11Setup,
    peer: &Tpm2Peer,
    timing: P11Timing,
    notes: &mut Vec<String>,
    progress: &mut impl FnMut(&str),
) -> Result<(Option<Vec<SignRate>>, Option<Rate>)> {
    let work = &setup.daemon.work;
    let (sign, nginx) = peer.with_abrmd(|env| {
        let module = Path::new(p11_peer::MODULE);
        let sign = p11_sign::measure(module, p11_peer::KEY, Some(p11_peer::PIN), env, &THREADS, timing.sign)
            .context("C_Sign through tpm2-pkcs11")?;
        let nginx = match (&setup.engine, &peer.cert) {
            (Some(engine), Some(cert)) => {
                let openssl_conf = nginx::openssl_conf(&work.join("openssl-tpm2.cnf"), engine, module, true)?;
                let key = Key::Engine { uri: p11_peer::engine_uri(), openssl_conf, ssl_engine: false };
                let conf = Conf {
                    dir: work.join("nginx-tpm2"),
                    cert: cert.clone(),
                    key,
                    workers: Workers::Single,
                    env: env.to_vec(),
                };
                Some(nginx_rate(&conf, timing.tls))
            }
            _ => None,
        };
        Ok((sign, nginx))
    })?;
    progress(&format!("C_Sign through tpm2-pkcs11: {}", describe(&sign)));
    let nginx = match nginx {
        Some(Ok(rate)) => {
            progress(&format!("nginx, tpm2-pkcs11 (master_process off): {}", describe_tls(rate)));
            Some(rate)
        }
        Some(Err(e)) => {
            let note = format!("nginx with tpm2-pkcs11 failed: {e:#}").replace('\n', " ");
            progress(&note);
            notes.push(note);
            None
        }
        None => None,
    };
    Ok((Some(sign), nginx))
}

fn describe(rates: &[SignRate]) -> String {
    let parts: Vec<String> = rates
        .iter()
        .map(|r| {
            format!(
                "{} thread(s) {}/s (p50 {} µs)",
                r.threads,
                crate::table::num(r.rate, 0),
                crate::table::num(r.p50_us, 0)
            )
        })
        .collect();
    parts.join(", ")
}

fn describe_tls(r: Rate) -> String {
    format!(
        "{} handshakes/s with 1 client, {} with {CLIENTS}",
        crate::table::num(r.one, 0),
        crate::table::num(r.many, 0)
    )
}
