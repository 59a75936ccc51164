//! Log output off the request path, in batches: stderr (the journal under systemd) and the
//! optional audit log file.
//!
//! Every request writes an audit line, so how lines reach their destination is on the hot
//! path. Writing from the async workers would let a slow journal stall requests;
//! a channel to a writer thread (tracing-appender's `non_blocking`) wakes that thread for every
//! line, and on a small or virtualised CPU a wake-up costs more than formatting the line.
//! [`BatchedWriter`] appends each line to a shared buffer and wakes the writer thread only when
//! the buffer was empty; the thread then waits [`COALESCE`] for more lines and writes them all
//! with one `write(2)`. [`FlushGuard`] writes what is left when the daemon stops.
//!
//! A logger never waits for the destination (a slow or stuck journal must not stall the tokio
//! workers that log). When the destination does not keep up:
//! - past [`HIGH_WATER`] buffered bytes, ordinary lines are dropped;
//! - audit lines (the `audit` tracing target, and every line of the audit file) are still
//!   kept, up to [`AUDIT_HIGH_WATER`] buffered bytes; past that they are dropped too.
//!
//! Nothing is dropped silently: the drops are counted ([`BatchedWriter::dropped`]) and, once
//! the writer thread has written its next batch, it logs a warning saying how many lines
//! (and how many of them audit lines) were lost. Under sustained overload the buffer stays
//! below [`AUDIT_HIGH_WATER`] and the warnings mark the gaps. In the audit file
//! ([`BatchedWriter::gap_records`]) the gap is marked in place too: the first audit line kept
//! after drops is preceded by one JSON record, `{"time":...,"event":"audit_gap","dropped":N}`,
//! saying how many audit lines are missing there.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the writer thread waits after the first line of a batch, for more lines.
pub const COALESCE: Duration = Duration::from_millis(5);

/// Buffered bytes past which ordinary log lines are dropped (counted and reported).
pub const HIGH_WATER: usize = 1024 * 1024;

/// Buffered bytes past which audit lines are dropped too (counted and reported): about 60,000
/// audit records.
pub const AUDIT_HIGH_WATER: usize = 16 * 1024 * 1024;

/// The tracing target of audit events ([`crate::auth::audit`]): lines kept up to
/// [`AUDIT_HIGH_WATER`].
const AUDIT_TARGET: &str = "audit";

/// How a line counts against the bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Dropped past [`HIGH_WATER`].
    Ordinary,
    /// Dropped past [`AUDIT_HIGH_WATER`].
    Audit,
}

/// Lines dropped because the destination did not keep up.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Lines dropped, audit lines included.
    pub lines: u64,
    /// Of those, audit lines.
    pub audit: u64,
}

impl Dropped {
    fn count(&mut self, kind: Kind) {
        self.lines += 1;
        if kind == Kind::Audit {
            self.audit += 1;
        }
    }
}

#[derive(Debug, Default)]
struct State {
    buf: Vec<u8>,
    closed: bool,
    /// Drops the writer thread has not reported yet.
    unreported: Dropped,
    /// Every drop since the start.
    total: Dropped,
    /// Whether a gap in the audit lines is marked with a record ([`BatchedWriter::gap_records`]).
    gap_records: bool,
    /// Audit lines dropped since the last one kept.
    gap: u64,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when the buffer gets its first line, and at close.
    has_lines: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a buffer of whole lines: still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one line, or counts it as dropped if the buffer is past the line's bound. Never
    /// waits for the writer (a line larger than the bound still goes into an empty buffer).
    fn append(&self, bytes: &[u8], kind: Kind) {
        let bound = match kind {
            Kind::Ordinary => HIGH_WATER,
            Kind::Audit => AUDIT_HIGH_WATER,
        };
        let mut state = self.lock();
        if !state.buf.is_empty() && state.buf.len() + bytes.len() > bound {
            state.unreported.count(kind);
            state.total.count(kind);
            if kind == Kind::Audit {
                state.gap += 1;
            }
            return;
        }
        let first = state.buf.is_empty();
        if kind == Kind::Audit && state.gap > 0 && state.gap_records {
            // Over the bound by one short line at most: the gap must show where it is.
            let dropped = std::mem::take(&mut state.gap);
            state.buf.extend_from_slice(gap_record(dropped).as_bytes());
        }
        state.buf.extend_from_slice(bytes);
        drop(state);
        if first {
            self.has_lines.notify_one();
        }
    }
}

/// A `MakeWriter` for tracing-subscriber: each event's bytes go to the shared buffer, those of
/// audit events with the audit lines' bound.
#[derive(Debug, Clone)]
pub struct BatchedWriter {
    shared: Arc<Shared>,
    kind: Kind,
}

/// Stops the writer thread, after it wrote every buffered line, when dropped.
#[derive(Debug)]
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl BatchedWriter {
    /// Appends `bytes` (whole lines) for the writer thread, or counts them as dropped past
    /// this writer's bound ([`HIGH_WATER`], or [`AUDIT_HIGH_WATER`] for
    /// [`BatchedWriter::audit_lines`]). Never waits.
    pub fn append(&self, bytes: &[u8]) {
        self.shared.append(bytes, self.kind);
    }

    /// This writer, for lines that are all audit records (the audit file): they are kept up to
    /// [`AUDIT_HIGH_WATER`].
    #[must_use]
    pub fn audit_lines(mut self) -> Self {
        self.kind = Kind::Audit;
        self
    }

    /// This writer, for the audit file: after audit lines were dropped, the next one kept is
    /// preceded by a record saying how many are missing ([`gap_record`]).
    #[must_use]
    pub fn gap_records(self) -> Self {
        self.shared.lock().gap_records = true;
        self
    }

    /// Lines dropped since the start because the destination did not keep up.
    pub fn dropped(&self) -> Dropped {
        self.shared.lock().total
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
        let name = thread.to_owned();
        let thread =
            std::thread::Builder::new().name(thread.into()).spawn(move || run(&for_thread, &name, out, on_error))?;
        Ok((
            BatchedWriter { shared: shared.clone(), kind: Kind::Ordinary },
            FlushGuard { shared, thread: Some(thread) },
        ))
    }
}

/// The writer thread: waits for a first line, lets a batch gather for [`COALESCE`], swaps the
/// buffer out and writes it, then reports the lines dropped meanwhile; until closed and empty.
fn run<W: Write>(shared: &Shared, name: &str, mut out: W, on_error: Option<fn(&io::Error)>) {
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
        let dropped = std::mem::take(&mut state.unreported);
        drop(state);
        if let (Err(e), Some(report)) = (out.write_all(&spare).and_then(|()| out.flush()), on_error) {
            report(&e);
        }
        if dropped.lines > 0 {
            // An ordinary event, but kept like an audit line (its target), so the gap shows.
            tracing::warn!(
                writer = name,
                lines = dropped.lines,
                audit_lines = dropped.audit,
                "log lines dropped: the log destination did not keep up"
            );
        }
    }
}

/// The audit record marking `dropped` audit lines lost before it, in the audit file's style
/// (`time` in seconds since the epoch).
fn gap_record(dropped: u64) -> String {
    let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let record = serde_json::json!({
        "time": time, "event": "audit_gap", "dropped": dropped,
        "reason": "the audit log did not keep up: this many records before this one are missing",
    });
    format!("{record}\n")
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.has_lines.notify_all();
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

    /// Audit events, and the writer's own reports of dropped lines, get the audit lines'
    /// bound.
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        let kept = meta.target() == AUDIT_TARGET || meta.target() == module_path!();
        BatchedWriter { shared: self.shared.clone(), kind: if kept { Kind::Audit } else { self.kind } }
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

    /// A destination stuck until the test opens it (a journal that stopped reading).
    #[derive(Clone, Default)]
    struct Stuck {
        open: Arc<(Mutex<bool>, Condvar)>,
        /// Set when the writer thread is inside `write`, holding the batch it took.
        entered: Arc<(Mutex<bool>, Condvar)>,
        calls: Calls,
    }

    impl Stuck {
        fn release(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }

        /// Waits until the writer thread is stuck in `write`.
        fn wait_entered(&self) {
            let mut entered = self.entered.0.lock().unwrap();
            while !*entered {
                entered = self.entered.1.wait(entered).unwrap();
            }
        }
    }

    /// Opens the destination when dropped, so a failing assertion fails the test instead of
    /// leaving the writer thread (and the guard's drop waiting for it) stuck for good.
    struct ReleaseOnDrop(Stuck);

    impl Drop for ReleaseOnDrop {
        fn drop(&mut self) {
            self.0.release();
        }
    }

    impl Write for Stuck {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            *self.entered.0.lock().unwrap() = true;
            self.entered.1.notify_all();
            let mut open = self.open.0.lock().unwrap();
            while !*open {
                open = self.open.1.wait(open).unwrap();
            }
            drop(open);
            self.calls.write(b)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// With the destination stuck, 64 MiB of ordinary lines and then 8 MiB of audit lines are
    /// logged without waiting: ordinary lines past 1 MiB are dropped and counted, audit lines
    /// are all kept; every kept line arrives once the destination moves again. (Loggers used to
    /// wait for the writer past 1 MiB: this test hung.)
    #[test]
    fn a_stuck_destination_drops_ordinary_lines_counted_and_keeps_audit_lines() {
        let stuck = Stuck::default();
        let (writer, guard) = BatchedWriter::start("test-log", stuck.clone(), None).unwrap();
        let release = ReleaseOnDrop(stuck.clone());
        let started = std::time::Instant::now();
        let line = |c: u8| {
            let mut l = vec![c; 64 * 1024 - 1];
            l.push(b'\n');
            l
        };
        for _ in 0..1024 {
            writer.append(&line(b'o'));
        }
        let audit = writer.clone().audit_lines();
        for _ in 0..128 {
            audit.append(&line(b'a'));
        }
        assert!(started.elapsed() < Duration::from_secs(2), "logging waited: {:?}", started.elapsed());
        let dropped = writer.dropped();
        assert_eq!(dropped.audit, 0, "{dropped:?}");
        // 1 MiB is 16 lines; the writer thread may have taken one buffer (and be stuck writing
        // it) before the buffer filled again: 16 to 32 ordinary lines kept.
        assert!((1024 - 32..=1024 - 16).contains(&dropped.lines), "{dropped:?}");
        drop(release);
        drop(guard);
        let text = stuck.calls.0.lock().unwrap().concat();
        let count = |c: u8| text.split(|&b| b == b'\n').filter(|l| l.first() == Some(&c)).count() as u64;
        assert_eq!((count(b'o'), count(b'a')), (1024 - dropped.lines, 128));
    }

    /// With gap records (the audit file), the first audit line kept after drops is preceded by
    /// one `audit_gap` record counting them; without, nothing is added.
    #[test]
    fn a_gap_in_the_audit_lines_is_marked_where_it_is() {
        for marked in [true, false] {
            let stuck = Stuck::default();
            let (writer, guard) = BatchedWriter::start("test-log", stuck.clone(), None).unwrap();
            let release = ReleaseOnDrop(stuck.clone());
            let audit = if marked { writer.audit_lines().gap_records() } else { writer.audit_lines() };
            let line = |n: usize| format!("{{\"n\":{n},\"pad\":\"{}\"}}\n", "x".repeat(1024 * 1024));
            audit.append(line(0).as_bytes());
            stuck.wait_entered();
            for n in 1..20 {
                audit.append(line(n).as_bytes());
            }
            let dropped = audit.dropped().audit;
            assert!(dropped >= 3, "{dropped}");
            drop(release);
            // Once the writer caught up, the next line is kept: after the record.
            while !stuck
                .calls
                .0
                .lock()
                .unwrap()
                .concat()
                .ends_with(line(19 - usize::try_from(dropped).unwrap()).as_bytes())
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            audit.append(line(100).as_bytes());
            audit.append(line(101).as_bytes());
            drop(guard);
            let text = String::from_utf8(stuck.calls.0.lock().unwrap().concat()).unwrap();
            let records: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            let gaps: Vec<usize> =
                records.iter().enumerate().filter(|(_, r)| r["event"] == "audit_gap").map(|(i, _)| i).collect();
            let kept = usize::try_from(20 - dropped).unwrap();
            if marked {
                assert_eq!(gaps, vec![kept], "one record, right before line 100");
                assert_eq!(records[kept]["dropped"], serde_json::json!(dropped));
                assert!(records[kept]["time"].as_f64().unwrap() > 0.0);
                assert_eq!(records[kept + 1]["n"], 100);
                assert_eq!(records[kept + 2]["n"], 101);
            } else {
                assert!(gaps.is_empty());
                assert_eq!(records.len(), kept + 2);
            }
        }
    }

    /// Past [`AUDIT_HIGH_WATER`] audit lines are dropped too, counted as audit lines.
    #[test]
    fn audit_lines_past_their_bound_are_dropped_and_counted() {
        let stuck = Stuck::default();
        let (writer, guard) = BatchedWriter::start("test-log", stuck.clone(), None).unwrap();
        let release = ReleaseOnDrop(stuck.clone());
        let audit = writer.audit_lines();
        let line = vec![b'a'; 1024 * 1024];
        // The writer thread takes the first line and sticks in `write`; only then do the
        // other 19 MiB queue, 16 MiB of which fit under the bound (else how much it took
        // first, and so how much is dropped, would depend on the scheduler).
        audit.append(&line);
        stuck.wait_entered();
        for _ in 1..20 {
            audit.append(&line);
        }
        let dropped = audit.dropped();
        assert!(dropped.lines >= 3 && dropped.lines == dropped.audit, "{dropped:?}");
        drop(release);
        drop(guard);
        let total: usize = stuck.calls.0.lock().unwrap().iter().map(Vec::len).sum();
        assert_eq!(total as u64, (20 - dropped.lines) * line.len() as u64);
    }
}
