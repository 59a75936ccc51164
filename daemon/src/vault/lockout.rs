//! The dictionary-attack guard: rations wrong key passwords before they reach the TPM.
//!
//! # Why the vault rations password attempts
//! A TPM 2.0 counts failed authorizations of DA-protected objects (the vault's
//! password-protected keys are created without `noDA`, so the TPM, not the vault, is what makes
//! a password hard to guess). The count, `TPM_PT_LOCKOUT_COUNTER`, is one per TPM: every program
//! on the device shares it. When it reaches `TPM_PT_MAX_AUTH_FAIL` (3 on a fresh swtpm, often 32
//! on hardware) the TPM enters lockout and refuses **every** DA-protected object of **every**
//! program until it forgives one failure per `TPM_PT_LOCKOUT_INTERVAL` (1,000 s on swtpm, often
//! 2 hours on hardware) or someone with the lockout authorization resets it. So a client that may
//! merely *use* one password key, without knowing its password, could lock the whole device by
//! guessing.
//!
//! The vault therefore stands in front of the TPM's counter with two rules:
//! - **A throttle per client and per key** ([`Throttle`]). Each client (a uid on the Unix socket,
//!   a certificate identity on the TLS listener: [`Client`]) gets
//!   [`LockoutConfig::free_failures_per_client`] wrong passwords per key for free, and each key
//!   [`LockoutConfig::free_failures_per_key`] in all (so many identities do not add up to many
//!   guesses). Past either budget, the next attempt on that key by that client waits
//!   [`LockoutConfig::delay`] after the last failure, doubling with each further failure up to
//!   [`LockoutConfig::max_delay`]; earlier attempts are refused with [`Error::Throttled`]
//!   (RESOURCE_EXHAUSTED, naming the wait) without reaching the TPM. The right password resets
//!   that client's count for that key. Attempts still running count against the budgets: an
//!   attempt that could overrun one waits (it is not refused) until those finish, so concurrent
//!   guesses cannot slip past a budget, while concurrent signatures with the right password
//!   only queue a little (the TPM runs one command at a time anyway). A client's failures are
//!   forgotten after twice
//!   `max_delay` without a new one, and the throttle remembers at most
//!   [`MAX_CLIENT_RECORDS`] client records (the stalest is dropped first; its failures keep
//!   counting in the key's total until that is forgotten too).
//! - **A reserve of the TPM's own tries** ([`LockoutConfig::tpm_reserve`]). Before each attempt
//!   on a password key, in the same TPM job as the attempt, the TPM layer reads the counter and
//!   the maximum and refuses (`TpmError::DaReserve`) while fewer than `tpm_reserve` tries remain
//!   ([`crate::tpm::Tpm::check_da_reserve`]). With a reserve of 2 or more the vault's own attempts
//!   can never push the TPM into lockout, so keys without a password, other programs'
//!   DA-protected objects and, once the TPM forgave a failure, other password keys keep working.
//!
//! This module owns the throttle's bookkeeping; it does not talk to the TPM (the vault runs the
//! reserve check) and it does not decide who may use a key (that is the access policy's job,
//! checked before a password is ever tried).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use crate::auth::Identity;
use crate::error::Error;
use crate::model::KeyName;
use crate::tpm::TpmError;

/// Most client records (one per client and key with failures) the throttle keeps.
pub const MAX_CLIENT_RECORDS: usize = 16_384;

/// The guard's settings (config keys `da_*`, see `docs/CONFIG.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockoutConfig {
    /// Wrong passwords each client may give for one key before its attempts on that key wait.
    pub free_failures_per_client: u32,
    /// Wrong passwords all clients together may give for one key before every attempt on it
    /// waits.
    pub free_failures_per_key: u32,
    /// The first wait past a budget; each further failure doubles it.
    pub delay: Duration,
    /// The longest wait.
    pub max_delay: Duration,
    /// Tries of the TPM's own dictionary-attack budget the vault never spends: password
    /// attempts are refused while fewer than this many remain (0: no reserve).
    pub tpm_reserve: u32,
}

impl Default for LockoutConfig {
    fn default() -> Self {
        Self {
            free_failures_per_client: 3,
            free_failures_per_key: 10,
            delay: Duration::from_millis(1000),
            max_delay: Duration::from_secs(600),
            tpm_reserve: 2,
        }
    }
}

impl LockoutConfig {
    /// No throttle and no reserve: every password attempt goes to the TPM (tests that need to
    /// drive a TPM into lockout, and the comparison in `docs/RELIABILITY.md`).
    pub fn disabled() -> Self {
        Self {
            free_failures_per_client: u32::MAX,
            free_failures_per_key: u32::MAX,
            delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            tpm_reserve: 0,
        }
    }

    /// The wait after the `n`-th failure past a budget (`n` = 0 for the first): `delay * 2^n`,
    /// at most `max_delay`.
    fn step(&self, n: u32) -> Duration {
        self.delay.saturating_mul(2u32.saturating_pow(n)).min(self.max_delay)
    }

    /// How long a client's failures on a key are remembered after its last one.
    fn forget_after(&self) -> Duration {
        self.max_delay.saturating_mul(2)
    }
}

/// Who presents a key password: the unit the throttle counts failures by. A uid on the Unix
/// socket (not a process: a client cannot get a fresh budget by forking), a certificate
/// identity on the TLS listener, or the daemon itself.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Client(String);

impl Client {
    /// A local client by uid.
    pub fn uid(uid: u32) -> Self {
        Self(format!("uid:{uid}"))
    }

    /// Calls made inside the daemon process (the library API, tests).
    pub fn in_process() -> Self {
        Self("in-process".to_owned())
    }
}

impl From<&Identity> for Client {
    fn from(id: &Identity) -> Self {
        match id {
            Identity::Unix(u) => Self::uid(u.uid),
            Identity::Cert { subject } => Self(format!("cert:{subject}")),
            Identity::Unknown => Self("unknown".to_owned()),
        }
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Client({})", self.0)
    }
}

/// A key password as one client presents it: what the TPM checks, and whom a wrong one is
/// counted against.
pub struct Password {
    client: Client,
    secret: Zeroizing<Vec<u8>>,
}

impl Password {
    /// `secret` presented by `client`.
    pub fn new(client: Client, secret: Zeroizing<Vec<u8>>) -> Self {
        Self { client, secret }
    }

    /// Who presents it.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The password's bytes.
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    pub(crate) fn into_parts(self) -> (Client, Zeroizing<Vec<u8>>) {
        (self.client, self.secret)
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Password").field("client", &self.client).finish_non_exhaustive()
    }
}

/// The throttle: failures per client and key, attempts in flight, and the guard's counters.
#[derive(Debug, Default)]
pub struct Throttle {
    config: LockoutConfig,
    state: Mutex<HashMap<KeyName, KeyTally>>,
    /// Wrong passwords the TPM rejected.
    failures: AtomicU64,
    /// Attempts refused without reaching the TPM (throttled, or the TPM's reserve).
    refused: AtomicU64,
    /// Woken whenever an attempt settles, for attempts waiting for those in flight.
    settled: tokio::sync::Notify,
}

/// What became of an admitted attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The TPM accepted the password.
    Accepted,
    /// The TPM rejected it (TPM_RC_AUTH_FAIL / BAD_AUTH).
    Rejected,
    /// Unknown whether the TPM tried it (the caller timed out or went away): counted as a
    /// failure, not in the metric.
    Unknown,
    /// The TPM never tried it (refused by the reserve, queue full, TPM down, ...).
    NotTried,
}

impl Outcome {
    /// The outcome of a TPM job that tried a password.
    pub(crate) fn of<T>(result: &Result<T, TpmError>) -> Self {
        match result {
            Ok(_) => Self::Accepted,
            Err(TpmError::AuthFailed) => Self::Rejected,
            Err(TpmError::Timeout(_)) => Self::Unknown,
            Err(_) => Self::NotTried,
        }
    }
}

/// An admitted password attempt; settle it with [`Attempt::settle`]. Dropped unsettled (the
/// request was cancelled while the TPM may be trying it), it counts as a failure.
#[derive(Debug)]
pub(crate) struct Attempt<'a> {
    throttle: &'a Throttle,
    key: KeyName,
    client: Client,
    settled: bool,
}

impl Attempt<'_> {
    /// Records what the TPM made of the attempt.
    pub(crate) fn settle(mut self, outcome: Outcome) {
        self.settled = true;
        self.throttle.settle(&self.key, &self.client, outcome, Instant::now());
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.throttle.settle(&self.key, &self.client, Outcome::Unknown, Instant::now());
        }
    }
}

/// Failures and attempts in flight, for one client on one key or for a key in all.
#[derive(Debug, Default, Clone)]
struct Tally {
    failures: u32,
    in_flight: u32,
    last_failure: Option<Instant>,
}

/// Whether a tally lets another attempt through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Now.
    Open,
    /// Not until the wait after the last failure is over.
    Closed(Duration),
    /// Once attempts in flight have finished: they could use up what is left of the budget
    /// (or, past it, the one attempt allowed after a wait is running).
    Busy,
}

impl Gate {
    /// Both gates together: the longer wait, else busy if either is.
    fn and(self, other: Gate) -> Gate {
        match (self, other) {
            (Gate::Closed(a), Gate::Closed(b)) => Gate::Closed(a.max(b)),
            (Gate::Closed(a), _) | (_, Gate::Closed(a)) => Gate::Closed(a),
            (Gate::Busy, _) | (_, Gate::Busy) => Gate::Busy,
            (Gate::Open, Gate::Open) => Gate::Open,
        }
    }
}

impl Tally {
    /// The gate of this tally, with `free` failures free.
    fn gate(&self, free: u32, cfg: &LockoutConfig, now: Instant) -> Gate {
        if self.failures.saturating_add(self.in_flight) < free {
            return Gate::Open;
        }
        if self.failures >= free {
            if let Some(last) = self.last_failure {
                let until = last + cfg.step(self.failures - free);
                if now < until {
                    return Gate::Closed(until - now);
                }
            }
        }
        // Past the budget, one attempt at a time: its outcome decides the next wait.
        if self.in_flight > 0 {
            Gate::Busy
        } else {
            Gate::Open
        }
    }

    fn idle_since(&self, now: Instant, forget: Duration) -> bool {
        self.in_flight == 0 && self.last_failure.is_none_or(|t| now.saturating_duration_since(t) >= forget)
    }
}

/// One key's tallies.
#[derive(Debug, Default)]
struct KeyTally {
    total: Tally,
    clients: HashMap<Client, Tally>,
}

impl KeyTally {
    /// Forgets clients idle for `forget`, and the key's own count once it is idle too.
    fn forget_idle(&mut self, now: Instant, forget: Duration) {
        let before = self.clients.len();
        let mut forgotten = 0u32;
        self.clients.retain(|_, c| {
            let keep = !c.idle_since(now, forget);
            if !keep {
                forgotten = forgotten.saturating_add(c.failures);
            }
            keep
        });
        if self.clients.len() != before {
            self.total.failures = self.total.failures.saturating_sub(forgotten);
        }
        if self.total.idle_since(now, forget) {
            // Failures of clients dropped for room are forgotten with the key's idleness.
            self.total.failures = self.clients.values().map(|c| c.failures).fold(0, u32::saturating_add);
        }
    }

    fn is_empty(&self) -> bool {
        self.clients.is_empty() && self.total.failures == 0 && self.total.in_flight == 0
    }
}

impl Throttle {
    /// A throttle with `config`.
    pub fn new(config: LockoutConfig) -> Self {
        Self { config, ..Self::default() }
    }

    /// The settings in force.
    pub fn config(&self) -> &LockoutConfig {
        &self.config
    }

    /// Wrong passwords the TPM rejected so far (`tpm_vault_da_failures_total`).
    pub fn failures_total(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Attempts refused without reaching the TPM so far (`tpm_vault_da_refused_total`).
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Counts an attempt the TPM's reserve refused.
    pub(crate) fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Admits `client`'s attempt on `key`: at once, after attempts in flight that could use up
    /// a budget have finished, or not while a wait after a failure is running.
    ///
    /// # Errors
    /// [`Error::Throttled`] naming the wait.
    pub(crate) async fn admit(&self, key: &KeyName, client: &Client) -> Result<Attempt<'_>, Error> {
        loop {
            // Registered before the check, so a settle between the check and the wait is seen.
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            match self.try_admit(key, client, Instant::now())? {
                Some(attempt) => return Ok(attempt),
                // Attempts in flight end within the TPM deadline (or when their request is
                // dropped); the timeout only bounds a missed wake-up.
                None => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), settled).await;
                }
            }
        }
    }

    /// One admission check: the attempt, `None` while attempts in flight must finish first.
    fn try_admit(&self, key: &KeyName, client: &Client, now: Instant) -> Result<Option<Attempt<'_>>, Error> {
        let cfg = &self.config;
        let mut state = self.lock();
        let tally = state.entry(key.clone()).or_default();
        tally.forget_idle(now, cfg.forget_after());
        let own = tally.clients.get(client).map_or(Gate::Open, |c| c.gate(cfg.free_failures_per_client, cfg, now));
        let all = tally.total.gate(cfg.free_failures_per_key, cfg, now);
        match own.and(all) {
            Gate::Open => {}
            Gate::Busy => return Ok(None),
            Gate::Closed(wait) => {
                if tally.is_empty() {
                    state.remove(key);
                }
                drop(state);
                self.count_refused();
                return Err(Error::Throttled { key: key.clone(), wait });
            }
        }
        tally.total.in_flight += 1;
        tally.clients.entry(client.clone()).or_default().in_flight += 1;
        make_room(&mut state, now, cfg.forget_after());
        Ok(Some(Attempt { throttle: self, key: key.clone(), client: client.clone(), settled: false }))
    }

    fn settle(&self, key: &KeyName, client: &Client, outcome: Outcome, now: Instant) {
        if outcome == Outcome::Rejected {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        let mut state = self.lock();
        let Some(tally) = state.get_mut(key) else {
            // Forgotten meanwhile (the key was deleted): nothing to count, but wake waiters.
            drop(state);
            self.settled.notify_waiters();
            return;
        };
        tally.total.in_flight = tally.total.in_flight.saturating_sub(1);
        let failed = matches!(outcome, Outcome::Rejected | Outcome::Unknown);
        if failed {
            tally.total.failures = tally.total.failures.saturating_add(1);
            tally.total.last_failure = Some(now);
        }
        if let Some(c) = tally.clients.get_mut(client) {
            c.in_flight = c.in_flight.saturating_sub(1);
            match outcome {
                Outcome::Accepted => {
                    tally.total.failures = tally.total.failures.saturating_sub(c.failures);
                    c.failures = 0;
                    c.last_failure = None;
                }
                Outcome::Rejected | Outcome::Unknown => {
                    c.failures = c.failures.saturating_add(1);
                    c.last_failure = Some(now);
                }
                Outcome::NotTried => {}
            }
            if c.failures == 0 && c.in_flight == 0 {
                tally.clients.remove(client);
            }
        }
        if tally.is_empty() {
            state.remove(key);
        }
        drop(state);
        self.settled.notify_waiters();
    }

    /// Forgets everything about `key` (it was deleted; a new key of that name starts afresh).
    pub(crate) fn forget(&self, key: &KeyName) {
        self.lock().remove(key);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<KeyName, KeyTally>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps the client records within [`MAX_CLIENT_RECORDS`]: forgets idle ones, then drops the
/// records whose last failure is oldest (never one with an attempt in flight).
fn make_room(state: &mut HashMap<KeyName, KeyTally>, now: Instant, forget: Duration) {
    let records = |s: &HashMap<KeyName, KeyTally>| s.values().map(|k| k.clients.len()).sum::<usize>();
    if records(state) <= MAX_CLIENT_RECORDS {
        return;
    }
    for tally in state.values_mut() {
        tally.forget_idle(now, forget);
    }
    while records(state) > MAX_CLIENT_RECORDS {
        let stalest = state
            .iter()
            .flat_map(|(k, t)| {
                t.clients.iter().filter(|(_, c)| c.in_flight == 0).map(move |(c, t)| (k, c, t.last_failure))
            })
            .min_by_key(|(_, _, last)| *last)
            .map(|(k, c, _)| (k.clone(), c.clone()));
        let Some((key, client)) = stalest else { return };
        if let Some(tally) = state.get_mut(&key) {
            tally.clients.remove(&client);
        }
    }
    state.retain(|_, t| !t.is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> KeyName {
        KeyName::try_from(name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn cfg() -> LockoutConfig {
        LockoutConfig {
            free_failures_per_client: 3,
            free_failures_per_key: 10,
            delay: Duration::from_millis(1000),
            max_delay: Duration::from_secs(600),
            tpm_reserve: 2,
        }
    }

    /// Admits at `now`, which must not have to wait for attempts in flight.
    fn admit_at<'a>(t: &'a Throttle, k: &KeyName, c: &Client, now: Instant) -> Result<Attempt<'a>, Error> {
        t.try_admit(k, c, now).map(|a| a.unwrap_or_else(|| panic!("busy")))
    }

    /// Tries once at `now` and settles with `outcome`; the wait if refused.
    fn attempt(t: &Throttle, k: &KeyName, c: &Client, now: Instant, outcome: Outcome) -> Option<Duration> {
        match admit_at(t, k, c, now) {
            Ok(a) => {
                let mut a = a;
                a.settled = true;
                t.settle(&a.key, &a.client, outcome, now);
                None
            }
            Err(Error::Throttled { wait, .. }) => Some(wait),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn free_failures_then_doubling_waits_up_to_the_cap() {
        let t = Throttle::new(LockoutConfig { max_delay: Duration::from_secs(5), ..cfg() });
        let (k, c) = (key("k"), Client::uid(1000));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(attempt(&t, &k, &c, t0, Outcome::Rejected), None, "free");
        }
        assert_eq!(attempt(&t, &k, &c, t0, Outcome::Rejected), Some(Duration::from_secs(1)));
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(attempt(&t, &k, &c, at(400), Outcome::Rejected), Some(Duration::from_millis(600)));
        // After the wait one attempt goes through; its failure doubles the wait.
        assert_eq!(attempt(&t, &k, &c, at(1000), Outcome::Rejected), None);
        assert_eq!(attempt(&t, &k, &c, at(1000), Outcome::Rejected), Some(Duration::from_secs(2)));
        assert_eq!(attempt(&t, &k, &c, at(3000), Outcome::Rejected), None);
        assert_eq!(attempt(&t, &k, &c, at(3000), Outcome::Rejected), Some(Duration::from_secs(4)));
        assert_eq!(attempt(&t, &k, &c, at(7000), Outcome::Rejected), None);
        assert_eq!(attempt(&t, &k, &c, at(7000), Outcome::Rejected), Some(Duration::from_secs(5)), "capped");
        assert_eq!(t.failures_total(), 6);
        assert_eq!(t.refused_total(), 5);
    }

    #[test]
    fn success_resets_the_clients_count() {
        let t = Throttle::new(cfg());
        let (k, c) = (key("k"), Client::uid(1000));
        let now = Instant::now();
        assert_eq!(attempt(&t, &k, &c, now, Outcome::Rejected), None);
        assert_eq!(attempt(&t, &k, &c, now, Outcome::Rejected), None);
        assert_eq!(attempt(&t, &k, &c, now, Outcome::Accepted), None);
        for _ in 0..3 {
            assert_eq!(attempt(&t, &k, &c, now, Outcome::Rejected), None, "the budget is whole again");
        }
        assert!(attempt(&t, &k, &c, now, Outcome::Rejected).is_some());
        assert_eq!(t.lock()[&k].total.failures, 3, "the key's total lost the reset client's failures");
    }

    #[test]
    fn clients_have_their_own_budgets_up_to_the_keys() {
        let t = Throttle::new(cfg());
        let k = key("k");
        let now = Instant::now();
        for uid in 1..=3 {
            let c = Client::uid(uid);
            for _ in 0..3 {
                assert_eq!(attempt(&t, &k, &c, now, Outcome::Rejected), None, "uid {uid}");
            }
            assert!(attempt(&t, &k, &c, now, Outcome::Rejected).is_some(), "uid {uid} used its budget");
        }
        // Nine failures on the key: a fourth client gets one more, then the key's budget is
        // spent for everyone, this client included.
        let d = Client::uid(4);
        assert_eq!(attempt(&t, &k, &d, now, Outcome::Rejected), None);
        assert_eq!(attempt(&t, &k, &d, now, Outcome::Rejected), Some(Duration::from_secs(1)));
        assert_eq!(attempt(&t, &k, &Client::uid(5), now, Outcome::Rejected), Some(Duration::from_secs(1)));
        // Other keys are not affected.
        assert_eq!(attempt(&t, &key("other"), &d, now, Outcome::Rejected), None);
    }

    #[test]
    fn attempts_in_flight_count_against_the_budget() {
        let t = Throttle::new(cfg());
        let (k, c) = (key("k"), Client::uid(1000));
        let now = Instant::now();
        let running: Vec<_> = (0..3).map(|_| admit_at(&t, &k, &c, now).unwrap_or_else(|e| panic!("{e}"))).collect();
        assert!(matches!(t.try_admit(&k, &c, now), Ok(None)), "a fourth concurrent attempt waits for them");
        assert!(matches!(t.try_admit(&k, &Client::uid(1), now), Ok(Some(_))), "another client is not held up");
        let mut running = running.into_iter();
        if let Some(a) = running.next() {
            a.settle(Outcome::Accepted);
        }
        assert!(matches!(t.try_admit(&k, &c, now), Ok(Some(_))), "one finished with the right password");
        for a in running {
            a.settle(Outcome::Rejected);
        }
        // Two rejections, and the attempt admitted and dropped just above: three failures.
        assert!(matches!(t.try_admit(&k, &c, now), Err(Error::Throttled { .. })));
    }

    #[test]
    fn cancelled_attempts_count_and_untried_ones_do_not() {
        let t = Throttle::new(cfg());
        let (k, c) = (key("k"), Client::uid(1000));
        let now = Instant::now();
        for _ in 0..2 {
            drop(admit_at(&t, &k, &c, now).unwrap_or_else(|e| panic!("{e}")));
        }
        assert_eq!(t.lock()[&k].clients[&c].failures, 2, "a dropped attempt may have reached the TPM");
        for _ in 0..5 {
            assert_eq!(attempt(&t, &k, &c, now, Outcome::NotTried), None, "nothing reached the TPM");
        }
        assert_eq!(t.failures_total(), 0, "the metric counts only the TPM's rejections");
        t.forget(&k);
        assert!(t.lock().is_empty());
    }

    #[test]
    fn failures_are_forgotten_after_twice_the_longest_wait() {
        let t = Throttle::new(LockoutConfig { max_delay: Duration::from_secs(10), ..cfg() });
        let (k, c) = (key("k"), Client::uid(1000));
        let t0 = Instant::now();
        for _ in 0..4 {
            attempt(&t, &k, &c, t0, Outcome::Rejected);
        }
        assert!(attempt(&t, &k, &c, t0 + Duration::from_millis(999), Outcome::Rejected).is_some());
        let later = t0 + Duration::from_secs(20);
        for _ in 0..3 {
            assert_eq!(attempt(&t, &k, &c, later, Outcome::Rejected), None, "a fresh budget");
        }
        let t_idle = later + Duration::from_secs(20);
        assert_eq!(attempt(&t, &k, &c, t_idle, Outcome::Accepted), None);
        assert!(t.lock().is_empty(), "nothing kept for a client with no failures");
    }

    #[test]
    fn client_records_are_bounded() {
        // With the default per-key budget, identities beyond the tenth wait (see
        // `clients_have_their_own_budgets_up_to_the_keys`); without one, records pile up.
        let t = Throttle::new(LockoutConfig { free_failures_per_key: u32::MAX, ..cfg() });
        let k = key("k");
        let now = Instant::now();
        let n = MAX_CLIENT_RECORDS as u32 + 50;
        for uid in 0..n {
            let at = now + Duration::from_micros(u64::from(uid));
            assert_eq!(attempt(&t, &k, &Client::uid(uid), at, Outcome::Rejected), None);
        }
        let records: usize = t.lock().values().map(|k| k.clients.len()).sum();
        assert_eq!(records, MAX_CLIENT_RECORDS);
        assert!(!t.lock()[&k].clients.contains_key(&Client::uid(0)), "the stalest record went first");
        assert_eq!(t.lock()[&k].total.failures, n, "dropped records still count in the key's total");
    }

    #[test]
    fn disabled_never_throttles() {
        let t = Throttle::new(LockoutConfig::disabled());
        let (k, c) = (key("k"), Client::uid(1000));
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(attempt(&t, &k, &c, now, Outcome::Rejected), None);
        }
    }
}
