//! A privileged caller (issue #31, item 3): in a process whose real and effective uid differ
//! (what a setuid-root program that loads the module looks like: `setresuid(nobody, 0, 0)`),
//! the module ignores `TPM_VAULT_PKCS11_CONFIG` (here a FIFO, which would hang a reader),
//! `TPM_VAULT_SOCKET` (here the test daemon's socket, which it must not reach) and
//! `TPM_VAULT_PKCS11_DEBUG` (nothing on stderr), and it refuses to sign while the uids differ
//! (`CKR_FUNCTION_FAILED`), with a key found before, and signs again once they are equal.
//!
//! Needs root (CI runs the tests as root); prints SKIPPED otherwise. Each case runs in a forked
//! child that loads the module afresh (the test process never initializes it).

#![allow(unsafe_code)]

mod p11;
mod support;

use std::os::unix::io::AsRawFd as _;
use std::ptr;

use cryptoki_sys::*;
use p11::{in_child, Module};
use sha2::Digest as _;
use support::NOBODY;

/// The module's function list, without touching the environment.
fn module() -> Module {
    let mut list: *mut CK_FUNCTION_LIST = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let rv = unsafe { tpm_vault_pkcs11::entry::C_GetFunctionList(&mut list) };
    assert_eq!(rv, CKR_OK);
    // SAFETY: the module returns a pointer to its static function list.
    Module { f: unsafe { &*list } }
}

/// Real uid `real`, effective and saved uid 0.
fn set_real_uid(real: u32) -> Result<(), String> {
    // SAFETY: a plain system call.
    if unsafe { libc::setresuid(real, 0, 0) } != 0 {
        return Err(format!("setresuid({real}, 0, 0)"));
    }
    Ok(())
}

#[test]
fn a_setuid_caller_ignores_the_environment_and_cannot_sign() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to make the real and effective uid differ (setresuid)");
        return;
    }
    if std::path::Path::new(tpm_vault_pkcs11_default_config()).exists() {
        eprintln!("SKIPPED: {} exists on this machine; the test needs the defaults", tpm_vault_pkcs11_default_config());
        return;
    }
    let d = support::Daemon::start();
    d.create_key("web", "ecc-p256");
    let fifo = d.path().join("config.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let stderr_file = d.path().join("child.stderr");

    // 1. The environment points at a FIFO config and the test daemon, and asks for debug output.
    let (_, code, message) = in_child(|| {
        // A hang (a FIFO opened for reading) ends the child with SIGALRM.
        // SAFETY: plain system calls; the file is ours.
        unsafe { libc::alarm(30) };
        let err = std::fs::File::create(&stderr_file).map_err(|e| e.to_string())?;
        // SAFETY: both descriptors are valid.
        unsafe { libc::dup2(err.as_raw_fd(), 2) };
        std::env::set_var("TPM_VAULT_PKCS11_CONFIG", &fifo);
        std::env::set_var("TPM_VAULT_SOCKET", &d.socket);
        std::env::set_var("TPM_VAULT_PKCS11_DEBUG", "1");
        set_real_uid(NOBODY)?;
        let m = module();
        m.initialize().map_err(|rv| format!("C_Initialize: {rv:#x} (the FIFO config was read?)"))?;
        let session = m.open_session().map_err(|rv| format!("C_OpenSession: {rv:#x}"))?;
        match m.find(session, &[]) {
            Err(CKR_DEVICE_ERROR) => Ok(()),
            Ok(found) => Err(format!("found {} objects: TPM_VAULT_SOCKET was followed", found.len())),
            Err(rv) => {
                Err(format!("C_FindObjectsInit: {rv:#x}, expected CKR_DEVICE_ERROR (no daemon on the default socket)"))
            }
        }
    });
    assert_eq!(code, 0, "environment in a setuid process: {message}");
    let printed = std::fs::read_to_string(&stderr_file).unwrap_or_default();
    assert!(!printed.contains("tpm-vault-pkcs11"), "debug output in a setuid process:\n{printed}");

    // 2. Found as root, the key cannot sign while the real uid is nobody's.
    let config = d.path().join("pkcs11.toml");
    std::fs::write(&config, "").expect("pkcs11.toml");
    let (_, code, message) = in_child(|| {
        std::env::set_var("TPM_VAULT_PKCS11_CONFIG", &config);
        std::env::set_var("TPM_VAULT_SOCKET", &d.socket);
        let m = module();
        m.initialize().map_err(|rv| format!("C_Initialize: {rv:#x}"))?;
        let session = m.open_session().map_err(|rv| format!("C_OpenSession: {rv:#x}"))?;
        let key = m.find_one(session, CKO_PRIVATE_KEY, "web").map_err(|rv| format!("find web: {rv:#x}"))?;
        let digest = sha2::Sha256::digest(b"setuid").to_vec();
        m.sign(session, CKM_ECDSA, key, &digest).map_err(|rv| format!("sign as root: {rv:#x}"))?;
        set_real_uid(NOBODY)?;
        match m.sign(session, CKM_ECDSA, key, &digest) {
            Err(CKR_FUNCTION_FAILED) => {}
            other => {
                return Err(format!(
                    "sign with real uid {NOBODY}, effective 0: {other:?}, expected CKR_FUNCTION_FAILED"
                ))
            }
        }
        set_real_uid(0)?;
        m.sign(session, CKM_ECDSA, key, &digest).map_err(|rv| format!("sign as root again: {rv:#x}"))?;
        Ok(())
    });
    assert_eq!(code, 0, "signing in a setuid process: {message}\n--- daemon ---\n{}", d.stderr());
}

/// The module's default config file.
fn tpm_vault_pkcs11_default_config() -> &'static str {
    "/etc/tpm-vault/pkcs11.toml"
}
