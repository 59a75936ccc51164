//! The device: one swtpm behind one connection, one command at a time, each held for the
//! profile's time, counted.
//!
//! Whoever holds the [`Device`] (behind the model's mutex, as the kernel holds `tpm_mutex`)
//! owns the TPM: the resource manager's ContextLoad/ContextSave/FlushContext and the client's
//! command of one request run back to back, and every one of them pays the profile's time.
//! Also holds the command attributes (`TPM2_GetCapability(TPM_CAP_COMMANDS)`) the resource
//! manager reads handle counts from, queried once at start as the kernel does
//! (`tpm2_get_cc_attrs_tbl`).

use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::profile::{Profile, Work};
use crate::stats::Tally;
use crate::wire::{self, cc};

/// TPMA_CC.cHandles: bits 25-27.
const ATTR_CHANDLES_SHIFT: u32 = 25;
/// TPMA_CC.rHandle: bit 28.
const ATTR_RHANDLE: u32 = 1 << 28;
/// TPMA_CC.V (vendor command): bit 29.
const ATTR_VENDOR: u32 = 1 << 29;
/// TPM_CC_FIRST.
const CC_FIRST: u32 = 0x11F;
/// TPM_RC_INITIALIZE: the TPM needs TPM2_Startup.
const RC_INITIALIZE: u32 = 0x100;

/// How a command's handles are laid out, from its TPMA_CC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandAttrs {
    /// Handles in the command's handle area.
    pub handles: usize,
    /// The response carries a handle.
    pub response_handle: bool,
}

/// The TPM: the connection to swtpm, the profile and the counters of everything sent to it.
#[derive(Debug)]
pub struct Device {
    upstream: u16,
    conn: Option<TcpStream>,
    attrs: HashMap<u32, CommandAttrs>,
    profile: Profile,
    speed: f64,
    /// Every command sent, shared with readers that must not wait for the TPM.
    total: std::sync::Arc<Mutex<Tally>>,
    /// `TPM_MODEL_TRACE` is set: every command, its response code and time go to stderr.
    trace: bool,
}

impl Device {
    /// Connects to swtpm's data port `upstream` on 127.0.0.1 and reads the command attributes
    /// (starting the TPM first if it asks for it).
    ///
    /// # Errors
    /// When swtpm cannot be reached or answers the capability query with an error.
    pub fn open(upstream: u16, profile: Profile, speed: f64, total: std::sync::Arc<Mutex<Tally>>) -> io::Result<Self> {
        let trace = std::env::var_os("TPM_MODEL_TRACE").is_some();
        let mut dev = Self { upstream, conn: None, attrs: HashMap::new(), profile, speed, total, trace };
        dev.attrs = dev.read_attrs()?;
        Ok(dev)
    }

    /// The attributes of `code`, if the TPM implements it. As the kernel does, ContextSave and
    /// FlushContext count as having one handle (FlushContext's is a parameter, but it sits
    /// where a handle would and must be mapped like one).
    pub fn attrs(&self, code: u32) -> Option<CommandAttrs> {
        let mut a = *self.attrs.get(&code)?;
        if code == cc::CONTEXT_SAVE || code == cc::FLUSH_CONTEXT {
            a.handles = 1;
        }
        Some(a)
    }

    /// Sends `cmd`, waits for the response and holds the TPM until the profile's time for it
    /// has passed since the command was sent. Counts it in `space` and in the total.
    ///
    /// # Errors
    /// When swtpm cannot be reached (after one reconnect).
    pub fn execute(&mut self, cmd: &[u8], space: &Mutex<Tally>) -> io::Result<Vec<u8>> {
        let sent = Instant::now();
        let rsp = self.exchange(cmd)?;
        let code = wire::header(cmd).code;
        let handles = self.attrs(code).map_or(0, |a| a.handles);
        let hold = self.profile.time(Work::of(cmd, &rsp, handles), self.speed);
        let elapsed = sent.elapsed();
        if hold > elapsed {
            std::thread::sleep(hold - elapsed);
        }
        let took = sent.elapsed();
        if self.trace {
            eprintln!("tpm-model: {} -> {:#x} in {took:?}", wire::command_name(code), wire::header(&rsp).code);
        }
        if let Ok(mut t) = self.total.lock() {
            t.add(code, took);
        }
        if let Ok(mut t) = space.lock() {
            t.add(code, took);
        }
        Ok(rsp)
    }

    /// TPM2_ContextLoad of a saved context body (TPMS_CONTEXT); the loaded handle, or the
    /// TPM's response code.
    pub fn context_load(&mut self, context: &[u8], space: &Mutex<Tally>) -> io::Result<Result<u32, u32>> {
        let rsp = self.execute(&wire::command(wire::ST_NO_SESSIONS, cc::CONTEXT_LOAD, context), space)?;
        let rc = wire::header(&rsp).code;
        Ok(match wire::u32_at(&rsp, wire::HEADER) {
            Some(h) if rc == wire::RC_SUCCESS => Ok(h),
            _ => Err(if rc == wire::RC_SUCCESS { wire::RC_HANDLE } else { rc }),
        })
    }

    /// TPM2_ContextSave of `handle`; the saved context body (TPMS_CONTEXT), or the TPM's
    /// response code.
    pub fn context_save(&mut self, handle: u32, space: &Mutex<Tally>) -> io::Result<Result<Vec<u8>, u32>> {
        let rsp = self.execute(&wire::command(wire::ST_NO_SESSIONS, cc::CONTEXT_SAVE, &handle.to_be_bytes()), space)?;
        let rc = wire::header(&rsp).code;
        Ok(if rc == wire::RC_SUCCESS { Ok(rsp[wire::HEADER..].to_vec()) } else { Err(rc) })
    }

    /// TPM2_FlushContext of `handle`; the TPM's response code.
    pub fn flush(&mut self, handle: u32, space: &Mutex<Tally>) -> io::Result<u32> {
        let rsp =
            self.execute(&wire::command(wire::ST_NO_SESSIONS, cc::FLUSH_CONTEXT, &handle.to_be_bytes()), space)?;
        Ok(wire::header(&rsp).code)
    }

    /// One command and its response on the upstream connection; reconnects once when a kept
    /// connection turns out dead (swtpm restarted under the model).
    fn exchange(&mut self, cmd: &[u8]) -> io::Result<Vec<u8>> {
        for _ in 0..2 {
            let fresh = self.conn.is_none();
            if fresh {
                let c = TcpStream::connect(("127.0.0.1", self.upstream))?;
                let _ = c.set_nodelay(true);
                self.conn = Some(c);
            }
            let Some(conn) = self.conn.as_mut() else { continue };
            let result = wire::write_buffer(conn, cmd).and_then(|()| {
                wire::read_buffer(conn)?
                    .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "swtpm closed the connection"))
            });
            match result {
                Ok(rsp) => return Ok(rsp),
                Err(e) => {
                    self.conn = None;
                    if fresh {
                        return Err(e);
                    }
                }
            }
        }
        Err(io::Error::new(io::ErrorKind::NotConnected, "swtpm unreachable"))
    }

    /// TPM2_GetCapability(TPM_CAP_COMMANDS) over every command, uncounted and untimed (the
    /// kernel reads it when the driver starts, not on anyone's request).
    fn read_attrs(&mut self) -> io::Result<HashMap<u32, CommandAttrs>> {
        let mut attrs = HashMap::new();
        let mut first = CC_FIRST;
        let mut started = false;
        loop {
            let mut body = Vec::with_capacity(12);
            body.extend_from_slice(&wire::CAP_COMMANDS.to_be_bytes());
            body.extend_from_slice(&first.to_be_bytes());
            body.extend_from_slice(&256u32.to_be_bytes());
            let rsp = self.exchange(&wire::command(wire::ST_NO_SESSIONS, cc::GET_CAPABILITY, &body))?;
            let rc = wire::header(&rsp).code;
            if rc == RC_INITIALIZE && !started {
                // TPM2_Startup(TPM_SU_CLEAR), as the kernel's tpm2_auto_startup does.
                started = true;
                self.exchange(&wire::command(wire::ST_NO_SESSIONS, 0x144, &[0, 0]))?;
                continue;
            }
            if rc != wire::RC_SUCCESS {
                return Err(io::Error::other(format!("GetCapability(TPM_CAP_COMMANDS) failed: {rc:#x}")));
            }
            let more = rsp.get(wire::HEADER).copied().unwrap_or(0) != 0;
            let count = wire::u32_at(&rsp, wire::HEADER + 5).unwrap_or(0) as usize;
            let mut last = first;
            for i in 0..count {
                let Some(a) = wire::u32_at(&rsp, wire::HEADER + 9 + 4 * i) else { break };
                if a & ATTR_VENDOR != 0 {
                    continue;
                }
                let code = a & 0xFFFF;
                last = code;
                attrs.insert(
                    code,
                    CommandAttrs {
                        handles: ((a >> ATTR_CHANDLES_SHIFT) & 0x7) as usize,
                        response_handle: a & ATTR_RHANDLE != 0,
                    },
                );
            }
            if !more || count == 0 {
                break;
            }
            first = last + 1;
        }
        Ok(attrs)
    }

    /// How long the TPM is held for `work` (the profile's time at the model's speed).
    pub fn hold(&self, work: Work) -> Duration {
        self.profile.time(work, self.speed)
    }
}
