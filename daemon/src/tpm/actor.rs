//! The TPM actor: the one thread that owns the [`Tpm`] connection, the bounded queue that
//! feeds it (served round-robin per client, [`super::queue`]), and the deadlines of its jobs.
//! [`TpmHandle`] is the cheap, cloneable way in.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::connection::{ConnectionConfig, Tpm};
use super::error::TpmError;
use super::queue::{ClientKey, FairQueue, Refused};
use super::shared::Shared;
use super::shared::TpmInfo;

/// A unit of TPM work: runs on the actor thread with exclusive access to the [`Tpm`].
struct Job {
    label: &'static str,
    deadline: Instant,
    run: Box<dyn Work>,
}

/// The body of a job: gets the TPM (or `None` when the job expired before it could run) and
/// reports success for the metrics.
trait Work: Send {
    fn run(self: Box<Self>, tpm: Option<&mut Tpm>) -> bool;
}

impl<F: FnOnce(Option<&mut Tpm>) -> bool + Send> Work for F {
    fn run(self: Box<Self>, tpm: Option<&mut Tpm>) -> bool {
        (*self)(tpm)
    }
}

/// Tuning for the actor's queue and deadlines.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Jobs that may wait for the TPM (all clients together) before new ones are refused.
    pub capacity: usize,
    /// Default deadline of one TPM operation, queueing included.
    pub timeout: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self { capacity: 1024, timeout: Duration::from_secs(10) }
    }
}

/// A cheap, cloneable handle to the TPM actor.
#[derive(Clone)]
pub struct TpmHandle {
    queue: Arc<Jobs>,
    shared: Arc<Shared>,
    timeout: Duration,
    capacity: usize,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

/// The actor's queue as its handles hold it: the last handle dropped closes it, so the actor
/// ends once it has run what was queued.
struct Jobs(Arc<FairQueue<Job>>);

impl Drop for Jobs {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl std::fmt::Debug for TpmHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmHandle")
            .field("state", &self.shared.state())
            .field("queued", &self.shared.queued.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl TpmHandle {
    /// Starts the actor thread, connects to the TPM and checks its SRK.
    ///
    /// # Errors
    /// [`TpmError::Unavailable`] when the TPM cannot be reached, [`TpmError::SrkMismatch`] when
    /// it is not the TPM the state belongs to.
    pub async fn open(cfg: ConnectionConfig, queue: QueueConfig) -> Result<(Self, TpmInfo), TpmError> {
        let shared = Arc::new(Shared::default());
        let jobs = Arc::new(FairQueue::<Job>::new(queue.capacity));
        let (ready_tx, ready_rx) = oneshot::channel();
        let actor_shared = shared.clone();
        let actor_jobs = jobs.clone();
        let thread = std::thread::Builder::new()
            .name("tpm".into())
            .spawn(move || {
                let mut tpm = match Tpm::open(cfg, actor_shared.clone()) {
                    Ok((tpm, info)) => {
                        let _ = ready_tx.send(Ok(info));
                        tpm
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                // Until the queue is closed (shutdown, or the last handle gone) and empty.
                while let Some(job) = actor_jobs.pop() {
                    let start = Instant::now();
                    let label = job.label;
                    if start > job.deadline {
                        job.run.run(None);
                    } else {
                        let ok = job.run.run(Some(&mut tpm));
                        actor_shared.metrics.observe(label, start.elapsed(), ok);
                    }
                    actor_shared.set_loaded(tpm.loaded_objects());
                    actor_shared.queued.fetch_sub(1, Ordering::Relaxed);
                }
                tpm.flush_all();
                tracing::debug!("TPM actor stopped");
            })
            .map_err(|e| TpmError::Unavailable(format!("cannot start TPM thread: {e}")))?;
        let info = ready_rx.await.map_err(|_| TpmError::Unavailable("TPM thread died during open".into()))??;
        let handle = Self {
            queue: Arc::new(Jobs(jobs)),
            shared,
            timeout: queue.timeout,
            capacity: queue.capacity,
            thread: Arc::new(Mutex::new(Some(thread))),
        };
        Ok((handle, info))
    }

    /// Runs `f` on the TPM thread with the default deadline, queued as `client`'s job
    /// ([`super::queue`]).
    ///
    /// # Errors
    /// Whatever `f` returns; [`TpmError::QueueFull`] when too many jobs wait;
    /// [`TpmError::Timeout`] when the deadline passes first.
    pub async fn call<T, F>(&self, client: ClientKey, label: &'static str, f: F) -> Result<T, TpmError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tpm) -> Result<T, TpmError> + Send + 'static,
    {
        self.call_with_timeout(client, label, self.timeout, f).await
    }

    /// Runs `f` on the TPM thread with an explicit deadline (e.g. longer for RSA key generation).
    ///
    /// # Errors
    /// As [`TpmHandle::call`].
    pub async fn call_with_timeout<T, F>(
        &self,
        client: ClientKey,
        label: &'static str,
        timeout: Duration,
        f: F,
    ) -> Result<T, TpmError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tpm) -> Result<T, TpmError> + Send + 'static,
    {
        let (reply_tx, reply_rx) = oneshot::channel();
        let ms = self.submit_call(client, label, timeout, f, move |result| {
            let _ = reply_tx.send(result);
        })?;
        let result = match tokio::time::timeout(timeout, reply_rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(TpmError::Unavailable("TPM actor stopped".into())),
            Err(_) => Err(TpmError::Timeout(ms)),
        };
        if let Err(e) = &result {
            self.shared.count_error(e.class_name());
        }
        result
    }

    /// Runs `f` on the TPM thread and blocks the calling (non-async) thread until it is done.
    /// For synchronous callers such as rustls' `Signer::sign`; never call it on an async worker
    /// without `block_in_place`.
    ///
    /// # Errors
    /// As [`TpmHandle::call`].
    pub fn call_blocking<T, F>(&self, client: ClientKey, label: &'static str, f: F) -> Result<T, TpmError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tpm) -> Result<T, TpmError> + Send + 'static,
    {
        let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
        let timeout = self.timeout;
        let ms = self.submit_call(client, label, timeout, f, move |result| {
            let _ = reply_tx.send(result);
        })?;
        let result = match reply_rx.recv_timeout(timeout) {
            Ok(result) => result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(TpmError::Timeout(ms)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(TpmError::Unavailable("TPM actor stopped".into()))
            }
        };
        if let Err(e) = &result {
            self.shared.count_error(e.class_name());
        }
        result
    }

    /// Queues `f` with a deadline of `timeout`; its result (or the expiry) goes to `reply`.
    /// Returns the deadline in milliseconds, for the caller's own timeout error.
    fn submit_call<T, F>(
        &self,
        client: ClientKey,
        label: &'static str,
        timeout: Duration,
        f: F,
        reply: impl FnOnce(Result<T, TpmError>) + Send + 'static,
    ) -> Result<u64, TpmError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tpm) -> Result<T, TpmError> + Send + 'static,
    {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.submit(client, label, timeout, move |tpm| {
            let result = match tpm {
                Some(tpm) => f(tpm),
                None => Err(TpmError::Timeout(ms)),
            };
            let ok = result.is_ok();
            reply(result);
            ok
        })?;
        Ok(ms)
    }

    fn submit(
        &self,
        client: ClientKey,
        label: &'static str,
        timeout: Duration,
        run: impl FnOnce(Option<&mut Tpm>) -> bool + Send + 'static,
    ) -> Result<(), TpmError> {
        let job = Job { label, deadline: Instant::now() + timeout, run: Box::new(run) };
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        self.queue.0.push(client, job).map_err(|refused| {
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
            match refused {
                Refused::Full(_) => TpmError::QueueFull(self.capacity),
                Refused::Closed(_) => TpmError::Unavailable("TPM actor stopped".into()),
            }
        })
    }

    /// State shared with the actor (connection state, metrics, queue depth).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Flushes every object the vault loaded and waits for it. The actor reconnects on the
    /// next job, so this is safe at any time; it is what shutdown calls.
    ///
    /// # Errors
    /// When the actor cannot be reached.
    pub async fn flush_all(&self) -> Result<(), TpmError> {
        self.call(ClientKey::DAEMON, "flush", |tpm| {
            tpm.flush_all();
            Ok(())
        })
        .await
    }

    /// Stops the actor: jobs already queued run first (each within its deadline), later ones
    /// fail with `Unavailable`; every object the vault loaded is flushed and the TPM connection
    /// closed. Waits for the thread up to `grace`. Safe to call from any clone, once or more.
    pub async fn shutdown(&self, grace: Duration) {
        self.queue.0.close();
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let deadline = Instant::now() + grace;
            while !thread.is_finished() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                tracing::warn!("TPM thread still busy after {grace:?}; leaving it");
            }
        }
    }
}
