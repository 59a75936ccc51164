//! `tpm-vault srk public`, `attest srk`, `verify-srk`, `seal-for` and `seal import`: secrets
//! sealed for a device from anywhere. `seal-for` runs offline (no daemon, no TPM): it needs only
//! the device's storage root key; the blob it writes opens only in that device's TPM, under the
//! policy given. `attest srk` has the device's AK certify that key over a verifier's nonce, and
//! `verify-srk` checks that offline against the AK enrolled for the device (in-core by
//! [`SrkCertification::verify`]; this module only moves files and prints).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use tpm_vault_client::attest::{public_key_der, public_key_pem, AkAlg, CertifiedSrk, SrkCertError};
use tpm_vault_client::seal_for::{self, SealForPolicy, SrkCertification, MAX_BLOB};
use tpm_vault_client::{Error, PcrBinding, SealInfo, MAX_SECRET};

use super::attest::{parse_nonce, Nonce};
use super::error::CliError;
use super::files;
use super::output::{fields, Report};
use super::{Context, OutputFormat};

/// `srk.pub`: the SRK's TPM2B_PUBLIC.
const SRK_PUB: &str = "srk.pub";
/// `srk.pem`: the SRK's public key, PEM SubjectPublicKeyInfo.
const SRK_PEM: &str = "srk.pem";
/// `certify.msg`: the TPMS_ATTEST (TPM_ST_ATTEST_CERTIFY) the AK signed.
const CERTIFY_MSG: &str = "certify.msg";
/// `certify.sig`: the AK's TPMT_SIGNATURE over `certify.msg`.
const CERTIFY_SIG: &str = "certify.sig";
/// `ak.pub.pem`: the attestation key that signed (as `quote --out-dir` writes it).
const AK_PEM: &str = "ak.pub.pem";

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

/// `tpm-vault attest srk`.
#[derive(Debug, Args)]
#[command(after_help = "Writes DIR/srk.pub (the SRK's TPM2B_PUBLIC), DIR/srk.pem, DIR/certify.msg (the \
TPMS_ATTEST of TPM2_Certify), DIR/certify.sig (the AK's TPMT_SIGNATURE) and DIR/ak.pub.pem. A verifier that \
trusts the device's AK checks them offline and gets the SRK to seal for:\n  \
tpm-vault verify-srk --in-dir DIR --nonce NONCE --ak device-1.ak.pem --out device-1.srk\n  \
tpm-vault seal-for --srk device-1.srk --pcr sha256:9=HEX wifi < psk > wifi.blob")]
pub(crate) struct AttestSrkArgs {
    /// The verifier's nonce (qualifying data), hex, 1 to 64 bytes
    #[arg(long, value_name = "HEX", value_parser = parse_nonce)]
    pub(crate) nonce: Nonce,
    /// Directory to write the files to (created if missing)
    #[arg(long, value_name = "DIR")]
    pub(crate) out_dir: PathBuf,
    /// Which attestation key certifies: the ECC one, or the RSA one a Keylime registrar holds
    #[arg(long, value_enum, default_value = "ecc-p256")]
    pub(crate) ak_alg: AkAlgArg,
}

/// `--ak-alg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum AkAlgArg {
    /// The vault's default AK (ECDSA-SHA256)
    #[value(name = "ecc-p256")]
    EccP256,
    /// The RSA AK (RSASSA-SHA256) the Keylime agent registers (the registrar's aik_tpm)
    #[value(name = "rsa-2048")]
    Rsa2048,
}

impl AttestSrkArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let alg = match self.ak_alg {
            AkAlgArg::EccP256 => AkAlg::EccP256,
            AkAlgArg::Rsa2048 => AkAlg::Rsa2048,
        };
        let cert = ctx.client().await?.certify_srk_with(alg, &self.nonce.0).await?;
        // The daemon's own answer must check out against the AK it names before it is written.
        let certified = cert
            .verify(&self.nonce.0)
            .map_err(|e| Error::InvalidInput(format!("the daemon's SRK certification does not verify: {e}")))?;
        let ak_pem =
            public_key_pem(&cert.ak_public_der).map_err(|e| Error::InvalidInput(format!("the daemon's AK: {e}")))?;
        std::fs::create_dir_all(&self.out_dir).map_err(CliError::write(&self.out_dir))?;
        files::write(&self.out_dir.join(SRK_PUB), &certified.srk.tpm2b_public)?;
        files::write(&self.out_dir.join(SRK_PEM), certified.srk.public_pem.as_bytes())?;
        files::write(&self.out_dir.join(CERTIFY_MSG), &cert.attest)?;
        files::write(&self.out_dir.join(CERTIFY_SIG), &cert.signature)?;
        files::write(&self.out_dir.join(AK_PEM), ak_pem.as_bytes())?;
        ctx.emit(&AttestSrkReport { dir: self.out_dir, nonce: self.nonce.0, certified })
    }
}

/// What `attest srk` wrote.
struct AttestSrkReport {
    dir: PathBuf,
    nonce: Vec<u8>,
    certified: CertifiedSrk,
}

impl Report for AttestSrkReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "Certified the SRK (name {}) with the AK over nonce {} into {}/{{{SRK_PUB},{SRK_PEM},{CERTIFY_MSG},{CERTIFY_SIG},{AK_PEM}}}",
            hex::encode(&self.certified.srk.name),
            hex::encode(&self.nonce),
            self.dir.display()
        )?;
        writeln!(
            out,
            "Check with: tpm-vault verify-srk --in-dir {} --nonce {} --ak ENROLLED_AK.pem --out DEVICE.srk",
            self.dir.display(),
            hex::encode(&self.nonce)
        )
    }

    fn json(&self) -> Value {
        let file = |name: &str| self.dir.join(name).display().to_string();
        json!({
            "out_dir": self.dir.display().to_string(),
            "nonce": hex::encode(&self.nonce),
            "srk_name": hex::encode(&self.certified.srk.name),
            "files": {
                "srk_tpm2b_public": file(SRK_PUB),
                "srk_public_key": file(SRK_PEM),
                "message": file(CERTIFY_MSG),
                "signature": file(CERTIFY_SIG),
                "ak_public_key": file(AK_PEM),
            },
        })
    }
}

/// `tpm-vault verify-srk`.
#[derive(Debug, Args)]
#[command(after_help = "Offline: no daemon and no TPM are needed here. Checks, in this order: the \
signature with the AK given, that the signed structure is a TPM2_Certify (magic 0xff544347, type \
TPM_ST_ATTEST_CERTIFY), the nonce, that the certified name is the name of DIR/srk.pub (nameAlg || \
H(TPMT_PUBLIC)), and that this is a storage key seal-for can seal for. Then writes that SRK to --out, \
for seal-for --srk; or names the failed check on stderr and exits 1.\n\nThe AK in the directory proves \
nothing (whoever wrote the files wrote it too): --ak is the key enrolled for the device, or the one its \
Keylime verifier attests.\n\nExamples:\n  \
tpm-vault verify-srk --in-dir d1 --nonce NONCE --ak device-1.ak.pem --out device-1.srk\n  \
tpm-vault seal-for --srk device-1.srk --pcr sha256:9=HEX wifi < psk > wifi.blob")]
pub(crate) struct VerifySrkArgs {
    /// Directory with srk.pub, certify.msg and certify.sig (from attest srk)
    #[arg(long, value_name = "DIR")]
    pub(crate) in_dir: PathBuf,
    /// The nonce the certification must be over, hex
    #[arg(long, value_name = "HEX", value_parser = parse_nonce)]
    pub(crate) nonce: Nonce,
    /// The device's enrolled attestation key: ECC P-256 or RSA, PEM or DER
    ///
    /// A Keylime registrar's aik_tpm (base64 TPM2B_PUBLIC of the RSA AK; attest srk --ak-alg
    /// rsa-2048) converts with `base64 -d > ak.tpm2b; tpm2_print -t TPM2B_PUBLIC -f pem ak.tpm2b`.
    #[arg(long, value_name = "FILE")]
    pub(crate) ak: PathBuf,
    /// Where to write the verified SRK; - for stdout (with --output json, it is in the object)
    #[arg(long, value_name = "FILE", default_value = "-")]
    pub(crate) out: PathBuf,
    /// Its encoding (pem only for the TCG-template SRK, which seal-for assumes for a PEM key)
    #[arg(long, value_enum, default_value = "tpm2b")]
    pub(crate) format: SrkFormat,
}

impl VerifySrkArgs {
    pub(crate) fn run(self, ctx: &Context) -> Result<(), CliError> {
        let read = |name: &str, what| files::read_limited(&self.in_dir.join(name), MAX_KEY_FILE, what);
        let attest = read(CERTIFY_MSG, "a TPMS_ATTEST")?;
        let signature = read(CERTIFY_SIG, "a TPMT_SIGNATURE")?;
        let srk_tpm2b_public = read(SRK_PUB, "a TPM2B_PUBLIC")?;
        let ak = files::read_limited(&self.ak, MAX_KEY_FILE, "a public key")?;
        let result = public_key_der(&ak).map_err(SrkCertError::Malformed).and_then(|ak_public_der| {
            SrkCertification { attest, signature, srk_tpm2b_public, ak_public_der }.verify(&self.nonce.0)
        });
        let certified = match result {
            Ok(certified) => certified,
            Err(e) => {
                if ctx.output == OutputFormat::Json {
                    ctx.emit(&VerifySrkReport { result: Err(e.clone()), out: None })?;
                }
                return Err(CliError::SrkRejected(e));
            }
        };
        let bytes = match self.format {
            SrkFormat::Tpm2b => certified.srk.tpm2b_public.clone(),
            SrkFormat::Pem => {
                let template =
                    tpm_vault_proto::sealed_blob::StorageKey::from_spki_as_tcg_srk(&certified.srk.public_der)
                        .map(|k| k.name);
                if template.as_ref() != Ok(&certified.srk.name) {
                    return Err(Error::InvalidInput(
                        "this SRK is not the TCG-template key seal-for takes a PEM key as: use --format tpm2b".into(),
                    )
                    .into());
                }
                certified.srk.public_pem.clone().into_bytes()
            }
        };
        let to_stdout = files::is_std(&self.out);
        match (to_stdout, ctx.output) {
            (true, OutputFormat::Text) => return files::write_stdout(&bytes),
            (true, OutputFormat::Json) => {}
            (false, _) => files::write(&self.out, &bytes)?,
        }
        let out = (!to_stdout).then(|| self.out.clone());
        ctx.emit(&VerifySrkReport { result: Ok(certified), out })
    }
}

/// The outcome of `verify-srk`.
struct VerifySrkReport {
    /// The certified SRK, or the failed check.
    result: Result<CertifiedSrk, SrkCertError>,
    /// The file the SRK was written to (none: stdout, or nothing on failure).
    out: Option<PathBuf>,
}

impl Report for VerifySrkReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        match &self.result {
            Ok(c) => {
                writeln!(out, "SRK certification OK")?;
                fields(
                    out,
                    &[
                        ("srk name", hex::encode(&c.srk.name)),
                        ("nonce", hex::encode(&c.nonce)),
                        ("signer", hex::encode(&c.signer)),
                        ("tpm clock", format!("{} ms (reset {}, restart {})", c.clock, c.reset_count, c.restart_count)),
                        ("firmware", format!("{:#018x}", c.firmware_version)),
                        ("written to", self.out.as_deref().map_or_else(|| "-".to_owned(), display)),
                    ],
                )
            }
            Err(e) => writeln!(out, "SRK certification rejected: {e}"),
        }
    }

    fn json(&self) -> Value {
        match &self.result {
            Ok(c) => json!({
                "valid": true,
                "srk_name": hex::encode(&c.srk.name),
                "srk_tpm2b_public": hex::encode(&c.srk.tpm2b_public),
                "srk_public_pem": c.srk.public_pem,
                "nonce": hex::encode(&c.nonce),
                "signer": hex::encode(&c.signer),
                "clock": c.clock,
                "reset_count": c.reset_count,
                "restart_count": c.restart_count,
                "firmware_version": c.firmware_version,
                "out": self.out.as_deref().map(display),
            }),
            Err(e) => json!({ "valid": false, "reason": e.reason(), "error": e.to_string() }),
        }
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
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

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::Parser;

    use super::super::attest::AttestCommand;
    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("tpm-vault").chain(args.iter().copied())).map(|cli| cli.command)
    }

    #[test]
    fn srk_attestation_args() {
        let Ok(Command::Attest(AttestCommand::Srk(args))) =
            parse(&["attest", "srk", "--nonce", "ab", "--out-dir", "d"])
        else {
            panic!("not attest srk")
        };
        assert_eq!((args.nonce, args.out_dir, args.ak_alg), (Nonce(vec![0xab]), PathBuf::from("d"), AkAlgArg::EccP256));
        let rsa = parse(&["attest", "srk", "--nonce", "ab", "--out-dir", "d", "--ak-alg", "rsa-2048"]);
        assert!(matches!(
            rsa,
            Ok(Command::Attest(AttestCommand::Srk(AttestSrkArgs { ak_alg: AkAlgArg::Rsa2048, .. })))
        ));
        let Ok(Command::VerifySrk(args)) = parse(&["verify-srk", "--in-dir", "d", "--nonce", "ab", "--ak", "a.pem"])
        else {
            panic!("not verify-srk")
        };
        assert_eq!((args.out, args.format), (PathBuf::from("-"), SrkFormat::Tpm2b));
        // The AK in the directory proves nothing: --ak is required.
        let missing = parse(&["verify-srk", "--in-dir", "d", "--nonce", "ab"]).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn rejection_json_names_the_reason() {
        let report = VerifySrkReport { result: Err(SrkCertError::BadSignature), out: None };
        let value = report.json();
        assert_eq!((&value["valid"], &value["reason"]), (&false.into(), &"bad_signature".into()));
    }
}
