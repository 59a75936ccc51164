//! A load generator: `--clients` concurrent callers sign 32-byte digests with one key for
//! `--seconds`, then the rate and latency percentiles are printed. For sizing a device ("how
//! many signatures per second does this vault give") and for profiling the daemon under load.
//!
//! ```sh
//! tpm-vault key create load
//! cargo run --release -p tpm-vault-client --example sign_load -- --key load --clients 16 --seconds 10
//! ```
//!
//! Each client has its own connection. Every signature is checked to be non-empty only; the
//! daemon's tests and `tpm-vault-bench` verify signatures.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use tpm_vault_client::{ClientBuilder, SignInput, SignOptions, DEFAULT_SOCKET};

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "sign_load", about = "Concurrent signing load against tpm-vaultd; prints rate and latency")]
struct Args {
    /// The daemon's socket.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Key to sign with (must exist; the caller needs the `sign` permission).
    #[arg(long)]
    key: String,
    /// Concurrent callers, each on its own connection.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Measured time, after a one-second warm-up.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.clients >= 1 && args.seconds > 0.0, "--clients and --seconds must be positive");
    let warmup = Instant::now() + Duration::from_secs(1);
    let end = warmup + Duration::from_secs_f64(args.seconds);
    let key: Arc<str> = Arc::from(args.key.as_str());
    let mut tasks = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        let client = ClientBuilder::new(&args.socket).connect().await.context("connecting to the daemon")?;
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let options = SignOptions::new();
            let (mut latencies, mut total) = (Vec::new(), 0u64);
            loop {
                let t = Instant::now();
                if t >= end {
                    return Ok::<_, tpm_vault_client::Error>((latencies, total));
                }
                let sig = client.sign(&key, SignInput::Digest(vec![7; 32]), &options).await?;
                total += 1;
                let done = Instant::now();
                if t >= warmup && done <= end && !sig.bytes().is_empty() {
                    latencies.push(done - t);
                }
            }
        }));
    }
    let (mut all, mut total) = (Vec::new(), 0);
    for t in tasks {
        let (latencies, n) = t.await.context("client task")??;
        all.extend(latencies);
        total += n;
    }
    all.sort_unstable();
    let pct = |p: f64| all.get(((all.len() as f64 - 1.0) * p).round() as usize).map_or(0, |d| d.as_micros());
    println!(
        "{} clients: {:.0} signs/s, p50 {} us, p99 {} us ({} signatures in {} s; {total} with the warm-up)",
        args.clients,
        all.len() as f64 / args.seconds,
        pct(0.5),
        pct(0.99),
        all.len(),
        args.seconds
    );
    Ok(())
}
