//! Per-client fairness: a client may have at most N requests that use the TPM in flight; more
//! wait their turn outside the TPM queue. So one greedy client fills at most N slots of the
//! (serial, slow) TPM queue, and everybody else's requests wait behind at most N of its jobs
//! instead of all of them.
//!
//! Each client also gets its own [`ClientKey`], under which the TPM queue serves its jobs in
//! turn with every other client's ([`crate::tpm::queue`]): with both, another client's job
//! waits behind about one job of each busy client, not 16.
//!
//! Memory (issue #31, item 6): requests that need no TPM (public keys, random bytes, status)
//! are counted too, against a second per-client limit of calls in flight
//! ([`ClientLimits::acquire_call`]); and every unary response is counted against the client's
//! budget of **response bytes in flight** from before its largest buffer is allocated until
//! the transport sent it ([`reserve`], [`InFlight`]). A client that asks for answers and never
//! reads them holds at most its budget (or one response larger than it) in the daemon, not one
//! buffered response per HTTP/2 stream.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Identity;
use crate::error::Error;
use crate::tpm::{ClientKey, TpmError};

/// Default in-flight TPM requests per client.
pub const DEFAULT_PER_CLIENT: usize = 16;

/// Default in-flight requests per client that need no TPM (public keys, random bytes, status).
pub const DEFAULT_CALLS_PER_CLIENT: usize = 32;

/// Default response bytes in flight per client: reserved before a response's buffer is
/// allocated, given back once the transport sent it.
pub const DEFAULT_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// One client's semaphores.
#[derive(Debug, Clone)]
struct PerClient {
    /// TPM requests in flight.
    tpm: Arc<Semaphore>,
    /// Requests in flight that need no TPM.
    calls: Arc<Semaphore>,
    /// Response bytes in flight.
    bytes: Arc<Semaphore>,
    /// The client's key in the TPM queue.
    queue_key: ClientKey,
}

/// Per-client concurrency limits.
#[derive(Debug)]
pub struct ClientLimits {
    per_client: usize,
    calls_per_client: usize,
    response_bytes: usize,
    wait: Duration,
    /// Each client's semaphores and queue key (entries are never removed, so the map's length
    /// numbers the next client).
    slots: Mutex<HashMap<String, PerClient>>,
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
        Self {
            per_client: per_client.max(1),
            calls_per_client: DEFAULT_CALLS_PER_CLIENT,
            response_bytes: DEFAULT_RESPONSE_BYTES,
            wait,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// These limits with at most `calls` requests that need no TPM in flight per client.
    pub fn with_calls_per_client(mut self, calls: usize) -> Self {
        self.calls_per_client = calls.max(1);
        self
    }

    /// These limits with a budget of `bytes` response bytes in flight per client (at least
    /// 64 KiB; at most 1 GiB).
    pub fn with_response_bytes(mut self, bytes: usize) -> Self {
        self.response_bytes = bytes.clamp(64 * 1024, 1 << 30);
        self
    }

    /// The per-client budget of response bytes in flight.
    pub fn response_bytes(&self) -> usize {
        self.response_bytes
    }

    /// `who`'s semaphores, made on first use.
    fn client(&self, who: &Identity) -> Result<PerClient, Error> {
        let key = match who {
            Identity::Unix(u) => format!("uid:{}", u.uid),
            Identity::Cert { subject } => format!("cert:{subject}"),
            Identity::Unknown => "unknown".to_owned(),
        };
        let mut slots = self.slots.lock().map_err(|_| Error::Internal("limits lock".into()))?;
        let next = ClientKey::new(slots.len() as u64);
        Ok(slots
            .entry(key)
            .or_insert_with(|| PerClient {
                tpm: Arc::new(Semaphore::new(self.per_client)),
                calls: Arc::new(Semaphore::new(self.calls_per_client)),
                bytes: Arc::new(Semaphore::new(self.response_bytes)),
                queue_key: next,
            })
            .clone())
    }

    /// Takes one of `who`'s slots for a request that needs no TPM, waiting for one if the
    /// client is at its limit.
    ///
    /// # Errors
    /// [`Error::ClientBusy`] (RESOURCE_EXHAUSTED) after waiting too long.
    pub async fn acquire_call(&self, who: &Identity) -> Result<OwnedSemaphorePermit, Error> {
        let sem = self.client(who)?.calls;
        match tokio::time::timeout(self.wait, sem.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(Error::Internal("limits semaphore closed".into())),
            Err(_) => Err(Error::ClientBusy(format!(
                "too many requests in flight from this client (at most {} at once); retry later",
                self.calls_per_client
            ))),
        }
    }

    /// `who`'s budget of response bytes in flight, for [`set_budget`].
    ///
    /// # Errors
    /// [`Error::Internal`] if the limits' lock is poisoned.
    pub fn budget(&self, who: &Identity) -> Result<Budget, Error> {
        Ok(Budget { bytes: self.client(who)?.bytes, total: self.response_bytes, wait: self.wait })
    }

    /// Takes a slot for `who`, waiting for one if the client is at its limit; with it, the
    /// client's key in the TPM queue.
    ///
    /// # Errors
    /// [`Error::Tpm`] (`QueueFull`, i.e. RESOURCE_EXHAUSTED) after waiting too long.
    pub async fn acquire(&self, who: &Identity) -> Result<(OwnedSemaphorePermit, ClientKey), Error> {
        let PerClient { tpm: sem, queue_key, .. } = self.client(who)?;
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

/// A client's budget of response bytes in flight ([`ClientLimits::budget`]).
#[derive(Debug, Clone)]
pub struct Budget {
    bytes: Arc<Semaphore>,
    /// The budget's size: a call never holds more (a response larger than the budget waits
    /// until the client has nothing else in flight).
    total: usize,
    /// How long a reservation waits for room.
    wait: Duration,
}

/// The response bytes a call reserved: given back when dropped. The call's response carries
/// it ([`InFlight`]) until the transport sent the response.
#[derive(Debug, Default)]
pub struct Reservation {
    budget: Option<Budget>,
    permit: Option<OwnedSemaphorePermit>,
    held: usize,
}

impl Reservation {
    /// Bytes reserved.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Keeps at most `bytes` reserved (a reservation made for the largest possible response,
    /// once the real one is known).
    fn shrink_to(&mut self, bytes: usize) {
        if let Some(permit) = self.permit.as_mut() {
            if self.held > bytes {
                drop(permit.split(self.held - bytes));
                self.held = bytes;
            }
        }
    }
}

tokio::task_local! {
    /// The current call's reservation.
    static RESERVED: RefCell<Reservation>;
}

/// Runs `fut` (a call's handler) with a reservation of response bytes, empty until
/// [`set_budget`] names the client's budget and [`reserve`] reserves; returns the output and
/// the reservation.
pub async fn response_scope<F: Future>(fut: F) -> (F::Output, Reservation) {
    RESERVED
        .scope(RefCell::new(Reservation::default()), async {
            let out = fut.await;
            let reservation = RESERVED.with(|r| std::mem::take(&mut *r.borrow_mut()));
            (out, reservation)
        })
        .await
}

/// Names the budget the current call's reservations come from (once the client is known).
/// Outside a [`response_scope`] it does nothing.
pub fn set_budget(budget: Budget) {
    let _ = RESERVED.try_with(|r| {
        let mut r = r.borrow_mut();
        if r.budget.is_none() {
            r.budget = Some(budget);
        }
    });
}

/// Reserves room for `bytes` more bytes of the current call's response, waiting for the client's
/// earlier responses to be sent if its budget is spent. A call holds at most the whole budget,
/// so one response larger than the budget still goes through (alone). Outside a
/// [`response_scope`], or before [`set_budget`], it reserves nothing.
///
/// # Errors
/// [`Error::ClientBusy`] (RESOURCE_EXHAUSTED) when no room came free in time: the client's
/// earlier responses are not being read.
pub async fn reserve(bytes: usize) -> Result<(), Error> {
    let Ok(Some((budget, held))) = RESERVED.try_with(|r| {
        let r = r.borrow();
        r.budget.clone().map(|b| (b, r.held))
    }) else {
        return Ok(());
    };
    let want = bytes.min(budget.total.saturating_sub(held));
    if want == 0 {
        return Ok(());
    }
    // invariant: the budget is at most 1 GiB (`with_response_bytes`), so `want` fits a u32.
    let n = u32::try_from(want).unwrap_or(u32::MAX);
    let permit = match tokio::time::timeout(budget.wait, budget.bytes.clone().acquire_many_owned(n)).await {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) => return Err(Error::Internal("response budget semaphore closed".into())),
        Err(_) => {
            return Err(Error::ClientBusy(format!(
                "this client has {} bytes of responses it has not read yet; read them, then retry",
                budget.total
            )))
        }
    };
    let _ = RESERVED.try_with(|r| {
        let mut r = r.borrow_mut();
        r.held += want;
        match r.permit.as_mut() {
            Some(p) => p.merge(permit),
            None => r.permit = Some(permit),
        }
    });
    Ok(())
}

/// Makes the current call's reservation exactly `bytes` (the encoded response): reserves what
/// is missing, gives back what a reservation for a larger possible response held beyond it.
///
/// # Errors
/// As [`reserve`].
pub async fn reserve_exactly(bytes: usize) -> Result<(), Error> {
    let held = RESERVED.try_with(|r| r.borrow().held).unwrap_or(0);
    if bytes > held {
        reserve(bytes - held).await
    } else {
        let _ = RESERVED.try_with(|r| r.borrow_mut().shrink_to(bytes));
        Ok(())
    }
}

/// A response's reserved bytes, carried in its extensions (they must be `Clone`) from the
/// handler to the server's body wrapper, which holds them until the body was sent
/// (`server::Draining`).
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<Mutex<Option<Reservation>>>);

impl InFlight {
    /// Carries `reservation`.
    pub fn new(reservation: Reservation) -> Self {
        Self(Arc::new(Mutex::new(Some(reservation))))
    }

    /// The reservation, once.
    pub fn take(&self) -> Option<Reservation> {
        self.0.lock().ok().and_then(|mut r| r.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(total: usize) -> Budget {
        Budget { bytes: Arc::new(Semaphore::new(total)), total, wait: Duration::from_millis(50) }
    }

    /// Reservations come from the budget and go back when dropped; a response larger than the
    /// budget is let through alone; a budget spent by unsent responses refuses, then recovers.
    #[tokio::test]
    async fn reservations_are_bounded_and_given_back() {
        let b = budget(1000);
        let (r1, first) = response_scope(async {
            set_budget(b.clone());
            reserve(600).await
        })
        .await;
        assert!(r1.is_ok());
        assert_eq!(first.held(), 600);
        let (r2, _) = response_scope(async {
            set_budget(b.clone());
            reserve(600).await
        })
        .await;
        assert!(matches!(r2, Err(Error::ClientBusy(_))), "{r2:?}");
        drop(first);
        let (r3, big) = response_scope(async {
            set_budget(b.clone());
            reserve(5000).await?;
            reserve_exactly(300).await
        })
        .await;
        assert!(r3.is_ok());
        assert_eq!(big.held(), 300, "shrunk to the real response");
        assert_eq!(b.bytes.available_permits(), 700);
        drop(big);
        assert_eq!(b.bytes.available_permits(), 1000);
        // Outside a scope, or with no budget named: nothing is reserved.
        assert!(reserve(10).await.is_ok());
    }
}
