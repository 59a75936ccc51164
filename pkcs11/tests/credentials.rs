//! The module follows the caller's credentials (issue #31, item 2). The daemon fixes a
//! connection's identity when it is made, so a connection made as root must never serve a
//! process that became someone else:
//!
//! - a forked child that drops to `nobody` (as nginx's workers do) holds no descriptor connected
//!   to the daemon's socket, and no epoll instance of the module's runtime, before it calls the
//!   module at all; then it signs as nobody where nobody may and is refused where it may not;
//! - a process that connected as root and then calls `setresuid` without forking (OpenVPN's
//!   `--user`, stunnel's `setuid=`) signs as the new uid, is refused where that uid may not, and
//!   the daemon's audit log records both under uid 65534 and that process's pid.
//!
//! Needs root (CI runs the tests as root); prints SKIPPED otherwise. One test function: the
//! module's state is per process.

#![allow(unsafe_code)]

mod p11;
mod support;

use std::time::Duration;

use cryptoki_sys::*;
use p11::{in_child, Module};
use sha2::Digest as _;
use support::NOBODY;

fn policy() -> String {
    format!(
        "[[rule]]\nname = \"root\"\nclients = [\"uid:0\", \"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n\n\
         [[rule]]\nname = \"nobody-signs\"\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"nobody-ok\"]\noperations = [\"sign\", \"public\"]\n\n\
         [[rule]]\nname = \"nobody-reads\"\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"root-only\"]\noperations = [\"public\"]\n",
        nix::unistd::getuid().as_raw()
    )
}

/// Descriptors of this process that are Unix sockets connected to the daemon: their peer (the
/// process at the other end, SO_PEERCRED) is `daemon`. (The peer's address would not do: the
/// daemon binds its socket under a temporary name, then renames it into place.)
fn daemon_fds(daemon: u32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` is a valid out-buffer of `len` bytes.
        let rc = unsafe {
            libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
        };
        if rc == 0 && u32::try_from(cred.pid).is_ok_and(|p| p == daemon) {
            found.push(fd);
        }
    }
    found
}

/// Epoll instances open in this process.
fn epolls() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:[eventpoll]"))
        .count()
}

/// Drops every privilege to nobody: no supplementary groups, gid and uid 65534 (real, effective
/// and saved), as nginx's workers do.
fn become_nobody() -> Result<(), String> {
    // SAFETY: plain system calls.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err("setgroups".into());
        }
        if libc::setresgid(NOBODY, NOBODY, NOBODY) != 0 {
            return Err("setresgid".into());
        }
        if libc::setresuid(NOBODY, NOBODY, NOBODY) != 0 {
            return Err("setresuid".into());
        }
    }
    Ok(())
}

#[test]
fn connections_follow_fork_and_setuid() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to become nobody (setresuid); CI runs the tests as root");
        return;
    }
    let d = support::Daemon::start_with(&policy(), true);
    d.create_key("root-only", "ecc-p256");
    d.create_key("nobody-ok", "ecc-p256");
    d.open_to_nobody();
    let m = Module::load(&d);
    m.initialize().expect("C_Initialize");
    let session = m.open_session().expect("C_OpenSession");
    let root_only = m.find_one(session, CKO_PRIVATE_KEY, "root-only").expect("root-only");
    let nobody_ok = m.find_one(session, CKO_PRIVATE_KEY, "nobody-ok").expect("nobody-ok");
    let digest = sha2::Sha256::digest(b"who signs this?").to_vec();
    m.sign(session, CKM_ECDSA, root_only, &digest).expect("root signs with root-only");
    let daemon = d.proc.as_ref().expect("the daemon runs").pid();
    let parent_fds = daemon_fds(daemon);
    assert!(!parent_fds.is_empty(), "the check sees no connection to the daemon in the parent");
    let parent_epolls = epolls();

    // Fork, then drop to nobody: the inherited root connection is closed by the module's atfork
    // hook, before the child calls the module.
    let (_, code, message) = in_child(|| {
        become_nobody()?;
        let left = daemon_fds(daemon);
        if !left.is_empty() {
            return Err(format!("descriptors {left:?} still connected to the daemon after fork + setuid"));
        }
        if epolls() + 1 != parent_epolls {
            return Err(format!("{} epoll instances after fork, {parent_epolls} before", epolls()));
        }
        m.sign(session, CKM_ECDSA, nobody_ok, &digest).map_err(|rv| format!("nobody-ok as nobody: {rv:#x}"))?;
        match m.sign(session, CKM_ECDSA, root_only, &digest) {
            Err(CKR_FUNCTION_REJECTED) => Ok(()),
            other => Err(format!("root-only as nobody after fork: {other:?}, expected CKR_FUNCTION_REJECTED")),
        }
    });
    assert_eq!(code, 0, "fork + setuid: {message}\n--- daemon ---\n{}", d.stderr());

    // The same process connects as root, then becomes nobody without forking.
    let (pid, code, message) = in_child(|| {
        m.sign(session, CKM_ECDSA, root_only, &digest).map_err(|rv| format!("root-only as root: {rv:#x}"))?;
        become_nobody()?;
        match m.sign(session, CKM_ECDSA, root_only, &digest) {
            Err(CKR_FUNCTION_REJECTED) => {}
            Ok(_) => return Err("after setresuid(nobody) the process still signs as root".into()),
            Err(rv) => return Err(format!("root-only as nobody: {rv:#x}, expected CKR_FUNCTION_REJECTED")),
        }
        m.sign(session, CKM_ECDSA, nobody_ok, &digest).map_err(|rv| format!("nobody-ok as nobody: {rv:#x}"))?;
        let left = daemon_fds(daemon);
        if left.len() != 1 {
            return Err(format!("{} connections to the daemon after setuid, expected only nobody's", left.len()));
        }
        Ok(())
    });
    assert_eq!(code, 0, "setuid without fork: {message}\n--- daemon ---\n{}", d.stderr());

    // The audit log names nobody, and the second child's pid, for both of its decisions.
    let audit = d.audit_log.clone().expect("audit log");
    let has = |text: &str, key: &str, decision: &str| {
        text.lines().any(|l| {
            [
                "\"op\":\"sign\"",
                &format!("\"decision\":\"{decision}\""),
                &format!("\"uid\":{NOBODY},"),
                &format!("\"pid\":{pid},"),
                &format!("\"key\":\"{key}\""),
            ]
            .iter()
            .all(|w| l.contains(w))
        })
    };
    let deadline = std::time::Instant::now() + support::TIMEOUT;
    let mut text = String::new();
    while std::time::Instant::now() < deadline {
        text = std::fs::read_to_string(&audit).unwrap_or_default();
        if has(&text, "root-only", "deny") && has(&text, "nobody-ok", "allow") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(has(&text, "root-only", "deny"), "no denied sign of root-only by uid {NOBODY}:\n{text}");
    assert!(has(&text, "nobody-ok", "allow"), "no allowed sign of nobody-ok by uid {NOBODY}:\n{text}");
    // And root's own signatures still work in the parent.
    m.sign(session, CKM_ECDSA, root_only, &digest).expect("root signs with root-only again");
    m.finalize().expect("C_Finalize");
}
