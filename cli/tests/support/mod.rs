//! Test helpers of the CLI's tests: the daemon harness of the library's tests (the real daemon
//! over a per-test swtpm, `client/tests/support`, included here rather than copied) and the
//! `tpm-vault` binary run against it.
#![allow(dead_code, unused_imports, missing_docs)]

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use tpm_vault_daemon::harness::CloseInheritedFds as _;

#[path = "../../../client/tests/support/mod.rs"]
mod daemon;

pub use daemon::*;

/// The `tpm-vault` binary run against a test [`Daemon`].
pub trait DaemonCli {
    /// `tpm-vault --socket SOCKET ARGS...` with empty stdin.
    fn cli(&self, args: &[&str]) -> Output {
        self.cli_in(args, b"")
    }

    /// `tpm-vault --socket SOCKET ARGS...` with `stdin` as its standard input.
    fn cli_in(&self, args: &[&str], stdin: &[u8]) -> Output;
}

impl DaemonCli for Daemon {
    fn cli_in(&self, args: &[&str], stdin: &[u8]) -> Output {
        run_cli(&self.socket, args, stdin, self.dir.path())
    }
}

/// Runs the `tpm-vault` binary against `socket` in `cwd`, feeding `stdin` from a thread (so
/// large inputs cannot deadlock against a full stdout pipe).
pub fn run_cli(socket: &Path, args: &[&str], stdin: &[u8], cwd: &Path) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tpm-vault"))
        .close_inherited_fds()
        .arg("--socket")
        .arg(socket)
        .args(args)
        .current_dir(cwd)
        .env_remove("TPM_VAULT_SOCKET")
        .env_remove("TPM_VAULT_KEY_AUTH")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tpm-vault");
    let mut pipe = child.stdin.take().expect("stdin");
    let input = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        // The command may exit without reading everything (an error): a broken pipe is fine.
        let _ = pipe.write_all(&input);
    });
    let output = child.wait_with_output().expect("wait for tpm-vault");
    feeder.join().expect("stdin feeder");
    output
}
