//! `tpm-vault keylime-agent`: the device's Keylime agent (see [`crate::keylime`]).
//!
//! Owns the settings: flags over the config file (TOML, the same keys), checked before anything
//! is contacted; and the process: runs until SIGTERM / SIGINT.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use crate::keylime::{Agent, AgentConfig, KeylimeError, DEFAULT_PCRS};

use super::error::CliError;
use super::Context;

/// Shown at the end of `tpm-vault keylime-agent --help`.
const KEYLIME_HELP: &str = "\
The agent registers the TPM's EK and the vault's RSA attestation key with the registrar, proves
it holds the AK to the verifier (TPM2_Certify over the verifier's nonce) and then sends a quote
of the PCRs the verifier asks for, with the UEFI event log when the device has one, at the
interval the verifier sets (Keylime REST API v3.0, push model, Keylime 7.14). Every TPM operation
goes through tpm-vaultd under this user's identity: the access policy must grant `quote`.

Enroll the device on the tenant's side:
  keylime_tenant -c add --push-model -u UUID --tpm_policy '{\"9\": [\"<sha256 of PCR 9>\"]}'
and/or, with the daemon serving the UEFI event log, a measured-boot policy:
  keylime-policy create measured-boot -e binary_bios_measurements -o mb.json
  keylime_tenant -c add --push-model -u UUID --mb-policy mb.json

Config file keys (TOML): uuid, registrar, verifier, verifier_ca, registrar_ca, interval, pcrs,
state_dir. Flags win over the file.";

/// Be this device's Keylime agent (push model): register with a registrar, attest to a verifier
#[derive(Debug, Args)]
#[command(after_help = KEYLIME_HELP)]
pub(crate) struct KeylimeAgentArgs {
    /// The agent's UUID, as enrolled with `keylime_tenant -u`
    #[arg(long, value_name = "UUID")]
    uuid: Option<String>,
    /// The registrar's URL (http://HOST:8890, or https://HOST:8891 with --registrar-ca)
    #[arg(long, value_name = "URL")]
    registrar: Option<String>,
    /// The verifier's URL (https://HOST:8881)
    #[arg(long, value_name = "URL")]
    verifier: Option<String>,
    /// CA certificates (PEM) the verifier's TLS certificate must chain to [default: the system's]
    #[arg(long, value_name = "PEM")]
    verifier_ca: Option<PathBuf>,
    /// CA certificates (PEM) for an https registrar [default: the system's]
    #[arg(long, value_name = "PEM")]
    registrar_ca: Option<PathBuf>,
    /// Least time between attestation rounds; the verifier's interval wins when it is longer [default: 60 when the verifier sets none]
    #[arg(long, value_name = "SECONDS")]
    interval: Option<u64>,
    /// The sha256 PCRs offered to the verifier [default: 0-9,11-15: not IMA's 10]
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pcrs: Option<Vec<u32>>,
    /// Where the agent records its last round (status.json)
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Read these settings from FILE (TOML) [default: /etc/tpm-vault/keylime-agent.toml if it exists]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Register and attest once, print the round as JSON, and exit
    #[arg(long)]
    once: bool,
}

/// The default config file, read when it exists and no `--config` is given.
const DEFAULT_CONFIG: &str = "/etc/tpm-vault/keylime-agent.toml";

/// The config file's keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    uuid: Option<String>,
    registrar: Option<String>,
    verifier: Option<String>,
    verifier_ca: Option<PathBuf>,
    registrar_ca: Option<PathBuf>,
    interval: Option<u64>,
    pcrs: Option<Vec<u32>>,
    state_dir: Option<PathBuf>,
}

impl KeylimeAgentArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let once = self.once;
        let config = self.settings()?;
        let client = ctx.client().await?.clone();
        let mut agent = Agent::new(client, config)?;
        if once {
            agent.register().await?;
            let round = agent.attest_once().await?;
            let json = serde_json::json!({
                "index": round.index, "pcrs": round.pcrs, "event_log": round.sent_event_log,
                "seconds_to_next": round.seconds_to_next,
            });
            println!("{json}");
            return Ok(());
        }
        let shutdown = super::terminated();
        Ok(agent.run(shutdown).await?)
    }

    /// The settings: flags, then the config file, then defaults; required ones checked.
    fn settings(&self) -> Result<AgentConfig, CliError> {
        let file = match &self.config {
            Some(path) => read_config(path)?,
            None if Path::new(DEFAULT_CONFIG).exists() => read_config(Path::new(DEFAULT_CONFIG))?,
            None => FileConfig::default(),
        };
        let missing = |what: &str| {
            CliError::from(KeylimeError::Config(format!("--{what} is required (or `{}` in the config file)", what)))
        };
        Ok(AgentConfig {
            uuid: self.uuid.clone().or(file.uuid).ok_or_else(|| missing("uuid"))?,
            registrar: self.registrar.clone().or(file.registrar).ok_or_else(|| missing("registrar"))?,
            verifier: self.verifier.clone().or(file.verifier).ok_or_else(|| missing("verifier"))?,
            verifier_ca: self.verifier_ca.clone().or(file.verifier_ca),
            registrar_ca: self.registrar_ca.clone().or(file.registrar_ca),
            interval: self.interval.or(file.interval).map(Duration::from_secs),
            pcrs: self.pcrs.clone().or(file.pcrs).unwrap_or_else(|| DEFAULT_PCRS.to_vec()),
            state_dir: self.state_dir.clone().or(file.state_dir),
        })
    }
}

fn read_config(path: &Path) -> Result<FileConfig, CliError> {
    let text = std::fs::read_to_string(path).map_err(CliError::read(path))?;
    toml::from_str(&text)
        .map_err(|e| CliError::from(KeylimeError::Config(format!("{}: {}", path.display(), e.message()))))
}
