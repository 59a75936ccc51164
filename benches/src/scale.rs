//! Key-count scaling: sign latency, start-to-ready time and RSS of the daemon with 10, 1,000 and
//! 100,000 stored keys (quick mode: 10 and 1,000).
//!
//! Creating 100,000 keys in the TPM would take hours, so (untimed, once per run) the library
//! creates [`REAL_KEYS`] real ECC P-256 keys in the benchmark's state directory
//! (`Vault::create_key`, records written by the store's atomic writer), and each key set is a
//! state directory of its own holding the SRK name, those real records (copied with
//! `Table::insert`) and `count − 4` copies: the same record (`KeyRecord::to_bytes`, the
//! library's own serialisation) under distinct names `k000004`, `k000005`, …, copy `i` of real
//! key `i mod 4`. The copies are written with a plain write and one `sync(2)` at the end instead
//! of the atomic writer's two fsyncs per file (the report gives its measured time per record,
//! a few ms on this disk: minutes for 100,000). `Store::count` then checks that the library
//! sees `count` keys. A copy's TPM object
//! is its real key's, so signing with it loads (or reuses) that object.
//!
//! Each round, for each key set: start a daemon on it (start-to-ready, idle RSS), check one
//! signature (Verify RPC), then sign from one client:
//! - **cached**: a pseudo-random name among the copies of real key 0, whose TPM object stays
//!   loaded: one `TPM2_Sign`, plus finding the record (the vault caches 4,096 parsed records;
//!   beyond that it reads the record's file);
//! - **cold**: a pseudo-random name of real key `t mod 4` at step `t`: with the daemon's default
//!   `--max-loaded-objects 3` (the SRK and two keys), every signature needs `TPM2_Load` (and a
//!   `TPM2_FlushContext` of the least recently used key) before `TPM2_Sign`.
//!
//! then read the RSS again and stop the daemon.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use tokio::runtime::Runtime;
use tpm_vault_client::{Client, HashAlgorithm, SignInput, SignOptions, SignatureScheme};
use tpm_vault_daemon::formats::store::{Record as _, Store};
use tpm_vault_daemon::model::{KeyAlg, KeyName};

use crate::procfs::{self, Proc};
use crate::sign::daemon::{policy_allow_all, Daemon, Setup};
use crate::sign::{timed_async, Pids, Timing, DIGEST};
use crate::stats::Measurement;

/// Real TPM keys behind every key set.
pub const REAL_KEYS: usize = 4;
/// Key counts of a full run.
pub const COUNTS: [usize; 3] = [10, 1_000, 100_000];
/// Key counts of a quick run.
pub const QUICK_COUNTS: [usize; 2] = [10, 1_000];
/// Pause between "socket accepts" and reading the idle RSS.
const SETTLE: Duration = Duration::from_millis(200);

/// Name of real key `g`.
pub fn real_name(g: usize) -> String {
    format!("scale-{g}")
}

fn copy_name(i: usize) -> String {
    format!("k{i:06}")
}

/// Creates the real keys in the vault at `state_dir` (skipping those that exist); returns the
/// mean time of one key creation (`Vault::create_key`: TPM2_Create and the record's write).
///
/// # Errors
/// Vault errors.
pub async fn create_real_keys(state_dir: &Path, tcti: &str) -> Result<Option<Duration>> {
    let vault = crate::sign::actor::open(state_dir, tcti).await?;
    let uid = nix::unistd::getuid().as_raw();
    let result = async {
        let (mut took, mut created) = (Duration::ZERO, 0u32);
        for g in 0..REAL_KEYS {
            let name = KeyName::try_from(real_name(g).as_str())?;
            if vault.key(&name).await.is_err() {
                let t = Instant::now();
                vault.create_key(name, KeyAlg::EccP256, uid, None, None).await?;
                took += t.elapsed();
                created += 1;
            }
        }
        anyhow::Ok((created > 0).then(|| took / created))
    }
    .await;
    vault.shutdown(Duration::from_secs(10)).await;
    result.context("creating the real keys of the key sets")
}

/// A state directory with `count` key records.
#[derive(Debug, Clone)]
pub struct KeySet {
    /// Records in it.
    pub count: usize,
    /// The state directory.
    pub dir: PathBuf,
    /// Record names by the real key whose TPM object they use.
    groups: Vec<Vec<String>>,
    /// How long writing it took.
    pub written_in: Duration,
    /// Mean time of one record through the store's atomic writer (the real keys' records).
    pub atomic_write: Duration,
}

impl KeySet {
    /// Writes the key set of `count` records under `root` from the real keys in `main_state`.
    ///
    /// # Errors
    /// Store errors, or a key set the library does not count as `count` keys.
    pub fn prepare(main_state: &Path, root: &Path, count: usize) -> Result<Self> {
        ensure!(count >= REAL_KEYS, "a key set needs at least {REAL_KEYS} keys");
        let started = Instant::now();
        let dir = root.join(format!("n{count}"));
        let main = Store::open(main_state).context("opening the benchmark's store")?;
        let store = Store::open(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::copy(main_state.join("srk.name"), dir.join("srk.name")).context("copying srk.name")?;
        let mut records = Vec::with_capacity(REAL_KEYS);
        let mut groups = vec![Vec::new(); REAL_KEYS];
        let mut atomic = Duration::ZERO;
        for (g, group) in groups.iter_mut().enumerate() {
            let name = KeyName::try_from(real_name(g).as_str())?;
            let record = main.keys().get(&name)?.with_context(|| format!("real key {name} is missing"))?;
            let t = Instant::now();
            store.keys().insert(&record)?;
            atomic += t.elapsed();
            group.push(name.to_string());
            records.push(record);
        }
        // The store's layout: `keys/<name>.key` (see `tpm_vault_daemon::formats::store`).
        let keys = dir.join("keys");
        for i in REAL_KEYS..count {
            let mut record = records[i % REAL_KEYS].clone();
            record.name = KeyName::try_from(copy_name(i).as_str())?;
            let path = keys.join(format!("{}.key", record.name));
            std::fs::write(&path, record.to_bytes()).with_context(|| format!("writing {}", path.display()))?;
            groups[i % REAL_KEYS].push(record.name.to_string());
        }
        nix::unistd::sync();
        let seen = store.keys().count()?;
        ensure!(seen == count, "the store counts {seen} keys in {}, expected {count}", dir.display());
        Ok(Self { count, dir, groups, written_in: started.elapsed(), atomic_write: atomic / REAL_KEYS as u32 })
    }
}

/// Everything the phase needs.
#[derive(Debug, Clone)]
pub struct ScaleSetup {
    /// The daemon (its `state_dir` and `work` are replaced per key set).
    pub daemon: Setup,
    /// The key sets, smallest first.
    pub sets: Vec<KeySet>,
}

/// One key set in one round.
#[derive(Debug, Clone)]
pub struct CountRound {
    /// Keys stored.
    pub count: usize,
    /// Spawn until the socket accepts.
    pub ready: Duration,
    /// VmRSS after start, KiB.
    pub rss_idle_kib: u64,
    /// VmRSS after both sign windows, KiB.
    pub rss_after_kib: u64,
    /// Signing with keys whose TPM object is loaded.
    pub cached: Measurement,
    /// Signing with a key that is not loaded.
    pub cold: Measurement,
}

/// What one round measured, smallest key set first.
#[derive(Debug, Clone, Default)]
pub struct ScaleRound {
    /// Per key set.
    pub counts: Vec<CountRound>,
}

/// A small deterministic generator (the same name sequence every round).
#[derive(Debug, Clone)]
pub struct Picker(u64);

impl Picker {
    /// A generator with a fixed seed.
    pub fn new() -> Self {
        Self(0x9e37_79b9_7f4a_7c15)
    }

    /// The next index below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

impl Default for Picker {
    fn default() -> Self {
        Self::new()
    }
}

fn options() -> SignOptions {
    SignOptions::new().with_hash(HashAlgorithm::Sha256).with_scheme(SignatureScheme::Ecdsa)
}

/// Signs [`DIGEST`] with `name` through the daemon.
///
/// # Errors
/// RPC errors.
pub async fn sign(client: &Client, name: &str) -> Result<()> {
    client
        .sign(name, SignInput::Digest(DIGEST.to_vec()), &options())
        .await
        .map(drop)
        .with_context(|| format!("Sign RPC with {name}"))
}

/// The name the cold loop signs with at step `t`.
pub fn cold_name<'a>(groups: &'a [Vec<String>], picker: &mut Picker, t: usize) -> &'a str {
    let group = &groups[t % groups.len()];
    &group[picker.below(group.len())]
}

/// One round over every key set.
///
/// # Errors
/// Start/stop failures, RPC errors, a signature that does not verify.
pub fn run(
    setup: &ScaleSetup,
    round: usize,
    timing: Timing,
    swtpm_pid: u32,
    rt: &Runtime,
    mut progress: impl FnMut(&str),
) -> Result<ScaleRound> {
    let uid = nix::unistd::getuid().as_raw();
    let mut counts = Vec::with_capacity(setup.sets.len());
    for set in &setup.sets {
        let daemon_setup = Setup {
            state_dir: set.dir.clone(),
            work: setup.daemon.work.join(format!("n{}", set.count)),
            ..setup.daemon.clone()
        };
        std::fs::create_dir_all(&daemon_setup.work).with_context(|| format!("{}", daemon_setup.work.display()))?;
        let (daemon, ready) = Daemon::start_with(
            &daemon_setup,
            &format!("scale-n{}-round{round}.log", set.count),
            &policy_allow_all(uid),
        )?;
        std::thread::sleep(SETTLE);
        let pid = daemon.pid();
        let rss_idle_kib = procfs::rss_kib(Proc::Pid(pid))?;
        let pids = Pids { swtpm: swtpm_pid, daemon: Some(pid) };
        let measured = rt.block_on(async {
            let client = Client::connect(daemon.socket()).await.context("connecting to the daemon")?;
            let first = &set.groups[0][0];
            let sig = client.sign(first, SignInput::Digest(DIGEST.to_vec()), &options()).await?;
            let valid = client.verify(first, SignInput::Digest(DIGEST.to_vec()), sig.bytes(), &options()).await?;
            ensure!(valid, "the daemon's signature with {first} does not verify");
            let mut pick = Picker::new();
            let cached = timed_async(timing, pids, || {
                let name = &set.groups[0][pick.below(set.groups[0].len())];
                sign(&client, name)
            })
            .await?;
            let mut pick = Picker::new();
            let mut t = 0;
            let cold = timed_async(timing, pids, || {
                t += 1;
                sign(&client, cold_name(&set.groups, &mut pick, t))
            })
            .await?;
            anyhow::Ok((cached, cold))
        });
        let (cached, cold) = match measured {
            Ok(m) => m,
            Err(e) => return Err(e.context(format!("daemon log:\n{}", daemon.log_tail()))),
        };
        let rss_after_kib = procfs::rss_kib(Proc::Pid(pid))?;
        daemon.stop()?;
        progress(&format!(
            "{} keys: ready in {:.0} ms, RSS {:.1} MiB, sign p50 cached {:.0} µs, cold {:.0} µs",
            set.count,
            ready.as_secs_f64() * 1e3,
            rss_after_kib as f64 / 1024.0,
            cached.p50().as_secs_f64() * 1e6,
            cold.p50().as_secs_f64() * 1e6
        ));
        counts.push(CountRound { count: set.count, ready, rss_idle_kib, rss_after_kib, cached, cold });
    }
    Ok(ScaleRound { counts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picker_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Picker::new(), Picker::new());
        let xs: Vec<usize> = (0..100).map(|_| a.below(7)).collect();
        let ys: Vec<usize> = (0..100).map(|_| b.below(7)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|&x| x < 7));
        assert!(xs.iter().any(|&x| x != xs[0]));
    }

    #[test]
    fn cold_names_rotate_through_the_real_keys() {
        let groups: Vec<Vec<String>> = (0..REAL_KEYS).map(|g| vec![real_name(g), copy_name(g + REAL_KEYS)]).collect();
        let mut p = Picker::new();
        for t in 0..8 {
            let name = cold_name(&groups, &mut p, t);
            assert!(groups[t % REAL_KEYS].iter().any(|n| n == name), "{t}: {name}");
        }
    }
}
