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
//!
//! Key generations (issue #31, item 7): an RSA key generation holds the TPM for seconds on a
//! real TPM, so each client has at most one RSA key creation in flight (more wait their turn)
//! and a token bucket of them ([`KeygenLimit`]: `rsa_keygen_per_minute`, `rsa_keygen_burst`);
//! past it, CreateKey is refused with RESOURCE_EXHAUSTED ([`ClientLimits::acquire_keygen`]). With the TPM
//! queue's round robin, another client's signature waits behind at most one key generation.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Identity;
use crate::error::{Busy, Error};
use crate::tpm::{ClientKey, TpmError};

/// Default in-flight TPM requests per client.
pub const DEFAULT_PER_CLIENT: usize = 16;

/// Default in-flight requests per client that need no TPM (public keys, random bytes, status).
pub const DEFAULT_CALLS_PER_CLIENT: usize = 32;

/// Default response bytes in flight per client: reserved before a response's buffer is
/// allocated, given back once the transport sent it.
pub const DEFAULT_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// Default RSA key creations per minute per client (the bucket's refill).
pub const DEFAULT_KEYGEN_PER_MINUTE: u32 = 60;

/// Default RSA key creations a client may make at once before the per-minute rate applies.
pub const DEFAULT_KEYGEN_BURST: u32 = 30;

/// The per-client quota of RSA key creations: a token bucket of `burst` creations, refilled at
/// `per_minute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeygenLimit {
    /// Creations the bucket gains per minute (at least 1).
    pub per_minute: u32,
    /// The bucket's size (at least 1).
    pub burst: u32,
}

impl Default for KeygenLimit {
    fn default() -> Self {
        Self { per_minute: DEFAULT_KEYGEN_PER_MINUTE, burst: DEFAULT_KEYGEN_BURST }
    }
}

/// One client's bucket of key creations.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(limit: KeygenLimit) -> Self {
        Self { tokens: f64::from(limit.burst), at: Instant::now() }
    }

    /// Takes one creation, or says how long until one is there.
    fn take(&mut self, limit: KeygenLimit, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(limit.per_minute.max(1)) / 60.0;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(limit.burst.max(1)));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(((1.0 - self.tokens) / rate).max(0.0)))
        }
    }
}

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
    /// Key creations in flight (one).
    keygen: Arc<Semaphore>,
    /// The client's quota of key creations.
    keygen_bucket: Arc<Mutex<Bucket>>,
}

/// Per-client concurrency limits.
#[derive(Debug)]
pub struct ClientLimits {
    per_client: usize,
    calls_per_client: usize,
    response_bytes: usize,
    keygen: KeygenLimit,
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
            keygen: KeygenLimit::default(),
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

    /// These limits with the per-client quota of key creations `keygen` (each figure at least 1).
    pub fn with_keygen(mut self, keygen: KeygenLimit) -> Self {
        self.keygen = KeygenLimit { per_minute: keygen.per_minute.max(1), burst: keygen.burst.max(1) };
        self
    }

    /// The per-client quota of key creations.
    pub fn keygen(&self) -> KeygenLimit {
        self.keygen
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
                keygen: Arc::new(Semaphore::new(1)),
                keygen_bucket: Arc::new(Mutex::new(Bucket::full(self.keygen))),
            })
            .clone())
    }

    /// Takes one of `who`'s slots for a request that needs no TPM, waiting for one if the
    /// client is at its limit; with it, the client's key in the TPM queue.
    ///
    /// # Errors
    /// [`Error::ClientBusy`] (RESOURCE_EXHAUSTED) after waiting too long.
    pub async fn acquire_call(&self, who: &Identity) -> Result<(OwnedSemaphorePermit, ClientKey), Error> {
        let PerClient { calls: sem, queue_key, .. } = self.client(who)?;
        let permit = self.wait_for(sem, || Error::ClientBusy(Busy::Calls(self.calls_per_client))).await?;
        Ok((permit, queue_key))
    }

    /// A permit of `sem`, waiting up to the configured time; `busy` past it.
    async fn wait_for(&self, sem: Arc<Semaphore>, busy: impl FnOnce() -> Error) -> Result<OwnedSemaphorePermit, Error> {
        match tokio::time::timeout(self.wait, sem.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(Error::Internal("limits semaphore closed".into())),
            Err(_) => Err(busy()),
        }
    }

    /// Takes `who`'s key-creation slot (one creation in flight per client; a second waits for
    /// the first), then one creation from its quota; held until the creation ended.
    ///
    /// # Errors
    /// [`Error::ClientBusy`] (RESOURCE_EXHAUSTED) when the client's quota is spent (the message
    /// names the quota and when to retry), or after waiting too long for its slot.
    pub async fn acquire_keygen(&self, who: &Identity) -> Result<OwnedSemaphorePermit, Error> {
        let PerClient { keygen: sem, keygen_bucket: bucket, .. } = self.client(who)?;
        let permit = self.wait_for(sem, || Error::ClientBusy(Busy::KeygenRunning)).await?;
        let taken =
            bucket.lock().map_err(|_| Error::Internal("keygen quota lock".into()))?.take(self.keygen, Instant::now());
        match taken {
            Ok(()) => Ok(permit),
            Err(wait) => Err(Error::ClientBusy(Busy::KeygenQuota {
                per_minute: self.keygen.per_minute,
                burst: self.keygen.burst,
                retry_s: wait.as_secs().max(1),
            })),
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
        let permit = self.wait_for(sem, || Error::Tpm(TpmError::QueueFull(self.per_client))).await?;
        Ok((permit, queue_key))
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
        Err(_) => return Err(Error::ClientBusy(Busy::ResponseBytes(budget.total))),
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

    /// The quota: a burst, then refused with the time to wait; refilled at the rate.
    #[test]
    fn keygen_bucket_refills_at_the_rate() {
        let limit = KeygenLimit { per_minute: 60, burst: 2 };
        let mut b = Bucket::full(limit);
        let t0 = b.at;
        assert!(b.take(limit, t0).is_ok());
        assert!(b.take(limit, t0).is_ok());
        let wait = b.take(limit, t0).expect_err("spent");
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1), "{wait:?}");
        assert!(b.take(limit, t0 + Duration::from_millis(1001)).is_ok(), "one a second");
        assert!(b.take(limit, t0 + Duration::from_millis(1002)).is_err());
        // Never more than the burst, however long the client was idle.
        let later = t0 + Duration::from_secs(3600);
        assert!(b.take(limit, later).is_ok());
        assert!(b.take(limit, later).is_ok());
        assert!(b.take(limit, later).is_err());
    }

    /// One creation in flight per client; another client is not held up; the quota refuses.
    #[tokio::test]
    async fn one_keygen_in_flight_per_client_and_a_quota() {
        let limits =
            ClientLimits::new(16, Duration::from_millis(50)).with_keygen(KeygenLimit { per_minute: 1, burst: 2 });
        let a = Identity::Cert { subject: "CN=a".into() };
        let b = Identity::Cert { subject: "CN=b".into() };
        let first = limits.acquire_keygen(&a).await.expect("first");
        let busy = limits.acquire_keygen(&a).await;
        assert!(matches!(&busy, Err(Error::ClientBusy(m)) if m.to_string().contains("one at a time")), "{busy:?}");
        let other = limits.acquire_keygen(&b).await.expect("another client");
        drop((first, other));
        drop(limits.acquire_keygen(&a).await.expect("second of the burst"));
        let spent = limits.acquire_keygen(&a).await;
        assert!(matches!(&spent, Err(Error::ClientBusy(m)) if m.to_string().contains("quota")), "{spent:?}");
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
