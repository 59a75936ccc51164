//! `tpm-vault kem encap` and `tpm-vault kem decap`: ML-KEM key establishment with a vault
//! ML-KEM key.
//!
//! `encap` runs in this process with the key's public part (anyone may encapsulate to it);
//! `decap` asks the daemon, where the sealed private part is used. Both print the 32-byte
//! shared secret in hex on stdout, so treat their output as secret.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use tpm_vault_client::KemPublicKey;
use tpm_vault_client::{Error, Named};

use super::error::CliError;
use super::files;
use super::output::Report;
use super::{Context, OutputFormat};

/// A ciphertext file larger than this is not an ML-KEM ciphertext (ML-KEM-1024: 1568 bytes).
const MAX_CIPHERTEXT_FILE: usize = 4096;

/// `tpm-vault kem ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum KemCommand {
    /// Make a shared secret for an ML-KEM key: write the ciphertext file, print the secret (hex)
    Encap(EncapArgs),
    /// Recover the shared secret from a ciphertext with an ML-KEM key in the vault (hex)
    Decap(DecapArgs),
}

impl KemCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            KemCommand::Encap(args) => args.run(ctx).await,
            KemCommand::Decap(args) => args.run(ctx).await,
        }
    }
}

/// `tpm-vault kem encap`.
#[derive(Debug, Args)]
#[command(after_help = "Encapsulation uses only the key's public part and runs in this process. \
Send the ciphertext to the key's holder, who recovers the same secret with `kem decap`.")]
pub(crate) struct EncapArgs {
    /// ML-KEM key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Where to write the ciphertext (raw bytes) [default: NAME.ct]; - for stdout with --output
    /// json (hex in the object)
    #[arg(long, value_name = "CT")]
    pub(crate) out: Option<PathBuf>,
}

impl EncapArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let json = ctx.output == OutputFormat::Json;
        let out = self.out.unwrap_or_else(|| PathBuf::from(format!("{}.ct", self.name)));
        if files::is_std(&out) && !json {
            return Err(Error::InvalidInput(
                "the shared secret goes to standard output: write the ciphertext to a file (--out CT)".to_owned(),
            )
            .into());
        }
        let public = ctx.client().await?.public_key(&self.name).await?;
        let key = KemPublicKey::from_spki(&public.der)?;
        let sent = key.encapsulate()?;
        if !files::is_std(&out) {
            files::write(&out, &sent.ciphertext)?;
        }
        ctx.emit(&EncapReport {
            name: self.name,
            algorithm: key.algorithm().name(),
            out: Some(out).filter(|out| !files::is_std(out)),
            ciphertext: hex::encode(&sent.ciphertext),
            shared_secret: to_hex(sent.shared_secret()),
        })
    }
}

/// `tpm-vault kem decap`.
#[derive(Debug, Args)]
pub(crate) struct DecapArgs {
    /// ML-KEM key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// The ciphertext file (raw bytes, as `kem encap` writes it); - for stdin
    #[arg(long = "in", value_name = "CT")]
    pub(crate) input: PathBuf,
}

impl DecapArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let ciphertext = files::read_limited(&self.input, MAX_CIPHERTEXT_FILE, "an ML-KEM ciphertext")?;
        let secret = ctx.client().await?.decapsulate(&self.name, &ciphertext).await?;
        ctx.emit(&DecapReport { name: self.name, shared_secret: to_hex(&secret) })
    }
}

/// The result of `kem encap`.
struct EncapReport {
    name: String,
    algorithm: &'static str,
    out: Option<PathBuf>,
    ciphertext: String,
    shared_secret: Zeroizing<String>,
}

impl Report for EncapReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let path = self.out.as_ref().map_or_else(|| "-".to_owned(), |p| p.display().to_string());
        writeln!(out, "ciphertext:    {path} ({} bytes)", self.ciphertext.len() / 2)?;
        writeln!(out, "shared secret: {}", self.shared_secret.as_str())
    }

    fn json(&self) -> Value {
        let mut object = json!({
            "name": self.name,
            "algorithm": self.algorithm,
            "shared_secret": self.shared_secret.as_str(),
        });
        if let Some(map) = object.as_object_mut() {
            match &self.out {
                Some(path) => map.insert("out".into(), json!(path.display().to_string())),
                None => map.insert("ciphertext".into(), json!(self.ciphertext)),
            };
        }
        object
    }
}

/// The result of `kem decap`.
struct DecapReport {
    name: String,
    shared_secret: Zeroizing<String>,
}

impl Report for DecapReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}", self.shared_secret.as_str())
    }

    fn json(&self) -> Value {
        json!({ "name": self.name, "shared_secret": self.shared_secret.as_str() })
    }
}

/// Hex of a secret, in a string wiped on drop.
fn to_hex(bytes: &[u8]) -> Zeroizing<String> {
    Zeroizing::new(hex::encode(bytes))
}
