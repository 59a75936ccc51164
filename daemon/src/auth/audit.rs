//! The audit trail: one structured event per access decision on the `audit` tracing target
//! (time, client, where a local client's groups came from, operation, key, decision, rule,
//! outcome), and optionally the same as JSON
//! lines appended to a file in batches by a background thread ([`BatchedWriter`]: never
//! dropped; under a slow disk, requests wait). Never contains secrets.
//!
//! Rotation: after [`AuditLog::reopen`] (the daemon calls it on SIGHUP) the next batch goes to a
//! file opened anew at the configured path, so logrotate's rename + `postrotate` signal (the
//! shipped `systemd/logrotate.d/tpm-vault`) loses no record: lines written before the signal are
//! in the renamed file, the rest in the new one.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Identity, Operation};
use crate::logwriter::{BatchedWriter, FlushGuard};

/// Where audit events go besides the `audit` tracing target.
#[derive(Debug, Clone, Default)]
pub struct AuditLog {
    /// The file's writer, and the guard that flushes it when the last clone is dropped.
    file: Option<(BatchedWriter, Arc<FlushGuard>)>,
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
        let reopen = Arc::new(AtomicBool::new(false));
        let file = ReopeningFile { path: path.to_owned(), file: open_append(path)?, reopen: reopen.clone() };
        let report: fn(&std::io::Error) = |e| tracing::error!(error = %e, "cannot write the audit log file");
        let (writer, guard) = BatchedWriter::start("audit", file, Some(report))?;
        Ok(Self { file: Some((writer, Arc::new(guard))), reopen })
    }

    /// Makes the next batch go to a file opened anew at the configured path (after logrotate
    /// renamed the old one). A no-op without a file.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }

    /// Records one decision.
    pub fn record(
        &self,
        who: &Identity,
        op: Operation,
        key: Option<&str>,
        decision: &str,
        rule: Option<&str>,
        outcome: &str,
    ) {
        let (uid, user, pid, subject, groups) = match who {
            Identity::Unix(u) => (Some(u.uid), u.user.clone(), u.pid, None, Some(u.groups_source.as_str())),
            Identity::Cert { subject } => (None, None, None, Some(subject.clone()), None),
            Identity::Unknown => (None, None, None, None, None),
        };
        tracing::info!(
            target: "audit",
            uid,
            user = user.as_deref(),
            pid,
            subject = subject.as_deref(),
            groups,
            op = op.as_str(),
            key,
            decision,
            rule,
            outcome,
            "access"
        );
        if let Some((writer, _)) = &self.file {
            let time =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let line = serde_json::json!({
                "time": time, "uid": uid, "user": user, "pid": pid, "subject": subject, "groups": groups,
                "op": op.as_str(), "key": key, "decision": decision, "rule": rule, "outcome": outcome,
            });
            writer.append(format!("{line}\n").as_bytes());
        }
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
