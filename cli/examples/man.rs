//! Writes the man pages of `tpm-vault` and `tpm-vaultd` from their clap definitions
//! (clap_mangen): `tpm-vault.1`, one page per subcommand (`tpm-vault-key-create.1`, ...) and
//! `tpm-vaultd.1`, into `docs/man/` (or the directory given), which the Debian package ships
//! (`[package.metadata.deb]` of the daemon). `tests/man_pages.rs` fails when the committed
//! pages differ from what this renders; then run
//!
//!     cargo run -p tpm-vault-cli --example man
//!
//! The pages carry no date, so the output depends on the definitions only.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::CommandFactory;

/// Every page: file name and roff text.
pub fn render() -> std::io::Result<BTreeMap<String, Vec<u8>>> {
    let scratch = tempfile::tempdir()?;
    clap_mangen::generate_to(tpm_vault_cli::cli::Cli::command(), scratch.path())?;
    clap_mangen::generate_to(tpm_vault_daemon::daemon::Args::command(), scratch.path())?;
    let mut pages = BTreeMap::new();
    for entry in std::fs::read_dir(scratch.path())? {
        let entry = entry?;
        pages.insert(entry.file_name().to_string_lossy().into_owned(), std::fs::read(entry.path())?);
    }
    Ok(pages)
}

/// The committed pages' directory.
pub fn committed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/man")
}

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os().nth(1).map_or_else(committed_dir, PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    for old in std::fs::read_dir(&dir)? {
        let old = old?.path();
        if old.extension().is_some_and(|x| x == "1") {
            std::fs::remove_file(old)?;
        }
    }
    let pages = render()?;
    for (name, text) in &pages {
        std::fs::write(dir.join(name), text)?;
    }
    println!("{} man pages in {}", pages.len(), dir.display());
    Ok(())
}
