//! `tpm-vault csr` and `tpm-vault cert ...`: certificate requests, self-signed certificates,
//! importing a chain issued by a CA, and showing the stored chain (ACME enrollment and renewal:
//! `acme`).

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use x509_cert::der::Decode as _;

use tpm_vault_client::{CertSubject, CertificateChain, Error};

use super::error::CliError;
use super::files;
use super::output::{fields, rfc3339, Report};
use super::{Context, OutputFormat};

/// Largest chain file `cert import` reads.
const MAX_CHAIN_FILE: usize = 256 * 1024;

/// Subject options shared by `csr` and `cert self-sign`.
#[derive(Debug, Args)]
pub(crate) struct SubjectArgs {
    /// Subject distinguished name, e.g. "CN=device-1,O=Example" (CN, O, OU, C, ST, L)
    #[arg(long, value_name = "DN")]
    pub(crate) subject: String,
    /// Subject alternative names: dns:NAME, ip:ADDR, uri:URI, comma-separated (repeatable)
    #[arg(long, value_name = "dns:NAME,ip:ADDR,...")]
    pub(crate) san: Vec<String>,
}

impl SubjectArgs {
    fn parse(&self) -> Result<CertSubject, CliError> {
        let mut subject = CertSubject::new(self.subject.clone());
        for sans in &self.san {
            subject = subject.with_sans(sans)?;
        }
        Ok(subject)
    }
}

/// `tpm-vault csr`.
#[derive(Debug, Args)]
pub(crate) struct CsrArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Subject and alternative names
    #[command(flatten)]
    pub(crate) subject: SubjectArgs,
}

impl CsrArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let subject = self.subject.parse()?;
        let pem = ctx.client().await?.create_csr(&self.name, &subject).await?;
        if ctx.output == OutputFormat::Json {
            return ctx.emit(&PemReport { name: self.name, pem, version: None });
        }
        files::write_stdout(pem.as_bytes())
    }
}

/// `tpm-vault cert ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum CertCommand {
    /// Issue a self-signed certificate for a key (signed in the TPM) and store it with the key
    SelfSign(SelfSignArgs),
    /// Store a certificate chain (PEM, the key's certificate first, then its issuers)
    Import(ImportArgs),
    /// Show the certificate chain stored with a key
    Show(ShowArgs),
    /// Get a certificate for a key from an ACME CA (RFC 8555); the account key is a vault key too
    Enroll(Box<super::acme::EnrollArgs>),
    /// Renew ACME certificates that are due (same key, or a new one with --new-key)
    Renew(super::acme::RenewArgs),
}

impl CertCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            CertCommand::SelfSign(args) => args.run(ctx).await,
            CertCommand::Import(args) => args.run(ctx).await,
            CertCommand::Show(args) => args.run(ctx).await,
            CertCommand::Enroll(args) => args.run(ctx).await,
            CertCommand::Renew(args) => args.run(ctx).await,
        }
    }
}

/// `tpm-vault cert self-sign`.
#[derive(Debug, Args)]
pub(crate) struct SelfSignArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Subject and alternative names
    #[command(flatten)]
    pub(crate) subject: SubjectArgs,
    /// Validity in days
    #[arg(long, value_name = "N", default_value_t = 365)]
    pub(crate) days: u32,
}

impl SelfSignArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let subject = self.subject.parse()?;
        let chain = ctx.client().await?.self_sign(&self.name, &subject, self.days).await?;
        if ctx.output == OutputFormat::Json {
            return ctx.emit(&PemReport { name: self.name, pem: chain.chain_pem, version: Some(chain.version) });
        }
        files::write_stdout(chain.chain_pem.as_bytes())
    }
}

/// `tpm-vault cert import`.
#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// PEM chain file, leaf first ("-" for standard input)
    #[arg(value_name = "CHAIN")]
    pub(crate) chain: PathBuf,
}

impl ImportArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let bytes = files::read_limited(&self.chain, MAX_CHAIN_FILE, "a certificate chain")?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::InvalidInput(format!("{} is not PEM text", self.chain.display())))?;
        let chain = ctx.client().await?.set_certificate(&self.name, &text).await?;
        ctx.emit(&ChainReport { chain, imported: true })
    }
}

/// `tpm-vault cert show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// Key name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Print the PEM chain itself instead of a summary
    #[arg(long)]
    pub(crate) pem: bool,
}

impl ShowArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let chain = ctx.client().await?.certificate(&self.name).await?;
        if self.pem && ctx.output == OutputFormat::Text {
            return files::write_stdout(chain.chain_pem.as_bytes());
        }
        ctx.emit(&ChainReport { chain, imported: false })
    }
}

/// A CSR or a freshly self-signed certificate with `--output json`.
struct PemReport {
    name: String,
    pem: String,
    version: Option<u64>,
}

impl Report for PemReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.pem.as_bytes())
    }

    fn json(&self) -> Value {
        match self.version {
            Some(v) => json!({ "name": self.name, "pem": self.pem, "version": v }),
            None => json!({ "name": self.name, "pem": self.pem }),
        }
    }
}

/// A stored chain, from `import` and `show`.
struct ChainReport {
    chain: CertificateChain,
    imported: bool,
}

/// What `show` tells about one certificate.
struct CertSummary {
    subject: String,
    issuer: String,
    serial: String,
    not_before: String,
    not_after: String,
}

fn summaries(pem: &str) -> Vec<CertSummary> {
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let block = &rest[start..];
        let Some(end) = block.find("-----END CERTIFICATE-----") else { break };
        let whole = &block[..end + "-----END CERTIFICATE-----".len()];
        rest = &block[whole.len()..];
        let Ok((_, der)) = x509_cert::der::pem::decode_vec(whole.as_bytes()) else { continue };
        let Ok(cert) = x509_cert::Certificate::from_der(&der) else { continue };
        let tbs = &cert.tbs_certificate;
        let name = |n: &x509_cert::name::Name| {
            n.0.iter()
                .map(|rdn| rdn.0.iter().map(ToString::to_string).collect::<Vec<_>>().join("+"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let time = |t: &x509_cert::time::Time| {
            i64::try_from(t.to_unix_duration().as_secs()).map(rfc3339).unwrap_or_else(|_| "?".into())
        };
        out.push(CertSummary {
            subject: name(&tbs.subject),
            issuer: name(&tbs.issuer),
            serial: hex::encode(tbs.serial_number.as_bytes()),
            not_before: time(&tbs.validity.not_before),
            not_after: time(&tbs.validity.not_after),
        });
    }
    out
}

impl Report for ChainReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let certs = summaries(&self.chain.chain_pem);
        if self.imported {
            writeln!(
                out,
                "Stored a chain of {} certificate(s) with key {:?} (version {})",
                certs.len(),
                self.chain.name,
                self.chain.version
            )?;
            return Ok(());
        }
        fields(out, &[("key", self.chain.name.clone()), ("version", self.chain.version.to_string())])?;
        for (i, c) in certs.iter().enumerate() {
            writeln!(out)?;
            writeln!(out, "certificate {}{}", i + 1, if i == 0 { " (the key's own)" } else { "" })?;
            fields(
                out,
                &[
                    ("  subject", c.subject.clone()),
                    ("  issuer", c.issuer.clone()),
                    ("  serial", c.serial.clone()),
                    ("  not before", c.not_before.clone()),
                    ("  not after", c.not_after.clone()),
                ],
            )?;
        }
        Ok(())
    }

    fn json(&self) -> Value {
        let certs: Vec<Value> = summaries(&self.chain.chain_pem)
            .into_iter()
            .map(|c| {
                json!({
                    "subject": c.subject,
                    "issuer": c.issuer,
                    "serial": c.serial,
                    "not_before": c.not_before,
                    "not_after": c.not_after,
                })
            })
            .collect();
        json!({
            "name": self.chain.name,
            "version": self.chain.version,
            "tpm_name": self.chain.tpm_name,
            "pem": self.chain.chain_pem,
            "certificates": certs,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> Command {
        let mut argv = vec!["tpm-vault"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap().command
    }

    #[test]
    fn csr_and_cert_commands_parse() {
        let Command::Csr(args) =
            parse(&["csr", "web", "--subject", "CN=a,O=b", "--san", "dns:x,ip:10.0.0.1", "--san", "uri:spiffe://a/b"])
        else {
            panic!("not csr")
        };
        let subject = args.subject.parse().unwrap();
        assert_eq!(subject.subject, "CN=a,O=b");
        assert_eq!((subject.dns_names.len(), subject.ip_addresses.len(), subject.uris.len()), (1, 1, 1));
        let Command::Cert(CertCommand::SelfSign(args)) = parse(&["cert", "self-sign", "web", "--subject", "CN=a"])
        else {
            panic!("not self-sign")
        };
        assert_eq!(args.days, 365);
        let Command::Cert(CertCommand::Import(args)) = parse(&["cert", "import", "web", "chain.pem"]) else {
            panic!("not import")
        };
        assert_eq!(args.chain, PathBuf::from("chain.pem"));
        let Command::Cert(CertCommand::Show(args)) = parse(&["cert", "show", "web", "--pem"]) else {
            panic!("not show")
        };
        assert!(args.pem);
        let Command::Csr(args) = parse(&["csr", "web", "--subject", "CN=a", "--san", "bogus"]) else {
            panic!("not csr")
        };
        assert!(args.subject.parse().is_err());
    }

    #[test]
    fn summaries_read_pem_chains() {
        assert!(summaries("not pem").is_empty());
        let report = ChainReport {
            chain: CertificateChain { name: "web".into(), chain_pem: String::new(), version: 3, tpm_name: "00".into() },
            imported: true,
        };
        let mut out = Vec::new();
        report.text(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Stored a chain of 0 certificate(s) with key \"web\" (version 3)\n"
        );
        assert_eq!(report.json()["version"], 3);
    }
}
