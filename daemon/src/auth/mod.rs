//! Who is calling: the client identity attached to every request. On the Unix socket it comes
//! from SO_PEERCRED (uid, gid, pid), which the kernel vouches for. Access policies (deny by
//! default) build on it.

pub mod peer;

pub use peer::Peer;
