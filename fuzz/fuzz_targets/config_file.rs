//! The daemon's config file (`/etc/tpm-vault/config.toml`): `toml::from_str::<FileConfig>` on
//! arbitrary UTF-8, then the whole of `Config::load` on the same text written to a file (its
//! error reporting with line and column, and the validation of the values).
//!
//! Properties: no panic; every rejection is one line (`tpm-vaultd` prints it to stderr and exits
//! 64); `Config::load` accepts nothing the TOML layer rejected.
#![no_main]

use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

use clap::Parser;
use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::daemon::{Args, Config, FileConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let parsed = toml::from_str::<FileConfig>(text);
    let Some((file, args)) = scratch() else { return };
    if rewrite(file, text).is_err() {
        return;
    }
    match Config::load(args) {
        Ok(c) => {
            assert!(parsed.is_ok(), "Config::load accepted what toml rejected");
            assert!(c.max_loaded_objects >= 2 && !c.tpm_timeout.is_zero() && !c.tcti.is_empty());
            assert!(c.metrics_listen.is_none_or(|a| a.ip().is_loopback()));
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "multi-line config error: {msg:?}");
        }
    }
});

/// The scratch file `Config::load` reads and the arguments naming it, made once per process.
/// The file is unlinked at once and named through `/proc/self/fd`, so nothing is left behind.
fn scratch() -> Option<&'static (std::fs::File, Args)> {
    static SCRATCH: OnceLock<Option<(std::fs::File, Args)>> = OnceLock::new();
    SCRATCH
        .get_or_init(|| {
            let dir = std::path::Path::new("/dev/shm");
            let dir = if dir.is_dir() { dir.to_owned() } else { std::env::temp_dir() };
            let path = dir.join(format!("tpm-vault-fuzz-config-{}.toml", std::process::id()));
            let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).ok()?;
            std::fs::remove_file(&path).ok()?;
            let fd = format!("/proc/self/fd/{}", file.as_raw_fd());
            let args = Args::try_parse_from(["tpm-vaultd", "--config", fd.as_str()]).ok()?;
            Some((file, args))
        })
        .as_ref()
}

fn rewrite(mut file: &std::fs::File, text: &str) -> std::io::Result<()> {
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(text.as_bytes())
}
