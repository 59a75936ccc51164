//! The connection to the daemon, one per process and set of credentials.
//!
//! A current-thread tokio runtime and a [`Client`] on it, made lazily by the first call that
//! needs the daemon. Calls from many threads share it: tokio lets several threads `block_on` one
//! current-thread runtime, the first one driving its I/O for all. A call that finds the daemon
//! gone drops the connection, so the next call reconnects; idempotent calls retry once on a
//! fresh connection at once.
//!
//! **Credentials.** The daemon fixes a connection's identity when it is made (SO_PEERCRED and
//! SO_PEERGROUPS of the connecting process), so a connection is only ever used by the
//! credentials it was made with: the process id, the effective uid and gid and the
//! supplementary groups ([`Credentials`]) are compared on every call, and a change (a forked
//! child, `setuid`/`setgid`/`setgroups` after connecting: OpenVPN's `--user`, stunnel's
//! `setuid=`) makes a new connection, under the new identity.
//!
//! **Fork.** A forked child must neither use nor keep the parent's connection: its descriptor
//! is authenticated as the parent (root, for nginx's master), and any code in the child could
//! send its own requests on it. The runtime shares its epoll instance with the parent, so it
//! must not be dropped in the child either (that would deregister the parent's sockets). The
//! `pthread_atfork` child hook therefore closes, in the child, every descriptor the runtime
//! holds (the daemon's socket, its wake-up eventfd, its epoll instance) and leaks the rest of
//! the parent's connection without running any of its destructors. The runtime's descriptors
//! are found through its epoll instance: at creation the module registers a marker socket of
//! its own with the runtime, finds the one epoll instance (`/proc/self/fd`, `fdinfo`) whose
//! interest list holds that marker, and in the child closes every descriptor on that list
//! (each checked against the inode the kernel lists for it) and then the epoll instance itself,
//! with only async-signal-safe system calls and no allocation.

use std::future::Future;
use std::os::fd::{AsRawFd as _, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tpm_vault_client::{Client, Code, Error as ClientError};

/// Who the calling process is, as the daemon sees it when a connection is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Credentials {
    /// The process (a forked child has another).
    pid: u32,
    /// Effective uid (SO_PEERCRED's uid).
    euid: u32,
    /// Effective gid (SO_PEERCRED's gid).
    egid: u32,
    /// Supplementary groups, sorted (SO_PEERGROUPS).
    groups: Vec<u32>,
}

impl Credentials {
    /// The calling process's credentials now.
    #[allow(unsafe_code)] // libc calls, each with its SAFETY note
    pub(crate) fn current() -> Credentials {
        // SAFETY: these calls cannot fail and take no pointers.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Credentials { pid: std::process::id(), euid, egid, groups: supplementary_groups() }
    }
}

/// The supplementary groups, sorted (empty if they cannot be read).
#[allow(unsafe_code)] // libc calls, each with its SAFETY note
fn supplementary_groups() -> Vec<u32> {
    for _ in 0..4 {
        // SAFETY: a zero size asks for the count only and writes nothing.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        let Ok(len) = usize::try_from(n) else { return Vec::new() };
        let mut groups = vec![0 as libc::gid_t; len];
        // SAFETY: the buffer holds `n` gids; the kernel writes at most that many, or fails
        // with EINVAL if the list grew meanwhile (then we ask again).
        let got = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
        if let Ok(got) = usize::try_from(got) {
            groups.truncate(got);
            groups.sort_unstable();
            groups.dedup();
            return groups;
        }
    }
    Vec::new()
}

/// One process's connection, for one set of credentials.
#[derive(Debug)]
struct Connection {
    /// The credentials it was made with (the daemon authenticated these).
    credentials: Credentials,
    /// The client (cheap to clone; clones share the connection).
    client: Client,
    /// A socket of the module's own registered with the runtime, so that its epoll instance
    /// can be told from every other one in the process (see the module docs).
    marker: tokio::net::UnixDatagram,
    /// The runtime's epoll instance, found through `marker`; `None` without `/proc`.
    epoll: Option<RawFd>,
    /// Drives the client's futures and its HTTP/2 connection. Dropped last.
    runtime: tokio::runtime::Runtime,
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

/// Runs `call` with the daemon's client, connecting first if this process (with its current
/// credentials) has no connection.
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

/// The connection for these credentials, made now if there is none (or only one made with
/// other credentials: the parent's, or this process's before it changed its ids).
fn current(socket: &Path) -> Result<Arc<Connection>, ClientError> {
    let credentials = Credentials::current();
    let mut slot = CURRENT.lock();
    let mut stale = None;
    if let Some(connection) = slot.as_ref() {
        if connection.credentials == credentials {
            return Ok(Arc::clone(connection));
        }
        if let Some(old) = slot.take() {
            if old.credentials.pid == credentials.pid {
                // The same process with other ids: the old connection goes (once the calls
                // of other threads that still hold it finish), outside the lock.
                crate::debug(format_args!("credentials changed: connecting again"));
                stale = Some(old);
            } else {
                // A forked child whose atfork hook did not run (a raw `clone`): as the hook.
                detach_inherited(&old);
                std::mem::forget(old);
            }
        }
    }
    let connection = connect(socket, credentials);
    if let Ok(connection) = &connection {
        *slot = Some(Arc::clone(connection));
    }
    drop(slot);
    drop(stale);
    connection
}

/// Makes a connection for `credentials`.
fn connect(socket: &Path, credentials: Credentials) -> Result<Arc<Connection>, ClientError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ClientError::Runtime)?;
    let marker = {
        let _entered = runtime.enter();
        tokio::net::UnixDatagram::unbound().map_err(ClientError::Runtime)?
    };
    let epoll = runtime_epoll(marker.as_raw_fd());
    if epoll.is_none() {
        crate::debug(format_args!("the runtime's epoll instance was not found (no /proc?)"));
    }
    let client = runtime.block_on(Client::builder(socket).with_connect_timeout(CONNECT_TIMEOUT).connect())?;
    Ok(Arc::new(Connection { credentials, client, marker, epoll, runtime }))
}

/// Forgets `connection` if it is still the current one, so the next call reconnects.
fn drop_if_same(connection: &Arc<Connection>) {
    let mut slot = CURRENT.lock();
    if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
        // The runtime may be in use by other threads' calls: they hold their own `Arc`, and the
        // last one to finish drops it (outside any runtime, so the drop is allowed).
        let old = slot.take();
        drop(slot);
        drop(old);
    }
}

/// Forgets this process's connection (`C_Finalize`).
pub(crate) fn reset() {
    let old = CURRENT.lock().take();
    if let Some(old) = old {
        if old.credentials.pid != std::process::id() {
            detach_inherited(&old);
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

/// In a forked child: closes every descriptor of `inherited`'s runtime (see the module docs).
/// Async-signal-safe: system calls only, no allocation, no lock.
fn detach_inherited(inherited: &Connection) {
    if let Some(epoll) = inherited.epoll {
        close_runtime_fds(epoll, inherited.marker.as_raw_fd());
    }
}

/// The epoll instance whose interest list holds `marker` (with `marker`'s inode).
fn runtime_epoll(marker: RawFd) -> Option<RawFd> {
    let marker_ino = inode(marker)?;
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    entries.filter_map(Result::ok).find_map(|entry| {
        let fd: RawFd = entry.file_name().to_str()?.parse().ok()?;
        let target = std::fs::read_link(entry.path()).ok()?;
        if target.as_os_str() != "anon_inode:[eventpoll]" {
            return None;
        }
        let mut buf = [0u8; FDINFO_MAX];
        let info = read_fdinfo(fd, &mut buf)?;
        let holds_marker = registered(info).any(|(tfd, ino)| tfd == marker && ino == marker_ino);
        holds_marker.then_some(fd)
    })
}

/// Bytes of an epoll instance's `fdinfo` read at most (a few lines per registered descriptor;
/// the runtime registers three or four).
const FDINFO_MAX: usize = 4096;

/// Closes the descriptors on `epoll`'s interest list whose inode is the one the kernel lists
/// for them, then `epoll` itself, if `marker` is on that list (so `epoll` is still the
/// runtime's). Async-signal-safe.
#[allow(unsafe_code)] // libc calls, each with its SAFETY note
fn close_runtime_fds(epoll: RawFd, marker: RawFd) {
    let mut buf = [0u8; FDINFO_MAX];
    let Some(info) = read_fdinfo(epoll, &mut buf) else { return };
    let Some(marker_ino) = inode(marker) else { return };
    if !registered(info).any(|(tfd, ino)| tfd == marker && ino == marker_ino) {
        return;
    }
    for (fd, ino) in registered(info) {
        if fd != epoll && inode(fd) == Some(ino) {
            // SAFETY: `fd` is one of the runtime's descriptors (on its interest list, same
            // inode); nothing in this process uses it again (the runtime is leaked).
            unsafe { libc::close(fd) };
        }
    }
    // SAFETY: as above, the runtime's epoll instance.
    unsafe { libc::close(epoll) };
}

/// The inode of the file open on `fd`.
#[allow(unsafe_code)] // libc calls, each with its SAFETY note
fn inode(fd: RawFd) -> Option<u64> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `stat` is a valid out-pointer; fstat fills it on success.
    let rc = unsafe { libc::fstat(fd, stat.as_mut_ptr()) };
    // SAFETY: initialized by the successful fstat.
    // `ino_t` is 32 bits on some 32-bit targets.
    #[allow(clippy::useless_conversion)]
    (rc == 0).then(|| u64::from(unsafe { stat.assume_init() }.st_ino))
}

/// Reads `/proc/self/fdinfo/FD` into `buf` with system calls only; the text read.
#[allow(unsafe_code)] // libc calls, each with its SAFETY note
fn read_fdinfo(fd: RawFd, buf: &mut [u8; FDINFO_MAX]) -> Option<&[u8]> {
    let mut path = [0u8; 40];
    let prefix = b"/proc/self/fdinfo/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 12];
    let mut n = u32::try_from(fd).ok()?;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (i, d) in digits[..len].iter().rev().enumerate() {
        path[prefix.len() + i] = *d;
    }
    // The rest of `path` is zeros: NUL-terminated.
    // SAFETY: `path` is NUL-terminated.
    let file = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if file < 0 {
        return None;
    }
    let mut total = 0;
    while total < buf.len() {
        // SAFETY: writes at most the rest of `buf`.
        let got = unsafe { libc::read(file, buf[total..].as_mut_ptr().cast(), buf.len() - total) };
        match usize::try_from(got) {
            Ok(0) | Err(_) => break,
            Ok(got) => total += got,
        }
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(file) };
    Some(&buf[..total])
}

/// The `(fd, inode)` of every `tfd:` line of an epoll instance's `fdinfo`
/// (`tfd: %8d events: %8x data: %16llx  pos:%lli ino:%lx sdev:%x`).
fn registered(info: &[u8]) -> impl Iterator<Item = (RawFd, u64)> + '_ {
    info.split(|&b| b == b'\n').filter_map(|line| {
        let rest = line.strip_prefix(b"tfd:")?;
        let fd = parse_number(rest.trim_ascii_start(), 10)?;
        let at = rest.windows(4).position(|w| w == b"ino:")?;
        let ino = parse_number(&rest[at + 4..], 16)?;
        Some((RawFd::try_from(fd).ok()?, ino))
    })
}

/// The number at the start of `text` in `radix` (digits up to the first other byte).
fn parse_number(text: &[u8], radix: u32) -> Option<u64> {
    let mut value: u64 = 0;
    let mut any = false;
    for &b in text {
        let Some(d) = (b as char).to_digit(radix) else { break };
        value = value.checked_mul(u64::from(radix))?.checked_add(u64::from(d))?;
        any = true;
    }
    any.then_some(value)
}

/// `pthread_atfork` hooks: no thread may hold the connection lock while another forks, or the
/// child would inherit it locked forever; and the child closes the parent's connection.
pub(crate) mod fork {
    use super::{detach_inherited, CURRENT};

    /// Before `fork`: take the lock.
    pub(crate) fn prepare() {
        std::mem::forget(CURRENT.lock());
    }

    /// After `fork`, in the parent: release it.
    pub(crate) fn parent() {
        // SAFETY: `prepare` took the lock on this thread and forgot the guard.
        #[allow(unsafe_code)]
        unsafe {
            CURRENT.force_unlock();
        }
    }

    /// After `fork`, in the child: close the parent's connection's descriptors, leak the
    /// rest of it (its destructors would touch the parent's epoll instance), release the lock.
    pub(crate) fn child() {
        // SAFETY: `prepare` took the lock on this thread (the child's only one) and forgot the
        // guard; nothing else can hold it.
        #[allow(unsafe_code)]
        let inherited = unsafe {
            let inherited = (*CURRENT.data_ptr()).take();
            crate::reset_in_child(&CURRENT);
            inherited
        };
        if let Some(inherited) = inherited {
            detach_inherited(&inherited);
            std::mem::forget(inherited);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoll_fdinfo_lines_parse() {
        let info = b"pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\n\
            tfd:        7 events:       19 data:                7  pos:0 ino:3f2a sdev:8\n\
            tfd:       12 events: 8000201d data:                0  pos:0 ino:1057 sdev:e\n";
        let got: Vec<_> = registered(info).collect();
        assert_eq!(got, vec![(7, 0x3f2a), (12, 0x1057)]);
    }

    #[test]
    fn the_runtime_epoll_is_found_by_its_marker() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let marker = {
            let _entered = runtime.enter();
            tokio::net::UnixDatagram::unbound().unwrap()
        };
        let epoll = runtime_epoll(marker.as_raw_fd()).expect("found");
        let target = std::fs::read_link(format!("/proc/self/fd/{epoll}")).unwrap();
        assert_eq!(target.as_os_str(), "anon_inode:[eventpoll]");
    }

    #[test]
    fn credentials_include_the_groups() {
        let c = Credentials::current();
        assert_eq!(c.pid, std::process::id());
        assert!(c.groups.windows(2).all(|w| w[0] < w[1]));
    }
}
