//! Port pairs (P, P+1) below 32768 for the model's client endpoints.
//!
//! The same scheme as `tpm_vault_daemon::harness::claim_port_pair` (its lock files, its range),
//! so a model, the daemon's private swtpm and the test proxies in parallel test processes never
//! pick the same pair. swtpm's TCTI does not care about the range, but sharing the claim
//! keeps everyone out of each other's way.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::TcpListener;

use nix::fcntl::{Flock, FlockArg};

/// Port range to pick from (swtpm 0.7.1 cannot bind above 32767; the daemon's harness uses
/// the same range).
const PORT_MIN: u16 = 12000;
const PORT_MAX: u16 = 32700;

/// A claimed, bound port pair: the data and control listeners and the lock that keeps other
/// processes off the pair while it is in use.
#[derive(Debug)]
pub struct PortPair {
    /// The data port P (the control port is P+1).
    pub port: u16,
    /// Listening on P.
    pub data: TcpListener,
    /// Listening on P+1.
    pub ctrl: TcpListener,
    /// Held while the pair is used.
    pub claim: Flock<File>,
}

/// Claims a free pair and binds both ports on 127.0.0.1.
///
/// # Errors
/// When no pair is free after many tries.
pub fn claim_pair() -> io::Result<PortPair> {
    let lock_dir = std::env::temp_dir().join("tpm-vault-ports");
    std::fs::create_dir_all(&lock_dir)?;
    let span = u32::from((PORT_MAX - PORT_MIN) / 2);
    let mut seed = seed();
    for _ in 0..500 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let port = PORT_MIN + 2 * ((seed >> 33) as u32 % span) as u16;
        let path = lock_dir.join(format!("{port}.lock"));
        let Ok(file) = OpenOptions::new().create(true).truncate(false).write(true).open(&path) else {
            continue;
        };
        let Ok(claim) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        let Ok(data) = TcpListener::bind(("127.0.0.1", port)) else { continue };
        let Ok(ctrl) = TcpListener::bind(("127.0.0.1", port + 1)) else { continue };
        return Ok(PortPair { port, data, ctrl, claim });
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, "no free port pair below 32768"))
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let tid = std::thread::current().id();
    let h = format!("{tid:?}").bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    t ^ (u64::from(std::process::id()) << 32) ^ h
}
