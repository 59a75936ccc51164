//! Client identity from the transport. On the Unix socket it comes from SO_PEERCRED (uid, gid,
//! pid) and SO_PEERGROUPS (the supplementary groups), which the kernel vouches for, as they
//! were when the client connected; user and group names are resolved from the system databases
//! (NSS) so policies can name them. Only where the kernel lacks SO_PEERGROUPS (before Linux
//! 4.13) are the groups NSS's list for the user (`getgrouplist`), which misses groups a process
//! was given or dropped (`setgroups`, `newgrp`, `systemd`'s `SupplementaryGroups=`); each audit
//! record says which source its groups came from ([`GroupsSource`]).

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;

use tonic::transport::server::UdsConnectInfo;

use crate::model::Owner;

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
    /// Groups (primary and supplementary), id and name.
    pub groups: Vec<(u32, String)>,
    /// Where the supplementary groups came from.
    pub groups_source: GroupsSource,
}

/// Where a local client's supplementary groups came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupsSource {
    /// The kernel's record of the connecting process (`SO_PEERGROUPS`).
    Kernel,
    /// The user's groups in the system's group database (`getgrouplist`): the kernel lacks
    /// `SO_PEERGROUPS`, or there is no connection (CheckAccess asks about a uid).
    Nss,
}

impl GroupsSource {
    /// The name audit records use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "SO_PEERGROUPS",
            Self::Nss => "getgrouplist",
        }
    }
}

impl UnixIdentity {
    /// Resolves names for a uid/gid pair, with the supplementary groups the kernel reported
    /// for the peer (`kernel_groups`, from [`peer_groups`]) or, when there are none to go by,
    /// NSS's list for the user (blocking NSS lookups; fast for local files, cached by callers
    /// where it matters).
    pub fn resolve(uid: u32, gid: u32, pid: Option<i32>, kernel_groups: Option<&[u32]>) -> Self {
        use nix::unistd::{getgrouplist, Gid, Group, Uid, User};
        let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
        let mut gids = vec![Gid::from_raw(gid)];
        let groups_source = match kernel_groups {
            Some(list) => {
                gids.extend(list.iter().map(|&g| Gid::from_raw(g)));
                GroupsSource::Kernel
            }
            None => {
                if let Some(u) = &user {
                    if let Ok(name) = std::ffi::CString::new(u.name.clone()) {
                        if let Ok(list) = getgrouplist(&name, Gid::from_raw(gid)) {
                            gids.extend(list);
                        }
                    }
                }
                GroupsSource::Nss
            }
        };
        gids.sort_unstable_by_key(|g| g.as_raw());
        gids.dedup();
        let groups = gids
            .into_iter()
            .map(|g| {
                let name = Group::from_gid(g).ok().flatten().map(|g| g.name).unwrap_or_default();
                (g.as_raw(), name)
            })
            .collect();
        Self { uid, gid, pid, user: user.map(|u| u.name), groups, groups_source }
    }
}

/// The supplementary groups of the process at the other end of a connected Unix socket, as the
/// kernel recorded them when it connected (`SO_PEERGROUPS`, Linux 4.13); `None` where the
/// kernel lacks the option (or the socket has no peer credentials).
pub fn peer_groups(socket: BorrowedFd<'_>) -> Option<Vec<u32>> {
    use nix::errno::Errno;
    use nix::libc;
    const GID: usize = std::mem::size_of::<libc::gid_t>();
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    // Twice at most: a first answer of ERANGE says how much room the list needs.
    for _ in 0..2 {
        let mut len = libc::socklen_t::try_from(groups.len() * GID).ok()?;
        // SAFETY (the crate's second audited `unsafe`; nix and rustix have no wrapper for this
        // option): `groups` is a live, writable, gid_t-aligned buffer of `len` bytes that
        // nothing else references during the call; the kernel writes at most `len` bytes into
        // it and stores the length it wrote (or, failing with ERANGE, the length it needs) in
        // `len`, a live socklen_t; `socket` is borrowed, so the descriptor stays open.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let len = usize::try_from(len).ok()?;
        match rc {
            0 => {
                groups.truncate(len.min(groups.len() * GID) / GID);
                return Some(groups);
            }
            _ if Errno::last() == Errno::ERANGE && len > groups.len() * GID => groups.resize(len / GID, 0),
            _ => return None,
        }
    }
    None
}

/// What a connection on the Unix socket carries into each of its requests: tonic's peer
/// credentials, and the peer's supplementary groups ([`peer_groups`], read once at accept).
#[derive(Debug, Clone)]
pub struct UnixConnectInfo {
    /// Peer credentials and address.
    pub uds: UdsConnectInfo,
    /// The peer's supplementary groups; `None` where the kernel lacks `SO_PEERGROUPS`.
    pub groups: Option<Arc<[u32]>>,
}

impl Identity {
    /// The owner a record this client creates gets: its uid on the Unix socket, its
    /// certificate identity on the TLS listener; `None` for an unidentified client.
    pub fn owner(&self) -> Option<Owner> {
        match self {
            Self::Unix(u) => Some(Owner::Uid(u.uid)),
            Self::Cert { subject } => Some(Owner::Certificate(subject.clone())),
            Self::Unknown => None,
        }
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Unix user id.
    pub uid: u32,
    /// Unix group id.
    pub gid: u32,
    /// Process id, when known.
    pub pid: Option<i32>,
    /// Supplementary groups from the kernel (`SO_PEERGROUPS`), when it reports them.
    pub groups: Option<Arc<[u32]>>,
}

impl Peer {
    /// The credentials of the client that sent `req`. `None` when the transport carries none.
    pub fn of<T>(req: &tonic::Request<T>) -> Option<Peer> {
        let ext = req.extensions();
        let (info, groups) = match ext.get::<UnixConnectInfo>() {
            Some(i) => (&i.uds, i.groups.clone()),
            None => (ext.get::<UdsConnectInfo>()?, None),
        };
        let cred = info.peer_cred?;
        Some(Peer { uid: cred.uid(), gid: cred.gid(), pid: cred.pid(), groups })
    }
}

/// The identity behind a request: Unix peer credentials (names resolved), or a TLS client
/// identity the TLS listener attached as a request extension.
pub fn identity<T>(req: &tonic::Request<T>) -> Option<Identity> {
    if let Some(id) = req.extensions().get::<Identity>() {
        return Some(id.clone());
    }
    let p = Peer::of(req)?;
    Some(Identity::Unix(resolve_cached(p)))
}

/// How long a resolved user/group lookup is reused. Name and group changes take effect within
/// this time (and at once for new uids).
const RESOLVE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// A resolved identity's cache key: uid, gid and the kernel's group list (if any).
type ResolveKey = (u32, u32, Option<Arc<[u32]>>);

type ResolveCache = std::collections::HashMap<ResolveKey, (std::time::Instant, UnixIdentity)>;

/// [`UnixIdentity::resolve`] with a short-lived cache: NSS lookups read /etc/passwd and
/// /etc/group (or ask a directory service) and would otherwise cost more than a TPM signature's
/// share of the request path.
fn resolve_cached(peer: Peer) -> UnixIdentity {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<ResolveCache>> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let Peer { uid, gid, pid, groups } = peer;
    let key = (uid, gid, groups);
    if let Ok(map) = cache.lock() {
        if let Some((at, id)) = map.get(&key) {
            if at.elapsed() < RESOLVE_TTL {
                return UnixIdentity { pid, ..id.clone() };
            }
        }
    }
    let id = UnixIdentity::resolve(uid, gid, pid, key.2.as_deref());
    if let Ok(mut map) = cache.lock() {
        if map.len() > 4096 {
            map.clear();
        }
        map.insert(key, (std::time::Instant::now(), id.clone()));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// `id -G NAME`: the groups the system's databases give the user (as `getgrouplist`).
    fn id_groups(name: &str) -> BTreeSet<u32> {
        let out = std::process::Command::new("id").arg("-G").arg(name).output().unwrap();
        assert!(out.status.success(), "id -G {name}");
        String::from_utf8(out.stdout).unwrap().split_whitespace().map(|g| g.parse().unwrap()).collect()
    }

    /// The fallback used where the kernel lacks `SO_PEERGROUPS` (no kernel list) gives each user
    /// the groups `id -G` gives: for the current user and every user `/etc/group` names as a
    /// member (those have supplementary groups, the part the fallback exists for).
    #[test]
    fn the_nss_fallback_lists_the_groups_id_lists() {
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid()).unwrap().unwrap().name;
        let members = std::fs::read_to_string("/etc/group").unwrap_or_default();
        let mut names: BTreeSet<String> =
            members.lines().filter_map(|l| l.split(':').nth(3)).flat_map(|m| m.split(',')).map(str::to_owned).collect();
        names.retain(|n| !n.is_empty());
        names.insert(me);
        let mut with_supplementary = 0;
        for name in &names {
            let Ok(Some(user)) = nix::unistd::User::from_name(name) else { continue };
            let id = UnixIdentity::resolve(user.uid.as_raw(), user.gid.as_raw(), None, None);
            assert_eq!(id.groups_source, GroupsSource::Nss);
            let ours: BTreeSet<u32> = id.groups.iter().map(|(g, _)| *g).collect();
            let expected = id_groups(name);
            assert_eq!(ours, expected, "groups of {name}");
            with_supplementary += usize::from(expected.len() > 1);
        }
        eprintln!("{} user(s) checked, {with_supplementary} with supplementary groups", names.len());
    }

    /// On a real connection whose kernel list is missing (as before Linux 4.13) the request's
    /// identity comes from the fallback and says so (`getgrouplist` in the audit record); with
    /// the kernel's list it says `SO_PEERGROUPS`.
    #[tokio::test]
    async fn the_source_follows_whether_the_kernel_gave_the_groups() {
        let (server, _client) = tokio::net::UnixStream::pair().unwrap();
        use tonic::transport::server::Connected as _;
        let request = |groups: Option<Arc<[u32]>>| {
            let mut req = tonic::Request::new(());
            req.extensions_mut().insert(UnixConnectInfo { uds: server.connect_info(), groups });
            req
        };
        let Some(Identity::Unix(nss)) = identity(&request(None)) else { panic!("no Unix identity") };
        assert_eq!(nss.groups_source.as_str(), "getgrouplist");
        let kernel = peer_groups(std::os::fd::AsFd::as_fd(&server)).map(Arc::from);
        assert!(kernel.is_some(), "this kernel has SO_PEERGROUPS");
        let Some(Identity::Unix(from_kernel)) = identity(&request(kernel)) else { panic!("no Unix identity") };
        assert_eq!(from_kernel.groups_source.as_str(), "SO_PEERGROUPS");
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid()).unwrap().unwrap().name;
        let ours: BTreeSet<u32> = nss.groups.iter().map(|(g, _)| *g).collect();
        assert_eq!(ours, id_groups(&me));
    }
}
