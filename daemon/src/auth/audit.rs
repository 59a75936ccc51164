//! The audit trail: one structured event per access decision on the `audit` tracing target
//! (time, client, operation, key, decision, rule, outcome), and optionally the same as JSON
//! lines appended to a file by a background task. Never contains secrets.

use std::io::Write;
use std::path::Path;

use tokio::sync::mpsc;

use super::{Identity, Operation};

/// Where audit events go besides the `audit` tracing target.
#[derive(Debug, Clone, Default)]
pub struct AuditLog {
    file: Option<mpsc::Sender<String>>,
}

impl AuditLog {
    /// Tracing only.
    pub fn tracing_only() -> Self {
        Self { file: None }
    }

    /// Tracing plus JSON lines appended to `path` (created mode 0600 if missing). Must be
    /// called inside a tokio runtime.
    ///
    /// # Errors
    /// The open error.
    pub fn with_file(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
        let (tx, mut rx) = mpsc::channel::<String>(4096);
        std::thread::Builder::new().name("audit".into()).spawn(move || {
            while let Some(line) = rx.blocking_recv() {
                if file.write_all(line.as_bytes()).and_then(|()| file.flush()).is_err() {
                    tracing::error!("cannot write the audit log file");
                }
            }
        })?;
        Ok(Self { file: Some(tx) })
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
        if let Some(tx) = &self.file {
            let time =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let line = serde_json::json!({
                "time": time, "uid": uid, "user": user, "pid": pid, "subject": subject,
                "op": op.as_str(), "key": key, "decision": decision, "rule": rule, "outcome": outcome,
            });
            let _ = tx.try_send(format!("{line}\n"));
        }
    }
}
