//! `C_Sign` (CKM_ECDSA over a 32-byte digest, P-256) through a PKCS#11 module, driven with the
//! `cryptoki` crate in a child process of the benchmark (this binary re-run with
//! [`SIGN_FLAG`]): the child loads the module once (one `C_Initialize`, OS locking), then for
//! each thread count opens that many sessions (a user-PIN login on the first one when a PIN is
//! given), finds the private key by `CKA_LABEL`, checks one signature is 64 bytes (r||s) and
//! signs back to back from one thread per session for a warm-up and a window. A child per
//! measurement keeps the module's environment (socket, store, TCTI) and its one load per
//! process apart from the benchmark, and lets the module start from scratch every round.

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
    let exe = std::env::current_exe().context("locating this executable")?;
    let levels: Vec<String> = threads.iter().map(ToString::to_string).collect();
    let out = Command::new(exe)
        .close_inherited_fds()
        .arg(SIGN_FLAG)
        .arg(module)
        .args([label, pin.unwrap_or("-")])
        .args([timing.warmup.as_millis().to_string(), timing.window.as_millis().to_string(), levels.join(",")])
        .envs(env.iter().map(|(k, v)| (k, v)))
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
    Ok(rates)
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
        let (m, back) = run_threads(sessions, timing)?;
        println!("rate {threads} {} {} {}", m.rate(), us(m.p50()), us(m.p99()));
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

/// One thread per session signing back to back; the signatures completed inside the window.
fn run_threads(sessions: Vec<Signer>, timing: Timing) -> Result<(Measurement, Vec<Signer>)> {
    let t0 = Instant::now() + timing.warmup;
    let t1 = t0 + timing.window;
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
    Ok((Measurement::finish(latencies, timing.window, Default::default()), back))
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
}
