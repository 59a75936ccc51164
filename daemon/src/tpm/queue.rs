//! The TPM actor's queue, served round-robin per client.
//!
//! Every job is queued under the client it is for: a [`ClientKey`], an opaque small number the
//! caller's layer hands out, one per client identity (the RPC layer takes it with the client's
//! TPM slot and passes it down, through the vault, to every [`TpmHandle`](super::TpmHandle)
//! call as an argument: no job can be queued without naming its client; the TPM layer never
//! learns who the client is). Each client has its own FIFO, and the actor takes the next job from the
//! next client that has one, so a client that just queued a job waits behind at most one job
//! of every other client with work queued, however many those have waiting. Jobs the daemon
//! runs for itself (start-up, housekeeping, the watchdog, its own TLS handshakes, in-process
//! users of the vault) form one client of their own, [`ClientKey::DAEMON`].
//!
//! The queue as a whole keeps one bound (the configured capacity, over all clients): past it a
//! job is refused, whoever it is for. Closing the queue refuses new jobs and lets the actor
//! take those already queued, in the same order, until it is empty.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Whose TPM job this is, for the queue's turns: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientKey(u64);

impl ClientKey {
    /// The daemon's own jobs (start-up, housekeeping, the watchdog, its TLS handshakes) and
    /// those of in-process users of the vault.
    pub const DAEMON: Self = Self(0);

    /// The key numbered `n`; distinct numbers are distinct clients (and none is [`Self::DAEMON`]).
    pub fn new(n: u64) -> Self {
        Self(n.saturating_add(1))
    }
}

/// Why a job was not queued; the job comes back with the reason.
#[derive(Debug)]
pub(crate) enum Refused<T> {
    /// The queue holds its capacity of jobs.
    Full(T),
    /// The queue is closed.
    Closed(T),
}

/// A bounded queue with one FIFO per client, served in turn; see the module docs.
#[derive(Debug)]
pub(crate) struct FairQueue<T> {
    inner: Mutex<Inner<T>>,
    ready: Condvar,
    capacity: usize,
}

#[derive(Debug)]
struct Inner<T> {
    /// Each client's queued jobs, oldest first; only clients with a job have an entry.
    fifos: HashMap<ClientKey, VecDeque<T>>,
    /// The clients with a job, the one whose turn is next first.
    turns: VecDeque<ClientKey>,
    /// Jobs queued, over all clients.
    len: usize,
    closed: bool,
}

impl<T> FairQueue<T> {
    /// A queue of at most `capacity` jobs (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let inner = Inner { fifos: HashMap::new(), turns: VecDeque::new(), len: 0, closed: false };
        Self { inner: Mutex::new(inner), ready: Condvar::new(), capacity: capacity.max(1) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // The queue's state is consistent between statements: a panic elsewhere cannot leave
        // it half-changed, so a poisoned lock is still good.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `job` at the end of `client`'s FIFO (a client without jobs takes the last turn).
    pub(crate) fn push(&self, client: ClientKey, job: T) -> Result<(), Refused<T>> {
        let mut q = self.lock();
        if q.closed {
            return Err(Refused::Closed(job));
        }
        if q.len >= self.capacity {
            return Err(Refused::Full(job));
        }
        let fifo = q.fifos.entry(client).or_default();
        fifo.push_back(job);
        if fifo.len() == 1 {
            q.turns.push_back(client);
        }
        q.len += 1;
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next client's oldest job, waiting for one; `None` once the queue is closed and
    /// empty.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut q = self.lock();
        loop {
            if let Some(job) = q.take_next() {
                return Some(job);
            }
            if q.closed {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Refuses new jobs from now on; those queued are still taken by [`FairQueue::pop`].
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Jobs queued.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len
    }
}

impl<T> Inner<T> {
    fn take_next(&mut self) -> Option<T> {
        while let Some(client) = self.turns.pop_front() {
            let Some(fifo) = self.fifos.get_mut(&client) else { continue };
            let job = fifo.pop_front();
            if fifo.is_empty() {
                self.fifos.remove(&client);
            } else {
                self.turns.push_back(client);
            }
            if job.is_some() {
                self.len -= 1;
                return job;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    const A: ClientKey = ClientKey(1);
    const B: ClientKey = ClientKey(2);
    const C: ClientKey = ClientKey(3);

    fn drain(q: &FairQueue<&'static str>) -> Vec<&'static str> {
        q.close();
        std::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn clients_are_served_in_turn_each_in_its_own_order() {
        let q = FairQueue::new(100);
        for job in ["a1", "a2", "a3", "a4"] {
            q.push(A, job).expect("push");
        }
        q.push(B, "b1").expect("push");
        q.push(ClientKey::DAEMON, "n1").expect("push");
        q.push(B, "b2").expect("push");
        assert_eq!(drain(&q), ["a1", "b1", "n1", "a2", "b2", "a3", "a4"]);
    }

    #[test]
    fn a_newcomer_waits_behind_one_job_of_a_flooding_client() {
        let q = FairQueue::new(100);
        for _ in 0..50 {
            q.push(A, "a").expect("push");
        }
        assert_eq!(q.pop(), Some("a"));
        q.push(B, "b").expect("push");
        // A's turn came first (it had jobs when B arrived), then B's.
        assert_eq!(q.pop(), Some("a"));
        assert_eq!(q.pop(), Some("b"));
        assert_eq!(q.len(), 48);
    }

    #[test]
    fn a_client_whose_fifo_emptied_takes_the_last_turn_when_it_returns() {
        let q = FairQueue::new(100);
        q.push(A, "a1").expect("push");
        q.push(B, "b1").expect("push");
        q.push(B, "b2").expect("push");
        assert_eq!(q.pop(), Some("a1"));
        q.push(C, "c1").expect("push");
        q.push(A, "a2").expect("push");
        assert_eq!(drain(&q), ["b1", "c1", "a2", "b2"]);
    }

    #[test]
    fn the_capacity_bounds_all_clients_together() {
        let q = FairQueue::new(3);
        q.push(A, "a1").expect("push");
        q.push(A, "a2").expect("push");
        q.push(B, "b1").expect("push");
        assert!(matches!(q.push(C, "c1"), Err(Refused::Full("c1"))));
        assert_eq!(q.pop(), Some("a1"));
        q.push(C, "c1").expect("room again");
        assert_eq!(drain(&q), ["b1", "a2", "c1"]);
    }

    #[test]
    fn a_closed_queue_refuses_new_jobs_and_gives_out_the_queued_ones() {
        let q = FairQueue::new(10);
        q.push(A, "a1").expect("push");
        q.push(B, "b1").expect("push");
        q.close();
        assert!(matches!(q.push(A, "a2"), Err(Refused::Closed("a2"))));
        assert_eq!(q.pop(), Some("a1"));
        assert_eq!(q.pop(), Some("b1"));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn pop_waits_for_a_job_and_wakes_on_close() {
        let q = Arc::new(FairQueue::new(10));
        let taker = {
            let q = q.clone();
            std::thread::spawn(move || (q.pop(), q.pop()))
        };
        std::thread::sleep(Duration::from_millis(50));
        q.push(A, "a1").expect("push");
        std::thread::sleep(Duration::from_millis(50));
        q.close();
        assert_eq!(taker.join().expect("taker"), (Some("a1"), None));
    }

    #[test]
    fn numbered_clients_are_distinct_from_the_daemon() {
        assert_ne!(ClientKey::new(0), ClientKey::DAEMON);
        assert_ne!(ClientKey::new(0), ClientKey::new(1));
    }
}
