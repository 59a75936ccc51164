//! A private `swtpm` process: the TPM of machines that have none, and of every test.
//!
//! The daemon starts one with its state under `<state-dir>/swtpm` when there is no
//! `/dev/tpmrm0` (or with `--simulator`); tests start one per test in a temp dir. Ports: swtpm
//! 0.7 cannot listen above 32767, so a free pair (P, P+1) is picked below that, claimed with an
//! advisory lock file so parallel test processes never pick the same pair, and checked free
//! before use. The process is killed on drop. Keys in a simulator are NOT hardware-protected.

use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::tpm::spawn::CloseInheritedFds as _;

/// Why the simulator could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    /// The `swtpm` binary is missing.
    #[error("cannot run swtpm ({0}); install the swtpm package")]
    NotInstalled(std::io::Error),
    /// swtpm did not come up.
    #[error("swtpm did not start: {0}")]
    Start(String),
    /// File system problem with the state directory.
    #[error("swtpm state directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A running swtpm, killed on drop.
#[derive(Debug)]
pub struct Swtpm {
    child: Option<Child>,
    port: u16,
    state_dir: PathBuf,
    /// Held for the life of the process so no other process picks the same ports.
    _port_lock: Flock<File>,
}

/// Port range to pick from (swtpm 0.7.1 cannot bind above 32767).
const PORT_MIN: u16 = 12000;
const PORT_MAX: u16 = 32700;

impl Swtpm {
    /// Starts swtpm with its state in `state_dir` (created if missing) on a free port pair.
    ///
    /// # Errors
    /// [`SimulatorError`] if swtpm is missing or does not answer.
    pub fn start(state_dir: &Path) -> Result<Self, SimulatorError> {
        std::fs::create_dir_all(state_dir)
            .map_err(|source| SimulatorError::Io { path: state_dir.to_owned(), source })?;
        kill_stale(state_dir);
        let mut last = String::new();
        for _ in 0..20 {
            let (port, lock) = claim_port_pair()?;
            match spawn(state_dir, port) {
                Ok(child) => {
                    let mut sim = Self { child: Some(child), port, state_dir: state_dir.to_owned(), _port_lock: lock };
                    match sim.wait_ready(Duration::from_secs(10)) {
                        Ok(()) => return Ok(sim),
                        Err(e) => last = e,
                    }
                }
                Err(e @ SimulatorError::NotInstalled(_)) => return Err(e),
                Err(e) => last = e.to_string(),
            }
        }
        Err(SimulatorError::Start(last))
    }

    /// TCTI string for this simulator.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// TPM command port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// State directory.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Kills the process (SIGKILL, like a crash or power cut) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port with the same state (TPM2_Startup(CLEAR):
    /// PCRs reset, transient objects gone, persistent state kept).
    ///
    /// # Errors
    /// [`SimulatorError::Start`] if it does not come back.
    pub fn restart(&mut self) -> Result<(), SimulatorError> {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // The old socket may linger briefly; retry the spawn until the port is free.
            let child = spawn(&self.state_dir, self.port)?;
            self.child = Some(child);
            match self.wait_ready(Duration::from_secs(5)) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(SimulatorError::Start(e)),
                Err(_) => {
                    self.kill();
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            let Some(child) = self.child.as_mut() else {
                return Err("not running".into());
            };
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(format!("swtpm exited with {status}"));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                // Make sure the listener is ours, not a racing process's.
                std::thread::sleep(Duration::from_millis(20));
                if let Ok(None) = child.try_wait() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.kill();
                return Err("timed out waiting for swtpm".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(state_dir: &Path, port: u16) -> Result<Child, SimulatorError> {
    let pid_file = state_dir.join("swtpm.pid");
    Command::new("swtpm")
        .close_inherited_fds()
        .arg("socket")
        .arg("--tpm2")
        .arg("--tpmstate")
        .arg(format!("dir={}", state_dir.display()))
        .arg("--server")
        .arg(format!("type=tcp,port={port},bindaddr=127.0.0.1"))
        .arg("--ctrl")
        .arg(format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1))
        .arg("--flags")
        .arg("not-need-init,startup-clear")
        .arg("--pid")
        .arg(format!("file={}", pid_file.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(SimulatorError::NotInstalled)
}

/// Kills a swtpm left running on this state dir by a crashed daemon (it would hold the state
/// lock and make the new one fail).
fn kill_stale(state_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(state_dir.join("swtpm.pid")) else {
        return;
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    if cmdline.contains("swtpm") && cmdline.contains(&state_dir.display().to_string()) {
        tracing::warn!(pid, "killing a stale swtpm left by an earlier run");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Picks a port pair (P, P+1) below 32768 whose lock file this process holds and which is
/// currently free. Keep the returned lock while using the ports (tests use it for proxies).
///
/// # Errors
/// [`SimulatorError::Start`] when no pair is free.
pub fn claim_port_pair() -> Result<(u16, Flock<File>), SimulatorError> {
    let lock_dir = std::env::temp_dir().join("tpm-vault-ports");
    std::fs::create_dir_all(&lock_dir).map_err(|source| SimulatorError::Io { path: lock_dir.clone(), source })?;
    let span = u32::from((PORT_MAX - PORT_MIN) / 2);
    let mut seed = seed();
    for _ in 0..500 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let port = PORT_MIN + 2 * ((seed >> 33) as u32 % span) as u16;
        let path = lock_dir.join(format!("{port}.lock"));
        let Ok(file) = OpenOptions::new().create(true).truncate(false).write(true).open(&path) else {
            continue;
        };
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        if port_free(port) && port_free(port + 1) {
            return Ok((port, lock));
        }
    }
    Err(SimulatorError::Start("no free port pair below 32768".into()))
}

fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}
