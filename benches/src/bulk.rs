//! Bulk cryptography (issue #18): what the vault does in-core, in the caller's process and
//! through the daemon, against OpenSSL on one core of the same machine in the same round.
//!
//! - **AES-256-GCM in-core**: the vault's own stream format ([`Encryptor`] from
//!   `daemon/src/crypto/stream.rs`: 64 KiB chunks, per-chunk nonce and associated data, the
//!   copies in and out of its buffers), fed 1 MiB at a time on this thread, against `openssl
//!   speed -elapsed -evp aes-256-gcm` at 16 KiB blocks (one process, one core).
//! - **SHA-256 in-core**: the vault's hash (`HashAlg::Sha256.digest`, aws-lc-rs) of 16 KiB
//!   blocks, one digest per block as `openssl speed -elapsed sha256` does, against its 16 KiB
//!   column.
//! - **`tpm-vault encrypt` / `decrypt`** ([`cli_round`]): the real CLI binary on a file of
//!   [`CliSetup::bytes`] (page cache warm: the files are read once before) to `/dev/null`,
//!   pinned to one CPU with `taskset -c 0` and on every CPU; wall time of the process, so the
//!   stream-key RPC and the connection are in it.
//! - **The client library from memory** ([`library`]): `Client::copy_encrypt` of up to
//!   [`LIBRARY_MAX_BYTES`] of plaintext in memory into a counting sink, and `copy_decrypt` of its
//!   ciphertext, on one thread (`with_bulk_threads(1)`) and on every CPU.
//! - **Through the daemon** ([`stream`], `--in-daemon`): one `CryptoService/Encrypt` stream of
//!   [`OpsSetup::stream_bytes`] plaintext (`Client::copy_encrypt_in_daemon`, 256 KiB messages)
//!   from a generated source into a counting sink, on a current-thread runtime of its own as the
//!   CLI runs it; the daemon's RSS is sampled every 10 ms during the stream. A short stream is
//!   encrypted in-process and decrypted in the daemon first (checked, and it unseals the data
//!   key so the timed stream does not include the TPM). Then up to [`DECRYPT_MAX_BYTES`] of
//!   ciphertext is decrypted by one `CryptoService/Decrypt` stream from memory.
//! - **Opening a stream** ([`stream_key_rpc`]): `CreateStreamKey` round trips (the data key is
//!   cached, so no TPM command), set against one raw TPM command in the report.
//! - `openssl speed -elapsed ecdsap256` sign/s: not a peer of the vault, only this CPU's speed
//!   next to the published figures the device model ([`crate::device`]) scales to.
//!
//! [`OpsSetup::stream_bytes`]: crate::ops::OpsSetup::stream_bytes

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{bail, ensure, Context as _, Result};
use tokio::io::{AsyncReadExt, AsyncWrite};
use tpm_vault_client::{Client, Code};
use tpm_vault_daemon::model::HashAlg;
use tpm_vault_proto::stream::{wrap, DataKeyId, Encryptor, Header, CHUNK, TAG};

use crate::procfs::{self, Proc};
use crate::sign::{timed_async, timed_loop, CpuSnapshot, Pids, Timing};
use crate::stats::{CpuUse, Measurement};

/// The daemon's data key the stream uses (created on first use).
pub const DATA_KEY: &str = "bench-data";
/// Encryption context of the streams.
pub const CONTEXT: &[u8] = b"tpm-vault-bench";
/// Plaintext per in-core AES-GCM update.
const AES_PIECE: usize = 1024 * 1024;
/// Block size of the SHA-256 and OpenSSL figures (OpenSSL's 16 KiB column).
pub const BLOCK: usize = 16 * 1024;
/// Interval of the daemon RSS samples during the stream.
const RSS_SAMPLE: Duration = Duration::from_millis(10);
/// Size of the checked warm-up stream (a few chunks and a partial one).
const CHECK_BYTES: usize = 3 * CHUNK + 1234;

/// The daemon's encrypt stream.
#[derive(Debug, Clone, Default)]
pub struct StreamRound {
    /// Plaintext bytes.
    pub bytes: u64,
    /// Wall time of the whole call.
    pub elapsed: Duration,
    /// Daemon VmRSS before the stream, KiB.
    pub rss_before_kib: u64,
    /// Highest daemon VmRSS seen during the stream, KiB.
    pub rss_peak_kib: u64,
    /// CPU over the stream (bench = the client library in this process).
    pub cpu: CpuUse,
    /// Plaintext bytes of the timed decrypt stream (0: none).
    pub decrypt_bytes: u64,
    /// Wall time of the decrypt call.
    pub decrypt_elapsed: Duration,
}

impl StreamRound {
    /// Plaintext bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        per_sec(self.bytes, self.elapsed)
    }

    /// Plaintext bytes per second of the decrypt stream.
    pub fn decrypt_bytes_per_sec(&self) -> f64 {
        per_sec(self.decrypt_bytes, self.decrypt_elapsed)
    }
}

/// `openssl speed -elapsed` figures of one round.
#[derive(Debug, Clone, Copy, Default)]
pub struct Openssl {
    /// AES-256-GCM, 16 KiB blocks, bytes/s.
    pub aes_gcm: f64,
    /// SHA-256, 16 KiB blocks, bytes/s.
    pub sha256: f64,
    /// ECDSA P-256 signatures/s.
    pub ecdsa_sign: f64,
}

/// What one round measured.
#[derive(Debug, Clone, Default)]
pub struct BulkRound {
    /// The vault's stream encryptor in this thread, plaintext bytes/s.
    pub aes: f64,
    /// The vault's SHA-256 of 16 KiB blocks, bytes/s.
    pub sha: f64,
    /// OpenSSL on the same machine (`None` without `openssl`).
    pub openssl: Option<Openssl>,
    /// The daemon's encrypt streams.
    pub streams: Streams,
}

/// The streams of one round, in the caller's process and through the daemon.
#[derive(Debug, Clone, Default)]
pub struct Streams {
    /// Through the daemon's `Encrypt`/`Decrypt` RPCs (`--in-daemon`), the client library on a
    /// current-thread runtime of its own, as `tpm-vault encrypt --in-daemon` runs it
    /// ([`stream_current_thread`]).
    pub daemon: StreamRound,
    /// Through tonic directly ([`stream_tuned`]).
    pub tuned: StreamRound,
    /// The client library from memory on one thread.
    pub library_one: LocalRates,
    /// The same on every CPU ([`LocalRates::threads`] threads).
    pub library_all: LocalRates,
    /// `CreateStreamKey` round trips.
    pub stream_key: Measurement,
    /// `tpm-vault encrypt`/`decrypt` of a file.
    pub cli: Option<CliRound>,
}

/// Encryption and decryption in this process, from memory into a counting sink.
#[derive(Debug, Clone, Default)]
pub struct LocalRates {
    /// Threads sealing and opening chunks.
    pub threads: usize,
    /// Plaintext bytes per stream.
    pub bytes: u64,
    /// Plaintext bytes/s encrypted.
    pub encrypt: f64,
    /// Plaintext bytes/s decrypted.
    pub decrypt: f64,
}

/// `tpm-vault encrypt` and `decrypt` of a file to `/dev/null`, plaintext bytes/s.
#[derive(Debug, Clone, Default)]
pub struct CliRound {
    /// Plaintext bytes of the file.
    pub bytes: u64,
    /// CPUs the unpinned runs could use.
    pub cpus: usize,
    /// `taskset -c 0 tpm-vault encrypt`.
    pub encrypt_one: f64,
    /// `taskset -c 0 tpm-vault decrypt`.
    pub decrypt_one: f64,
    /// `tpm-vault encrypt` on every CPU.
    pub encrypt_all: f64,
    /// `tpm-vault decrypt` on every CPU.
    pub decrypt_all: f64,
    /// `tpm-vault encrypt` on every CPU of the file into a new file (issue #36 item 7).
    pub encrypt_file: f64,
    /// `cat` of the same file into a new file, timed alternately with `encrypt_file`.
    pub cat_file: f64,
}

/// Whether `openssl` can run (for `openssl speed` here and `s_server`/`s_time` in the TLS phase).
pub fn openssl_available() -> bool {
    Command::new("openssl")
        .close_inherited_fds()
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The in-core figures and OpenSSL's (when `openssl`), with the streams measured before.
///
/// # Errors
/// Cipher errors, `openssl` failures.
pub fn run(timing: Timing, pids: Pids, streams: Streams, openssl: bool) -> Result<BulkRound> {
    let aes = aes_in_core(timing, pids)?;
    let sha = sha_in_core(timing, pids)?;
    let openssl = if openssl {
        let secs = timing.window.as_secs_f64().round().max(1.0) as u64;
        Some(Openssl {
            aes_gcm: openssl_speed(&["-evp", "aes-256-gcm"], secs)?,
            sha256: openssl_speed(&["sha256"], secs)?,
            ecdsa_sign: openssl_ecdsa()?,
        })
    } else {
        None
    };
    Ok(BulkRound { aes, sha, openssl, streams })
}

fn aes_in_core(timing: Timing, pids: Pids) -> Result<f64> {
    let key: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(29).wrapping_add(3));
    let header = bench_header(&key, [7; 16])?;
    let mut enc = Encryptor::new(&key, &header, CONTEXT)?;
    let piece = vec![0x5au8; AES_PIECE];
    let mut out = Vec::with_capacity(AES_PIECE + AES_PIECE / CHUNK * TAG + 1024);
    let m = timed_loop(timing, pids, || {
        enc.update(&piece, &mut out)?;
        std::hint::black_box(&out);
        out.clear();
        Ok(())
    })?;
    Ok(m.rate() * AES_PIECE as f64)
}

fn sha_in_core(timing: Timing, pids: Pids) -> Result<f64> {
    let block = vec![0x5au8; BLOCK];
    let m = timed_loop(timing, pids, || {
        std::hint::black_box(HashAlg::Sha256.digest(std::hint::black_box(&block)));
        Ok(())
    })?;
    Ok(m.rate() * BLOCK as f64)
}

fn openssl(args: &[&str]) -> Result<String> {
    let out = Command::new("openssl")
        .close_inherited_fds()
        .arg("speed")
        .args(["-elapsed", "-mr"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running openssl speed {}", args.join(" ")))?;
    ensure!(
        out.status.success(),
        "openssl speed {} exited with {}: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `openssl speed -elapsed -mr -seconds S -bytes 16384 ALG...` in bytes/s.
fn openssl_speed(alg: &[&str], secs: u64) -> Result<f64> {
    let secs = secs.to_string();
    let bytes = BLOCK.to_string();
    let mut args = vec!["-seconds", &secs, "-bytes", &bytes];
    args.extend_from_slice(alg);
    let text = openssl(&args)?;
    parse_speed(&text).with_context(|| format!("no +F line in the output of openssl speed {}:\n{text}", alg.join(" ")))
}

/// The bytes/s of the first (only) block size of an `-mr` run: `+F:IDX:NAME:BYTES_PER_SEC`.
fn parse_speed(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("+F:"))?;
    line.split(':').nth(3)?.trim().parse().ok()
}

/// `openssl speed -elapsed -mr -seconds 1 ecdsap256` signatures/s.
fn openssl_ecdsa() -> Result<f64> {
    let text = openssl(&["-seconds", "1", "ecdsap256"])?;
    parse_ecdsa(&text).with_context(|| format!("no +F4 line in the output of openssl speed ecdsap256:\n{text}"))
}

/// `+F4:IDX:BITS:SIGN_PER_SEC:VERIFY_PER_SEC` → signs/s.
fn parse_ecdsa(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("+F4:"))?;
    line.split(':').nth(3)?.trim().parse().ok()
}

/// A sink that counts what it is given.
#[derive(Debug, Default)]
struct Counter(u64);

impl AsyncWrite for Counter {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.0 += buf.len() as u64;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A v2 stream header under [`DATA_KEY`] (its stream key wrapped by `key`, as the daemon wraps).
fn bench_header(key: &[u8; 32], id: [u8; 16]) -> Result<Header> {
    Ok(wrap(key, DataKeyId { name: DATA_KEY, id }, CHUNK as u32, CONTEXT, [9; 12], key)?)
}

/// Ciphertext length of a stream of `plain` bytes under [`DATA_KEY`]: header, then every
/// 64 KiB chunk and a final (possibly empty) one, each with its tag, then the commitment of a
/// v3 stream.
fn sealed_len(plain: u64) -> Result<u64> {
    let header = bench_header(&[0; 32], [0; 16])?;
    let commitment = if header.is_committed() { tpm_vault_proto::stream::COMMITMENT as u64 } else { 0 };
    let chunks = plain / CHUNK as u64 + 1;
    Ok(header.encode().len() as u64 + plain + chunks * TAG as u64 + commitment)
}

/// Creates [`DATA_KEY`] unless the daemon has it.
async fn ensure_data_key(client: &Client) -> Result<()> {
    match client.create_data_key(DATA_KEY, None).await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Code::AlreadyExists => Ok(()),
        Err(e) => Err(e).context("CreateDataKey RPC"),
    }
}

/// One checked round trip of a short stream (encrypted in this process, decrypted in the
/// daemon), then the timed `Encrypt` stream of `bytes` through the daemon and a timed `Decrypt`.
///
/// # Errors
/// RPC errors, a round trip that does not give the plaintext back, a stream of the wrong length.
pub async fn stream(client: &Client, pids: Pids, bytes: u64) -> Result<StreamRound> {
    let daemon = pids.daemon.context("no daemon pid")?;
    ensure_data_key(client).await?;
    let plain: Vec<u8> = (0..CHECK_BYTES).map(|i| (i % 251) as u8).collect();
    let mut sealed = Vec::new();
    client.copy_encrypt(DATA_KEY, CONTEXT, &mut plain.as_slice(), &mut sealed).await.context("Encrypt RPC")?;
    ensure!(
        tpm_vault_client::stream_key_name(&sealed)?.as_deref() == Some(DATA_KEY),
        "the stream header does not name {DATA_KEY}"
    );
    let mut opened = Vec::new();
    client.copy_decrypt_in_daemon(CONTEXT, &mut sealed.as_slice(), &mut opened).await.context("Decrypt RPC")?;
    ensure!(opened == plain, "decrypting in the daemon did not give the plaintext back");

    let rss_before_kib = procfs::rss_kib(Proc::Pid(daemon))?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(kib) = procfs::rss_kib(Proc::Pid(daemon)) {
                    peak = peak.max(kib);
                }
                std::thread::sleep(RSS_SAMPLE);
            }
            peak
        })
    };
    let cpu_start = CpuSnapshot::take(pids)?;
    let start = Instant::now();
    let mut source = tokio::io::repeat(0x5a).take(bytes);
    let mut sink = Counter::default();
    let result = client.copy_encrypt_in_daemon(DATA_KEY, CONTEXT, &mut source, &mut sink).await;
    let elapsed = start.elapsed();
    let cpu = CpuSnapshot::take(pids)?.since(&cpu_start);
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap_or(0);
    let written = result.context("Encrypt RPC (timed stream)")?;
    let expected = sealed_len(bytes)?;
    if written != expected || sink.0 != expected {
        bail!("the encrypted stream has {written} bytes ({} counted), expected {expected}", sink.0);
    }
    let decrypt_bytes = bytes.min(DECRYPT_MAX_BYTES);
    let decrypt_elapsed = decrypt_stream(client, decrypt_bytes).await?;
    Ok(StreamRound {
        bytes,
        elapsed,
        rss_before_kib,
        rss_peak_kib: peak.max(rss_before_kib),
        cpu,
        decrypt_bytes,
        decrypt_elapsed,
    })
}

/// [`stream`] as `tpm-vault encrypt --in-daemon` runs it: a client of its own on a
/// current-thread runtime, on a thread of its own.
///
/// # Errors
/// As [`stream`]; the thread or its runtime failing to start.
pub fn stream_current_thread(socket: &std::path::Path, pids: Pids, bytes: u64) -> Result<StreamRound> {
    let socket = socket.to_owned();
    std::thread::Builder::new()
        .name("stream".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("runtime")?;
            rt.block_on(async {
                let client = Client::connect(&socket).await.context("connecting to the daemon")?;
                stream(&client, pids, bytes).await
            })
        })
        .context("starting the stream thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the stream thread panicked"))?
}

/// Most plaintext of the library's streams from memory (it and its ciphertext are held).
pub const LIBRARY_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// `Client::copy_encrypt` of `bytes` (at most [`LIBRARY_MAX_BYTES`]) of plaintext held in
/// memory into a counting sink, then `copy_decrypt` of its ciphertext, on `threads` threads.
///
/// # Errors
/// RPC errors; a stream of the wrong length.
pub async fn library(client: &Client, threads: usize, bytes: u64) -> Result<LocalRates> {
    let bytes = bytes.min(LIBRARY_MAX_BYTES);
    let client = client.clone().with_bulk_threads(threads);
    ensure_data_key(&client).await?;
    let plain = vec![0x5au8; usize::try_from(bytes).context("plaintext size")?];
    let mut sealed = Vec::with_capacity(usize::try_from(sealed_len(bytes)?).context("ciphertext size")?);
    client.copy_encrypt(DATA_KEY, CONTEXT, &mut plain.as_slice(), &mut sealed).await.context("encrypting")?;
    ensure!(sealed.len() as u64 == sealed_len(bytes)?, "the encrypted stream has {} bytes", sealed.len());
    let mut sink = Counter::default();
    let start = Instant::now();
    client.copy_encrypt(DATA_KEY, CONTEXT, &mut plain.as_slice(), &mut sink).await.context("encrypting")?;
    let encrypt = start.elapsed();
    let mut sink = Counter::default();
    let start = Instant::now();
    client.copy_decrypt(CONTEXT, &mut sealed.as_slice(), &mut sink).await.context("decrypting")?;
    let decrypt = start.elapsed();
    ensure!(sink.0 == bytes, "decryption gave {} bytes, expected {bytes}", sink.0);
    Ok(LocalRates { threads, bytes, encrypt: per_sec(bytes, encrypt), decrypt: per_sec(bytes, decrypt) })
}

/// `CreateStreamKey` round trips on one connection, [`DATA_KEY`] cached in the daemon.
///
/// # Errors
/// RPC errors.
pub async fn stream_key_rpc(client: &Client, timing: Timing, pids: Pids) -> Result<Measurement> {
    ensure_data_key(client).await?;
    timed_async(timing, pids, || async {
        let mut sink = Vec::new();
        // An empty stream: the one RPC, and a final chunk sealed in this process.
        client.copy_encrypt(DATA_KEY, CONTEXT, &mut tokio::io::empty(), &mut sink).await.context("CreateStreamKey")?;
        Ok(())
    })
    .await
}

/// The `tpm-vault` binary and the files its runs read.
#[derive(Debug, Clone)]
pub struct CliSetup {
    /// The CLI binary.
    pub binary: PathBuf,
    /// The plaintext file.
    pub plain: PathBuf,
    /// Its ciphertext, written by each round's first (untimed) run.
    pub sealed: PathBuf,
    /// Plaintext bytes.
    pub bytes: u64,
    /// Whether `taskset` can pin a run to one CPU (else those runs are skipped: NaN).
    pub taskset: bool,
    /// The scratch directory (short: the SSH agent's socket lives here too).
    pub dir: PathBuf,
}

impl CliSetup {
    /// Writes `bytes` of generated plaintext into `dir`.
    ///
    /// # Errors
    /// File errors.
    pub fn new(binary: PathBuf, dir: &Path, bytes: u64) -> Result<Self> {
        use std::io::Write as _;
        let plain = dir.join("plain");
        let mut file = std::io::BufWriter::new(std::fs::File::create(&plain).context("creating the plaintext file")?);
        let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            file.write_all(&block[..n]).context("writing the plaintext file")?;
            left -= n as u64;
        }
        file.flush().context("writing the plaintext file")?;
        Ok(Self { binary, sealed: dir.join("sealed"), plain, bytes, taskset: taskset_available(), dir: dir.to_owned() })
    }

    /// Runs `tpm-vault ARGS < input > output` (pinned to CPU 0 when `pin`); returns its wall time.
    fn time(&self, socket: &Path, args: &[&str], input: &Path, output: &Path, pin: bool) -> Result<Duration> {
        let mut cmd = if pin {
            let mut c = Command::new("taskset");
            c.args(["-c", "0"]).arg(&self.binary);
            c
        } else {
            Command::new(&self.binary)
        };
        cmd.close_inherited_fds().arg("--socket").arg(socket).args(args);
        let stdin = std::fs::File::open(input).with_context(|| format!("{}", input.display()))?;
        let stdout = std::fs::File::create(output).with_context(|| format!("{}", output.display()))?;
        cmd.stdin(stdin).stdout(stdout).stderr(Stdio::piped());
        let start = Instant::now();
        let out = cmd.output().with_context(|| format!("running {}", self.binary.display()))?;
        let elapsed = start.elapsed();
        ensure!(
            out.status.success(),
            "tpm-vault {} exited with {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(elapsed)
    }
}

/// Whether `taskset` can run (to pin the CLI to one CPU).
fn taskset_available() -> bool {
    Command::new("taskset")
        .close_inherited_fds()
        .args(["-c", "0", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `tpm-vault encrypt` and `decrypt` of the setup's file to `/dev/null`, pinned to one CPU and
/// on every CPU, against the daemon at `socket`. The first run writes the ciphertext (checked
/// by decrypting it back into a file), and each file is read once before: the page cache is warm.
///
/// # Errors
/// A run failing, a round trip that does not give the plaintext back.
pub fn cli_round(setup: &CliSetup, socket: &Path) -> Result<CliRound> {
    let null = Path::new("/dev/null");
    setup.time(socket, &["encrypt", DATA_KEY, "--context", "bench"], &setup.plain, &setup.sealed, false)?;
    let back = setup.sealed.with_extension("back");
    setup.time(socket, &["decrypt", DATA_KEY, "--context", "bench"], &setup.sealed, &back, false)?;
    let same = std::fs::read(&back)? == std::fs::read(&setup.plain)?;
    std::fs::remove_file(&back).ok();
    ensure!(same, "tpm-vault decrypt did not give the plaintext back");
    let rate = |d: Duration| per_sec(setup.bytes, d);
    let encrypt = |pin| setup.time(socket, &["encrypt", DATA_KEY, "--context", "bench"], &setup.plain, null, pin);
    let decrypt = |pin| setup.time(socket, &["decrypt", "--context", "bench"], &setup.sealed, null, pin);
    let (encrypt_one, decrypt_one) =
        if setup.taskset { (rate(encrypt(true)?), rate(decrypt(true)?)) } else { (f64::NAN, f64::NAN) };
    let (encrypt_file, cat_file) = file_to_file(setup, socket)?;
    Ok(CliRound {
        bytes: setup.bytes,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        encrypt_one,
        decrypt_one,
        encrypt_all: rate(encrypt(false)?),
        decrypt_all: rate(decrypt(false)?),
        encrypt_file: rate(encrypt_file),
        cat_file: rate(cat_file),
    })
}

/// Runs of each side of the file-to-file comparison; the fastest of each counts (a shared
/// machine only ever slows a run down).
const FILE_RUNS: usize = 3;

/// `tpm-vault encrypt < plain > new file` and `cat plain > new file`, alternately
/// ([`FILE_RUNS`] each, the output removed before each run so every run writes a new file
/// into the page cache); returns the best time of each.
///
/// # Errors
/// A run failing.
fn file_to_file(setup: &CliSetup, socket: &Path) -> Result<(Duration, Duration)> {
    let out = setup.dir.join("copy");
    let (mut encrypt, mut cat) = (Duration::MAX, Duration::MAX);
    for _ in 0..FILE_RUNS {
        std::fs::remove_file(&out).ok();
        let t = setup.time(socket, &["encrypt", DATA_KEY, "--context", "bench"], &setup.plain, &out, false)?;
        encrypt = encrypt.min(t);
        std::fs::remove_file(&out).ok();
        let input = std::fs::File::open(&setup.plain).with_context(|| format!("{}", setup.plain.display()))?;
        let output = std::fs::File::create(&out).with_context(|| format!("{}", out.display()))?;
        let start = Instant::now();
        let status =
            Command::new("cat").close_inherited_fds().stdin(input).stdout(output).status().context("running cat")?;
        cat = cat.min(start.elapsed());
        ensure!(status.success(), "cat exited with {status}");
    }
    std::fs::remove_file(&out).ok();
    Ok((encrypt, cat))
}

/// Bytes per second, 0 for no time.
fn per_sec(bytes: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        bytes as f64 / s
    } else {
        0.0
    }
}

/// Most plaintext of the timed decrypt stream (its ciphertext is held in memory).
pub const DECRYPT_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Encrypts `bytes` of plaintext into memory (untimed), then times one decrypt stream of it
/// into a counting sink; returns the wall time.
async fn decrypt_stream(client: &Client, bytes: u64) -> Result<Duration> {
    let mut sealed = Vec::with_capacity(usize::try_from(sealed_len(bytes)?).context("ciphertext size")?);
    let mut source = tokio::io::repeat(0x5a).take(bytes);
    client.copy_encrypt(DATA_KEY, CONTEXT, &mut source, &mut sealed).await.context("Encrypt RPC (decrypt input)")?;
    let mut sink = Counter::default();
    let start = Instant::now();
    let written = client
        .copy_decrypt_in_daemon(CONTEXT, &mut sealed.as_slice(), &mut sink)
        .await
        .context("Decrypt RPC (timed stream)")?;
    let elapsed = start.elapsed();
    ensure!(written == bytes && sink.0 == bytes, "the decrypted stream has {written} bytes, expected {bytes}");
    Ok(elapsed)
}

/// Most plaintext of the tuned stream (a diagnostic; a quarter GiB is long enough).
pub const TUNED_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Plaintext per request message of the tuned stream.
const TUNED_MESSAGE: usize = 1024 * 1024;
/// HTTP/2 windows of the tuned stream's connection.
const TUNED_WINDOW: u32 = 16 * 1024 * 1024;

/// The same stream with tonic directly instead of the client library: [`TUNED_MESSAGE`]
/// messages made as the transport asks for them and [`TUNED_WINDOW`] HTTP/2 windows on this
/// side. A diagnostic: how much of the stream's cost is the daemon's.
///
/// # Errors
/// RPC errors, a stream of the wrong length.
pub async fn stream_tuned(socket: &std::path::Path, pids: Pids, bytes: u64) -> Result<StreamRound> {
    use tonic::codegen::tokio_stream;
    use tpm_vault_proto::v1 as pb;
    let daemon = pids.daemon.context("no daemon pid")?;
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))?
        .initial_stream_window_size(TUNED_WINDOW)
        .initial_connection_window_size(TUNED_WINDOW)
        .max_frame_size(tpm_vault_daemon::daemon::HTTP2_MAX_FRAME)
        .connect()
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let mut client = pb::crypto_service_client::CryptoServiceClient::new(channel)
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024);
    let piece = tonic::codegen::Bytes::from(vec![0x5au8; TUNED_MESSAGE]);
    let first = pb::EncryptRequest { key_name: DATA_KEY.into(), context: CONTEXT.to_vec(), data: Default::default() };
    let sizes = (0..bytes.div_ceil(TUNED_MESSAGE as u64))
        .map(move |i| (bytes - i * TUNED_MESSAGE as u64).min(TUNED_MESSAGE as u64) as usize);
    let messages = std::iter::once(first)
        .chain(sizes.map(move |n| pb::EncryptRequest { data: piece.slice(..n), ..Default::default() }));
    let rss_before_kib = procfs::rss_kib(Proc::Pid(daemon))?;
    let cpu_start = CpuSnapshot::take(pids)?;
    let start = Instant::now();
    let mut responses = client.encrypt(tokio_stream::iter(messages)).await.context("Encrypt RPC (tuned)")?.into_inner();
    let mut written = 0u64;
    while let Some(m) = responses.message().await.context("Encrypt RPC (tuned)")? {
        written += m.data.len() as u64;
    }
    let elapsed = start.elapsed();
    let cpu = CpuSnapshot::take(pids)?.since(&cpu_start);
    let expected = sealed_len(bytes)?;
    ensure!(written == expected, "the tuned stream has {written} bytes, expected {expected}");
    Ok(StreamRound { bytes, elapsed, rss_before_kib, rss_peak_kib: rss_before_kib, cpu, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openssl_machine_readable_output() {
        let aes = "+DT:AES-256-GCM:1:16384\n+R:236760:AES-256-GCM:1.000000\n+H:16384\n\
                   +F:25:AES-256-GCM:3879075840.00\n";
        assert_eq!(parse_speed(aes), Some(3_879_075_840.0));
        let ecdsa = "+R5:44418:256:1.00\n+DTP:256:verify:ecdsa:1\n+R6:11616:256:1.00\n\
                     +F4:3:256:44418.000000:11616.000000\n";
        assert_eq!(parse_ecdsa(ecdsa), Some(44_418.0));
        assert_eq!(parse_speed("garbage"), None);
        assert_eq!(parse_ecdsa("+F4:3"), None);
    }

    #[test]
    fn stream_length() {
        // Format v3: the wrapped stream key in the header, a 32-byte commitment at the end.
        let header = 8 + 1 + 1 + DATA_KEY.len() as u64 + 16 + 4 + 12 + 48;
        let len = |n| sealed_len(n).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(len(0), header + 16 + 32);
        assert_eq!(len(CHUNK as u64), header + CHUNK as u64 + 32 + 32);
        assert_eq!(len(1 << 30), header + (1 << 30) + ((1 << 30) / CHUNK as u64 + 1) * 16 + 32);
    }

    #[test]
    fn in_core_rates_are_positive() {
        let pids = Pids { swtpm: std::process::id(), daemon: None };
        let timing = Timing { warmup: Duration::from_millis(10), window: Duration::from_millis(50) };
        assert!(aes_in_core(timing, pids).unwrap_or_else(|e| panic!("{e:#}")) > 0.0);
        assert!(sha_in_core(timing, pids).unwrap_or_else(|e| panic!("{e:#}")) > 0.0);
    }
}
