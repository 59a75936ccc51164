//! The daemon's error type: every layer's error folds into [`Error`]; `rpc/error_status.rs` is the
//! only place that turns it into a gRPC status.

use crate::auth::denied::Denied;
use crate::model::KeyName;
use crate::store::error::StoreError;
use crate::tpm::TpmError;

/// Anything that can go wrong serving a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: bad name, wrong digest length, unsupported scheme, oversize
    /// input. The message names the field and the rule.
    #[error("{0}")]
    InvalidArgument(String),
    /// No key with this name.
    #[error("key {0:?} not found")]
    KeyNotFound(String),
    /// The key exists but carries no certificate chain (GetCertificate, the TLS listener).
    #[error("key {0:?} has no certificate")]
    NoCertificate(String),
    /// A record with this name already exists (a signing key, sealed secret or data key: the
    /// store's [`StoreError::Exists`] becomes this).
    #[error("key {:?} already exists", .0.as_str())]
    KeyExists(KeyName),
    /// The access policy denies the operation (also when a write's re-check under the store's
    /// lock refuses it: [`StoreError::Refused`] becomes this).
    #[error("{0}")]
    PermissionDenied(Box<Denied>),
    /// The device has no measured-boot event log (none configured, or no file at its path).
    #[error("{0}")]
    NoEventLog(String),
    /// The event log exists but cannot be read (permissions, I/O, too large).
    #[error("{0}")]
    EventLogUnreadable(String),
    /// The key's PCR policy is not satisfied (PCR values differ from the bound ones).
    #[error("{0}")]
    PcrMismatch(String),
    /// Too many wrong passwords for a key: the dictionary-attack guard refuses further attempts
    /// without trying them on the TPM until `wait` has passed (see [`crate::vault::lockout`]).
    #[error(
        "too many wrong passwords for key {key} (dictionary-attack guard): further attempts are refused for {}",
        wait_text(*.wait)
    )]
    Throttled {
        /// The key.
        key: String,
        /// How long until the next attempt is let through.
        wait: std::time::Duration,
    },
    /// The client is at one of its own bounds (calls in flight, response bytes not yet sent,
    /// key generations): the message names which; retry later.
    #[error("{0}")]
    ClientBusy(String),
    /// The TPM failed or is unreachable.
    #[error(transparent)]
    Tpm(#[from] TpmError),
    /// The state directory failed.
    #[error(transparent)]
    Store(StoreError),
    /// A bug or an impossible state; details are logged, not returned.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<Denied> for Error {
    fn from(d: Denied) -> Self {
        Self::PermissionDenied(Box::new(d))
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Exists(name) => Self::KeyExists(name),
            StoreError::Refused { name } => Self::from(Denied::ChangedUnderWriteLock(name)),
            other => Self::Store(other),
        }
    }
}

impl Error {
    /// `KeyNotFound` for a name.
    pub fn not_found(name: &KeyName) -> Self {
        Self::KeyNotFound(name.to_string())
    }
}

/// A wait as a person reads it, rounded up: tenths of a second under 10 s, whole seconds above.
fn wait_text(wait: std::time::Duration) -> String {
    let ms = wait.as_millis();
    if ms < 10_000 {
        let tenths = ms.div_ceil(100).max(1);
        format!("{}.{} s", tenths / 10, tenths % 10)
    } else {
        format!("{} s", ms.div_ceil(1000))
    }
}

impl From<crate::model::InvalidInput> for Error {
    fn from(e: crate::model::InvalidInput) -> Self {
        Self::InvalidArgument(e.0)
    }
}
