//! The binaries a run measures, built by cargo with this benchmark's profile from the same
//! source as the library it links (so every path measured is the same code): `tpm-vaultd`,
//! the `tpm-vault` CLI and the client's examples, the PKCS#11 module; and the workspace they are
//! built in.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context as _, Result};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

/// The workspace this benchmark was built from (where `docs/` lives).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    match manifest.parent() {
        Some(root) if root.join("Cargo.toml").exists() => root.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// `cargo build ARGS` in `workspace` with this benchmark's profile; why it failed, if it did.
fn cargo_build(workspace: &Path, args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut build = Command::new(cargo);
    build.close_inherited_fds();
    build.arg("build").args(args).current_dir(workspace);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    match build.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("exited with {s}")),
        Err(e) => Err(e.to_string()),
    }
}

/// `relative` next to this executable (where cargo puts what it builds with the same profile).
fn beside_this_executable(relative: &Path) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    Ok(exe.parent().context("this executable has no parent directory")?.join(relative))
}

/// Finds the daemon binary. Unless one is given, runs `cargo build` for it with this
/// benchmark's profile first, so the daemon measured is built from the same source as the
/// library measured; falls back to an existing binary (with a note) if that build fails.
pub fn daemon(explicit: Option<&Path>, workspace: &Path, notes: &mut Vec<String>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        ensure!(p.is_file(), "--daemon {}: no such file", p.display());
        return Ok(p.to_owned());
    }
    let candidate = beside_this_executable(Path::new("tpm-vaultd"))?;
    eprintln!("[setup] building tpm-vaultd (cargo build -p tpm-vault-daemon)");
    if let Err(why) = cargo_build(workspace, &["-p", "tpm-vault-daemon", "--bin", "tpm-vaultd"]) {
        if !candidate.is_file() {
            bail!(
                "cannot build tpm-vaultd ({why}) and there is none at {}; build it or pass --daemon",
                candidate.display()
            );
        }
        let note = format!(
            "`cargo build` of tpm-vaultd failed ({why}); measured the existing {} instead",
            candidate.display()
        );
        eprintln!("warning: {note}");
        notes.push(note);
    }
    ensure!(
        candidate.is_file(),
        "tpm-vaultd is not at {} after the build (CARGO_TARGET_DIR changed?); pass --daemon",
        candidate.display()
    );
    Ok(candidate)
}

/// A binary of a client-side crate (`-p tpm-vault-cli --bin tpm-vault`, `-p tpm-vault-client
/// --example tls_server`): `cargo build` with this benchmark's profile, so it is built from the
/// same source as what else is measured; `relative` is its path next to this executable.
pub fn client(workspace: &Path, package: &str, target: &[&str], relative: &Path) -> Result<PathBuf> {
    let candidate = beside_this_executable(relative)?;
    let built = cargo_build(workspace, &[&["-p", package], target].concat()).is_ok();
    ensure!(
        candidate.is_file(),
        "{} is not at {} (cargo build {}); build it with `cargo build -p {package} {}`",
        relative.display(),
        candidate.display(),
        if built { "succeeded" } else { "failed" },
        target.join(" ")
    );
    Ok(candidate)
}

/// The PKCS#11 module (`libtpm_vault_pkcs11.so`), built like the rest.
pub fn pkcs11_module(workspace: &Path) -> Result<PathBuf> {
    let candidate = beside_this_executable(Path::new("libtpm_vault_pkcs11.so"))?;
    let built = cargo_build(workspace, &["-p", "tpm-vault-pkcs11"]).is_ok();
    ensure!(
        candidate.is_file(),
        "the PKCS#11 module is not at {} (cargo build {}); build it with `cargo build -p tpm-vault-pkcs11`",
        candidate.display(),
        if built { "succeeded" } else { "failed" }
    );
    Ok(candidate)
}
