//! `tpm-vault-bench`: measures tpm-vault against the raw TPM and its peers in one run on one
//! swtpm, prints a table and writes `docs/BENCHMARKS.md` plus the chart `docs/bench-sign.svg`.
//!
//! ```sh
//! cargo run --release -p tpm-vault-bench            # full: 3 rounds, 5 s windows (~20 min)
//! cargo run -p tpm-vault-bench -- --quick --out /tmp/b.md   # CI smoke test (~2.5 min)
//! cargo run --release -p tpm-vault-bench -- --device-only   # the device phase alone (~2.5 min)
//! ```
//!
//! A run starts one swtpm, creates the keys (untimed), then repeats rounds of: raw ESAPI →
//! vault library → daemon at 1/4/16/64 clients → tpm2-tools → TLS handshakes (`openssl s_time`
//! against the example server with the vault key, a software-key rustls server and the OpenSSL
//! peers), checking after every phase that nothing was left loaded in the TPM. Modules: [`sign`]
//! the phases, [`tls`] the handshake phase and its report section, [`tls_peers`] its OpenSSL
//! servers (s_server, tpm2-openssl, tpm2-abrmd), [`stats`] measurements
//! and spreads, [`summary`] figures and targets, [`table`] the one table model of the report
//! and its markdown renderer, [`report`] the report's sections and terminal output,
//! [`svg`] the chart, [`procfs`] CPU/RSS from `/proc`, [`machine`] CPU model, date, versions,
//! [`binaries`] the cargo builds of what is measured.
//! After the TLS phase, [`p11`] runs the PKCS#11 module: `C_Sign` at 1 and 16 threads
//! ([`p11_sign`], in a child process) against the daemon's `Sign` RPC of the same round and
//! tpm2-pkcs11 ([`p11_peer`]), and nginx with the key behind each module or in a file
//! ([`nginx`]); [`p11_report`] writes its section and targets.
//!
//! Each round then runs, on shorter windows: [`ops`] quote, seal, unseal and random bytes
//! (raw ESAPI, then a daemon that also runs the encrypt stream of [`bulk`]), [`bulk`] in-core
//! AES-GCM and SHA-256 against `openssl speed`, [`scale`] signing and daemon start with 10,
//! 1,000 and 100,000 stored keys, [`algs`] signing with P-384, RSA-2048/3072 (against raw
//! ESAPI) and the post-quantum keys (against aws-lc-rs in-process), and [`policy`] one
//! access-policy decision. The thread and gRPC round trips under the
//! latency figures are in [`floor`] (the health checks in [`sign::health`]). After the rounds, [`census`] counts the TPM commands of every
//! operation through the [`tap`], and [`device`] measures the vault and raw ESAPI through the TPM
//! device model (`tpm-model/`: the Jetson Orin's fTPM behind the kernel's resource manager), and
//! [`device_tls`] measures TLS handshakes (example server, nginx + the PKCS#11 module) and
//! `C_Sign` against tpm2-pkcs11 on the same model; `tpm-vault-bench --device-tls OUT.md [--quick]`
//! runs that phase alone.
#![forbid(unsafe_code)]

mod agent;
mod algs;
mod binaries;
mod bulk;
mod census;
mod device;
mod device_tls;
mod floor;
mod machine;
mod nginx;
mod ops;
mod p11;
mod p11_peer;
mod p11_report;
mod p11_sign;
mod policy;
mod procfs;
mod report;
mod scale;
mod sign;
mod stats;
mod summary;
mod svg;
mod table;
mod tap;
mod tls;
mod tls_peers;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use tpm_vault_daemon::harness::Swtpm;
use tpm_vault_daemon::model::KeyAlg;

use crate::machine::Machine;
use crate::report::RunInfo;
use crate::sign::tools::{Tools, Variant};
use crate::sign::{actor, daemon, health, raw, tools, Pids, Timing};
use crate::stats::Measurement;
use crate::summary::{Round, Summary};
use crate::table::num;

/// File name of the chart, written next to the markdown report.
const CHART: &str = "bench-sign.svg";
/// Slices raw ESAPI and the library alternate in within a round (full mode), so that both see
/// the same moments of a shared, noisy machine.
const SLICES: usize = 5;
/// Warm-up of each slice (every slice reconnects to the TPM).
const SLICE_WARMUP: Duration = Duration::from_millis(250);
/// Daemon concurrency levels.
const LEVELS: [usize; 4] = [1, 4, 16, 64];
/// Default window of the signing and TLS phases, seconds (10 s until the phases beyond signing
/// were added; 5 s keeps a full run under 10 minutes on 2 cores).
const WINDOW: f64 = 5.0;
/// Window and warm-up of the phases beyond signing (quote, seal, random, bulk, key counts)
/// in a full run: each is a single path with a peer in the same round, so a short window will do.
const SHORT: Timing = Timing { warmup: Duration::from_millis(300), window: Duration::from_secs(2) };
/// The same in quick mode.
const QUICK_SHORT: Timing = Timing { warmup: Duration::from_millis(100), window: Duration::from_millis(300) };
/// Plaintext of the daemon's encrypt stream.
const STREAM_BYTES: u64 = 1 << 30;
/// The same in quick mode.
const QUICK_STREAM_BYTES: u64 = 16 << 20;
/// Operations per row of the TPM command census (quick: 3).
const CENSUS_OPS: u64 = 20;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tpm-vault-bench",
    about = "Benchmarks tpm-vault against raw TPM calls and tpm2-tools on one swtpm; writes \
             docs/BENCHMARKS.md and docs/bench-sign.svg"
)]
struct Args {
    /// Smoke test for CI: one round of 1 s windows. The figures only show that every path works.
    #[arg(long)]
    quick: bool,
    /// Where the markdown report goes; the chart is written beside it as bench-sign.svg
    /// [default: docs/BENCHMARKS.md in the workspace].
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Rounds to run [default: 3, or 1 with --quick].
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Measured window of the signing and TLS phases, in seconds [default: 5, or 1 with --quick];
    /// the other phases use at most 2 s (0.3 s with --quick).
    #[arg(long, value_name = "SECONDS")]
    window: Option<f64>,
    /// tpm-vaultd binary to measure [default: built by cargo with this benchmark's profile,
    /// next to this executable].
    #[arg(long, value_name = "PATH")]
    daemon: Option<PathBuf>,
    /// RUST_LOG filter of the daemon (for investigations; the report says when it is not the
    /// shipped default).
    #[arg(long, value_name = "FILTER", default_value = "info")]
    daemon_rust_log: String,
    /// Run the device phase alone (the vault and raw ESAPI through the TPM device model) and
    /// print its section, or write it to --out.
    #[arg(long)]
    device_only: bool,
}

/// What a run does.
#[derive(Debug, Clone)]
struct Plan {
    quick: bool,
    rounds: usize,
    /// Every phase but raw ESAPI and the library.
    timing: Timing,
    /// Raw ESAPI and the library: `slices` alternating slices of `slice` each per round.
    slices: usize,
    slice: Timing,
    /// The phases beyond signing.
    short: Timing,
    /// Plaintext bytes of the daemon's encrypt stream.
    stream_bytes: u64,
    /// Stored-key counts of the scaling phase.
    counts: Vec<usize>,
    /// Operations per census row.
    census_ops: u64,
    /// The device phase.
    device: device::DevicePlan,
}

impl Plan {
    fn new(args: &Args) -> Result<Self> {
        let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
        ensure!(rounds >= 1, "--rounds must be at least 1");
        let window = args.window.unwrap_or(if args.quick { 1.0 } else { WINDOW });
        ensure!(window.is_finite() && window > 0.0 && window <= 3600.0, "--window must be between 0 and 3600 seconds");
        let warmup = if args.quick { 0.25 } else { 1.0 };
        let timing = Timing { warmup: Duration::from_secs_f64(warmup), window: Duration::from_secs_f64(window) };
        let slices = if args.quick { 1 } else { SLICES };
        let slice = Timing { warmup: SLICE_WARMUP.min(timing.warmup), window: timing.window / slices as u32 };
        let short = if args.quick {
            QUICK_SHORT
        } else {
            Timing { warmup: SHORT.warmup.min(timing.warmup), window: SHORT.window.min(timing.window) }
        };
        Ok(Self {
            quick: args.quick,
            rounds,
            timing,
            slices,
            slice,
            short,
            stream_bytes: if args.quick { QUICK_STREAM_BYTES } else { STREAM_BYTES },
            counts: if args.quick { scale::QUICK_COUNTS.to_vec() } else { scale::COUNTS.to_vec() },
            census_ops: if args.quick { 3 } else { CENSUS_OPS },
            device: device::DevicePlan::new(args.quick),
        })
    }
}

fn main() -> ExitCode {
    // The bare gRPC server of the floor phase: this binary re-run as a child (see `floor`).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // A PKCS#11 module's signing loop: this binary re-run as a child (see `p11_sign`).
    if argv.get(1).is_some_and(|a| a == p11_sign::SIGN_FLAG) {
        return match p11_sign::child(&argv[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tpm-vault-bench: PKCS#11 signing: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // Only the device model's TLS and tpm2-pkcs11 phase (see `device_tls`).
    if argv.get(1).is_some_and(|a| a == device_tls::STANDALONE_FLAG) {
        return match device_tls::standalone(&argv[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tpm-vault-bench: device TLS phase: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if argv.get(1).is_some_and(|a| a == floor::SERVER_FLAG) {
        let Some(socket) = argv.get(2) else {
            eprintln!("tpm-vault-bench: {} needs a socket path", floor::SERVER_FLAG);
            return ExitCode::FAILURE;
        };
        return match floor::serve(Path::new(socket)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tpm-vault-bench: bare gRPC server: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tpm-vault-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The command line as a user would retype it.
fn command_line() -> String {
    let mut cmd = String::from("cargo run");
    if !cfg!(debug_assertions) {
        cmd.push_str(" --release");
    }
    cmd.push_str(" -p tpm-vault-bench");
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.is_empty() {
        cmd.push_str(" --");
        for a in args {
            let plain = !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+".contains(c));
            if plain {
                cmd.push(' ');
                cmd.push_str(&a);
            } else {
                cmd.push_str(&format!(" '{}'", a.replace('\'', r"'\''")));
            }
        }
    }
    cmd
}

fn progress(stage: &str, msg: &str) {
    eprintln!("[{stage}] {msg}");
}

fn describe(m: &Measurement) -> String {
    format!(
        "{}/s, p50 {} µs, p99 {} µs",
        num(m.rate(), 0),
        num(m.p50().as_secs_f64() * 1e6, 0),
        num(m.p99().as_secs_f64() * 1e6, 0)
    )
}

/// Flushes whatever a phase left loaded in the TPM and records it.
fn check_clean(tcti: &str, phase: &str, notes: &mut Vec<String>) -> Result<()> {
    let n = raw::flush_leftovers(tcti).with_context(|| format!("checking the TPM after {phase}"))?;
    if n > 0 {
        warn(
            notes,
            format!("after {phase}, {n} transient object(s) were still loaded in the TPM (flushed by the harness)"),
        );
    }
    Ok(())
}

/// Prints a warning and keeps it for the report's notes.
fn warn(notes: &mut Vec<String>, note: String) {
    eprintln!("warning: {note}");
    notes.push(note);
}

/// `--device-only`: one swtpm, the raw keys, the device phase; its section on stdout or in `--out`.
fn run_device_only(args: &Args) -> Result<()> {
    let plan = Plan::new(args)?;
    let workspace = binaries::workspace_root();
    let mut notes = Vec::new();
    let bin = binaries::daemon(args.daemon.as_deref(), &workspace, &mut notes)?;
    let tmp = tempfile::Builder::new().prefix("tpmvb-").tempdir().context("creating a temporary directory")?;
    let (swtpm, tcti, _) = start_swtpm(tmp.path())?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let key = raw::create_key(&tcti, KeyAlg::EccP256).context("creating the raw ESAPI key")?;
    let ak = ops::create_ak(&tcti).context("creating the raw ESAPI AK")?;
    let (state_dir, work) = (tmp.path().join("state"), tmp.path().join("d"));
    let base = daemon::Setup {
        bin,
        tcti: tcti.clone(),
        state_dir,
        work,
        rust_log: args.daemon_rust_log.clone(),
        args: Vec::new(),
    };
    let setup = device::DeviceSetup::new(&base, &tmp.path().join("v"), swtpm.port(), key, ak)?;
    let load_start = machine::loadavg();
    let dev = device::run(&setup, plan.device, &rt, |m| progress("device", m)).context("device phase")?;
    check_clean(&tcti, "the device phase", &mut notes)?;
    let section = format!(
        "{}Command: `{}`; load average {} at the start, {} at the end.\n",
        device::markdown(Some(&dev)),
        command_line(),
        load_start,
        machine::loadavg()
    );
    match &args.out {
        Some(out) => std::fs::write(out, &section).with_context(|| format!("writing {}", out.display()))?,
        None => println!("{section}"),
    }
    for n in notes {
        eprintln!("note: {n}");
    }
    Ok(())
}

fn run(args: &Args) -> Result<()> {
    if args.device_only {
        return run_device_only(args);
    }
    let started = Instant::now();
    let mut bench = Bench::setup(args)?;
    let measured = bench.rounds()?;
    let ops = bench.plan.census_ops;
    progress("census", &format!("TPM commands per operation ({ops} of each, through a tap)"));
    let setup = bench.more.census(bench.swtpm.port());
    let census = census::census(&setup, ops, bench.swtpm_pid, &bench.rt).context("TPM command census")?;
    check_clean(&bench.tcti, "the census", &mut bench.notes)?;
    let plan = bench.plan.device;
    progress(
        "device",
        &format!("the vault and raw ESAPI through the TPM device model (orin-ftpm ×{}, resource manager)", plan.speed),
    );
    let dev_setup = device::DeviceSetup::new(
        &bench.setup,
        &bench.tmp.path().join("v"),
        bench.swtpm.port(),
        bench.key.clone(),
        bench.more.ops.ak.clone(),
    )?;
    let dev = device::run(&dev_setup, plan, &bench.rt, |m| progress("device", m)).context("device phase")?;
    check_clean(&bench.tcti, "the device phase", &mut bench.notes)?;
    if bench.plan.quick {
        // The smoke test still checks the resource-manager figure the device depends on.
        let commands = dev.commands_per_signature().context("no steady-state signature row")?;
        ensure!(
            device::COMMANDS_GOAL.met(commands),
            "{commands:.2} TPM commands per steady-state signature through the resource-manager model \
             (goal {})",
            device::COMMANDS_GOAL.describe(0)
        );
    }
    progress("device", "TLS handshakes and tpm2-pkcs11 on the device model (orin-ftpm)");
    let device_tls = device_tls::run(&bench.device_tls_setup(), &bench.rt, |m| progress("device TLS", m))
        .context("device model TLS phase")?;
    bench.write_report(args, started, &measured, &census, &dev, &device_tls)
}

/// Everything a run sets up once, before the rounds. Fields drop in this order: swtpm first
/// (as soon as the run is over), the scratch directory last.
struct Bench {
    swtpm: Swtpm,
    p11: Option<p11::P11Setup>,
    more: MoreSetup,
    tls: Option<tls::TlsSetup>,
    setup: daemon::Setup,
    tools: Option<Tools>,
    key: raw::RawKey,
    rt: tokio::runtime::Runtime,
    policy: policy::PolicySetup,
    p11_timing: p11::P11Timing,
    plan: Plan,
    workspace: PathBuf,
    machine: Machine,
    notes: Vec<String>,
    tcti: String,
    swtpm_pid: u32,
    /// Short paths: the daemon's Unix socket lives in here (107-byte limit).
    tmp: tempfile::TempDir,
}

/// What the rounds measured.
struct Measured {
    rounds: Vec<Round>,
    tls: Vec<tls::TlsRound>,
    p11: Vec<p11::P11Round>,
    /// Wall time of the rounds.
    measuring: Duration,
}

/// The signing phases of one round and the floors under them.
struct Signing {
    raw: Measurement,
    actor: Measurement,
    actor_callers: Measurement,
    handoff: Measurement,
    threads: Measurement,
    floor: Measurement,
    daemon: daemon::DaemonRound,
    tools: Vec<(Variant, Measurement)>,
}

impl Signing {
    /// The round, with the phases beyond signing.
    fn round(
        self,
        ops: ops::OpsRound,
        bulk: bulk::BulkRound,
        scale: scale::ScaleRound,
        algs: algs::AlgsRound,
        agent: agent::AgentRound,
        policy: policy::PolicyRound,
    ) -> Round {
        let Self { raw, actor, actor_callers, handoff, threads, floor, daemon, tools } = self;
        Round {
            raw,
            actor,
            actor_callers,
            handoff,
            threads,
            floor,
            daemon,
            tools,
            ops,
            bulk,
            agent,
            scale,
            algs,
            policy,
        }
    }
}

/// The swtpm of a run, its TCTI and pid.
fn start_swtpm(tmp: &Path) -> Result<(Swtpm, String, u32)> {
    let swtpm = Swtpm::start(&tmp.join("swtpm")).context("starting swtpm")?;
    let tcti = swtpm.tcti();
    let swtpm_pid = procfs::read_pid_file(&swtpm.state_dir().join("swtpm.pid"))?;
    progress("setup", &format!("swtpm on {tcti} (pid {swtpm_pid})"));
    Ok((swtpm, tcti, swtpm_pid))
}

/// The TLS phase's set-up, unless openssl is missing.
fn tls_setup(
    workspace: &Path,
    setup: &daemon::Setup,
    tmp: &Path,
    notes: &mut Vec<String>,
) -> Result<Option<tls::TlsSetup>> {
    if !bulk::openssl_available() {
        warn(notes, "openssl is not installed: the TLS handshake phase was skipped".to_owned());
        return Ok(None);
    }
    progress("setup", "building the tls_server example (cargo build -p tpm-vault-client --example tls_server)");
    let example = tls::example_binary(workspace)?;
    let daemon = daemon::Setup { work: tmp.join("t"), ..setup.clone() };
    let (peers, peer_notes) = tls::detect_peers();
    for note in peer_notes {
        warn(notes, note);
    }
    Ok(Some(tls::TlsSetup { daemon, example, peers }))
}

/// A note when the machine was already busy at the start.
fn busy_note(machine: &Machine, notes: &mut Vec<String>) {
    if let Some(load) = machine.load_start.split_whitespace().next().and_then(|l| l.parse::<f64>().ok()) {
        if load > machine.cores.max(1) as f64 {
            notes.push(format!(
                "the machine was busy when the run started (1-minute load average {load} on {} CPUs): \
                 expect noisy figures",
                machine.cores
            ));
        }
    }
}

impl Bench {
    /// Builds what is measured, starts swtpm, creates the keys, sets every phase up.
    fn setup(args: &Args) -> Result<Self> {
        let plan = Plan::new(args)?;
        let workspace = binaries::workspace_root();
        let machine = Machine::detect(&workspace);
        let mut notes = Vec::new();
        let bin = binaries::daemon(args.daemon.as_deref(), &workspace, &mut notes)?;
        let tools_ok = tools::available();
        if !tools_ok {
            warn(&mut notes, "tpm2-tools is not installed (no `tpm2_sign`): its phase was skipped".to_owned());
        }
        let tmp = tempfile::Builder::new().prefix("tpmvb-").tempdir().context("creating a temporary directory")?;
        let (state_dir, work, tools_dir) = (tmp.path().join("state"), tmp.path().join("d"), tmp.path().join("tools"));
        for d in [&work, &tools_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("{}", d.display()))?;
        }
        let (swtpm, tcti, swtpm_pid) = start_swtpm(tmp.path())?;
        let rt =
            tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
        let key = raw::create_key(&tcti, KeyAlg::EccP256).context("creating the raw ESAPI key")?;
        raw::write_blobs(&key, &tools_dir)?;
        rt.block_on(actor::create_key(&state_dir, &tcti))?;
        let tools = if tools_ok {
            Some(Tools::setup(&tcti, &tools_dir, key.spki.clone()).context("tpm2-tools setup")?)
        } else {
            None
        };
        check_clean(&tcti, "setup", &mut notes)?;
        let rust_log = args.daemon_rust_log.clone();
        let setup = daemon::Setup { bin, tcti: tcti.clone(), state_dir, work, rust_log, args: Vec::new() };
        if args.daemon_rust_log != "info" {
            notes.push(format!("the daemon ran with RUST_LOG={}, not its default `info`", args.daemon_rust_log));
        }
        let tls = tls_setup(&workspace, &setup, tmp.path(), &mut notes)?;
        busy_note(&machine, &mut notes);
        let more = MoreSetup::new(&plan, &workspace, &setup, tmp.path(), &key, &rt, &mut notes)?;
        check_clean(&tcti, "setup of the key sets", &mut notes)?;
        progress("setup", "building the PKCS#11 module (cargo build -p tpm-vault-pkcs11) and the tpm2-pkcs11 token");
        let p11_daemon = daemon::Setup { work: tmp.path().join("p"), ..setup.clone() };
        let p11 = p11::P11Setup::new(&workspace, p11_daemon, &mut notes).context("PKCS#11 phase set-up")?;
        check_clean(&tcti, "setup of the PKCS#11 phase", &mut notes)?;
        let p11_timing = p11::P11Timing { sign: if plan.quick { plan.short } else { plan.timing }, tls: plan.timing };
        let policy = policy::PolicySetup::new(&workspace).context("loading the access policies")?;
        Ok(Self {
            swtpm,
            p11,
            more,
            tls,
            setup,
            tools,
            key,
            rt,
            policy,
            p11_timing,
            plan,
            workspace,
            machine,
            notes,
            tcti,
            swtpm_pid,
            tmp,
        })
    }

    /// The rounds.
    fn rounds(&mut self) -> Result<Measured> {
        let n = self.plan.rounds;
        let (mut rounds, mut tls_rounds, mut p11_rounds) = (Vec::new(), Vec::new(), Vec::new());
        let measuring = Instant::now();
        for r in 1..=n {
            let stage = format!("round {r}/{n}");
            let signing = self.signing(r, &stage)?;
            if let Some(t) = &self.tls {
                let raw_rate = signing.raw.rate();
                let on_progress = |msg: &str| progress(&stage, &format!("TLS: {msg}"));
                let tls_r =
                    tls::run(t, r, self.plan.timing, raw_rate, &self.rt, on_progress).context("TLS handshake phase")?;
                tls_rounds.push(tls_r);
                check_clean(&self.tcti, &format!("the TLS phase (round {r})"), &mut self.notes)?;
            }
            if let Some(p) = &self.p11 {
                let rates = signing.daemon.levels.iter().map(|l| (l.clients, l.m.rate())).collect();
                let on_progress = |msg: &str| progress(&stage, &format!("PKCS#11: {msg}"));
                let p11_r = p11::run(p, r, self.p11_timing, rates, &self.rt, &mut self.notes, on_progress)
                    .context("PKCS#11 phase")?;
                p11_rounds.push(p11_r);
                check_clean(&self.tcti, &format!("the PKCS#11 phase (round {r})"), &mut self.notes)?;
            }
            let (ops, bulk, scale, algs, agent) =
                self.more.round(&self.plan, r, self.swtpm_pid, &self.rt, &stage, &mut self.notes)?;
            let pids = Pids { swtpm: self.swtpm_pid, daemon: None };
            let policy = self.policy.run(self.plan.short, pids).context("access-policy phase")?;
            let per = policy.m.p50().as_secs_f64() * 1e9 / policy.batch as f64;
            progress(&stage, &format!("access-policy decision: {} ns ({} rules)", num(per, 0), policy.rules));
            rounds.push(signing.round(ops, bulk, scale, algs, agent, policy));
        }
        Ok(Measured { rounds, tls: tls_rounds, p11: p11_rounds, measuring: measuring.elapsed() })
    }

    /// Raw ESAPI and the library in alternating slices (see [`SLICES`]), the floors, the daemon,
    /// tpm2-tools.
    fn signing(&mut self, r: usize, stage: &str) -> Result<Signing> {
        let (plan, tcti, rt) = (&self.plan, self.tcti.as_str(), &self.rt);
        let pids = Pids { swtpm: self.swtpm_pid, daemon: None };
        let (mut raw_parts, mut actor_parts, mut callers_parts, mut handoff) = (vec![], vec![], vec![], None);
        for k in 1..=plan.slices {
            raw_parts.push(raw::run(tcti, &self.key, plan.slice, pids).context("raw ESAPI phase")?);
            check_clean(tcti, &format!("raw ESAPI (round {r})"), &mut self.notes)?;
            let last = k == plan.slices;
            let a = rt.block_on(actor::run(&self.setup.state_dir, tcti, plan.slice, pids, last));
            let a = a.context("vault library phase")?;
            actor_parts.push(a.sign);
            callers_parts.push(a.callers);
            handoff = a.handoff.or(handoff);
            check_clean(tcti, &format!("vault library (round {r})"), &mut self.notes)?;
        }
        let (raw, actor) = (Measurement::merge(raw_parts), Measurement::merge(actor_parts));
        let actor_callers = Measurement::merge(callers_parts);
        let handoff = handoff.context("no TPM actor hand-off measurement")?;
        progress(stage, &format!("raw ESAPI: {}", describe(&raw)));
        progress(stage, &format!("vault library: {}", describe(&actor)));
        progress(stage, &format!("vault library, {} callers: {}", actor::CALLERS, describe(&actor_callers)));
        progress(stage, &format!("TPM actor hand-off (empty job): {}", describe(&handoff)));
        let threads = floor::thread_round_trip(health::timing(plan.slice), pids).context("thread round trip")?;
        progress(stage, &format!("bare thread round trip: {}", describe(&threads)));
        let daemon = daemon::run(&self.setup, r, &LEVELS, plan.timing, self.swtpm_pid, rt, |msg| {
            progress(stage, &format!("daemon: {msg}"));
        })
        .context("daemon phase")?;
        check_clean(tcti, &format!("the daemon (round {r})"), &mut self.notes)?;
        let server = floor::FloorServer::start(self.tmp.path())?;
        let server_pids = Pids { swtpm: self.swtpm_pid, daemon: Some(server.pid()) };
        let floor = rt.block_on(health::measure(server.socket(), health::timing(plan.timing), server_pids));
        drop(server);
        let floor = floor.context("bare gRPC round trip")?;
        progress(stage, &format!("bare gRPC health check: {}", describe(&floor)));
        let mut tools = Vec::new();
        if let Some(t) = &self.tools {
            for v in Variant::ALL {
                let m = t.run(v, plan.timing, pids).with_context(|| format!("tpm2-tools phase ({})", v.label()))?;
                progress(stage, &format!("{}: {}", v.label(), describe(&m)));
                tools.push((v, m));
            }
            check_clean(tcti, &format!("tpm2-tools (round {r})"), &mut self.notes)?;
        }
        Ok(Signing { raw, actor, actor_callers, handoff, threads, floor, daemon, tools })
    }

    /// What the device model's TLS phase runs with: this run's daemon, example, module and
    /// engine.
    fn device_tls_setup(&self) -> device_tls::DeviceTlsSetup {
        device_tls::DeviceTlsSetup {
            daemon: self.setup.bin.clone(),
            rust_log: self.setup.rust_log.clone(),
            example: self.tls.as_ref().map(|t| t.example.clone()),
            module: self.p11.as_ref().map(|p| p.module.clone()),
            engine: self.p11.as_ref().and_then(|p| p.engine.clone()),
            work: self.tmp.path().join("dt"),
            quick: self.plan.quick,
            timing: device_tls::timing(self.plan.quick),
        }
    }

    /// Writes the markdown report (keeping its hand-written tail) and the chart, prints the table.
    fn write_report(
        &mut self,
        args: &Args,
        started: Instant,
        measured: &Measured,
        census: &census::Census,
        dev: &device::DeviceRun,
        device_tls: &device_tls::DeviceTls,
    ) -> Result<()> {
        let (plan, machine) = (&self.plan, &self.machine);
        let mut summary = Summary::new(&measured.rounds);
        summary.checks.extend(tls::checks(&measured.tls));
        summary.checks.extend(p11_report::checks(&measured.p11));
        summary.checks.extend(device::checks(dev));
        let tls_skipped = self.tls.as_ref().map_or(&[][..], |t| &t.peers.skipped);
        let p11_skipped = self.p11.as_ref().map_or(&[][..], |p| &p.skipped);
        let run = RunInfo {
            command: command_line(),
            quick: plan.quick,
            timing: plan.timing,
            slices: plan.slices,
            slice: plan.slice,
            levels: LEVELS.to_vec(),
            elapsed: started.elapsed(),
            measuring: measured.measuring,
            chart: CHART.into(),
            tools: self.tools.is_some(),
            notes: std::mem::take(&mut self.notes),
            daemon_rust_log: args.daemon_rust_log.clone(),
            load_end: machine::loadavg(),
            tls_section: tls::markdown(&measured.tls, plan.timing, tls_skipped),
            pkcs11_section: p11_report::markdown(&measured.p11, self.p11_timing.sign, self.p11_timing.tls, p11_skipped),
            short: plan.short,
            key_sets: self.more.scale.sets.iter().map(|k| (k.count, k.written_in, k.atomic_write)).collect(),
            key_creation: self.more.key_creation,
            algs_created: self.more.algs.created.clone(),
            device_section: format!(
                "{}{}{}",
                census::markdown(Some(census)),
                device::markdown(Some(dev)),
                device_tls::markdown(device_tls, &command_line())
            ),
        };
        let out = args.out.clone().unwrap_or_else(|| self.workspace.join("docs").join("BENCHMARKS.md"));
        write_files(&out, &run, machine, &summary, plan.quick)?;
        Ok(())
    }
}

/// Prints the table, writes the markdown report at `out` (keeping an existing report's
/// hand-written tail) and the chart beside it.
fn write_files(out: &Path, run: &RunInfo, machine: &Machine, summary: &Summary, quick: bool) -> Result<()> {
    println!("\n{}", report::console(summary));
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let kept = std::fs::read_to_string(out).ok().and_then(|old| report::kept_tail(&old).map(str::to_owned));
    let mut markdown = report::markdown(run, machine, summary);
    if let Some(tail) = kept {
        markdown.push_str(&tail);
    }
    std::fs::write(out, markdown).with_context(|| format!("writing {}", out.display()))?;
    let chart = out.with_file_name(CHART);
    let subtitle = format!(
        "{} · {} ({} CPUs) · {} · {} build{}",
        machine.date,
        machine.cpu_model,
        machine.cores,
        machine.swtpm,
        machine.profile,
        if quick { " · QUICK MODE (smoke test, not representative)" } else { "" }
    );
    std::fs::write(&chart, svg::sign_chart(summary, &subtitle))
        .with_context(|| format!("writing {}", chart.display()))?;
    println!("wrote {} and {} in {} s", out.display(), chart.display(), num(run.elapsed.as_secs_f64(), 0));
    Ok(())
}

/// Set-up of the phases beyond signing: the raw phase's AK, the real keys and the key sets, the
/// daemons' scratch directories.
struct MoreSetup {
    ops: ops::OpsSetup,
    scale: scale::ScaleSetup,
    algs: algs::AlgsSetup,
    /// Mean time of creating one key in the TPM through the library.
    key_creation: Option<Duration>,
    openssl: bool,
}

impl MoreSetup {
    fn new(
        plan: &Plan,
        workspace: &Path,
        setup: &daemon::Setup,
        tmp: &Path,
        key: &raw::RawKey,
        rt: &tokio::runtime::Runtime,
        notes: &mut Vec<String>,
    ) -> Result<Self> {
        let tcti = &setup.tcti;
        progress("setup", "creating the raw AK and the real keys of the key sets");
        let ak = ops::create_ak(tcti).context("creating the raw ESAPI AK")?;
        let key_creation = rt.block_on(scale::create_real_keys(&setup.state_dir, tcti))?;
        let mut sets = Vec::with_capacity(plan.counts.len());
        for &n in &plan.counts {
            let set = scale::KeySet::prepare(&setup.state_dir, &tmp.join("sets"), n)
                .with_context(|| format!("writing the key set of {n} keys"))?;
            progress("setup", &format!("key set of {n} keys written in {:.1} s", set.written_in.as_secs_f64()));
            sets.push(set);
        }
        progress("setup", "creating the P-384, RSA-2048, RSA-3072 and ML-DSA-65 keys");
        let algs = algs::AlgsSetup::new(algs::daemon_setup(setup, &tmp.join("a"))?, rt)?;
        let openssl = bulk::openssl_available();
        if !openssl {
            warn(notes, "openssl is not installed: the bulk-crypto peers (`openssl speed`) were skipped".to_owned());
        }
        let (ops_work, scale_work, cli_work) = (tmp.join("o"), tmp.join("s"), tmp.join("c"));
        for d in [&ops_work, &scale_work, &cli_work] {
            std::fs::create_dir_all(d).with_context(|| format!("{}", d.display()))?;
        }
        progress("setup", "building the CLI (cargo build -p tpm-vault-cli --bin tpm-vault)");
        let binary = binaries::client(workspace, "tpm-vault-cli", &["--bin", "tpm-vault"], Path::new("tpm-vault"))?;
        let cli = bulk::CliSetup::new(binary, &cli_work, plan.stream_bytes)?;
        if !cli.taskset {
            let note = "`taskset` is not installed: the `tpm-vault encrypt`/`decrypt` runs on one CPU were skipped";
            warn(notes, note.to_owned());
        }
        Ok(Self {
            ops: ops::OpsSetup {
                daemon: daemon::Setup { work: ops_work, ..setup.clone() },
                ak,
                key: key.clone(),
                stream_bytes: plan.stream_bytes,
                cli,
            },
            scale: scale::ScaleSetup { daemon: daemon::Setup { work: scale_work, ..setup.clone() }, sets },
            algs,
            key_creation,
            openssl,
        })
    }

    /// One round of quote/seal/random (with the encrypt stream), bulk crypto and key counts.
    fn round(
        &self,
        plan: &Plan,
        r: usize,
        swtpm_pid: u32,
        rt: &tokio::runtime::Runtime,
        stage: &str,
        notes: &mut Vec<String>,
    ) -> Result<(ops::OpsRound, bulk::BulkRound, scale::ScaleRound, algs::AlgsRound, agent::AgentRound)> {
        let tcti = &self.ops.daemon.tcti;
        let (ops_r, streams, agent_r) = ops::run(&self.ops, r, plan.short, swtpm_pid, rt, |m| progress(stage, m))
            .context("quote, seal and random phase")?;
        for l in &agent_r.levels {
            progress(
                stage,
                &format!(
                    "ssh-agent, {} client(s): {} signs/s through the agent, {} through gRPC `Sign`",
                    l.clients,
                    num(l.agent, 0),
                    num(l.grpc, 0)
                ),
            );
        }
        check_clean(tcti, &format!("quote, seal and random (round {r})"), notes)?;
        let pids = Pids { swtpm: swtpm_pid, daemon: None };
        let bulk_r = bulk::run(plan.short, pids, streams, self.openssl).context("bulk crypto phase")?;
        let mib = |b: f64| num(b / (1024.0 * 1024.0), 0);
        progress(
            stage,
            &format!(
                "in-core: AES-256-GCM {} MiB/s, SHA-256 {} MiB/s; openssl: {}",
                mib(bulk_r.aes),
                mib(bulk_r.sha),
                bulk_r.openssl.map_or("skipped".into(), |o| format!(
                    "AES-256-GCM {} MiB/s, SHA-256 {} MiB/s, ECDSA P-256 {} signs/s",
                    mib(o.aes_gcm),
                    mib(o.sha256),
                    num(o.ecdsa_sign, 0)
                ))
            ),
        );
        let scale_r =
            scale::run(&self.scale, r, plan.short, swtpm_pid, rt, |m| progress(stage, &format!("key sets: {m}")))
                .context("key-count phase")?;
        check_clean(tcti, &format!("the key sets (round {r})"), notes)?;
        let algs_r = algs::run(&self.algs, r, plan.short, swtpm_pid, rt).context("key algorithm phase")?;
        progress(stage, &format!("key algorithms: {}", algs::describe(&algs_r)));
        check_clean(tcti, &format!("the key algorithms (round {r})"), notes)?;
        Ok((ops_r, bulk_r, scale_r, algs_r, agent_r))
    }

    /// What the command census needs (its daemon reuses the quote/seal phase's scratch dir).
    fn census(&self, swtpm_port: u16) -> census::CensusSetup {
        census::CensusSetup {
            daemon: self.ops.daemon.clone(),
            swtpm_port,
            key: self.ops.key.clone(),
            ak: self.ops.ak.clone(),
        }
    }
}
