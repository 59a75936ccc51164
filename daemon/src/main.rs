//! `tpm-vaultd`: the daemon's process. Everything it does (command line, configuration,
//! logging, runtime, signals, exit codes) is in the library: `serve/app.rs`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    tpm_vault_daemon::daemon::main()
}
