//! Bounds that hold before any request is authorized, so that a process that may only connect
//! (and has no right in the policy) cannot make the daemon stop serving others.
//!
//! - [`ConnectionLimits`]: connections on the Unix socket, in all and per client uid; one past a
//!   bound is closed at once (its client sees the connection reset) and logged at debug level.
//!   [`UnixIncoming`] accepts and admits them, and waits a little after a failed accept
//!   ([`crate::serve::fdlimit::accept_failed`]).
//! - [`Tally`] and its [`Held`]: the one "count up, give back on drop" guard these bounds, the
//!   TLS listener's connections and handshakes, a TLS key's handshake signatures and the
//!   metrics endpoint's connections are counted with.
//! - [`FrameLimit`]: the largest gRPC message each method may receive ([`max_message`], from
//!   the one table of them in `rpc::sizes`), checked on each message's 5-byte length prefix as
//!   it arrives, before the server reserves memory for it. tonic's own limit is per service, and `SealService` must take Seal's 64 MiB
//!   secrets, so without this an Unseal could make the daemon reserve 64 MiB per stream.
//!
//! The HTTP/2 bounds that hyper enforces itself (streams per connection, keepalive, reset
//! floods, header size) are set where the server is built (`server::http2_server`); all the
//! figures are in `docs/CONFIG.md` (`max_connections`, `max_connections_per_client`,
//! `max_streams_per_connection`) and `docs/RELIABILITY.md`.

use std::collections::HashMap;
use std::hash::Hash;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::Connected;

/// How many connections the Unix socket takes, in all and per client uid.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    open: Tally<u32>,
}

impl ConnectionLimits {
    /// At most `max_total` connections, and `max_per_uid` from one uid.
    pub fn new(max_total: usize, max_per_uid: usize) -> Self {
        Self { open: Tally::new(max_total, max_per_uid) }
    }

    /// Admits `stream` if its uid (from `SO_PEERCRED`; unknown counts as one uid) and the
    /// daemon are under their bounds; otherwise drops it, which closes it.
    pub fn admit(&self, stream: UnixStream) -> Option<Counted> {
        use std::os::fd::AsFd as _;
        let uid = stream.peer_cred().map_or(u32::MAX, |c| c.uid());
        let held = match self.open.try_take(uid) {
            Ok(held) => held,
            Err(Full { total, mine }) => {
                let (max_all, max_mine) = (self.open.bounds.max_total, self.open.bounds.max_per_key);
                tracing::debug!(uid, open = total, max_all, mine, max_mine, "connection refused: too many open");
                return None;
            }
        };
        // The peer's groups as the kernel recorded them at connect, read once per connection.
        let groups = crate::auth::peer_groups(stream.as_fd()).map(Arc::from);
        Some(Counted { stream, groups, _held: held })
    }
}

/// The Unix socket's admitted connections, as the gRPC server takes them. A failed accept
/// (`EMFILE` when the process is out of descriptors) is logged and followed by a short wait,
/// never handed to tonic: tonic would poll again at once, and the listener, its pending
/// connection still unaccepted, stays readable, so the loop would spin.
#[derive(Debug)]
pub struct UnixIncoming {
    listener: tokio::net::UnixListener,
    limits: ConnectionLimits,
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl UnixIncoming {
    /// Accepts on `listener`, admitting connections under `limits`.
    pub fn new(listener: tokio::net::UnixListener, limits: ConnectionLimits) -> Self {
        Self { listener, limits, backoff: None }
    }
}

impl tokio_stream::Stream for UnixIncoming {
    type Item = io::Result<Counted>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(backoff) = self.backoff.as_mut() {
                if std::future::Future::poll(backoff.as_mut(), cx).is_pending() {
                    return Poll::Pending;
                }
                self.backoff = None;
            }
            match self.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, _))) => {
                    if let Some(counted) = self.limits.admit(stream) {
                        return Poll::Ready(Some(Ok(counted)));
                    }
                }
                Poll::Ready(Err(e)) => {
                    self.backoff = Some(Box::pin(crate::serve::fdlimit::accept_failed("Unix socket", &e)));
                }
            }
        }
    }
}

/// Things held at once (connections, handshake signatures), in all and per key, each under a
/// bound: the one "count up, give back on drop" guard of the daemon. [`Tally::try_take`] counts
/// one more and returns its [`Held`], which gives it back when dropped.
#[derive(Debug)]
pub(crate) struct Tally<K> {
    bounds: Arc<Counts<K>>,
}

impl<K> Clone for Tally<K> {
    fn clone(&self) -> Self {
        Self { bounds: self.bounds.clone() }
    }
}

#[derive(Debug)]
struct Counts<K> {
    max_total: usize,
    max_per_key: usize,
    /// Held in all, and per key (keys at zero are removed).
    open: Mutex<(usize, HashMap<K, usize>)>,
}

/// Why [`Tally::try_take`] refused: the counts it found at a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    /// Held in all.
    pub total: usize,
    /// Held under the key asked for.
    pub mine: usize,
}

impl<K: Eq + Hash + Clone> Tally<K> {
    /// At most `max_total` held at once, and `max_per_key` under one key.
    pub(crate) fn new(max_total: usize, max_per_key: usize) -> Self {
        let open = Mutex::new((0, HashMap::new()));
        Self { bounds: Arc::new(Counts { max_total, max_per_key, open }) }
    }

    /// One more held under `key`, given back when the [`Held`] drops.
    ///
    /// # Errors
    /// [`Full`] when `max_total` are held in all or `max_per_key` under `key`.
    pub(crate) fn try_take(&self, key: K) -> Result<Held<K>, Full> {
        let mut open = self.bounds.open.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, per_key) = &mut *open;
        let mine = per_key.get(&key).copied().unwrap_or(0);
        if *total >= self.bounds.max_total || mine >= self.bounds.max_per_key {
            return Err(Full { total: *total, mine });
        }
        *total += 1;
        per_key.insert(key.clone(), mine + 1);
        Ok(Held { counts: self.bounds.clone(), key })
    }
}

impl Tally<()> {
    /// At most `max` held at once, with no keys.
    pub(crate) fn up_to(max: usize) -> Self {
        Self::new(max, max)
    }
}

/// One thing counted by a [`Tally`]; its count is given back when this is dropped.
#[derive(Debug)]
pub(crate) struct Held<K: Eq + Hash> {
    counts: Arc<Counts<K>>,
    key: K,
}

impl<K: Eq + Hash> Drop for Held<K> {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, per_key) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(n) = per_key.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_key.remove(&self.key);
            }
        }
    }
}

/// An admitted Unix connection: the stream itself, counted until dropped, and its peer's
/// groups, which every request on it carries ([`crate::auth::UnixConnectInfo`]).
#[derive(Debug)]
pub struct Counted {
    stream: UnixStream,
    groups: Option<Arc<[u32]>>,
    _held: Held<u32>,
}

impl Connected for Counted {
    type ConnectInfo = crate::auth::UnixConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        crate::auth::UnixConnectInfo { uds: self.stream.connect_info(), groups: self.groups.clone() }
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

pub use crate::rpc::sizes::max_message;

/// A request body that fails, with `OUT_OF_RANGE` as tonic does for an oversized message, as
/// soon as a gRPC message prefix declares more than the method's limit: before anything
/// reserves room for the message.
#[derive(Debug)]
pub struct FrameLimit<B> {
    inner: B,
    limit: usize,
    /// The prefix read so far (flag byte and 4-byte big-endian length).
    prefix: [u8; 5],
    have: usize,
    /// Bytes of the current message still to come.
    remaining: usize,
}

impl<B> FrameLimit<B> {
    /// `inner` limited to messages of at most `limit` bytes.
    pub fn new(inner: B, limit: usize) -> Self {
        Self { inner, limit, prefix: [0; 5], have: 0, remaining: 0 }
    }

    /// Follows the message boundaries through `data`; fails on a prefix over the limit.
    fn check(&mut self, data: &[u8]) -> Result<(), tonic::Status> {
        let mut at = 0;
        while at < data.len() {
            if self.remaining > 0 {
                let take = self.remaining.min(data.len() - at);
                self.remaining -= take;
                at += take;
                continue;
            }
            self.prefix[self.have] = data[at];
            self.have += 1;
            at += 1;
            if self.have == self.prefix.len() {
                self.have = 0;
                let len = u32::from_be_bytes([self.prefix[1], self.prefix[2], self.prefix[3], self.prefix[4]]);
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if len > self.limit {
                    return Err(crate::rpc::error_status::message_too_large(len, self.limit));
                }
                self.remaining = len;
            }
        }
        Ok(())
    }
}

impl<B> Body for FrameLimit<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            if let Err(status) = self.check(data) {
                return Poll::Ready(Some(Err(Box::new(status))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len as usize));
        m
    }

    /// Messages at the limit pass whatever the chunking; one prefix over it fails, even when
    /// the prefix arrives split across chunks.
    #[test]
    fn prefixes_are_followed_across_chunks() {
        let stream: Vec<u8> = [message(10), message(0), message(100)].concat();
        for chunk in [1, 2, 3, 5, 7, 64, 1000] {
            let mut limit = FrameLimit::new((), 100);
            for part in stream.chunks(chunk) {
                assert!(limit.check(part).is_ok(), "chunk {chunk}");
            }
            let mut over = FrameLimit::new((), 100);
            let bad: Vec<u8> = [message(10), vec![0, 0, 0, 0, 101]].concat();
            let failed = bad.chunks(chunk).map(|part| over.check(part)).find_map(Result::err);
            let status = failed.unwrap_or_else(|| panic!("chunk {chunk}: 101 bytes passed a 100-byte limit"));
            assert_eq!(status.code(), tonic::Code::OutOfRange);
        }
    }
}
