//! `tpm-vault quote`, `verify-quote`, `pcr read` and `attest key|activate`: attestation.
//!
//! Quotes are written and read in the files tpm2-tools uses (`quote.msg`, `quote.sig`,
//! `quote.pcrs`, `ak.pub.pem`), so `tpm2_checkquote` accepts what `quote` writes and
//! `verify-quote` accepts what `tpm2_quote` writes. Verification is done in-core by
//! [`Quote::verify`]; this module only moves files and prints.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use tpm_vault_client::attest::{decode_pcrs, encode_pcrs, public_key_der, CredentialFile, QuoteInfo};
use tpm_vault_client::eventlog::{EventLog, PcrCheck};
use tpm_vault_client::parse_pcr_selection as parse_selection;
use tpm_vault_client::{AttestationKey, Error, PcrBinding, PcrValues, Quote, QuoteError};

use super::error::CliError;
use super::files;
use super::output::{fields, Report};
use super::{Context, OutputFormat};

/// `quote.msg`: the TPMS_ATTEST.
const QUOTE_MSG: &str = "quote.msg";
/// `quote.sig`: the TPMT_SIGNATURE.
const QUOTE_SIG: &str = "quote.sig";
/// `quote.pcrs`: the PCR values, tpm2-tools serialized format.
const QUOTE_PCRS: &str = "quote.pcrs";
/// `ak.pub.pem`: the attestation key.
const AK_PEM: &str = "ak.pub.pem";
/// `eventlog.bin`: the device's event log, with `quote --with-eventlog`.
const EVENTLOG: &str = "eventlog.bin";
/// No quote file is anywhere near this large (a PCR file of 32 digest lists is 17 KiB).
const MAX_QUOTE_FILE: usize = 64 * 1024;
/// Largest nonce the TPM takes (TPM2B_DATA).
const MAX_NONCE: usize = 64;

/// `tpm-vault quote`.
#[derive(Debug, Args)]
#[command(after_help = "Writes DIR/quote.msg (TPMS_ATTEST), DIR/quote.sig (TPMT_SIGNATURE), DIR/quote.pcrs \
(PCR values, tpm2-tools format) and DIR/ak.pub.pem, which both of these accept:\n  \
tpm-vault verify-quote --in-dir DIR --nonce NONCE\n  \
tpm2_checkquote -u DIR/ak.pub.pem -m DIR/quote.msg -s DIR/quote.sig -f DIR/quote.pcrs -g sha256 -q NONCE")]
pub(crate) struct QuoteArgs {
    /// PCRs to quote: BANK:IDX[,IDX...]
    #[arg(long, value_name = "BANK:IDX[,IDX]", default_value = "sha256:0,1,2,3,4,5,6,7,8,9", value_parser = parse_indices)]
    pub(crate) pcrs: PcrBinding,
    /// The verifier's nonce (qualifying data), hex, 1 to 64 bytes
    #[arg(long, value_name = "HEX", value_parser = parse_nonce)]
    pub(crate) nonce: Nonce,
    /// Directory to write the quote files to (created if missing)
    #[arg(long, value_name = "DIR")]
    pub(crate) out_dir: PathBuf,
    /// Also write the device's event log (from the daemon) to DIR/eventlog.bin, for
    /// `verify-quote --eventlog`
    #[arg(long)]
    pub(crate) with_eventlog: bool,
}

impl QuoteArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let client = ctx.client().await?;
        // The log first: a device without one fails before any file is written.
        let log = match self.with_eventlog {
            true => Some(client.event_log().await?.0),
            false => None,
        };
        let quote = client.quote(&self.pcrs, &self.nonce.0).await?;
        let pcrs = encode_pcrs(&quote.pcrs).map_err(|e| Error::InvalidInput(format!("the daemon's quote: {e}")))?;
        let pem = quote.ak_public_pem().map_err(|e| Error::InvalidInput(format!("the daemon's quote: {e}")))?;
        std::fs::create_dir_all(&self.out_dir).map_err(CliError::write(&self.out_dir))?;
        files::write(&self.out_dir.join(QUOTE_MSG), &quote.attest)?;
        files::write(&self.out_dir.join(QUOTE_SIG), &quote.signature)?;
        files::write(&self.out_dir.join(QUOTE_PCRS), &pcrs)?;
        files::write(&self.out_dir.join(AK_PEM), pem.as_bytes())?;
        if let Some(log) = &log {
            files::write(&self.out_dir.join(EVENTLOG), log)?;
        }
        ctx.emit(&QuoteReport { dir: self.out_dir, nonce: self.nonce.0, quote, eventlog: log.is_some() })
    }
}

/// `tpm-vault verify-quote`.
#[derive(Debug, Args)]
#[command(after_help = "Checks, in this order: the signature with the attestation key, that the signed \
structure is a TPM quote, the nonce, that the PCR file covers the quoted PCRs, that its values hash to \
the quoted digest, and the --expect values. Prints \"Quote OK\" and exits 0, or names the failed check \
on stderr and exits 1.\n\nThe AK in the directory proves nothing by itself (whoever wrote the quote wrote \
it too): pass the key you enrolled for the device with --ak. Without --ak the quote is checked against \
DIR/ak.pub.pem, the output says \"signer enrolled: NO\" (JSON: \"signer_enrolled\": false) and the exit \
status is 12, unless --allow-unenrolled-ak is given.")]
pub(crate) struct VerifyQuoteArgs {
    /// Directory with quote.msg, quote.sig, quote.pcrs and ak.pub.pem
    #[arg(long, value_name = "DIR")]
    pub(crate) in_dir: PathBuf,
    /// The nonce the quote must be over, hex
    #[arg(long, value_name = "HEX", value_parser = parse_nonce)]
    pub(crate) nonce: Nonce,
    /// Expected PCR values, BANK:IDX=HEX[,IDX=HEX]; repeatable
    #[arg(long, value_name = "BANK:IDX=HEX", value_parser = parse_expectation)]
    pub(crate) expect: Vec<PcrBinding>,
    /// The device's enrolled attestation key to check against (PEM or DER) [default:
    /// DIR/ak.pub.pem, which proves nothing: exit status 12]
    #[arg(long, value_name = "FILE")]
    pub(crate) ak: Option<PathBuf>,
    /// Without --ak: accept a quote checked only against DIR/ak.pub.pem (exit 0, not 12)
    #[arg(long, conflicts_with = "ak")]
    pub(crate) allow_unenrolled_ak: bool,
    /// Also check that this event log replays to the quoted PCR values (e.g. DIR/eventlog.bin)
    #[arg(long, value_name = "FILE")]
    pub(crate) eventlog: Option<PathBuf>,
    /// With --eventlog: print the events behind each quoted PCR
    #[arg(long, requires = "eventlog")]
    pub(crate) show_events: bool,
}

impl VerifyQuoteArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let read = |name: &str| files::read_limited(&self.in_dir.join(name), MAX_QUOTE_FILE, "a quote file");
        let attest = read(QUOTE_MSG)?;
        let signature = read(QUOTE_SIG)?;
        let pcrs = read(QUOTE_PCRS)?;
        let ak_path = self.ak.clone().unwrap_or_else(|| self.in_dir.join(AK_PEM));
        let ak = files::read_limited(&ak_path, MAX_QUOTE_FILE, "a public key")?;
        let log = self.eventlog.as_deref().map(super::eventlog::read_log).transpose()?;
        let mut log_checks = None;
        let result = check(attest, signature, &pcrs, &ak).and_then(|quote| {
            let info = quote.verify(&self.nonce.0, &self.expect)?;
            if let Some(bytes) = &log {
                let log = EventLog::parse(bytes)?;
                log_checks = Some((quote.check_event_log(&log)?, log));
            }
            Ok((quote.pcrs, info))
        });
        let enrolled = self.ak.is_some();
        let report = VerifyQuoteReport { result, enrolled, eventlog: log_checks, show_events: self.show_events };
        match (&report.result, ctx.output) {
            (Ok(_), _) | (Err(_), OutputFormat::Json) => ctx.emit(&report)?,
            _ => {}
        }
        match report.result {
            Ok(_) if !enrolled && !self.allow_unenrolled_ak => Err(CliError::SignerNotEnrolled(self.in_dir)),
            Ok(_) => Ok(()),
            Err(e) => Err(CliError::QuoteRejected(e)),
        }
    }
}

/// Assembles a [`Quote`] from the files' bytes.
fn check(attest: Vec<u8>, signature: Vec<u8>, pcrs: &[u8], ak: &[u8]) -> Result<Quote, QuoteError> {
    Ok(Quote { attest, signature, pcrs: decode_pcrs(pcrs)?, ak_public_der: public_key_der(ak)? })
}

/// `tpm-vault pcr ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum PcrCommand {
    /// Print PCR values
    Read(PcrReadArgs),
    /// Print the value a PCR reaches after extends (for `seal --pcr` and `policy sign --pcr`)
    Predict(super::eventlog::PredictArgs),
}

impl PcrCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            PcrCommand::Read(args) => args.run(ctx).await,
            PcrCommand::Predict(args) => args.run(ctx).await,
        }
    }
}

/// `tpm-vault pcr read`.
#[derive(Debug, Args)]
pub(crate) struct PcrReadArgs {
    /// PCRs to read: BANK:IDX[,IDX...] [default: sha256:0-23]
    #[arg(long, value_name = "BANK:IDX[,IDX]", value_parser = parse_indices)]
    pub(crate) pcrs: Option<PcrBinding>,
}

impl PcrReadArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let values = ctx.client().await?.read_pcrs(self.pcrs.as_ref()).await?;
        ctx.emit(&PcrReport(values))
    }
}

/// `tpm-vault attest ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum AttestCommand {
    /// Show the attestation key (AK) and the endorsement key (EK)
    Key(AttestKeyArgs),
    /// Recover a credential made with tpm2_makecredential for the AK (proves AK and EK share a TPM)
    Activate(ActivateArgs),
    /// Have the AK certify the storage root key over a nonce (TPM2_Certify), for verify-srk
    Srk(super::seal_for::AttestSrkArgs),
}

impl AttestCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            AttestCommand::Key(args) => args.run(ctx).await,
            AttestCommand::Activate(args) => args.run(ctx).await,
            AttestCommand::Srk(args) => args.run(ctx).await,
        }
    }
}

/// `tpm-vault attest key`.
#[derive(Debug, Args)]
#[command(after_help = "A verifier binds a secret to the AK with the EK, e.g.:\n  \
tpm-vault attest key --ek-out ek.pem --output json   # ak_name\n  \
tpm2_makecredential --tcti none -G rsa -u ek.pem -s secret -n AK_NAME -o cred\n  \
tpm-vault attest activate --in cred > recovered")]
pub(crate) struct AttestKeyArgs {
    /// Also write the EK public key (PEM) to FILE
    #[arg(long, value_name = "FILE")]
    pub(crate) ek_out: Option<PathBuf>,
    /// Also write the AK public key (PEM) to FILE
    #[arg(long, value_name = "FILE")]
    pub(crate) ak_out: Option<PathBuf>,
}

impl AttestKeyArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let keys = ctx.client().await?.attestation_key().await?;
        if let Some(path) = &self.ek_out {
            files::write(path, with_newline(&keys.ek_public_pem).as_bytes())?;
        }
        if let Some(path) = &self.ak_out {
            files::write(path, with_newline(&keys.ak_public_pem).as_bytes())?;
        }
        ctx.emit(&AttestKeyReport(keys))
    }
}

/// `tpm-vault attest activate`.
#[derive(Debug, Args)]
#[command(after_help = "The credential file is what tpm2_makecredential -o writes (magic 0xBADCC0DE, version 1, \
TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET).")]
pub(crate) struct ActivateArgs {
    /// The credential file; - for stdin
    #[arg(long = "in", value_name = "CRED_FILE")]
    pub(crate) input: PathBuf,
    /// Where to write the recovered secret; - for stdout
    ///
    /// With --output json and --out -, the secret is in the object (hex) instead.
    #[arg(long, value_name = "FILE", default_value = "-")]
    pub(crate) out: PathBuf,
}

impl ActivateArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let bytes = files::read_limited(&self.input, MAX_QUOTE_FILE, "a credential file")?;
        let credential =
            CredentialFile::parse(&bytes).map_err(|e| Error::InvalidInput(format!("{}: {e}", self.input.display())))?;
        let secret =
            ctx.client().await?.activate_credential(&credential.credential_blob, &credential.encrypted_secret).await?;
        SecretReport::deliver(ctx, self.out, &secret)
    }
}

/// A verifier's nonce (a newtype, so clap takes it as one value rather than a list of bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Nonce(pub(crate) Vec<u8>);

/// Parses a nonce in hex (optionally `0x`-prefixed), 1 to 64 bytes.
pub(crate) fn parse_nonce(text: &str) -> Result<Nonce, String> {
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")).unwrap_or(text);
    let nonce = hex::decode(digits).map_err(|e| format!("not hex: {e}"))?;
    if nonce.is_empty() || nonce.len() > MAX_NONCE {
        return Err(format!("a nonce has 1 to {MAX_NONCE} bytes, this one {}", nonce.len()));
    }
    Ok(Nonce(nonce))
}

/// Parses a PCR selection without values.
fn parse_indices(text: &str) -> Result<PcrBinding, String> {
    let binding = parse_selection(text).map_err(|e| e.to_string())?;
    if !binding.values().is_empty() {
        return Err("give PCR indices only (BANK:IDX[,IDX]), not values".to_owned());
    }
    Ok(binding)
}

/// Parses an expectation: a selection with values.
fn parse_expectation(text: &str) -> Result<PcrBinding, String> {
    let binding = parse_selection(text).map_err(|e| e.to_string())?;
    if binding.values().is_empty() {
        return Err("give the expected values, e.g. sha256:9=HEX".to_owned());
    }
    Ok(binding)
}

fn with_newline(pem: &str) -> String {
    if pem.ends_with('\n') {
        pem.to_owned()
    } else {
        format!("{pem}\n")
    }
}

/// The command that checks a quote directory with tpm2-tools.
pub(crate) fn checkquote_command(dir: &Path, bank: &str, nonce: &[u8]) -> String {
    let file = |name: &str| dir.join(name).display().to_string();
    format!(
        "tpm2_checkquote -u {} -m {} -s {} -f {} -g {bank} -q {}",
        file(AK_PEM),
        file(QUOTE_MSG),
        file(QUOTE_SIG),
        file(QUOTE_PCRS),
        hex::encode(nonce)
    )
}

/// PCR values as JSON: `[{"pcr": 9, "value": "hex"}, ...]`.
fn values_json(values: &PcrValues) -> Value {
    Value::Array(values.iter().map(|(pcr, value)| json!({ "pcr": pcr, "value": hex::encode(value) })).collect())
}

/// A quote written to a directory, from `quote`.
pub(crate) struct QuoteReport {
    /// The output directory.
    pub(crate) dir: PathBuf,
    /// The nonce.
    pub(crate) nonce: Vec<u8>,
    /// The quote.
    pub(crate) quote: Quote,
    /// Whether `eventlog.bin` was written too.
    pub(crate) eventlog: bool,
}

impl Report for QuoteReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "Quoted {} over nonce {} into {}/{{{QUOTE_MSG},{QUOTE_SIG},{QUOTE_PCRS},{AK_PEM}}}",
            self.quote.pcrs.selection(),
            hex::encode(&self.nonce),
            self.dir.display()
        )?;
        if self.eventlog {
            writeln!(out, "Event log: {}", self.dir.join(EVENTLOG).display())?;
        }
        writeln!(out, "Check with: {}", checkquote_command(&self.dir, &self.quote.pcrs.bank, &self.nonce))
    }

    fn json(&self) -> Value {
        let file = |name: &str| self.dir.join(name).display().to_string();
        json!({
            "out_dir": self.dir.display().to_string(),
            "nonce": hex::encode(&self.nonce),
            "bank": self.quote.pcrs.bank,
            "pcrs": values_json(&self.quote.pcrs),
            "files": {
                "message": file(QUOTE_MSG),
                "signature": file(QUOTE_SIG),
                "pcrs": file(QUOTE_PCRS),
                "ak_public_key": file(AK_PEM),
                "eventlog": self.eventlog.then(|| file(EVENTLOG)),
            },
            "checkquote": checkquote_command(&self.dir, &self.quote.pcrs.bank, &self.nonce),
        })
    }
}

/// The outcome of `verify-quote`.
pub(crate) struct VerifyQuoteReport {
    /// The verified values and quote details, or the failed check.
    pub(crate) result: Result<(PcrValues, QuoteInfo), QuoteError>,
    /// Whether the quote was checked against an enrolled AK (`--ak`) rather than the one in
    /// the directory it came with.
    pub(crate) enrolled: bool,
    /// With `--eventlog`, when it explains the quote: each quoted PCR's check, and the log.
    pub(crate) eventlog: Option<(Vec<PcrCheck>, EventLog)>,
    /// `--show-events`.
    pub(crate) show_events: bool,
}

impl VerifyQuoteReport {
    fn eventlog_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let Some((checks, log)) = &self.eventlog else { return Ok(()) };
        writeln!(out, "event log: explains {} quoted PCRs", checks.len())?;
        if self.show_events {
            for check in checks {
                writeln!(out, "PCR {}:{} = {}", check.bank, check.pcr, hex::encode(&check.tpm))?;
                for event in log.events_for(check.pcr) {
                    super::eventlog::event_text(event, out, "  ")?;
                }
            }
        }
        Ok(())
    }

    fn eventlog_json(&self) -> Value {
        let Some((checks, log)) = &self.eventlog else { return Value::Null };
        let pcrs: Vec<Value> = checks
            .iter()
            .map(|check| {
                let mut value = super::eventlog::check_json(check);
                if self.show_events {
                    value["events"] = log.events_for(check.pcr).map(super::eventlog::event_json).collect();
                }
                value
            })
            .collect();
        json!({ "explains_quote": true, "pcrs": pcrs })
    }
}

impl VerifyQuoteReport {
    fn enrolled_text(&self) -> &'static str {
        match self.enrolled {
            true => "yes (checked against the AK given with --ak)",
            false => "NO (the AK was not checked against an enrolled key)",
        }
    }
}

impl Report for VerifyQuoteReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        match &self.result {
            Ok((values, info)) => {
                writeln!(out, "Quote OK")?;
                fields(
                    out,
                    &[
                        ("pcrs", values.selection()),
                        ("pcr digest", hex::encode(&info.pcr_digest)),
                        ("nonce", hex::encode(&info.nonce)),
                        ("signer", hex::encode(&info.signer)),
                        (
                            "tpm clock",
                            format!("{} ms (reset {}, restart {})", info.clock, info.reset_count, info.restart_count),
                        ),
                        ("firmware", format!("{:#018x}", info.firmware_version)),
                        ("signer enrolled", self.enrolled_text().to_owned()),
                    ],
                )?;
                self.eventlog_text(out)
            }
            Err(e) => writeln!(out, "quote rejected: {e}"),
        }
    }

    fn json(&self) -> Value {
        match &self.result {
            Ok((values, info)) => json!({
                "valid": true,
                "bank": values.bank,
                "pcrs": values_json(values),
                "pcr_digest": hex::encode(&info.pcr_digest),
                "nonce": hex::encode(&info.nonce),
                "signer": hex::encode(&info.signer),
                "clock": info.clock,
                "reset_count": info.reset_count,
                "restart_count": info.restart_count,
                "safe": info.safe,
                "firmware_version": info.firmware_version,
                "signer_enrolled": self.enrolled,
                "eventlog": self.eventlog_json(),
            }),
            Err(e) => json!({
                "valid": false, "reason": e.reason(), "error": e.to_string(), "signer_enrolled": self.enrolled,
            }),
        }
    }
}

/// PCR values, from `pcr read`, printed like `tpm2_pcrread`.
pub(crate) struct PcrReport(pub(crate) PcrValues);

impl Report for PcrReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "  {}:", self.0.bank)?;
        for (pcr, value) in self.0.iter() {
            writeln!(out, "    {pcr:<2}: 0x{}", hex::encode_upper(value))?;
        }
        Ok(())
    }

    fn json(&self) -> Value {
        json!({ "bank": self.0.bank, "pcrs": values_json(&self.0) })
    }
}

/// The AK and EK, from `attest key`.
pub(crate) struct AttestKeyReport(pub(crate) AttestationKey);

impl AttestKeyReport {
    fn certificate_line(&self) -> String {
        match (&self.0.ek_certificate, self.0.note.is_empty()) {
            (Some(cert), _) => format!("present ({} bytes DER)", cert.len()),
            (None, true) => "none: this TPM has no EK certificate".to_owned(),
            (None, false) => format!("none: {}", self.0.note),
        }
    }
}

impl Report for AttestKeyReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        fields(out, &[("ak name", hex::encode(&self.0.ak_name)), ("ek certificate", self.certificate_line())])?;
        writeln!(out, "ak public key:")?;
        out.write_all(with_newline(&self.0.ak_public_pem).as_bytes())?;
        writeln!(out, "ek public key:")?;
        out.write_all(with_newline(&self.0.ek_public_pem).as_bytes())
    }

    fn json(&self) -> Value {
        json!({
            "ak_name": hex::encode(&self.0.ak_name),
            "ak_public_pem": self.0.ak_public_pem,
            "ek_public_pem": self.0.ek_public_pem,
            "ek_certificate": self.0.ek_certificate.as_ref().map(hex::encode),
            "note": self.0.note,
        })
    }
}

/// A recovered secret, from `attest activate --output json` (and `unseal --output json`).
pub(crate) struct SecretReport {
    /// The secret in hex, when it goes to stdout inside the object.
    pub(crate) secret: Option<String>,
    /// The file it was written to, if not stdout.
    pub(crate) out: Option<PathBuf>,
}

impl SecretReport {
    /// Writes a recovered `secret` to `out` (stdout: `-`) and, with `--output json`, reports it:
    /// in the JSON object itself (hex) when `out` is stdout, else the file it went to.
    pub(crate) fn deliver(ctx: &Context, out: PathBuf, secret: &[u8]) -> Result<(), CliError> {
        let json = ctx.output == OutputFormat::Json;
        if !(json && files::is_std(&out)) {
            files::write_secret(&out, secret)?;
        }
        if json {
            let secret = files::is_std(&out).then(|| hex::encode(secret));
            ctx.emit(&SecretReport { secret, out: Some(out).filter(|out| !files::is_std(out)) })?;
        }
        Ok(())
    }
}

impl Report for SecretReport {
    fn text(&self, _out: &mut dyn Write) -> io::Result<()> {
        // In text mode the secret itself is the output.
        Ok(())
    }

    fn json(&self) -> Value {
        json!({ "secret": self.secret, "out": self.out.as_ref().map(|p| p.display().to_string()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces() {
        assert_eq!(parse_nonce("00ff").unwrap(), Nonce(vec![0, 0xff]));
        assert_eq!(parse_nonce("0xAB").unwrap(), Nonce(vec![0xab]));
        assert!(parse_nonce("").unwrap_err().contains("1 to 64 bytes"));
        assert!(parse_nonce(&"00".repeat(65)).unwrap_err().contains("1 to 64 bytes"));
        assert!(parse_nonce("xyz").unwrap_err().starts_with("not hex"));
    }

    #[test]
    fn default_pcrs_are_0_to_9() {
        let binding = parse_indices("sha256:0,1,2,3,4,5,6,7,8,9").unwrap();
        assert_eq!(binding.pcrs(), tpm_vault_client::attest::DEFAULT_QUOTE_PCRS);
        assert!(parse_indices(&format!("sha256:9={}", "00".repeat(32))).is_err());
        assert!(parse_expectation("sha256:9").is_err());
    }

    #[test]
    fn checkquote_line() {
        let line = checkquote_command(Path::new("q"), "sha256", b"\x01\x02");
        assert_eq!(
            line,
            "tpm2_checkquote -u q/ak.pub.pem -m q/quote.msg -s q/quote.sig -f q/quote.pcrs -g sha256 -q 0102"
        );
    }

    fn parse(args: &[&str]) -> Result<super::super::Command, clap::Error> {
        use clap::Parser;
        super::super::Cli::try_parse_from(std::iter::once("tpm-vault").chain(args.iter().copied()))
            .map(|cli| cli.command)
    }

    #[test]
    fn attestation_args() {
        use super::super::Command;
        use clap::error::ErrorKind;
        let Ok(Command::Quote(args)) = parse(&["quote", "--nonce", "ab", "--out-dir", "q"]) else {
            panic!("not quote")
        };
        assert_eq!(args.pcrs.to_string(), "sha256:0,1,2,3,4,5,6,7,8,9");
        assert_eq!((args.nonce, args.out_dir), (Nonce(vec![0xab]), PathBuf::from("q")));
        assert_eq!(parse(&["quote", "--out-dir", "q"]).unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
        let v9 = format!("sha256:9={}", "00".repeat(32));
        let Ok(Command::VerifyQuote(args)) =
            parse(&["verify-quote", "--in-dir", "q", "--nonce", "ab", "--expect", &v9, "--expect", &v9, "--ak", "a"])
        else {
            panic!("not verify-quote")
        };
        assert_eq!(args.expect.len(), 2);
        assert_eq!((args.ak, args.allow_unenrolled_ak), (Some(PathBuf::from("a")), false));
        let with_both = ["verify-quote", "--in-dir", "q", "--nonce", "ab", "--ak", "a", "--allow-unenrolled-ak"];
        assert_eq!(parse(&with_both).unwrap_err().kind(), ErrorKind::ArgumentConflict);
        let Ok(Command::Pcr(PcrCommand::Read(args))) = parse(&["pcr", "read"]) else { panic!("not pcr read") };
        assert_eq!(args.pcrs, None);
        let Ok(Command::Attest(AttestCommand::Key(args))) = parse(&["attest", "key", "--ek-out", "ek.pem"]) else {
            panic!("not attest key")
        };
        assert_eq!(args.ek_out, Some(PathBuf::from("ek.pem")));
        let Ok(Command::Attest(AttestCommand::Activate(args))) = parse(&["attest", "activate", "--in", "c"]) else {
            panic!("not attest activate")
        };
        assert_eq!((args.input, args.out), (PathBuf::from("c"), PathBuf::from("-")));
    }

    #[test]
    fn pcr_report_looks_like_tpm2_pcrread() {
        let values = PcrValues { bank: "sha256".into(), pcrs: vec![0, 10], values: vec![vec![0; 2], vec![0xab; 2]] };
        let mut out = Vec::new();
        PcrReport(values).text(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "  sha256:\n    0 : 0x0000\n    10: 0xABAB\n");
    }

    #[test]
    fn failure_json_names_the_reason() {
        let report = VerifyQuoteReport {
            result: Err(QuoteError::BadSignature),
            enrolled: true,
            eventlog: None,
            show_events: false,
        };
        let value = report.json();
        assert_eq!(value["valid"], false);
        assert_eq!(value["reason"], "bad_signature");
        assert_eq!(value["signer_enrolled"], true);
    }
}
