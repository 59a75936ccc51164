//! State the TPM actor shares with the rest of the daemon: connection state, last error, TPM
//! facts, queue depth, per-command metrics and the dictionary-attack state last read. Written by
//! the actor, read by status, health and the metrics endpoint.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::observe::metrics::Metrics;

/// Facts about the TPM gathered when connecting.
#[derive(Debug, Clone, Default)]
pub struct TpmInfo {
    /// SRK name.
    pub srk_name: Vec<u8>,
    /// Manufacturer ID as text (e.g. "IBM").
    pub manufacturer: String,
    /// Firmware version, hex.
    pub firmware: String,
    /// Vendor string (TPM_PT_VENDOR_STRING_1..4), e.g. `SW   TPM` for swtpm/libtpms.
    pub vendor: String,
    /// True if the SRK came from the persistent handle 0x81000001.
    pub srk_persistent: bool,
}

/// The TPM's dictionary-attack state, as read with TPM2_GetCapability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaState {
    /// TPM_PT_LOCKOUT_COUNTER: failed authorizations not yet forgiven.
    pub failures: u32,
    /// TPM_PT_MAX_AUTH_FAIL: the TPM locks out when `failures` reaches it.
    pub max_tries: u32,
    /// TPM_PT_LOCKOUT_INTERVAL: seconds per failure forgiven (0: only a reset forgives).
    pub interval_s: u32,
}

/// Connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpmState {
    /// Connected, SRK loaded and checked.
    Ready,
    /// Unreachable; the actor reconnects with backoff.
    Down,
    /// The SRK differs from the recorded one: the TPM was cleared or replaced.
    Mismatch,
}

#[derive(Debug)]
struct Inner {
    state: TpmState,
    last_error: Option<String>,
    info: TpmInfo,
}

/// Shared between the actor and its handles.
#[derive(Debug)]
pub struct Shared {
    inner: Mutex<Inner>,
    /// Jobs queued or running.
    pub queued: AtomicUsize,
    /// Objects the vault holds loaded.
    loaded: AtomicUsize,
    /// Per-TPM-command metrics (`tpm/<label>`).
    pub metrics: Metrics,
    /// TPM errors by class ([`super::TpmError::class_name`]).
    errors: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Successful connections, the first included (see [`Shared::reconnects`]).
    connects: AtomicU64,
    /// The TPM's dictionary-attack state as last read (at connect, before each password
    /// attempt, on a lockout), for the `tpm_vault_tpm_lockout_*` gauges.
    da: Mutex<Option<DaState>>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner { state: TpmState::Down, last_error: None, info: TpmInfo::default() }),
            queued: AtomicUsize::new(0),
            loaded: AtomicUsize::new(0),
            metrics: Metrics::default(),
            errors: Mutex::new(std::collections::BTreeMap::new()),
            connects: AtomicU64::new(0),
            da: Mutex::new(None),
        }
    }
}

impl Shared {
    /// Records a state change (and the error that caused it, or fresh TPM facts).
    pub fn set_state(&self, state: TpmState, error: Option<String>, info: Option<TpmInfo>) {
        if let Ok(mut g) = self.inner.lock() {
            g.state = state;
            if error.is_some() {
                g.last_error = error;
            }
            if let Some(i) = info {
                g.info = i;
            }
        }
    }

    /// Current state.
    pub fn state(&self) -> TpmState {
        self.inner.lock().map(|g| g.state).unwrap_or(TpmState::Down)
    }

    /// Last error seen, if any.
    pub fn last_error(&self) -> Option<String> {
        self.inner.lock().ok().and_then(|g| g.last_error.clone())
    }

    /// TPM facts from the last successful connect.
    pub fn info(&self) -> TpmInfo {
        self.inner.lock().map(|g| g.info.clone()).unwrap_or_default()
    }

    /// Counts one TPM error of `class`.
    pub fn count_error(&self, class: &'static str) {
        if let Ok(mut e) = self.errors.lock() {
            *e.entry(class).or_default() += 1;
        }
    }

    /// TPM errors so far, by class.
    pub fn errors_by_class(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Counts one successful connection to the TPM (SRK checked).
    pub fn count_connect(&self) {
        self.connects.fetch_add(1, Ordering::Relaxed);
    }

    /// Reconnections after the TPM went away or was reset: successful connections after the
    /// first.
    pub fn reconnects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// Records the dictionary-attack state just read.
    pub fn set_da(&self, da: DaState) {
        if let Ok(mut g) = self.da.lock() {
            *g = Some(da);
        }
    }

    /// The dictionary-attack state as last read, if it has been.
    pub fn da(&self) -> Option<DaState> {
        self.da.lock().ok().and_then(|g| *g)
    }

    /// Records the loaded-object count.
    pub fn set_loaded(&self, n: usize) {
        self.loaded.store(n, Ordering::Relaxed);
    }

    /// Objects the vault holds loaded.
    pub fn loaded(&self) -> usize {
        self.loaded.load(Ordering::Relaxed)
    }
}
