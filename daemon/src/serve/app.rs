//! The `tpm-vaultd` process from start to exit: parses the command line and configuration,
//! answers `--check-config`, sets up logging, raises the descriptor limit, builds the runtime
//! and runs the daemon ([`super::server::run`]) until SIGTERM or SIGINT. `main.rs` only calls
//! [`main`].
//!
//! Exit codes: 0 after a clean shutdown (or a valid `--check-config`), 64 (EX_USAGE) for a bad
//! command line, environment, config file or policy directory (one line on stderr naming the
//! setting, file and line) or a state directory others could change (naming it), 1 when the
//! daemon cannot start or fails while serving.

use std::process::ExitCode;

use clap::Parser;

use crate::config::{Args, Config, LogFormat, PolicyCheck, ServeLimits};
use crate::observe::logwriter::{BatchedWriter, FlushGuard};
use crate::serve::fdlimit::{self, NoFile};
use crate::serve::server::{self, ServerError};

/// Exit code for configuration errors (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

/// Log filter without `RUST_LOG`. tss-esapi's own log lines (context open/close, every handle
/// flushed, raw response codes) duplicate what the daemon reports with context, as `TSS2_LOG`
/// does for the C library; `RUST_LOG=info,tss_esapi=debug` brings them back.
const DEFAULT_LOG_FILTER: &str = "info,tss_esapi=off";

/// The whole process: see the module docs. Returns the exit code.
pub fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        // --help and --version print to stdout and exit 0.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or("invalid arguments");
            eprintln!("tpm-vaultd: {}", first.trim_start_matches("error: "));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let (true, Some(user)) = (args.check_config, &args.user) {
        if let Some(code) = check_config_as(user) {
            return code;
        }
    }
    let config = match Config::load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tpm-vaultd: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if args.check_config {
        return check_config(&config);
    }
    // Before any thread exists: these read (and unset) process environment variables.
    let activated = match server::activated_listener() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tpm-vaultd: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The TSS C library logs every TPM error response to stderr; the daemon reports errors itself.
    if std::env::var_os("TSS2_LOG").is_none() {
        std::env::set_var("TSS2_LOG", "all+NONE");
    }
    // Flushes buffered log lines when main returns.
    let _log_guard = match init_logging(config.log_format) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("tpm-vaultd: cannot start the log thread: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut config = config;
    fit_descriptors(&mut config);
    let tpm = if config.simulator { "private swtpm" } else { config.tcti.as_str() };
    match &config.file {
        Some(file) => tracing::info!(config = %file.display(), tpm, "starting"),
        None => tracing::info!(tpm, "starting (no config file)"),
    }
    if nix::unistd::Uid::effective().is_root() && !config.simulator {
        tracing::warn!("running as root: prefer the tpm-vault user (see systemd/tpm-vaultd.service)");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads)
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
    let served = runtime.block_on(async {
        // Installed now, so a signal during start-up still gets the orderly shutdown.
        let shutdown = shutdown_signal().map_err(ServerError::Signals)?;
        server::run(config, activated, shutdown).await
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        // A policy or audit log that does not load, or an unsafe state directory, is a
        // configuration error, as with --check-config.
        Err(e) if e.is_config() => {
            tracing::error!(error = %e, "tpm-vaultd cannot start");
            eprintln!("tpm-vaultd: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            tracing::error!(error = %e, "tpm-vaultd failed");
            eprintln!("tpm-vaultd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-config`: the config already parsed; check the audit log can be opened and the state
/// directory can be trusted, load the policy directory as the daemon would, report, exit.
fn check_config(config: &Config) -> ExitCode {
    let file = config.file.as_ref().map_or_else(|| "defaults (no config file)".into(), |f| f.display().to_string());
    if let Some(Err(e)) = config.audit_log.as_deref().map(crate::config::check_audit_log) {
        eprintln!("tpm-vaultd: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    // As start-up checks it (exit 64 there too), judged for the user running the check.
    if let Err(e) = crate::config::check_state_dir(&config.state_dir) {
        eprintln!("tpm-vaultd: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    match crate::config::check_policies(&config.policies, config.policies_configured) {
        Ok(PolicyCheck { files, rules, warnings, builtin }) => {
            for warning in warnings {
                eprintln!("tpm-vaultd: warning: policy {warning} (a typo? the rule cannot match it)");
            }
            let dir = config.policies.display();
            let policies = if builtin {
                format!("no directory {dir}: the built-in default policy ({rules} rule(s)) is in force")
            } else if rules == 0 {
                format!("no rules in {dir} ({files} file(s)): every request will be denied")
            } else {
                format!("{rules} rule(s) in {files} file(s) in {dir}")
            };
            let who = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|u| u.name);
            let who = who.map(|name| format!(" (checked as user {name})")).unwrap_or_default();
            let descriptors = match fdlimit::planned() {
                Ok(nofile) => {
                    let fitted = fdlimit::fit(&config.limits, config.listen.is_some(), nofile.soft);
                    if let Some(warning) = &fitted.warning {
                        eprintln!("tpm-vaultd: warning: {warning}");
                    }
                    format!("; file descriptors: {}", describe(&nofile, &fitted.limits, config.listen.is_some()))
                }
                Err(e) => format!("; file descriptors: cannot read RLIMIT_NOFILE: {e}"),
            };
            println!("configuration OK: {file}; policies: {policies}{descriptors}{who}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tpm-vaultd: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and lowers the connection bounds that do
/// not fit in it (see `docs/CONFIG.md`, "File descriptors"), logging both.
fn fit_descriptors(config: &mut Config) {
    let nofile = match fdlimit::raise() {
        Ok(nofile) => nofile,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the soft RLIMIT_NOFILE to the hard limit");
            match fdlimit::planned() {
                Ok(planned) => NoFile { soft: planned.before, ..planned },
                Err(_) => return,
            }
        }
    };
    let tls = config.listen.is_some();
    let fitted = fdlimit::fit(&config.limits, tls, nofile.soft);
    if let Some(warning) = &fitted.warning {
        tracing::warn!("{warning}");
    }
    config.limits = fitted.limits;
    tracing::info!("file descriptors: {}", describe(&nofile, &config.limits, tls));
}

/// The limit and what it holds: `RLIMIT_NOFILE 1024 (hard limit 1024): connections 512 on the
/// Unix socket + 448 on the TLS listener + 64 reserved`.
fn describe(nofile: &NoFile, limits: &ServeLimits, tls: bool) -> String {
    let tls = if tls { format!(" + {} on the TLS listener", limits.tls_connections()) } else { String::new() };
    format!(
        "{nofile}: connections {} on the Unix socket{tls} + {} reserved",
        limits.max_connections,
        fdlimit::FD_RESERVE
    )
}

/// `--check-config --user NAME`: unless this process already runs as NAME, runs the same
/// command again as NAME (its uid and primary group; supplementary groups are not applied) and
/// returns its exit status. `None`: already NAME, check here.
fn check_config_as(name: &str) -> Option<ExitCode> {
    use std::os::unix::process::CommandExt;
    let user = match nix::unistd::User::from_name(name) {
        Ok(Some(user)) => user,
        Ok(None) => {
            eprintln!("tpm-vaultd: --user {name}: no such user");
            return Some(ExitCode::from(EXIT_CONFIG));
        }
        Err(e) => {
            eprintln!("tpm-vaultd: --user {name}: {e}");
            return Some(ExitCode::from(EXIT_CONFIG));
        }
    };
    if nix::unistd::geteuid() == user.uid {
        return None;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("tpm-vaultd: cannot find my own executable to check as {name}: {e}");
            return Some(ExitCode::FAILURE);
        }
    };
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .uid(user.uid.as_raw())
        .gid(user.gid.as_raw())
        .status();
    Some(match status {
        Ok(status) => status.code().and_then(|c| u8::try_from(c).ok()).map_or(ExitCode::FAILURE, ExitCode::from),
        Err(e) => {
            eprintln!("tpm-vaultd: cannot check as user {name} (needs root): {e}");
            ExitCode::FAILURE
        }
    })
}

/// Logs go to stderr (journald picks them up under systemd). `RUST_LOG` filters them
/// (e.g. `RUST_LOG=debug` or `RUST_LOG=info,audit=warn`); without it, [`DEFAULT_LOG_FILTER`].
fn init_logging(format: LogFormat) -> std::io::Result<FlushGuard> {
    let default = || tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER);
    let (filter, bad_filter) = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => match tracing_subscriber::EnvFilter::try_new(&spec) {
            Ok(f) => (f, None),
            Err(e) => (default(), Some(format!("{spec:?}: {e}"))),
        },
        _ => (default(), None),
    };
    // Logging (audit events included, one per request) is written in batches by a background
    // thread (`logwriter`), so a slow journal never sits on the request path: past its bounds
    // lines are dropped (ordinary ones first, audit lines only past a much larger bound),
    // counted and reported.
    // A failed write to stderr has nowhere to be reported.
    let (writer, guard) = BatchedWriter::start("log", std::io::stderr(), None)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Plain => builder.with_ansi(false).without_time().init(),
    }
    if let Some(why) = bad_filter {
        tracing::warn!("ignoring invalid RUST_LOG {why}; using {DEFAULT_LOG_FILTER}");
    }
    Ok(guard)
}

/// Installs the SIGTERM and SIGINT handlers; the future resolves at the first of either.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}
