//! The audit trail: one structured event per access decision on the `audit` tracing target
//! (time, client, where a local client's groups came from, operation, key, decision, rule,
//! outcome), and optionally the same as JSON lines appended to a file in batches by a
//! background thread ([`BatchedWriter`]: loggers never wait for it; past its bound it drops
//! lines, counted and reported, see [`crate::observe::logwriter`]). Never contains secrets.
//!
//! Repeated refusals are aggregated, so a client with no rights cannot flood the journal: of
//! the requests refused for one client (uid or certificate subject), operation and reason
//! (denied by the policy, or refused before any decision with the same code), the first
//! [`DENIALS_IN_FULL`] in each [`DENIAL_WINDOW`] are written one by one, the rest are counted,
//! and at the end of the window one summary record says how many (`"repeated": N`, with the
//! window's first client identity and no key). Granted requests are always written one by one.
//!
//! Rotation: after [`AuditLog::reopen`] (the daemon calls it on SIGHUP) the next batch goes to a
//! file opened anew at the configured path, so logrotate's rename + `postrotate` signal (the
//! shipped `systemd/logrotate.d/tpm-vault`) loses no record: lines written before the signal are
//! in the renamed file, the rest in the new one.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Identity, Operation};
use crate::observe::logwriter::{BatchedWriter, FlushGuard};

/// Refusals written one by one per client, operation and reason in each [`DENIAL_WINDOW`].
pub const DENIALS_IN_FULL: u64 = 5;

/// The interval repeated refusals are counted over; its summary record is written at its end.
pub const DENIAL_WINDOW: Duration = Duration::from_secs(10);

/// Most windows tracked at once. Past it, refusals of clients not tracked yet share one
/// window (summarised without a client identity), so a flood of identities cannot grow the
/// table.
const MAX_WINDOWS: usize = 4096;

/// Where audit events go besides the `audit` tracing target.
#[derive(Debug, Clone, Default)]
pub struct AuditLog {
    /// Dropped first: when the last clone goes, it writes the summaries of windows still open
    /// before the file is flushed.
    denials: Arc<Denials>,
    /// Where records go.
    sink: Sink,
    /// Flushes the file when the last clone is dropped.
    _flush: Option<Arc<FlushGuard>>,
    /// Set by [`AuditLog::reopen`]; the writer thread reopens the file before its next write.
    reopen: Arc<AtomicBool>,
}

impl AuditLog {
    /// Tracing only.
    pub fn tracing_only() -> Self {
        Self::default()
    }

    /// Tracing plus JSON lines appended to `path` (created mode 0600 if missing).
    ///
    /// # Errors
    /// The open error, or the writer thread's spawn error.
    pub fn with_file(path: &Path) -> std::io::Result<Self> {
        Self::with_file_and_window(path, DENIAL_WINDOW)
    }

    fn with_file_and_window(path: &Path, window: Duration) -> std::io::Result<Self> {
        let reopen = Arc::new(AtomicBool::new(false));
        let file = ReopeningFile { path: path.to_owned(), file: open_append(path)?, reopen: reopen.clone() };
        let report: fn(&std::io::Error) = |e| tracing::error!(error = %e, "cannot write the audit log file");
        let (writer, guard) = BatchedWriter::start("audit", file, Some(report))?;
        let sink = Sink { file: Some(writer.audit_lines().gap_records()) };
        Ok(Self { denials: Arc::new(Denials::new(sink.clone(), window)), sink, _flush: Some(Arc::new(guard)), reopen })
    }

    /// Makes the next batch go to a file opened anew at the configured path (after logrotate
    /// renamed the old one). A no-op without a file.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }

    /// Records one decision (a refusal only if it is among the first of its kind in the
    /// window; see the module docs).
    pub fn record(
        &self,
        who: &Identity,
        op: Operation,
        key: Option<&str>,
        decision: &str,
        rule: Option<&str>,
        outcome: &str,
    ) {
        let entry = Entry { who, op, key, decision, rule, outcome, repeated: None };
        let refused = decision == "deny" || (decision == "none" && outcome != "ok");
        if refused && !self.denials.admit(&entry) {
            return;
        }
        self.sink.write(&entry);
    }
}

/// One audit record.
struct Entry<'a> {
    who: &'a Identity,
    op: Operation,
    key: Option<&'a str>,
    decision: &'a str,
    rule: Option<&'a str>,
    outcome: &'a str,
    /// For a summary: how many refusals it stands for.
    repeated: Option<u64>,
}

/// Writes records: the tracing event, and the file's JSON line if there is a file.
#[derive(Debug, Clone, Default)]
struct Sink {
    file: Option<BatchedWriter>,
}

impl Sink {
    fn write(&self, e: &Entry<'_>) {
        let (uid, user, pid, subject, groups) = match e.who {
            Identity::Unix(u) => (Some(u.uid), u.user.as_deref(), u.pid, None, Some(u.groups_source.as_str())),
            Identity::Cert { subject } => (None, None, None, Some(subject.as_str()), None),
            Identity::Unknown => (None, None, None, None, None),
        };
        tracing::info!(
            target: "audit",
            uid,
            user,
            pid,
            subject,
            groups,
            op = e.op.as_str(),
            key = e.key,
            decision = e.decision,
            rule = e.rule,
            outcome = e.outcome,
            repeated = e.repeated,
            "access"
        );
        if let Some(writer) = &self.file {
            let time =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let mut line = serde_json::json!({
                "time": time, "uid": uid, "user": user, "pid": pid, "subject": subject, "groups": groups,
                "op": e.op.as_str(), "key": e.key, "decision": e.decision, "rule": e.rule, "outcome": e.outcome,
            });
            if let (Some(n), Some(fields)) = (e.repeated, line.as_object_mut()) {
                fields.insert("repeated".into(), n.into());
                fields.insert("window_s".into(), DENIAL_WINDOW.as_secs().into());
            }
            writer.append(format!("{line}\n").as_bytes());
        }
    }
}

/// The refusals counted per client, operation and reason, and the thread that writes each
/// window's summary at its end. Writes the summaries of open windows when dropped.
#[derive(Debug)]
struct Denials {
    table: Arc<Table>,
    sink: Sink,
}

impl Default for Denials {
    fn default() -> Self {
        Self::new(Sink::default(), DENIAL_WINDOW)
    }
}

#[derive(Debug)]
struct Table {
    state: Mutex<TableState>,
    /// Wakes the summary thread at close.
    wake: Condvar,
    window: Duration,
}

#[derive(Debug, Default)]
struct TableState {
    windows: HashMap<DenialKey, Window>,
    /// The summary thread runs (it stops when no window is left).
    sweeping: bool,
    closed: bool,
}

/// Who was refused what, and why: the unit refusals are counted in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct DenialKey {
    client: Client,
    op: Operation,
    decision: String,
    outcome: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Client {
    Uid(u32),
    Cert(String),
    Unknown,
    /// Any client, once [`MAX_WINDOWS`] windows are tracked.
    Other,
}

/// One open window: when it started, how many refusals it saw, and whom they were for (the
/// first one's identity, without its pid).
#[derive(Debug)]
struct Window {
    start: Instant,
    count: u64,
    who: Identity,
}

/// A window's summary record, owned.
struct Summary {
    who: Identity,
    key: DenialKey,
    repeated: u64,
}

impl Summary {
    fn entry(&self) -> Entry<'_> {
        Entry {
            who: &self.who,
            op: self.key.op,
            key: None,
            decision: &self.key.decision,
            rule: None,
            outcome: &self.key.outcome,
            repeated: Some(self.repeated),
        }
    }
}

impl Denials {
    fn new(sink: Sink, window: Duration) -> Self {
        let table = Table { state: Mutex::default(), wake: Condvar::new(), window };
        Self { table: Arc::new(table), sink }
    }

    /// Counts a refusal; whether it is to be written one by one.
    fn admit(&self, e: &Entry<'_>) -> bool {
        let now = Instant::now();
        let mut summaries = Vec::new();
        let write = {
            let mut state = self.table.lock();
            if state.closed {
                return true;
            }
            let mut key = DenialKey {
                client: match e.who {
                    Identity::Unix(u) => Client::Uid(u.uid),
                    Identity::Cert { subject } => Client::Cert(subject.clone()),
                    Identity::Unknown => Client::Unknown,
                },
                op: e.op,
                decision: e.decision.to_owned(),
                outcome: e.outcome.to_owned(),
            };
            if !state.windows.contains_key(&key) && state.windows.len() >= MAX_WINDOWS {
                self.table.expire(&mut state, now, &mut summaries);
                if state.windows.len() >= MAX_WINDOWS {
                    key.client = Client::Other;
                }
            }
            let window = self.table.window;
            let who = || match &key.client {
                Client::Other => Identity::Unknown,
                _ => without_pid(e.who),
            };
            let open = state.windows.entry(key.clone()).or_insert_with(|| Window { start: now, count: 0, who: who() });
            if now.duration_since(open.start) >= window {
                let ended = std::mem::replace(open, Window { start: now, count: 0, who: who() });
                summaries.extend(ended.summary(key));
            }
            open.count += 1;
            let write = open.count <= DENIALS_IN_FULL;
            if !state.sweeping {
                state.sweeping = self.spawn_sweeper();
            }
            write
        };
        for summary in &summaries {
            self.sink.write(&summary.entry());
        }
        write
    }

    /// Starts the thread that writes each window's summary at its end; false if it cannot
    /// start (then summaries are written when the next refusal of their kind arrives, or at
    /// close).
    fn spawn_sweeper(&self) -> bool {
        let (table, sink) = (self.table.clone(), self.sink.clone());
        let spawned = std::thread::Builder::new().name("audit-repeats".into()).spawn(move || table.sweep(&sink));
        if let Err(e) = &spawned {
            tracing::warn!(error = %e, "cannot start the audit summary thread; summaries of repeated refusals may be late");
        }
        spawned.is_ok()
    }
}

impl Drop for Denials {
    fn drop(&mut self) {
        let summaries: Vec<Summary> = {
            let mut state = self.table.lock();
            state.closed = true;
            state.windows.drain().filter_map(|(key, w)| w.summary(key)).collect()
        };
        self.table.wake.notify_all();
        for summary in &summaries {
            self.sink.write(&summary.entry());
        }
    }
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, TableState> {
        // Counts only: a panic while holding the lock leaves nothing to repair.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes the windows that ended, collecting the summaries of those that counted more
    /// than they wrote.
    fn expire(&self, state: &mut TableState, now: Instant, into: &mut Vec<Summary>) {
        let ended: Vec<DenialKey> = state
            .windows
            .iter()
            .filter(|(_, w)| now.duration_since(w.start) >= self.window)
            .map(|(k, _)| k.clone())
            .collect();
        for key in ended {
            if let Some(w) = state.windows.remove(&key) {
                into.extend(w.summary(key));
            }
        }
    }

    /// The summary thread: at each window's end, writes its summary; stops when no window is
    /// left, or at close.
    fn sweep(&self, sink: &Sink) {
        let mut state = self.lock();
        loop {
            if state.closed {
                return;
            }
            let now = Instant::now();
            let mut summaries = Vec::new();
            self.expire(&mut state, now, &mut summaries);
            if !summaries.is_empty() {
                drop(state);
                for summary in &summaries {
                    sink.write(&summary.entry());
                }
                state = self.lock();
                continue;
            }
            let Some(next) = state.windows.values().map(|w| w.start + self.window).min() else {
                state.sweeping = false;
                return;
            };
            state = self
                .wake
                .wait_timeout(state, next.saturating_duration_since(now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Window {
    /// The summary of the refusals this window counted but did not write, if any.
    fn summary(self, key: DenialKey) -> Option<Summary> {
        (self.count > DENIALS_IN_FULL).then(|| Summary { who: self.who, key, repeated: self.count - DENIALS_IN_FULL })
    }
}

/// The identity for a summary: a window spans processes, so no pid.
fn without_pid(who: &Identity) -> Identity {
    match who {
        Identity::Unix(u) => Identity::Unix(super::UnixIdentity { pid: None, ..u.clone() }),
        other => other.clone(),
    }
}

/// Opens `path` for appending, creating it mode 0600.
fn open_append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// The audit file as the writer thread sees it: reopened at its path when asked.
#[derive(Debug)]
struct ReopeningFile {
    path: PathBuf,
    file: File,
    reopen: Arc<AtomicBool>,
}

impl Write for ReopeningFile {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.reopen.swap(false, Ordering::AcqRel) {
            match open_append(&self.path) {
                Ok(file) => {
                    self.file = file;
                    tracing::info!(path = %self.path.display(), "audit log file reopened");
                }
                // Keep writing to the old file rather than lose records.
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "cannot reopen the audit log file; still writing to the old one")
                }
            }
        }
        self.file.write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The audit file is a pipe whose reader starts late and reads slowly, and four threads
    /// record a burst meanwhile: every decision still arrives, one JSON line each. (The file
    /// writer used to drop lines once 4,096 were pending.)
    #[test]
    fn a_slow_audit_destination_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
        let reader_path = path.clone();
        let reader = std::thread::spawn(move || {
            let mut pipe = std::fs::File::open(reader_path).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
            let mut text = String::new();
            let mut chunk = [0u8; 4096];
            loop {
                match pipe.read(&mut chunk).unwrap() {
                    0 => break,
                    n => text.push_str(std::str::from_utf8(&chunk[..n]).unwrap()),
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            text
        });
        let log = AuditLog::with_file(&path).unwrap();
        let writers: Vec<_> = (0..4u32)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    let who = Identity::Cert { subject: format!("CN=client-{t}") };
                    for i in 0..5_000 {
                        log.record(&who, Operation::Sign, Some(&format!("key-{i}")), "allow", Some("r"), "ok");
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        drop(log);
        let text = reader.join().unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 20_000);
        assert!(lines.iter().all(|l| l["op"] == "sign" && l["decision"] == "allow"));
    }

    fn unix(uid: u32, pid: i32) -> Identity {
        Identity::Unix(super::super::UnixIdentity {
            uid,
            gid: uid,
            pid: Some(pid),
            user: None,
            groups: vec![],
            groups_source: crate::auth::GroupsSource::Nss,
        })
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// A flood of refusals: per client, operation and reason the first five are written, the
    /// rest summed up in one record at the end of the window (with no further record needed to
    /// trigger it); grants are all written; the next window starts afresh.
    #[test]
    fn repeated_refusals_are_written_five_times_then_summed_up_at_the_window_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::with_file_and_window(&path, Duration::from_secs(2)).unwrap();
        for i in 0..1000 {
            log.record(&unix(1000, i), Operation::Sign, Some(&format!("k{i}")), "deny", None, "denied");
        }
        for _ in 0..3 {
            log.record(&unix(1001, 1), Operation::Sign, Some("k"), "deny", None, "denied");
        }
        for _ in 0..7 {
            log.record(&unix(1000, 1), Operation::Delete, Some("k"), "deny", None, "denied");
        }
        for _ in 0..9 {
            log.record(&unix(1000, 1), Operation::Sign, None, "none", None, "InvalidArgument");
        }
        for _ in 0..20 {
            log.record(&unix(1000, 1), Operation::Sign, Some("mine"), "allow", Some("r"), "ok");
        }
        let expected = 6 + 3 + 6 + 6 + 20;
        let deadline = Instant::now() + Duration::from_secs(10);
        while lines(&path).len() < expected {
            assert!(Instant::now() < deadline, "{:#?}", lines(&path));
            std::thread::sleep(Duration::from_millis(20));
        }
        let entries = lines(&path);
        assert_eq!(entries.len(), expected, "{entries:#?}");
        let summary = |uid: u32, op: &str, outcome: &str| -> Vec<&serde_json::Value> {
            entries
                .iter()
                .filter(|e| e["uid"] == uid && e["op"] == op && e["outcome"] == outcome && e.get("repeated").is_some())
                .collect()
        };
        let repeated =
            |uid, op, outcome| summary(uid, op, outcome).iter().map(|e| e["repeated"].clone()).collect::<Vec<_>>();
        assert_eq!(repeated(1000, "sign", "denied"), vec![serde_json::json!(995)]);
        assert_eq!(repeated(1000, "delete", "denied"), vec![serde_json::json!(2)]);
        assert_eq!(repeated(1000, "sign", "InvalidArgument"), vec![serde_json::json!(4)]);
        assert!(repeated(1001, "sign", "denied").is_empty());
        let s = summary(1000, "sign", "denied")[0];
        assert_eq!(
            (s["key"].clone(), s["pid"].clone(), s["decision"].clone()),
            (serde_json::Value::Null, serde_json::Value::Null, serde_json::json!("deny"))
        );
        let written = |uid: u32, op: &str| {
            entries.iter().filter(|e| e["uid"] == uid && e["op"] == op && e.get("repeated").is_none()).count()
        };
        assert_eq!((written(1000, "sign"), written(1001, "sign"), written(1000, "delete")), (5 + 5 + 20, 3, 5));
        // A new window: written again.
        log.record(&unix(1000, 2), Operation::Sign, Some("k"), "deny", None, "denied");
        drop(log);
        assert_eq!(lines(&path).len(), expected + 1);
    }

    /// Closing the log writes the summaries of the windows still open.
    #[test]
    fn closing_writes_the_open_windows_summaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::with_file(&path).unwrap();
        for i in 0..8 {
            log.record(
                &Identity::Cert { subject: "CN=x".into() },
                Operation::Unseal,
                Some(&format!("s{i}")),
                "deny",
                None,
                "denied",
            );
        }
        drop(log);
        let entries = lines(&path);
        assert_eq!(entries.len(), 6, "{entries:#?}");
        assert_eq!(
            (entries[5]["subject"].clone(), entries[5]["repeated"].clone()),
            (serde_json::json!("CN=x"), serde_json::json!(3))
        );
    }

    /// logrotate's way: rename the file, signal, delete the renamed file. Every record written
    /// after the reopen is in the new file; nothing is lost with the renamed one.
    #[test]
    fn rename_then_reopen_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let rotated = dir.path().join("audit.log.1");
        let log = AuditLog::with_file(&path).unwrap();
        let who = Identity::Cert { subject: "CN=c".into() };
        let record = |n: u32| log.record(&who, Operation::Sign, Some(&format!("k{n}")), "allow", Some("r"), "ok");
        let lines_in = |p: &Path| std::fs::read_to_string(p).unwrap_or_default().lines().count();
        for n in 0..10 {
            record(n);
        }
        // Wait for the batch to reach the file before rotating.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while lines_in(&path) < 10 {
            assert!(std::time::Instant::now() < deadline, "first batch never written");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::rename(&path, &rotated).unwrap();
        log.reopen();
        for n in 10..25 {
            record(n);
        }
        drop(log);
        assert_eq!(lines_in(&rotated), 10);
        assert_eq!(lines_in(&path), 15, "records after the reopen are in the new file");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
