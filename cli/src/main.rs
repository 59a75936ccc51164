//! `tpm-vault`: the command line of tpm-vault. All logic is in the library (`tpm_vault_cli::cli`).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::process::ExitCode;

use clap::Parser;
use tpm_vault_cli::cli::{self, Cli};

fn main() -> ExitCode {
    let args = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tpm-vault: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(cli::run(args))
}
