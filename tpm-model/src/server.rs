//! The model's listeners: a port pair per client space speaking swtpm's TCP protocol, and a
//! stats port.
//!
//! A [`Model`] owns the [`Device`] (one swtpm, one command at a time) behind a mutex. Each
//! [`Endpoint`] is one space, one open file of `/dev/tpmrm0`: its data port P takes TPM
//! commands (every connection may carry any number of them; swtpm's TCTI opens one per
//! command), its control port P+1 is forwarded to swtpm's control port untouched. A command
//! the resource manager fails (out of slots, say) gets no response: the model closes that
//! connection, so the TCTI's receive fails with `TSS2_TCTI_RC_IO_ERROR`, the same code the
//! device TCTI returns when `write()` on `/dev/tpmrm0` fails with `-ENOMEM`; the space
//! itself lives on, as the file does.
//!
//! The stats port takes one line per connection and answers one JSON document: `stats`
//! (everything), `open` (a new space: `{"id", "port", "tcti"}`), `close ID`, `reopen ID` (close
//! the space and open it again on the same port: a process closed the file and the next one
//! opened it).

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::device::Device;
use crate::ports::{self, PortPair};
use crate::profile::Profile;
use crate::space::{Failure, Outcome, SpaceState, OBJECT_SLOTS, SESSION_SLOTS};
use crate::stats::{SpaceStats, Stats, Tally};
use crate::wire;

/// How often accept loops look at their stop flag.
const POLL: Duration = Duration::from_millis(20);

/// Why the model could not start.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// swtpm could not be reached or did not answer the command-attribute query.
    #[error("TPM behind the model: {0}")]
    Upstream(io::Error),
    /// No port pair or stats port could be bound.
    #[error("binding the model's ports: {0}")]
    Bind(io::Error),
}

/// Builds a [`Model`].
#[derive(Debug, Clone)]
pub struct ModelBuilder {
    upstream: u16,
    profile: Profile,
    speed: f64,
    slots: (usize, usize),
}

impl ModelBuilder {
    /// A model in front of the swtpm whose data port is `upstream` (control: `upstream + 1`)
    /// on 127.0.0.1, with the `none` profile at speed 1.
    pub fn new(upstream: u16) -> Self {
        Self { upstream, profile: Profile::none(), speed: 1.0, slots: (OBJECT_SLOTS, SESSION_SLOTS) }
    }

    /// Object and session slots per space (default: the kernel's 3 and 3). With swtpm behind
    /// the model (3 object slots, 3 loaded sessions, as the TPM reference implementation), a
    /// space of 3 fills the TPM: a command that makes a fourth object fails in the TPM with
    /// TPM_RC_OBJECT_MEMORY before the resource manager's own slot check. Fewer slots reach
    /// that check (what a TPM with more memory meets).
    pub fn with_slots(mut self, objects: usize, sessions: usize) -> Self {
        self.slots = (objects, sessions);
        self
    }

    /// The device profile.
    pub fn with_profile(mut self, profile: Profile) -> Self {
        self.profile = profile;
        self
    }

    /// The speed factor: every profile time is multiplied by it (0.1 = ten times faster).
    pub fn with_speed(mut self, speed: f64) -> Self {
        self.speed = speed;
        self
    }

    /// Connects to swtpm, reads its command attributes and opens the stats port.
    ///
    /// # Errors
    /// [`ModelError`].
    pub fn build(self) -> Result<Model, ModelError> {
        let total = Arc::new(Mutex::new(Tally::default()));
        let device = Device::open(self.upstream, self.profile.clone(), self.speed, total.clone())
            .map_err(ModelError::Upstream)?;
        let stats_listener = TcpListener::bind("127.0.0.1:0").map_err(ModelError::Bind)?;
        let stats_port = stats_listener.local_addr().map_err(ModelError::Bind)?.port();
        let inner = Arc::new(Inner {
            device: Mutex::new(device),
            total,
            spaces: Mutex::new(Vec::new()),
            owned: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            upstream: self.upstream,
            slots: self.slots,
            profile: self.profile,
            speed: self.speed,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let stats_thread = {
            let (inner, stop) = (inner.clone(), stop.clone());
            std::thread::Builder::new()
                .name("model-stats".into())
                .spawn(move || {
                    accept_loop(stats_listener, &stop, move |c| serve_stats(c, &inner));
                })
                .map_err(ModelError::Bind)?
        };
        Ok(Model { inner, stats_port, stop, threads: vec![stats_thread] })
    }
}

/// A running model, stopped on drop (its endpoints stop with their own drop).
#[derive(Debug)]
pub struct Model {
    inner: Arc<Inner>,
    stats_port: u16,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Model {
    /// Opens a new client space on its own port pair: what opening `/dev/tpmrm0` gives a
    /// process. The space closes (its sessions flushed) when the endpoint is dropped.
    ///
    /// # Errors
    /// When no port pair can be bound.
    pub fn open(&self) -> Result<Endpoint, ModelError> {
        open_endpoint(&self.inner)
    }

    /// Every command sent to the TPM so far and every space's figures.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Every command sent to the TPM so far, all clients together.
    pub fn total(&self) -> Tally {
        lock(&self.inner.total).clone()
    }

    /// The stats port (127.0.0.1), for readers in other processes.
    pub fn stats_port(&self) -> u16 {
        self.stats_port
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.inner.profile
    }

    /// The speed factor.
    pub fn speed(&self) -> f64 {
        self.inner.speed
    }

    /// swtpm's data port.
    pub fn upstream(&self) -> u16 {
        self.inner.upstream
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        lock(&self.inner.owned).clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One client space: a port pair and the resource manager's state for it. Closed on drop.
#[derive(Debug)]
pub struct Endpoint {
    space: Arc<Space>,
    inner: Arc<Inner>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    _claim: nix::fcntl::Flock<std::fs::File>,
}

impl Endpoint {
    /// The TCTI that reaches the TPM through this space.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.space.port)
    }

    /// The data port (the control port is the next one).
    pub fn port(&self) -> u16 {
        self.space.port
    }

    /// The space's number in [`Stats::spaces`].
    pub fn id(&self) -> u64 {
        self.space.id
    }

    /// The space's figures so far.
    pub fn stats(&self) -> SpaceStats {
        self.space.stats()
    }

    /// Closes the space and opens a fresh one on the same ports, as when the process that
    /// held `/dev/tpmrm0` open exits and the next one opens it (a daemon restart). swtpm's
    /// TCTI opens a connection per command, so the model cannot see a client close its TCTI:
    /// whoever restarts the client says so here.
    pub fn reopen(&self) {
        self.space.close(&self.inner);
        self.space.open.store(true, Ordering::Relaxed);
    }

    /// Closes the space now (sessions flushed); later commands run in a fresh one.
    pub fn close(&self) {
        self.space.close(&self.inner);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.space.close(&self.inner);
    }
}

/// What the model's threads share.
#[derive(Debug)]
struct Inner {
    device: Mutex<Device>,
    total: Arc<Mutex<Tally>>,
    spaces: Mutex<Vec<Arc<Space>>>,
    /// Endpoints opened through the stats port, kept until closed there or the model stops.
    owned: Mutex<Vec<Endpoint>>,
    next_id: AtomicU64,
    upstream: u16,
    slots: (usize, usize),
    profile: Profile,
    speed: f64,
}

impl Inner {
    fn stats(&self) -> Stats {
        let tpm = lock(&self.total).clone();
        let spaces = lock(&self.spaces).iter().map(|s| s.stats()).collect();
        Stats { tpm, spaces }
    }
}

/// A space and its counters.
#[derive(Debug)]
struct Space {
    id: u64,
    port: u16,
    open: AtomicBool,
    state: Mutex<SpaceState>,
    client: Mutex<Tally>,
    tpm: Mutex<Tally>,
    out_of_slots: AtomicU64,
    failed: AtomicU64,
    /// Objects and sessions held, refreshed after each command (read without waiting for one).
    held: Mutex<(usize, usize)>,
}

impl Space {
    fn stats(&self) -> SpaceStats {
        let (objects, sessions) = *lock(&self.held);
        SpaceStats {
            id: self.id,
            port: self.port,
            open: self.open.load(Ordering::Relaxed),
            client: lock(&self.client).clone(),
            tpm: lock(&self.tpm).clone(),
            out_of_slots: self.out_of_slots.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            objects,
            sessions,
        }
    }

    /// Runs one client command (space lock, then the TPM: the kernel's order).
    fn execute(&self, inner: &Inner, cmd: &[u8]) -> Outcome {
        let mut state = lock(&self.state);
        let mut device = lock(&inner.device);
        self.open.store(true, Ordering::Relaxed);
        if let Ok(mut t) = self.client.lock() {
            t.add(wire::header(cmd).code, Duration::ZERO);
        }
        let outcome = state.execute(&mut device, cmd, &self.tpm);
        drop(device);
        if let Outcome::Fail(f) = &outcome {
            self.failed.fetch_add(1, Ordering::Relaxed);
            if *f == Failure::OutOfSlots {
                self.out_of_slots.fetch_add(1, Ordering::Relaxed);
            }
        }
        *lock(&self.held) = (state.objects(), state.sessions());
        outcome
    }

    fn close(&self, inner: &Inner) {
        let mut state = lock(&self.state);
        let mut device = lock(&inner.device);
        state.close(&mut device, &self.tpm);
        self.open.store(false, Ordering::Relaxed);
        *lock(&self.held) = (0, 0);
    }
}

/// Locks, taking the data of a poisoned lock (a panicked connection thread must not stop the
/// model).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn open_endpoint(inner: &Arc<Inner>) -> Result<Endpoint, ModelError> {
    let PortPair { port, data, ctrl, claim } = ports::claim_pair().map_err(ModelError::Bind)?;
    let space = Arc::new(Space {
        id: inner.next_id.fetch_add(1, Ordering::Relaxed),
        port,
        open: AtomicBool::new(true),
        state: Mutex::new(SpaceState::with_slots(inner.slots.0, inner.slots.1)),
        client: Mutex::new(Tally::default()),
        tpm: Mutex::new(Tally::default()),
        out_of_slots: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        held: Mutex::new((0, 0)),
    });
    lock(&inner.spaces).push(space.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let data_loop = {
        let (inner, space, stop) = (inner.clone(), space.clone(), stop.clone());
        std::thread::Builder::new()
            .name("model-data".into())
            .spawn(move || {
                accept_loop(data, &stop, move |c| serve_commands(c, &inner, &space));
            })
            .map_err(ModelError::Bind)?
    };
    let ctrl_loop = {
        let (stop, upstream) = (stop.clone(), inner.upstream + 1);
        std::thread::Builder::new()
            .name("model-ctrl".into())
            .spawn(move || accept_loop(ctrl, &stop, move |c| forward_blindly(c, upstream)))
            .map_err(ModelError::Bind)?
    };
    Ok(Endpoint { space, inner: inner.clone(), stop, threads: vec![data_loop, ctrl_loop], _claim: claim })
}

fn accept_loop(listener: TcpListener, stop: &AtomicBool, handle: impl Fn(TcpStream) + Send + Sync + 'static) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let handle = Arc::new(handle);
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let _ = conn.set_nonblocking(false);
                let handle = handle.clone();
                // Connection threads end when the peer closes.
                let _ = std::thread::Builder::new().name("model-conn".into()).spawn(move || handle(conn));
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

fn serve_commands(mut client: TcpStream, inner: &Inner, space: &Space) {
    let _ = client.set_nodelay(true);
    while let Ok(Some(cmd)) = wire::read_buffer(&mut client) {
        match space.execute(inner, &cmd) {
            Outcome::Reply(rsp) => {
                if wire::write_buffer(&mut client, &rsp).is_err() {
                    break;
                }
            }
            Outcome::Fail(_) => break,
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

fn forward_blindly(client: TcpStream, upstream: u16) {
    let Ok(tpm) = TcpStream::connect(("127.0.0.1", upstream)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(mut c_read), Ok(mut t_write)) = (client.try_clone(), tpm.try_clone()) else { return };
    let up = std::thread::spawn(move || {
        let _ = io::copy(&mut c_read, &mut t_write);
        let _ = t_write.shutdown(Shutdown::Write);
    });
    let (mut t_read, mut c_write) = (tpm, client);
    let _ = io::copy(&mut t_read, &mut c_write);
    let _ = c_write.shutdown(Shutdown::Write);
    let _ = up.join();
}

fn serve_stats(conn: TcpStream, inner: &Arc<Inner>) {
    let Ok(read) = conn.try_clone() else { return };
    let mut line = String::new();
    if BufReader::new(read).read_line(&mut line).is_err() {
        return;
    }
    let mut words = line.split_whitespace();
    let answer = match (words.next(), words.next().and_then(|w| w.parse::<u64>().ok())) {
        (Some("stats"), _) => inner.stats().to_json(),
        (Some("open"), _) => match open_endpoint(inner) {
            Ok(ep) => {
                let a = serde_json::json!({ "id": ep.id(), "port": ep.port(), "tcti": ep.tcti() });
                lock(&inner.owned).push(ep);
                a
            }
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        },
        (Some(verb @ ("close" | "reopen")), Some(id)) => {
            let mut owned = lock(&inner.owned);
            match owned.iter().position(|e| e.id() == id) {
                Some(i) if verb == "close" => {
                    drop(owned.remove(i));
                    serde_json::json!({ "closed": id })
                }
                Some(i) => {
                    owned[i].reopen();
                    serde_json::json!({ "reopened": id })
                }
                None => serde_json::json!({ "error": format!("no space {id} opened here") }),
            }
        }
        _ => serde_json::json!({ "error": "expected: stats | open | close ID | reopen ID" }),
    };
    let mut conn = conn;
    let _ = writeln!(conn, "{answer}");
}

/// Asks a model's stats port (in this or another process) one question (`stats`, `open`,
/// `close ID`, `reopen ID`).
///
/// # Errors
/// I/O errors and answers that are not JSON.
pub fn query(stats_port: u16, question: &str) -> io::Result<serde_json::Value> {
    let mut conn = TcpStream::connect(("127.0.0.1", stats_port))?;
    writeln!(conn, "{question}")?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
