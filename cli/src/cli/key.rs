//! `tpm-vault key ...`: create, list, show, export and delete keys.

use std::io::{self, Write};

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};

use tpm_vault_client::parse_pcr_selection as parse_selection;
use tpm_vault_client::{Error, KeyAlgorithm, KeyInfo, KeyUsage, Named, PcrBinding, PublicKey};

use super::error::CliError;
use super::files;
use super::output::{key_json, key_text, pcr_selection, rfc3339, table, usages_text, yes_no, Report};
use super::password::AuthArgs;
use super::{Context, OutputFormat};

/// `tpm-vault key ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum KeyCommand {
    /// Create a key inside the TPM (the private part never leaves it), or a TPM-sealed
    /// ML-DSA / ML-KEM / hybrid key
    Create(CreateArgs),
    /// List keys
    List(ListArgs),
    /// Show a key's metadata
    Show(ShowArgs),
    /// Narrow what a key may be used for (usages are never widened)
    SetUsage(SetUsageArgs),
    /// Print a key's public part (SubjectPublicKeyInfo, readable by openssl)
    Public(PublicArgs),
    /// Delete a key for good (the TPM keeps no copy)
    Delete(DeleteArgs),
}

impl KeyCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            KeyCommand::Create(args) => args.run(ctx).await,
            KeyCommand::List(args) => args.run(ctx).await,
            KeyCommand::Show(args) => args.run(ctx).await,
            KeyCommand::SetUsage(args) => args.run(ctx).await,
            KeyCommand::Public(args) => args.run(ctx).await,
            KeyCommand::Delete(args) => args.run(ctx).await,
        }
    }
}

/// `tpm-vault key create`.
#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    /// Key name: [a-z0-9][a-z0-9._-]{0,63}
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Key algorithm
    ///
    /// ecc-* and rsa-* keys are generated inside the TPM. ml-dsa-* (signing) and ml-kem-*
    /// (decapsulation) keys are generated in the daemon and sealed by the TPM: the private part
    /// is only ever unsealed into daemon memory, never returned. hybrid-p256-mldsa65 creates an
    /// ECC P-256 TPM key and a sealed ML-DSA-65 key under one name, for `sign --scheme hybrid`.
    #[arg(
        long,
        value_name = "ALG",
        default_value = "ecc-p256",
        value_parser = named_parser::<KeyAlgorithm>()
    )]
    pub(crate) alg: KeyAlgorithm,
    /// Make the key usable only while PCRs hold given values, e.g. sha256:9
    ///
    /// BANK:IDX[,IDX] binds to the values at creation; BANK:IDX=HEX[,IDX=HEX] to given
    /// (e.g. future) values. Banks: sha1, sha256, sha384; indices 0-23.
    #[arg(long, value_name = "BANK:IDX[,IDX]", value_parser = parse_pcr)]
    pub(crate) pcr: Option<PcrBinding>,
    /// Protect the key with a password (a key is either PCR-bound or password-protected)
    #[command(flatten)]
    pub(crate) auth: AuthArgs,
    /// What the key may be used for; repeatable [default: sign]
    ///
    /// sign: raw signatures (TLS, PKCS#11, CSRs, certificates, `tpm-vault sign`). ssh: only SSH
    /// user authentication and SSHSIG (`ssh-keygen -Y sign`), which the daemon parses; the
    /// key `tpm-vault ssh-agent` serves (ECC and RSA keys). policy: only PCR-policy approvals
    /// (`policy sign --vault-key`; ecc-p256 keys). Fixed at creation; `key set-usage` narrows.
    #[arg(long = "usage", value_name = "USAGE", value_parser = named_parser::<KeyUsage>())]
    pub(crate) usages: Vec<KeyUsage>,
}

impl CreateArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        // Read the password before connecting, so a bad file is reported as such.
        let auth = self.auth.load()?;
        let client = ctx.client().await?;
        let key = match auth {
            Some(_) if self.pcr.is_some() => {
                return Err(Error::InvalidInput(
                    "a key is either PCR-bound (--pcr) or password-protected (--auth, --auth-file), not both"
                        .to_owned(),
                )
                .into())
            }
            auth => client.create_key_with_usages(&self.name, self.alg, self.pcr, auth.as_ref(), &self.usages).await?,
        };
        ctx.emit(&KeyReport(key))
    }
}

/// `tpm-vault key list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {}

impl ListArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let keys = ctx.client().await?.list_keys().await?;
        ctx.emit(&KeyListReport(keys))
    }
}

/// `tpm-vault key show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
}

impl ShowArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let key = ctx.client().await?.key(&self.name).await?;
        ctx.emit(&KeyReport(key))
    }
}

/// `tpm-vault key set-usage`.
#[derive(Debug, Args)]
pub(crate) struct SetUsageArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// A usage the key keeps (sign, ssh, policy); repeatable. Each must be one the key has:
    /// adding one is refused. Keys created before usages existed have all three.
    #[arg(long = "usage", value_name = "USAGE", required = true, value_parser = named_parser::<KeyUsage>())]
    pub(crate) usages: Vec<KeyUsage>,
}

impl SetUsageArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let key = ctx.client().await?.set_key_usage(&self.name, &self.usages).await?;
        ctx.emit(&KeyReport(key))
    }
}

/// `tpm-vault key public`.
#[derive(Debug, Args)]
pub(crate) struct PublicArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Encoding on stdout
    ///
    /// With --output json, the object has both (der in hex). A hybrid key has two public keys
    /// (ECDSA P-256, then ML-DSA-65): pem prints both blocks, der is refused.
    #[arg(long, value_enum, default_value_t = PublicFormat::Pem)]
    pub(crate) format: PublicFormat,
}

/// Encodings of `key public`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PublicFormat {
    /// PEM "PUBLIC KEY".
    Pem,
    /// DER SubjectPublicKeyInfo.
    Der,
}

impl PublicArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let key = ctx.client().await?.public_key(&self.name).await?;
        if ctx.output == OutputFormat::Json {
            return ctx.emit(&PublicKeyReport { name: self.name, key });
        }
        match self.format {
            PublicFormat::Der if key.ml_dsa.is_some() => Err(Error::InvalidInput(
                "a hybrid key has two public keys (ECDSA P-256 and ML-DSA-65): use --format pem, which prints \
                 both, or --output json"
                    .to_owned(),
            )
            .into()),
            PublicFormat::Der => files::write_stdout(&key.der),
            PublicFormat::Pem => {
                let mut pem = String::new();
                for block in std::iter::once(&key.pem).chain(key.ml_dsa.as_ref().map(|(_, pem)| pem)) {
                    pem.push_str(block);
                    if !pem.ends_with('\n') {
                        pem.push('\n');
                    }
                }
                files::write_stdout(pem.as_bytes())
            }
        }
    }
}

/// `tpm-vault key delete`.
#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
}

impl DeleteArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        ctx.client().await?.delete_key(&self.name).await?;
        ctx.emit(&DeletedReport { name: self.name })
    }
}

/// A clap parser for the short names of an API enum, listing them in `--help` and completions.
pub(crate) fn named_parser<T: Named + Send + Sync + Clone>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::names()).try_map(|name| T::from_name(&name))
}

/// Parses `--pcr`, leaving the "invalid value" context to clap.
fn parse_pcr(text: &str) -> Result<PcrBinding, String> {
    parse_selection(text).map_err(|e| e.to_string())
}

/// One key, from `create` and `show`.
pub(crate) struct KeyReport(pub(crate) KeyInfo);

impl Report for KeyReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        key_text(&self.0, out)
    }

    fn json(&self) -> Value {
        key_json(&self.0)
    }
}

/// All keys, from `list`.
pub(crate) struct KeyListReport(pub(crate) Vec<KeyInfo>);

impl Report for KeyListReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.0.is_empty() {
            return Ok(());
        }
        let rows: Vec<Vec<String>> = self
            .0
            .iter()
            .map(|key| {
                vec![
                    key.name.clone(),
                    key.algorithm.name().to_owned(),
                    rfc3339(key.created_unix),
                    key.pcr_binding.as_ref().map_or_else(|| "-".to_owned(), pcr_selection),
                    yes_no(key.has_auth).to_owned(),
                    usages_text(key),
                ]
            })
            .collect();
        table(out, &["NAME", "ALGORITHM", "CREATED", "PCRS", "PASSWORD", "USAGES"], &rows)
    }

    fn json(&self) -> Value {
        let keys: Vec<Value> = self.0.iter().map(key_json).collect();
        json!({ "keys": keys })
    }
}

/// A public key, from `public --output json`.
pub(crate) struct PublicKeyReport {
    /// The key's name.
    pub(crate) name: String,
    /// Its public part.
    pub(crate) key: PublicKey,
}

impl Report for PublicKeyReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.key.pem.as_bytes())
    }

    fn json(&self) -> Value {
        let mut object = json!({
            "name": self.name,
            "algorithm": self.key.algorithm.name(),
            "pem": self.key.pem,
            "der": hex::encode(&self.key.der),
        });
        if let (Some((der, pem)), Some(map)) = (&self.key.ml_dsa, object.as_object_mut()) {
            map.insert("ml_dsa_pem".into(), json!(pem));
            map.insert("ml_dsa_der".into(), json!(hex::encode(der)));
        }
        object
    }
}

/// A deleted key, from `delete`.
pub(crate) struct DeletedReport {
    /// The key's name.
    pub(crate) name: String,
}

impl Report for DeletedReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "Deleted key {:?}", self.name)
    }

    fn json(&self) -> Value {
        json!({ "name": self.name, "deleted": true })
    }
}
