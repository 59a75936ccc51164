//! The atfork hooks cover every session's lock (issue #31, item 7): while one thread hashes
//! 4 MiB blocks with `C_DigestUpdate` on a session (holding that session's lock for
//! milliseconds), the main thread forks 100 times; each child goes on with the same session.
//! A child that inherited the session locked would hang (it is killed by `alarm`, and the test
//! fails). No daemon is needed: digests are computed in the module.

#![allow(unsafe_code)]

mod p11;
mod support;

use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cryptoki_sys::*;
use p11::{ck, in_child, Module};

#[test]
fn a_child_never_inherits_a_locked_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("pkcs11.toml");
    std::fs::write(&config, "").expect("pkcs11.toml");
    std::env::set_var("TPM_VAULT_PKCS11_CONFIG", &config);
    std::env::set_var("TPM_VAULT_SOCKET", dir.path().join("none.sock"));
    let mut list: *mut CK_FUNCTION_LIST = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    ck(unsafe { tpm_vault_pkcs11::entry::C_GetFunctionList(&mut list) }).expect("C_GetFunctionList");
    // SAFETY: the module's static function list.
    let m = Module { f: unsafe { &*list } };
    m.initialize().expect("C_Initialize");
    let session = m.open_session().expect("C_OpenSession");
    let mut mech = CK_MECHANISM { mechanism: CKM_SHA256, pParameter: ptr::null_mut(), ulParameterLen: 0 };
    // SAFETY: the mechanism lives for the call.
    ck(unsafe { (m.f.C_DigestInit.expect("C_DigestInit"))(session, &mut mech) }).expect("C_DigestInit");

    let stop = Arc::new(AtomicBool::new(false));
    let hasher = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let block = vec![7u8; 4 << 20];
            let mut updates = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: `block` lives for the call.
                let rv = unsafe {
                    (m.f.C_DigestUpdate.expect("C_DigestUpdate"))(session, block.as_ptr() as *mut _, block.len() as _)
                };
                assert_eq!(rv, CKR_OK);
                updates += 1;
            }
            updates
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    for round in 0..100 {
        let (_, code, message) = in_child(|| {
            // SAFETY: a hang ends the child with SIGALRM.
            unsafe { libc::alarm(20) };
            let data = b"child";
            // SAFETY: `data` lives for the call.
            let rv = unsafe {
                (m.f.C_DigestUpdate.expect("C_DigestUpdate"))(session, data.as_ptr() as *mut _, data.len() as _)
            };
            if rv != CKR_OK {
                return Err(format!("C_DigestUpdate in the child: {rv:#x}"));
            }
            Ok(())
        });
        assert_eq!(code, 0, "round {round}: {message} (142: the child hung on the session's lock)");
    }
    stop.store(true, Ordering::Relaxed);
    let updates = hasher.join().expect("hasher thread");
    assert!(updates > 0, "the hashing thread never ran");
}
