//! The daemon's lifecycle: start the simulator if needed, open the vault, bind the Unix socket
//! (or take it from systemd), announce readiness, serve until shutdown, drain, flush the TPM.
//!
//! [`run`] owns the whole sequence and the pieces that live as long as the daemon: the per-RPC
//! [`Metrics`], the optional Prometheus endpoint ([`crate::observe::telemetry`]) and the systemd
//! watchdog ([`crate::serve::systemd`]). [`serve_ctx`] and its variants are the part tests drive directly:
//! serve one listener until a shutdown future resolves, then drain with a bound.
//!
//! Order at start: access policy loaded (a bad policy stops the daemon before anything else) →
//! state directory checked (refused if anyone but the daemon's user and root could change it) →
//! vault open (SRK loaded and its name checked) → metrics endpoint bound → TLS listener built
//! and bound, if configured ([`crate::serve::tls`]) → Unix socket bound (or taken from systemd) →
//! servers accepting → `READY=1`. Both listeners serve the same services until shutdown. At shutdown:
//! `STOPPING=1` → stop accepting → wait up to the grace period for in-flight requests (then
//! answer the rest `UNAVAILABLE`) → stop the TPM actor, which flushes every transient object it
//! loaded → remove our socket file.

use std::convert::Infallible;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::net::UnixListener;
use tonic::codegen::{http, Service};
use tonic::service::{AxumBody, AxumRouter, Routes};

use crate::auth::audit::AuditLog;
use crate::auth::{Access, PolicyError};
use crate::config::{Config, ServeLimits};
use crate::error::Error;
use crate::observe::metrics::Metrics;
use crate::observe::telemetry::{self, MetricsSource};
use crate::rpc::{self, Ctx};
use crate::serve::bounds::{ConnectionLimits, FrameLimit, UnixIncoming};
use crate::tpm::simulator::Swtpm;
use crate::tpm::QueueConfig;
use crate::vault::{Vault, VaultConfig};

/// Socket file mode: owner and group (`tpm-vault`) may connect, nobody else.
pub const SOCKET_MODE: u32 = 0o660;

/// Added to `tpm_timeout` for stopping the TPM actor at shutdown (the command in progress plus
/// the flushes).
const TPM_STOP_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Why the daemon could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another daemon is serving on the socket.
    #[error("socket {0} is in use by a running daemon")]
    SocketInUse(PathBuf),
    /// Socket setup failed.
    #[error("socket {path}: {source}")]
    Socket {
        /// The socket's path.
        path: PathBuf,
        /// What binding, or setting its mode, failed with.
        #[source]
        source: std::io::Error,
    },
    /// The audit log file cannot be opened (a configuration error: exit 64).
    #[error("audit log {path}: {source}")]
    AuditLog {
        /// Configured path.
        path: PathBuf,
        /// Open error.
        #[source]
        source: std::io::Error,
    },
    /// The access policy does not load (file, line and reason).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The embedded simulator could not start.
    #[error(transparent)]
    Simulator(#[from] crate::tpm::simulator::SimulatorError),
    /// Opening the vault failed.
    #[error(transparent)]
    Vault(#[from] Error),
    /// The Prometheus endpoint could not be bound.
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        /// Configured address.
        addr: std::net::SocketAddr,
        /// Bind error.
        #[source]
        source: std::io::Error,
    },
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// The TLS listener could not be set up (key, chain, client CAs, address).
    #[error(transparent)]
    Tls(#[from] crate::serve::tls::TlsError),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

impl ServerError {
    /// Whether the daemon cannot start because of how it is configured or installed, as with a
    /// bad config file (`tpm-vaultd` exits 64): a policy or audit log that does not load, or a
    /// state directory others could change.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            ServerError::Policy(_)
                | ServerError::AuditLog { .. }
                | ServerError::Vault(Error::Store(crate::store::StoreError::Unsafe { .. }))
        )
    }
}

/// Binds the Unix socket: replaces a stale file left by a crashed run, refuses to steal a live
/// one, and puts it in place with mode 0660 already set, so it is never connectable by others,
/// even for a moment, whatever umask the daemon was started with: it is bound inside a private
/// directory (0700, next to `path`), given its mode there and renamed into place. (Not by
/// narrowing the umask around `bind`: the umask is the whole process's, and a directory another
/// thread created meanwhile, a state directory for one, came out group-writable.)
///
/// # Errors
/// [`ServerError::SocketInUse`] if a daemon answers on it; [`ServerError::Socket`] otherwise.
pub fn bind_unix(path: &Path) -> Result<StdUnixListener, ServerError> {
    let err = |source| ServerError::Socket { path: path.to_owned(), source };
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
    let private = private_dir_beside(path).map_err(err)?;
    let staged = private.join("s");
    let bound = StdUnixListener::bind(&staged).and_then(|listener| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(SOCKET_MODE))?;
        std::fs::rename(&staged, path)?;
        Ok(listener)
    });
    // Empty after the rename; after a failure, whatever was staged goes with it.
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    let listener = bound.map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    Ok(listener)
}

/// Creates a directory only this user can enter (0700), in the directory of `path`, with a
/// name of this process's and this call's own (a leftover of a crashed run with the same pid is
/// reused).
fn private_dir_beside(path: &Path) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = parent.join(format!(".tpm-vault-bind.{}.{call}", std::process::id()));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        other => other?,
    }
    // Exactly 0700, also under an unusual umask; and refuse a planted directory or link.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || std::os::unix::fs::MetadataExt::uid(&meta) != nix::unistd::geteuid().as_raw() {
        return Err(std::io::Error::other(format!("{} is not a directory of this user", dir.display())));
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// A socket passed by systemd socket activation (`LISTEN_FDS`/`LISTEN_PID`), if any.
///
/// Call it once, before the runtime starts: it unsets `LISTEN_FDS` and `LISTEN_PID` so that
/// child processes (the embedded swtpm) do not inherit them. Peer credentials work on such a
/// socket exactly as on one we bind: tonic's `UdsConnectInfo` comes from each accepted
/// `tokio::net::UnixStream` (`SO_PEERCRED`), whoever created the listener.
///
/// # Errors
/// [`ServerError::Socket`] if the passed fd is not a Unix listener.
pub fn activated_listener() -> Result<Option<StdUnixListener>, ServerError> {
    let mut fds = listenfd::ListenFd::from_env();
    match fds.take_unix_listener(0) {
        Ok(Some(l)) => {
            l.set_nonblocking(true).map_err(|source| ServerError::Socket { path: "LISTEN_FDS".into(), source })?;
            Ok(Some(l))
        }
        Ok(None) => Ok(None),
        Err(source) => Err(ServerError::Socket { path: "LISTEN_FDS".into(), source }),
    }
}

/// Runs the daemon until `shutdown` resolves: the whole lifecycle behind `tpm-vaultd`.
///
/// `activated` is the socket systemd passed ([`activated_listener`], taken before the runtime
/// started); without one the daemon binds `config.socket` itself and removes it on exit.
///
/// # Errors
/// [`ServerError`] for anything that prevents starting; serving errors after start.
pub async fn run(
    config: Config,
    activated: Option<StdUnixListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let mut config = config;
    // Policies first: a policy that does not load stops the daemon before it touches anything.
    let audit = match &config.audit_log {
        Some(path) => {
            AuditLog::with_file(path).map_err(|source| ServerError::AuditLog { path: path.clone(), source })?
        }
        None => AuditLog::tracing_only(),
    };
    let access =
        Arc::new(Access::load(&config.policies, config.policies_configured, audit)?.with_keygen_limit(config.keygen));
    // Then the state directory: one others could change is not used at all (not even for the
    // simulator's state).
    crate::store::check_state_dir(&config.state_dir).map_err(Error::from)?;
    spawn_policy_reload(access.clone());
    let _simulator = if config.simulator {
        let sim = start_simulator(&config.state_dir).await?;
        config.tcti = sim.tcti();
        Some(sim)
    } else {
        None
    };
    crate::serve::systemd::notify_status("opening the TPM");
    let vault = Vault::open(VaultConfig {
        state_dir: config.state_dir.clone(),
        tcti: config.tcti.clone(),
        max_loaded_objects: config.max_loaded_objects,
        resource_manager: Some(config.resource_manager.resolve(&config.tcti)),
        queue: QueueConfig { timeout: config.tpm_timeout, ..QueueConfig::default() },
        simulator: config.simulator,
        datakey_idle: config.datakey_idle,
        lockout: config.lockout.clone(),
    })
    .await?;
    // As loud as --simulator's own warning (which already said it when starting the swtpm).
    if let (Some(software), false) = (vault.software_tpm(), config.simulator) {
        tracing::warn!(
            tcti = %config.tcti,
            "the TPM is a software TPM ({software}). Keys are NOT hardware-protected: use a hardware TPM \
             (device:/dev/tpmrm0) in production."
        );
    }
    let metrics = Arc::new(Metrics::default());
    let result = serve_vault(&config, vault.clone(), metrics, access, activated, shutdown).await;
    // Requests are answered by now, but jobs they queued may still be waiting for the TPM;
    // each has a deadline of at most `tpm_timeout`, after which the actor skips it. So this
    // bound lets the actor run out its queue and flush every transient object it loaded.
    crate::serve::systemd::notify_status("flushing TPM objects");
    vault.shutdown(config.tpm_timeout + TPM_STOP_MARGIN).await;
    tracing::info!("stopped");
    result
}

/// Everything between an open vault and its shutdown; the vault is shut down by the caller
/// whatever happens here.
async fn serve_vault(
    config: &Config,
    vault: Vault,
    metrics: Arc<Metrics>,
    access: Arc<Access>,
    activated: Option<StdUnixListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let metrics_task = match config.metrics_listen {
        Some(addr) => {
            let listener = telemetry::bind(addr).await.map_err(|source| ServerError::Metrics { addr, source })?;
            let source = MetricsSource { rpc: metrics.clone(), vault: vault.clone(), access: access.clone() };
            Some(AbortOnDrop(telemetry::spawn(listener, source)))
        }
        None => None,
    };
    let tls = match &config.listen {
        Some(l) => {
            let tls = crate::serve::tls::TlsListener::bind(&vault, l.addr, &l.key, &l.client_ca)
                .await?
                .with_pins(&l.pins)
                .await?;
            tracing::info!(addr = %l.addr, key = %l.key, "TLS listener bound (client certificates required)");
            Some(tls)
        }
        None => None,
    };
    let (listener, owned_socket) = match activated {
        Some(l) => {
            tracing::info!("using the socket passed by systemd (socket activation)");
            (l, None)
        }
        None => (bind_unix(&config.socket)?, Some(config.socket.clone())),
    };
    let listener = UnixListener::from_std(listener)
        .map_err(|source| ServerError::Socket { path: config.socket.clone(), source })?;
    let _watchdog = crate::serve::systemd::spawn_watchdog(vault.tpm().clone()).map(AbortOnDrop);
    let ctx = Ctx::new(vault, metrics, access).with_event_log(config.event_log.as_deref());
    let result = serve_ctx_with_tls(ctx, listener, tls, shutdown, config.shutdown_grace, &config.limits).await;
    drop(metrics_task);
    if let Some(path) = owned_socket {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// Serves the API on `listener` with the given connection and stream bounds until `shutdown`,
/// then stops accepting and waits up to `grace` for in-flight requests. Sends `READY=1` to
/// systemd once accepting. Per-RPC metrics go to a fresh registry; use [`serve_ctx`] to supply
/// one.
///
/// # Errors
/// [`ServerError::Transport`] if the server fails.
pub async fn serve_with_limits(
    vault: Vault,
    access: Arc<Access>,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
    grace: std::time::Duration,
    limits: &ServeLimits,
) -> Result<(), ServerError> {
    let ctx = Ctx::new(vault, Arc::new(Metrics::default()), access);
    serve_ctx_with_tls(ctx, listener, None, shutdown, grace, limits).await
}

/// Serves the API with the handlers' context given by the caller (so the caller can share the
/// metrics registry with the Prometheus endpoint). Sends `READY=1` once accepting and
/// `STOPPING=1` as soon as `shutdown` resolves.
///
/// # Errors
/// [`ServerError::Transport`] if the server fails.
pub async fn serve_ctx(
    ctx: Ctx,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
    grace: std::time::Duration,
) -> Result<(), ServerError> {
    serve_ctx_with_tls(ctx, listener, None, shutdown, grace, &ServeLimits::default()).await
}

/// [`serve_ctx`] plus, when given, the TLS listener ([`crate::serve::tls::TlsListener`]): both serve
/// the same services and drain together at shutdown.
///
/// # Errors
/// [`ServerError::Transport`] if either server fails.
pub async fn serve_ctx_with_tls(
    ctx: Ctx,
    listener: UnixListener,
    tls: Option<crate::serve::tls::TlsListener>,
    shutdown: impl Future<Output = ()>,
    grace: std::time::Duration,
    limits: &ServeLimits,
) -> Result<(), ServerError> {
    let (expire_tx, expire_rx) = tokio::sync::watch::channel(false);
    let routes =
        Routes::from(AxumRouter::new().fallback_service(Draining { inner: rpc::routes(ctx)?, expired: expire_rx }));
    let connections = ConnectionLimits::new(limits.max_connections, limits.max_connections_per_client);
    let incoming = UnixIncoming::new(listener, connections);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let unix = http2_server(limits)
        .add_routes(routes.clone())
        .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone()));
    let tls = async {
        match tls {
            Some(tls) => {
                http2_server(limits)
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(tls.incoming(limits.tls_connections()), stopped(stop_rx))
                    .await
            }
            None => Ok(()),
        }
    };
    let server = async { tokio::try_join!(unix, tls).map(|_| ()) };
    tokio::pin!(server);
    crate::serve::systemd::notify_ready("serving");
    tracing::info!("ready");
    tokio::select! {
        r = &mut server => return r.map_err(ServerError::from),
        () = shutdown => {}
    }
    crate::serve::systemd::notify_stopping("draining in-flight requests");
    tracing::info!(
        grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
        "shutting down: draining in-flight requests"
    );
    let _ = stop_tx.send(true);
    if let Ok(r) = tokio::time::timeout(grace, &mut server).await {
        return r.map_err(ServerError::from);
    }
    tracing::warn!("requests still running after the grace period; answering them UNAVAILABLE");
    let _ = expire_tx.send(true);
    match tokio::time::timeout(CLOSE_TIMEOUT, &mut server).await {
        Ok(r) => r.map_err(ServerError::from),
        Err(_) => {
            tracing::warn!("connections still open; closing them");
            Ok(())
        }
    }
}

/// Largest HTTP/2 DATA frame the daemon accepts (advertised in its SETTINGS; the client
/// library advertises the same). With HTTP/2's default of 16 KiB, a bulk `Encrypt`/`Decrypt`
/// stream cost a `recv` and a `writev` (and a wake-up of the other side) per 16 KiB; with this,
/// a whole 256 KiB request or response message travels as one frame. Flow control is
/// unchanged (hyper's default windows: 1 MiB per stream and per connection), so this does not
/// raise the data a connection may buffer.
pub const HTTP2_MAX_FRAME: u32 = 1024 * 1024;

/// How often an idle connection is pinged, and how long its peer has to answer before the
/// connection is closed (a client that vanished without closing, or one that stopped reading).
const KEEPALIVE: (std::time::Duration, std::time::Duration) =
    (std::time::Duration::from_secs(30), std::time::Duration::from_secs(10));

/// Streams a client may reset before the server has seen them, per connection (the HTTP/2
/// rapid-reset attack, CVE-2023-44487).
const MAX_PENDING_RESETS: usize = 32;

/// The largest header block a request may send: gRPC requests carry a path, a content type and
/// a timeout.
const MAX_HEADER_LIST: u32 = 16 * 1024;

/// The gRPC server with the daemon's HTTP/2 settings ([`HTTP2_MAX_FRAME`], streams per
/// connection, keepalive, reset and header bounds).
fn http2_server(limits: &ServeLimits) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_frame_size(HTTP2_MAX_FRAME)
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_keepalive_interval(Some(KEEPALIVE.0))
        .http2_keepalive_timeout(Some(KEEPALIVE.1))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .http2_max_header_list_size(MAX_HEADER_LIST)
}

/// After the grace period: how long answered connections get to close before they are dropped.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Wraps every route so that, once the grace period is over, requests still running are
/// answered `UNAVAILABLE` (retryable) instead of having their connection cut, which clients see
/// as an opaque transport error. Their TPM jobs, if any, still finish or fail inside the actor.
/// It also bounds each request's messages ([`crate::serve::bounds::max_message`]).
#[derive(Debug, Clone)]
struct Draining {
    inner: Routes,
    /// Becomes `true` when the grace period is over.
    expired: tokio::sync::watch::Receiver<bool>,
}

impl Service<http::Request<AxumBody>> for Draining {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<http::Request<AxumBody>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: http::Request<AxumBody>) -> Self::Future {
        // Each method's message bound, checked on the message prefixes as they arrive.
        let limit = crate::serve::bounds::max_message(req.uri().path());
        let req = req.map(|body| AxumBody::new(FrameLimit::new(body, limit)));
        let response = self.inner.call(req);
        let mut expired = self.expired.clone();
        Box::pin(async move {
            let expiry = async move {
                if expired.wait_for(|e| *e).await.is_err() {
                    // The server is gone without expiring: let the request finish.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                r = response => r.map(hold_until_sent),
                () = expiry => {
                    let status = crate::rpc::error_status::shutting_down();
                    let (parts, ()) = status.into_http::<()>().into_parts();
                    Ok(http::Response::from_parts(parts, tonic::body::Body::empty()))
                }
            }
        })
    }
}

/// A response whose handler reserved its bytes against the client's budget
/// ([`crate::auth::limits::InFlight`]) keeps the reservation in its body, given back when the
/// body is dropped: once the transport sent it (or the stream was reset).
fn hold_until_sent(mut response: http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> {
    match response.extensions_mut().remove::<crate::auth::limits::InFlight>().and_then(|f| f.take()) {
        Some(reservation) => {
            response.map(|body| tonic::body::Body::new(Holding { inner: body, _reservation: reservation }))
        }
        None => response,
    }
}

/// A response body holding its reservation of response bytes ([`hold_until_sent`]).
struct Holding {
    inner: tonic::body::Body,
    _reservation: crate::auth::limits::Reservation,
}

impl http_body::Body for Holding {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Aborts a background task when dropped (metrics endpoint, watchdog).
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
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

/// On SIGHUP: reopens the audit log file (log rotation) and reloads the access policy. A policy
/// that does not load is logged and the old one stays in force; one without rules is a loud
/// warning, since it denies every request.
fn spawn_policy_reload(access: Arc<Access>) {
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot watch SIGHUP; policy reload disabled");
            return;
        };
        while hup.recv().await.is_some() {
            access.reopen_audit_log();
            match access.reload() {
                Ok(0) => tracing::warn!(
                    rules = 0,
                    "access policy reloaded with NO rules: every request will be denied until rules are added"
                ),
                Ok(rules) => tracing::info!(rules, "access policy reloaded"),
                Err(e) => tracing::error!(error = %e, "access policy NOT reloaded; the previous policy stays in force"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};

    /// Binding the socket leaves the process's other threads alone: directories they create
    /// while sockets are being bound get the mode they asked for (less the umask the process
    /// runs with). When `bind_unix` narrowed the umask around `bind`, a state directory another
    /// thread made at that moment came out 0640/0660 and the state-directory check refused it.
    #[test]
    fn binding_does_not_change_the_modes_other_threads_get() {
        let root = tempfile::tempdir().unwrap();
        let umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
        let expected = 0o755;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let binder = {
            let (root, done) = (root.path().to_owned(), done.clone());
            std::thread::spawn(move || {
                for i in 0..2000 {
                    let _listener = super::bind_unix(&root.join(format!("s{i}"))).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        };
        let mut wrong = Vec::new();
        let mut made = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let dir = root.path().join(format!("d{made}"));
            std::fs::DirBuilder::new().mode(0o755).create(&dir).unwrap();
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
            if mode != expected {
                wrong.push(format!("{mode:o}"));
            }
            std::fs::remove_dir(&dir).unwrap();
            made += 1;
        }
        binder.join().unwrap();
        nix::sys::stat::umask(umask);
        assert!(
            wrong.is_empty(),
            "{} of {made} directories got another mode: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
    }
}
