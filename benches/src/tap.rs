//! A counting tap between a TPM client and swtpm: TPM commands per operation, measured.
//!
//! swtpm's TCP server has two channels: the data channel on port P carries raw TPM 2.0 command
//! and response buffers (each starts with a 10-byte header: tag, total size, command code or
//! response code, big-endian), and the control channel on P+1 carries swtpm's own commands.
//! The tap listens on a pair of its own (Q, Q+1, claimed like swtpm's ports so that parallel
//! test processes do not collide); a client pointed at
//! `swtpm:host=127.0.0.1,port=Q` gets one upstream connection per connection it opens. On the
//! data channel the tap forwards one whole command at a time, waits for the whole response and
//! forwards it back, counting the command by its code and adding the time from forwarding the
//! command to receiving the response (the TPM's share of an operation, loopback included). The
//! control channel is forwarded blindly.
//!
//! The tap adds a hop to every command, so timed phases never run through it: only the
//! command census of [`crate::device`] does. Owns no TPM logic and changes no bytes.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use tpm_vault_daemon::harness::claim_port_pair;

/// Largest command or response the tap accepts (TPM2 buffers are at most a few KiB).
const MAX_BUFFER: usize = 64 * 1024;
/// How often the accept loops look at the stop flag.
const POLL: Duration = Duration::from_millis(20);

/// Commands counted so far, by command code: (count, time until the response).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    by_code: BTreeMap<u32, (u64, Duration)>,
}

impl Tally {
    /// What was counted after `earlier` (a snapshot of the same tap).
    pub fn since(&self, earlier: &Tally) -> Tally {
        let mut by_code = BTreeMap::new();
        for (&code, &(n, t)) in &self.by_code {
            let (n0, t0) = earlier.by_code.get(&code).copied().unwrap_or_default();
            if n > n0 {
                by_code.insert(code, (n - n0, t.saturating_sub(t0)));
            }
        }
        Tally { by_code }
    }

    /// Commands in all.
    pub fn commands(&self) -> u64 {
        self.by_code.values().map(|(n, _)| n).sum()
    }

    /// Time the TPM took to answer, summed over the commands.
    pub fn tpm_time(&self) -> Duration {
        self.by_code.values().map(|(_, t)| *t).sum()
    }

    /// Commands with this code.
    #[cfg(test)]
    pub fn count(&self, code: u32) -> u64 {
        self.by_code.get(&code).map_or(0, |(n, _)| *n)
    }

    /// `Load 1, Sign 1` per operation (counts divided by `ops`, in command-code order);
    /// `none` when nothing was sent.
    pub fn describe(&self, ops: u64) -> String {
        if self.by_code.is_empty() {
            return "none".into();
        }
        let ops = ops.max(1) as f64;
        self.by_code
            .iter()
            .map(|(&code, &(n, _))| {
                let per = n as f64 / ops;
                let per = if (per - per.round()).abs() < 0.005 { format!("{per:.0}") } else { format!("{per:.2}") };
                format!("{} {per}", command_name(code))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn add(&mut self, code: u32, took: Duration) {
        let e = self.by_code.entry(code).or_default();
        e.0 += 1;
        e.1 += took;
    }
}

/// TPM 2.0 command codes (Part 2, table 12) the tests use.
#[cfg(test)]
pub mod cc {
    /// TPM2_Quote.
    pub const QUOTE: u32 = 0x158;
}

/// The name of a command code (`0x15d` → `Sign`), or its hex value.
pub fn command_name(code: u32) -> String {
    let name = match code {
        0x11F => "NV_UndefineSpaceSpecial",
        0x120 => "EvictControl",
        0x12A => "NV_DefineSpace",
        0x131 => "CreatePrimary",
        0x144 => "Startup",
        0x145 => "Shutdown",
        0x14E => "NV_Read",
        0x153 => "Create",
        0x157 => "Load",
        0x158 => "Quote",
        0x15D => "Sign",
        0x15E => "Unseal",
        0x161 => "ContextLoad",
        0x162 => "ContextSave",
        0x165 => "FlushContext",
        0x167 => "LoadExternal",
        0x173 => "ReadPublic",
        0x176 => "StartAuthSession",
        0x177 => "VerifySignature",
        0x17A => "GetCapability",
        0x17B => "GetRandom",
        0x17C => "GetTestResult",
        0x17E => "PCR_Read",
        0x17F => "PolicyPCR",
        0x182 => "PCR_Extend",
        0x189 => "PolicyGetDigest",
        0x18A => "TestParms",
        0x18F => "PolicyAuthorize",
        _ => return format!("{code:#x}"),
    };
    name.into()
}

/// A running tap, stopped on drop.
#[derive(Debug)]
pub struct Tap {
    port: u16,
    /// The claim on the port pair (see `claim_port_pair`), held while the tap runs.
    _claim: nix::fcntl::Flock<std::fs::File>,
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Tap {
    /// Starts a tap in front of the swtpm whose data channel is `upstream` (control:
    /// `upstream + 1`) on 127.0.0.1.
    ///
    /// # Errors
    /// When no free port pair is found.
    pub fn start(upstream: u16) -> Result<Self> {
        let (port, claim) = claim_port_pair().context("claiming a port pair for the TPM tap")?;
        let data = TcpListener::bind(("127.0.0.1", port)).context("binding the tap's data port")?;
        let ctrl = TcpListener::bind(("127.0.0.1", port + 1)).context("binding the tap's control port")?;
        let tally = Arc::new(Mutex::new(Tally::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let data_loop = {
            let (tally, stop) = (tally.clone(), stop.clone());
            std::thread::Builder::new()
                .name("tap-data".into())
                .spawn(move || accept_loop(data, &stop, move |c| forward_commands(c, upstream, tally.clone())))?
        };
        let ctrl_loop = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("tap-ctrl".into())
                .spawn(move || accept_loop(ctrl, &stop, move |c| forward_blindly(c, upstream + 1)))?
        };
        Ok(Self { port, _claim: claim, tally, stop, threads: vec![data_loop, ctrl_loop] })
    }

    /// The TCTI that reaches swtpm through the tap.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// What was counted so far.
    pub fn snapshot(&self) -> Tally {
        self.tally.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, stop: &AtomicBool, handle: impl Fn(TcpStream) + Send + Clone + 'static) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let _ = conn.set_nonblocking(false);
                let handle = handle.clone();
                // Connection threads end when either side closes.
                let _ = std::thread::Builder::new().name("tap-conn".into()).spawn(move || handle(conn));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// Reads one TPM buffer (header, then the rest) from `from`; `None` at a clean end of stream.
fn read_buffer(from: &mut TcpStream) -> Result<Option<Vec<u8>>> {
    let mut header = [0u8; 10];
    match from.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let size = u32::from_be_bytes([header[2], header[3], header[4], header[5]]) as usize;
    ensure!((10..=MAX_BUFFER).contains(&size), "TPM buffer of {size} bytes");
    let mut buf = vec![0u8; size];
    buf[..10].copy_from_slice(&header);
    from.read_exact(&mut buf[10..])?;
    Ok(Some(buf))
}

fn forward_commands(mut client: TcpStream, upstream: u16, tally: Arc<Mutex<Tally>>) {
    let Ok(mut tpm) = TcpStream::connect(("127.0.0.1", upstream)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = tpm.set_nodelay(true);
    let result = (|| -> Result<()> {
        while let Some(command) = read_buffer(&mut client)? {
            let code = u32::from_be_bytes([command[6], command[7], command[8], command[9]]);
            let sent = Instant::now();
            tpm.write_all(&command)?;
            let response = read_buffer(&mut tpm)?.context("swtpm closed the connection mid-command")?;
            let took = sent.elapsed();
            if let Ok(mut t) = tally.lock() {
                t.add(code, took);
            }
            client.write_all(&response)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        eprintln!("warning: TPM tap: {e:#}");
    }
    let _ = tpm.shutdown(Shutdown::Both);
    let _ = client.shutdown(Shutdown::Both);
}

fn forward_blindly(client: TcpStream, upstream: u16) {
    let Ok(tpm) = TcpStream::connect(("127.0.0.1", upstream)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(mut c_read), Ok(mut t_write)) = (client.try_clone(), tpm.try_clone()) else { return };
    let up = std::thread::spawn(move || {
        let _ = io::copy(&mut c_read, &mut t_write);
        let _ = t_write.shutdown(Shutdown::Write);
    });
    let (mut t_read, mut c_write) = (tpm, client);
    let _ = io::copy(&mut t_read, &mut c_write);
    let _ = c_write.shutdown(Shutdown::Write);
    let _ = up.join();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_subtract_and_describe() {
        let ms = Duration::from_millis;
        const PCR_READ: u32 = 0x17E;
        let mut a = Tally::default();
        a.add(PCR_READ, ms(1));
        let before = a.clone();
        for _ in 0..2 {
            a.add(PCR_READ, ms(1));
            a.add(cc::QUOTE, ms(3));
        }
        let d = a.since(&before);
        assert_eq!(d.commands(), 4);
        assert_eq!(d.tpm_time(), ms(8));
        assert_eq!(d.count(cc::QUOTE), 2);
        assert_eq!(d.describe(2), "Quote 1, PCR_Read 1");
        assert_eq!(Tally::default().describe(1), "none");
        assert_eq!(command_name(0x1ff), "0x1ff");
    }

    #[test]
    fn forwards_and_counts_whole_commands() {
        // A fake TPM that answers every command with a 10-byte success response.
        let fake = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let upstream = fake.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("{e}"));
        std::thread::spawn(move || {
            if let Ok((mut conn, _)) = fake.accept() {
                while let Ok(Some(_)) = read_buffer(&mut conn) {
                    let _ = conn.write_all(&[0x80, 0x01, 0, 0, 0, 10, 0, 0, 0, 0]);
                }
            }
        });
        let tap = Tap::start(upstream).unwrap_or_else(|e| panic!("{e:#}"));
        let mut c = TcpStream::connect(("127.0.0.1", tap.port)).unwrap_or_else(|e| panic!("{e}"));
        // TPM2_GetRandom(8): tag, size 12, code, bytesRequested.
        let cmd = [0x80, 0x01, 0, 0, 0, 12, 0, 0, 0x01, 0x7B, 0, 8];
        for _ in 0..3 {
            c.write_all(&cmd).unwrap_or_else(|e| panic!("{e}"));
            let mut resp = [0u8; 10];
            c.read_exact(&mut resp).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(resp[..2], [0x80, 0x01]);
        }
        assert_eq!(tap.snapshot().count(0x17B), 3);
        assert_eq!(tap.snapshot().describe(3), "GetRandom 1");
    }
}
