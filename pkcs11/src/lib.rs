//! tpm-vault's PKCS#11 module, `libtpm_vault_pkcs11.so`: nginx, OpenSSL (libp11's engine),
//! GnuTLS, OpenSSH, `pkcs11-tool` and every other PKCS#11 program sign with the vault's
//! TPM-resident keys.
//!
//! The module is a thin client of `tpm-vaultd`: it holds no keys, no store and no TPM
//! connection of its own. Every signature is a `Sign` call on the daemon's Unix socket, made
//! under the calling process's uid, so the access policy and the audit log apply to every
//! program as to any other client. Messages are hashed in the caller's process; only digests
//! travel.
//!
//! Layout:
//! - [`entry`]: the C ABI (function list, pointer checks, the two-call convention);
//! - `token`: state, sessions, objects cache and every operation, in safe Rust;
//! - `objects`: the objects of a key and their attributes, and the per-process handle table;
//! - `mechanism`: mechanisms, input preparation (hashing, DigestInfo), signature encoding,
//!   in-core verification;
//! - `connection`: the connection to the daemon, one per process and credentials;
//! - `config`: socket and token label; `error`: the one table from daemon errors to `CKR_*`.
//!
//! Fork-safe: there are no module threads, handles come from a per-process table the child
//! inherits, a forked child closes the parent's connection and the connection is remade when
//! the caller's credentials change, and `pthread_atfork` hooks keep every lock of the module
//! (state, sessions, handle table, connection) consistent across `fork`. Thread-safe (`CKF_OS_LOCKING_OK`): sessions are
//! independent and no lock is held during a daemon call.
// The C ABI needs unsafe code: `entry` allows it; anywhere else it is refused unless the
// function that needs it (a libc call, a lock reset after fork) allows it by name.
#![deny(unsafe_code)]

mod config;
mod connection;
pub mod entry;
mod error;
mod mechanism;
mod objects;
mod token;

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether `TPM_VAULT_PKCS11_DEBUG` asked for messages on stderr.
static DEBUG: AtomicBool = AtomicBool::new(false);

/// Reads `TPM_VAULT_PKCS11_DEBUG` (any non-empty value but `0` turns messages on); never in a
/// secure-execution process (a setuid program's stderr is its caller's).
fn init_debug() {
    let on =
        !config::secure_execution() && std::env::var("TPM_VAULT_PKCS11_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0");
    DEBUG.store(on, Ordering::Relaxed);
}

/// Prints a message on stderr when debugging is on. Never prints secrets: callers pass only
/// names, codes and lengths.
fn debug(args: std::fmt::Arguments<'_>) {
    if DEBUG.load(Ordering::Relaxed) {
        eprintln!("tpm-vault-pkcs11[{}]: {args}", std::process::id());
    }
}

/// After `fork`, in the child: makes `lock` unlocked, with no waiters. The parent's threads that
/// were parked on it do not exist in the child, and parking_lot's `force_unlock` would hand the
/// lock to one of them (leaving it locked for good), so the child starts the lock afresh.
///
/// # Safety
/// Only in a `pthread_atfork` child hook, on a lock the prepare hook took on this thread.
#[allow(unsafe_code)]
unsafe fn reset_in_child<T: ?Sized>(lock: &parking_lot::Mutex<T>) {
    // parking_lot's `RawMutex` is one `AtomicU8` (its only field): 0 is unlocked, no waiters
    // (`RawMutex::INIT`).
    const _: () = assert!(std::mem::size_of::<parking_lot::RawMutex>() == 1);
    // SAFETY: a one-byte struct whose only field is an `AtomicU8` is that atomic; storing to it
    // is interior mutability. No other thread exists in the child; the data is left as it is.
    let state = &*(lock.raw() as *const parking_lot::RawMutex).cast::<std::sync::atomic::AtomicU8>();
    state.store(0, std::sync::atomic::Ordering::Release);
}
