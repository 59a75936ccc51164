//! The daemon's lifecycle: start the simulator if needed, open the vault, bind the Unix socket
//! (or take it from systemd), announce readiness, serve until shutdown, drain, flush the TPM.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::config::Config;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::rpc::{self, Ctx};
use crate::simulator::Swtpm;
use crate::tpm::QueueConfig;
use crate::vault::{Vault, VaultConfig};

/// Socket file mode: owner and group (`tpm-vault`) may connect, nobody else.
pub const SOCKET_MODE: u32 = 0o660;

/// Why the daemon could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another daemon is serving on the socket.
    #[error("socket {0} is in use by a running daemon")]
    SocketInUse(PathBuf),
    /// Socket setup failed.
    #[error("socket {path}: {source}")]
    Socket {
        /// Path.
        path: PathBuf,
        /// Error.
        #[source]
        source: std::io::Error,
    },
    /// The embedded simulator could not start.
    #[error(transparent)]
    Simulator(#[from] crate::simulator::SimulatorError),
    /// Opening the vault failed.
    #[error(transparent)]
    Vault(#[from] Error),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Binds the Unix socket: replaces a stale file left by a crashed run, refuses to steal a live
/// one, and sets mode 0660.
///
/// # Errors
/// [`ServerError::SocketInUse`] if a daemon answers on it; [`ServerError::Socket`] otherwise.
pub fn bind_unix(path: &Path) -> Result<StdUnixListener, ServerError> {
    let err = |source| ServerError::Socket {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServerError::SocketInUse(path.to_owned()));
        }
        tracing::info!(socket = %path.display(), "removing stale socket from an earlier run");
        std::fs::remove_file(path).map_err(err)?;
    }
    let listener = StdUnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    Ok(listener)
}

/// A socket passed by systemd socket activation (`LISTEN_FDS`), if any.
///
/// # Errors
/// [`ServerError::Socket`] if the passed fd is not a Unix listener.
pub fn activated_listener() -> Result<Option<StdUnixListener>, ServerError> {
    let mut fds = listenfd::ListenFd::from_env();
    match fds.take_unix_listener(0) {
        Ok(Some(l)) => {
            l.set_nonblocking(true)
                .map_err(|source| ServerError::Socket {
                    path: "LISTEN_FDS".into(),
                    source,
                })?;
            Ok(Some(l))
        }
        Ok(None) => Ok(None),
        Err(source) => Err(ServerError::Socket {
            path: "LISTEN_FDS".into(),
            source,
        }),
    }
}

/// Runs the daemon until `shutdown` resolves: the whole lifecycle behind `tpm-vaultd`.
///
/// # Errors
/// [`ServerError`] for anything that prevents starting; serving errors after start.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let mut config = config;
    let _simulator = if config.simulator {
        let sim = start_simulator(&config.state_dir).await?;
        config.tcti = sim.tcti();
        Some(sim)
    } else {
        None
    };
    let vault = Vault::open(VaultConfig {
        state_dir: config.state_dir.clone(),
        tcti: config.tcti.clone(),
        max_loaded_objects: config.max_loaded_objects,
        queue: QueueConfig {
            timeout: config.tpm_timeout,
            ..QueueConfig::default()
        },
        simulator: config.simulator,
    })
    .await?;
    let (listener, owned_socket) = match activated_listener()? {
        Some(l) => (l, None),
        None => (bind_unix(&config.socket)?, Some(config.socket.clone())),
    };
    let listener = UnixListener::from_std(listener).map_err(|source| ServerError::Socket {
        path: config.socket.clone(),
        source,
    })?;
    let result = serve(vault.clone(), listener, shutdown, config.shutdown_grace).await;
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    vault.shutdown(config.shutdown_grace).await;
    if let Some(path) = owned_socket {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("stopped");
    result
}

/// Serves the API on `listener` until `shutdown`, then stops accepting and waits up to `grace`
/// for in-flight requests. Sends `READY=1` to systemd once accepting.
///
/// # Errors
/// [`ServerError::Transport`] if the server fails.
pub async fn serve(
    vault: Vault,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
    grace: std::time::Duration,
) -> Result<(), ServerError> {
    let ctx = Ctx {
        vault,
        metrics: Arc::new(Metrics::default()),
    };
    let routes = rpc::routes(ctx)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_routes(routes)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
            let _ = stop_rx.await;
        });
    tokio::pin!(server);
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    tracing::info!("ready");
    tokio::select! {
        r = &mut server => return r.map_err(ServerError::from),
        () = shutdown => {}
    }
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "shutting down: draining in-flight requests"
    );
    let _ = stop_tx.send(());
    match tokio::time::timeout(grace, &mut server).await {
        Ok(r) => r.map_err(ServerError::from),
        Err(_) => {
            tracing::warn!("requests still running after the grace period; stopping anyway");
            Ok(())
        }
    }
}

async fn start_simulator(state_dir: &Path) -> Result<Swtpm, ServerError> {
    tracing::warn!(
        "no TPM in use: starting a private swtpm under {}/swtpm. Keys are NOT hardware-protected.",
        state_dir.display()
    );
    let dir = state_dir.join("swtpm");
    let sim = tokio::task::spawn_blocking(move || Swtpm::start(&dir))
        .await
        .map_err(|e| Error::Internal(format!("simulator task: {e}")))??;
    Ok(sim)
}
