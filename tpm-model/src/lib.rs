//! A TPM device model for the tests and the benchmark: what a TPM client meets on a device,
//! in front of one real swtpm.
//!
//! The vault is built for an NVIDIA Jetson Orin, whose firmware TPM sits behind the Linux
//! kernel's resource manager at `/dev/tpmrm0`. Two things there differ from a bare swtpm:
//! the resource manager (per open file 3 object slots and 3 session slots, every object and
//! session loaded before and saved after every command) and the TPM's speed (tens of
//! milliseconds a signature, not tenths). The model adds both between a TCTI speaking
//! swtpm's TCP protocol and a real swtpm, and counts every command:
//!
//! ```text
//!  client (swtpm TCTI) ──► Endpoint (a space: one open file of /dev/tpmrm0)
//!  client (swtpm TCTI) ──► Endpoint ──┐      resource manager, per space
//!                                     ├──► Device: one command at a time, each held for the
//!                                     │    profile's time, counted ──► swtpm
//!                 stats port (JSON) ──┘
//! ```
//!
//! # Layout
//! - [`space`]: the resource manager, re-done from the kernel's `tpm2-space.c`.
//! - [`device`]: the TPM itself: swtpm behind one connection, one command at a time, the
//!   profile's time, the command attributes the resource manager reads handle counts from.
//! - [`profile`]: device profiles (`orin-ftpm`, `dtpm-slb9670`, `none`) and the speed factor.
//! - [`server`]: the listeners ([`Model`], [`Endpoint`]) and the stats port.
//! - [`stats`]: counts by command code, per space and in all.
//! - [`wire`]: the TPM wire format, as far as the model reads it; [`ports`]: port pairs.
//!
//! # What a client sees, and where the model differs from the kernel
//! - **A space is an endpoint, not a TCP connection.** swtpm's TCTI (tpm2-tss `tcti-swtpm`)
//!   opens a new TCP connection for every command and closes it after the response, so a
//!   connection cannot stand for an open file. Each [`Endpoint`] has its own port pair and
//!   TCTI string and is one space; [`Endpoint::reopen`] (or dropping it) is the file being
//!   closed: its sessions are flushed and its objects dropped. The model cannot see a client
//!   drop its TCTI context and make a new one on the same string: on the kernel that new
//!   context would get a fresh space, here it finds the old one (the vault's daemon flushes
//!   leftover transient objects and sessions when it connects, so it ends up the same).
//! - **Running out of room.** swtpm (libtpms), like the TPM reference implementation, holds 3
//!   transient objects and 3 loaded sessions. A full space (3 objects) loaded for a command
//!   therefore fills the TPM, and a command that makes a fourth object fails *in the TPM* with
//!   `TPM_RC_OBJECT_MEMORY` (0x902; sessions: `TPM_RC_SESSION_MEMORY`, 0x903), which reaches
//!   the client as a TPM response, before the resource manager's own slot check. That check
//!   (`tpm2_map_response_header`) fires on TPMs with more room (and in tests that give spaces
//!   fewer slots, [`ModelBuilder::with_slots`]): the new object is flushed and the command
//!   fails.
//! - **A command the resource manager fails** (out of slots, a transient handle not of this
//!   space, saved contexts over a page) gets no response: the model closes the connection.
//!   The TCTI's receive then fails with `TSS2_TCTI_RC_IO_ERROR` (0xA000A), the code the device
//!   TCTI returns when `write()` fails with `-ENOMEM`/`-EINVAL`. In both cases ESYS reports
//!   that code and its context is left unusable (`_ESYS_STATE_INTERNALERROR`: every later call
//!   is `BAD_SEQUENCE`), so the client must make a new context. As in the kernel, every object
//!   and session loaded for the command is flushed (`tpm2_flush_space`): the space keeps the
//!   objects saved before the command, and its sessions are gone.
//! - **A saved object the TPM refuses to load** (swtpm was reset under the model) is dropped
//!   from the space and that one command fails; the kernel would keep failing every command
//!   of the file until it is reopened.
//! - Commands the TPM does not implement get `TPM_RC_COMMAND_CODE` with the resource
//!   manager's layer (0xB0143), as from the kernel.
//! - GetCapability(TPM_CAP_HANDLES) answers list only the space's own transient objects;
//!   session handles pass unfiltered, as in the kernel (so a client sees, and could flush,
//!   other clients' saved sessions there: the kernel does the same).
//! - The first virtual handle is 0x80FFFFFF, as in the kernel. tss-esapi 7 takes transient
//!   handles only up to 0x80FFFFFE (its `TPM2_TRANSIENT_LAST`): its `get_capability` for
//!   transient handles fails with `InvalidParam` while slot 0 holds an object, on
//!   `/dev/tpmrm0` as here.
//! - swtpm answers the first ECDSA signature of its life with `TPM_RC_RETRY` (ESYS resubmits
//!   it): a one-off, not a property of the model; measurements warm up first.
//! - `TPM_MODEL_TRACE=1` prints every command that reaches the TPM, its response code and time.
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]

pub mod device;
pub mod ports;
pub mod profile;
pub mod server;
pub mod space;
pub mod stats;
pub mod wire;

pub use profile::{Profile, Work};
pub use server::{query, Endpoint, Model, ModelBuilder, ModelError};
pub use space::{Failure, OBJECT_SLOTS, SESSION_SLOTS};
pub use stats::{SpaceStats, Stats, Tally};
