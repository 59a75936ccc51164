//! Stream encryption in the caller's process (format v2): the daemon only makes and unwraps
//! the stream key ([`Client::copy_encrypt`](crate::Client::copy_encrypt) and
//! [`Client::copy_decrypt`](crate::Client::copy_decrypt) call it once per stream), and the
//! AES-256-GCM work on the data runs here, on the CPU's AES instructions.
//!
//! Chunks are independent (each has its own counter nonce), so a batch of them is sealed or
//! opened on a few threads at once ([`threads`], started once per stream) and written in order. Memory stays bounded:
//! one batch ([`CHUNKS_PER_THREAD`] chunks per thread) is read, processed and written at a time.
//! Decryption writes a chunk only after every chunk before it and itself authenticated; a
//! failing chunk ends the stream with an error naming it, before any of its bytes.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tpm_vault_proto::stream::{ChunkCipher, StreamError, TAG};
use zeroize::Zeroizing;

use crate::Error;

/// Chunks each thread processes per batch: 16 × 64 KiB, so a batch is large enough that the
/// hand-off to the threads costs little next to the AES work.
pub const CHUNKS_PER_THREAD: usize = 16;

/// The threads that seal or open chunks: the CPUs this process may use, at most 8. Read once:
/// `available_parallelism` reads the cgroup's files on every call.
pub fn threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8))
}

/// One chunk of a batch: its index, whether it is the stream's last, and its bytes (plaintext
/// or sealed, transformed in place).
struct Chunk {
    /// Index in the stream.
    index: u32,
    /// The final chunk.
    last: bool,
    /// Its bytes.
    data: Zeroizing<Vec<u8>>,
}

/// Reads into `buf`'s spare capacity until it is full or the input ends; true at the end.
async fn fill<R: AsyncRead + Unpin + ?Sized>(reader: &mut R, buf: &mut Vec<u8>, want: usize) -> Result<bool, Error> {
    while buf.len() < want {
        let spare = want - buf.len();
        let n = (&mut *reader).take(spare as u64).read_buf(buf).await.map_err(Error::Read)?;
        if n == 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// An empty chunk buffer of `capacity` bytes: one of the last batch's, wiped (a freshly allocated
/// one per chunk costs a page fault per 4 KiB each batch, as the allocator returns freed batches
/// to the kernel).
fn buffer(spare: &mut Vec<Zeroizing<Vec<u8>>>, capacity: usize) -> Zeroizing<Vec<u8>> {
    match spare.pop() {
        Some(mut b) => {
            zeroize::Zeroize::zeroize(&mut *b);
            b.reserve(capacity);
            b
        }
        None => Zeroizing::new(Vec::with_capacity(capacity)),
    }
}

/// What a worker does to a chunk: seal or open it in place.
type Work = fn(&ChunkCipher, &mut Chunk) -> Result<(), StreamError>;

/// A group of chunks sent to a worker, and where it sends them back.
type Job = (Vec<Chunk>, tokio::sync::oneshot::Sender<Vec<(Chunk, Result<(), StreamError>)>>);

/// The threads of one stream ([`threads`] of them), kept for the stream's life: a thread per
/// batch would cost a thread start each time and make the allocator hand the batch's memory
/// back to the kernel and fault it in again, one page fault per 4 KiB of data.
struct Workers {
    /// One job queue per thread; dropping them ends the threads.
    queues: Vec<std::sync::mpsc::Sender<Job>>,
}

impl Workers {
    /// Starts the threads, each doing `work` with `cipher`.
    fn start(cipher: &Arc<ChunkCipher>, work: Work) -> Result<Workers, Error> {
        let mut queues = Vec::with_capacity(threads());
        for n in 0..threads() {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            let cipher = Arc::clone(cipher);
            std::thread::Builder::new()
                .name(format!("tpm-vault-aes-{n}"))
                .spawn(move || {
                    while let Ok((mut group, reply)) = rx.recv() {
                        let done = group.drain(..).map(|mut c| {
                            let r = work(&cipher, &mut c);
                            (c, r)
                        });
                        let _ = reply.send(done.collect());
                    }
                })
                .map_err(Error::Runtime)?;
            queues.push(tx);
        }
        Ok(Workers { queues })
    }

    /// Runs the work on every chunk of `batch`, split over the threads; the chunks come back
    /// in order, each with its result.
    async fn run(&self, mut batch: Vec<Chunk>) -> Result<Vec<(Chunk, Result<(), StreamError>)>, Error> {
        let per = batch.len().div_ceil(self.queues.len()).max(1);
        let mut replies = Vec::with_capacity(self.queues.len());
        for queue in &self.queues {
            if batch.is_empty() {
                break;
            }
            let rest = batch.split_off(per.min(batch.len()));
            let (tx, rx) = tokio::sync::oneshot::channel();
            queue.send((std::mem::replace(&mut batch, rest), tx)).map_err(|_| gone())?;
            replies.push(rx);
        }
        let mut done = Vec::new();
        for reply in replies {
            done.extend(reply.await.map_err(|_| gone())?);
        }
        Ok(done)
    }
}

impl Workers {
    /// Runs the work on `batch` and writes the chunks to `writer` in order, up to the first
    /// that failed (whose error it returns); the buffers go back to `spare`. Returns the bytes
    /// written.
    async fn write<W: AsyncWrite + Unpin + ?Sized>(
        &self,
        batch: Vec<Chunk>,
        writer: &mut W,
        spare: &mut Vec<Zeroizing<Vec<u8>>>,
    ) -> Result<u64, Error> {
        let mut written = 0;
        for (chunk, result) in self.run(batch).await? {
            result.map_err(|e| Error::InvalidInput(e.0))?;
            writer.write_all(&chunk.data).await.map_err(Error::Write)?;
            written += chunk.data.len() as u64;
            spare.push(chunk.data);
        }
        Ok(written)
    }
}

/// The error for a worker thread that went away (it panicked).
fn gone() -> Error {
    Error::Runtime(std::io::Error::other("an encryption thread stopped"))
}

/// Encrypts everything `reader` yields with `cipher` and writes `header` and the chunks to
/// `writer`; returns the bytes written.
///
/// # Errors
/// [`Error::Read`], [`Error::Write`]; [`Error::InvalidInput`] past 2^32 chunks.
pub(crate) async fn encrypt<R, W>(
    cipher: ChunkCipher,
    header: &[u8],
    reader: &mut R,
    writer: &mut W,
) -> Result<u64, Error>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let cipher = Arc::new(cipher);
    let size = cipher.chunk_size();
    let workers = Workers::start(&cipher, |c, chunk| c.seal(chunk.index, chunk.last, &mut chunk.data, 0))?;
    writer.write_all(header).await.map_err(Error::Write)?;
    let mut written = header.len() as u64;
    let mut index: u32 = 0;
    let mut spare = Vec::new();
    loop {
        let mut batch = Vec::with_capacity(threads() * CHUNKS_PER_THREAD);
        let mut eof = false;
        while batch.len() < threads() * CHUNKS_PER_THREAD && !eof {
            let mut data = buffer(&mut spare, size + TAG);
            eof = fill(reader, &mut data, size).await?;
            // A full chunk is never the last; the last is the short (maybe empty) one at the end.
            batch.push(Chunk { index, last: eof, data });
            index = index.checked_add(1).ok_or_else(|| Error::InvalidInput("stream too long".into()))?;
        }
        written += workers.write(batch, writer, &mut spare).await?;
        if eof {
            writer.flush().await.map_err(Error::Write)?;
            return Ok(written);
        }
    }
}

/// Decrypts the chunks that follow a stream's header in `reader` with `cipher` and writes the
/// plaintext to `writer`, a chunk only once it authenticated; returns the bytes written.
///
/// # Errors
/// [`Error::InvalidInput`] naming the failing chunk (tampered, reordered, truncated, spliced, wrong
/// key or context); [`Error::Read`], [`Error::Write`]. `writer` then holds the plaintext of
/// the chunks before the failing one only.
pub(crate) async fn decrypt<R, W>(cipher: ChunkCipher, reader: &mut R, writer: &mut W) -> Result<u64, Error>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let cipher = Arc::new(cipher);
    let sealed = cipher.chunk_size() + TAG;
    let workers = Workers::start(&cipher, |c, chunk| c.open(chunk.index, chunk.last, &mut chunk.data, 0))?;
    let mut written = 0u64;
    let mut index: u32 = 0;
    let mut spare = Vec::new();
    loop {
        let mut batch = Vec::with_capacity(threads() * CHUNKS_PER_THREAD);
        let mut eof = false;
        while batch.len() < threads() * CHUNKS_PER_THREAD && !eof {
            let mut data = buffer(&mut spare, sealed);
            eof = fill(reader, &mut data, sealed).await?;
            // A full sealed chunk is never the last: the last is the short one at the end. An
            // input that ends on a chunk boundary (or inside a tag) has lost its final chunk.
            if eof && data.len() < TAG {
                return Err(Error::InvalidInput(format!("stream truncated: no final chunk after chunk {index}")));
            }
            batch.push(Chunk { index, last: eof, data });
            index = index.checked_add(1).ok_or_else(|| Error::InvalidInput("stream too long".into()))?;
        }
        written += workers.write(batch, writer, &mut spare).await?;
        if eof {
            writer.flush().await.map_err(Error::Write)?;
            return Ok(written);
        }
    }
}
