//! File descriptors: the process's `RLIMIT_NOFILE` and the connection bounds that must fit in it.
//!
//! Every connection the daemon holds is a descriptor, and so is every record the store opens,
//! the TPM connection, the log and audit files and the metrics endpoint's connections. A flood
//! of connections that used the last descriptor would make all of these fail (`EMFILE`), so:
//!
//! - [`raise`]: at start, the soft limit is raised to the hard one (what most daemons do; the
//!   common soft limit of 1,024 is a default for programs that use `select`, which the daemon
//!   does not).
//! - [`fit`]: the connection bounds (Unix socket and TLS listener) are lowered, TLS first, when
//!   they and [`FD_RESERVE`] do not fit in the soft limit.
//! - [`accept_failed`]: an accept that fails (`EMFILE`, `ENFILE`, ...) waits a little before
//!   the next one instead of spinning, and never stops the listener.

use std::io;
use std::time::Duration;

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

use crate::config::ServeLimits;

/// Descriptors kept for everything but connections: the standard streams, the log and audit
/// files, the runtime's own (epoll, wake-ups, signals), the three listeners, the systemd
/// notify socket, the TPM connection (two sockets for a swtpm, plus its pipes under
/// `--simulator`), the metrics endpoint's 16 connections, and the store's files, each open
/// only while one record is read or written (a write opens the temp file and the directory):
/// about 35 for the fixed uses, the rest for the store's reads in progress.
pub const FD_RESERVE: usize = 64;

/// The TLS listener is lowered to no fewer connections than this (or its configured bound, or
/// half the room, if smaller) before the Unix socket gives up any.
pub const MIN_TLS_CONNECTIONS: usize = 16;

/// A soft limit is raised to at most this much when the hard limit is unlimited (Linux's
/// default `fs.nr_open`: a soft limit above it is refused).
const NR_OPEN: u64 = 1 << 20;

/// How long an accept loop waits after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The process's `RLIMIT_NOFILE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFile {
    /// Soft limit before [`raise`].
    pub before: u64,
    /// Soft limit in force (or, from [`planned`], the one start-up would set).
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

impl std::fmt::Display for NoFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hard = if self.hard == RLIM_INFINITY { "unlimited".to_owned() } else { self.hard.to_string() };
        if self.before == self.soft {
            write!(f, "RLIMIT_NOFILE {} (hard limit {hard})", self.soft)
        } else {
            write!(f, "RLIMIT_NOFILE {} (raised from {}; hard limit {hard})", self.soft, self.before)
        }
    }
}

/// The soft limit [`raise`] aims for.
fn target(soft: u64, hard: u64) -> u64 {
    let hard = if hard == RLIM_INFINITY { NR_OPEN } else { hard };
    soft.max(hard)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit.
///
/// # Errors
/// The `getrlimit` or `setrlimit` error; the limit is then as it was.
pub fn raise() -> io::Result<NoFile> {
    let (before, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    let soft = target(before, hard);
    if soft != before {
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).map_err(io::Error::from)?;
    }
    Ok(NoFile { before, soft, hard })
}

/// What [`raise`] would set, without changing anything (for `--check-config`).
///
/// # Errors
/// The `getrlimit` error.
pub fn planned() -> io::Result<NoFile> {
    let (before, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    Ok(NoFile { before, soft: target(before, hard), hard })
}

/// The connection bounds in force under a soft limit, and a warning when they are lower than
/// the configured ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    /// The bounds to serve with.
    pub limits: ServeLimits,
    /// Set when the configured bounds did not fit: names both and the limit.
    pub warning: Option<String>,
}

/// Fits the Unix socket's connections (and, with `tls`, the TLS listener's) and
/// [`FD_RESERVE`] into `soft` descriptors. When the configured bounds do not fit, TLS gives
/// up connections first, down to [`MIN_TLS_CONNECTIONS`], then the Unix socket (its
/// per-client bound following); no bound goes below 1.
pub fn fit(configured: &ServeLimits, tls: bool, soft: u64) -> Fitted {
    let budget = usize::try_from(soft).unwrap_or(usize::MAX).saturating_sub(FD_RESERVE);
    let unix = configured.max_connections;
    let tls_wanted = if tls { configured.tls_connections() } else { 0 };
    if unix.saturating_add(tls_wanted) <= budget {
        return Fitted { limits: *configured, warning: None };
    }
    let mut limits = *configured;
    let tls_now = if tls {
        let floor = MIN_TLS_CONNECTIONS.min(tls_wanted).min(budget / 2).max(1);
        budget.saturating_sub(unix).max(floor).min(tls_wanted)
    } else {
        0
    };
    let unix_now = budget.saturating_sub(tls_now).min(unix).max(1);
    limits.max_connections = unix_now;
    limits.max_connections_per_client = configured.max_connections_per_client.min(unix_now);
    let (configured_tls, in_force_tls) = if tls {
        limits.max_tls_connections = Some(tls_now);
        (format!(" + {tls_wanted} on the TLS listener"), format!(", {tls_now} on the TLS listener"))
    } else {
        (String::new(), String::new())
    };
    let warning = format!(
        "max_connections {unix} on the Unix socket{configured_tls} and a reserve of {FD_RESERVE} descriptors \
         do not fit in RLIMIT_NOFILE {soft}: in force {unix_now} on the Unix socket (per client {}){in_force_tls}; \
         raise LimitNOFILE= (the hard limit) or lower max_connections",
        limits.max_connections_per_client
    );
    Fitted { limits, warning: Some(warning) }
}

/// What an accept loop does when `accept` fails: log (the error names `EMFILE` and the like)
/// and wait [`ACCEPT_BACKOFF`] (the returned sleep) before the next accept, instead of retrying
/// at once (a listener whose pending connection cannot be accepted stays readable, so that
/// would spin) or giving up. Pending connections wait in the kernel's backlog meanwhile.
pub fn accept_failed(listener: &str, error: &io::Error) -> tokio::time::Sleep {
    tracing::warn!(%error, "{listener}: accept failed; trying again in {} ms", ACCEPT_BACKOFF.as_millis());
    tokio::time::sleep(ACCEPT_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(unix: usize, per_client: usize) -> ServeLimits {
        ServeLimits { max_connections: unix, max_connections_per_client: per_client, ..ServeLimits::default() }
    }

    #[test]
    fn bounds_that_fit_are_kept() {
        let d = ServeLimits::default();
        assert_eq!(fit(&d, true, 1024 + 64), Fitted { limits: d, warning: None });
        assert_eq!(fit(&d, false, 512 + 64), Fitted { limits: d, warning: None });
        assert_eq!(fit(&d, true, RLIM_INFINITY), Fitted { limits: d, warning: None });
    }

    #[test]
    fn tls_gives_up_connections_first() {
        // 1,024 descriptors: 960 for connections, 512 for Unix, 448 left for TLS.
        let f = fit(&ServeLimits::default(), true, 1024);
        assert_eq!((f.limits.max_connections, f.limits.tls_connections()), (512, 448));
        assert_eq!(f.limits.max_connections_per_client, 128);
        let warning = f.warning.unwrap_or_default();
        assert!(warning.contains("max_connections 512 on the Unix socket + 512 on the TLS listener"), "{warning}");
        assert!(
            warning.contains(
                "RLIMIT_NOFILE 1024: in force 512 on the Unix socket (per client 128), 448 on the TLS listener"
            ),
            "{warning}"
        );
    }

    #[test]
    fn then_the_unix_socket_and_its_per_client_bound() {
        // 256: 192 for connections; TLS keeps 16, Unix gets 176.
        let f = fit(&ServeLimits::default(), true, 256);
        assert_eq!((f.limits.max_connections, f.limits.tls_connections()), (176, 16));
        assert_eq!(f.limits.max_connections_per_client, 128);
        let f = fit(&limits(512, 500), true, 256);
        assert_eq!(f.limits.max_connections_per_client, 176);
        // Without TLS the Unix socket has it all.
        let f = fit(&ServeLimits::default(), false, 256);
        assert_eq!((f.limits.max_connections, f.limits.max_tls_connections), (192, None));
        // A configured TLS bound under the floor stays what it is.
        let small = ServeLimits { max_tls_connections: Some(4), ..ServeLimits::default() };
        assert_eq!(fit(&small, true, 256).limits.tls_connections(), 4);
        // Nothing goes below 1, even with no room at all.
        let f = fit(&ServeLimits::default(), true, 10);
        assert_eq!(
            (f.limits.max_connections, f.limits.max_connections_per_client, f.limits.tls_connections()),
            (1, 1, 1)
        );
        // Little room: TLS keeps at most half of it.
        let f = fit(&ServeLimits::default(), true, 64 + 20);
        assert_eq!((f.limits.max_connections, f.limits.tls_connections()), (10, 10));
    }

    #[test]
    fn raise_reaches_the_hard_limit() {
        let nofile = raise().unwrap();
        assert_eq!(nofile.soft, target(nofile.before, nofile.hard));
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap().0, nofile.soft);
        assert_eq!(planned().unwrap().soft, nofile.soft);
    }
}
