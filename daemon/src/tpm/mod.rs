//! The TPM layer: one thread owns the ESAPI context; everyone else holds a [`TpmHandle`].
//!
//! Firmware TPMs execute one command at a time and every call crosses into the secure world,
//! so the vault funnels all TPM work through a single actor thread fed by a bounded queue,
//! served round-robin per client.
//! Async callers await a reply with a deadline, so a hung or vanished TPM becomes an
//! `Unavailable`/`Timeout` error, never a hung request. The parts, by what they are:
//! - [`actor`]: the thread and its deadlines ([`TpmHandle`]); [`queue`]: its queue, one FIFO
//!   per client served in turn, the client named by an opaque [`ClientKey`];
//! - [`connection`]: the connection, SRK, sessions, loaded objects and every command ([`Tpm`]);
//! - [`object`]: stored objects in and out of the TPM's marshalled form;
//! - [`templates`]: object templates; [`pcr`]: PCR reads, extends and policy digests;
//!   [`attest`]: quotes, the EK and credential activation;
//! - [`error`]: the response-code classification; [`convert`]: signature and public-key
//!   encoding; [`shared`]: the state and counters shared with the rest of the daemon;
//!   [`software`]: whether the TPM is a software TPM;
//! - [`simulator`]: a private swtpm process (machines without a TPM, and tests); [`spawn`]:
//!   child processes that inherit no TPM socket.
//!
//! It speaks the vault's own types (key algorithms, schemes, digests, stored objects) and
//! knows nothing of files or gRPC.

pub mod actor;
pub mod attest;
pub mod connection;
pub mod convert;
pub mod error;
pub mod object;
pub mod pcr;
pub mod queue;
pub mod shared;
pub mod simulator;
pub mod software;
pub mod spawn;
pub mod templates;

pub use actor::{QueueConfig, TpmHandle};
pub use connection::{ConnectionConfig, PolicyAuth, ResourceManager, SignJob};
pub use error::TpmError;
pub use object::KeyBlob;
pub use queue::ClientKey;
pub use shared::{DaState, TpmInfo, TpmState};
pub use software::SoftwareTpm;
