//! `tpm-vault srk public`, `seal-for` and `seal import`: secrets sealed for a device from
//! anywhere. `seal-for` runs offline (no daemon, no TPM): it needs only the device's storage
//! root key; the blob it writes opens only in that device's TPM, under the policy given.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use tpm_vault_client::seal_for::{self, SealForPolicy, MAX_BLOB};
use tpm_vault_client::{Error, PcrBinding, SealInfo, MAX_SECRET};

use super::error::CliError;
use super::files;
use super::output::Report;
use super::Context;

/// A PEM/DER key or TPM public area larger than this is not one.
const MAX_KEY_FILE: usize = 64 * 1024;

/// `tpm-vault srk ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum SrkCommand {
    /// Print the storage root key's public area (what seal-for --srk takes)
    Public(SrkPublicArgs),
}

impl SrkCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            SrkCommand::Public(args) => args.run(ctx).await,
        }
    }
}

/// Encodings of the SRK's public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SrkFormat {
    /// PEM SubjectPublicKeyInfo (seal-for takes it as the TCG-template SRK with that point)
    Pem,
    /// TPM2B_PUBLIC, as tpm2_readpublic -o writes it (the exact public area)
    Tpm2b,
}

/// `tpm-vault srk public`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
tpm-vault srk public --format tpm2b --out device-1.srk\n  \
tpm-vault seal-for --srk device-1.srk --pcr sha256:9=HEX wifi < psk > wifi.blob")]
pub(crate) struct SrkPublicArgs {
    /// Output encoding
    #[arg(long, value_enum, default_value = "pem")]
    pub(crate) format: SrkFormat,
    /// Where to write it; - for stdout
    #[arg(long, value_name = "FILE", default_value = "-")]
    pub(crate) out: PathBuf,
}

impl SrkPublicArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let srk = ctx.client().await?.srk_public().await?;
        let bytes = match self.format {
            SrkFormat::Pem => srk.public_pem.into_bytes(),
            SrkFormat::Tpm2b => srk.tpm2b_public,
        };
        files::write(&self.out, &bytes)
    }
}

/// The policy options shared by `seal-for` and a raw `seal import`.
#[derive(Debug, Args)]
pub(crate) struct PolicyArgs {
    /// PCR values the device must have: BANK:IDX=HEX[,IDX=HEX] (repeatable)
    ///
    /// With --authorized-by, only the indices count [default: sha256:9].
    #[arg(long, value_name = "BANK:IDX=HEX", value_parser = parse_pcr)]
    pub(crate) pcr: Vec<PcrBinding>,
    /// Let a policy authority approve PCR values: its ECC P-256 public key (PEM or DER)
    #[arg(long, value_name = "KEY.pem")]
    pub(crate) authorized_by: Option<PathBuf>,
}

fn parse_pcr(text: &str) -> Result<PcrBinding, String> {
    tpm_vault_client::parse_pcr_selection(text).map_err(|e| e.to_string())
}

impl PolicyArgs {
    fn policy(&self) -> Result<SealForPolicy, CliError> {
        let mut bank: Option<&str> = None;
        let mut pcrs = Vec::new();
        let mut values = Vec::new();
        for b in &self.pcr {
            if bank.is_some_and(|x| x != b.bank()) {
                return Err(Error::InvalidInput("--pcr: all PCRs must be of one bank".into()).into());
            }
            bank = Some(b.bank());
            pcrs.extend_from_slice(b.pcrs());
            values.extend(b.values().iter().cloned());
        }
        let bank = bank.unwrap_or("sha256");
        match &self.authorized_by {
            Some(path) => {
                let authority = files::read_limited(path, MAX_KEY_FILE, "a public key")?;
                let pcrs = if pcrs.is_empty() { vec![9] } else { pcrs };
                Ok(SealForPolicy::Authorized { pcrs: PcrBinding::current(bank, pcrs)?, authority })
            }
            None if pcrs.is_empty() => Err(Error::InvalidInput(
                "give --pcr BANK:IDX=HEX (the values the device must have) or --authorized-by KEY.pem".into(),
            )
            .into()),
            None if values.len() != pcrs.len() => Err(Error::InvalidInput(
                "--pcr needs the values the device must have (BANK:IDX=HEX): the device's PCRs cannot be read from \
                 here"
                    .into(),
            )
            .into()),
            None => Ok(SealForPolicy::Pcr(PcrBinding::expected(bank, pcrs.into_iter().zip(values))?)),
        }
    }
}

/// `tpm-vault seal-for`.
#[derive(Debug, Args)]
#[command(after_help = "Offline: no daemon and no TPM are needed here. On the device: \
tpm-vault seal import NAME < NAME.blob, then tpm-vault unseal NAME.\n\nExamples:\n  \
tpm-vault seal-for --srk device-1.srk --pcr sha256:9=HEX wifi < psk > wifi.blob\n  \
tpm-vault seal-for --srk device-1.srk --authorized-by authority.pem db < password > db.blob")]
pub(crate) struct SealForArgs {
    /// The device's storage root key: `srk public --format tpm2b` or `--format pem` output
    #[arg(long, value_name = "SRK.pub")]
    pub(crate) srk: PathBuf,
    /// Secret name on the device: [a-z0-9][a-z0-9._-]{0,63}
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) policy: PolicyArgs,
    /// The secret; - for stdin
    #[arg(long = "in", value_name = "FILE", default_value = "-")]
    pub(crate) input: PathBuf,
    /// Where to write the blob; - for stdout
    #[arg(long, value_name = "FILE", default_value = "-")]
    pub(crate) out: PathBuf,
}

impl SealForArgs {
    pub(crate) fn run(self) -> Result<(), CliError> {
        let srk = files::read_limited(&self.srk, MAX_KEY_FILE, "a storage key")?;
        let policy = self.policy.policy()?;
        let secret = Zeroizing::new(files::read_limited(&self.input, MAX_SECRET, "a secret")?);
        let blob = seal_for::seal_for(&srk, &self.name, &policy, &secret)?;
        files::write(&self.out, &blob)
    }
}

/// `tpm-vault seal import`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
tpm-vault seal import wifi < wifi.blob && tpm-vault unseal wifi\n  \
tpm-vault seal import db --public key.pub --duplicate key.dup --seed key.seed --pcr sha256:9=HEX")]
pub(crate) struct SealImportArgs {
    /// Secret name: [a-z0-9][a-z0-9._-]{0,63}
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// The blob (from seal-for); - for stdin
    #[arg(long = "in", value_name = "FILE", default_value = "-", conflicts_with = "public")]
    pub(crate) input: PathBuf,
    /// A raw import triple from other tools instead: the sealed object's TPM2B_PUBLIC
    #[arg(long, value_name = "FILE", requires_all = ["duplicate", "seed"])]
    pub(crate) public: Option<PathBuf>,
    /// ... its duplicate (TPM2B_PRIVATE)
    #[arg(long, value_name = "FILE", requires = "public")]
    pub(crate) duplicate: Option<PathBuf>,
    /// ... and its encrypted seed (TPM2B_ENCRYPTED_SECRET)
    #[arg(long, value_name = "FILE", requires = "public")]
    pub(crate) seed: Option<PathBuf>,
    /// With a raw triple: the policy the object's authPolicy is
    #[command(flatten)]
    pub(crate) policy: PolicyArgs,
}

impl SealImportArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let blob = match (&self.public, &self.duplicate, &self.seed) {
            (Some(p), Some(d), Some(s)) => {
                let read = |path: &PathBuf, what| files::read_limited(path, MAX_KEY_FILE, what);
                let policy = self.policy.policy()?;
                seal_for::blob_from_triple(
                    &read(p, "a TPM2B_PUBLIC")?,
                    &read(d, "a TPM2B_PRIVATE")?,
                    &read(s, "a TPM2B_ENCRYPTED_SECRET")?,
                    &policy,
                )?
            }
            _ => {
                if !self.policy.pcr.is_empty() || self.policy.authorized_by.is_some() {
                    return Err(Error::InvalidInput(
                        "a blob carries its policy: --pcr and --authorized-by go with --public/--duplicate/--seed"
                            .into(),
                    )
                    .into());
                }
                files::read_limited(&self.input, MAX_BLOB, "a sealed blob")?
            }
        };
        let info = ctx.client().await?.import_sealed(&self.name, &blob).await?;
        ctx.emit(&ImportReport(info))
    }
}

/// An imported secret.
struct ImportReport(SealInfo);

impl Report for ImportReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "Imported {:?} bound to {} (policy digest {})", self.0.name, self.0.pcrs, self.0.policy_digest)
    }

    fn json(&self) -> Value {
        json!({ "name": self.0.name, "pcrs": self.0.pcrs, "policy_digest": self.0.policy_digest, "imported": true })
    }
}
