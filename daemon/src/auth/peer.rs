//! Client identity from the transport. On the Unix socket it comes from SO_PEERCRED (uid, gid,
//! pid), which the kernel vouches for; user and group names are resolved from the system
//! databases (NSS) so policies can name them.

use std::fmt;

use tonic::transport::server::UdsConnectInfo;

/// An authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A local process on the Unix socket.
    Unix(UnixIdentity),
    /// A TLS client, by certificate subject (or SPIFFE ID).
    Cert {
        /// Subject (e.g. `CN=agent-1,O=Example`) or SPIFFE URI.
        subject: String,
    },
    /// No identity could be established (always denied).
    Unknown,
}

/// A local client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixIdentity {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Process id.
    pub pid: Option<i32>,
    /// User name, if the uid resolves.
    pub user: Option<String>,
    /// Groups (primary and supplementary of the user), id and name.
    pub groups: Vec<(u32, String)>,
}

impl UnixIdentity {
    /// Resolves names and groups for a uid/gid pair (blocking NSS lookups; fast for local
    /// files, cached by callers where it matters).
    pub fn resolve(uid: u32, gid: u32, pid: Option<i32>) -> Self {
        use nix::unistd::{getgrouplist, Gid, Group, Uid, User};
        let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
        let mut gids = vec![Gid::from_raw(gid)];
        if let Some(u) = &user {
            if let Ok(name) = std::ffi::CString::new(u.name.clone()) {
                if let Ok(list) = getgrouplist(&name, Gid::from_raw(gid)) {
                    gids.extend(list);
                }
            }
        }
        gids.sort_unstable_by_key(|g| g.as_raw());
        gids.dedup();
        let groups = gids
            .into_iter()
            .map(|g| {
                let name = Group::from_gid(g).ok().flatten().map(|g| g.name).unwrap_or_default();
                (g.as_raw(), name)
            })
            .collect();
        Self { uid, gid, pid, user: user.map(|u| u.name), groups }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(u) => match &u.user {
                Some(name) => write!(f, "uid {} ({name})", u.uid),
                None => write!(f, "uid {}", u.uid),
            },
            Self::Cert { subject } => write!(f, "certificate {subject:?}"),
            Self::Unknown => f.write_str("an unidentified client"),
        }
    }
}

/// Raw peer credentials of a request on the Unix socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Unix user id.
    pub uid: u32,
    /// Unix group id.
    pub gid: u32,
    /// Process id, when known.
    pub pid: Option<i32>,
}

impl Peer {
    /// The credentials of the client that sent `req`. `None` when the transport carries none.
    pub fn of<T>(req: &tonic::Request<T>) -> Option<Peer> {
        let info = req.extensions().get::<UdsConnectInfo>()?;
        let cred = info.peer_cred?;
        Some(Peer { uid: cred.uid(), gid: cred.gid(), pid: cred.pid() })
    }
}

/// The identity behind a request: Unix peer credentials (names resolved), or a TLS client
/// identity the TLS listener attached as a request extension.
pub fn identity<T>(req: &tonic::Request<T>) -> Option<Identity> {
    if let Some(id) = req.extensions().get::<Identity>() {
        return Some(id.clone());
    }
    let p = Peer::of(req)?;
    Some(Identity::Unix(resolve_cached(p.uid, p.gid, p.pid)))
}

/// How long a resolved user/group lookup is reused. Name and group changes take effect within
/// this time (and at once for new uids).
const RESOLVE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

type ResolveCache = std::collections::HashMap<(u32, u32), (std::time::Instant, UnixIdentity)>;

/// [`UnixIdentity::resolve`] with a short-lived cache: NSS lookups read /etc/passwd and
/// /etc/group (or ask a directory service) and would otherwise cost more than a TPM signature's
/// share of the request path.
fn resolve_cached(uid: u32, gid: u32, pid: Option<i32>) -> UnixIdentity {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<ResolveCache>> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Ok(map) = cache.lock() {
        if let Some((at, id)) = map.get(&(uid, gid)) {
            if at.elapsed() < RESOLVE_TTL {
                return UnixIdentity { pid, ..id.clone() };
            }
        }
    }
    let id = UnixIdentity::resolve(uid, gid, pid);
    if let Ok(mut map) = cache.lock() {
        if map.len() > 4096 {
            map.clear();
        }
        map.insert((uid, gid), (std::time::Instant::now(), id.clone()));
    }
    id
}
