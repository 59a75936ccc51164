//! `tpm-vault sign` and `tpm-vault verify`.
//!
//! Inputs are raw bytes: the message (or, with `--digest`, the digest) and the signature
//! (DER `ECDSA-Sig-Value` or the RSA signature), as `openssl pkeyutl` reads and writes them.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};

use tpm_vault_client::{HashAlgorithm, Named, SignOptions, Signature, SignatureScheme};

use super::error::CliError;
use super::files;
use super::key::named_parser;
use super::output::Report;
use super::password::AuthArgs;
use super::{Context, OutputFormat};

/// What `sign` and `verify` share: the input and how it is hashed and signed.
#[derive(Debug, Args)]
pub(crate) struct InputArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// The message (or digest) file; - for stdin
    #[arg(long = "in", value_name = "FILE")]
    pub(crate) input: PathBuf,
    /// The input is a precomputed digest, not a message
    ///
    /// 32 bytes for sha256, 48 for sha384; raw bytes, as `openssl dgst -binary` writes.
    #[arg(long)]
    pub(crate) digest: bool,
    /// Hash algorithm [default: sha384 for ecc-p384 keys, sha256 otherwise]
    #[arg(long, value_name = "HASH", value_parser = named_parser::<HashAlgorithm>())]
    pub(crate) hash: Option<HashAlgorithm>,
    /// Signature scheme [default: ecdsa for ECC keys, pss for RSA keys, ml-dsa for ML-DSA keys,
    /// hybrid for hybrid-p256-mldsa65 keys]
    #[arg(long, value_name = "SCHEME", value_parser = named_parser::<SignatureScheme>())]
    pub(crate) scheme: Option<SignatureScheme>,
}

impl InputArgs {
    fn options(&self, hash: HashAlgorithm) -> SignOptions {
        SignOptions::new().with_hash(hash).with_scheme(self.scheme.unwrap_or_default())
    }
}

/// `tpm-vault sign`.
#[derive(Debug, Args)]
#[command(after_help = "The signature is DER ECDSA-Sig-Value for ECDSA, raw bytes for RSA, \
as `openssl pkeyutl -verify` expects; the FIPS 204 encoding for ML-DSA; the versioned TVHS format \
(ECDSA P-256 + ML-DSA-65, see README) for --scheme hybrid. Messages are hashed outside the TPM; \
ML-DSA and hybrid keys sign whole messages (at most 4 MiB, no --digest).")]
pub(crate) struct SignArgs {
    /// What to sign
    #[command(flatten)]
    pub(crate) input: InputArgs,
    /// Where to write the signature; - for stdout
    ///
    /// With --output json and --out -, the signature is in the object (hex) instead.
    #[arg(long, value_name = "SIG")]
    pub(crate) out: PathBuf,
    /// The key's password, for keys created with one
    #[command(flatten)]
    pub(crate) auth: AuthArgs,
}

impl SignArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        if self.auth.reads_stdin() && files::is_std(&self.input.input) {
            return Err(tpm_vault_client::Error::InvalidInput(
                "--in and --auth-file cannot both be read from standard input".to_owned(),
            )
            .into());
        }
        let auth = self.auth.load()?;
        let requested = self.input.hash.unwrap_or_default();
        let scheme = self.input.scheme.unwrap_or_default();
        let (input, hash) =
            files::read_sign_input(ctx, &self.input.name, &self.input.input, self.input.digest, requested, scheme)
                .await?;
        let mut options = self.input.options(hash);
        if let Some(auth) = auth {
            options = options.with_auth(auth);
        }
        let signature = ctx.client().await?.sign(&self.input.name, input, &options).await?;
        let json = ctx.output == OutputFormat::Json;
        // With JSON on stdout, `--out -` would mix binary into it: the object carries the
        // signature instead.
        if !(json && files::is_std(&self.out)) {
            files::write(&self.out, signature.bytes())?;
        }
        if json {
            ctx.emit(&SignReport {
                name: self.input.name,
                signature,
                out: Some(self.out).filter(|out| !files::is_std(out)),
            })?;
        }
        Ok(())
    }
}

/// `tpm-vault verify`.
#[derive(Debug, Args)]
#[command(after_help = "Prints \"Verified OK\" and exits 0, or prints \"Verification failure\" on \
stderr and exits 1.")]
pub(crate) struct VerifyArgs {
    /// What was signed
    #[command(flatten)]
    pub(crate) input: InputArgs,
    /// The signature file; - for stdin
    #[arg(long, value_name = "SIG")]
    pub(crate) sig: PathBuf,
}

impl VerifyArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        if files::is_std(&self.sig) && files::is_std(&self.input.input) {
            return Err(tpm_vault_client::Error::InvalidInput(
                "--in and --sig cannot both be read from standard input".to_owned(),
            )
            .into());
        }
        let signature = files::read_signature(&self.sig)?;
        let requested = self.input.hash.unwrap_or_default();
        let scheme = self.input.scheme.unwrap_or_default();
        let (input, hash) =
            files::read_sign_input(ctx, &self.input.name, &self.input.input, self.input.digest, requested, scheme)
                .await?;
        let valid = ctx.client().await?.verify(&self.input.name, input, &signature, &self.input.options(hash)).await?;
        let report = VerifyReport { name: self.input.name, valid };
        if valid || ctx.output == OutputFormat::Json {
            ctx.emit(&report)?;
        }
        if valid {
            Ok(())
        } else {
            Err(CliError::VerificationFailed)
        }
    }
}

/// A signature, from `sign --output json`.
pub(crate) struct SignReport {
    /// The key's name.
    pub(crate) name: String,
    /// The signature and what made it.
    pub(crate) signature: Signature,
    /// The file it was written to, if not stdout.
    pub(crate) out: Option<PathBuf>,
}

impl Report for SignReport {
    fn text(&self, _out: &mut dyn Write) -> io::Result<()> {
        // In text mode the signature file is the output.
        Ok(())
    }

    fn json(&self) -> Value {
        json!({
            "name": self.name,
            "scheme": self.signature.scheme().name(),
            "hash": self.signature.hash().name(),
            "signature": hex::encode(self.signature.bytes()),
            "out": self.out.as_ref().map(|p| p.display().to_string()),
        })
    }
}

/// A verification result.
pub(crate) struct VerifyReport {
    /// The key's name.
    pub(crate) name: String,
    /// Whether the signature is good.
    pub(crate) valid: bool,
}

impl Report for VerifyReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.valid {
            writeln!(out, "Verified OK")
        } else {
            writeln!(out, "Verification failure")
        }
    }

    fn json(&self) -> Value {
        json!({ "name": self.name, "valid": self.valid })
    }
}
