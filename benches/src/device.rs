//! On the device: the vault and raw ESAPI measured through the TPM device model
//! ([`tpm_vault_tpm_model`]) with the `orin-ftpm` profile, the NVIDIA Jetson Orin's OP-TEE
//! firmware TPM behind the Linux kernel's resource manager (`/dev/tpmrm0`), in front of this
//! run's swtpm. Nothing here is projected: every figure is a measurement through the model.
//!
//! - **The model** holds every command that reaches the TPM for the device's published time
//!   (ECDSA P-256 sign 45.1 ms, RSA-2048 private operation 11.9 ms, 0.874 ms the floor of any
//!   command, key generation by type; speed factor 1 in a full run, so the times are the
//!   device's) and runs one command at a time, as a TPM does; its resource manager gives each
//!   client (each open file of `/dev/tpmrm0`) 3 object and 3 session slots and loads every saved
//!   object before, and saves and flushes it after, every command, as `tpm2-space.c` does. It
//!   counts every command that reaches the TPM, the resource manager's own included.
//! - **The vault**: the real `tpm-vaultd` with `--resource-manager kernel`, as on the device,
//!   on a fresh state directory and a fresh space (a new open file) per start: start to ready,
//!   key creation of every algorithm, signatures (P-256 and RSA-2048 at 1 and [`CLIENTS`]
//!   clients, each on its own connection; [`RR_KEYS`] keys round-robin), quote, seal, unseal.
//! - **Raw ESAPI** in this process, through the same model, each client its own space: the
//!   floor. A signer loads its key, flushes the SRK (a loaded object costs every command three
//!   more in a kernel space) and signs: ContextLoad, Sign, ContextSave, FlushContext. Then the
//!   same key made **persistent** (`TPM2_EvictControl`): persistent objects are not the
//!   resource manager's, so a signature is one command; what offering persistent keys would buy.
//!   Round-robin, raw loads each key under the loaded SRK, signs and flushes it; quotes have the
//!   AK loaded (SRK flushed); seal and unseal use the SRK and a salted HMAC session as
//!   [`crate::ops::RawOps`] does (AK flushed); creation keeps the SRK loaded.
//! - **Counting**: per row, the commands that reached the TPM during the counted operations
//!   (single-client rows: exactly, from the first counted operation's start to the last one's
//!   end; several clients: over the window) and the share of that time the TPM was held (*TPM
//!   busy*: what is left is the clients' and the resource manager's gaps between commands).
//! - **Ceilings**: a TPM doing nothing but the signature, back to back: 1 / 45.1 ms for P-256
//!   (and the P-256 AK's quote), 1 / 11.9 ms for RSA-2048 (at the run's speed factor).
//!
//! The verdicts ([`checks`]) are issue #36's goals.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context as _, Result};
use tokio::runtime::Runtime;
use tpm_vault_client::{Client, HashAlgorithm, KeyAlgorithm, SignInput, SignOptions};
use tpm_vault_daemon::formats::{convert, templates, verify};
use tpm_vault_daemon::model::KeyAlg;
use tpm_vault_tpm_model::{Model, ModelBuilder, Profile, Tally, Work};
use tss_esapi::handles::{KeyHandle, ObjectHandle, PersistentTpmHandle};
use tss_esapi::interface_types::dynamic_handles::Persistent;
use tss_esapi::interface_types::resource_handles::Provision;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::structures::{Digest, HashcheckTicket, SignatureScheme};
use tss_esapi::Context;

use crate::ops::{DaemonOps, RawAk, RawOps};
use crate::sign::daemon::{policy_allow_all, Daemon, Setup};
use crate::sign::raw::{self, connect, create_srk, null_hashcheck, RawKey};
use crate::sign::{Timing, DIGEST};
use crate::stats::{CpuUse, Measurement};
use crate::summary::Check;
use crate::table::{num, Align, Cell, Goal, Table};

/// Concurrent clients of the throughput rows.
pub const CLIENTS: usize = 4;
/// Keys of the round-robin rows.
pub const RR_KEYS: usize = 10;
/// Speed factor of a full run: the device's own times.
pub const SPEED: f64 = 1.0;
/// Speed factor of `--quick` (20 times faster than the device).
pub const QUICK_SPEED: f64 = 0.05;
/// Where raw ESAPI makes its key persistent (owner range; the vault's SRK is 0x81000001).
const PERSISTENT_HANDLE: u32 = 0x8100_0F00;

/// TPM commands per steady-state signature (P-256, one client, key in use): the floor for one
/// transient key behind the kernel's resource manager (ContextLoad, Sign, ContextSave,
/// FlushContext).
pub const COMMANDS_GOAL: Goal = Goal::AtMost(4.0);
/// P-256 signatures/s, [`CLIENTS`] clients ÷ the fTPM's ceiling.
pub const P256_GOAL: Goal = Goal::AtLeast(0.93);
/// RSA-2048 signatures/s, [`CLIENTS`] clients ÷ the fTPM's ceiling.
pub const RSA_GOAL: Goal = Goal::AtLeast(0.80);
/// Quotes/s, one client ÷ the ceiling of the quote's signature.
pub const QUOTE_GOAL: Goal = Goal::AtLeast(0.90);
/// Seal and unseal p50 ÷ raw ESAPI's.
pub const SEAL_GOAL: Goal = Goal::AtMost(2.0);
/// Start to ready, seconds (the slowest start of the run).
pub const START_GOAL: Goal = Goal::AtMost(1.0);

/// How the device phase runs.
#[derive(Debug, Clone, Copy)]
pub struct DevicePlan {
    /// The model's speed factor (1: the device's times).
    pub speed: f64,
    /// Warm-up and window of every timed row.
    pub timing: Timing,
    /// Keys created per algorithm (P-256: also the round-robin keys).
    pub creates: usize,
    /// Daemon restarts timed after the first start.
    pub restarts: usize,
}

impl DevicePlan {
    /// A full run's plan, or `--quick`'s: a faster model, short windows, one of each.
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                speed: QUICK_SPEED,
                timing: Timing { warmup: Duration::from_millis(100), window: Duration::from_millis(400) },
                creates: 1,
                restarts: 1,
            }
        } else {
            Self {
                speed: SPEED,
                timing: Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(5) },
                creates: 2,
                restarts: 3,
            }
        }
    }
}

/// What the device phase needs, made on bare swtpm before the model starts.
#[derive(Debug, Clone)]
pub struct DeviceSetup {
    /// The daemon: a fresh state directory, `--resource-manager kernel`; its TCTI is set to a
    /// space of the model at each start.
    pub daemon: Setup,
    /// swtpm's data port.
    pub swtpm_port: u16,
    /// Raw ESAPI's P-256 signing key.
    pub p256: RawKey,
    /// Raw ESAPI's RSA-2048 signing key.
    pub rsa: RawKey,
    /// Raw ESAPI's round-robin keys (P-256).
    pub rr: Vec<RawKey>,
    /// Raw ESAPI's AK.
    pub ak: RawAk,
}

impl DeviceSetup {
    /// Creates raw ESAPI's RSA-2048 and round-robin keys on `base.tcti` (bare swtpm: fast) and
    /// the daemon's set-up under `root`.
    ///
    /// # Errors
    /// TPM and file errors.
    pub fn new(base: &Setup, root: &Path, swtpm_port: u16, p256: RawKey, ak: RawAk) -> Result<Self> {
        let rsa = raw::create_key(&base.tcti, KeyAlg::Rsa2048).context("creating the raw RSA-2048 key")?;
        let rr = (0..RR_KEYS)
            .map(|_| raw::create_key(&base.tcti, KeyAlg::EccP256))
            .collect::<Result<Vec<_>>>()
            .context("creating the raw round-robin keys")?;
        let state_dir = root.join("state");
        std::fs::create_dir_all(root).with_context(|| format!("{}", root.display()))?;
        let daemon = Setup {
            state_dir,
            work: root.to_path_buf(),
            args: vec!["--resource-manager".into(), "kernel".into()],
            ..base.clone()
        };
        Ok(Self { daemon, swtpm_port, p256, rsa, rr, ak })
    }
}

/// An operation of the device phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Signatures of a 32-byte digest in the key's default scheme, key in use.
    Sign(KeyAlg, usize),
    /// P-256 signatures over [`RR_KEYS`] keys in turn, one client.
    RoundRobin,
    /// Quote of sha256:0,7,9 with the P-256 AK.
    Quote,
    /// Seal 32 bytes to sha256:9.
    Seal,
    /// Unseal it.
    Unseal,
    /// Key creation.
    Create(KeyAlg),
    /// Daemon start: spawn until the socket accepts (a fresh space each time).
    Start,
}

impl Op {
    /// Row label.
    pub fn label(self) -> String {
        match self {
            Self::Sign(alg, 1) => format!("sign {alg}, 1 client"),
            Self::Sign(alg, n) => format!("sign {alg}, {n} clients"),
            Self::RoundRobin => format!("sign ecc-p256, {RR_KEYS} keys round-robin, 1 client"),
            Self::Quote => "quote sha256:0,7,9".into(),
            Self::Seal => "seal 32 B to sha256:9".into(),
            Self::Unseal => "unseal".into(),
            Self::Create(alg) => format!("create {alg}"),
            Self::Start => "daemon start to ready".into(),
        }
    }
}

/// Who ran an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// `tpm-vaultd` over its socket.
    Vault,
    /// The same with `--resource-manager none`: what it does on a TPM of its own (transient
    /// SRK, keys and the salted session kept loaded), as it did behind `/dev/tpmrm0` before it
    /// knew the kernel's resource manager.
    VaultUntuned,
    /// Raw ESAPI, transient objects.
    Raw,
    /// Raw ESAPI, the key persistent.
    RawPersistent,
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Self::Vault => "vault",
            Self::VaultUntuned => "vault, `--resource-manager none` (untuned)",
            Self::Raw => "raw ESAPI",
            Self::RawPersistent => "raw ESAPI, key persistent",
        }
    }
}

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    /// The operation.
    pub op: Op,
    /// Who ran it.
    pub who: Who,
    /// Completions in the window and their latencies (creation and start: every one, the
    /// window their sum).
    pub m: Measurement,
    /// Operations the tally covers.
    pub counted: u64,
    /// The commands that reached the TPM over them.
    pub tally: Tally,
    /// Wall time the tally covers.
    pub span: Duration,
}

impl Row {
    /// TPM commands per operation.
    pub fn commands(&self) -> f64 {
        self.tally.commands() as f64 / self.counted.max(1) as f64
    }

    /// Wall time per operation the TPM was not held (single client: the client's, the
    /// daemon's, the TCTI's and the model's forwarding time between commands).
    pub fn gap(&self) -> Duration {
        self.span.saturating_sub(self.tally.time()) / u32::try_from(self.counted.max(1)).unwrap_or(u32::MAX)
    }

    /// Share of the time the TPM was held.
    pub fn busy(&self) -> f64 {
        self.tally.time().as_secs_f64() / self.span.as_secs_f64().max(1e-9)
    }
}

/// What the device phase measured.
#[derive(Debug, Clone)]
pub struct DeviceRun {
    /// The model's profile name and speed factor.
    pub profile: &'static str,
    /// See [`DevicePlan::speed`].
    pub speed: f64,
    /// The plan.
    pub timing: Timing,
    /// Every row, in the order run.
    pub rows: Vec<Row>,
    /// Wall time of the phase.
    pub elapsed: Duration,
}

impl DeviceRun {
    /// The row of `op` run by `who`.
    pub fn row(&self, op: Op, who: Who) -> Option<&Row> {
        self.rows.iter().find(|r| r.op == op && r.who == who)
    }

    /// The ceiling of `op`: the TPM doing nothing but its signature, per second.
    pub fn ceiling(&self, op: Op) -> Option<f64> {
        let p = Profile::orin_ftpm();
        let work = match op {
            Op::Sign(KeyAlg::EccP256, _) | Op::Quote | Op::RoundRobin => Work::EcSign(256),
            Op::Sign(KeyAlg::Rsa2048, _) => Work::RsaPrivate(2048),
            _ => return None,
        };
        Some(1.0 / p.time(work, self.speed).as_secs_f64())
    }

    /// TPM commands per steady-state signature: the vault, P-256, one client.
    pub fn commands_per_signature(&self) -> Option<f64> {
        self.row(Op::Sign(KeyAlg::EccP256, 1), Who::Vault).map(Row::commands)
    }
}

/// A loop's result: the latencies of the counted operations, how many started, and (single
/// client) the commands they sent and the time from the first one's start to the last one's end.
struct Looped {
    latencies: Vec<Duration>,
    started: u64,
    counted: Option<(Tally, Duration)>,
}

/// One client's loop: `op` back to back from now. Alone (`model` given), every operation that
/// starts from `t0` until `t1` counts, with the model's tally from the first one's start to the
/// last one's end (an exact count of their commands), and at least one runs however slow.
/// Beside other clients (`None`), the operations that start and end inside the window count.
struct Counter<'a> {
    t0: Instant,
    t1: Instant,
    model: Option<&'a Model>,
    latencies: Vec<Duration>,
    started: u64,
    first: Option<(Tally, Instant)>,
}

impl<'a> Counter<'a> {
    fn new((t0, t1): (Instant, Instant), model: Option<&'a Model>) -> Self {
        Self { t0, t1, model, latencies: Vec::new(), started: 0, first: None }
    }

    /// Whether to run another operation starting at `start` (and counts it).
    fn begin(&mut self, start: Instant) -> bool {
        let alone = self.model.is_some();
        if start >= self.t1 && (!alone || self.started > 0) {
            return false;
        }
        if start >= self.t0 {
            if self.first.is_none() {
                self.first = self.model.map(|m| (m.total(), start));
            }
            self.started += 1;
        }
        true
    }

    fn end(&mut self, start: Instant, end: Instant) {
        let alone = self.model.is_some();
        if start >= self.t0 && (alone || end <= self.t1) {
            self.latencies.push(end - start);
        }
    }

    fn finish(self) -> Looped {
        let counted = match (self.model, self.first) {
            (Some(m), Some((tally, at))) => Some((m.total().since(&tally), at.elapsed())),
            _ => None,
        };
        Looped { latencies: self.latencies, started: self.started, counted }
    }
}

/// See [`Counter`].
fn run_loop(edges: (Instant, Instant), model: Option<&Model>, mut op: impl FnMut() -> Result<()>) -> Result<Looped> {
    let mut c = Counter::new(edges, model);
    loop {
        let start = Instant::now();
        if !c.begin(start) {
            break;
        }
        op()?;
        c.end(start, Instant::now());
    }
    Ok(c.finish())
}

/// [`run_loop`] for an async operation.
async fn run_loop_async<F, Fut>(edges: (Instant, Instant), model: Option<&Model>, mut op: F) -> Result<Looped>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut c = Counter::new(edges, model);
    loop {
        let start = Instant::now();
        if !c.begin(start) {
            break;
        }
        op().await?;
        c.end(start, Instant::now());
    }
    Ok(c.finish())
}

/// The window of a row starting now.
fn window(timing: Timing) -> (Instant, Instant) {
    let t0 = Instant::now() + timing.warmup;
    (t0, t0 + timing.window)
}

/// A single-client row from its loop: the rate is its operations over the time they took.
fn single(op: Op, who: Who, looped: Looped) -> Result<Row> {
    let (tally, span) = looped.counted.context("no operation started in the window")?;
    let m = Measurement::finish(looped.latencies, span, CpuUse::default());
    Ok(Row { op, who, m, counted: looped.started, tally, span })
}

/// Several clients' loops, counted over the window by a thread of its own (operations in flight
/// at its edges make the count approximate by a few operations).
fn several(
    model: &Model,
    op: Op,
    who: Who,
    timing: Timing,
    (t0, t1): (Instant, Instant),
    run: impl FnOnce() -> Result<Vec<Looped>>,
) -> Result<Row> {
    let (loops, tally) = std::thread::scope(|s| {
        let counter = s.spawn(move || {
            std::thread::sleep(t0.saturating_duration_since(Instant::now()));
            let before = model.total();
            std::thread::sleep(t1.saturating_duration_since(Instant::now()));
            model.total().since(&before)
        });
        let loops = run();
        let tally = counter.join().map_err(|_| anyhow!("the counting thread panicked"));
        (loops, tally)
    });
    let (loops, tally) = (loops?, tally?);
    let started = loops.iter().map(|l| l.started).sum();
    let latencies = loops.into_iter().flat_map(|l| l.latencies).collect();
    let m = Measurement::finish(latencies, timing.window, CpuUse::default());
    Ok(Row { op, who, m, counted: started, tally, span: timing.window })
}

/// A row of one-off operations (creation, start): every latency, the window their sum.
fn one_offs(op: Op, who: Who, latencies: Vec<Duration>, tally: Tally) -> Row {
    let span: Duration = latencies.iter().sum();
    let counted = latencies.len() as u64;
    Row { op, who, m: Measurement::finish(latencies, span, CpuUse::default()), counted, tally, span }
}

/// Raw ESAPI signing with one key: transient (the SRK flushed once the key is loaded, so the
/// space holds the key alone) or persistent.
struct LeanSigner {
    ctx: Context,
    key: KeyHandle,
    persistent: Option<Persistent>,
    digest: Digest,
    ticket: HashcheckTicket,
    scheme: SignatureScheme,
}

impl LeanSigner {
    /// Connects, loads `key` (of `alg`), flushes the SRK, optionally makes the key persistent,
    /// and checks one signature.
    fn open(tcti: &str, key: &RawKey, alg: KeyAlg, persistent: Option<u32>) -> Result<Self> {
        let mut ctx = connect(tcti)?;
        let srk = create_srk(&mut ctx)?;
        let loaded = ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.load(srk, key.private.clone(), key.public.clone()))
            .context("TPM2_Load")?;
        ctx.flush_context(srk.into()).context("flushing the SRK")?;
        let (handle, persistent) = match persistent {
            None => (loaded, None),
            Some(h) => {
                let p = Persistent::Persistent(PersistentTpmHandle::new(h).context("persistent handle")?);
                let obj = ctx
                    .execute_with_session(Some(AuthSession::Password), |c| {
                        c.evict_control(Provision::Owner, loaded.into(), p)
                    })
                    .context("TPM2_EvictControl (making the key persistent)")?;
                ctx.flush_context(loaded.into()).context("flushing the transient key")?;
                (KeyHandle::from(obj), Some(p))
            }
        };
        let mut s = Self {
            ctx,
            key: handle,
            persistent,
            digest: Digest::try_from(DIGEST.to_vec()).context("digest")?,
            ticket: null_hashcheck()?,
            scheme: convert::signature_scheme(alg.default_scheme(), alg.default_hash()),
        };
        let sig = s.signature()?;
        let der = convert::encode_signature(alg, &sig)?;
        let valid = verify::verify_digest(alg, &key.spki, alg.default_scheme(), alg.default_hash(), &DIGEST, &der)?;
        ensure!(valid, "raw ESAPI {alg} signature through the model does not verify");
        Ok(s)
    }

    fn signature(&mut self) -> Result<tss_esapi::structures::Signature> {
        let (key, digest, ticket, scheme) = (self.key, self.digest.clone(), self.ticket.clone(), self.scheme);
        self.ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.sign(key, digest, scheme, ticket))
            .context("TPM2_Sign")
    }

    fn sign(&mut self) -> Result<()> {
        self.signature().map(drop)
    }

    /// Flushes the key, or evicts the persistent one.
    fn close(mut self) -> Result<()> {
        match self.persistent {
            None => self.ctx.flush_context(self.key.into()).context("flushing the key"),
            Some(p) => {
                let key = ObjectHandle::from(self.key);
                self.ctx
                    .execute_with_session(Some(AuthSession::Password), |c| c.evict_control(Provision::Owner, key, p))
                    .map(drop)
                    .context("TPM2_EvictControl (evicting the persistent key)")
            }
        }
    }
}

/// Raw ESAPI over many keys: the SRK loaded, each signature `TPM2_Load` + `TPM2_Sign` +
/// `TPM2_FlushContext` of the next key.
struct RawRoundRobin {
    ctx: Context,
    srk: KeyHandle,
    keys: Vec<RawKey>,
    next: usize,
    digest: Digest,
    scheme: SignatureScheme,
}

impl RawRoundRobin {
    fn open(tcti: &str, keys: &[RawKey]) -> Result<Self> {
        let mut ctx = connect(tcti)?;
        let srk = create_srk(&mut ctx)?;
        Ok(Self {
            ctx,
            srk,
            keys: keys.to_vec(),
            next: 0,
            digest: Digest::try_from(DIGEST.to_vec()).context("digest")?,
            scheme: convert::signature_scheme(KeyAlg::EccP256.default_scheme(), KeyAlg::EccP256.default_hash()),
        })
    }

    fn sign(&mut self) -> Result<()> {
        let key = &self.keys[self.next % self.keys.len()];
        self.next += 1;
        let (srk, public, private) = (self.srk, key.public.clone(), key.private.clone());
        let handle = self
            .ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.load(srk, private, public))
            .context("TPM2_Load")?;
        let (digest, scheme, ticket) = (self.digest.clone(), self.scheme, null_hashcheck()?);
        let signed = self
            .ctx
            .execute_with_session(Some(AuthSession::Password), |c| c.sign(handle, digest, scheme, ticket))
            .context("TPM2_Sign");
        self.ctx.flush_context(handle.into()).context("flushing the key")?;
        signed.map(drop)
    }

    fn close(mut self) -> Result<()> {
        self.ctx.flush_context(self.srk.into()).context("flushing the SRK")
    }
}

/// Raw ESAPI quoting: the AK loaded, the SRK flushed.
fn raw_quoter(tcti: &str, ak: &RawAk) -> Result<(Context, KeyHandle)> {
    let mut ctx = connect(tcti)?;
    let srk = create_srk(&mut ctx)?;
    let handle = ctx
        .execute_with_session(Some(AuthSession::Password), |c| c.load(srk, ak.private.clone(), ak.public.clone()))
        .context("TPM2_Load (AK)")?;
    ctx.flush_context(srk.into()).context("flushing the SRK")?;
    Ok((ctx, handle))
}

/// The algorithms created, with the client's name for them; those with a TPM key template
/// are created by raw ESAPI too.
const CREATED: [KeyAlg; 8] = [
    KeyAlg::EccP256,
    KeyAlg::EccP384,
    KeyAlg::Rsa2048,
    KeyAlg::Rsa3072,
    KeyAlg::MlDsa65,
    KeyAlg::MlKem768,
    KeyAlg::HybridP256MlDsa65,
    KeyAlg::MlDsa44,
];

fn client_alg(alg: KeyAlg) -> KeyAlgorithm {
    alg.api()
}

fn sign_name(alg: KeyAlg) -> String {
    format!("sign-{alg}")
}

fn rr_name(i: usize) -> String {
    format!("rr-{i}")
}

/// One signature of [`DIGEST`] with `name` in its key's default scheme.
async fn vault_sign(client: &Client, name: &str) -> Result<()> {
    let options = SignOptions::new().with_hash(HashAlgorithm::Sha256);
    client
        .sign(name, SignInput::Digest(DIGEST.to_vec()), &options)
        .await
        .map(drop)
        .with_context(|| format!("Sign RPC with {name}"))
}

/// Runs the device phase: raw ESAPI, then the vault, through one model in front of swtpm.
///
/// # Errors
/// Model, TPM, RPC and daemon start/stop errors.
pub fn run(setup: &DeviceSetup, plan: DevicePlan, rt: &Runtime, progress: impl Fn(&str)) -> Result<DeviceRun> {
    let started = Instant::now();
    let profile = Profile::orin_ftpm();
    let name = profile.name;
    let model = ModelBuilder::new(setup.swtpm_port)
        .with_profile(profile)
        .with_speed(plan.speed)
        .build()
        .map_err(|e| anyhow!("starting the TPM device model: {e}"))?;
    let mut rows = raw_rows(setup, plan, &model, &progress)?;
    rows.extend(vault_rows(setup, plan, &model, rt, &progress)?);
    for r in &rows {
        progress(&format!(
            "{} ({}): {}/s, p50 {} ms, {} TPM commands ({}), TPM busy {} %, idle {} per op",
            r.op.label(),
            r.who.label(),
            num(r.m.rate(), 1),
            num(r.m.p50().as_secs_f64() * 1e3, 1),
            num(r.commands(), 2),
            r.tally.describe(r.counted),
            num(r.busy() * 100.0, 0),
            ms(r.gap())
        ));
    }
    Ok(DeviceRun { profile: name, speed: plan.speed, timing: plan.timing, rows, elapsed: started.elapsed() })
}

fn open_space(model: &Model) -> Result<tpm_vault_tpm_model::Endpoint> {
    model.open().map_err(|e| anyhow!("opening a space of the TPM device model: {e}"))
}

/// Raw ESAPI's rows.
fn raw_rows(setup: &DeviceSetup, plan: DevicePlan, model: &Model, progress: &impl Fn(&str)) -> Result<Vec<Row>> {
    let timing = plan.timing;
    let mut rows = Vec::new();
    let space = open_space(model)?;
    let tcti = space.tcti();
    progress("raw ESAPI: signatures");
    for (alg, key) in [(KeyAlg::EccP256, &setup.p256), (KeyAlg::Rsa2048, &setup.rsa)] {
        for (who, persistent) in [(Who::Raw, None), (Who::RawPersistent, Some(PERSISTENT_HANDLE))] {
            let mut signer = LeanSigner::open(&tcti, key, alg, persistent)?;
            let edges = window(timing);
            let looped = run_loop(edges, Some(model), || signer.sign());
            signer.close()?;
            rows.push(single(Op::Sign(alg, 1), who, looped?)?);
        }
        // Several clients, each its own process-like space.
        let spaces = (0..CLIENTS).map(|_| open_space(model)).collect::<Result<Vec<_>>>()?;
        let mut signers = Vec::new();
        for s in &spaces {
            signers.push(LeanSigner::open(&s.tcti(), key, alg, None)?);
        }
        let edges = window(timing);
        let row = several(model, Op::Sign(alg, CLIENTS), Who::Raw, timing, edges, || {
            std::thread::scope(|sc| {
                let handles: Vec<_> = signers
                    .iter_mut()
                    .map(|signer| sc.spawn(move || run_loop(edges, None, || signer.sign())))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().map_err(|_| anyhow!("a raw signing thread panicked"))?)
                    .collect::<Result<Vec<_>>>()
            })
        })?;
        for s in signers {
            s.close()?;
        }
        rows.push(row);
    }
    progress("raw ESAPI: round-robin, quote, seal, unseal, create");
    let mut rr = RawRoundRobin::open(&tcti, &setup.rr)?;
    let edges = window(timing);
    let looped = run_loop(edges, Some(model), || rr.sign());
    rr.close()?;
    rows.push(single(Op::RoundRobin, Who::Raw, looped?)?);

    let (mut ctx, ak) = raw_quoter(&tcti, &setup.ak)?;
    let list = tpm_vault_daemon::formats::pcr::selection_list(
        &tpm_vault_daemon::model::PcrSelection::new(tpm_vault_daemon::model::PcrBank::Sha256, &[0, 7, 9])
            .context("quote PCRs")?,
    )?;
    let nonce = tss_esapi::structures::Data::try_from(vec![7u8; crate::ops::NONCE_LEN]).context("nonce")?;
    let edges = window(timing);
    let looped = run_loop(edges, Some(model), || {
        let (n, l) = (nonce.clone(), list.clone());
        ctx.execute_with_session(Some(AuthSession::Password), |c| c.quote(ak, n, SignatureScheme::Null, l))
            .map(drop)
            .context("TPM2_Quote")
    });
    ctx.flush_context(ak.into()).context("flushing the AK")?;
    drop(ctx);
    rows.push(single(Op::Quote, Who::Raw, looped?)?);

    let mut ops = RawOps::open(&tcti, &setup.ak, &setup.p256)?;
    ops.flush_ak()?;
    let edges = window(timing);
    let sealed = run_loop(edges, Some(model), || ops.seal().map(drop));
    let sealed = sealed.and_then(|l| single(Op::Seal, Who::Raw, l));
    let edges = window(timing);
    let unsealed = run_loop(edges, Some(model), || ops.unseal().map(drop));
    let unsealed = unsealed.and_then(|l| single(Op::Unseal, Who::Raw, l));
    ops.close()?;
    rows.push(sealed?);
    rows.push(unsealed?);

    let mut ctx = connect(&tcti)?;
    let srk = create_srk(&mut ctx)?;
    for alg in CREATED.into_iter().filter(|a| !a.has_pq()) {
        let template = templates::signing_key(alg, None, false)?;
        let before = model.total();
        let mut latencies = Vec::new();
        for _ in 0..plan.creates {
            let t = Instant::now();
            ctx.execute_with_session(Some(AuthSession::Password), |c| {
                c.create(srk, template.clone(), None, None, None, None)
            })
            .with_context(|| format!("TPM2_Create ({alg})"))?;
            latencies.push(t.elapsed());
        }
        rows.push(one_offs(Op::Create(alg), Who::Raw, latencies, model.total().since(&before)));
    }
    ctx.flush_context(srk.into()).context("flushing the SRK")?;
    Ok(rows)
}

/// A daemon through a fresh space of the model, with the time it took to accept and the
/// commands it sent meanwhile.
fn start_daemon(
    setup: &DeviceSetup,
    model: &Model,
    n: usize,
) -> Result<(Daemon, tpm_vault_tpm_model::Endpoint, Duration, Tally)> {
    let space = open_space(model)?;
    let daemon_setup = Setup { tcti: space.tcti(), ..setup.daemon.clone() };
    let uid = nix::unistd::getuid().as_raw();
    let before = model.total();
    let (daemon, ready) = Daemon::start_with(&daemon_setup, &format!("device-{n}.log"), &policy_allow_all(uid))?;
    Ok((daemon, space, ready, model.total().since(&before)))
}

/// The vault's rows.
fn vault_rows(
    setup: &DeviceSetup,
    plan: DevicePlan,
    model: &Model,
    rt: &Runtime,
    progress: &impl Fn(&str),
) -> Result<Vec<Row>> {
    // First, while the SRK is not yet persistent: the daemon as it ran behind /dev/tpmrm0
    // before it knew the kernel's resource manager (its own state directory).
    progress("vault: untuned (--resource-manager none)");
    let untuned = DeviceSetup {
        daemon: Setup {
            args: vec!["--resource-manager".into(), "none".into()],
            state_dir: setup.daemon.work.join("untuned"),
            ..setup.daemon.clone()
        },
        ..setup.clone()
    };
    let (daemon, space, _, _) = start_daemon(&untuned, model, 99)?;
    let name = sign_name(KeyAlg::EccP256);
    let signed = rt.block_on(async {
        let client = Client::connect(daemon.socket()).await.context("connecting to the daemon")?;
        client.create_key(&name, KeyAlgorithm::EccP256, None).await.context("CreateKey")?;
        // A seal opens the salted session, which this mode keeps for the next secret.
        let options = tpm_vault_client::SealOptions::new().with_overwrite(true);
        client.seal("untuned", &[7; 32], &options).await.context("Seal RPC")?;
        run_loop_async(window(plan.timing), Some(model), || vault_sign(&client, &name)).await
    });
    let signed = match signed {
        Ok(l) => l,
        Err(e) => return Err(e.context(format!("daemon log:\n{}", daemon.log_tail()))),
    };
    daemon.stop()?;
    drop(space);
    let untuned_row = single(Op::Sign(KeyAlg::EccP256, 1), Who::VaultUntuned, signed)?;
    progress("vault: start, create");
    let (daemon, space, first_ready, first_tally) = start_daemon(setup, model, 0)?;
    let (mut starts, mut start_tally) = (vec![first_ready], first_tally);
    let measured = measure_vault(plan, model, rt, &daemon, progress);
    let measured = match measured {
        Ok(rows) => rows,
        Err(e) => return Err(e.context(format!("daemon log:\n{}", daemon.log_tail()))),
    };
    daemon.stop()?;
    drop(space);
    progress("vault: restarts");
    for n in 1..=plan.restarts {
        let (daemon, space, ready, tally) = start_daemon(setup, model, n)?;
        starts.push(ready);
        start_tally.merge(&tally);
        daemon.stop()?;
        drop(space);
    }
    let mut rows = measured;
    rows.push(one_offs(Op::Start, Who::Vault, starts, start_tally));
    rows.push(untuned_row);
    Ok(rows)
}

fn measure_vault(
    plan: DevicePlan,
    model: &Model,
    rt: &Runtime,
    daemon: &Daemon,
    progress: &impl Fn(&str),
) -> Result<Vec<Row>> {
    let timing = plan.timing;
    let socket = daemon.socket().to_path_buf();
    let client = rt.block_on(Client::connect(&socket)).context("connecting to the daemon")?;
    let mut rows = Vec::new();
    // Creation: the round-robin keys are P-256's samples; every algorithm `creates` times more.
    for alg in CREATED {
        let mut names: Vec<String> = (0..plan.creates).map(|i| format!("new-{alg}-{i}")).collect();
        if alg == KeyAlg::EccP256 {
            names.extend((0..RR_KEYS).map(rr_name));
        }
        if matches!(alg, KeyAlg::EccP256 | KeyAlg::Rsa2048) {
            names.push(sign_name(alg));
        }
        let before = model.total();
        let mut latencies = Vec::new();
        for n in &names {
            let t = Instant::now();
            rt.block_on(client.create_key(n, client_alg(alg), None))
                .with_context(|| format!("CreateKey {n} ({alg})"))?;
            latencies.push(t.elapsed());
        }
        rows.push(one_offs(Op::Create(alg), Who::Vault, latencies, model.total().since(&before)));
    }
    progress("vault: signatures");
    for alg in [KeyAlg::EccP256, KeyAlg::Rsa2048] {
        let name = sign_name(alg);
        let edges = window(timing);
        let looped = rt.block_on(run_loop_async(edges, Some(model), || vault_sign(&client, &name)))?;
        rows.push(single(Op::Sign(alg, 1), Who::Vault, looped)?);
        let clients = rt.block_on(async {
            let mut v = Vec::new();
            for _ in 0..CLIENTS {
                v.push(Client::connect(&socket).await.context("connecting to the daemon")?);
            }
            anyhow::Ok(v)
        })?;
        let edges = window(timing);
        let row = several(model, Op::Sign(alg, CLIENTS), Who::Vault, timing, edges, || {
            rt.block_on(async {
                let mut tasks = tokio::task::JoinSet::new();
                for c in clients {
                    let name = name.clone();
                    tasks.spawn(async move { run_loop_async(edges, None, || vault_sign(&c, &name)).await });
                }
                let mut loops = Vec::new();
                while let Some(r) = tasks.join_next().await {
                    loops.push(r.context("a signing client panicked")??);
                }
                anyhow::Ok(loops)
            })
        })?;
        rows.push(row);
    }
    let names: Vec<String> = (0..RR_KEYS).map(rr_name).collect();
    let mut next = 0usize;
    let edges = window(timing);
    let looped = rt.block_on(run_loop_async(edges, Some(model), || {
        next += 1;
        vault_sign(&client, &names[next % names.len()])
    }))?;
    rows.push(single(Op::RoundRobin, Who::Vault, looped)?);

    progress("vault: quote, seal, unseal");
    let ops = rt.block_on(DaemonOps::connect(&socket))?;
    for op in [Op::Quote, Op::Seal, Op::Unseal] {
        let edges = window(timing);
        let looped = rt.block_on(run_loop_async(edges, Some(model), || async {
            match op {
                Op::Quote => ops.quote().await,
                Op::Seal => ops.seal().await,
                _ => ops.unseal().await,
            }
        }))?;
        rows.push(single(op, Who::Vault, looped)?);
    }
    Ok(rows)
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    format!("{} ms", num(ms, if ms >= 100.0 { 0 } else { 1 }))
}

/// The verdicts against issue #36's goals.
pub fn checks(run: &DeviceRun) -> Vec<Check> {
    let mut out = Vec::new();
    let mut push = |what: String, value: Option<f64>, unit: &'static str, decimals: usize, goal: Goal| {
        if let Some(value) = value {
            out.push(Check { what, value, unit, decimals, goal, suspect: false });
        }
    };
    let at = format!("`{}` ×{} through the resource-manager model", run.profile, num(run.speed, 2));
    push(
        format!("TPM commands per steady-state signature, vault, ecc-p256, 1 client, {at}"),
        run.commands_per_signature(),
        "",
        2,
        COMMANDS_GOAL,
    );
    for (alg, goal) in [(KeyAlg::EccP256, P256_GOAL), (KeyAlg::Rsa2048, RSA_GOAL)] {
        let op = Op::Sign(alg, CLIENTS);
        push(
            format!("vault {alg} signatures/s, {CLIENTS} clients ÷ the fTPM's ceiling for the signature alone, {at}"),
            run.row(op, Who::Vault).zip(run.ceiling(op)).map(|(r, c)| r.m.rate() / c),
            "×",
            2,
            goal,
        );
    }
    push(
        format!("vault quotes/s, 1 client ÷ the ceiling of its signature, {at}"),
        run.row(Op::Quote, Who::Vault).zip(run.ceiling(Op::Quote)).map(|(r, c)| r.m.rate() / c),
        "×",
        2,
        QUOTE_GOAL,
    );
    for op in [Op::Seal, Op::Unseal] {
        let p50 = |who| run.row(op, who).map(|r| r.m.p50().as_secs_f64());
        push(
            format!("vault {} p50 ÷ raw ESAPI p50, {at}", op.label()),
            p50(Who::Vault).zip(p50(Who::Raw)).map(|(v, r)| v / r),
            "×",
            2,
            SEAL_GOAL,
        );
    }
    push(
        format!("daemon start to ready, slowest of the run, {at}"),
        run.row(Op::Start, Who::Vault).and_then(|r| r.m.latencies.last()).map(Duration::as_secs_f64),
        " s",
        2,
        START_GOAL,
    );
    out
}

/// The device section of the report.
pub fn markdown(run: Option<&DeviceRun>) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "## On the device: Jetson Orin fTPM through the kernel's resource manager (device model)\n");
    let Some(run) = run else {
        let _ = writeln!(w, "Not run.\n");
        return out;
    };
    let _ = writeln!(
        w,
        "Measured through the TPM device model (`tpm-model/`) with the `{}` profile at speed ×{} \
         ({}): the Orin's OP-TEE firmware TPM as wolfTPM's published figures through `/dev/tpmrm0` \
         give it (ECDSA P-256 sign 45.1 ms, RSA-2048 private operation 11.9 ms, 0.874 ms the floor \
         of every command, RSA-2048 key generation 736 ms; one command at a time), behind the \
         kernel's resource manager as `tpm2-space.c` runs it (per open file 3 object and 3 session \
         slots, every saved object loaded before and saved and flushed after every command), in \
         front of this run's swtpm. The daemon runs with `--resource-manager kernel`, a fresh space \
         per start; raw ESAPI runs in this process, each client its own space (see \
         `benches/src/device.rs` for what each raw path keeps loaded). *TPM commands* are those \
         that reached the TPM per operation, the resource manager's own included; *TPM busy* is \
         the share of the time the TPM was held, and *TPM idle per op* the rest of the wall time \
         per operation (single client: the gaps between commands, spent by the client, the daemon, \
         the TCTI's TCP connection per command and the model's forwarding; several clients: \
         over the window). The TPM's hold is the profile's time or swtpm's own when that is \
         longer (a loaded machine slows swtpm too). The *ceiling* is the TPM doing nothing but the \
         signature back to back (P-256: 1 / 45.1 ms, the quote's P-256 AK too; RSA-2048: \
         1 / 11.9 ms). Windows: {} s after a {} s warm-up; creation and start: every one timed. \
         The phase took {} s.\n",
        run.profile,
        num(run.speed, 2),
        if (run.speed - 1.0).abs() < 1e-9 {
            "the device's own times"
        } else {
            "scaled: a smoke test, not the device's figures"
        },
        num(run.timing.window.as_secs_f64(), 1),
        num(run.timing.warmup.as_secs_f64(), 1),
        num(run.elapsed.as_secs_f64(), 0),
    );
    let (l, r) = (Align::Left, Align::Right);
    let mut t = Table::new([
        ("operation", l),
        ("who", l),
        ("ops/s", r),
        ("p50", r),
        ("p99", r),
        ("TPM commands per op", l),
        ("TPM busy", r),
        ("TPM idle per op", r),
        ("÷ ceiling", r),
        ("vault ÷ raw ESAPI (ops/s)", r),
    ]);
    for row in &run.rows {
        let ceiling =
            run.ceiling(row.op).map_or(Cell::text("—"), |c| Cell::Text(format!("{}×", num(row.m.rate() / c, 2))));
        let vs_raw = match (row.who, run.row(row.op, Who::Raw)) {
            (Who::Vault, Some(raw)) if raw.m.rate() > 0.0 => {
                Cell::Text(format!("{}×", num(row.m.rate() / raw.m.rate(), 2)))
            }
            _ => Cell::text("—"),
        };
        t.push(vec![
            Cell::Text(row.op.label()),
            Cell::text(row.who.label()),
            Cell::num(row.m.rate(), 1),
            Cell::Text(ms(row.m.p50())),
            Cell::Text(ms(row.m.p99())),
            Cell::Text(format!("{} ({})", num(row.commands(), 2), row.tally.describe(row.counted))),
            Cell::Text(format!("{} %", num(row.busy() * 100.0, 0))),
            Cell::Text(ms(row.gap())),
            ceiling,
            vs_raw,
        ]);
    }
    w.push_str(&t.markdown());
    let _ = writeln!(w);
    let mut v = Table::new([("goal (issue #36)", l), ("measured", r), ("goal", l), ("", l)]);
    for c in checks(run) {
        v.push(vec![
            Cell::Text(c.what.clone()),
            Cell::Text(format!("{}{}", num(c.value, c.decimals), c.unit)),
            Cell::Text(c.goal.describe(2)),
            Cell::Text(format!("**{}**", c.verdict())),
        ]);
    }
    w.push_str(&v.markdown());
    let _ = writeln!(w);
    let one = Op::Sign(KeyAlg::EccP256, 1);
    if let (Some(v), Some(u)) = (run.row(one, Who::Vault), run.row(one, Who::VaultUntuned)) {
        let _ = writeln!(
            w,
            "**What the kernel mode bought** (`resource_manager = \"kernel\"`: the SRK persistent, one \
             key kept, the salted session flushed after use): a P-256 signature, one client, is {} TPM \
             commands ({}) and {} signatures/s; the same daemon with `--resource-manager none` (what \
             it did behind `/dev/tpmrm0` before: a transient SRK, the key and the salted session kept \
             loaded, each saved and restored by the kernel around every command) spends {} ({}) and \
             signs {} a second: {}× the rate for {}× the commands.\n",
            num(v.commands(), 2),
            v.tally.describe(v.counted),
            num(v.m.rate(), 1),
            num(u.commands(), 2),
            u.tally.describe(u.counted),
            num(u.m.rate(), 1),
            num(v.m.rate() / u.m.rate(), 2),
            num(v.commands() / u.commands(), 2),
        );
    }
    if let (Some(t), Some(p)) =
        (run.row(Op::Sign(KeyAlg::EccP256, 1), Who::Raw), run.row(Op::Sign(KeyAlg::EccP256, 1), Who::RawPersistent))
    {
        let rsa = |who| run.row(Op::Sign(KeyAlg::Rsa2048, 1), who).map_or(f64::NAN, |r| r.m.rate());
        let _ = writeln!(
            w,
            "**A persistent key** (raw ESAPI, `TPM2_EvictControl` to {PERSISTENT_HANDLE:#x}): {} TPM \
             command(s) a signature against {} transient, {} against {} P-256 signatures/s ({}×) and \
             {} against {} RSA-2048 ({}×); it costs an NV slot and an NV write when the key is made.\n",
            num(p.commands(), 2),
            num(t.commands(), 2),
            num(p.m.rate(), 1),
            num(t.m.rate(), 1),
            num(p.m.rate() / t.m.rate(), 2),
            num(rsa(Who::RawPersistent), 1),
            num(rsa(Who::Raw), 1),
            num(rsa(Who::RawPersistent) / rsa(Who::Raw), 2),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(op: Op, who: Who, ops: u64, window_ms: u64, commands: u64) -> Row {
        let mut tally = Tally::default();
        for _ in 0..commands {
            tally.add(0x15D, Duration::from_millis(1));
        }
        let latencies = vec![Duration::from_millis(window_ms / ops.max(1)); ops as usize];
        let window = Duration::from_millis(window_ms);
        Row { op, who, m: Measurement::finish(latencies, window, CpuUse::default()), counted: ops, tally, span: window }
    }

    #[test]
    fn verdicts_are_ratios_to_the_ceiling_and_to_raw() {
        let p256 = Op::Sign(KeyAlg::EccP256, CLIENTS);
        let run = DeviceRun {
            profile: "orin-ftpm",
            speed: 1.0,
            timing: Timing { warmup: Duration::ZERO, window: Duration::from_secs(1) },
            rows: vec![
                row(Op::Sign(KeyAlg::EccP256, 1), Who::Vault, 20, 1000, 80),
                // 21 signatures in a second: 21 × 45.1 ms = 0.947 of the ceiling.
                row(p256, Who::Vault, 21, 1000, 84),
                row(Op::Seal, Who::Vault, 10, 1000, 10),
                row(Op::Seal, Who::Raw, 25, 1000, 10),
            ],
            elapsed: Duration::from_secs(4),
        };
        assert_eq!(run.commands_per_signature(), Some(4.0));
        let checks = checks(&run);
        let find = |s: &str| checks.iter().find(|c| c.what.contains(s)).unwrap_or_else(|| panic!("no check {s}"));
        let p = find("ecc-p256 signatures/s");
        assert!((p.value - 21.0 * 0.0451).abs() < 1e-9, "{}", p.value);
        assert_eq!(p.verdict(), "PASS");
        // The vault's seal p50 (100 ms) is 2.5× raw's (40 ms): a miss.
        let s = find("seal");
        assert!((s.value - 2.5).abs() < 1e-9, "{}", s.value);
        assert_eq!(s.verdict(), "MISS");
        assert_eq!(find("commands per steady-state").verdict(), "PASS");
        // Rows not run give no verdict.
        assert!(!checks.iter().any(|c| c.what.contains("RSA") || c.what.contains("start")));
        let md = markdown(Some(&run));
        assert!(md.contains("| sign ecc-p256, 1 client | vault |"), "{md}");
    }
}
