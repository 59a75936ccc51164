//! `tpm-vaultd`: parses configuration, sets up logging, builds the runtime and runs the
//! daemon until SIGTERM or SIGINT. All logic lives in the library.

use std::process::ExitCode;

use clap::Parser;
use tpm_vault_daemon::config::{Args, Config, LogFormat};

/// Exit code for configuration errors (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match Config::load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tpm-vaultd: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if args.check_config {
        println!("configuration OK");
        return ExitCode::SUCCESS;
    }
    init_logging(config.log_format);
    // The TSS C library logs every TPM error response to stderr; the daemon reports errors itself.
    if std::env::var_os("TSS2_LOG").is_none() {
        std::env::set_var("TSS2_LOG", "all+NONE");
    }
    if nix::unistd::Uid::effective().is_root() && !config.simulator {
        tracing::warn!(
            "running as root: prefer the tpm-vault user (see systemd/tpm-vaultd.service)"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tpm-vaultd")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tpm-vaultd: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(tpm_vault_daemon::server::run(config, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "tpm-vaultd failed");
            eprintln!("tpm-vaultd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Plain => builder.with_ansi(false).without_time().init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
