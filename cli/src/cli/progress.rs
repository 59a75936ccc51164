//! A progress line on stderr for long streams (`encrypt`, `decrypt`, `random`).
//!
//! Owns when progress is shown (stderr is a terminal, and the stream has run for a second) and
//! how it reads (`encrypting: 1.2 GiB of 4.0 GiB (30%), 410.5 MiB/s, ETA 0:07`). It does not
//! know what flows through: [`Progress`] wraps any reader or writer and counts bytes.

use std::io::{self, IsTerminal, Write};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Nothing is drawn for streams shorter than this.
const FIRST_DRAW: Duration = Duration::from_secs(1);

/// Time between redraws.
const REDRAW: Duration = Duration::from_millis(250);

/// A reader or writer that reports the bytes passing through it on stderr, when stderr is a
/// terminal. The line is erased when the stream ends (on drop).
#[derive(Debug)]
pub(crate) struct Progress<T> {
    /// The wrapped reader or writer.
    inner: T,
    /// `None` when stderr is not a terminal: then this is a plain pass-through.
    meter: Option<Meter>,
}

impl<T> Progress<T> {
    /// Wraps `inner`; `total` is the expected byte count, if known (for the percentage and ETA).
    pub(crate) fn new(inner: T, label: &'static str, total: Option<u64>) -> Progress<T> {
        let meter = io::stderr().is_terminal().then(|| Meter::new(label, total, Instant::now()));
        Progress { inner, meter }
    }

    fn count(&mut self, n: usize) {
        if let Some(meter) = &mut self.meter {
            meter.add(n as u64, Instant::now());
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Progress<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        this.count(n);
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Progress<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = result {
            this.count(n);
        }
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The size of standard input when it is a regular file (`< file`), for the ETA.
pub(crate) fn stdin_size() -> Option<u64> {
    let fd = io::stdin().as_fd().try_clone_to_owned().ok()?;
    let metadata = std::fs::File::from(fd).metadata().ok()?;
    metadata.is_file().then_some(metadata.len())
}

/// Counts bytes and draws the line.
#[derive(Debug)]
struct Meter {
    /// What is going on: "encrypting", "decrypting", "random".
    label: &'static str,
    /// Expected bytes, if known.
    total: Option<u64>,
    /// Bytes so far.
    done: u64,
    /// When the stream started, for the rate.
    start: Instant,
    /// When to draw next.
    next_draw: Instant,
    /// Whether a line is on screen (to erase at the end).
    drawn: bool,
}

impl Meter {
    fn new(label: &'static str, total: Option<u64>, now: Instant) -> Meter {
        Meter { label, total, done: 0, start: now, next_draw: now + FIRST_DRAW, drawn: false }
    }

    fn add(&mut self, n: u64, now: Instant) {
        self.done += n;
        if now >= self.next_draw {
            self.next_draw = now + REDRAW;
            let line = progress_line(self.label, self.done, self.total, now - self.start);
            // Progress is a courtesy: a failing stderr must not fail the stream.
            let _ = write!(io::stderr().lock(), "\r{line}\x1b[K");
            self.drawn = true;
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.drawn {
            let _ = write!(io::stderr().lock(), "\r\x1b[K");
        }
    }
}

/// `encrypting: 1.2 GiB of 4.0 GiB (30%), 410.5 MiB/s, ETA 0:07` (without the total parts
/// when the size is unknown).
fn progress_line(label: &str, done: u64, total: Option<u64>, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
    let mut line = format!("{label}: {}", size(done as f64));
    if let Some(total) = total.filter(|&t| t > 0) {
        let percent = (done.min(total) as f64 * 100.0 / total as f64).floor();
        line.push_str(&format!(" of {} ({percent:.0}%)", size(total as f64)));
    }
    line.push_str(&format!(", {}/s", size(rate)));
    if let Some(total) = total {
        if rate > 0.0 && done < total {
            line.push_str(&format!(", ETA {}", clock(((total - done) as f64 / rate).ceil() as u64)));
        }
    }
    line
}

/// Bytes with a binary unit: `512 B`, `1.5 KiB`, `410.5 MiB`.
fn size(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024.0 {
        return format!("{bytes:.0} B");
    }
    let mut value = bytes / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

/// Seconds as `m:ss` or `h:mm:ss`.
fn clock(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size(0.0), "0 B");
        assert_eq!(size(1023.0), "1023 B");
        assert_eq!(size(1536.0), "1.5 KiB");
        assert_eq!(size(410.5 * 1024.0 * 1024.0), "410.5 MiB");
        assert_eq!(size(3.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0), "3.0 TiB");
    }

    #[test]
    fn clocks() {
        assert_eq!(clock(7), "0:07");
        assert_eq!(clock(65), "1:05");
        assert_eq!(clock(3723), "1:02:03");
    }

    #[test]
    fn line_with_and_without_total() {
        let mib = 1024 * 1024;
        assert_eq!(
            progress_line("encrypting", 100 * mib, Some(400 * mib), Duration::from_secs(2)),
            "encrypting: 100.0 MiB of 400.0 MiB (25%), 50.0 MiB/s, ETA 0:06"
        );
        assert_eq!(
            progress_line("decrypting", 3 * mib, None, Duration::from_secs(1)),
            "decrypting: 3.0 MiB, 3.0 MiB/s"
        );
        assert_eq!(
            progress_line("random", 10, Some(10), Duration::from_secs(1)),
            "random: 10 B of 10 B (100%), 10 B/s"
        );
    }

    #[test]
    fn meter_waits_before_drawing() {
        let start = Instant::now();
        let mut meter = Meter::new("x", None, start);
        meter.add(5, start + Duration::from_millis(10));
        assert!(!meter.drawn);
        assert_eq!(meter.done, 5);
        // Not drawn to the real stderr in tests: only the schedule is checked.
        assert_eq!(meter.next_draw, start + FIRST_DRAW);
    }

    #[tokio::test]
    async fn counts_reads_and_writes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut reader = Progress { inner: &b"hello"[..], meter: Some(Meter::new("r", None, Instant::now())) };
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        assert_eq!(reader.meter.as_ref().unwrap().done, 5);
        let mut writer = Progress { inner: Vec::new(), meter: Some(Meter::new("w", None, Instant::now())) };
        writer.write_all(b"abc").await.unwrap();
        assert_eq!(writer.meter.as_ref().unwrap().done, 3);
        assert_eq!(writer.inner, b"abc");
    }
}
