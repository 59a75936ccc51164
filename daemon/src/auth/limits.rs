//! Per-client fairness: a client may have at most N requests that use the TPM in flight; more
//! wait their turn outside the TPM queue. So one greedy client fills at most N slots of the
//! (serial, slow) TPM queue, and everybody else's requests wait behind at most N of its jobs
//! instead of all of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Identity;
use crate::error::Error;
use crate::tpm::TpmError;

/// Default in-flight TPM requests per client.
pub const DEFAULT_PER_CLIENT: usize = 16;

/// Per-client concurrency limits.
#[derive(Debug)]
pub struct ClientLimits {
    per_client: usize,
    wait: Duration,
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self::new(DEFAULT_PER_CLIENT, Duration::from_secs(30))
    }
}

impl ClientLimits {
    /// At most `per_client` TPM requests in flight per client; a request waits at most `wait`
    /// for a slot.
    pub fn new(per_client: usize, wait: Duration) -> Self {
        Self { per_client: per_client.max(1), wait, slots: Mutex::new(HashMap::new()) }
    }

    /// Takes a slot for `who`, waiting for one if the client is at its limit.
    ///
    /// # Errors
    /// [`Error::Tpm`] (`QueueFull`, i.e. RESOURCE_EXHAUSTED) after waiting too long.
    pub async fn acquire(&self, who: &Identity) -> Result<OwnedSemaphorePermit, Error> {
        let key = match who {
            Identity::Unix(u) => format!("uid:{}", u.uid),
            Identity::Cert { subject } => format!("cert:{subject}"),
            Identity::Unknown => "unknown".to_owned(),
        };
        let sem = {
            let mut slots = self.slots.lock().map_err(|_| Error::Internal("limits lock".into()))?;
            slots.entry(key).or_insert_with(|| Arc::new(Semaphore::new(self.per_client))).clone()
        };
        match tokio::time::timeout(self.wait, sem.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(Error::Internal("limits semaphore closed".into())),
            Err(_) => Err(Error::Tpm(TpmError::QueueFull(self.per_client))),
        }
    }

    /// The per-client limit.
    pub fn per_client(&self) -> usize {
        self.per_client
    }
}
