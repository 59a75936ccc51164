//! The vault library in this process: `Vault::open` + `Vault::sign` from one async caller.
//! Each signature is a job queued to the TPM actor thread (which keeps the key loaded and
//! signs with one `TPM2_Sign`), awaited over a oneshot channel with a deadline, then
//! DER-encoded: exactly what the daemon's Sign RPC does below gRPC. Then the same with
//! [`CALLERS`] concurrent callers, so the next job waits in the actor's queue while the TPM
//! works on one (what the daemon's clients do to the actor, without gRPC).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use tokio::task::JoinSet;
use tpm_vault_daemon::model::{HashAlg, KeyAlg, KeyName, Scheme, SignInput};
use tpm_vault_daemon::SignRequest;
use tpm_vault_daemon::{Vault, VaultConfig};

use super::{timed_async, CpuSnapshot, Pids, Timing, DIGEST, KEY_NAME};
use crate::stats::Measurement;

/// Concurrent callers of the second library measurement.
pub const CALLERS: usize = 2;

/// How long shutdown waits for the actor to flush and close.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Opens the vault at `state_dir` with the daemon's defaults (also the key-set phase's opener).
///
/// # Errors
/// Vault errors.
pub async fn open(state_dir: &Path, tcti: &str) -> Result<Vault> {
    Vault::open(VaultConfig::new(state_dir, tcti))
        .await
        .with_context(|| format!("opening the vault in {}", state_dir.display()))
}

fn key_name() -> Result<KeyName> {
    KeyName::try_from(KEY_NAME).context("key name")
}

fn request() -> SignRequest {
    SignRequest { input: SignInput::Digest(DIGEST.to_vec()), hash: Some(HashAlg::Sha256), scheme: Some(Scheme::Ecdsa) }
}

/// Creates the benchmark key in the vault at `state_dir` (owned by the current user, no
/// password) unless it exists; the daemon phase uses the same state directory.
///
/// # Errors
/// Vault errors.
pub async fn create_key(state_dir: &Path, tcti: &str) -> Result<()> {
    let vault = open(state_dir, tcti).await?;
    let name = key_name()?;
    let result = if vault.key(&name).await.is_ok() {
        Ok(())
    } else {
        let uid = nix::unistd::getuid().as_raw();
        vault.create_key(name, KeyAlg::EccP256, uid, None, None).await.map(drop).context("creating the benchmark key")
    };
    vault.shutdown(SHUTDOWN_GRACE).await;
    result
}

/// What the library phase measured.
#[derive(Debug, Clone)]
pub struct ActorRound {
    /// `Vault::sign` in a loop.
    pub sign: Measurement,
    /// `Vault::sign` in a loop from each of [`CALLERS`] concurrent callers.
    pub callers: Measurement,
    /// Empty jobs through the actor (`TpmHandle::call` with a closure that does nothing): the
    /// cost of the hand-off to the TPM thread and back, without a TPM command. Only when asked.
    pub handoff: Option<Measurement>,
}

/// Opens the vault, checks one signature in-core, signs in a loop from one caller, then from
/// [`CALLERS`], times empty actor jobs if `with_handoff`, shuts the vault down (which flushes
/// its objects and closes the TPM connection).
///
/// # Errors
/// Vault errors, or a signature that does not verify.
pub async fn run(state_dir: &Path, tcti: &str, timing: Timing, pids: Pids, with_handoff: bool) -> Result<ActorRound> {
    let vault = open(state_dir, tcti).await?;
    let result = async {
        let sign = measure(&vault, timing, pids).await?;
        let callers = concurrent(&vault, CALLERS, timing, pids).await?;
        let handoff = if with_handoff { Some(handoff(&vault, timing, pids).await?) } else { None };
        Ok(ActorRound { sign, callers, handoff })
    }
    .await;
    vault.shutdown(SHUTDOWN_GRACE).await;
    result
}

/// Empty jobs for a tenth of the window (at least 0.2 s).
async fn handoff(vault: &Vault, timing: Timing, pids: Pids) -> Result<Measurement> {
    let short =
        Timing { warmup: Duration::from_millis(50), window: (timing.window / 10).max(Duration::from_millis(200)) };
    timed_async(short, pids, || async {
        vault
            .tpm()
            .call(tpm_vault_daemon::ClientKey::DAEMON, "bench-noop", |_tpm| Ok(()))
            .await
            .map_err(anyhow::Error::from)
    })
    .await
}

async fn measure(vault: &Vault, timing: Timing, pids: Pids) -> Result<Measurement> {
    let name = key_name()?;
    let first = vault.sign(&name, request(), None).await?;
    let valid = vault
        .verify(&name, SignInput::Digest(DIGEST.to_vec()), &first.signature, Some(HashAlg::Sha256), Some(Scheme::Ecdsa))
        .await?;
    ensure!(valid, "vault signature does not verify");
    timed_async(timing, pids, || async {
        vault.sign(&name, request(), None).await.map(drop).map_err(anyhow::Error::from)
    })
    .await
}

/// `callers` tasks signing back to back on `vault` at once; every signature that completes
/// inside the window counts, with its latency as its caller saw it.
async fn concurrent(vault: &Vault, callers: usize, timing: Timing, pids: Pids) -> Result<Measurement> {
    let name = key_name()?;
    CpuSnapshot::take(pids)?;
    let t0 = Instant::now() + timing.warmup;
    let t1 = t0 + timing.window;
    let mut tasks = JoinSet::new();
    for _ in 0..callers {
        let (vault, name) = (vault.clone(), name.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let start = Instant::now();
                if start >= t1 {
                    break;
                }
                vault.sign(&name, request(), None).await?;
                let end = Instant::now();
                if end >= t0 && end <= t1 {
                    latencies.push(end - start);
                }
            }
            anyhow::Ok(latencies)
        });
    }
    tokio::time::sleep_until(t0.into()).await;
    let cpu_start = CpuSnapshot::take(pids)?;
    tokio::time::sleep_until(t1.into()).await;
    let cpu_end = CpuSnapshot::take(pids)?;
    let mut latencies = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined.context("caller task panicked")??);
    }
    Ok(Measurement::finish(latencies, timing.window, cpu_end.since(&cpu_start)))
}
