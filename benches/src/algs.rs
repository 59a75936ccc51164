//! The other key algorithms, one caller: signing with ECC P-384, RSA-2048 and RSA-3072 in their
//! default schemes (ECDSA with SHA-384; RSA-PSS with SHA-256 and a hash-length salt), with
//! ML-DSA-65 and with hybrid P-256 + ML-DSA-65 keys, and ML-KEM-768 decapsulation.
//!
//! - **TPM keys**: the daemon's `Sign` RPC with a small message (hashed in the daemon), against
//!   raw ESAPI signing the same digest with one `TPM2_Sign` and the key loaded (a key from the
//!   vault's template under the SRK, password session, NULL hashcheck ticket: what
//!   [`crate::sign::raw`] does for P-256).
//! - **ML-DSA-65**: a TPM cannot compute it; the vault seals the key's seed to the TPM, unseals
//!   it once and signs in-core (aws-lc-rs). So the peer is aws-lc-rs signing the same message in
//!   this process, and the daemon's figure is that plus one gRPC round trip.
//! - **Hybrid P-256 + ML-DSA-65**: one `TPM2_Sign` (the P-256 half) and one in-core ML-DSA-65
//!   signature over the same message; its peer is the round's raw P-256 `TPM2_Sign` (from
//!   [`crate::sign::raw`]), so the ratio is what the post-quantum half and gRPC add to a
//!   classical TPM signature.
//! - **ML-KEM-768**: the daemon's `Decapsulate` RPC (key unsealed once, decapsulated in-core)
//!   against aws-lc-rs decapsulating in this process; ciphertexts come from the key's public key.
//!
//! Keys are made once per run, untimed ([`AlgsSetup::new`]): the raw keys with `TPM2_Create`,
//! the vault's with `Vault::create_key` in a state directory of their own (so the key-count
//! phase's sets stay as they are). Every path's first signature is checked in-core before
//! timing: raw signatures against the key's public key, the daemon's with its `Verify` RPC.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use aws_lc_rs::kem::{Ciphertext, DecapsulationKey, ML_KEM_768};
use aws_lc_rs::signature::{PqdsaKeyPair, ML_DSA_65_SIGNING};
use tokio::runtime::Runtime;
use tpm_vault_client::{Client, SignInput, SignOptions};
use tpm_vault_daemon::model::{KeyAlg, KeyName};

use crate::sign::daemon::{policy_allow_all, Daemon, Setup};
use crate::sign::raw::{self, RawKey, RawSigner};
use crate::sign::{timed_async, timed_loop, Pids, Timing};
use crate::stats::Measurement;

/// The TPM key algorithms measured, in report order.
pub const TPM_ALGS: [KeyAlg; 3] = [KeyAlg::EccP384, KeyAlg::Rsa2048, KeyAlg::Rsa3072];

/// The vault keys without a raw peer of their own, created beside [`TPM_ALGS`].
const PQ_ALGS: [KeyAlg; 3] = [KeyAlg::MlDsa65, KeyAlg::HybridP256MlDsa65, KeyAlg::MlKem768];

/// The message every path signs.
const MESSAGE: &[u8] = b"tpm-vault benchmark: the other key algorithms";

/// Name of the vault key of `alg`.
fn key_name(alg: KeyAlg) -> String {
    format!("alg-{alg}")
}

/// What [`run`] needs: the raw keys and the daemon's set-up on the vault keys' state directory.
#[derive(Debug, Clone)]
pub struct AlgsSetup {
    /// Raw keys, one per [`TPM_ALGS`] entry.
    raw: Vec<(KeyAlg, RawKey)>,
    /// The daemon, on the state directory holding the vault keys.
    daemon: Setup,
    /// Time to create each key (raw `TPM2_Create`, vault `create_key`), for the report.
    pub created: Vec<(String, Duration)>,
}

impl AlgsSetup {
    /// Creates the raw keys and, in `state_dir` (a directory of their own), the vault keys.
    ///
    /// # Errors
    /// TPM and vault errors.
    pub fn new(daemon: Setup, rt: &Runtime) -> Result<Self> {
        let mut created = Vec::new();
        let mut raw = Vec::new();
        for alg in TPM_ALGS {
            let t = Instant::now();
            let key = raw::create_key(&daemon.tcti, alg).with_context(|| format!("creating the raw {alg} key"))?;
            created.push((format!("raw `TPM2_Create` {alg}"), t.elapsed()));
            raw.push((alg, key));
        }
        rt.block_on(async {
            let vault = crate::sign::actor::open(&daemon.state_dir, &daemon.tcti).await?;
            let uid = nix::unistd::getuid().as_raw();
            let result = async {
                for alg in TPM_ALGS.into_iter().chain(PQ_ALGS) {
                    let name = KeyName::try_from(key_name(alg).as_str())?;
                    if vault.key(&name).await.is_ok() {
                        continue;
                    }
                    let t = Instant::now();
                    vault.create_key(name, alg, uid, None, None).await?;
                    created.push((format!("vault `create_key` {alg}"), t.elapsed()));
                }
                anyhow::Ok(())
            }
            .await;
            vault.shutdown(Duration::from_secs(10)).await;
            result.context("creating the vault keys of the algorithm phase")
        })?;
        Ok(Self { raw, daemon, created })
    }
}

/// One round's measurements.
#[derive(Debug, Clone)]
pub struct AlgsRound {
    /// Per TPM algorithm: raw ESAPI, then the daemon.
    pub tpm: Vec<(KeyAlg, Measurement, Measurement)>,
    /// ML-DSA-65 with aws-lc-rs in this process.
    pub ml_dsa_local: Measurement,
    /// ML-DSA-65 through the daemon.
    pub ml_dsa_daemon: Measurement,
    /// Hybrid P-256 + ML-DSA-65 through the daemon (its peer is the round's raw P-256).
    pub hybrid_daemon: Measurement,
    /// ML-KEM-768 decapsulation with aws-lc-rs in this process.
    pub ml_kem_local: Measurement,
    /// ML-KEM-768 decapsulation through the daemon.
    pub ml_kem_daemon: Measurement,
}

/// One round: raw ESAPI per algorithm (one connection at a time, as swtpm serves), aws-lc-rs
/// ML-DSA-65, then a daemon signing with each vault key.
///
/// # Errors
/// TPM, RPC and start/stop errors; signatures that do not verify.
pub fn run(setup: &AlgsSetup, round: usize, timing: Timing, swtpm_pid: u32, rt: &Runtime) -> Result<AlgsRound> {
    let pids = Pids { swtpm: swtpm_pid, daemon: None };
    let mut raw = Vec::with_capacity(setup.raw.len());
    for (alg, key) in &setup.raw {
        raw.push(raw_sign(&setup.daemon.tcti, *alg, key, timing, pids).with_context(|| format!("raw {alg}"))?);
    }
    let ml_dsa_local = local_ml_dsa(timing, pids)?;
    let ml_kem_local = local_ml_kem(timing, pids)?;

    let uid = nix::unistd::getuid().as_raw();
    let (daemon, _ready) =
        Daemon::start_with(&setup.daemon, &format!("algs-round{round}.log"), &policy_allow_all(uid))?;
    let pids = Pids { swtpm: swtpm_pid, daemon: Some(daemon.pid()) };
    let measured = rt.block_on(async {
        let client = Client::connect(daemon.socket()).await.context("connecting to the daemon")?;
        let mut tpm = Vec::with_capacity(TPM_ALGS.len());
        for alg in TPM_ALGS {
            tpm.push(daemon_sign(&client, alg, timing, pids).await.with_context(|| format!("daemon {alg}"))?);
        }
        let ml_dsa = daemon_sign(&client, KeyAlg::MlDsa65, timing, pids).await.context("daemon ML-DSA-65")?;
        let hybrid = daemon_sign(&client, KeyAlg::HybridP256MlDsa65, timing, pids).await.context("daemon hybrid")?;
        let ml_kem = daemon_decapsulate(&client, timing, pids).await.context("daemon ML-KEM-768")?;
        anyhow::Ok((tpm, ml_dsa, hybrid, ml_kem))
    });
    let (tpm_daemon, ml_dsa_daemon, hybrid_daemon, ml_kem_daemon) = match measured {
        Ok(m) => m,
        Err(e) => return Err(e.context(format!("daemon log:\n{}", daemon.log_tail()))),
    };
    daemon.stop()?;
    let tpm = TPM_ALGS.into_iter().zip(raw).zip(tpm_daemon).map(|((alg, r), d)| (alg, r, d)).collect();
    Ok(AlgsRound { tpm, ml_dsa_local, ml_dsa_daemon, hybrid_daemon, ml_kem_local, ml_kem_daemon })
}

/// Loads `key` and signs the digest of [`MESSAGE`] in a loop, after checking one signature.
fn raw_sign(tcti: &str, alg: KeyAlg, key: &RawKey, timing: Timing, pids: Pids) -> Result<Measurement> {
    let digest = tpm_vault_daemon::model::SignInput::Message(MESSAGE.to_vec()).into_digest(alg.default_hash())?;
    let mut signer = RawSigner::open_for(tcti, key, alg, &digest)?;
    let m = timed_loop(timing, pids, || signer.sign())?;
    signer.close()?;
    Ok(m)
}

/// ML-DSA-65 signatures of [`MESSAGE`] with aws-lc-rs, a fresh key.
fn local_ml_dsa(timing: Timing, pids: Pids) -> Result<Measurement> {
    let kp = PqdsaKeyPair::generate(&ML_DSA_65_SIGNING).map_err(|_| anyhow::anyhow!("ML-DSA-65 key generation"))?;
    let mut sig = vec![0u8; kp.algorithm().signature_len()];
    timed_loop(timing, pids, || {
        kp.sign(MESSAGE, &mut sig).map(drop).map_err(|_| anyhow::anyhow!("ML-DSA-65 signing failed"))
    })
}

/// ML-KEM-768 decapsulations with aws-lc-rs, a fresh key, after checking one.
fn local_ml_kem(timing: Timing, pids: Pids) -> Result<Measurement> {
    let failed = |what: &'static str| move |_| anyhow::anyhow!("ML-KEM-768 {what} failed");
    let dk = DecapsulationKey::generate(&ML_KEM_768).map_err(failed("key generation"))?;
    let (ciphertext, secret) =
        dk.encapsulation_key().and_then(|ek| ek.encapsulate()).map_err(failed("encapsulation"))?;
    let opened = dk.decapsulate(Ciphertext::from(ciphertext.as_ref())).map_err(failed("decapsulation"))?;
    ensure!(opened.as_ref() == secret.as_ref(), "aws-lc-rs ML-KEM-768 decapsulated another secret");
    timed_loop(timing, pids, || {
        dk.decapsulate(Ciphertext::from(ciphertext.as_ref())).map(drop).map_err(failed("decapsulation"))
    })
}

/// The daemon's `Decapsulate` RPC with the vault's ML-KEM-768 key, after checking one shared
/// secret against the one encapsulated to its public key.
async fn daemon_decapsulate(client: &Client, timing: Timing, pids: Pids) -> Result<Measurement> {
    let name = key_name(KeyAlg::MlKem768);
    let sent = client.encapsulate(&name).await?;
    let opened = client.decapsulate(&name, &sent.ciphertext).await?;
    ensure!(opened.as_slice() == sent.shared_secret(), "the daemon decapsulated another secret");
    timed_async(timing, pids, || async {
        client.decapsulate(&name, &sent.ciphertext).await.map(drop).map_err(anyhow::Error::from)
    })
    .await
}

/// The daemon's `Sign` RPC with the vault key of `alg`, after checking one signature.
async fn daemon_sign(client: &Client, alg: KeyAlg, timing: Timing, pids: Pids) -> Result<Measurement> {
    let name = key_name(alg);
    let options = SignOptions::new();
    let first = client.sign(&name, SignInput::Message(MESSAGE.to_vec()), &options).await?;
    let valid = client.verify(&name, SignInput::Message(MESSAGE.to_vec()), first.bytes(), &options).await?;
    ensure!(valid, "daemon {alg} signature does not verify");
    timed_async(timing, pids, || async {
        client.sign(&name, SignInput::Message(MESSAGE.to_vec()), &options).await.map(drop).map_err(anyhow::Error::from)
    })
    .await
}

/// The set-up of the daemon of this phase: `base`'s binary and TPM, its own state and scratch
/// directories under `root`.
///
/// # Errors
/// Directories that cannot be made.
pub fn daemon_setup(base: &Setup, root: &Path) -> Result<Setup> {
    let (state_dir, work) = (root.join("state"), root.join("w"));
    for d in [&state_dir, &work] {
        std::fs::create_dir_all(d).with_context(|| format!("{}", d.display()))?;
    }
    Ok(Setup { state_dir, work, ..base.clone() })
}

/// One line for the progress output: p50 per path.
pub fn describe(r: &AlgsRound) -> String {
    let us = |m: &Measurement| format!("{:.0} µs", m.p50().as_secs_f64() * 1e6);
    let mut parts: Vec<String> =
        r.tpm.iter().map(|(alg, raw, d)| format!("{alg} raw {} / daemon {}", us(raw), us(d))).collect();
    parts.push(format!("ml-dsa-65 aws-lc-rs {} / daemon {}", us(&r.ml_dsa_local), us(&r.ml_dsa_daemon)));
    parts.push(format!("hybrid daemon {}", us(&r.hybrid_daemon)));
    parts.push(format!("ml-kem-768 decapsulate aws-lc-rs {} / daemon {}", us(&r.ml_kem_local), us(&r.ml_kem_daemon)));
    format!("sign p50: {}", parts.join(", "))
}
