//! A quick driver for the daemon's `Encrypt`/`Decrypt` streams, outside the full benchmark:
//! `cargo run --release -p tpm-vault-bench --example stream -- SOCKET DAEMON_PID [MIB] [ROUNDS]`.
//! Prints MiB/s and CPU seconds per GiB of the daemon and of this process (the client library).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use anyhow::{Context as _, Result};
use tokio::io::{AsyncReadExt, AsyncWrite};
use tpm_vault_client::{Client, Code};

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

/// The numeric fields of `/proc/PID/stat`, from field 4 of proc(5) (`ppid`) on, at index 0
/// (`i128`: some are signed, some use all 64 bits).
fn stat(pid: &str) -> Result<Vec<i128>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("stat")?.1;
    Ok(rest.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>()?)
}

/// Minor page faults of a process so far.
fn minflt(pid: &str) -> Result<i128> {
    stat(pid)?.get(6).copied().context("stat: minflt")
}

/// utime + stime of a process, seconds.
fn cpu(pid: &str) -> Result<f64> {
    let f = stat(pid)?;
    let ticks = f.get(10).zip(f.get(11)).map(|(u, s)| u + s).context("stat: utime, stime")?;
    Ok(ticks as f64 / 100.0)
}

fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let socket = args.first().context("SOCKET")?.clone();
    let daemon = args.get(1).context("DAEMON_PID")?.clone();
    let mib: u64 = args.get(2).map_or(Ok(1024), |s| s.parse())?;
    let rounds: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let bytes = mib * 1024 * 1024;
    let client = Client::connect(&socket).await?;
    match client.create_data_key("bench-data", None).await {
        Ok(_) => {}
        Err(e) if e.code() == Code::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    // Warm-up and check: round trip of a small stream.
    let plain: Vec<u8> = (0..(3 * 65536 + 1234)).map(|i| (i % 251) as u8).collect();
    let mut sealed = Vec::new();
    client.copy_encrypt("bench-data", b"ctx", &mut plain.as_slice(), &mut sealed).await?;
    let mut opened = Vec::new();
    client.copy_decrypt(b"ctx", &mut sealed.as_slice(), &mut opened).await?;
    anyhow::ensure!(opened == plain, "round trip");
    // A ciphertext of `bytes` for the decrypt stream, held in memory (only when small enough).
    for _ in 0..rounds {
        let (d0, c0, r0, f0) = (cpu(&daemon)?, cpu("self")?, rss_kib(&daemon), minflt("self")?);
        let start = Instant::now();
        let mut source = tokio::io::repeat(0x5a).take(bytes);
        let mut sink = Counter(0);
        client.copy_encrypt("bench-data", b"ctx", &mut source, &mut sink).await?;
        let secs = start.elapsed().as_secs_f64();
        let (d1, c1, r1, f1) = (cpu(&daemon)?, cpu("self")?, rss_kib(&daemon), minflt("self")?);
        let gib = bytes as f64 / (1u64 << 30) as f64;
        println!(
            "encrypt {mib} MiB: {:.0} MiB/s, daemon {:.2} s CPU/GiB, client {:.2} s CPU/GiB, daemon RSS {} -> {} KiB, client page faults {}",
            mib as f64 / secs,
            (d1 - d0) / gib,
            (c1 - c0) / gib,
            r0,
            r1,
            f1 - f0
        );
        if bytes <= 1 << 30 {
            let mut sealed = Vec::with_capacity(bytes as usize + bytes as usize / 4096 + 1024);
            let mut source = tokio::io::repeat(0x5a).take(bytes);
            client.copy_encrypt("bench-data", b"ctx", &mut source, &mut sealed).await?;
            let (d0, c0) = (cpu(&daemon)?, cpu("self")?);
            let start = Instant::now();
            let mut sink = Counter(0);
            client.copy_decrypt(b"ctx", &mut sealed.as_slice(), &mut sink).await?;
            let secs = start.elapsed().as_secs_f64();
            let (d1, c1) = (cpu(&daemon)?, cpu("self")?);
            anyhow::ensure!(sink.0 == bytes, "decrypted length");
            println!(
                "decrypt {mib} MiB: {:.0} MiB/s, daemon {:.2} s CPU/GiB, client {:.2} s CPU/GiB",
                mib as f64 / secs,
                (d1 - d0) / gib,
                (c1 - c0) / gib
            );
        }
    }
    Ok(())
}
