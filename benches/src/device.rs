//! The device model: where the TPM, not the vault, is the limit on an NVIDIA Jetson Orin (fTPM
//! in OP-TEE, Cortex-A78AE) and an NXP i.MX95 (Cortex-A55), computed from this run's figures and
//! the published figures in `shared/seeds/`.
//!
//! Two parts:
//! - **The command census** ([`census`], once per run, after the rounds): every operation is run
//!   [`Census::ops`] times through a [`Tap`] between the caller and swtpm, which counts the TPM
//!   commands each one sends and the time swtpm took to answer them. So the number of TPM
//!   commands per operation is measured, not read off the code. Timed phases never run through
//!   the tap (it adds a hop per command).
//! - **The model** ([`markdown`]): an operation on the device costs its TPM commands at the
//!   device TPM's per-command cost plus the vault's own work (this run's daemon latency minus the
//!   swtpm time of its commands) scaled by the CPU speed ratio; bulk work scales with the device
//!   CPU's crypto speed. Every constant taken from an article is named below with its source;
//!   every other figure comes from this run.

use std::fmt::Write as _;

use anyhow::{ensure, Result};
use tokio::runtime::Runtime;
use tpm_vault_client::Client;

use crate::bulk;
use crate::ops::{DaemonOps, RawAk, RawOps};
use crate::scale::{self, Picker};
use crate::sign::daemon::{policy_allow_all, Daemon, Setup};
use crate::sign::raw::{RawKey, RawSigner};
use crate::sign::{Pids, KEY_NAME};
use crate::stats::{Measurement, Spread};
use crate::summary::Round;
use crate::table::{num, Align, Cell, Table};
use crate::tap::{cc, Tally, Tap};

/// Published figures the model scales to. Each names the article in `shared/seeds/`.
pub mod seeds {
    /// Jetson Orin Nano, Cortex-A78AE, one core: `openssl speed -elapsed` ECDSA P-256 signs/s,
    /// OpenSSL 3.0.2 (seed 000, "TLS 1.3: wolfSSL and OpenSSL").
    pub const ORIN_OPENSSL_ECDSA_SIGN: f64 = 25_041.0;
    /// Orin, wolfSSL 5.9.2 with SP assembly, ECDSA P-256 signs/s (seed 000).
    pub const ORIN_WOLFSSL_ECDSA_SIGN: f64 = 22_582.0;
    /// i.MX95, Cortex-A55 at 1.8 GHz, one core, wolfSSL 5.9.2, ECDSA P-256 signs/s (seed 002).
    pub const IMX95_WOLFSSL_ECDSA_SIGN: f64 = 2_667.0;
    /// Orin, wolfSSL, ML-KEM-768 encapsulations/s (seed 000): NEON-bound code.
    pub const ORIN_WOLFSSL_MLKEM768_ENCAP: f64 = 37_287.0;
    /// i.MX95, wolfSSL, ML-KEM-768 encapsulations/s (seed 002): the same code on the A55.
    pub const IMX95_WOLFSSL_MLKEM768_ENCAP: f64 = 17_112.0;
    /// Orin, `openssl speed -elapsed` AES-128-GCM at 16 KB, MiB/s, OpenSSL 3.0.2 (seed 000).
    pub const ORIN_OPENSSL_AES128_GCM_MIB: f64 = 1_702.7;
    /// Orin, `openssl speed -elapsed` SHA-256 at 16 KB, MiB/s, OpenSSL 3.0.2 (seed 000).
    pub const ORIN_OPENSSL_SHA256_MIB: f64 = 1_035.3;
    /// Orin fTPM random bytes per second: "the fTPM's RNG runs at roughly 2 KB/s" (seed 000).
    pub const FTPM_RNG_BYTES_PER_SEC: f64 = 2_000.0;
}

/// Bytes one `TPM2_GetRandom` returns on the fTPM (assumed: a SHA-256-sized TPM2B_DIGEST, what
/// the daemon asks for per call).
const FTPM_RANDOM_PER_COMMAND: f64 = 32.0;
/// AES-256 runs 14 rounds where AES-128 runs 10 (GHASH is the same): AES-256-GCM is assumed to
/// run at 10/14 of AES-128-GCM, which is pessimistic.
const AES256_OVER_AES128: f64 = 10.0 / 14.0;
/// Encrypt-stream size of the census.
const CENSUS_STREAM: u64 = 4 * 1024 * 1024;

/// A vault operation of the census.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// ECDSA P-256 sign, key loaded.
    Sign,
    /// ECDSA P-256 sign, key not loaded (the daemon rotating over more keys than slots).
    SignCold,
    /// Quote of sha256:0,7,9.
    Quote,
    /// Raw only: PCR_Read + Quote.
    QuoteWithPcrRead,
    /// Seal 32 bytes to sha256:9.
    Seal,
    /// Unseal.
    Unseal,
    /// Random bytes (daemon: 1 MiB; raw: one TPM2_GetRandom).
    Random,
    /// Daemon only: an encrypt stream of [`CENSUS_STREAM`] bytes, data key already unsealed.
    Stream,
}

impl Op {
    /// Row label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Sign => "sign, key loaded",
            Self::SignCold => "sign, key not loaded",
            Self::Quote => "quote sha256:0,7,9",
            Self::QuoteWithPcrRead => "PCR_Read + quote",
            Self::Seal => "seal 32 B to sha256:9",
            Self::Unseal => "unseal",
            Self::Random => "random bytes",
            Self::Stream => "encrypt stream (data key unsealed)",
        }
    }
}

/// Commands counted over `ops` operations.
#[derive(Debug, Clone, Default)]
pub struct Counted {
    /// Operations run.
    pub ops: u64,
    /// What the tap counted.
    pub tally: Tally,
}

impl Counted {
    /// TPM commands per operation.
    pub fn commands(&self) -> f64 {
        self.tally.commands() as f64 / self.ops.max(1) as f64
    }

    /// swtpm's answer time per operation, µs.
    pub fn tpm_us(&self) -> f64 {
        self.tally.tpm_time().as_secs_f64() * 1e6 / self.ops.max(1) as f64
    }

    /// Commands per operation that make the TPM sign (Sign, Quote).
    pub fn signing_commands(&self) -> f64 {
        (self.tally.count(cc::SIGN) + self.tally.count(cc::QUOTE)) as f64 / self.ops.max(1) as f64
    }
}

/// The command census of a run.
#[derive(Debug, Clone, Default)]
pub struct Census {
    /// Operations per row.
    pub ops: u64,
    /// Through the daemon.
    pub daemon: Vec<(Op, Counted)>,
    /// Raw ESAPI in this process.
    pub raw: Vec<(Op, Counted)>,
    /// Daemon start (spawn until the socket accepts).
    pub start: Tally,
    /// Daemon stop (SIGTERM until exit).
    pub stop: Tally,
}

impl Census {
    /// The daemon's row for `op`.
    pub fn daemon(&self, op: Op) -> Option<&Counted> {
        self.daemon.iter().find(|(o, _)| *o == op).map(|(_, c)| c)
    }

    /// The raw row for `op`.
    pub fn raw(&self, op: Op) -> Option<&Counted> {
        self.raw.iter().find(|(o, _)| *o == op).map(|(_, c)| c)
    }
}

/// What the census needs.
#[derive(Debug, Clone)]
pub struct CensusSetup {
    /// The daemon on the benchmark's state dir (its TCTI is replaced by the tap's).
    pub daemon: Setup,
    /// swtpm's data port.
    pub swtpm_port: u16,
    /// The raw phase's signing key.
    pub key: RawKey,
    /// The raw phase's AK.
    pub ak: RawAk,
}

/// One untimed operation (first-use costs: loading the AK, making room for a TPM2_Create),
/// then `ops` counted ones.
fn count(tap: &Tap, ops: u64, mut op: impl FnMut() -> Result<()>) -> Result<Counted> {
    op()?;
    let before = tap.snapshot();
    for _ in 0..ops {
        op()?;
    }
    Ok(Counted { ops, tally: tap.snapshot().since(&before) })
}

/// Like [`count`], for an async operation.
async fn count_async<F, Fut>(tap: &Tap, ops: u64, mut op: F) -> Result<Counted>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    op().await?;
    let before = tap.snapshot();
    for _ in 0..ops {
        op().await?;
    }
    Ok(Counted { ops, tally: tap.snapshot().since(&before) })
}

/// Runs every operation `ops` times through a tap: raw ESAPI first, then a daemon.
///
/// # Errors
/// TPM, RPC and start/stop errors.
pub fn census(setup: &CensusSetup, ops: u64, swtpm_pid: u32, rt: &Runtime) -> Result<Census> {
    let tap = Tap::start(setup.swtpm_port)?;
    let tcti = tap.tcti();
    let mut raw = Vec::new();
    let mut signer = RawSigner::open(&tcti, &setup.key)?;
    raw.push((Op::Sign, count(&tap, ops, || signer.sign())?));
    signer.close()?;
    let mut r = RawOps::open(&tcti, &setup.ak, &setup.key)?;
    raw.push((Op::SignCold, count(&tap, ops, || r.sign_cold())?));
    raw.push((Op::Quote, count(&tap, ops, || r.quote().map(drop))?));
    raw.push((Op::QuoteWithPcrRead, count(&tap, ops, || r.pcr_read_and_quote())?));
    raw.push((Op::Seal, count(&tap, ops, || r.seal().map(drop))?));
    raw.push((Op::Unseal, count(&tap, ops, || r.unseal().map(drop))?));
    raw.push((Op::Random, count(&tap, ops, || r.random().map(drop))?));
    r.close()?;

    let daemon_setup = Setup { tcti, ..setup.daemon.clone() };
    let uid = nix::unistd::getuid().as_raw();
    let before_start = tap.snapshot();
    let (daemon, _) = Daemon::start_with(&daemon_setup, "census.log", &policy_allow_all(uid))?;
    let start = tap.snapshot().since(&before_start);
    let pids = Pids { swtpm: swtpm_pid, daemon: Some(daemon.pid()) };
    let counted = rt.block_on(async {
        let d = DaemonOps::connect(daemon.socket()).await?;
        let client: &Client = d.client();
        let mut rows = Vec::new();
        rows.push((Op::Sign, count_async(&tap, ops, || scale::sign(client, KEY_NAME)).await?));
        let cold: Vec<Vec<String>> = (0..scale::REAL_KEYS).map(|g| vec![scale::real_name(g)]).collect();
        let (mut pick, mut t) = (Picker::new(), 0);
        rows.push((
            Op::SignCold,
            count_async(&tap, ops, || {
                t += 1;
                scale::sign(client, scale::cold_name(&cold, &mut pick, t))
            })
            .await?,
        ));
        rows.push((Op::Quote, count_async(&tap, ops, || d.quote()).await?));
        rows.push((Op::Seal, count_async(&tap, ops, || d.seal()).await?));
        rows.push((Op::Unseal, count_async(&tap, ops, || d.unseal()).await?));
        rows.push((Op::Random, count_async(&tap, ops, || d.random()).await?));
        // The first stream unseals the data key; the second is counted.
        bulk::stream(client, pids, CENSUS_STREAM).await?;
        let before = tap.snapshot();
        bulk::stream(client, pids, CENSUS_STREAM).await?;
        rows.push((Op::Stream, Counted { ops: 1, tally: tap.snapshot().since(&before) }));
        anyhow::Ok(rows)
    });
    let daemon_rows = match counted {
        Ok(rows) => rows,
        Err(e) => return Err(e.context(format!("daemon log:\n{}", daemon.log_tail()))),
    };
    let before_stop = tap.snapshot();
    daemon.stop()?;
    let stop = tap.snapshot().since(&before_stop);
    ensure!(daemon_rows.iter().all(|(_, c)| c.ops > 0), "empty census row");
    Ok(Census { ops, daemon: daemon_rows, raw, start, stop })
}

/// Median over the rounds of `f` (NaN when no round has it).
fn median(rounds: &[Round], f: impl Fn(&Round) -> Option<f64>) -> f64 {
    let v: Vec<f64> = rounds.iter().filter_map(f).collect();
    Spread::of(&v).map_or(f64::NAN, |s| s.median)
}

/// A device the model projects to.
#[derive(Debug, Clone, Copy)]
struct Device {
    name: &'static str,
    /// How many times longer this device's CPU takes for the vault's own (host) work.
    cpu_factor: f64,
    /// One TPM command, µs (world switch into the secure world and the TA).
    command_us: f64,
    /// One ECDSA P-256 signature in software on this device's CPU, µs (inside the TA).
    ecdsa_us: f64,
    /// OpenSSL AES-256-GCM at 16 KiB, MiB/s.
    aes_mib: f64,
    /// OpenSSL SHA-256 at 16 KiB, MiB/s.
    sha_mib: f64,
}

/// One vault operation projected to a device.
#[derive(Debug, Clone, Copy)]
struct Projection {
    tpm_us: f64,
    host_us: f64,
}

impl Projection {
    fn latency_us(self) -> f64 {
        self.tpm_us + self.host_us
    }

    fn tpm_share(self) -> f64 {
        self.tpm_us / self.latency_us()
    }
}

impl Device {
    /// The operation counted in `counted`, whose host side (everything but the TPM) took
    /// `host_us` here.
    fn project(&self, counted: &Counted, host_us: f64) -> Projection {
        let tpm_us = counted.commands() * self.command_us + counted.signing_commands() * self.ecdsa_us;
        Projection { tpm_us, host_us: host_us * self.cpu_factor }
    }
}

/// This run's medians the model uses.
#[derive(Debug, Clone, Copy)]
struct RunFigures {
    openssl_ecdsa: f64,
    openssl_aes: f64,
    openssl_sha: f64,
    aes: f64,
    sha: f64,
    stream: f64,
    random: f64,
    daemon_cpu_ms_per_1000_signs: f64,
}

impl RunFigures {
    fn of(rounds: &[Round], daemon_clients: usize) -> Self {
        let ossl = |f: fn(&bulk::Openssl) -> f64| median(rounds, |r| r.bulk.openssl.as_ref().map(f));
        Self {
            openssl_ecdsa: ossl(|o| o.ecdsa_sign),
            openssl_aes: ossl(|o| o.aes_gcm),
            openssl_sha: ossl(|o| o.sha256),
            aes: median(rounds, |r| Some(r.bulk.aes)),
            sha: median(rounds, |r| Some(r.bulk.sha)),
            stream: median(rounds, |r| Some(r.bulk.streams.daemon.bytes_per_sec())),
            random: median(rounds, |r| Some(r.ops.random_daemon.bytes_per_sec())),
            daemon_cpu_ms_per_1000_signs: median(rounds, |r| {
                let l = r.daemon.levels.iter().find(|l| l.clients == daemon_clients)?;
                Some(l.m.cpu_per_1000(l.m.cpu.daemon?))
            }),
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// The devices, from this run's CPU figure and the seeds.
fn devices(run: &RunFigures) -> [Device; 2] {
    let command_us = FTPM_RANDOM_PER_COMMAND / seeds::FTPM_RNG_BYTES_PER_SEC * 1e6;
    let orin_factor = run.openssl_ecdsa / seeds::ORIN_OPENSSL_ECDSA_SIGN;
    let a55_over_a78 = seeds::ORIN_WOLFSSL_ECDSA_SIGN / seeds::IMX95_WOLFSSL_ECDSA_SIGN;
    let simd = seeds::ORIN_WOLFSSL_MLKEM768_ENCAP / seeds::IMX95_WOLFSSL_MLKEM768_ENCAP;
    let orin_aes = seeds::ORIN_OPENSSL_AES128_GCM_MIB * AES256_OVER_AES128;
    [
        Device {
            name: "Jetson Orin (A78AE, fTPM)",
            cpu_factor: orin_factor,
            command_us,
            ecdsa_us: 1e6 / seeds::ORIN_WOLFSSL_ECDSA_SIGN,
            aes_mib: orin_aes,
            sha_mib: seeds::ORIN_OPENSSL_SHA256_MIB,
        },
        Device {
            name: "i.MX95 (A55, fTPM assumed)",
            cpu_factor: orin_factor * a55_over_a78,
            command_us,
            ecdsa_us: 1e6 / seeds::IMX95_WOLFSSL_ECDSA_SIGN,
            aes_mib: orin_aes / simd,
            sha_mib: seeds::ORIN_OPENSSL_SHA256_MIB / simd,
        },
    ]
}

fn us_cell(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{} ms", num(us / 1e3, 1))
    } else if us >= 1_000.0 {
        format!("{} ms", num(us / 1e3, 2))
    } else {
        format!("{} µs", num(us, 0))
    }
}

/// The census and device-model sections of the report.
pub fn markdown(rounds: &[Round], census: Option<&Census>, daemon_clients: usize) -> String {
    let mut out = String::new();
    let w = &mut out;
    let Some(census) = census else {
        let _ = writeln!(w, "## TPM commands per operation, and the device model\n\nNot run.\n");
        return out;
    };
    census_table(w, census);
    let run = RunFigures::of(rounds, daemon_clients);
    let devs = devices(&run);
    model_inputs(w, &run, &devs);
    let shares = operations_table(w, rounds, census, &devs);
    let capacity = capacity_table(w, census, &run, &devs, daemon_clients);
    bulk_table(w, census, &run, &devs);
    reading(w, &run, &devs, &shares, &capacity);
    out
}

/// The model's inputs: the fTPM command cost, the CPU and bulk-crypto speed factors.
fn model_inputs(w: &mut String, run: &RunFigures, devs: &[Device; 2]) {
    let _ = writeln!(w, "## Device model: Jetson Orin and i.MX95\n");
    let _ = writeln!(
        w,
        "What the figures above become on a device whose TPM is a firmware TPM in OP-TEE, computed \
         from this run and the published figures in `shared/seeds/`. The model: an operation costs \
         its TPM commands (counted above) at the device's per-command cost, plus the vault's own \
         work (host time, below), scaled by how much slower the device's CPU is. Inputs:\n"
    );
    let simd = seeds::ORIN_WOLFSSL_MLKEM768_ENCAP / seeds::IMX95_WOLFSSL_MLKEM768_ENCAP;
    let a55 = seeds::ORIN_WOLFSSL_ECDSA_SIGN / seeds::IMX95_WOLFSSL_ECDSA_SIGN;
    for line in [
        format!(
            "- **One fTPM command: {}** (assumption). The Orin article gives the fTPM's RNG as \
             roughly {} B/s; at {} bytes per `TPM2_GetRandom` that is one command every {} ms: \
             the cost of a world switch into OP-TEE and back through the TA, which every command \
             pays. Commands that sign (`Sign`, `Quote`) add one software ECDSA P-256 signature at \
             the device's speed ({} µs on the A78AE, {} µs on the A55: wolfSSL, {} and {} signs/s \
             in the articles). If the fTPM returned 64 bytes a call, commands would cost twice as \
             long and the TPM's share below would only grow. The seeds give no TPM figure for the \
             i.MX95: the same OP-TEE fTPM cost is assumed there.",
            us_cell(devs[0].command_us),
            num(seeds::FTPM_RNG_BYTES_PER_SEC, 0),
            num(FTPM_RANDOM_PER_COMMAND, 0),
            num(devs[0].command_us / 1e3, 1),
            num(devs[0].ecdsa_us, 0),
            num(devs[1].ecdsa_us, 0),
            num(seeds::ORIN_WOLFSSL_ECDSA_SIGN, 0),
            num(seeds::IMX95_WOLFSSL_ECDSA_SIGN, 0),
        ),
        format!(
            "- **CPU speed.** This machine's `openssl speed -elapsed ecdsap256` gives {} signs/s \
             (median of this run) against {} on the Orin's A78AE (OpenSSL 3.0.2, one core): the \
             vault's own work is assumed {}× slower there. The A55 is {}× slower again (wolfSSL \
             ECDSA P-256 sign, {} vs {} signs/s): {}× this machine.",
            num(run.openssl_ecdsa, 0),
            num(seeds::ORIN_OPENSSL_ECDSA_SIGN, 0),
            num(devs[0].cpu_factor, 2),
            num(a55, 1),
            num(seeds::ORIN_WOLFSSL_ECDSA_SIGN, 0),
            num(seeds::IMX95_WOLFSSL_ECDSA_SIGN, 0),
            num(devs[1].cpu_factor, 1),
        ),
        format!(
            "- **Bulk crypto speed.** Orin OpenSSL AES-128-GCM {} MiB/s and SHA-256 {} MiB/s at 16 KB; \
             AES-256-GCM assumed at 10/14 of AES-128-GCM (rounds): {} MiB/s. The seeds have no AES \
             or SHA figure for the A55: its ARMv8 crypto-extension throughput is assumed {}× below \
             the A78AE's, the ratio of the NEON-bound ML-KEM-768 encapsulation (wolfSSL, {} vs {} /s): \
             AES-256-GCM {} MiB/s, SHA-256 {} MiB/s. The vault's in-core code is assumed to keep \
             the ratio to OpenSSL it has here; the daemon stream's overhead beyond AES scales with \
             the CPU factor.",
            num(seeds::ORIN_OPENSSL_AES128_GCM_MIB, 1),
            num(seeds::ORIN_OPENSSL_SHA256_MIB, 1),
            num(devs[0].aes_mib, 0),
            num(simd, 2),
            num(seeds::ORIN_WOLFSSL_MLKEM768_ENCAP, 0),
            num(seeds::IMX95_WOLFSSL_MLKEM768_ENCAP, 0),
            num(devs[1].aes_mib, 0),
            num(devs[1].sha_mib, 0),
        ),
    ] {
        let _ = writeln!(w, "{line}");
    }
    let _ = writeln!(w);
}

/// The daemon's and raw ESAPI's p50 of one operation (same TPM work, same round), µs, and
/// what the daemon adds (per round, then the median).
fn pair(
    rounds: &[Round],
    daemon: impl Fn(&Round) -> Option<&Measurement>,
    raw: impl Fn(&Round) -> Option<&Measurement>,
) -> (f64, f64, f64) {
    let us = |m: &Measurement| m.p50().as_secs_f64() * 1e6;
    let d = median(rounds, |r| daemon(r).map(us));
    let r = median(rounds, |r| raw(r).map(us));
    let added = median(rounds, |x| Some(us(daemon(x)?) - us(raw(x)?)));
    (d, r, added)
}

/// Per TPM-bound operation: commands, host time, and the projection on each device; returns
/// each operation's projections for the reading.
fn operations_table(
    w: &mut String,
    rounds: &[Round],
    census: &Census,
    devs: &[Device; 2],
) -> Vec<(Op, Projection, Projection)> {
    let ops: [(Op, (f64, f64, f64)); 5] = [
        (Op::Sign, pair(rounds, |r| r.daemon.levels.iter().find(|l| l.clients == 1).map(|l| &l.m), |r| Some(&r.raw))),
        (Op::SignCold, pair(rounds, |r| r.scale.counts.first().map(|c| &c.cold), |r| Some(&r.ops.sign_cold_raw))),
        (Op::Quote, pair(rounds, |r| Some(&r.ops.quote_daemon), |r| Some(&r.ops.quote_raw))),
        (Op::Seal, pair(rounds, |r| Some(&r.ops.seal_daemon), |r| Some(&r.ops.seal_raw))),
        (Op::Unseal, pair(rounds, |r| Some(&r.ops.unseal_daemon), |r| Some(&r.ops.unseal_raw))),
    ];
    let _ = writeln!(
        w,
        "Per operation, one caller. *Host time* is what is not the TPM: raw ESAPI's p50 minus the \
         swtpm time of its commands (the TPM client stack: tpm2-tss marshalling and, for seal and \
         unseal, its session HMACs and parameter encryption, which any TPM client pays), plus \
         what the vault adds (daemon p50 − raw ESAPI p50 doing the same TPM work, per round: \
         gRPC, access check, store, in-core crypto, and for seal the fsync of its record). All \
         host time is scaled by the CPU factor, the fsync too, which overstates the vault's share. \
         The last column is the command cost above which the TPM takes most of the time on each \
         device, so the verdict does not hang on the assumed 16 ms. *swtpm time* is measured \
         through the counting tap, whose forwarding it includes: it overstates swtpm (a loaded \
         sign shows more than raw ESAPI's whole p50), so the raw host part can come out as 0 and \
         the host time is, if anything, understated by up to a few hundred µs per operation, \
         small against a 16 ms fTPM command.\n"
    );
    let (r, l) = (Align::Right, Align::Left);
    let mut t = Table::new([
        ("operation", l),
        ("TPM commands", r),
        ("swtpm time (through the tap)", r),
        ("raw ESAPI p50", r),
        ("daemon p50", r),
        ("vault adds", r),
        (devs[0].name, r),
        ("TPM share", r),
        (devs[1].name, r),
        ("TPM share", r),
        ("TPM is the limit above (Orin / i.MX95)", l),
    ]);
    let mut shares = Vec::new();
    for (op, (daemon_us, raw_us, added_us)) in ops {
        let (Some(c), Some(rc)) = (census.daemon(op), census.raw(op)) else { continue };
        let host = (raw_us - rc.tpm_us()).max(0.0) + added_us.max(0.0);
        let (a, b) = (devs[0].project(c, host), devs[1].project(c, host));
        let even = |p: Projection| us_cell(p.host_us / c.commands().max(1.0));
        let share = |p: Projection| Cell::Text(format!("{} %", num(p.tpm_share() * 100.0, 0)));
        t.push(vec![
            Cell::text(op.label()),
            Cell::num(c.commands(), 0),
            Cell::Text(us_cell(c.tpm_us())),
            Cell::Text(us_cell(raw_us)),
            Cell::Text(us_cell(daemon_us)),
            Cell::Text(us_cell(added_us)),
            Cell::Text(us_cell(a.latency_us())),
            share(a),
            Cell::Text(us_cell(b.latency_us())),
            share(b),
            Cell::Text(format!("{} / {}", even(a), even(b))),
        ]);
        shares.push((op, a, b));
    }
    w.push_str(&t.markdown());
    let _ = writeln!(w);
    shares
}

/// Signing capacity: one TPM against the vault's CPU per signature; returns vault ÷ TPM per
/// device.
fn capacity_table(w: &mut String, census: &Census, run: &RunFigures, devs: &[Device; 2], clients: usize) -> Vec<f64> {
    let Some(c) = census.daemon(Op::Sign) else { return Vec::new() };
    let cpu_ms = run.daemon_cpu_ms_per_1000_signs;
    let _ = writeln!(
        w,
        "**Signing capacity.** A TPM runs one command at a time and a signature with a loaded \
         key takes {} TPM command(s): that bounds the device's signing rate (TPM ceiling). \
         The daemon spent {} ms of CPU per 1,000 signatures in this run ({} clients); scaled \
         by the CPU factor, that is how many signatures one core of the device can serve.\n",
        num(c.commands(), 0),
        num(cpu_ms, 0),
        clients
    );
    let r = Align::Right;
    let mut t = Table::new([
        ("device", Align::Left),
        ("TPM ceiling, signs/s", r),
        ("vault, one core, signs/s", r),
        ("vault ÷ TPM", r),
    ]);
    let mut capacity = Vec::new();
    for d in devs {
        let tpm = 1e6 / d.project(c, 0.0).tpm_us;
        let vault = 1e6 / (cpu_ms * d.cpu_factor);
        capacity.push(vault / tpm);
        let ratio = Cell::Text(format!("{}×", num(vault / tpm, 1)));
        t.push(vec![Cell::text(d.name), Cell::num(tpm, 0), Cell::num(vault, 0), ratio]);
    }
    w.push_str(&t.markdown());
    let _ = writeln!(w);
    capacity
}

/// The vault's in-core AES-GCM on device `d`, bytes/s: its ratio to OpenSSL here, kept.
fn aes_on(run: &RunFigures, d: &Device) -> f64 {
    run.aes / run.openssl_aes * d.aes_mib * MIB
}

/// A daemon path of `rate` bytes/s here on device `d`: per byte, the in-core AES-GCM time plus
/// the rest of this run's per-byte time scaled by the CPU factor.
fn through_daemon(run: &RunFigures, rate: f64, d: &Device) -> f64 {
    let rest = (1.0 / rate - 1.0 / run.aes).max(0.0);
    1.0 / (1.0 / aes_on(run, d) + rest * d.cpu_factor)
}

/// Bulk crypto and random bytes: no TPM involved after the data key is unsealed.
fn bulk_table(w: &mut String, census: &Census, run: &RunFigures, devs: &[Device; 2]) {
    let _ = writeln!(
        w,
        "**Bulk crypto and random bytes** take no TPM command (the census counts {} for a {} MiB \
         encrypt stream and {} for a 1 MiB `GetRandom`), so their limit is the CPU. The vault's \
         in-core code keeps its ratio to OpenSSL; the daemon's stream and `GetRandom` cost, per \
         byte, the in-core AES-GCM time plus the rest of this run's per-byte time scaled by the \
         CPU factor (AES-GCM stands in for the DRBG's AES-CTR).\n",
        census.daemon(Op::Stream).map_or("n/a".into(), |c| num(c.commands(), 0)),
        CENSUS_STREAM / (1024 * 1024),
        census.daemon(Op::Random).map_or("n/a".into(), |c| num(c.commands(), 0)),
    );
    let r = Align::Right;
    let mut t = Table::new([("MiB/s", Align::Left), ("this run", r), (devs[0].name, r), (devs[1].name, r)]);
    let sha_ratio = run.sha / run.openssl_sha;
    type OnDevice<'a> = &'a dyn Fn(&Device) -> f64;
    let rows: [(&str, f64, OnDevice); 5] = [
        ("OpenSSL AES-256-GCM, 16 KiB", run.openssl_aes, &|d: &Device| d.aes_mib * MIB),
        ("vault AES-256-GCM in-core (stream format)", run.aes, &|d: &Device| aes_on(run, d)),
        ("daemon encrypt stream over the socket", run.stream, &|d: &Device| through_daemon(run, run.stream, d)),
        ("vault SHA-256 in-core, 16 KiB", run.sha, &|d: &Device| sha_ratio * d.sha_mib * MIB),
        ("daemon `GetRandom`, 1 MiB requests", run.random, &|d: &Device| through_daemon(run, run.random, d)),
    ];
    for (label, here, on) in rows {
        let (a, b) = (Cell::num(on(&devs[0]) / MIB, 0), Cell::num(on(&devs[1]) / MIB, 0));
        t.push(vec![Cell::text(label), Cell::num(here / MIB, 0), a, b]);
    }
    let rng = num(seeds::FTPM_RNG_BYTES_PER_SEC / MIB, 4);
    t.push(vec![
        Cell::text("fTPM RNG (Orin article), for comparison"),
        Cell::text("—"),
        Cell::Text(rng),
        Cell::text("—"),
    ]);
    w.push_str(&t.markdown());
    let _ = writeln!(w);
}

/// The reading, from the figures above.
fn reading(
    w: &mut String,
    run: &RunFigures,
    devs: &[Device; 2],
    shares: &[(Op, Projection, Projection)],
    capacity: &[f64],
) {
    let range = |f: &dyn Fn(&(Op, Projection, Projection)) -> f64| {
        let v: Vec<f64> = shares.iter().map(f).collect();
        Spread::of(&v).map_or("n/a".into(), |s| format!("{}–{} %", num(s.min * 100.0, 0), num(s.max * 100.0, 0)))
    };
    let vault_bound = |f: &dyn Fn(&(Op, Projection, Projection)) -> f64| -> String {
        let ops: Vec<&str> = shares.iter().filter(|x| f(x) < 0.5).map(|(op, _, _)| op.label()).collect();
        if ops.is_empty() {
            "none".into()
        } else {
            ops.join(", ")
        }
    };
    let random_ratio = through_daemon(run, run.random, &devs[0]) / seeds::FTPM_RNG_BYTES_PER_SEC;
    let _ = writeln!(
        w,
        "Reading: with a {} fTPM command, the TPM takes {} of every TPM-bound operation's time \
         on the Orin and {} on the i.MX95; the operations where the vault's own time is larger \
         are, on the Orin: {}; on the i.MX95: {}. One core's worth of the vault's signing CPU \
         covers {} the fTPM's signing ceiling (Orin, i.MX95). Bulk work never reaches the TPM: on \
         the Orin the daemon's DRBG would serve about {}× the fTPM RNG's rate. These are \
         projections with the stated assumptions, not measurements on the devices; the command \
         counts and the vault's own time are this run's.\n",
        us_cell(devs[0].command_us),
        range(&|(_, a, _)| a.tpm_share()),
        range(&|(_, _, b)| b.tpm_share()),
        vault_bound(&|(_, a, _)| a.tpm_share()),
        vault_bound(&|(_, _, b)| b.tpm_share()),
        capacity.iter().map(|c| format!("{}×", num(*c, 1))).collect::<Vec<_>>().join(" and "),
        num(random_ratio, 0)
    );
}

fn census_table(w: &mut String, census: &Census) {
    let _ = writeln!(w, "## TPM commands per operation\n");
    let _ = writeln!(
        w,
        "Counted at a TCP tap between the caller and swtpm (`benches/src/tap.rs`), after the \
         rounds: each operation once untimed, then {} times counted; raw ESAPI first, then a fresh daemon on the benchmark's \
         state directory. Commands per operation, and the time swtpm took to answer them \
         (loopback included); the tap is not in the timed phases.\n",
        census.ops
    );
    let (l, r) = (Align::Left, Align::Right);
    let mut t = Table::new([
        ("operation", l),
        ("daemon: TPM commands", l),
        ("swtpm time", r),
        ("raw ESAPI: TPM commands", l),
        ("swtpm time", r),
    ]);
    let all = [Op::Sign, Op::SignCold, Op::Quote, Op::QuoteWithPcrRead, Op::Seal, Op::Unseal, Op::Random, Op::Stream];
    for op in all {
        let cells = |c: Option<&Counted>| match c {
            Some(c) => [
                Cell::Text(format!("{} ({})", num(c.commands(), 0), c.tally.describe(c.ops))),
                Cell::Text(us_cell(c.tpm_us())),
            ],
            None => [Cell::text("—"), Cell::text("—")],
        };
        let label = match op {
            Op::Random => format!(
                "random bytes (daemon: a {} MiB `GetRandom`; raw: one `TPM2_GetRandom` of {} B)",
                crate::ops::RANDOM_REQUEST >> 20,
                crate::ops::TPM_RANDOM_REQUEST
            ),
            Op::Stream => format!("encrypt stream of {} MiB (data key unsealed)", CENSUS_STREAM / (1024 * 1024)),
            other => other.label().to_owned(),
        };
        let [d, dt] = cells(census.daemon(op));
        let [rc, rt] = cells(census.raw(op));
        t.push(vec![Cell::Text(label), d, dt, rc, rt]);
    }
    for (what, tally) in [
        ("daemon start (spawn until the socket accepts)", &census.start),
        ("daemon stop (SIGTERM until exit)", &census.stop),
    ] {
        t.push(vec![
            Cell::text(what),
            Cell::Text(format!("{} ({})", num(tally.commands() as f64, 0), tally.describe(1))),
            Cell::Text(us_cell(tally.tpm_time().as_secs_f64() * 1e6)),
            Cell::empty(),
            Cell::empty(),
        ]);
    }
    w.push_str(&t.markdown());
    let _ = writeln!(w);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection_adds_tpm_and_scaled_host_time() {
        let run = RunFigures {
            openssl_ecdsa: seeds::ORIN_OPENSSL_ECDSA_SIGN * 2.0,
            openssl_aes: 1.0,
            openssl_sha: 1.0,
            aes: 1.0,
            sha: 1.0,
            stream: 1.0,
            random: 1.0,
            daemon_cpu_ms_per_1000_signs: 100.0,
        };
        let [orin, imx] = devices(&run);
        assert!((orin.cpu_factor - 2.0).abs() < 1e-9);
        assert!(imx.cpu_factor > orin.cpu_factor);
        assert!((orin.command_us - 16_000.0).abs() < 1e-6);
        // An operation of no TPM command is all host time.
        let c = Counted { ops: 1, tally: Tally::default() };
        let p = orin.project(&c, 100.0);
        assert_eq!(p.tpm_us, 0.0);
        assert!((p.host_us - 200.0).abs() < 1e-9);
        assert_eq!(p.tpm_share(), 0.0);
    }
}
