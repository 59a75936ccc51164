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
//! - **The other post-quantum parameter sets and operations** ([`PqWhat`], on a quarter of the
//!   window each): ML-DSA-44/87 signing, ML-DSA-44/65/87 verification (`Verify` RPC), ML-KEM-1024
//!   decapsulation, and ML-KEM-768/1024 encapsulation done client-side with the vault key's
//!   public key, each against aws-lc-rs doing the same in this process with a key of its own.
//!
//! Keys are made once per run, untimed ([`AlgsSetup::new`]): the raw keys with `TPM2_Create`,
//! the vault's with `Vault::create_key` in a state directory of their own (so the key-count
//! phase's sets stay as they are). Every path's first signature is checked in-core before
//! timing: raw signatures against the key's public key, the daemon's with its `Verify` RPC.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use aws_lc_rs::kem::{Algorithm, AlgorithmId, Ciphertext, DecapsulationKey, ML_KEM_1024, ML_KEM_768};
use aws_lc_rs::signature::{
    KeyPair as _, PqdsaKeyPair, PqdsaSigningAlgorithm, PqdsaVerificationAlgorithm, UnparsedPublicKey, ML_DSA_44,
    ML_DSA_44_SIGNING, ML_DSA_65, ML_DSA_65_SIGNING, ML_DSA_87, ML_DSA_87_SIGNING,
};
use tokio::runtime::Runtime;
use tpm_vault_client::{Client, KemPublicKey, SignInput, SignOptions};
use tpm_vault_daemon::model::{KeyAlg, KeyName};

use crate::sign::daemon::{policy_allow_all, Daemon, Setup};
use crate::sign::raw::{self, RawKey, RawSigner};
use crate::sign::{timed_async, timed_loop, Pids, Timing};
use crate::stats::Measurement;

/// The TPM key algorithms measured, in report order.
pub const TPM_ALGS: [KeyAlg; 3] = [KeyAlg::EccP384, KeyAlg::Rsa2048, KeyAlg::Rsa3072];

/// The vault keys without a raw peer of their own, created beside [`TPM_ALGS`].
const PQ_ALGS: [KeyAlg; 6] =
    [KeyAlg::MlDsa65, KeyAlg::HybridP256MlDsa65, KeyAlg::MlKem768, KeyAlg::MlDsa44, KeyAlg::MlDsa87, KeyAlg::MlKem1024];

/// The other post-quantum operations, in report order (ML-DSA-65 signing and ML-KEM-768
/// decapsulation are in the main rows).
pub const PQ_OPS: [PqWhat; 8] = [
    PqWhat::Sign(KeyAlg::MlDsa44),
    PqWhat::Sign(KeyAlg::MlDsa87),
    PqWhat::Verify(KeyAlg::MlDsa44),
    PqWhat::Verify(KeyAlg::MlDsa65),
    PqWhat::Verify(KeyAlg::MlDsa87),
    PqWhat::Encapsulate(KeyAlg::MlKem768),
    PqWhat::Encapsulate(KeyAlg::MlKem1024),
    PqWhat::Decapsulate(KeyAlg::MlKem1024),
];

/// A post-quantum operation measured in this process (aws-lc-rs) and through the vault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PqWhat {
    /// ML-DSA signing: the daemon's `Sign` RPC.
    Sign(KeyAlg),
    /// ML-DSA verification: the daemon's `Verify` RPC.
    Verify(KeyAlg),
    /// ML-KEM encapsulation: client-side, to the vault key's public key.
    Encapsulate(KeyAlg),
    /// ML-KEM decapsulation: the daemon's `Decapsulate` RPC.
    Decapsulate(KeyAlg),
}

impl PqWhat {
    fn alg(self) -> KeyAlg {
        match self {
            Self::Sign(a) | Self::Verify(a) | Self::Encapsulate(a) | Self::Decapsulate(a) => a,
        }
    }

    /// `ML-DSA-44` for `ml-dsa-44`.
    fn upper(self) -> String {
        self.alg().as_str().to_uppercase()
    }

    /// The label of the in-process peer's row.
    pub fn local_label(self) -> String {
        match self {
            Self::Sign(_) => format!("aws-lc-rs {} sign, in this process", self.upper()),
            Self::Verify(_) => format!("aws-lc-rs {} verify, in this process", self.upper()),
            Self::Encapsulate(_) => format!("aws-lc-rs {} encapsulate to a key of this process", self.upper()),
            Self::Decapsulate(_) => format!("aws-lc-rs {} decapsulate, in this process", self.upper()),
        }
    }

    /// The label of the vault's row.
    pub fn vault_label(self) -> String {
        let alg = self.alg();
        match self {
            Self::Sign(_) => format!("daemon `Sign` RPC, {alg}"),
            Self::Verify(_) => format!("daemon `Verify` RPC, {alg}"),
            Self::Encapsulate(_) => format!("client-side encapsulate to the vault key's public key, {alg}"),
            Self::Decapsulate(_) => format!("daemon `Decapsulate` RPC, {alg}"),
        }
    }
}

/// One [`PqWhat`] of a round.
#[derive(Debug, Clone)]
pub struct PqOp {
    /// What was measured.
    pub what: PqWhat,
    /// aws-lc-rs in this process.
    pub local: Measurement,
    /// Through the vault.
    pub vault: Measurement,
}

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
    /// The other post-quantum operations ([`PQ_OPS`]).
    pub pq: Vec<PqOp>,
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
    let mut pq_local = Vec::with_capacity(PQ_OPS.len());
    for what in PQ_OPS {
        pq_local.push(local_pq(what, pq_timing(timing), pids).with_context(|| what.local_label())?);
    }

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
        let ml_kem = daemon_decapsulate(&client, KeyAlg::MlKem768, timing, pids).await.context("daemon ML-KEM-768")?;
        let mut pq = Vec::with_capacity(PQ_OPS.len());
        for what in PQ_OPS {
            pq.push(vault_pq(&client, what, pq_timing(timing), pids).await.with_context(|| what.vault_label())?);
        }
        anyhow::Ok((tpm, ml_dsa, hybrid, ml_kem, pq))
    });
    let (tpm_daemon, ml_dsa_daemon, hybrid_daemon, ml_kem_daemon, pq_vault) = match measured {
        Ok(m) => m,
        Err(e) => return Err(e.context(format!("daemon log:\n{}", daemon.log_tail()))),
    };
    daemon.stop()?;
    let tpm = TPM_ALGS.into_iter().zip(raw).zip(tpm_daemon).map(|((alg, r), d)| (alg, r, d)).collect();
    let pq = PQ_OPS.into_iter().zip(pq_local).zip(pq_vault).map(|((what, local), vault)| PqOp { what, local, vault });
    Ok(AlgsRound { tpm, ml_dsa_local, ml_dsa_daemon, hybrid_daemon, ml_kem_local, ml_kem_daemon, pq: pq.collect() })
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

/// ML-KEM decapsulations with aws-lc-rs, a fresh key, after checking one.
fn local_decapsulate(kem: &'static Algorithm<AlgorithmId>, timing: Timing, pids: Pids) -> Result<Measurement> {
    let failed = |what: &'static str| move |_| anyhow::anyhow!("ML-KEM {what} failed");
    let dk = DecapsulationKey::generate(kem).map_err(failed("key generation"))?;
    let (ciphertext, secret) =
        dk.encapsulation_key().and_then(|ek| ek.encapsulate()).map_err(failed("encapsulation"))?;
    let opened = dk.decapsulate(Ciphertext::from(ciphertext.as_ref())).map_err(failed("decapsulation"))?;
    ensure!(opened.as_ref() == secret.as_ref(), "aws-lc-rs ML-KEM decapsulated another secret");
    timed_loop(timing, pids, || {
        dk.decapsulate(Ciphertext::from(ciphertext.as_ref())).map(drop).map_err(failed("decapsulation"))
    })
}

/// ML-KEM-768 decapsulations with aws-lc-rs, a fresh key, after checking one.
fn local_ml_kem(timing: Timing, pids: Pids) -> Result<Measurement> {
    local_decapsulate(&ML_KEM_768, timing, pids)
}

/// The timing of each [`PQ_OPS`] row: a quarter of the window (in-core work, thousands of
/// operations a second), half the warm-up.
fn pq_timing(timing: Timing) -> Timing {
    Timing { warmup: timing.warmup / 2, window: timing.window / 4 }
}

/// The aws-lc-rs algorithms of an ML-DSA key.
fn ml_dsa(alg: KeyAlg) -> Result<(&'static PqdsaSigningAlgorithm, &'static PqdsaVerificationAlgorithm)> {
    Ok(match alg {
        KeyAlg::MlDsa44 => (&ML_DSA_44_SIGNING, &ML_DSA_44),
        KeyAlg::MlDsa65 => (&ML_DSA_65_SIGNING, &ML_DSA_65),
        KeyAlg::MlDsa87 => (&ML_DSA_87_SIGNING, &ML_DSA_87),
        other => anyhow::bail!("{other} is not an ML-DSA algorithm"),
    })
}

/// The aws-lc-rs algorithm of an ML-KEM key.
fn ml_kem(alg: KeyAlg) -> Result<&'static Algorithm<AlgorithmId>> {
    Ok(match alg {
        KeyAlg::MlKem768 => &ML_KEM_768,
        KeyAlg::MlKem1024 => &ML_KEM_1024,
        other => anyhow::bail!("{other} is not an ML-KEM algorithm"),
    })
}

/// `what` with aws-lc-rs in this process and a fresh key, after checking one result.
fn local_pq(what: PqWhat, timing: Timing, pids: Pids) -> Result<Measurement> {
    let failed = |_| anyhow::anyhow!("aws-lc-rs failed");
    match what {
        PqWhat::Sign(alg) | PqWhat::Verify(alg) => {
            let (signing, verifying) = ml_dsa(alg)?;
            let kp = PqdsaKeyPair::generate(signing).map_err(failed)?;
            let mut sig = vec![0u8; signing.signature_len()];
            kp.sign(MESSAGE, &mut sig).map_err(failed)?;
            let public = UnparsedPublicKey::new(verifying, kp.public_key().as_ref().to_vec());
            public.verify(MESSAGE, &sig).map_err(|_| anyhow::anyhow!("{alg} signature does not verify"))?;
            if matches!(what, PqWhat::Sign(_)) {
                timed_loop(timing, pids, || kp.sign(MESSAGE, &mut sig).map(drop).map_err(failed))
            } else {
                timed_loop(timing, pids, || public.verify(MESSAGE, &sig).map_err(failed))
            }
        }
        PqWhat::Encapsulate(alg) => {
            let ek = DecapsulationKey::generate(ml_kem(alg)?).and_then(|dk| dk.encapsulation_key()).map_err(failed)?;
            timed_loop(timing, pids, || ek.encapsulate().map(drop).map_err(failed))
        }
        PqWhat::Decapsulate(alg) => local_decapsulate(ml_kem(alg)?, timing, pids),
    }
}

/// `what` through the vault: the daemon's RPC, or (encapsulation) in-core with the vault key's
/// public key; the first result is checked.
async fn vault_pq(client: &Client, what: PqWhat, timing: Timing, pids: Pids) -> Result<Measurement> {
    match what {
        PqWhat::Sign(alg) => daemon_sign(client, alg, timing, pids).await,
        PqWhat::Verify(alg) => {
            let (name, options) = (key_name(alg), SignOptions::new());
            let signature = client.sign(&name, SignInput::Message(MESSAGE.to_vec()), &options).await?;
            let verify = || async {
                let valid =
                    client.verify(&name, SignInput::Message(MESSAGE.to_vec()), signature.bytes(), &options).await?;
                ensure!(valid, "daemon {alg} signature does not verify");
                Ok(())
            };
            verify().await?;
            timed_async(timing, pids, verify).await
        }
        PqWhat::Encapsulate(alg) => {
            let name = key_name(alg);
            let public = KemPublicKey::from_spki(&client.public_key(&name).await?.der)?;
            let sent = public.encapsulate()?;
            let opened = client.decapsulate(&name, &sent.ciphertext).await?;
            ensure!(opened.as_slice() == sent.shared_secret(), "the daemon decapsulated another secret");
            timed_loop(timing, pids, || public.encapsulate().map(drop).map_err(anyhow::Error::from))
        }
        PqWhat::Decapsulate(alg) => daemon_decapsulate(client, alg, timing, pids).await,
    }
}

/// The daemon's `Decapsulate` RPC with the vault's ML-KEM key of `alg`, after checking one
/// shared secret against the one encapsulated to its public key.
async fn daemon_decapsulate(client: &Client, alg: KeyAlg, timing: Timing, pids: Pids) -> Result<Measurement> {
    let name = key_name(alg);
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
    for p in &r.pq {
        parts.push(format!("{:?} aws-lc-rs {} / vault {}", p.what, us(&p.local), us(&p.vault)));
    }
    format!("sign p50: {}", parts.join(", "))
}
