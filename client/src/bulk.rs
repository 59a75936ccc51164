//! Stream encryption in the caller's process (format v2): the daemon only makes and unwraps
//! the stream key ([`Client::copy_encrypt`](crate::Client::copy_encrypt) and
//! [`Client::copy_decrypt`](crate::Client::copy_decrypt) call it once per stream), and the
//! AES-256-GCM work on the data runs here, on the CPU's AES instructions.
//!
//! Chunks are independent (each has its own counter nonce), so a batch of them is sealed or
//! opened on a few threads at once ([`threads`]) and written in order. Memory stays bounded:
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

/// The threads that seal or open chunks: the CPUs this process may use, at most 8.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8)
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

/// Runs `work` on every chunk of `batch`, split over [`threads`], off the async runtime.
async fn in_parallel(
    cipher: &Arc<ChunkCipher>,
    batch: Vec<Chunk>,
    work: fn(&ChunkCipher, &mut Chunk) -> Result<(), StreamError>,
) -> Result<Vec<(Chunk, Result<(), StreamError>)>, Error> {
    let cipher = Arc::clone(cipher);
    let join = tokio::task::spawn_blocking(move || {
        let mut done: Vec<(Chunk, Result<(), StreamError>)> = batch.into_iter().map(|c| (c, Ok(()))).collect();
        let per = done.len().div_ceil(threads()).max(1);
        std::thread::scope(|scope| {
            for group in done.chunks_mut(per) {
                let cipher = &cipher;
                scope.spawn(move || {
                    for (chunk, result) in group {
                        *result = work(cipher, chunk);
                    }
                });
            }
        });
        done
    });
    join.await.map_err(|e| Error::Runtime(std::io::Error::other(e)))
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
    writer.write_all(header).await.map_err(Error::Write)?;
    let mut written = header.len() as u64;
    let mut index: u32 = 0;
    loop {
        let mut batch = Vec::with_capacity(threads() * CHUNKS_PER_THREAD);
        let mut eof = false;
        while batch.len() < threads() * CHUNKS_PER_THREAD && !eof {
            let mut data = Zeroizing::new(Vec::with_capacity(size + TAG));
            eof = fill(reader, &mut data, size).await?;
            // A full chunk is never the last; the last is the short (maybe empty) one at the end.
            batch.push(Chunk { index, last: eof, data });
            index = index.checked_add(1).ok_or_else(|| Error::InvalidInput("stream too long".into()))?;
        }
        for (chunk, result) in
            in_parallel(&cipher, batch, |c, chunk| c.seal(chunk.index, chunk.last, &mut chunk.data, 0)).await?
        {
            result.map_err(|e| Error::InvalidInput(e.0))?;
            writer.write_all(&chunk.data).await.map_err(Error::Write)?;
            written += chunk.data.len() as u64;
        }
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
    let mut written = 0u64;
    let mut index: u32 = 0;
    loop {
        let mut batch = Vec::with_capacity(threads() * CHUNKS_PER_THREAD);
        let mut eof = false;
        while batch.len() < threads() * CHUNKS_PER_THREAD && !eof {
            let mut data = Zeroizing::new(Vec::with_capacity(sealed));
            eof = fill(reader, &mut data, sealed).await?;
            // A full sealed chunk is never the last: the last is the short one at the end. An
            // input that ends on a chunk boundary (or inside a tag) has lost its final chunk.
            if eof && data.len() < TAG {
                return Err(Error::InvalidInput(format!("stream truncated: no final chunk after chunk {index}")));
            }
            batch.push(Chunk { index, last: eof, data });
            index = index.checked_add(1).ok_or_else(|| Error::InvalidInput("stream too long".into()))?;
        }
        for (chunk, result) in
            in_parallel(&cipher, batch, |c, chunk| c.open(chunk.index, chunk.last, &mut chunk.data, 0)).await?
        {
            result.map_err(|e| Error::InvalidInput(e.0))?;
            writer.write_all(&chunk.data).await.map_err(Error::Write)?;
            written += chunk.data.len() as u64;
        }
        if eof {
            writer.flush().await.map_err(Error::Write)?;
            return Ok(written);
        }
    }
}
