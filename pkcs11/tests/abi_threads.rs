//! The C ABI in this process (the crate's rlib, through `C_GetFunctionList`): 8 threads × 500
//! signatures through one `C_Initialize`, every one verified; children of `fork` that sign
//! with and without initializing again, with the parent's handles; a daemon that goes away
//! gives `CKR_DEVICE_ERROR` and the next call after it is back succeeds without
//! re-initializing. One test function: the module's state is per process.

#![allow(unsafe_code)]

mod p11;
mod support;

use std::sync::Arc;

use cryptoki_sys::*;
use p11::Module;
use p256::ecdsa::signature::hazmat::PrehashVerifier as _;
use sha2::Digest as _;

#[test]
fn threads_fork_and_reconnect() {
    let mut daemon = support::Daemon::start();
    daemon.create_key("web", "ecc-p256");
    let public = support::spki_der_of(&daemon.public_pem("web"), "pub");
    let vk = Arc::new(
        <p256::ecdsa::VerifyingKey as p256::pkcs8::DecodePublicKey>::from_public_key_der(&public).expect("P-256 key"),
    );
    let m = Module::load(&daemon);
    m.initialize().expect("C_Initialize");
    let session = m.open_session().expect("C_OpenSession");
    let key = m.find_one(session, CKO_PRIVATE_KEY, "web").expect("the private key");
    assert_eq!(key, m.find_one(session, CKO_PRIVATE_KEY, "web").expect("again"), "handles are stable");

    // 8 threads, each with its own session, 500 signatures each, all verified.
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let vk = Arc::clone(&vk);
            std::thread::spawn(move || {
                let session = m.open_session().expect("session");
                for i in 0..500u32 {
                    let message = format!("thread {t} signature {i}");
                    let digest = sha2::Sha256::digest(message.as_bytes());
                    let sig = m.sign(session, CKM_ECDSA, key, &digest).unwrap_or_else(|rv| panic!("C_Sign {rv:#x}"));
                    let sig = p256::ecdsa::Signature::from_slice(&sig).expect("r || s");
                    vk.verify_prehash(&digest, &sig).expect("a valid signature");
                }
                m.close_session(session).expect("close");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("signing thread");
    }

    // Forked children sign with the parent's handles: one initializes again (as libp11 does),
    // one goes on with the inherited session; each verifies and exits 0 only on success.
    for reinitialize in [true, false] {
        let digest = sha2::Sha256::digest(b"child");
        // SAFETY: the child only calls the module and async-signal-unsafe code that does not
        // depend on other threads' locks (the module's are consistent through its atfork hooks).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let ok = std::panic::catch_unwind(|| {
                let session = if reinitialize {
                    m.initialize().expect("C_Initialize in the child");
                    m.open_session().expect("session in the child")
                } else {
                    session
                };
                let sig = m.sign(session, CKM_ECDSA, key, &digest).expect("C_Sign in the child");
                let sig = p256::ecdsa::Signature::from_slice(&sig).expect("r || s");
                vk.verify_prehash(&digest, &sig).is_ok()
            });
            // SAFETY: leave without running the parent's test harness or destructors.
            unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child made above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child (re-init {reinitialize}) status {status}"
        );
        let sig = m.sign(session, CKM_ECDSA, key, &digest).expect("the parent still signs");
        vk.verify_prehash(&digest, &p256::ecdsa::Signature::from_slice(&sig).expect("r || s")).expect("valid");
    }

    // The daemon goes away: CKR_DEVICE_ERROR; it comes back: the same session signs again.
    daemon.stop();
    let digest = sha2::Sha256::digest(b"down");
    assert_eq!(m.sign(session, CKM_ECDSA, key, &digest), Err(CKR_DEVICE_ERROR));
    daemon.restart();
    let sig = m.sign(session, CKM_ECDSA, key, &digest).expect("signs after the daemon restarted");
    vk.verify_prehash(&digest, &p256::ecdsa::Signature::from_slice(&sig).expect("r || s")).expect("valid");
    m.finalize().expect("C_Finalize");
    assert_eq!(m.open_session(), Err(CKR_CRYPTOKI_NOT_INITIALIZED));
}
