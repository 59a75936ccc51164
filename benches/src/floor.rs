//! The floors under every "latency the vault adds" figure: the gRPC transport's own round trip
//! and a bare hand-off between two OS threads, both without the vault.
//!
//! A bare tonic server serving only the standard `grpc.health.v1` health service runs in a
//! child process (this binary with `--grpc-floor-server SOCKET`), with the runtime shape of
//! `tpm-vaultd` (a multi-thread runtime with the daemon's default worker count, HTTP/2 frames as
//! large as the daemon's), on a Unix socket. One client checks its health back to back; no
//! request does any work, so the p50 is what one unary gRPC call costs on this machine before
//! any server does anything: two processes woken, HTTP/2 framing both ways, prost encoding. The
//! same check against `tpm-vaultd` (in [`crate::sign::daemon`]) measures the daemon's gRPC
//! stack without a TPM job; both use [`crate::sign::health`].
//!
//! [`thread_round_trip`] times the other half: one thread hands a message to another, which
//! hands it straight back (std channels, nothing else). The vault library pays one such round
//! trip per TPM job, because one dedicated thread owns the TPM; this is its cost on this
//! machine with no tokio, queue bookkeeping or TPM work in it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use crate::sign::{timed_loop, Pids, Timing};
use crate::stats::Measurement;

/// The hidden flag that turns this binary into the bare server.
pub const SERVER_FLAG: &str = "--grpc-floor-server";

/// How long the child gets to bind its socket.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The child's entry point: serves the health service on `socket` until killed.
///
/// # Errors
/// Runtime, bind or server failures.
pub fn serve(socket: &Path) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(tpm_vault_daemon::daemon::default_worker_threads())
        .enable_all()
        .build()
        .context("runtime")?;
    runtime.block_on(async {
        let listener = UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
        tonic::transport::Server::builder()
            .max_frame_size(tpm_vault_daemon::daemon::HTTP2_MAX_FRAME)
            .add_service(service)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .context("serving")
    })
}

/// The bare server's process, killed on drop.
#[derive(Debug)]
pub struct FloorServer {
    child: Child,
    socket: PathBuf,
}

impl FloorServer {
    /// Starts the child on a socket in `dir` and waits until it accepts.
    ///
    /// # Errors
    /// Spawn failures, or the socket not accepting in time.
    pub fn start(dir: &Path) -> Result<Self> {
        let socket = dir.join("grpc-floor.sock");
        let _ = std::fs::remove_file(&socket);
        let exe = std::env::current_exe().context("locating this benchmark's binary")?;
        let child = Command::new(exe)
            .close_inherited_fds()
            .arg(SERVER_FLAG)
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the bare gRPC server")?;
        let server = Self { child, socket };
        let deadline = Instant::now() + START_TIMEOUT;
        while std::os::unix::net::UnixStream::connect(&server.socket).is_err() {
            if Instant::now() > deadline {
                bail!("the bare gRPC server did not accept on {} in time", server.socket.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for FloorServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Round trips between this thread and an echo thread, back to back, over two std channels of
/// capacity 1.
///
/// # Errors
/// The echo thread failing to start or vanishing; a vanished process of `pids`.
pub fn thread_round_trip(timing: Timing, pids: Pids) -> Result<Measurement> {
    let (to_echo, echo_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let (echo_tx, from_echo) = std::sync::mpsc::sync_channel::<()>(1);
    let echo = std::thread::Builder::new()
        .name("echo".into())
        .spawn(move || {
            while echo_rx.recv().is_ok() {
                if echo_tx.send(()).is_err() {
                    break;
                }
            }
        })
        .context("starting the echo thread")?;
    let m = timed_loop(timing, pids, || {
        to_echo.send(()).context("the echo thread stopped")?;
        from_echo.recv().context("the echo thread stopped")
    });
    drop(to_echo);
    let _ = echo.join();
    m
}
