//! `tpm-vault seal`, `unseal` and `policy sign`: secrets sealed to PCR values (by default
//! PCR 9, the kernel measurement), and signed approvals of new PCR values.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{ArgGroup, Args, Subcommand};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use tpm_vault_client::parse_pcr_selection as parse_selection;
use tpm_vault_client::{
    Error, PcrBinding, PolicyApproval, PolicyAuthority, SealInfo, SealOptions, SignedPolicy, MAX_SECRET,
    MAX_SIGNED_POLICY,
};

use super::attest::SecretReport;
use super::error::CliError;
use super::files;
use super::output::{rfc3339, Report};
use super::{Context, OutputFormat};

/// A PEM key file larger than this is not a key.
const MAX_KEY_FILE: usize = 64 * 1024;

/// `tpm-vault seal import`.
#[derive(Debug, Subcommand)]
pub(crate) enum SealCommand {
    /// Import a secret sealed for this device elsewhere (seal-for, or a raw triple)
    Import(super::seal_for::SealImportArgs),
}

/// `tpm-vault seal`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  \
tpm-vault seal disk < secret                          # to the current sha256:9\n  \
tpm-vault seal disk --pcr sha256:9=HEX < secret       # to the value PCR 9 will have\n  \
tpm-vault seal disk --authorized-by authority.pem < secret   # to any approved PCR 9 value\n  \
tpm-vault seal disk --delete
  \
tpm-vault seal import wifi < wifi.blob               # a secret sealed elsewhere with seal-for",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub(crate) struct SealArgs {
    /// Import a secret sealed for this device elsewhere (seal-for, or a raw triple)
    #[command(subcommand)]
    pub(crate) command: Option<SealCommand>,
    /// Secret name: [a-z0-9][a-z0-9._-]{0,63}
    #[arg(value_name = "NAME", required = true)]
    pub(crate) name: Option<String>,
    /// PCRs to seal to [default: sha256:9, current value]
    ///
    /// BANK:IDX[,IDX] seals to the current values; BANK:IDX=HEX[,IDX=HEX] to given (e.g.
    /// future) values. With --authorized-by, only the indices count.
    #[arg(long, value_name = "BANK:IDX[=HEX]", value_parser = parse_pcr)]
    pub(crate) pcr: Option<PcrBinding>,
    /// Let a policy authority approve PCR values: its ECC P-256 public key (PEM or DER)
    ///
    /// The secret then opens for any values the authority signed (`tpm-vault policy sign`),
    /// given with `unseal --policy`: a kernel update needs a new signature, not a re-seal.
    #[arg(long, value_name = "KEY.pem")]
    pub(crate) authorized_by: Option<PathBuf>,
    /// Replace an existing secret of the same name
    #[arg(long)]
    pub(crate) overwrite: bool,
    /// The secret; - for stdin
    #[arg(long = "in", value_name = "FILE", default_value = "-")]
    pub(crate) input: PathBuf,
    /// Delete the sealed secret NAME instead of sealing
    #[arg(long, conflicts_with_all = ["pcr", "authorized_by", "overwrite"])]
    pub(crate) delete: bool,
}

impl SealArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        if let Some(SealCommand::Import(args)) = self.command {
            return args.run(ctx).await;
        }
        let Some(name) = self.name else {
            return Err(Error::InvalidInput("a secret NAME is required".into()).into());
        };
        if self.delete {
            ctx.client().await?.delete_sealed(&name).await?;
            return ctx.emit(&DeletedSealedReport { name });
        }
        let mut options = SealOptions::new().with_overwrite(self.overwrite);
        if let Some(pcr) = self.pcr {
            options = options.with_pcrs(pcr);
        }
        if let Some(path) = &self.authorized_by {
            options = options.with_authority(files::read_limited(path, MAX_KEY_FILE, "a public key")?);
        }
        // Read the secret before connecting, so a bad file is reported as such.
        let secret = Zeroizing::new(files::read_limited(&self.input, MAX_SECRET, "a sealed secret")?);
        let info = ctx.client().await?.seal(&name, &secret, &options).await?;
        ctx.emit(&SealReport { info, authorized: self.authorized_by.is_some() })
    }
}

/// `tpm-vault unseal`.
#[derive(Debug, Args)]
#[command(after_help = "Exits 6 when the PCRs do not hold the sealed (or approved) values, naming the PCRs \
that differ.")]
pub(crate) struct UnsealArgs {
    /// Secret name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Signed policy approving the current PCR values (for secrets sealed with --authorized-by)
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: Option<PathBuf>,
    /// Where to write the secret; - for stdout
    ///
    /// With --output json and --out -, the secret is in the object (hex) instead.
    #[arg(long, value_name = "FILE", default_value = "-")]
    pub(crate) out: PathBuf,
}

impl UnsealArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let policy = match &self.policy {
            Some(path) => Some(files::read_limited(path, MAX_SIGNED_POLICY, "a signed policy")?),
            None => None,
        };
        let secret = ctx.client().await?.unseal(&self.name, policy.as_deref()).await?;
        SecretReport::deliver(ctx, self.out, &secret)
    }
}

/// `tpm-vault policy ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Approve PCR values for secrets sealed with --authorized-by (writes a signed policy)
    Sign(PolicySignArgs),
}

impl PolicyCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            PolicyCommand::Sign(args) => args.run(ctx).await,
        }
    }
}

/// `tpm-vault policy sign`.
#[derive(Debug, Args)]
#[command(
    group(ArgGroup::new("authority").required(true).args(["key", "vault_key"])),
    disable_version_flag = true,
    after_help = "With --key, signing happens here, offline; no daemon is needed. Make a key with:\n  \
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out authority.key\n  \
openssl pkey -in authority.key -pubout -out authority.pem   # for seal --authorized-by"
)]
pub(crate) struct PolicySignArgs {
    /// The authority's ECC P-256 private key, PEM (PKCS#8 or SEC1)
    #[arg(long, value_name = "PRIV.pem")]
    pub(crate) key: Option<PathBuf>,
    /// A vault ecc-p256 key with the `policy` usage acting as the authority (signs through the
    /// daemon; `key create NAME --usage policy`)
    #[arg(long, value_name = "NAME")]
    pub(crate) vault_key: Option<String>,
    /// PCR values to approve: BANK:IDX=HEX[,IDX=HEX]
    #[arg(long, value_name = "BANK:IDX=HEX", value_parser = parse_approval)]
    pub(crate) pcr: PcrBinding,
    /// Where to write the signed policy; - for stdout
    #[arg(long, value_name = "FILE")]
    pub(crate) out: PathBuf,
    /// Approval counter: once a higher version opened a secret, lower ones are refused for it
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) version: u64,
    /// Expiry, Unix seconds (0 = never)
    #[arg(long, value_name = "UNIX", default_value_t = 0)]
    pub(crate) expires: i64,
}

impl PolicySignArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let approval = PolicyApproval::new(&self.pcr)?.with_version(self.version).with_expiry(self.expires);
        let policy = match (&self.key, &self.vault_key) {
            (Some(path), _) => {
                let pem = Zeroizing::new(files::read_limited(path, MAX_KEY_FILE, "a private key")?);
                let text = std::str::from_utf8(&pem)
                    .map_err(|_| Error::InvalidInput(format!("{}: not a PEM file", path.display())))?;
                let authority = PolicyAuthority::from_pem(text)
                    .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))?;
                authority.sign(&approval)
            }
            (None, Some(name)) => ctx.client().await?.sign_policy(name, &approval).await?,
            (None, None) => {
                return Err(Error::InvalidInput("give --key or --vault-key".to_owned()).into());
            }
        };
        let json = ctx.output == OutputFormat::Json;
        if !(json && files::is_std(&self.out)) {
            files::write(&self.out, &policy.to_bytes())?;
        }
        if json || !files::is_std(&self.out) {
            let out = Some(self.out).filter(|out| !files::is_std(out));
            ctx.emit(&PolicyReport { policy, out })?;
        }
        Ok(())
    }
}

/// Parses `--pcr` of seal.
fn parse_pcr(text: &str) -> Result<PcrBinding, String> {
    parse_selection(text).map_err(|e| e.to_string())
}

/// Parses `--pcr` of policy sign: values are required.
fn parse_approval(text: &str) -> Result<PcrBinding, String> {
    let binding = parse_selection(text).map_err(|e| e.to_string())?;
    if binding.values().is_empty() {
        return Err("give the PCR values to approve, e.g. sha256:9=HEX".to_owned());
    }
    Ok(binding)
}

/// A sealed secret, from `seal`.
pub(crate) struct SealReport {
    /// What the daemon reported.
    pub(crate) info: SealInfo,
    /// Sealed with a policy authority.
    pub(crate) authorized: bool,
}

impl Report for SealReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let how = if self.authorized { "values approved by the policy authority of" } else { "" };
        let target = if how.is_empty() { self.info.pcrs.clone() } else { format!("{how} {}", self.info.pcrs) };
        writeln!(out, "Sealed {:?} to {target} (policy digest {})", self.info.name, self.info.policy_digest)
    }

    fn json(&self) -> Value {
        json!({
            "name": self.info.name,
            "pcrs": self.info.pcrs,
            "policy_digest": self.info.policy_digest,
            "authorized": self.authorized,
        })
    }
}

/// A deleted sealed secret, from `seal --delete`.
pub(crate) struct DeletedSealedReport {
    /// The secret's name.
    pub(crate) name: String,
}

impl Report for DeletedSealedReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "Deleted sealed secret {:?}", self.name)
    }

    fn json(&self) -> Value {
        json!({ "name": self.name, "deleted": true })
    }
}

/// A signed policy, from `policy sign`.
pub(crate) struct PolicyReport {
    /// The policy.
    pub(crate) policy: SignedPolicy,
    /// The file it was written to, if not stdout.
    pub(crate) out: Option<PathBuf>,
}

impl Report for PolicyReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let expires =
            if self.policy.expires_unix() == 0 { "never".to_owned() } else { rfc3339(self.policy.expires_unix()) };
        let file = self.out.as_ref().map_or_else(|| "standard output".to_owned(), |p| p.display().to_string());
        writeln!(
            out,
            "Approved {} (policy digest {}, version {}, expires {expires}) in {file}",
            self.policy.pcrs().selection(),
            hex::encode(self.policy.approved_policy()),
            self.policy.version()
        )
    }

    fn json(&self) -> Value {
        let pcrs = self.policy.pcrs();
        let values: Vec<Value> =
            pcrs.iter().map(|(pcr, value)| json!({ "pcr": pcr, "value": hex::encode(value) })).collect();
        json!({
            "bank": pcrs.bank,
            "pcrs": values,
            "approved_policy": hex::encode(self.policy.approved_policy()),
            "version": self.policy.version(),
            "expires_unix": self.policy.expires_unix(),
            "authority_spki": hex::encode(self.policy.authority_spki()),
            "out": self.out.as_ref().map(|p| p.display().to_string()),
            "policy": self.out.is_none().then(|| hex::encode(self.policy.to_bytes())),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::Parser;
    use p256::pkcs8::{EncodePrivateKey, LineEnding};

    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("tpm-vault").chain(args.iter().copied())).map(|cli| cli.command)
    }

    fn value() -> String {
        "ab".repeat(32)
    }

    #[test]
    fn seal_args() {
        let Ok(Command::Seal(args)) = parse(&["seal", "disk"]) else { panic!("not seal") };
        assert_eq!((args.name.as_deref(), args.pcr, args.overwrite, args.delete), (Some("disk"), None, false, false));
        assert_eq!(args.input, PathBuf::from("-"));
        let pcr = format!("sha256:9={}", value());
        let Ok(Command::Seal(args)) =
            parse(&["seal", "disk", "--pcr", &pcr, "--authorized-by", "a.pem", "--overwrite", "--in", "s"])
        else {
            panic!("not seal")
        };
        assert_eq!(args.pcr.unwrap().values()[0], vec![0xab; 32]);
        assert_eq!(args.authorized_by, Some(PathBuf::from("a.pem")));
        assert!(args.overwrite);
        let err = parse(&["seal", "disk", "--delete", "--pcr", "sha256:9"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
        assert_eq!(parse(&["seal", "disk", "--pcr", "sha256:99"]).unwrap_err().kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn unseal_args() {
        let Ok(Command::Unseal(args)) = parse(&["unseal", "disk", "--policy", "p"]) else { panic!("not unseal") };
        assert_eq!((args.name.as_str(), args.policy), ("disk", Some(PathBuf::from("p"))));
        assert_eq!(parse(&["unseal"]).unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn policy_sign_args() {
        let pcr = format!("sha256:9={}", value());
        let Ok(Command::Policy(PolicyCommand::Sign(args))) = parse(&[
            "policy",
            "sign",
            "--key",
            "k.pem",
            "--pcr",
            &pcr,
            "--out",
            "f",
            "--version",
            "3",
            "--expires",
            "5",
        ]) else {
            panic!("not policy sign")
        };
        assert_eq!((args.version, args.expires), (3, 5));
        assert_eq!(args.key, Some(PathBuf::from("k.pem")));
        let missing = parse(&["policy", "sign", "--pcr", &pcr, "--out", "f"]).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::MissingRequiredArgument);
        let both = parse(&["policy", "sign", "--key", "k", "--vault-key", "v", "--pcr", &pcr, "--out", "f"]);
        assert_eq!(both.unwrap_err().kind(), ErrorKind::ArgumentConflict);
        let no_values = parse(&["policy", "sign", "--key", "k", "--pcr", "sha256:9", "--out", "f"]).unwrap_err();
        assert_eq!(no_values.kind(), ErrorKind::ValueValidation);
        assert!(no_values.to_string().contains("give the PCR values to approve"), "{no_values}");
    }

    /// `policy sign --key` works offline: no daemon at the socket.
    #[tokio::test]
    async fn offline_policy_sign_writes_a_signed_policy() {
        let dir = tempfile::tempdir().unwrap();
        let key = p256::SecretKey::from_bytes(&[9u8; 32].into()).unwrap();
        let key_path = dir.path().join("k.pem");
        std::fs::write(&key_path, key.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes()).unwrap();
        let out = dir.path().join("p.policy");
        let pcr = format!("sha256:9={}", value());
        let command = parse(&[
            "--socket",
            "/nonexistent/vault.sock",
            "policy",
            "sign",
            "--key",
            key_path.to_str().unwrap(),
            "--pcr",
            &pcr,
            "--out",
            out.to_str().unwrap(),
            "--version",
            "7",
        ])
        .unwrap();
        let mut ctx = Context { socket: "/nonexistent/vault.sock".into(), output: OutputFormat::Json, client: None };
        command.run(&mut ctx).await.unwrap();
        let policy = SignedPolicy::from_bytes(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(policy.version(), 7);
        assert_eq!(policy.pcrs().values, vec![vec![0xab; 32]]);
        let expected = PolicyApproval::new(&pcr.parse().unwrap()).unwrap().policy_digest();
        assert_eq!(policy.approved_policy(), expected);

        // A key file that is no key: one clear line, exit 2.
        std::fs::write(&key_path, "not a key").unwrap();
        let command =
            parse(&["policy", "sign", "--key", key_path.to_str().unwrap(), "--pcr", &pcr, "--out", "-"]).unwrap();
        let err = command.run(&mut ctx).await.unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().ends_with("no PEM private key found (expected \"PRIVATE KEY\" or \"EC PRIVATE KEY\")"));
    }

    #[test]
    fn seal_report_text() {
        let info = SealInfo { name: "disk".into(), policy_digest: "ab".into(), pcrs: "sha256:9".into() };
        let mut out = Vec::new();
        SealReport { info: info.clone(), authorized: false }.text(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "Sealed \"disk\" to sha256:9 (policy digest ab)\n");
        let mut out = Vec::new();
        SealReport { info, authorized: true }.text(&mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("to values approved by the policy authority of sha256:9"));
    }
}
