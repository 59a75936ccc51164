//! One client's space: the Linux kernel's resource manager (`drivers/char/tpm/tpm2-space.c`)
//! for one open file of `/dev/tpmrm0`, re-done in Rust from what those functions do.
//!
//! - A space has [`OBJECT_SLOTS`] object slots and [`SESSION_SLOTS`] session slots
//!   (`context_tbl[3]`, `session_tbl[3]`). Between commands nothing of it is loaded in the
//!   TPM: objects are kept as saved contexts, sessions as saved contexts under their handles.
//! - Before each command (`tpm2_prepare_space` → `tpm2_load_space`) every saved object, then
//!   every saved session, is ContextLoaded; transient handles in the command's handle area
//!   (how many: the command's attributes, see [`crate::device`]) are virtual handles
//!   `0x80FFFFFF - i` mapped to the object in slot i (`tpm2_map_command`); an unknown virtual
//!   handle fails the command.
//! - After it (`tpm2_commit_space`): a new transient object in the response gets a free slot
//!   and its virtual handle, a new session a free session slot, and with none free the new
//!   object or session is flushed and the command fails (`tpm2_map_response_header`, the
//!   kernel's `-ENOMEM`, "out of slots"); `GetCapability(TPM_CAP_HANDLES)` answers keep only
//!   this space's transient handles, as virtual handles (`tpm2_map_response_body`); then every
//!   object is ContextSaved and flushed and every session ContextSaved (`tpm2_save_space`). An
//!   object or session the TPM no longer has (the client flushed it, a session ended) leaves
//!   its slot. Saved contexts must fit a page (4096 bytes) per kind, or the command fails.
//! - Any failure after the loads flushes whatever is loaded (`tpm2_flush_space`) and leaves
//!   the space as it was before the command.
//! - Closing the space flushes its sessions (`tpm2_del_space`); its objects are dropped.
//!
//! Where the model differs (documented in the crate root): a saved object the TPM refuses to
//! load (it was reset under the model) is dropped from the space and the command fails,
//! rather than failing every later command of that file as the kernel would.

use std::sync::Mutex;

use crate::device::Device;
use crate::stats::Tally;
use crate::wire::{self, cc};

/// Object slots per space (`ARRAY_SIZE(space->context_tbl)`).
pub const OBJECT_SLOTS: usize = 3;
/// Session slots per space (`ARRAY_SIZE(space->session_tbl)`).
pub const SESSION_SLOTS: usize = 3;
/// Bytes of saved contexts a space keeps per kind (`PAGE_SIZE`).
pub const CONTEXT_BUFFER: usize = 4096;

/// Why the resource manager failed a command (what `write()` would return).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No free object or session slot for what the command made (`-ENOMEM`).
    OutOfSlots,
    /// Saved contexts do not fit the space's buffer (`-ENOMEM`).
    OutOfBacking,
    /// A transient handle that is not one of this space's (`-EINVAL`), or a command too short
    /// for its handle area.
    Invalid,
    /// The TPM refused a context the space saved, or a response could not be mapped (`-EFAULT`).
    Fault,
    /// swtpm could not be reached.
    Upstream,
}

/// What becomes of a client's command.
#[derive(Debug)]
pub enum Outcome {
    /// Send this response.
    Reply(Vec<u8>),
    /// Fail the command as `write()` would (the model closes the connection).
    Fail(Failure),
}

/// A saved session: its handle (sessions keep their handle across save and load) and its
/// saved context.
#[derive(Debug, Clone)]
struct SavedSession {
    handle: u32,
    context: Vec<u8>,
}

/// The space between commands.
#[derive(Debug)]
pub struct SpaceState {
    objects: Vec<Option<Vec<u8>>>,
    sessions: Vec<Option<SavedSession>>,
}

impl Default for SpaceState {
    fn default() -> Self {
        Self::with_slots(OBJECT_SLOTS, SESSION_SLOTS)
    }
}

impl SpaceState {
    /// An empty space with `objects` object slots and `sessions` session slots (the kernel's
    /// are [`OBJECT_SLOTS`] and [`SESSION_SLOTS`]; tests take fewer to reach its own
    /// out-of-slots failure before the TPM runs out of memory).
    pub fn with_slots(objects: usize, sessions: usize) -> Self {
        Self { objects: vec![None; objects], sessions: vec![None; sessions] }
    }

    /// Objects saved now.
    pub fn objects(&self) -> usize {
        self.objects.iter().flatten().count()
    }

    /// Sessions held now.
    pub fn sessions(&self) -> usize {
        self.sessions.iter().flatten().count()
    }

    /// Runs one client command through the space on `dev`, counting the TPM's commands in
    /// `tally`.
    pub fn execute(&mut self, dev: &mut Device, cmd: &[u8], tally: &Mutex<Tally>) -> Outcome {
        let code = wire::header(cmd).code;
        let Some(attrs) = dev.attrs(code) else {
            // tpm_dev_transmit: a command the TPM does not implement gets a made-up answer.
            return Outcome::Reply(wire::error_response(wire::RESMGR_LAYER | wire::RC_COMMAND_CODE));
        };
        if cmd.len() < wire::HEADER + 4 * attrs.handles {
            return Outcome::Fail(Failure::Invalid);
        }
        let mut work = Work::new(self.objects.len(), self.sessions.len());
        if let Err(f) = self.load(dev, &mut work, tally) {
            return Outcome::Fail(f);
        }
        let mut cmd = cmd.to_vec();
        if let Err(f) = map_command(&work, &mut cmd, attrs.handles) {
            work.flush(dev, tally);
            return Outcome::Fail(f);
        }
        let mut rsp = match dev.execute(&cmd, tally) {
            Ok(r) => r,
            Err(_) => {
                work.flush(dev, tally);
                return Outcome::Fail(Failure::Upstream);
            }
        };
        match self.commit(dev, &mut work, code, attrs.response_handle, &mut rsp, tally) {
            Ok(()) => Outcome::Reply(rsp),
            Err(f) => {
                work.flush(dev, tally);
                Outcome::Fail(f)
            }
        }
    }

    /// Closes the space: flushes its sessions (their contexts would hold TPM session slots
    /// otherwise) and drops its objects.
    pub fn close(&mut self, dev: &mut Device, tally: &Mutex<Tally>) {
        for s in self.sessions.iter_mut() {
            if let Some(s) = s.take() {
                let _ = dev.flush(s.handle, tally);
            }
        }
        self.objects.iter_mut().for_each(|o| *o = None);
    }

    /// `tpm2_load_space`: ContextLoads every saved object, then every saved session.
    fn load(&mut self, dev: &mut Device, work: &mut Work, tally: &Mutex<Tally>) -> Result<(), Failure> {
        for i in 0..self.objects.len() {
            let Some(ctx) = &self.objects[i] else { continue };
            match dev.context_load(ctx, tally) {
                Ok(Ok(h)) => work.objects[i] = Slot::Loaded(h),
                Ok(Err(_)) => {
                    // The TPM no longer takes this context (reset under the model): drop it
                    // so the space stays usable, and fail the command.
                    self.objects[i] = None;
                    work.flush(dev, tally);
                    return Err(Failure::Fault);
                }
                Err(_) => {
                    work.flush(dev, tally);
                    return Err(Failure::Upstream);
                }
            }
        }
        for i in 0..self.sessions.len() {
            let Some(s) = &self.sessions[i] else { continue };
            match dev.context_load(&s.context, tally) {
                Ok(Ok(h)) if h == s.handle => work.sessions[i] = Some(h),
                // Restored to another handle: the kernel gives up on the command.
                Ok(Ok(_)) => {
                    work.flush(dev, tally);
                    return Err(Failure::Fault);
                }
                // Flushed or replayed outside the space: forget the session.
                Ok(Err(rc)) if wire::rc_value(rc) == wire::RC_HANDLE || rc == wire::RC_REFERENCE_H0 => {
                    self.sessions[i] = None;
                }
                Ok(Err(_)) => {
                    work.flush(dev, tally);
                    return Err(Failure::Fault);
                }
                Err(_) => {
                    work.flush(dev, tally);
                    return Err(Failure::Upstream);
                }
            }
        }
        Ok(())
    }

    /// `tpm2_commit_space`: maps the response, saves the space, and keeps it on success.
    // The slot index runs over two parallel tables (the work copy and the saved contexts).
    #[allow(clippy::needless_range_loop)]
    fn commit(
        &mut self,
        dev: &mut Device,
        work: &mut Work,
        code: u32,
        response_handle: bool,
        rsp: &mut Vec<u8>,
        tally: &Mutex<Tally>,
    ) -> Result<(), Failure> {
        let rc = wire::header(rsp).code;
        if rc == wire::RC_SUCCESS && response_handle {
            map_response_header(dev, work, rsp, tally)?;
        }
        if rc == wire::RC_SUCCESS && code == cc::GET_CAPABILITY {
            map_response_body(work, rsp)?;
        }
        // tpm2_save_space.
        let mut objects: Vec<Option<Vec<u8>>> = vec![None; self.objects.len()];
        let mut used = 0;
        for i in 0..self.objects.len() {
            let Slot::Loaded(h) = work.objects[i] else { continue };
            match dev.context_save(h, tally) {
                Ok(Ok(ctx)) => {
                    used += ctx.len();
                    if used > CONTEXT_BUFFER {
                        return Err(Failure::OutOfBacking);
                    }
                    objects[i] = Some(ctx);
                    let _ = dev.flush(h, tally);
                    work.objects[i] = Slot::Saved;
                }
                // Gone from the TPM (flushed by the client): the slot is free.
                Ok(Err(rc)) if rc == wire::RC_REFERENCE_H0 => work.objects[i] = Slot::Empty,
                Ok(Err(_)) => return Err(Failure::Fault),
                Err(_) => return Err(Failure::Upstream),
            }
        }
        let mut sessions: Vec<Option<SavedSession>> = vec![None; self.sessions.len()];
        let mut used = 0;
        for i in 0..self.sessions.len() {
            let Some(h) = work.sessions[i] else { continue };
            match dev.context_save(h, tally) {
                Ok(Ok(ctx)) => {
                    used += ctx.len();
                    if used > CONTEXT_BUFFER {
                        return Err(Failure::OutOfBacking);
                    }
                    sessions[i] = Some(SavedSession { handle: h, context: ctx });
                }
                // The session ended (continueSession clear, or flushed): forget it.
                Ok(Err(rc)) if rc == wire::RC_REFERENCE_H0 || wire::rc_value(rc) == wire::RC_HANDLE => {
                    work.sessions[i] = None;
                }
                Ok(Err(_)) => return Err(Failure::Fault),
                Err(_) => return Err(Failure::Upstream),
            }
        }
        self.objects = objects;
        self.sessions = sessions;
        Ok(())
    }
}

/// A slot of the work copy (the kernel's `context_tbl` entry: 0, a physical handle, or ~0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Slot {
    /// Free.
    #[default]
    Empty,
    /// Loaded in the TPM under this handle.
    Loaded(u32),
    /// Saved and flushed again.
    Saved,
}

/// The space while a command runs (the kernel's `chip->work_space`).
#[derive(Debug)]
struct Work {
    objects: Vec<Slot>,
    /// Session handles loaded or started in this command.
    sessions: Vec<Option<u32>>,
}

impl Work {
    fn new(objects: usize, sessions: usize) -> Self {
        Self { objects: vec![Slot::Empty; objects], sessions: vec![None; sessions] }
    }

    /// `tpm2_flush_space`: flushes every object still loaded and every session.
    fn flush(&mut self, dev: &mut Device, tally: &Mutex<Tally>) {
        for slot in self.objects.iter_mut() {
            if let Slot::Loaded(h) = *slot {
                let _ = dev.flush(h, tally);
                *slot = Slot::Saved;
            }
        }
        for s in self.sessions.iter_mut() {
            if let Some(h) = s.take() {
                let _ = dev.flush(h, tally);
            }
        }
    }
}

/// The virtual handle of slot `i`.
pub fn virtual_handle(i: usize) -> u32 {
    wire::HT_TRANSIENT | (0x00FF_FFFF - i as u32)
}

/// `tpm2_map_command`: virtual transient handles in the handle area → physical ones.
fn map_command(work: &Work, cmd: &mut [u8], handles: usize) -> Result<(), Failure> {
    for k in 0..handles {
        let at = wire::HEADER + 4 * k;
        let Some(h) = wire::u32_at(cmd, at) else { return Err(Failure::Invalid) };
        if h & 0xFF00_0000 != wire::HT_TRANSIENT {
            continue;
        }
        let i = (0x00FF_FFFF - (h & 0x00FF_FFFF)) as usize;
        match work.objects.get(i) {
            Some(Slot::Loaded(p)) => wire::put_u32(cmd, at, *p),
            _ => return Err(Failure::Invalid),
        }
    }
    Ok(())
}

/// `tpm2_map_response_header`: a new object gets a slot and its virtual handle, a new session
/// a session slot; with none free it is flushed and the command fails.
fn map_response_header(dev: &mut Device, work: &mut Work, rsp: &mut [u8], tally: &Mutex<Tally>) -> Result<(), Failure> {
    let Some(h) = wire::u32_at(rsp, wire::HEADER) else { return Err(Failure::Fault) };
    match h & 0xFF00_0000 {
        wire::HT_TRANSIENT => {
            if let Some(i) = work.objects.iter().position(|s| *s == Slot::Empty) {
                work.objects[i] = Slot::Loaded(h);
                wire::put_u32(rsp, wire::HEADER, virtual_handle(i));
                return Ok(());
            }
        }
        wire::HT_HMAC_SESSION | wire::HT_POLICY_SESSION => {
            if let Some(i) = work.sessions.iter().position(Option::is_none) {
                work.sessions[i] = Some(h);
                return Ok(());
            }
        }
        // Persistent, NV, permanent: not the space's business.
        _ => return Ok(()),
    }
    let _ = dev.flush(h, tally);
    Err(Failure::OutOfSlots)
}

/// `tpm2_map_response_body`: a GetCapability(TPM_CAP_HANDLES) answer keeps only this space's
/// transient handles (as virtual handles); other handle types pass.
fn map_response_body(work: &Work, rsp: &mut Vec<u8>) -> Result<(), Failure> {
    const AT: usize = wire::HEADER;
    if rsp.len() < AT + 9 {
        return Err(Failure::Fault);
    }
    if wire::u32_at(rsp, AT + 1) != Some(wire::CAP_HANDLES) {
        return Ok(());
    }
    let count = wire::u32_at(rsp, AT + 5).unwrap_or(0) as usize;
    if rsp.len() != AT + 9 + 4 * count {
        return Err(Failure::Fault);
    }
    let mut kept = Vec::with_capacity(count);
    for k in 0..count {
        let Some(h) = wire::u32_at(rsp, AT + 9 + 4 * k) else { break };
        if h & 0xFF00_0000 == wire::HT_TRANSIENT {
            if let Some(i) = work.objects.iter().position(|s| *s == Slot::Loaded(h)) {
                kept.push(virtual_handle(i));
            }
        } else {
            kept.push(h);
        }
    }
    rsp.truncate(AT + 9);
    for h in &kept {
        rsp.extend_from_slice(&h.to_be_bytes());
    }
    let len = rsp.len() as u32;
    wire::put_u32(rsp, 2, len);
    wire::put_u32(rsp, AT + 5, kept.len() as u32);
    Ok(())
}
