//! The connection to the daemon, one per process.
//!
//! A current-thread tokio runtime and a [`Client`] on it, made lazily by the first call that
//! needs the daemon. Calls from many threads share it: tokio lets several threads `block_on` one
//! current-thread runtime, the first one driving its I/O for all. There are no threads of the
//! module's own, so nothing is lost by `fork`: a child sees the process id change, forgets the
//! parent's runtime and socket (never touching them, since the parent still uses the same
//! epoll instance) and connects afresh. A call that finds the daemon gone drops the connection,
//! so the next call reconnects; idempotent calls retry once on a fresh connection at once.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tpm_vault_client::{Client, Code, Error as ClientError};

/// One process's connection.
#[derive(Debug)]
struct Connection {
    /// The process that made it.
    pid: u32,
    /// Drives the client's futures and its HTTP/2 connection.
    runtime: tokio::runtime::Runtime,
    /// The client (cheap to clone; clones share the connection).
    client: Client,
}

/// The current connection, if any. Held only to clone or replace the `Arc`, never across a call.
static CURRENT: Mutex<Option<Arc<Connection>>> = Mutex::new(None);

/// Time allowed to open the socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a failed call may be sent again on a fresh connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// The call changes nothing if it ran twice (reads, signatures, random bytes).
    Idempotent,
    /// The call creates or deletes something: never sent twice.
    Once,
}

/// Runs `call` with the daemon's client, connecting first if this process has no connection.
///
/// # Errors
/// The client's error; a transport failure also drops the connection.
pub(crate) fn call<T, F, Fut>(socket: &Path, retry: Retry, call: F) -> Result<T, ClientError>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let first = run(socket, &call);
    match first {
        Err(e) if retry == Retry::Idempotent && is_connection_lost(&e) => run(socket, &call),
        other => other,
    }
}

/// One attempt of [`call`].
fn run<T, F, Fut>(socket: &Path, call: &F) -> Result<T, ClientError>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let connection = current(socket)?;
    let result = connection.runtime.block_on(call(connection.client.clone()));
    if let Err(e) = &result {
        if is_connection_lost(e) {
            drop_if_same(&connection);
        }
    }
    result
}

/// The connection for this process, made now if there is none (or only the parent's).
fn current(socket: &Path) -> Result<Arc<Connection>, ClientError> {
    let pid = std::process::id();
    let mut slot = CURRENT.lock();
    if let Some(connection) = slot.as_ref() {
        if connection.pid == pid {
            return Ok(Arc::clone(connection));
        }
        // A forked child: the parent's runtime shares its epoll instance with the parent, so
        // dropping it here would deregister the parent's sockets. Leak it instead.
        if let Some(parent) = slot.take() {
            std::mem::forget(parent);
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ClientError::Runtime)?;
    let client = runtime.block_on(Client::builder(socket).with_connect_timeout(CONNECT_TIMEOUT).connect())?;
    let connection = Arc::new(Connection { pid, runtime, client });
    *slot = Some(Arc::clone(&connection));
    Ok(connection)
}

/// Forgets `connection` if it is still the current one, so the next call reconnects.
fn drop_if_same(connection: &Arc<Connection>) {
    let mut slot = CURRENT.lock();
    if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
        // The runtime may be in use by other threads' calls: they hold their own `Arc`, and the
        // last one to finish drops it (outside any runtime, so the drop is allowed).
        slot.take();
    }
}

/// Forgets this process's connection (`C_Finalize`).
pub(crate) fn reset() {
    let old = CURRENT.lock().take();
    if let Some(old) = old {
        if old.pid != std::process::id() {
            std::mem::forget(old);
        }
    }
}

/// True when the error means the daemon is gone (not running, restarted, connection broken),
/// as opposed to an answer from the daemon.
fn is_connection_lost(e: &ClientError) -> bool {
    match e {
        ClientError::Transport { .. } => true,
        ClientError::Status(status) => status.code() == Code::Unavailable && !status.message().starts_with("TPM"),
        _ => false,
    }
}

/// `pthread_atfork` hooks: no thread may hold the connection lock while another forks, or the
/// child would inherit it locked forever.
pub(crate) mod fork {
    use super::CURRENT;

    /// Before `fork`: take the lock.
    pub(crate) fn prepare() {
        std::mem::forget(CURRENT.lock());
    }

    /// After `fork`, in parent and child: release it.
    pub(crate) fn release() {
        // SAFETY: `prepare` took the lock on this thread and forgot the guard.
        #[allow(unsafe_code)]
        unsafe {
            CURRENT.force_unlock();
        }
    }
}
