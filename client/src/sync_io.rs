//! [`SyncIo`]: a blocking reader or writer used where the library takes a tokio one.
//!
//! Each poll makes the blocking call at once, on the polling thread. That is what a program
//! whose runtime has nothing else to do wants for bulk data: [`BlockingClient`] (its private
//! runtime runs only the call these bytes feed) and the `tpm-vault encrypt`/`decrypt` commands
//! (standard input and output as plain files), whose data path is then `read`, AES, `write`,
//! without tokio's stdio threads and their two extra copies of every byte. Never use it on a
//! runtime shared with other work.
//!
//! [`BlockingClient`]: crate::BlockingClient

use std::io::{Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A blocking reader or writer used as a tokio one: each poll does the blocking call.
#[derive(Debug)]
pub struct SyncIo<T>(pub T);

impl<T: Read + Unpin> AsyncRead for SyncIo<T> {
    fn poll_read(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        // The bulk pipeline reads into initialised buffers, so this zeroes nothing there.
        let n = self.get_mut().0.read(buf.initialize_unfilled())?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: Write + Unpin> AsyncWrite for SyncIo<T> {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.get_mut().0.write(buf))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(self.get_mut().0.flush())
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_flush(cx)
    }
}
