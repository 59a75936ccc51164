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

/// A TCG event log's UEFI_IMAGE_LOAD_EVENT of `file` on PciRoot(0x0)/Pci(0x1f,0x2).
pub fn image_load_event(file: &str) -> Vec<u8> {
    let mut path = vec![2, 1, 12, 0];
    path.extend_from_slice(&0x0a03_41d0u32.to_le_bytes());
    path.extend_from_slice(&0u32.to_le_bytes());
    path.extend_from_slice(&[1, 1, 6, 0, 2, 0x1f]);
    let file: Vec<u8> = format!("{file}\0").encode_utf16().flat_map(u16::to_le_bytes).collect();
    path.extend_from_slice(&[4, 4]);
    path.extend_from_slice(&((file.len() + 4) as u16).to_le_bytes());
    path.extend_from_slice(&file);
    path.extend_from_slice(&[0x7f, 0xff, 4, 0]);
    [
        &0x7e00_0000u64.to_le_bytes()[..],
        &0x2_0000u64.to_le_bytes(),
        &0u64.to_le_bytes(),
        &(path.len() as u64).to_le_bytes(),
        &path,
    ]
    .concat()
}
