//! Per-client fairness: a client may have at most N requests that use the TPM in flight; more
//! wait their turn outside the TPM queue. So one greedy client fills at most N slots of the
//! (serial, slow) TPM queue, and everybody else's requests wait behind at most N of its jobs
//! instead of all of them.
//!
//! Each client also gets its own [`ClientKey`], under which the TPM queue serves its jobs in
//! turn with every other client's ([`crate::tpm::queue`]): with both, another client's job
//! waits behind about one job of each busy client, not 16.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Identity;
use crate::error::Error;
use crate::tpm::{ClientKey, TpmError};

/// Default in-flight TPM requests per client.
pub const DEFAULT_PER_CLIENT: usize = 16;

/// Per-client concurrency limits.
#[derive(Debug)]
pub struct ClientLimits {
    per_client: usize,
    wait: Duration,
    /// Each client's slots and queue key (entries are never removed, so the map's length
    /// numbers the next client).
    slots: Mutex<HashMap<String, (Arc<Semaphore>, ClientKey)>>,
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

    /// Takes a slot for `who`, waiting for one if the client is at its limit; with it, the
    /// client's key in the TPM queue.
    ///
    /// # Errors
    /// [`Error::Tpm`] (`QueueFull`, i.e. RESOURCE_EXHAUSTED) after waiting too long.
    pub async fn acquire(&self, who: &Identity) -> Result<(OwnedSemaphorePermit, ClientKey), Error> {
        let key = match who {
            Identity::Unix(u) => format!("uid:{}", u.uid),
            Identity::Cert { subject } => format!("cert:{subject}"),
            Identity::Unknown => "unknown".to_owned(),
        };
        let (sem, queue_key) = {
            let mut slots = self.slots.lock().map_err(|_| Error::Internal("limits lock".into()))?;
            let next = ClientKey::new(slots.len() as u64);
            slots.entry(key).or_insert_with(|| (Arc::new(Semaphore::new(self.per_client)), next)).clone()
        };
        match tokio::time::timeout(self.wait, sem.acquire_owned()).await {
            Ok(Ok(permit)) => Ok((permit, queue_key)),
            Ok(Err(_)) => Err(Error::Internal("limits semaphore closed".into())),
            Err(_) => Err(Error::Tpm(TpmError::QueueFull(self.per_client))),
        }
    }

    /// The per-client limit.
    pub fn per_client(&self) -> usize {
        self.per_client
    }
}
