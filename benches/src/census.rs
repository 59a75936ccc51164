//! The command census: every operation is run [`Census::ops`] times through a [`Tap`] between
//! the caller and swtpm (no resource manager), which counts the TPM commands each one sends
//! and the time swtpm took to answer them. So the number of TPM commands per operation is
//! measured, not read off the code. Once per run, after the rounds; timed phases never run
//! through the tap (it adds a hop per command). What the same operations cost behind the
//! kernel's resource manager on the device is [`crate::device`]'s.

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
use crate::table::{num, Align, Cell, Table};
use crate::tap::{Tally, Tap};

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

fn us_cell(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{} ms", num(us / 1e3, 1))
    } else if us >= 1_000.0 {
        format!("{} ms", num(us / 1e3, 2))
    } else {
        format!("{} µs", num(us, 0))
    }
}

/// The census section of the report.
pub fn markdown(census: Option<&Census>) -> String {
    let mut out = String::new();
    match census {
        Some(c) => census_table(&mut out, c),
        None => out.push_str("## TPM commands per operation\n\nNot run.\n\n"),
    }
    out
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
