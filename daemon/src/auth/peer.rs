//! Client identity from the transport.

use tonic::transport::server::UdsConnectInfo;

/// An authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Unix user id.
    pub uid: u32,
    /// Unix group id.
    pub gid: u32,
    /// Process id, when known.
    pub pid: Option<i32>,
}

impl Peer {
    /// The identity of the client that sent `req`, from the Unix socket's peer credentials.
    /// `None` when the transport carries none (then every policy check denies).
    pub fn of<T>(req: &tonic::Request<T>) -> Option<Peer> {
        let info = req.extensions().get::<UdsConnectInfo>()?;
        let cred = info.peer_cred?;
        Some(Peer { uid: cred.uid(), gid: cred.gid(), pid: cred.pid() })
    }
}
