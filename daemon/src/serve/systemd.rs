//! The daemon's side of the systemd service protocol: `sd_notify` state messages (`READY=1`,
//! `STOPPING=1`, `STATUS=`) and the watchdog keep-alive.
//!
//! Everything here is a no-op outside systemd (no `NOTIFY_SOCKET` / `WATCHDOG_USEC`), so tests
//! and foreground runs need no special casing. The watchdog sends `WATCHDOG=1` only after the TPM
//! actor has run a no-op job: a daemon whose actor is stuck inside a TPM command (hung
//! firmware, a wedged bus) stops sending keep-alives and systemd restarts it. A TPM that is
//! merely unreachable does not stop the keep-alives: the actor still answers (and reconnects
//! on its own), so the unit does not restart-loop on a missing device.
//!
//! Socket activation (`LISTEN_FDS`) is in [`crate::serve::server::activated_listener`].

use std::time::Duration;

use sd_notify::NotifyState;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::tpm::{TpmError, TpmHandle};

/// Tells systemd the daemon is ready (the socket accepts), with a status line.
pub fn notify_ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells systemd the daemon is shutting down, with a status line.
pub fn notify_stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// Updates the status line `systemctl status` shows.
pub fn notify_status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Starts the watchdog task when systemd asked for one (`WatchdogSec=` sets `WATCHDOG_USEC`).
///
/// Every `WATCHDOG_USEC / 2` the task runs a no-op job on the TPM actor (label `ping`) with a
/// deadline of the same length and, only if it completed, sends `WATCHDOG=1`. Returns `None`
/// when no watchdog is configured. Abort the returned task at shutdown.
pub fn spawn_watchdog(tpm: TpmHandle) -> Option<JoinHandle<()>> {
    let period = sd_notify::watchdog_enabled()?;
    let half = (period / 2).max(Duration::from_millis(10));
    tracing::info!(
        watchdog_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
        "systemd watchdog enabled: keep-alives follow the TPM actor"
    );
    Some(tokio::spawn(async move {
        let mut stalled = false;
        loop {
            let cycle_start = Instant::now();
            let deadline = cycle_start + half;
            match ping(&tpm, deadline, half).await {
                Ok(()) => {
                    if stalled {
                        tracing::info!("TPM actor answers again; watchdog keep-alives resume");
                        stalled = false;
                    }
                    send(&[NotifyState::Watchdog]);
                }
                Err(e) => {
                    if !stalled {
                        tracing::warn!(
                            error = %e,
                            "TPM actor did not answer the watchdog ping; withholding WATCHDOG=1"
                        );
                    }
                    stalled = true;
                }
            }
            tokio::time::sleep_until(deadline).await;
        }
    }))
}

/// Runs a no-op job on the actor before `deadline`; a full queue is retried (a busy actor is
/// still alive), anything else fails the ping.
async fn ping(tpm: &TpmHandle, deadline: Instant, budget: Duration) -> Result<(), TpmError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(TpmError::Timeout(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX)));
        }
        match tpm.call_with_timeout(crate::tpm::ClientKey::DAEMON, "ping", left, |_| Ok(())).await {
            Err(TpmError::QueueFull(_)) => {
                tokio::time::sleep(Duration::from_millis(100).min(left)).await;
            }
            other => return other,
        }
    }
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}
