//! `C_Sign` (CKM_ECDSA over a 32-byte digest, P-256) through a PKCS#11 module, driven with the
//! `cryptoki` crate in a child process of the benchmark (this binary re-run with
//! [`SIGN_FLAG`]): the child loads the module once (one `C_Initialize`, OS locking), then for
//! each thread count opens that many sessions (a user-PIN login on the first one when a PIN is
//! given), finds the private key by `CKA_LABEL`, checks one signature is 64 bytes (r||s) and
//! signs back to back from one thread per session for a warm-up and a window. A child per
//! measurement keeps the module's environment (socket, store, TCTI) and its one load per
//! process apart from the benchmark, and lets the module start from scratch every round.
//!
//! Behind the TPM device model ([`measure_on_model`]), the child also reads the model's
//! command counters (its stats port) at the start and the end of each window, so the TPM
//! commands per signature are those of the window's signatures only, not of the module's
//! start, login and key lookup.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{ensure, Context as _, Result};
use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::types::AuthPin;

use crate::sign::{Timing, DIGEST};
use crate::stats::Measurement;

/// Environment variable that gives the child the device model's stats port.
const MODEL_STATS_PORT: &str = "TPM_VAULT_BENCH_MODEL_STATS_PORT";

/// First argument of the child: `SIGN_FLAG MODULE LABEL PIN WARMUP_MS WINDOW_MS THREADS,...`
/// (`PIN` `-` for no login).
pub const SIGN_FLAG: &str = "--pkcs11-sign-child";

/// Signing rate and latency of one thread count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignRate {
    /// Threads (= sessions).
    pub threads: usize,
    /// Signatures per second, all threads together.
    pub rate: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th-percentile latency, µs.
    pub p99_us: f64,
}

/// The TPM commands of one window's signatures, read from the device model's counters.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    /// Threads (= sessions).
    pub threads: usize,
    /// Signatures completed inside the window.
    pub signs: u64,
    /// Commands that reached the TPM during the window, by command name.
    pub commands: BTreeMap<String, u64>,
    /// Milliseconds the TPM was held for them.
    pub busy_ms: f64,
}

/// Runs the child for `module` at each of `threads` with `env`; returns its rates.
///
/// # Errors
/// When the child fails (with its output) or prints something else.
pub fn measure(
    module: &Path,
    label: &str,
    pin: Option<&str>,
    env: &[(String, String)],
    threads: &[usize],
    timing: Timing,
) -> Result<Vec<SignRate>> {
    measure_on_model(module, label, pin, env, threads, timing, None).map(|(rates, _)| rates)
}

/// [`measure`], and with `model_stats` (a device model's stats port) the TPM commands of
/// each window.
///
/// # Errors
/// As [`measure`]; also when the child could not read the model's counters.
pub fn measure_on_model(
    module: &Path,
    label: &str,
    pin: Option<&str>,
    env: &[(String, String)],
    threads: &[usize],
    timing: Timing,
    model_stats: Option<u16>,
) -> Result<(Vec<SignRate>, Vec<Counted>)> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let levels: Vec<String> = threads.iter().map(ToString::to_string).collect();
    let out = Command::new(exe)
        .close_inherited_fds()
        .arg(SIGN_FLAG)
        .arg(module)
        .args([label, pin.unwrap_or("-")])
        .args([timing.warmup.as_millis().to_string(), timing.window.as_millis().to_string(), levels.join(",")])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .envs(model_stats.map(|port| (MODEL_STATS_PORT, port.to_string())))
        .stdin(Stdio::null())
        .output()
        .context("running the PKCS#11 signing child")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "PKCS#11 signing with {} failed ({}): {}{}",
        module.display(),
        out.status,
        text.trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let rates: Vec<SignRate> = text.lines().filter_map(parse_line).collect();
    ensure!(rates.len() == threads.len(), "unexpected output of the PKCS#11 signing child: {text}");
    let counted: Vec<Counted> = text.lines().filter_map(parse_counted).collect();
    ensure!(
        model_stats.is_none() || counted.len() == threads.len(),
        "the PKCS#11 signing child did not count the model's commands: {text}"
    );
    Ok((rates, counted))
}

/// `model THREADS SIGNS BUSY_MS {"Sign": N, ...}`.
fn parse_counted(line: &str) -> Option<Counted> {
    let mut f = line.strip_prefix("model ")?.splitn(4, ' ');
    let threads = f.next()?.parse().ok()?;
    let signs = f.next()?.parse().ok()?;
    let busy_ms = f.next()?.parse().ok()?;
    let commands = serde_json::from_str(f.next()?).ok()?;
    Some(Counted { threads, signs, commands, busy_ms })
}

/// `rate THREADS RATE P50_US P99_US`.
fn parse_line(line: &str) -> Option<SignRate> {
    let mut f = line.strip_prefix("rate ")?.split_whitespace();
    let threads = f.next()?.parse().ok()?;
    let mut next = || f.next().and_then(|v| v.parse::<f64>().ok());
    Some(SignRate { threads, rate: next()?, p50_us: next()?, p99_us: next()? })
}

/// The child's main: see [`SIGN_FLAG`]; prints one `rate` line per thread count.
///
/// # Errors
/// Bad arguments, any PKCS#11 failure.
pub fn child(args: &[OsString]) -> Result<()> {
    let arg = |i: usize| args.get(i).and_then(|a| a.to_str()).with_context(|| format!("{SIGN_FLAG}: argument {i}"));
    let (module, label, pin) = (arg(0)?, arg(1)?, arg(2)?);
    let ms = |i: usize| -> Result<Duration> { Ok(Duration::from_millis(arg(i)?.parse()?)) };
    let timing = Timing { warmup: ms(3)?, window: ms(4)? };
    let levels: Vec<usize> = arg(5)?.split(',').map(str::parse).collect::<Result<_, _>>()?;
    let pin = (pin != "-").then(|| AuthPin::new(pin.into()));
    let model = match std::env::var(MODEL_STATS_PORT) {
        Ok(port) => Some(port.parse::<u16>().with_context(|| format!("{MODEL_STATS_PORT}={port}"))?),
        Err(_) => None,
    };
    let ctx = Pkcs11::new(module).with_context(|| format!("loading {module}"))?;
    ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)).context("C_Initialize")?;
    let slot = *ctx.get_slots_with_token().context("C_GetSlotList")?.first().context("no slot with a token")?;
    // The first session holds the login (shared by every session of the token) all along.
    let first = ctx.open_ro_session(slot).context("C_OpenSession")?;
    if let Some(pin) = &pin {
        first.login(UserType::User, Some(pin)).context("C_Login")?;
    }
    let mut first = Some(first);
    for threads in levels {
        let mut sessions = Vec::with_capacity(threads);
        for _ in 0..threads {
            let session = match first.take() {
                Some(s) => s,
                None => ctx.open_ro_session(slot).context("C_OpenSession")?,
            };
            let key = find_key(&session, label)?;
            let sig = session.sign(&Mechanism::Ecdsa, key, &DIGEST).context("C_Sign")?;
            ensure!(sig.len() == 64, "C_Sign returned {} bytes, not r||s (64)", sig.len());
            sessions.push((session, key));
        }
        let Window { m, back, commands } = run_threads(sessions, timing, model)?;
        println!("rate {threads} {} {} {}", m.rate(), us(m.p50()), us(m.p99()));
        if let Some((commands, busy_ms)) = commands {
            println!("model {threads} {} {busy_ms} {}", m.latencies.len(), serde_json::to_string(&commands)?);
        }
        // Keep the logged-in session for the next level; the others close here.
        first = back.into_iter().next().map(|(s, _)| s);
    }
    Ok(())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The private key labelled `label`.
fn find_key(session: &Session, label: &str) -> Result<ObjectHandle> {
    let template = [Attribute::Class(ObjectClass::PRIVATE_KEY), Attribute::Label(label.as_bytes().to_vec())];
    let found = session.find_objects(&template).context("C_FindObjects")?;
    found.first().copied().with_context(|| format!("no private key labelled {label:?} on the token"))
}

/// A session and the key it signs with.
type Signer = (Session, ObjectHandle);

/// The device model's command counts by name now (all spaces together), and the
/// milliseconds the TPM was held for them.
fn model_counts(stats_port: u16) -> Result<(BTreeMap<String, u64>, f64)> {
    let stats = tpm_vault_tpm_model::query(stats_port, "stats").context("reading the device model's counters")?;
    let tpm = stats.get("tpm").and_then(|t| t.as_object()).context("the model's stats have no \"tpm\" counts")?;
    let busy = stats.get("tpm_busy_ms").and_then(|b| b.as_f64()).context("the model's stats have no busy time")?;
    Ok((tpm.iter().filter_map(|(name, n)| Some((name.clone(), n.as_u64()?))).collect(), busy))
}

/// `after - before`, by name, leaving out what did not grow.
pub fn counts_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(name, &n)| {
            let d = n.saturating_sub(before.get(name).copied().unwrap_or(0));
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}

/// What [`run_threads`] gives back.
struct Window {
    /// The signatures completed inside the window.
    m: Measurement,
    /// The sessions, for the next level.
    back: Vec<Signer>,
    /// TPM commands during the window and the milliseconds the TPM was held for them, when
    /// counted on a device model.
    commands: Option<(BTreeMap<String, u64>, f64)>,
}

/// One thread per session signing back to back; the signatures completed inside the window,
/// and with `model` (a device model's stats port) the TPM commands sent during it.
fn run_threads(sessions: Vec<Signer>, timing: Timing, model: Option<u16>) -> Result<Window> {
    let t0 = Instant::now() + timing.warmup;
    let t1 = t0 + timing.window;
    let counter = model.map(|port| {
        std::thread::spawn(move || -> Result<(BTreeMap<String, u64>, f64)> {
            std::thread::sleep(t0.saturating_duration_since(Instant::now()));
            let (before, busy_before) = model_counts(port)?;
            std::thread::sleep(t1.saturating_duration_since(Instant::now()));
            let (after, busy_after) = model_counts(port)?;
            Ok((counts_between(&before, &after), busy_after - busy_before))
        })
    });
    let results: Vec<Result<(Vec<Duration>, Signer)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .into_iter()
            .map(|(session, key)| {
                scope.spawn(move || -> Result<(Vec<Duration>, Signer)> {
                    let mut latencies = Vec::new();
                    loop {
                        let start = Instant::now();
                        if start >= t1 {
                            break;
                        }
                        session.sign(&Mechanism::Ecdsa, key, &DIGEST).context("C_Sign")?;
                        let end = Instant::now();
                        if end >= t0 && end <= t1 {
                            latencies.push(end - start);
                        }
                    }
                    Ok((latencies, (session, key)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("signing thread panicked"))))
            .collect()
    });
    let mut latencies = Vec::new();
    let mut back = Vec::new();
    for r in results {
        let (l, s) = r?;
        latencies.extend(l);
        back.push(s);
    }
    let commands = match counter {
        Some(c) => Some(c.join().map_err(|_| anyhow::anyhow!("model counter thread panicked"))??),
        None => None,
    };
    Ok(Window { m: Measurement::finish(latencies, timing.window, Default::default()), back, commands })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_lines_parse() {
        assert_eq!(
            parse_line("rate 16 1234.5 900 2000"),
            Some(SignRate { threads: 16, rate: 1234.5, p50_us: 900.0, p99_us: 2000.0 })
        );
        assert_eq!(parse_line("noise"), None);
        assert_eq!(parse_line("rate x 1 2 3"), None);
    }

    #[test]
    fn model_lines_parse() {
        let c = parse_counted(r#"model 4 88 4012.5 {"ContextLoad":176,"Sign":88}"#).unwrap();
        assert_eq!((c.threads, c.signs, c.busy_ms), (4, 88, 4012.5));
        assert_eq!(c.commands.get("ContextLoad"), Some(&176));
        assert_eq!(parse_counted("model 4 x {}"), None);
        let before = [("Sign".to_owned(), 3), ("ContextLoad".to_owned(), 5)].into();
        let after = [("Sign".to_owned(), 7), ("ContextLoad".to_owned(), 5), ("Load".to_owned(), 1)].into();
        let d = counts_between(&before, &after);
        assert_eq!(d, [("Sign".to_owned(), 4), ("Load".to_owned(), 1)].into());
    }
}
