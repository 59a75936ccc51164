//! Child processes that inherit stdio and nothing else.
//!
//! libtss2's swtpm TCTI opens a fresh TCP socket for every TPM command, without close-on-exec.
//! A child spawned while a command is in flight would inherit that socket; swtpm serves one
//! connection at a time, so it would go on serving the child's copy after the vault moved to its
//! next socket, and the vault's TPM would hang until the child exits. Marking descriptors
//! close-on-exec *before* spawning is racy (another thread may open a socket in between), so
//! [`CloseInheritedFds`] does it in the child itself, between `fork` and `exec`.

use std::io;

/// Extension for `Command`s: the child keeps stdin/stdout/stderr and no other descriptor.
pub trait CloseInheritedFds {
    /// Marks every descriptor above 2 close-on-exec in the child, after its stdio is set up.
    fn close_inherited_fds(&mut self) -> &mut Self;
}

impl CloseInheritedFds for std::process::Command {
    fn close_inherited_fds(&mut self) -> &mut Self {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: the hook runs in the forked child and only makes raw syscalls
        // (close_range, fcntl), which are async-signal-safe and allocate nothing.
        #[allow(unsafe_code)]
        unsafe {
            self.pre_exec(cloexec_above_stdio)
        }
    }
}

impl CloseInheritedFds for tokio::process::Command {
    fn close_inherited_fds(&mut self) -> &mut Self {
        self.as_std_mut().close_inherited_fds();
        self
    }
}

/// Highest descriptor the fallback loop visits when `close_range` is unavailable (Linux < 5.11).
const FALLBACK_MAX_FD: libc::c_int = 65_536;

#[allow(unsafe_code)]
fn cloexec_above_stdio() -> io::Result<()> {
    // SAFETY: a raw syscall with integer arguments; it touches no memory of this process.
    let done = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if done == 0 {
        return Ok(());
    }
    for fd in 3..FALLBACK_MAX_FD {
        // SAFETY: fcntl on a number that may not be an open descriptor just fails with EBADF.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A descriptor opened without close-on-exec stays out of the child.
    #[test]
    fn the_child_sees_only_stdio() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let fd = file.as_raw_fd();
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).unwrap();
        let probe = format!("test -e /proc/self/fd/{fd} && echo inherited || echo closed");
        let plain = std::process::Command::new("sh").args(["-c", &probe]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&plain.stdout).trim(), "inherited", "the probe works");
        let clean = std::process::Command::new("sh").close_inherited_fds().args(["-c", &probe]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&clean.stdout).trim(), "closed");
    }
}
