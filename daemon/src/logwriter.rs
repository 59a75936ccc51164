//! Log output off the request path, in batches: stderr (the journal under systemd) and the
//! optional audit log file.
//!
//! Every request writes an audit line, so how lines reach their destination is on the hot
//! path. Writing from the async workers would let a slow journal stall requests;
//! a channel to a writer thread (tracing-appender's `non_blocking`) wakes that thread for every
//! line, and on a small or virtualised CPU a wake-up costs more than formatting the line.
//! [`BatchedWriter`] appends each line to a shared buffer and wakes the writer thread only when
//! the buffer was empty; the thread then waits [`COALESCE`] for more lines and writes them all
//! with one `write(2)`. Nothing is dropped: past [`HIGH_WATER`] buffered bytes, loggers wait for
//! the writer. [`FlushGuard`] writes what is left when the daemon stops.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the writer thread waits after the first line of a batch, for more lines.
pub const COALESCE: Duration = Duration::from_millis(5);

/// Buffered bytes past which loggers wait for the writer thread (back-pressure, not loss).
pub const HIGH_WATER: usize = 1024 * 1024;

#[derive(Debug, Default)]
struct State {
    buf: Vec<u8>,
    closed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when the buffer gets its first line, and at close.
    has_lines: Condvar,
    /// Signalled when the writer took the buffer.
    has_room: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a buffer of whole lines: still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn append(&self, bytes: &[u8]) {
        let mut state = self.lock();
        while state.buf.len() >= HIGH_WATER && !state.closed {
            state = self.has_room.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        let first = state.buf.is_empty();
        state.buf.extend_from_slice(bytes);
        drop(state);
        if first {
            self.has_lines.notify_one();
        }
    }
}

/// A `MakeWriter` for tracing-subscriber: each event's bytes go to the shared buffer.
#[derive(Debug, Clone)]
pub struct BatchedWriter {
    shared: Arc<Shared>,
}

/// Stops the writer thread, after it wrote every buffered line, when dropped.
#[derive(Debug)]
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl BatchedWriter {
    /// Appends `bytes` (whole lines) for the writer thread; waits while [`HIGH_WATER`] bytes
    /// are buffered.
    pub fn append(&self, bytes: &[u8]) {
        self.shared.append(bytes);
    }

    /// Starts a writer thread named `thread` writing to `out`; `on_error` hears of failed
    /// writes (once per failed batch, whose lines are lost; the next batch is written as usual).
    ///
    /// # Errors
    /// If the thread cannot be spawned.
    pub fn start<W: Write + Send + 'static>(
        thread: &str,
        out: W,
        on_error: Option<fn(&io::Error)>,
    ) -> io::Result<(BatchedWriter, FlushGuard)> {
        let shared = Arc::new(Shared::default());
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new().name(thread.into()).spawn(move || run(&for_thread, out, on_error))?;
        Ok((BatchedWriter { shared: shared.clone() }, FlushGuard { shared, thread: Some(thread) }))
    }
}

/// The writer thread: waits for a first line, lets a batch gather for [`COALESCE`], swaps the
/// buffer out and writes it; until closed and empty.
fn run<W: Write>(shared: &Shared, mut out: W, on_error: Option<fn(&io::Error)>) {
    let mut spare = Vec::new();
    loop {
        let mut state = shared.lock();
        while state.buf.is_empty() && !state.closed {
            state = shared.has_lines.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        if state.buf.is_empty() {
            return; // closed and everything written
        }
        if !state.closed && state.buf.len() < HIGH_WATER {
            state = shared.has_lines.wait_timeout(state, COALESCE).unwrap_or_else(PoisonError::into_inner).0;
        }
        spare.clear();
        std::mem::swap(&mut state.buf, &mut spare);
        drop(state);
        shared.has_room.notify_all();
        if let (Err(e), Some(report)) = (out.write_all(&spare).and_then(|()| out.flush()), on_error) {
            report(&e);
        }
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.has_lines.notify_all();
        self.shared.has_room.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Write for BatchedWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.append(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedWriter {
    type Writer = BatchedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A destination that records each write(2)-sized call.
    #[derive(Clone, Default)]
    struct Calls(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Calls {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_arrive_whole_in_order_and_batched() {
        let calls = Calls::default();
        let (writer, guard) = BatchedWriter::start("test-log", calls.clone(), None).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut w = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        w.write_all(format!("thread {t} line {i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let calls = calls.0.lock().unwrap();
        let all: Vec<u8> = calls.concat();
        let text = String::from_utf8(all).unwrap();
        assert_eq!(text.lines().count(), 2000, "nothing lost at shutdown");
        for t in 0..4 {
            let mine: Vec<usize> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("thread {t} line ")))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..500).collect::<Vec<_>>(), "thread {t}'s lines in order");
        }
        assert!(calls.len() < 2000 / 4, "{} writes for 2000 lines: not batched", calls.len());
    }

    #[test]
    fn a_full_buffer_makes_loggers_wait_not_drop() {
        let calls = Calls::default();
        let (mut writer, guard) = BatchedWriter::start("test-log", calls.clone(), None).unwrap();
        let line = vec![b'x'; 64 * 1024];
        for _ in 0..64 {
            writer.write_all(&line).unwrap();
        }
        drop(guard);
        let total: usize = calls.0.lock().unwrap().iter().map(Vec::len).sum();
        assert_eq!(total, 64 * line.len());
    }
}
