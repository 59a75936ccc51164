//! A TCP proxy between the vault and swtpm (data port P → T, control port P+1 → T+1) that
//! records every byte both ways and can inject TPM faults: it parses TPM command/response
//! headers (tag u16, size u32, code u32) and can replace the responses to one command code
//! with an error code: TPM_RC_RETRY, the way a busy firmware TPM answers, or any other.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// TPM_CC_Sign.
pub const CC_SIGN: u32 = 0x0000_015D;
/// TPM_CC_Unseal.
#[allow(dead_code)]
pub const CC_UNSEAL: u32 = 0x0000_015E;
/// TPM_RC_RETRY.
pub const RC_RETRY: u32 = 0x0000_0922;
/// TPM_RC_PCR_CHANGED: the PCRs changed between TPM2_PolicyPCR and the command the policy
/// session authorizes.
#[allow(dead_code)]
pub const RC_PCR_CHANGED: u32 = 0x0000_0128;

#[derive(Default)]
struct Faults {
    /// Command code whose responses are replaced.
    command: AtomicU32,
    /// The response code put in their place.
    rc: AtomicU32,
    /// How many more responses to replace.
    remaining: AtomicUsize,
    /// How many were replaced.
    injected: AtomicUsize,
    /// Last command code seen on the data channel.
    last_command: AtomicU32,
    /// Commands forwarded on the data channel, by command code.
    counts: Mutex<std::collections::BTreeMap<u32, usize>>,
    /// Command code whose connection is closed instead of forwarding it.
    close_command: AtomicU32,
    /// How many more of those to close.
    close_remaining: AtomicUsize,
}

pub struct TpmProxy {
    pub port: u16,
    captured: Arc<Mutex<Vec<u8>>>,
    faults: Arc<Faults>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl TpmProxy {
    pub fn start(target: u16) -> Self {
        let captured = Arc::new(Mutex::new(Vec::new()));
        let faults = Arc::new(Faults::default());
        let (port, listeners, lock) = (0..20)
            .find_map(|_| {
                let (p, lock) = tpm_vault_daemon::harness::claim_port_pair().ok()?;
                let a = TcpListener::bind(("127.0.0.1", p)).ok()?;
                let b = TcpListener::bind(("127.0.0.1", p + 1)).ok()?;
                Some((p, [a, b], lock))
            })
            .expect("free port pair");
        for (i, listener) in listeners.into_iter().enumerate() {
            let captured = captured.clone();
            let faults = faults.clone();
            let to = target + i as u16;
            let data_channel = i == 0;
            std::thread::spawn(move || {
                for client in listener.incoming().flatten() {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else { continue };
                    let (c2, s2) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
                    if data_channel {
                        commands(c2, s2, captured.clone(), faults.clone());
                        responses(server, client, captured.clone(), faults.clone());
                    } else {
                        raw(c2, s2, captured.clone());
                        raw(server, client, captured.clone());
                    }
                }
            });
        }
        Self { port, captured, faults, _lock: lock }
    }

    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    pub fn contains(&self, needle: &[u8]) -> bool {
        let data = self.captured.lock().expect("lock");
        data.windows(needle.len()).any(|w| w == needle)
    }

    /// Occurrences of `needle` in the captured bytes (e.g. a command code).
    #[allow(dead_code)]
    pub fn count(&self, needle: &[u8]) -> usize {
        let data = self.captured.lock().expect("lock");
        data.windows(needle.len()).filter(|w| *w == needle).count()
    }

    pub fn len(&self) -> usize {
        self.captured.lock().expect("lock").len()
    }

    /// Replaces the next `count` responses to `command` with TPM_RC_RETRY.
    pub fn inject_retry(&self, command: u32, count: usize) {
        self.inject(command, RC_RETRY, count);
    }

    /// Replaces the next `count` responses to `command` with the response code `rc`.
    pub fn inject(&self, command: u32, rc: u32, count: usize) {
        self.faults.command.store(command, Ordering::SeqCst);
        self.faults.rc.store(rc, Ordering::SeqCst);
        self.faults.remaining.store(count, Ordering::SeqCst);
    }

    /// Commands forwarded so far, by command code (a snapshot).
    #[allow(dead_code)]
    pub fn commands(&self) -> std::collections::BTreeMap<u32, usize> {
        self.faults.counts.lock().expect("lock").clone()
    }

    /// Commands forwarded so far, all codes.
    #[allow(dead_code)]
    pub fn total_commands(&self) -> usize {
        self.faults.counts.lock().expect("lock").values().sum()
    }

    /// Closes the connection carrying the next `count` commands `command` instead of
    /// forwarding them: the TCTI gets no response, an I/O error (what the device TCTI returns
    /// when the kernel's resource manager fails `write()` with -ENOMEM, out of slots).
    #[allow(dead_code)]
    pub fn inject_close(&self, command: u32, count: usize) {
        self.faults.close_command.store(command, Ordering::SeqCst);
        self.faults.close_remaining.store(count, Ordering::SeqCst);
    }

    /// Responses replaced (or connections closed) so far.
    pub fn injected(&self) -> usize {
        self.faults.injected.load(Ordering::SeqCst)
    }
}

fn read_frame(from: &mut TcpStream) -> Option<Vec<u8>> {
    let mut header = [0u8; 10];
    from.read_exact(&mut header).ok()?;
    let size = u32::from_be_bytes([header[2], header[3], header[4], header[5]]) as usize;
    let mut frame = header.to_vec();
    if size > 10 {
        let mut rest = vec![0u8; size - 10];
        from.read_exact(&mut rest).ok()?;
        frame.extend_from_slice(&rest);
    }
    Some(frame)
}

fn commands(mut from: TcpStream, mut to: TcpStream, captured: Arc<Mutex<Vec<u8>>>, faults: Arc<Faults>) {
    std::thread::spawn(move || {
        while let Some(frame) = read_frame(&mut from) {
            let cc = u32::from_be_bytes([frame[6], frame[7], frame[8], frame[9]]);
            if faults.close_command.load(Ordering::SeqCst) == cc
                && faults.close_remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
            {
                // As the kernel's resource manager fails write() with -ENOMEM: no response.
                faults.injected.fetch_add(1, Ordering::SeqCst);
                break;
            }
            faults.last_command.store(cc, Ordering::SeqCst);
            *faults.counts.lock().expect("lock").entry(cc).or_default() += 1;
            captured.lock().expect("lock").extend_from_slice(&frame);
            if to.write_all(&frame).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
}

fn responses(mut from: TcpStream, mut to: TcpStream, captured: Arc<Mutex<Vec<u8>>>, faults: Arc<Faults>) {
    std::thread::spawn(move || {
        while let Some(frame) = read_frame(&mut from) {
            captured.lock().expect("lock").extend_from_slice(&frame);
            let inject = faults.last_command.load(Ordering::SeqCst) == faults.command.load(Ordering::SeqCst)
                && faults.remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
            let out = if inject {
                faults.injected.fetch_add(1, Ordering::SeqCst);
                let mut r = vec![0x80, 0x01, 0, 0, 0, 10];
                r.extend_from_slice(&faults.rc.load(Ordering::SeqCst).to_be_bytes());
                r
            } else {
                frame
            };
            if to.write_all(&out).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

fn raw(mut from: TcpStream, mut to: TcpStream, captured: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 || to.write_all(&buf[..n]).is_err() {
                break;
            }
            captured.lock().expect("lock").extend_from_slice(&buf[..n]);
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}
