//! Daemon configuration: flags > environment > `/etc/tpm-vault/config.toml` > defaults.
//!
//! [`Args`] is what clap parses (flags and their environment variables); [`FileConfig`] is the
//! TOML file, where unknown fields are errors; [`Config`] is the validated result the rest of
//! the daemon uses. Nothing here touches the TPM or binds a socket. [`check_policies`] is what
//! `tpm-vaultd --check-config` runs on top of [`Config::load`]. Every setting is documented
//! field by field in `docs/CONFIG.md`; `systemd/config.toml` is the commented example.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use crate::auth::limits::KeygenLimit;
use crate::tpm::ResourceManager;
use crate::vault::LockoutConfig;

/// Default config file.
pub const DEFAULT_CONFIG: &str = "/etc/tpm-vault/config.toml";
/// Default TCTI.
pub const DEFAULT_TCTI: &str = "device:/dev/tpmrm0";
/// Where Linux exposes the firmware's measured-boot event log.
pub const DEFAULT_EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";
/// The kernel resource manager device whose absence selects the embedded simulator.
pub const TPM_DEVICE: &str = "/dev/tpmrm0";

/// `tpm-vaultd` command line. Every setting is also a config-file key and most an env var.
#[derive(Debug, Parser)]
#[command(name = "tpm-vaultd", version, about = "TPM 2.0 key vault daemon: non-extractable keys over gRPC")]
pub struct Args {
    /// Config file (TOML). A missing default file is fine; a missing explicit one is an error.
    #[arg(long, env = "TPM_VAULT_CONFIG")]
    pub config: Option<PathBuf>,
    /// tpm2-tss TCTI string, e.g. `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`.
    #[arg(long, env = "TPM_VAULT_TCTI")]
    pub tcti: Option<String>,
    /// Start a private swtpm under the state dir and use it (keys are NOT hardware-protected).
    /// Also the default when no TCTI is configured and /dev/tpmrm0 does not exist.
    #[arg(long, env = "TPM_VAULT_SIMULATOR")]
    pub simulator: bool,
    /// State directory (key records, SRK name, simulator state).
    #[arg(long, env = "TPM_VAULT_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Unix socket to serve gRPC on (mode 0660).
    #[arg(long, env = "TPM_VAULT_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Access-policy directory.
    #[arg(long, env = "TPM_VAULT_POLICIES")]
    pub policies: Option<PathBuf>,
    /// Also serve gRPC over TLS 1.3 on ADDR:PORT (server key in the TPM, client certs required).
    #[arg(long, env = "TPM_VAULT_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Vault key of the TLS listener's server certificate (its chain must be stored with it:
    /// `tpm-vault cert import` or `cert self-sign`). Required with `--listen`.
    #[arg(long, env = "TPM_VAULT_LISTEN_KEY")]
    pub listen_key: Option<String>,
    /// PEM file of the CA certificates that may issue TLS client certificates. Required with
    /// `--listen`.
    #[arg(long, env = "TPM_VAULT_LISTEN_CLIENT_CA")]
    pub listen_client_ca: Option<PathBuf>,
    /// Most TPM transient objects kept loaded, the SRK included (firmware TPMs may have 3).
    /// Without a resource manager only: behind /dev/tpmrm0 the daemon keeps one key loaded.
    #[arg(long)]
    pub max_loaded_objects: Option<usize>,
    /// The resource manager in front of the TPM: `auto` (from the TCTI: device:/dev/tpmrm* is
    /// the kernel's, tabrmd: tpm2-abrmd), `kernel`, `tabrmd` or `none`.
    #[arg(long, env = "TPM_VAULT_RESOURCE_MANAGER")]
    pub resource_manager: Option<ResourceManagerSetting>,
    /// Deadline of one TPM operation, queueing included, in milliseconds.
    #[arg(long)]
    pub tpm_timeout_ms: Option<u64>,
    /// How long SIGTERM waits for in-flight requests, in milliseconds.
    #[arg(long)]
    pub shutdown_grace_ms: Option<u64>,
    /// Threads serving gRPC (HTTP/2, access checks, in-core crypto). Default: half the CPUs,
    /// at least 1, at most 4; the TPM thread and the rest of the device keep the other half.
    #[arg(long, env = "TPM_VAULT_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Log format: `plain` (journald-friendly) or `json`.
    #[arg(long, env = "TPM_VAULT_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Serve Prometheus metrics over plain HTTP on this loopback ADDR:PORT (`GET /metrics`).
    #[arg(long, env = "TPM_VAULT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Seconds an unsealed data key stays in memory after its last use.
    #[arg(long)]
    pub datakey_idle_secs: Option<u64>,
    /// Also append every access decision as a JSON line to this file (mode 0600).
    #[arg(long, env = "TPM_VAULT_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,
    /// Connections the daemon takes on the Unix socket (and, separately, on the TLS listener).
    #[arg(long, env = "TPM_VAULT_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Connections one client uid may have open on the Unix socket.
    #[arg(long, env = "TPM_VAULT_MAX_CONNECTIONS_PER_CLIENT")]
    pub max_connections_per_client: Option<usize>,
    /// Requests (HTTP/2 streams) one connection may have open at once.
    #[arg(long, env = "TPM_VAULT_MAX_STREAMS_PER_CONNECTION")]
    pub max_streams_per_connection: Option<u32>,
    /// Wrong passwords each client may give for one key before its further attempts on that key
    /// wait (the dictionary-attack guard).
    #[arg(long)]
    pub da_free_failures_per_client: Option<u32>,
    /// Wrong passwords all clients together may give for one key before every attempt on it
    /// waits.
    #[arg(long)]
    pub da_free_failures_per_key: Option<u32>,
    /// First wait past a budget of wrong passwords, in milliseconds; doubles with each failure.
    #[arg(long)]
    pub da_delay_ms: Option<u64>,
    /// Longest wait between password attempts past a budget, in seconds.
    #[arg(long)]
    pub da_max_delay_secs: Option<u64>,
    /// Tries of the TPM's own dictionary-attack budget the vault never spends (0: none).
    #[arg(long)]
    pub da_tpm_reserve: Option<u32>,
    /// The measured-boot event log served by GetEventLog. Default:
    /// /sys/kernel/security/tpm0/binary_bios_measurements, none with the simulator; an empty
    /// value in the config file serves none.
    #[arg(long, env = "TPM_VAULT_EVENT_LOG")]
    pub event_log: Option<PathBuf>,
    /// Validate the configuration, the policy directory and the state directory's ownership and
    /// modes (as the user running the check: use --user), then exit (0 when valid, 64 when not).
    #[arg(long)]
    pub check_config: bool,
    /// With --check-config: check as this user (the one the service runs as, e.g. tpm-vault),
    /// so files only root may read are caught before the daemon fails on them. Needs root.
    #[arg(long, value_name = "NAME", requires = "check_config")]
    pub user: Option<String>,
}

/// The `resource_manager` setting: what stands between the daemon and the TPM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ResourceManagerSetting {
    /// From the TCTI string: device:/dev/tpmrm* is the kernel's, tabrmd: is tpm2-abrmd.
    Auto,
    /// The kernel's (`/dev/tpmrm0`, or a device model of it behind another TCTI).
    Kernel,
    /// tpm2-abrmd.
    Tabrmd,
    /// None: the daemon is the TPM's only user.
    None,
}

impl ResourceManagerSetting {
    /// The resource manager this setting means for `tcti`.
    pub fn resolve(self, tcti: &str) -> ResourceManager {
        match self {
            Self::Auto => ResourceManager::detect(tcti),
            Self::Kernel => ResourceManager::Kernel,
            Self::Tabrmd => ResourceManager::UserSpace,
            Self::None => ResourceManager::None,
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event, no colours or timestamps (journald adds them).
    Plain,
    /// One JSON object per event.
    Json,
}

/// `config.toml`. Every field is optional; unknown fields are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// See [`Args::tcti`].
    pub tcti: Option<String>,
    /// See [`Args::simulator`].
    pub simulator: Option<bool>,
    /// See [`Args::state_dir`].
    pub state_dir: Option<PathBuf>,
    /// See [`Args::socket`].
    pub socket: Option<PathBuf>,
    /// See [`Args::policies`].
    pub policies: Option<PathBuf>,
    /// See [`Args::listen`].
    pub listen: Option<SocketAddr>,
    /// See [`Args::listen_key`].
    pub listen_key: Option<String>,
    /// See [`Args::listen_client_ca`].
    pub listen_client_ca: Option<PathBuf>,
    /// CA pins of the TLS listener (file only): a PEM file of CAs → the client identities
    /// (globs) only those CAs may vouch for (see [`TlsListen::pins`]).
    pub listen_client_ca_pins: Option<std::collections::BTreeMap<PathBuf, Vec<String>>>,
    /// See [`Args::max_loaded_objects`].
    pub max_loaded_objects: Option<usize>,
    /// See [`Args::resource_manager`].
    pub resource_manager: Option<ResourceManagerSetting>,
    /// See [`Args::tpm_timeout_ms`].
    pub tpm_timeout_ms: Option<u64>,
    /// See [`Args::shutdown_grace_ms`].
    pub shutdown_grace_ms: Option<u64>,
    /// See [`Args::worker_threads`].
    pub worker_threads: Option<usize>,
    /// See [`Args::log_format`].
    pub log_format: Option<LogFormat>,
    /// See [`Args::metrics_listen`].
    pub metrics_listen: Option<SocketAddr>,
    /// See [`Args::audit_log`].
    pub audit_log: Option<PathBuf>,
    /// See [`Args::max_connections`].
    pub max_connections: Option<usize>,
    /// See [`Args::max_connections_per_client`].
    pub max_connections_per_client: Option<usize>,
    /// See [`Args::max_streams_per_connection`].
    pub max_streams_per_connection: Option<u32>,
    /// See [`Args::da_free_failures_per_client`].
    pub da_free_failures_per_client: Option<u32>,
    /// See [`Args::da_free_failures_per_key`].
    pub da_free_failures_per_key: Option<u32>,
    /// See [`Args::da_delay_ms`].
    pub da_delay_ms: Option<u64>,
    /// See [`Args::da_max_delay_secs`].
    pub da_max_delay_secs: Option<u64>,
    /// See [`Args::da_tpm_reserve`].
    pub da_tpm_reserve: Option<u32>,
    /// See [`Args::datakey_idle_secs`].
    pub datakey_idle_secs: Option<u64>,
    /// See [`Args::event_log`].
    pub event_log: Option<PathBuf>,
    /// RSA key creations (CreateKey) one client may make per minute (file only; see
    /// [`crate::auth::limits::KeygenLimit`]).
    pub rsa_keygen_per_minute: Option<u32>,
    /// RSA key creations one client may make at once before `rsa_keygen_per_minute` applies
    /// (file only).
    pub rsa_keygen_burst: Option<u32>,
}

/// Validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// TCTI (the simulator's is filled in when it starts).
    pub tcti: String,
    /// Run a private swtpm.
    pub simulator: bool,
    /// State directory.
    pub state_dir: PathBuf,
    /// Unix socket path.
    pub socket: PathBuf,
    /// Policy directory.
    pub policies: PathBuf,
    /// Whether `policies` was configured (flag, environment or file): a configured directory
    /// must exist, while a missing default one means the built-in default policy.
    pub policies_configured: bool,
    /// Optional TLS listener: address, server key and client CAs (all three or none).
    pub listen: Option<TlsListen>,
    /// Transient object budget.
    pub max_loaded_objects: usize,
    /// The resource manager setting (resolved against the final TCTI when the TPM is opened).
    pub resource_manager: ResourceManagerSetting,
    /// TPM operation deadline.
    pub tpm_timeout: Duration,
    /// Shutdown drain bound.
    pub shutdown_grace: Duration,
    /// Async runtime worker threads (gRPC serving).
    pub worker_threads: usize,
    /// Log format.
    pub log_format: LogFormat,
    /// Optional Prometheus endpoint; always a loopback address (see [`Config::load`]).
    pub metrics_listen: Option<SocketAddr>,
    /// Optional JSON-lines audit file.
    pub audit_log: Option<PathBuf>,
    /// Bounds on connections and streams, before authorization.
    pub limits: ServeLimits,
    /// The dictionary-attack guard on key passwords.
    pub lockout: LockoutConfig,
    /// The per-client quota of RSA key creations.
    pub keygen: KeygenLimit,
    /// Idle time after which an unsealed data key is dropped from memory.
    pub datakey_idle: Duration,
    /// The event log GetEventLog serves, if any.
    pub event_log: Option<PathBuf>,
    /// The config file that was read, if any (for `--check-config` and the startup log).
    pub file: Option<PathBuf>,
}

/// The TLS listener's settings ([`Args::listen`], [`Args::listen_key`],
/// [`Args::listen_client_ca`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListen {
    /// Address to bind.
    pub addr: SocketAddr,
    /// Vault key holding the server certificate.
    pub key: crate::model::KeyName,
    /// PEM file of the CAs trusted to issue client certificates (read at start).
    pub client_ca: PathBuf,
    /// CA pins: each a PEM file of CAs and the client identity globs only they may vouch for
    /// (`listen_client_ca_pins`; [`crate::serve::tls::TlsListener::with_pins`]).
    pub pins: Vec<(PathBuf, Vec<String>)>,
}

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML or has unknown/invalid fields.
    #[error("config file {}{}: {message}", path.display(), at.map(|(l, c)| format!(", line {l}, column {c}")).unwrap_or_default())]
    Parse {
        path: PathBuf,
        /// Line and column (1-based) of the offending text, when the parser knows it.
        at: Option<(usize, usize)>,
        /// Parser message (names the field for unknown or invalid fields).
        message: String,
    },
    /// The policy directory exists but cannot be read, or a policy file does not parse.
    #[error("policy {}: {reason}", path.display())]
    Policy {
        /// Directory or file at fault.
        path: PathBuf,
        /// Why (with the line when a file does not parse).
        reason: String,
    },
    /// The audit log file cannot be opened for appending (or its directory is missing).
    #[error("audit log {}: {reason}", path.display())]
    AuditLog {
        /// The configured file.
        path: PathBuf,
        reason: String,
    },
    /// The state directory (or one above or inside it) could be changed by others, or cannot be
    /// examined ([`check_state_dir`]).
    #[error(transparent)]
    StateDir(crate::store::StoreError),
    /// A value is out of range.
    #[error("invalid setting {field}: {reason}")]
    Invalid {
        /// Setting name.
        field: &'static str,
        reason: String,
    },
}

impl Config {
    /// Resolves flags, environment and file into a configuration.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, line or setting at fault.
    pub fn load(args: &Args) -> Result<Self, ConfigError> {
        let (file, file_path) = match &args.config {
            Some(path) => (read_file(path)?, Some(path.clone())),
            None if Path::new(DEFAULT_CONFIG).exists() => {
                (read_file(Path::new(DEFAULT_CONFIG))?, Some(PathBuf::from(DEFAULT_CONFIG)))
            }
            None => (FileConfig::default(), None),
        };
        let limits = ServeLimits::resolve(args, &file)?;
        let lockout = lockout_config(args, &file)?;
        let keygen = keygen_limit(&file)?;
        let tcti = args.tcti.clone().or(file.tcti);
        let simulator =
            args.simulator || file.simulator.unwrap_or(false) || (tcti.is_none() && !Path::new(TPM_DEVICE).exists());
        let max_loaded_objects = args.max_loaded_objects.or(file.max_loaded_objects).unwrap_or(3);
        if max_loaded_objects < 2 {
            return Err(ConfigError::Invalid {
                field: "max_loaded_objects",
                reason: "must be at least 2 (the SRK and one key)".into(),
            });
        }
        let tpm_timeout_ms = args.tpm_timeout_ms.or(file.tpm_timeout_ms).unwrap_or(10_000);
        if tpm_timeout_ms == 0 {
            return Err(ConfigError::Invalid { field: "tpm_timeout_ms", reason: "must be positive".into() });
        }
        let worker_threads = args.worker_threads.or(file.worker_threads).unwrap_or_else(default_worker_threads);
        if !(1..=MAX_WORKER_THREADS).contains(&worker_threads) {
            return Err(ConfigError::Invalid {
                field: "worker_threads",
                reason: format!("must be between 1 and {MAX_WORKER_THREADS}"),
            });
        }
        let metrics_listen = args.metrics_listen.or(file.metrics_listen);
        if let Some(addr) = metrics_listen {
            if !addr.ip().is_loopback() {
                return Err(ConfigError::Invalid {
                    field: "metrics_listen",
                    reason: format!(
                        "{addr} is not a loopback address: the endpoint has no authentication and \
                         reveals key usage; scrape it locally or through a proxy"
                    ),
                });
            }
        }
        let listen = match args.listen.or(file.listen) {
            None => None,
            Some(addr) => {
                let key = args.listen_key.clone().or(file.listen_key).ok_or_else(|| ConfigError::Invalid {
                    field: "listen_key",
                    reason: "required with listen: the vault key whose stored certificate the TLS listener serves"
                        .into(),
                })?;
                let key = crate::model::KeyName::try_from(key.as_str())
                    .map_err(|e| ConfigError::Invalid { field: "listen_key", reason: e.to_string() })?;
                let client_ca =
                    args.listen_client_ca.clone().or(file.listen_client_ca).ok_or_else(|| ConfigError::Invalid {
                        field: "listen_client_ca",
                        reason: "required with listen: client certificates are mandatory on the TLS listener".into(),
                    })?;
                let pins = file.listen_client_ca_pins.clone().unwrap_or_default().into_iter().collect::<Vec<_>>();
                if let Some((path, _)) =
                    pins.iter().find(|(_, globs)| globs.is_empty() || globs.iter().any(String::is_empty))
                {
                    return Err(ConfigError::Invalid {
                        field: "listen_client_ca_pins",
                        reason: format!("{}: name at least one non-empty identity glob", path.display()),
                    });
                }
                Some(TlsListen { addr, key, client_ca, pins })
            }
        };
        if tcti.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError::Invalid { field: "tcti", reason: "must not be empty".into() });
        }
        Ok(Self {
            tcti: tcti.unwrap_or_else(|| DEFAULT_TCTI.into()),
            simulator,
            state_dir: args.state_dir.clone().or(file.state_dir).unwrap_or_else(|| "/var/lib/tpm-vault".into()),
            socket: args.socket.clone().or(file.socket).unwrap_or_else(|| "/run/tpm-vault/vault.sock".into()),
            policies_configured: args.policies.is_some() || file.policies.is_some(),
            policies: args.policies.clone().or(file.policies).unwrap_or_else(|| "/etc/tpm-vault/policies".into()),
            listen,
            max_loaded_objects,
            resource_manager: args.resource_manager.or(file.resource_manager).unwrap_or(ResourceManagerSetting::Auto),
            tpm_timeout: Duration::from_millis(tpm_timeout_ms),
            shutdown_grace: Duration::from_millis(args.shutdown_grace_ms.or(file.shutdown_grace_ms).unwrap_or(10_000)),
            worker_threads,
            log_format: args.log_format.or(file.log_format).unwrap_or(LogFormat::Plain),
            metrics_listen,
            audit_log: args.audit_log.clone().or(file.audit_log),
            limits,
            lockout,
            keygen,
            datakey_idle: Duration::from_secs(args.datakey_idle_secs.or(file.datakey_idle_secs).unwrap_or(300)),
            event_log: match args.event_log.clone().or(file.event_log) {
                Some(path) if path.as_os_str().is_empty() => None,
                Some(path) => Some(path),
                None if simulator => None,
                None => Some(DEFAULT_EVENT_LOG.into()),
            },
            file: file_path,
        })
    }
}

/// Bounds on what a client may hold open, checked before any request is authorized (see
/// `docs/CONFIG.md` and [`crate::serve::bounds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections on the Unix socket in all, and on the TLS listener in all unless
    /// `max_tls_connections` says otherwise.
    pub max_connections: usize,
    /// Connections from one uid on the Unix socket.
    pub max_connections_per_client: usize,
    /// HTTP/2 streams (requests in progress) per connection.
    pub max_streams_per_connection: u32,
    /// Connections on the TLS listener when they differ from `max_connections`: not a setting,
    /// but what start-up leaves when the file-descriptor limit cannot hold both
    /// ([`crate::serve::fdlimit::fit`]).
    pub max_tls_connections: Option<usize>,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            max_connections_per_client: 128,
            max_streams_per_connection: 128,
            max_tls_connections: None,
        }
    }
}

impl ServeLimits {
    /// Connections the TLS listener takes at once.
    pub fn tls_connections(&self) -> usize {
        self.max_tls_connections.unwrap_or(self.max_connections)
    }

    fn resolve(args: &Args, file: &FileConfig) -> Result<Self, ConfigError> {
        let d = Self::default();
        let limits = Self {
            max_connections: args.max_connections.or(file.max_connections).unwrap_or(d.max_connections),
            max_connections_per_client: args
                .max_connections_per_client
                .or(file.max_connections_per_client)
                .unwrap_or(d.max_connections_per_client),
            max_streams_per_connection: args
                .max_streams_per_connection
                .or(file.max_streams_per_connection)
                .unwrap_or(d.max_streams_per_connection),
            max_tls_connections: None,
        };
        let invalid = |field, reason: &str| Err(ConfigError::Invalid { field, reason: reason.into() });
        if !(1..=65_536).contains(&limits.max_connections) {
            return invalid("max_connections", "must be 1 to 65536");
        }
        if !(1..=limits.max_connections).contains(&limits.max_connections_per_client) {
            return invalid("max_connections_per_client", "must be 1 to max_connections");
        }
        if !(1..=10_000).contains(&limits.max_streams_per_connection) {
            return invalid("max_streams_per_connection", "must be 1 to 10000");
        }
        Ok(limits)
    }
}

/// The per-client quota of RSA key creations (`rsa_keygen_per_minute`, `rsa_keygen_burst`), checked.
fn keygen_limit(file: &FileConfig) -> Result<KeygenLimit, ConfigError> {
    let d = KeygenLimit::default();
    let limit = KeygenLimit {
        per_minute: file.rsa_keygen_per_minute.unwrap_or(d.per_minute),
        burst: file.rsa_keygen_burst.unwrap_or(d.burst),
    };
    let invalid = |field, reason: &str| Err(ConfigError::Invalid { field, reason: reason.into() });
    if !(1..=60_000).contains(&limit.per_minute) {
        return invalid("rsa_keygen_per_minute", "must be 1 to 60000");
    }
    if !(1..=10_000).contains(&limit.burst) {
        return invalid("rsa_keygen_burst", "must be 1 to 10000");
    }
    Ok(limit)
}

/// The dictionary-attack guard's settings ([`crate::vault::lockout`]), checked.
fn lockout_config(args: &Args, file: &FileConfig) -> Result<LockoutConfig, ConfigError> {
    let d = LockoutConfig::default();
    let delay_ms = args.da_delay_ms.or(file.da_delay_ms).unwrap_or(1000);
    let max_delay_secs = args.da_max_delay_secs.or(file.da_max_delay_secs).unwrap_or(600);
    let invalid = |field, reason: &str| Err(ConfigError::Invalid { field, reason: reason.into() });
    if !(1..=3_600_000).contains(&delay_ms) {
        return invalid("da_delay_ms", "must be 1 to 3600000 (one hour)");
    }
    if !(1..=86_400).contains(&max_delay_secs) || max_delay_secs.saturating_mul(1000) < delay_ms {
        return invalid("da_max_delay_secs", "must be 1 to 86400 (a day) and at least da_delay_ms");
    }
    Ok(LockoutConfig {
        free_failures_per_client: args
            .da_free_failures_per_client
            .or(file.da_free_failures_per_client)
            .unwrap_or(d.free_failures_per_client),
        free_failures_per_key: args
            .da_free_failures_per_key
            .or(file.da_free_failures_per_key)
            .unwrap_or(d.free_failures_per_key),
        delay: Duration::from_millis(delay_ms),
        max_delay: Duration::from_secs(max_delay_secs),
        tpm_reserve: args.da_tpm_reserve.or(file.da_tpm_reserve).unwrap_or(d.tpm_reserve),
    })
}

/// Upper bound of [`Config::worker_threads`].
pub const MAX_WORKER_THREADS: usize = 256;

/// Default [`Config::worker_threads`]: half the CPUs this process may use, between 1 and 4.
///
/// Every request ends at the one TPM thread, so more serving threads add no TPM throughput;
/// what they add is cross-thread hand-offs (tokio's idle workers wake to steal each new task).
/// Measured on a 2-CPU machine (`docs/BENCHMARKS.md`, "Serving threads"), one worker instead of
/// two cut the daemon's CPU per GiB streamed by a third and raised 16-client signing; four cover
/// bulk streams from several clients on a larger device.
#[must_use]
pub fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 4))
}

/// What [`check_policies`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyCheck {
    /// Policy files read.
    pub files: usize,
    /// Rules they hold (0: every request will be denied).
    pub rules: usize,
    /// What loaded but is probably a mistake (users or groups the system does not know).
    pub warnings: Vec<String>,
    /// The default directory does not exist: the built-in default policy is in force.
    pub builtin: bool,
}

/// Checks the policy directory for `--check-config` with the same loader the daemon uses at
/// start ([`crate::auth::Policy::load`]), so the two can never disagree: the directory
/// must be readable and every `*.toml` file in it a valid policy.
///
/// # Errors
/// [`ConfigError::Policy`] naming the directory or the file, line and reason.
pub fn check_policies(dir: &Path, configured: bool) -> Result<PolicyCheck, ConfigError> {
    let policy = crate::auth::Policy::load(dir, configured)
        .map_err(|e| ConfigError::Policy { path: e.path, reason: e.reason })?;
    Ok(PolicyCheck {
        files: policy.files().len(),
        rules: policy.len(),
        warnings: policy.warnings().to_vec(),
        builtin: policy.is_builtin(),
    })
}

/// Checks, for `--check-config`, that the state directory `dir` can be trusted, as start-up
/// does (see `docs/CONFIG.md`, `state_dir`), as the current user, without creating it: one
/// that does not exist yet is judged by the directories above it.
///
/// # Errors
/// [`ConfigError::StateDir`] naming the directory at fault.
pub fn check_state_dir(dir: &Path) -> Result<(), ConfigError> {
    crate::store::check_state_dir_unchanged(dir).map_err(ConfigError::StateDir)
}

/// Checks, for `--check-config`, that the daemon will be able to open `path` as its audit log:
/// an existing file opens for appending (nothing is written), else its directory exists and
/// the file could be made there.
///
/// # Errors
/// [`ConfigError::AuditLog`] with the reason.
pub fn check_audit_log(path: &Path) -> Result<(), ConfigError> {
    let fail = |reason: String| ConfigError::AuditLog { path: path.to_owned(), reason };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Err(fail("is a directory".into())),
        Ok(_) => std::fs::OpenOptions::new().append(true).open(path).map(drop).map_err(|e| fail(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            match std::fs::metadata(dir) {
                Ok(meta) if meta.is_dir() => nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK)
                    .map_err(|e| fail(format!("cannot create the file in {}: {e}", dir.display()))),
                Ok(_) => Err(fail(format!("{} is not a directory", dir.display()))),
                Err(e) => Err(fail(format!("directory {}: {e}", dir.display()))),
            }
        }
        Err(e) => Err(fail(e.to_string())),
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        at: e.span().map(|s| line_col(&text, s.start)),
        message: e.message().trim().replace('\n', "; "),
    })
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["tpm-vaultd"];
        v.extend_from_slice(extra);
        Args::try_parse_from(v).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn flags_override_file_and_unknown_fields_fail() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "tcti = \"swtpm:host=127.0.0.1,port=1\"\nmax_loaded_objects = 5\n").ok();
        let p = path.to_string_lossy().to_string();
        let c = Config::load(&args(&["--config", &p, "--max-loaded-objects", "4"])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.max_loaded_objects, 4);
        assert_eq!(c.tcti, "swtpm:host=127.0.0.1,port=1");
        assert!(!c.simulator);
        // The resource manager: detected from the TCTI unless set.
        assert_eq!(c.resource_manager.resolve(&c.tcti), ResourceManager::None);
        assert_eq!(ResourceManagerSetting::Auto.resolve("device:/dev/tpmrm0"), ResourceManager::Kernel);
        assert_eq!(ResourceManagerSetting::Auto.resolve("device:/dev/tpm0"), ResourceManager::None);
        assert_eq!(ResourceManagerSetting::Auto.resolve("tabrmd:bus_type=session"), ResourceManager::UserSpace);
        std::fs::write(&path, "tcti = \"swtpm:host=127.0.0.1,port=1\"\nresource_manager = \"kernel\"\n").ok();
        let c = Config::load(&args(&["--config", &p])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.resource_manager.resolve(&c.tcti), ResourceManager::Kernel);
        let c = Config::load(&args(&["--config", &p, "--resource-manager", "none"])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.resource_manager.resolve(&c.tcti), ResourceManager::None);
        std::fs::write(&path, "tcti = \"x\"\nbogus = 1\n").ok();
        let err = Config::load(&args(&["--config", &p])).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("bogus") && err.contains("line 2"), "{err}");
        let missing = Config::load(&args(&["--config", "/nonexistent/c.toml"]));
        assert!(matches!(missing, Err(ConfigError::Read { .. })));
    }

    #[test]
    fn event_log_default_file_and_off() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.toml");
        let p = path.to_string_lossy().to_string();
        std::fs::write(&path, "tcti = \"swtpm:host=127.0.0.1,port=1\"\n").ok();
        let c = Config::load(&args(&["--config", &p])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.event_log, Some(PathBuf::from(DEFAULT_EVENT_LOG)));
        let c = Config::load(&args(&["--config", &p, "--simulator"])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.event_log, None, "the simulator has no firmware log");
        std::fs::write(&path, "tcti = \"x\"\nevent_log = \"/var/lib/log.bin\"\n").ok();
        let c = Config::load(&args(&["--config", &p])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.event_log, Some(PathBuf::from("/var/lib/log.bin")));
        let c = Config::load(&args(&["--config", &p, "--event-log", "/tmp/x"])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.event_log, Some(PathBuf::from("/tmp/x")), "the flag wins");
        std::fs::write(&path, "tcti = \"x\"\nevent_log = \"\"\n").ok();
        let c = Config::load(&args(&["--config", &p])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.event_log, None, "empty: off");
    }

    #[test]
    fn parse_errors_are_one_line_with_line_and_column() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "# comment\n\nsocket = \"/tmp/s\"\n  bogus_key = 1\n").ok();
        let p = path.to_string_lossy().to_string();
        let err = Config::load(&args(&["--config", &p])).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains("line 4, column 3"), "{err}");
        assert!(err.contains("unknown field `bogus_key`"), "{err}");
        std::fs::write(&path, "max_loaded_objects = \"many\"\n").ok();
        let err = Config::load(&args(&["--config", &p])).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("line 1") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn keygen_quota_default_file_and_bounds() {
        let d = Config::load(&args(&[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.keygen, KeygenLimit { per_minute: 60, burst: 30 });
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.toml");
        let p = path.to_string_lossy().to_string();
        std::fs::write(&path, "rsa_keygen_per_minute = 6\nrsa_keygen_burst = 2\n").ok();
        let c = Config::load(&args(&["--config", &p])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.keygen, KeygenLimit { per_minute: 6, burst: 2 });
        for (text, field) in
            [("rsa_keygen_per_minute = 0\n", "rsa_keygen_per_minute"), ("rsa_keygen_burst = 0\n", "rsa_keygen_burst")]
        {
            std::fs::write(&path, text).ok();
            let err = Config::load(&args(&["--config", &p]));
            assert!(matches!(err, Err(ConfigError::Invalid { field: f, .. }) if f == field), "{text}: {err:?}");
        }
    }

    #[test]
    fn lockout_keys_default_file_flag_and_bounds() {
        let d = Config::load(&args(&[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.lockout, LockoutConfig::default());
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.toml");
        let p = path.to_string_lossy().to_string();
        std::fs::write(
            &path,
            "da_free_failures_per_client = 5\nda_free_failures_per_key = 20\nda_delay_ms = 250\n\
             da_max_delay_secs = 60\nda_tpm_reserve = 4\n",
        )
        .ok();
        let c = Config::load(&args(&["--config", &p, "--da-tpm-reserve", "3"])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.lockout,
            LockoutConfig {
                free_failures_per_client: 5,
                free_failures_per_key: 20,
                delay: Duration::from_millis(250),
                max_delay: Duration::from_secs(60),
                tpm_reserve: 3,
            }
        );
        for (bad, field) in [
            (&["--da-delay-ms", "0"][..], "da_delay_ms"),
            (&["--da-max-delay-secs", "0"][..], "da_max_delay_secs"),
            (&["--da-delay-ms", "5000", "--da-max-delay-secs", "4"][..], "da_max_delay_secs"),
        ] {
            let err = Config::load(&args(bad));
            assert!(matches!(err, Err(ConfigError::Invalid { field: f, .. }) if f == field), "{bad:?}: {err:?}");
        }
    }

    #[test]
    fn worker_threads_default_and_bounds() {
        let d = Config::load(&args(&[])).map(|c| c.worker_threads).unwrap_or(0);
        assert_eq!(d, default_worker_threads());
        assert!((1..=4).contains(&d), "{d}");
        assert_eq!(Config::load(&args(&["--worker-threads", "3"])).map(|c| c.worker_threads).ok(), Some(3));
        for bad in ["0", "257"] {
            let err = Config::load(&args(&["--worker-threads", bad]));
            assert!(matches!(err, Err(ConfigError::Invalid { field: "worker_threads", .. })), "{err:?}");
        }
    }

    #[test]
    fn metrics_listen_must_be_loopback() {
        let ok = Config::load(&args(&["--metrics-listen", "127.0.0.1:9464"])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.metrics_listen.map(|a| a.port()), Some(9464));
        assert!(Config::load(&args(&["--metrics-listen", "[::1]:9464"])).is_ok());
        let err = Config::load(&args(&["--metrics-listen", "0.0.0.0:9464"]));
        assert!(matches!(err, Err(ConfigError::Invalid { field: "metrics_listen", .. })), "{err:?}");
    }

    #[test]
    fn listen_needs_a_key_and_client_cas() {
        let err = Config::load(&args(&["--listen", "127.0.0.1:8443"]));
        assert!(matches!(err, Err(ConfigError::Invalid { field: "listen_key", .. })), "{err:?}");
        let err = Config::load(&args(&["--listen", "127.0.0.1:8443", "--listen-key", "web"]));
        assert!(matches!(err, Err(ConfigError::Invalid { field: "listen_client_ca", .. })), "{err:?}");
        let err =
            Config::load(&args(&["--listen", "127.0.0.1:8443", "--listen-key", "../x", "--listen-client-ca", "a"]));
        assert!(matches!(err, Err(ConfigError::Invalid { field: "listen_key", .. })), "{err:?}");
        let ok = Config::load(&args(&[
            "--listen",
            "127.0.0.1:8443",
            "--listen-key",
            "web",
            "--listen-client-ca",
            "/ca.pem",
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        let tls = ok.listen.unwrap_or_else(|| panic!("no listener"));
        assert_eq!((tls.key.as_str(), tls.client_ca.as_path()), ("web", Path::new("/ca.pem")));
        assert!(Config::load(&args(&[])).map(|c| c.listen.is_none()).unwrap_or(false));
    }

    #[test]
    fn listen_client_ca_pins_from_the_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.toml");
        let p = path.to_string_lossy().to_string();
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:8443\"\nlisten_key = \"web\"\nlisten_client_ca = \"/all.pem\"\n\
             [listen_client_ca_pins]\n\"/team.pem\" = [\"CN=agent-*,O=Example\", \"spiffe://example.org/*\"]\n",
        )
        .ok();
        let c = Config::load(&args(&["--config", &p])).unwrap_or_else(|e| panic!("{e}"));
        let tls = c.listen.unwrap_or_else(|| panic!("no listener"));
        assert_eq!(
            tls.pins,
            vec![(
                PathBuf::from("/team.pem"),
                vec!["CN=agent-*,O=Example".to_owned(), "spiffe://example.org/*".to_owned()]
            )]
        );
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:8443\"\nlisten_key = \"web\"\nlisten_client_ca = \"/all.pem\"\n\
             [listen_client_ca_pins]\n\"/team.pem\" = []\n",
        )
        .ok();
        let err = Config::load(&args(&["--config", &p]));
        assert!(matches!(err, Err(ConfigError::Invalid { field: "listen_client_ca_pins", .. })), "{err:?}");
    }

    #[test]
    fn policy_dir_checks() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let missing = dir.path().join("none");
        let err = check_policies(&missing, true).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("none"), "{err}");
        std::fs::write(
            dir.path().join("a.toml"),
            "[[rule]]\nname = \"r\"\nclients = [\"uid:0\"]\nkeys = [\"*\"]\noperations = [\"sign\"]\n",
        )
        .ok();
        std::fs::write(dir.path().join("README.md"), "not a policy").ok();
        assert_eq!(
            check_policies(dir.path(), true).ok(),
            Some(PolicyCheck { files: 1, rules: 1, warnings: vec![], builtin: false })
        );
        std::fs::write(dir.path().join("b.toml"), "# nothing yet\n\n[[rule]\n").ok();
        let err = check_policies(dir.path(), true).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("b.toml") && err.contains("line 3"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
