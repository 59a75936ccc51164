//! The audit trail: one structured event per access decision on the `audit` tracing target
//! (time, client, operation, key, decision, rule, outcome), and optionally the same as JSON
//! lines appended to a file in batches by a background thread ([`BatchedWriter`]: never
//! dropped; under a slow disk, requests wait). Never contains secrets.

use std::path::Path;
use std::sync::Arc;

use super::{Identity, Operation};
use crate::logwriter::{BatchedWriter, FlushGuard};

/// Where audit events go besides the `audit` tracing target.
#[derive(Debug, Clone, Default)]
pub struct AuditLog {
    /// The file's writer, and the guard that flushes it when the last clone is dropped.
    file: Option<(BatchedWriter, Arc<FlushGuard>)>,
}

impl AuditLog {
    /// Tracing only.
    pub fn tracing_only() -> Self {
        Self { file: None }
    }

    /// Tracing plus JSON lines appended to `path` (created mode 0600 if missing).
    ///
    /// # Errors
    /// The open error, or the writer thread's spawn error.
    pub fn with_file(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
        let report: fn(&std::io::Error) = |e| tracing::error!(error = %e, "cannot write the audit log file");
        let (writer, guard) = BatchedWriter::start("audit", file, Some(report))?;
        Ok(Self { file: Some((writer, Arc::new(guard))) })
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
        let (uid, user, pid, subject) = match who {
            Identity::Unix(u) => (Some(u.uid), u.user.clone(), u.pid, None),
            Identity::Cert { subject } => (None, None, None, Some(subject.clone())),
            Identity::Unknown => (None, None, None, None),
        };
        tracing::info!(
            target: "audit",
            uid,
            user = user.as_deref(),
            pid,
            subject = subject.as_deref(),
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
                "time": time, "uid": uid, "user": user, "pid": pid, "subject": subject,
                "op": op.as_str(), "key": key, "decision": decision, "rule": rule, "outcome": outcome,
            });
            writer.append(format!("{line}\n").as_bytes());
        }
    }
}
