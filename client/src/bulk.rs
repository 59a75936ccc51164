//! Stream encryption in the caller's process (format v2): the daemon only makes and unwraps
//! the stream key ([`Client::copy_encrypt`](crate::Client::copy_encrypt) and
//! [`Client::copy_decrypt`](crate::Client::copy_decrypt) call it once per stream), and the
//! AES-256-GCM work on the data runs here, on the CPU's AES instructions.
//!
//! The data path is one pipeline for both directions ([`run`]):
//! - **Batches.** Input is read straight into a [`Batch`]: [`BATCH_CHUNKS`] chunk slots of
//!   `chunk + TAG` bytes back to back, so a chunk is sealed or opened in place where it was read
//!   (the tag lands in its slot's tail) and written from there. No chunk is copied in user space;
//!   the only copies are the kernel's `read` and `write`. A sealed batch is one contiguous run of
//!   output, written with one call; an opened one is written chunk by chunk (its tags stay
//!   behind). The batches are allocated once per stream and reused; they are wiped when the
//!   stream ends.
//! - **Threads.** With one thread ([`threads`] on a process pinned to one CPU) each batch is
//!   processed on the calling thread between its read and its write: no hand-off at all. With
//!   more, a pool started once per stream takes batches from one queue (an idle thread takes the
//!   next, so a CPU busy with something else slows only its own batch), while the calling thread
//!   reads the next batches and writes the finished ones in order. At most
//!   [`IN_FLIGHT_PER_THREAD`] batches per thread are out at once: memory stays bounded.
//! - **Order and authenticity.** Batches are written in the order they were read. Decryption
//!   writes a chunk only once it and every chunk before it authenticated; a failing chunk ends
//!   the stream with an error naming it, before any of its bytes.
//!
//! The I/O is the caller's `AsyncRead`/`AsyncWrite`. The CLI and
//! [`BlockingClient`](crate::BlockingClient) hand in plain blocking files through
//! [`SyncIo`](crate::sync_io::SyncIo), so their data path is `read`, AES, `write`, with no
//! runtime thread in between.

use std::collections::VecDeque;
use std::sync::{mpsc, Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;
use tpm_vault_proto::stream::{ChunkCipher, StreamError, TagDigest, COMMITMENT, TAG};
use zeroize::Zeroizing;

use crate::Error;

/// Chunks per batch: 16 × 64 KiB, so a hand-off to a thread moves 1 MiB and costs little next
/// to its AES work.
pub const BATCH_CHUNKS: usize = 16;

/// Batches out at a thread per thread: one being processed and one waiting, so a thread never
/// idles while the calling thread writes.
pub const IN_FLIGHT_PER_THREAD: usize = 2;

/// The threads that seal or open chunks by default: the CPUs this process may use (its
/// affinity: 1 under `taskset -c 0`), at most 8. Read once: `available_parallelism` reads the
/// cgroup's files on every call.
pub fn threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8))
}

/// How a stream's chunks are spread over threads: `count` threads of AES work (1: the calling
/// thread does it between its read and its write); with `io_core`, one of them is left to the
/// calling thread's reads and writes, and the pool has `count - 1` (at least 1).
///
/// `io_core` is for an output that costs the kernel as much as a plain copy (a file, a pipe):
/// there the calling thread is the pipeline's critical path, a `read` and a `write` of every
/// byte, as much work as `cat`. With a pool thread per CPU besides it, three threads share two
/// CPUs and the scheduler takes a third of the I/O thread's time for AES that was not the
/// bottleneck (file to file ran at 0.65x of `cat`, issue #36). To `/dev/null` the writes cost
/// nothing and every CPU does AES.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Threads {
    /// Threads of AES work, the calling one included when it does all of it (at least 1).
    pub(crate) count: usize,
    /// Leave a CPU to the calling thread's I/O.
    pub(crate) io_core: bool,
}

impl Threads {
    /// `count` threads (at least 1), every one doing AES.
    pub(crate) fn new(count: usize) -> Threads {
        Threads { count: count.max(1), io_core: false }
    }

    /// Threads in the pool: 0 when the calling thread seals or opens the chunks itself.
    fn pool(self) -> usize {
        match (self.count, self.io_core) {
            (0 | 1, _) => 0,
            (n, false) => n,
            (n, true) => n - 1,
        }
    }
}

/// Which way a stream goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Plaintext in, sealed chunks out.
    Seal,
    /// Sealed chunks in, plaintext out.
    Open,
}

/// Up to [`BATCH_CHUNKS`] consecutive chunks of a stream, in their slots.
struct Batch {
    /// Index of the first chunk in the stream.
    first: u32,
    /// The slots, `chunk + TAG` bytes each, back to back.
    buf: Zeroizing<Vec<u8>>,
    /// Per chunk read: its input length; after processing, its output length (and only the
    /// chunks before a failing one are left).
    lens: Vec<usize>,
    /// The batch ends with the stream's final chunk.
    last: bool,
    /// The first chunk that failed, if one did.
    failed: Option<StreamError>,
    /// The tag of each chunk processed, in order (what a v3 stream's commitment covers).
    tags: Vec<[u8; TAG]>,
}

impl Batch {
    /// An empty batch for slots of `slot` bytes.
    fn new(slot: usize) -> Batch {
        Batch {
            first: 0,
            buf: Zeroizing::new(vec![0; BATCH_CHUNKS * slot]),
            lens: Vec::with_capacity(BATCH_CHUNKS),
            last: false,
            failed: None,
            tags: Vec::with_capacity(BATCH_CHUNKS),
        }
    }

    /// Reads the chunks from `first` on: up to `input` bytes into each slot, until the batch
    /// is full or a chunk comes up short. A full chunk is never the stream's last; the short
    /// (possibly empty) one at the end of the input is.
    async fn fill<R>(&mut self, reader: &mut R, first: u32, slot: usize, input: usize) -> Result<(), Error>
    where
        R: AsyncRead + Unpin + ?Sized,
    {
        self.first = first;
        self.lens.clear();
        self.last = false;
        self.failed = None;
        self.tags.clear();
        for start in (0..BATCH_CHUNKS).map(|j| j * slot) {
            let n = read_full(reader, &mut self.buf[start..start + input]).await?;
            self.lens.push(n);
            if n < input {
                self.last = true;
                break;
            }
        }
        Ok(())
    }

    /// Index of the batch's last chunk.
    fn last_index(&self) -> u32 {
        // invariant: `run` checked that every index of the batch fits in a u32.
        self.first + (self.lens.len() as u32).saturating_sub(1)
    }

    /// Seals or opens every chunk in place, stopping at the first that fails.
    fn process(&mut self, cipher: &ChunkCipher, direction: Direction, slot: usize) {
        let count = self.lens.len();
        for j in 0..count {
            let (start, len) = (j * slot, self.lens[j]);
            // invariant: `run` checked that every index of the batch fits in a u32.
            let index = self.first + j as u32;
            let last = self.last && j + 1 == count;
            let mut tag = [0u8; TAG];
            let done = match direction {
                Direction::Seal => {
                    let sealed = cipher.seal(index, last, &mut self.buf[start..start + len + TAG]);
                    tag.copy_from_slice(&self.buf[start + len..start + len + TAG]);
                    sealed.map(|()| len + TAG)
                }
                Direction::Open => {
                    if len >= TAG {
                        tag.copy_from_slice(&self.buf[start + len - TAG..start + len]);
                    }
                    cipher.open(index, last, &mut self.buf[start..start + len])
                }
            };
            self.tags.push(tag);
            match done {
                Ok(out) => self.lens[j] = out,
                Err(e) => {
                    self.lens.truncate(j);
                    self.failed = Some(e);
                    return;
                }
            }
        }
    }

    /// Writes the output of the chunks that succeeded, adjacent ones in one call; then the
    /// error of the one that failed, if any. Returns the bytes written.
    async fn write<W>(&mut self, writer: &mut W, slot: usize) -> Result<u64, Error>
    where
        W: AsyncWrite + Unpin + ?Sized,
    {
        let mut written = 0;
        let mut run = 0..0;
        for (j, &len) in self.lens.iter().enumerate() {
            let start = j * slot;
            if start != run.end {
                writer.write_all(&self.buf[run.clone()]).await.map_err(Error::Write)?;
                run.start = start;
            }
            run.end = start + len;
            written += len as u64;
        }
        writer.write_all(&self.buf[run]).await.map_err(Error::Write)?;
        match self.failed.take() {
            Some(e) => Err(Error::InvalidInput(e.0)),
            None => Ok(written),
        }
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
async fn read_full<R: AsyncRead + Unpin + ?Sized>(reader: &mut R, buf: &mut [u8]) -> Result<usize, Error> {
    let mut filled = 0;
    while filled < buf.len() {
        // `read` into an initialised slice: no zeroing of the buffer on each call.
        match reader.read(&mut buf[filled..]).await.map_err(Error::Read)? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// A batch handed to the pool, and where it goes back.
type Job = (Batch, oneshot::Sender<Batch>);

/// Where the chunks are sealed or opened: on the calling thread, or on a pool of threads kept
/// for the stream's life (a thread per batch would cost a thread start each time).
struct Workers {
    /// The stream's cipher.
    cipher: Arc<ChunkCipher>,
    /// Which way.
    direction: Direction,
    /// Bytes per slot.
    slot: usize,
    /// The pool's queue; `None` processes on the calling thread. Dropping it ends the threads.
    queue: Option<mpsc::Sender<Job>>,
}

impl Workers {
    /// A pool of `threads` threads (none for 0: the calling thread does the work).
    fn start(cipher: ChunkCipher, direction: Direction, threads: usize) -> Result<Workers, Error> {
        let pool = threads;
        let slot = cipher.chunk_size() + TAG;
        let cipher = Arc::new(cipher);
        let queue = if pool > 0 {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for n in 0..pool {
                let (rx, cipher) = (Arc::clone(&rx), Arc::clone(&cipher));
                std::thread::Builder::new()
                    .name(format!("tpm-vault-aes-{n}"))
                    .spawn(move || loop {
                        // The lock is held only to take the next job; a poisoned one (another
                        // thread panicked) ends this thread too, and the stream sees `gone`.
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        let Ok((mut batch, reply)) = job else { return };
                        batch.process(&cipher, direction, slot);
                        let _ = reply.send(batch);
                    })
                    .map_err(Error::Runtime)?;
            }
            Some(tx)
        } else {
            None
        };
        Ok(Workers { cipher, direction, slot, queue })
    }

    /// Batches out at once.
    fn depth(&self, threads: usize) -> usize {
        if self.queue.is_some() {
            threads * IN_FLIGHT_PER_THREAD
        } else {
            1
        }
    }

    /// Hands `batch` to the pool (or processes it here); the receiver gives it back processed.
    fn submit(&self, mut batch: Batch) -> Result<oneshot::Receiver<Batch>, Error> {
        let (tx, rx) = oneshot::channel();
        match &self.queue {
            Some(queue) => queue.send((batch, tx)).map_err(|_| gone())?,
            None => {
                batch.process(&self.cipher, self.direction, self.slot);
                let _ = tx.send(batch);
            }
        }
        Ok(rx)
    }
}

/// The error for a worker thread that went away (it panicked).
fn gone() -> Error {
    Error::Runtime(std::io::Error::other("an encryption thread stopped"))
}

/// Seals (or opens) everything `reader` yields with `cipher` on `threads` threads and writes
/// it to `writer` in order; returns the bytes written and the digest of the chunk tags (what
/// a v3 stream's commitment covers: the caller has the daemon make or check it).
///
/// # Errors
/// [`Error::Read`], [`Error::Write`]; [`Error::InvalidInput`] past 2^32 chunks, and for
/// decryption naming the failing chunk (tampered, reordered, truncated, spliced, wrong key or
/// context): `writer` then holds the plaintext of chunks before the failing one only.
pub(crate) async fn run<R, W>(
    cipher: ChunkCipher,
    direction: Direction,
    threads: Threads,
    reader: &mut R,
    writer: &mut W,
) -> Result<(u64, [u8; 32]), Error>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let threads = threads.pool();
    let mut tags = TagDigest::default();
    let slot = cipher.chunk_size() + TAG;
    let input = match direction {
        Direction::Seal => cipher.chunk_size(),
        Direction::Open => slot,
    };
    let workers = Workers::start(cipher, direction, threads)?;
    let depth = workers.depth(threads);
    let mut spare: Vec<Batch> = Vec::with_capacity(depth);
    let mut out: VecDeque<oneshot::Receiver<Batch>> = VecDeque::with_capacity(depth);
    let mut written = 0u64;
    let mut next = Some(0u32);
    while let Some(first) = next {
        let mut batch = spare.pop().unwrap_or_else(|| Batch::new(slot));
        batch.fill(reader, first, slot, input).await?;
        if direction == Direction::Open && batch.last && batch.lens.last().is_some_and(|&n| n < TAG) {
            // The final chunk is the short one at the end, at least a tag long. An input that
            // ends on a chunk boundary (or inside a tag) has lost its final chunk.
            return Err(Error::InvalidInput(format!(
                "stream truncated: no final chunk after chunk {}",
                batch.last_index()
            )));
        }
        let after = first.checked_add(batch.lens.len() as u32);
        next = match (batch.last, after) {
            (true, _) => None,
            (false, Some(after)) => Some(after),
            (false, None) => return Err(Error::InvalidInput("stream too long".into())),
        };
        out.push_back(workers.submit(batch)?);
        while out.len() >= depth || (next.is_none() && !out.is_empty()) {
            let Some(pending) = out.pop_front() else { break };
            let mut done = pending.await.map_err(|_| gone())?;
            for tag in &done.tags[..done.lens.len()] {
                tags.add(tag);
            }
            written += done.write(writer, slot).await?;
            spare.push(done);
        }
    }
    writer.flush().await.map_err(Error::Write)?;
    Ok((written, tags.finish()))
}

/// Writes `header`, then encrypts everything `reader` yields with `cipher` into `writer`;
/// returns the bytes written.
///
/// # Errors
/// As [`run`].
pub(crate) async fn encrypt<R, W>(
    cipher: ChunkCipher,
    header: &[u8],
    threads: Threads,
    reader: &mut R,
    writer: &mut W,
) -> Result<(u64, [u8; 32]), Error>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    writer.write_all(header).await.map_err(Error::Write)?;
    let (written, tags) = run(cipher, Direction::Seal, threads, reader, writer).await?;
    Ok((header.len() as u64 + written, tags))
}

/// A reader that holds back the last [`COMMITMENT`] bytes of its input: the chunks of a v3
/// stream come out, the commitment after them stays behind ([`Holdback::trailer`]).
pub(crate) struct Holdback<'a, R: ?Sized> {
    inner: &'a mut R,
    buf: Vec<u8>,
    start: usize,
    eof: bool,
}

impl<'a, R: AsyncRead + Unpin + ?Sized> Holdback<'a, R> {
    /// Holds back the end of `inner`.
    pub(crate) fn new(inner: &'a mut R) -> Self {
        Holdback { inner, buf: Vec::with_capacity(64 * 1024), start: 0, eof: false }
    }

    /// The bytes held back at the end of the input (fewer than [`COMMITMENT`] if it was shorter).
    pub(crate) fn trailer(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

impl<R: AsyncRead + Unpin + ?Sized> AsyncRead for Holdback<'_, R> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = self.get_mut();
        while !this.eof && this.buf.len() - this.start <= COMMITMENT {
            // Refill: keep what is held, read more after it.
            this.buf.drain(..this.start);
            this.start = 0;
            let have = this.buf.len();
            this.buf.resize(this.buf.capacity().max(have + 4096), 0);
            let mut rb = tokio::io::ReadBuf::new(&mut this.buf[have..]);
            match std::pin::Pin::new(&mut *this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => {
                    this.buf.truncate(have);
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    this.buf.truncate(have);
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    this.buf.truncate(have + n);
                    this.eof = n == 0;
                }
            }
        }
        let ready = (this.buf.len() - this.start).saturating_sub(COMMITMENT).min(out.remaining());
        out.put_slice(&this.buf[this.start..this.start + ready]);
        this.start += ready;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use tpm_vault_proto::stream::{wrap_version, DataKeyId, Decryptor, Encryptor, Header, CHUNK, VERSION_2};

    use super::*;

    fn header(key: &[u8; 32]) -> Header {
        // The pipeline's chunks are the same in v2 and v3 (v3 adds the daemon's commitment).
        wrap_version(&[3; 32], DataKeyId { name: "dk", id: [1; 16] }, CHUNK as u32, b"ctx", [4; 12], key, VERSION_2)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn cipher(key: &[u8; 32]) -> ChunkCipher {
        ChunkCipher::new(key, &header(key), b"ctx").unwrap_or_else(|e| panic!("{e}"))
    }

    /// What the daemon's single-threaded [`Encryptor`] makes of `data` (without the header).
    fn reference(key: &[u8; 32], data: &[u8]) -> Vec<u8> {
        let h = header(key);
        let mut e = Encryptor::new(key, &h, b"ctx").unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        e.update(data, &mut out).unwrap_or_else(|e| panic!("{e}"));
        e.finish(&mut out).unwrap_or_else(|e| panic!("{e}"));
        out.split_off(h.encode().len())
    }

    async fn pipe(direction: Direction, threads: usize, input: &[u8]) -> (Result<u64, Error>, Vec<u8>) {
        // 1 thread: inline; 2: a pool of 1 beside the I/O thread; 3: a pool of 3.
        let threads = Threads { count: threads, io_core: threads == 2 };
        let mut out = Vec::new();
        let r = run(cipher(&[9; 32]), direction, threads, &mut &input[..], &mut out).await.map(|(n, _)| n);
        (r, out)
    }

    #[tokio::test]
    async fn every_length_and_thread_count_matches_the_reference() {
        let batch = BATCH_CHUNKS * CHUNK;
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, batch - 1, batch, batch + 1, 3 * batch + CHUNK / 2] {
            let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let sealed = reference(&[9; 32], &data);
            for threads in [1, 2, 3] {
                let (r, out) = pipe(Direction::Seal, threads, &data).await;
                assert_eq!(r.unwrap_or_else(|e| panic!("{e}")), sealed.len() as u64, "{len} bytes, {threads} threads");
                assert!(out == sealed, "{len} bytes on {threads} threads differ from the reference");
                let (r, out) = pipe(Direction::Open, threads, &sealed).await;
                assert_eq!(r.unwrap_or_else(|e| panic!("{e}")), len as u64);
                assert!(out == data, "{len} bytes on {threads} threads do not round-trip");
            }
        }
    }

    #[tokio::test]
    async fn a_failing_chunk_releases_only_the_chunks_before_it() {
        let data = vec![7u8; 3 * BATCH_CHUNKS * CHUNK + 5];
        let sealed = reference(&[9; 32], &data);
        let bad_chunk = BATCH_CHUNKS + 3;
        for threads in [1, 2] {
            let mut tampered = sealed.clone();
            tampered[bad_chunk * (CHUNK + TAG) + 10] ^= 1;
            let (r, out) = pipe(Direction::Open, threads, &tampered).await;
            let err = r.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.starts_with(&format!("chunk {bad_chunk} does not authenticate")), "{err}");
            assert_eq!(out.len(), bad_chunk * CHUNK, "{threads} threads");
        }
    }

    #[tokio::test]
    async fn truncation_is_named() {
        let data = vec![1u8; 2 * CHUNK];
        let sealed = reference(&[9; 32], &data);
        for (cut, after) in [(2 * (CHUNK + TAG), 2), (2 * (CHUNK + TAG) + TAG - 1, 2), (0, 0)] {
            let (r, _) = pipe(Direction::Open, 2, &sealed[..cut]).await;
            let err = r.err().map(|e| e.to_string()).unwrap_or_default();
            assert_eq!(err, format!("stream truncated: no final chunk after chunk {after}"));
        }
        // And the daemon's decryptor agrees that the whole stream is fine.
        let mut d = Decryptor::new(&[9; 32], &header(&[9; 32]), b"ctx").unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        d.update(&sealed, &mut out).unwrap_or_else(|e| panic!("{e}"));
        d.finish(&mut out).unwrap_or_else(|e| panic!("{e}"));
        assert!(out == data);
    }
}
