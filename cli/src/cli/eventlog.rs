//! `tpm-vault eventlog show|replay` and `pcr predict`: the measured-boot event log and the PCR
//! values it (or a planned extend) leads to.
//!
//! Without `--log` the log comes from the daemon (GetEventLog), so a verifier reads the
//! device's log over the same API as its quote, and the daemon's privileges (not the
//! caller's) open the root-only sysfs file. Parsing, replay and checks are
//! [`tpm_vault_client::eventlog`]'s; this module only fetches, compares with the TPM and prints.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use tpm_vault_client::eventlog::{Event, EventData, EventLog, HashAlg, LogFormat, PcrCheck, Replay, MAX_LOG_SIZE};
use tpm_vault_client::{Error, PcrBinding};

use super::error::CliError;
use super::files;
use super::output::Report;
use super::Context;

/// Banks whose PCRs the API reads (and `seal --pcr` / `policy sign --pcr` take).
const API_BANKS: [HashAlg; 3] = [HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha384];

/// `tpm-vault eventlog ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum EventlogCommand {
    /// Print the events of the measured-boot log (PCR, type, digests, decoded data)
    Show(ShowArgs),
    /// Compute the PCR values the log implies and check them against the TPM's
    Replay(ReplayArgs),
}

impl EventlogCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            EventlogCommand::Show(args) => args.run(ctx).await,
            EventlogCommand::Replay(args) => args.run(ctx).await,
        }
    }
}

/// Where a log comes from.
#[derive(Debug, Args)]
pub(crate) struct LogSource {
    /// Read the log from FILE (e.g. /sys/kernel/security/tpm0/binary_bios_measurements, or
    /// eventlog.bin from `quote --with-eventlog`) [default: ask the daemon for the device's log]
    #[arg(long, value_name = "FILE")]
    pub(crate) log: Option<PathBuf>,
}

impl LogSource {
    /// The parsed log and where it came from.
    async fn load(&self, ctx: &mut Context) -> Result<(EventLog, String), CliError> {
        let (bytes, source) = match &self.log {
            Some(path) => (read_log(path)?, path.display().to_string()),
            None => {
                let (bytes, path) = ctx.client().await?.event_log().await?;
                (bytes, format!("daemon:{path}"))
            }
        };
        let log = EventLog::parse(&bytes).map_err(|e| Error::InvalidInput(format!("{source}: {e}")))?;
        Ok((log, source))
    }
}

/// Reads an event log file, bounded by [`MAX_LOG_SIZE`].
pub(crate) fn read_log(path: &Path) -> Result<Vec<u8>, CliError> {
    files::read_limited(path, MAX_LOG_SIZE, "an event log")
}

/// `tpm-vault eventlog show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    pub(crate) source: LogSource,
    /// Only the events of this PCR
    #[arg(long, value_name = "IDX")]
    pub(crate) pcr: Option<u32>,
}

impl ShowArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let (log, source) = self.source.load(ctx).await?;
        ctx.emit(&ShowReport { log, source, pcr: self.pcr })
    }
}

/// `tpm-vault eventlog replay`.
#[derive(Debug, Args)]
#[command(after_help = "Prints the value each PCR of each bank reaches by replaying the log. Unless --offline, \
the daemon's TPM values of the same PCRs are compared (banks sha1, sha256 and sha384; a bank the TPM lacks is \
reported as not compared); when a PCR differs, the first event to blame is named and the exit status is 1.")]
pub(crate) struct ReplayArgs {
    #[command(flatten)]
    pub(crate) source: LogSource,
    /// Do not compare with the TPM (needs --log: no daemon is contacted)
    #[arg(long, requires = "log")]
    pub(crate) offline: bool,
}

impl ReplayArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let (log, source) = self.source.load(ctx).await?;
        let replay = log.replay();
        let mut compared = BTreeMap::new();
        if !self.offline {
            let client = ctx.client().await?;
            for (&alg, pcrs) in &replay.pcrs {
                compared.insert(alg, compare_bank(&client, &log, alg, pcrs.keys().copied()).await?);
            }
        }
        let report = ReplayReport { source, format: log.format, events: log.events.len(), replay, compared };
        ctx.emit(&report)?;
        match report.first_disagreement() {
            Some(check) => Err(CliError::LogDisagrees(describe_check(check))),
            None => Ok(()),
        }
    }
}

/// One bank against the TPM: the checks, or why it was not compared.
async fn compare_bank(
    client: &tpm_vault_client::Client,
    log: &EventLog,
    alg: HashAlg,
    pcrs: impl Iterator<Item = u32>,
) -> Result<Result<Vec<PcrCheck>, String>, CliError> {
    if !API_BANKS.contains(&alg) {
        return Ok(Err(format!("the vault reads sha1, sha256 and sha384 PCRs, not {alg}")));
    }
    let Ok(selection) = PcrBinding::current(alg.name(), pcrs) else {
        return Ok(Err("the log extends no PCR of this bank".to_owned()));
    };
    match client.read_pcrs(Some(&selection)).await {
        Ok(values)
            if values.values.len() == values.pcrs.len() && values.values.iter().all(|v| v.len() == alg.size()) =>
        {
            let values: Vec<(u32, Vec<u8>)> = values.iter().map(|(pcr, v)| (pcr, v.to_vec())).collect();
            Ok(Ok(log.check(alg, &values)))
        }
        Ok(_) => Ok(Err(format!("the TPM has no {alg} bank allocated"))),
        Err(e) if e.code() == tonic::Code::InvalidArgument => Ok(Err(format!("the TPM has no {alg} bank: {e}"))),
        Err(e) => Err(e.into()),
    }
}

/// `sha256:9: log 0x.., TPM 0x..: CULPRIT`.
fn describe_check(check: &PcrCheck) -> String {
    let why = check.culprit.as_ref().map(ToString::to_string).unwrap_or_default();
    format!(
        "PCR {}:{}: the log replays to {}, the TPM holds {}: {why}",
        check.bank,
        check.pcr,
        hex::encode(&check.log),
        hex::encode(&check.tpm)
    )
}

/// An event as JSON.
pub(crate) fn event_json(event: &Event) -> Value {
    let digests: Map<String, Value> =
        event.digests.iter().map(|(alg, d)| (alg.name().to_owned(), Value::String(hex::encode(d)))).collect();
    let checked: Map<String, Value> = event
        .digests
        .iter()
        .filter_map(|(alg, _)| event.data_matches_digest(*alg).map(|ok| (alg.name().to_owned(), Value::Bool(ok))))
        .collect();
    json!({
        "index": event.index,
        "offset": event.offset,
        "pcr": event.pcr,
        "type": event.event_type.name(),
        "type_id": event.event_type.0,
        "extended": event.is_extended(),
        "digests": digests,
        "data_matches_digest": if checked.is_empty() { Value::Null } else { Value::Object(checked) },
        "data": data_json(&event.decoded()),
        "data_hex": hex::encode(&event.data),
    })
}

/// Decoded event data as JSON: `{"kind": ..., ...}`.
fn data_json(data: &EventData) -> Value {
    match data {
        EventData::Text(text) => json!({ "kind": "text", "text": text }),
        EventData::Separator(value) => json!({ "kind": "separator", "value": value }),
        EventData::Signature(signature) => json!({ "kind": "signature", "signature": signature }),
        EventData::StartupLocality(locality) => json!({ "kind": "startup_locality", "locality": locality }),
        EventData::UefiVariable { guid, name, value } => {
            json!({ "kind": "uefi_variable", "guid": guid, "name": name, "value": hex::encode(value) })
        }
        EventData::ImageLoad { address, length, link_time_address, device_path } => json!({
            "kind": "image_load",
            "address": address,
            "length": length,
            "link_time_address": link_time_address,
            "device_path": EventData::device_path_text(device_path),
        }),
        EventData::FirmwareBlob { base, length } => json!({ "kind": "firmware_blob", "base": base, "length": length }),
        // Raw bytes are in `data_hex` already.
        _ => json!({ "kind": "raw" }),
    }
}

/// An event as text: a heading line, its digests and its data.
pub(crate) fn event_text(event: &Event, out: &mut dyn Write, indent: &str) -> io::Result<()> {
    let extended = if event.is_extended() { "" } else { " (not extended)" };
    writeln!(
        out,
        "{indent}event {} at offset {}: PCR {} {}{extended}",
        event.index, event.offset, event.pcr, event.event_type
    )?;
    for (alg, digest) in &event.digests {
        let check = match event.data_matches_digest(*alg) {
            Some(false) => "  (NOT the hash of the data)",
            _ => "",
        };
        writeln!(out, "{indent}  {:<7} {}{check}", format!("{alg}:"), hex::encode(digest))?;
    }
    writeln!(out, "{indent}  data:   {}", event.decoded())
}

/// `eventlog show`'s result.
struct ShowReport {
    log: EventLog,
    source: String,
    pcr: Option<u32>,
}

impl ShowReport {
    fn events(&self) -> impl Iterator<Item = &Event> {
        self.log.events.iter().filter(|e| self.pcr.is_none_or(|pcr| e.pcr == pcr))
    }
}

fn format_name(format: LogFormat) -> &'static str {
    match format {
        LogFormat::CryptoAgile => "crypto_agile",
        LogFormat::Sha1 => "sha1",
    }
}

fn bank_names(banks: &[HashAlg]) -> Vec<&'static str> {
    banks.iter().map(|b| b.name()).collect()
}

impl Report for ShowReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{}: {} events, {} log, banks {}",
            self.source,
            self.log.events.len(),
            format_name(self.log.format),
            bank_names(&self.log.banks()).join(", ")
        )?;
        for event in self.events() {
            event_text(event, out, "")?;
        }
        Ok(())
    }

    fn json(&self) -> Value {
        json!({
            "source": self.source,
            "format": format_name(self.log.format),
            "banks": bank_names(&self.log.banks()),
            "events": self.events().map(event_json).collect::<Vec<_>>(),
        })
    }
}

/// `eventlog replay`'s result.
struct ReplayReport {
    source: String,
    format: LogFormat,
    events: usize,
    replay: Replay,
    /// Per bank: the checks against the TPM, or why it was not compared. Empty when offline.
    compared: BTreeMap<HashAlg, Result<Vec<PcrCheck>, String>>,
}

impl ReplayReport {
    fn first_disagreement(&self) -> Option<&PcrCheck> {
        self.compared.values().filter_map(|c| c.as_ref().ok()).flatten().find(|c| !c.ok())
    }

    fn check(&self, alg: HashAlg, pcr: u32) -> Option<&PcrCheck> {
        self.compared.get(&alg)?.as_ref().ok()?.iter().find(|c| c.pcr == pcr)
    }
}

impl Report for ReplayReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}: {} events, {} log", self.source, self.events, format_name(self.format))?;
        for (alg, pcrs) in &self.replay.pcrs {
            match self.compared.get(alg) {
                Some(Err(why)) => writeln!(out, "  {alg}: (not compared with the TPM: {why})")?,
                _ => writeln!(out, "  {alg}:")?,
            }
            for (pcr, value) in pcrs {
                let verdict = match self.check(*alg, *pcr) {
                    None => String::new(),
                    Some(check) if check.ok() => "  TPM agrees".to_owned(),
                    Some(check) => format!(
                        "  TPM DIFFERS: 0x{}; {}",
                        hex::encode_upper(&check.tpm),
                        check.culprit.as_ref().map(ToString::to_string).unwrap_or_default()
                    ),
                };
                writeln!(out, "    {pcr:<2}: 0x{}{verdict}", hex::encode_upper(value))?;
            }
        }
        if !self.compared.is_empty() {
            let verdict = if self.first_disagreement().is_some() { "NO" } else { "yes" };
            writeln!(out, "TPM agrees with the log: {verdict}")?;
        }
        Ok(())
    }

    fn json(&self) -> Value {
        let pcrs: Map<String, Value> = self
            .replay
            .pcrs
            .iter()
            .map(|(alg, values)| {
                let values: Map<String, Value> =
                    values.iter().map(|(pcr, v)| (pcr.to_string(), Value::String(hex::encode(v)))).collect();
                (alg.name().to_owned(), Value::Object(values))
            })
            .collect();
        let tpm: Map<String, Value> = self
            .compared
            .iter()
            .map(|(alg, result)| {
                let value = match result {
                    Ok(checks) => json!({
                        "compared": true,
                        "agrees": checks.iter().all(PcrCheck::ok),
                        "pcrs": checks.iter().map(check_json).collect::<Vec<_>>(),
                    }),
                    Err(why) => json!({ "compared": false, "reason": why }),
                };
                (alg.name().to_owned(), value)
            })
            .collect();
        let agrees =
            if self.compared.is_empty() { Value::Null } else { Value::Bool(self.first_disagreement().is_none()) };
        json!({
            "source": self.source,
            "format": format_name(self.format),
            "events": self.events,
            "pcrs": pcrs,
            "tpm": tpm,
            "tpm_agrees": agrees,
        })
    }
}

/// A PCR check as JSON.
pub(crate) fn check_json(check: &PcrCheck) -> Value {
    json!({
        "pcr": check.pcr,
        "log": hex::encode(&check.log),
        "tpm": hex::encode(&check.tpm),
        "ok": check.ok(),
        "culprit": check.culprit.as_ref().map(|c| json!({
            "reason": c.reason(),
            "event": c.event(),
            "message": c.to_string(),
        })),
    })
}

/// `tpm-vault pcr predict`.
///
/// Extends are applied in command-line order, `--extend-digest` and `--extend-file` mixed
/// (hence the hand-written [`clap::FromArgMatches`]: derive would give two separate lists).
#[derive(Debug)]
pub(crate) struct PredictArgs {
    /// The PCR, `BANK:IDX`.
    pub(crate) pcr: (HashAlg, u32),
    /// The starting value.
    pub(crate) from: From,
    /// The extends, in order.
    pub(crate) extends: Vec<Extend>,
}

/// Where `pcr predict` starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum From {
    /// The PCR's current value in the TPM (asks the daemon).
    Current,
    /// All zeros: the value after a reboot, before the boot loader measures anything.
    Zero,
    /// A given value.
    Value(Vec<u8>),
}

/// One extend of `pcr predict`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Extend {
    /// A digest, extended as given.
    Digest(Vec<u8>),
    /// A file, whose digest (in the PCR's bank) is extended: a kernel image, say.
    File(PathBuf),
}

const PREDICT_HELP: &str = "Prints BANK:IDX=HEX, the form `seal --pcr` and `policy sign --pcr` take. Each \
extend computes PCR = H(PCR || digest), as TPM2_PCR_Extend does; --extend-digest and --extend-file are applied \
in the order given.\n\nExample: the PCR 9 a boot loader that measures the kernel image (wolfBoot) will leave \
after a reboot into a new kernel:\n  tpm-vault pcr predict --pcr sha256:9 --from zero --extend-file vmlinuz-new";

impl clap::Args for PredictArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction};
        cmd.arg(
            Arg::new("pcr")
                .long("pcr")
                .value_name("BANK:IDX")
                .required(true)
                .value_parser(parse_predict_pcr)
                .help("The PCR, e.g. sha256:9 (banks sha1, sha256, sha384, sha512, sm3_256)"),
        )
        .arg(
            Arg::new("from")
                .long("from")
                .value_name("current|zero|HEX")
                .default_value("zero")
                .value_parser(parse_from)
                .help("Start from the TPM's current value, from zero (after a reboot), or from HEX"),
        )
        .arg(
            Arg::new("extend-digest")
                .long("extend-digest")
                .value_name("HEX")
                .action(ArgAction::Append)
                .value_parser(parse_digest)
                .help("Extend this digest (the bank's size); repeatable"),
        )
        .arg(
            Arg::new("extend-file")
                .long("extend-file")
                .value_name("FILE")
                .action(ArgAction::Append)
                .value_parser(clap::value_parser!(PathBuf))
                .help("Extend the digest of this file (in the PCR's bank); repeatable"),
        )
        .after_help(PREDICT_HELP)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for PredictArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let missing = || clap::Error::new(clap::error::ErrorKind::MissingRequiredArgument);
        let pcr = *matches.get_one::<(HashAlg, u32)>("pcr").ok_or_else(missing)?;
        let from = matches.get_one::<From>("from").cloned().unwrap_or(From::Zero);
        let mut extends: Vec<(usize, Extend)> = Vec::new();
        if let (Some(values), Some(at)) =
            (matches.get_many::<Vec<u8>>("extend-digest"), matches.indices_of("extend-digest"))
        {
            extends.extend(at.zip(values.cloned().map(Extend::Digest)));
        }
        if let (Some(values), Some(at)) =
            (matches.get_many::<PathBuf>("extend-file"), matches.indices_of("extend-file"))
        {
            extends.extend(at.zip(values.cloned().map(Extend::File)));
        }
        extends.sort_by_key(|(at, _)| *at);
        Ok(PredictArgs { pcr, from, extends: extends.into_iter().map(|(_, e)| e).collect() })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

fn parse_predict_pcr(text: &str) -> Result<(HashAlg, u32), String> {
    let (bank, index) = text.split_once(':').ok_or("expected BANK:IDX, e.g. sha256:9")?;
    let alg = HashAlg::from_name(bank.trim())
        .ok_or_else(|| format!("unknown PCR bank {bank:?} (expected sha1, sha256, sha384, sha512 or sm3_256)"))?;
    let pcr = index.trim().parse::<u32>().ok().filter(|&p| p <= tpm_vault_client::eventlog::MAX_PCR);
    let pcr = pcr.ok_or_else(|| format!("{index:?} is not a PCR index (0-23)"))?;
    Ok((alg, pcr))
}

fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")).unwrap_or(text);
    hex::decode(digits).map_err(|e| format!("not hex: {e}"))
}

fn parse_from(text: &str) -> Result<From, String> {
    match text {
        "current" => Ok(From::Current),
        "zero" => Ok(From::Zero),
        hex => parse_hex(hex).map(From::Value),
    }
}

fn parse_digest(text: &str) -> Result<Vec<u8>, String> {
    parse_hex(text)
}

impl PredictArgs {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let (alg, pcr) = self.pcr;
        let size_error = |what: &str, len: usize| {
            CliError::from(Error::InvalidInput(format!(
                "{what} has {len} bytes, but {alg} digests have {}",
                alg.size()
            )))
        };
        let mut value = match &self.from {
            From::Zero => vec![0; alg.size()],
            From::Value(value) => value.clone(),
            From::Current => {
                let selection = PcrBinding::current(alg.name(), [pcr])?;
                let values = ctx.client().await?.read_pcrs(Some(&selection)).await?;
                values.value(pcr).map(<[u8]>::to_vec).unwrap_or_default()
            }
        };
        if value.len() != alg.size() {
            return Err(size_error("the starting value", value.len()));
        }
        let start = value.clone();
        let mut digests = Vec::with_capacity(self.extends.len());
        for extend in &self.extends {
            let digest = match extend {
                Extend::Digest(digest) if digest.len() != alg.size() => {
                    return Err(size_error(&format!("--extend-digest {}", hex::encode(digest)), digest.len()))
                }
                Extend::Digest(digest) => digest.clone(),
                Extend::File(path) => alg.digest(&std::fs::read(path).map_err(CliError::read(path))?),
            };
            value = alg.extend(&value, &digest);
            digests.push(digest);
        }
        ctx.emit(&PredictReport { alg, pcr, start, digests, value })
    }
}

/// `pcr predict`'s result.
struct PredictReport {
    alg: HashAlg,
    pcr: u32,
    start: Vec<u8>,
    digests: Vec<Vec<u8>>,
    value: Vec<u8>,
}

impl PredictReport {
    /// `BANK:IDX=HEX`, as [`PcrBinding`]'s text form.
    fn binding(&self) -> String {
        format!("{}:{}={}", self.alg, self.pcr, hex::encode(&self.value))
    }
}

impl Report for PredictReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}", self.binding())
    }

    fn json(&self) -> Value {
        json!({
            "bank": self.alg.name(),
            "pcr": self.pcr,
            "from": hex::encode(&self.start),
            "extends": self.digests.iter().map(hex::encode).collect::<Vec<_>>(),
            "value": hex::encode(&self.value),
            "binding": self.binding(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> PredictArgs {
        use clap::Parser;
        let cli = super::super::Cli::try_parse_from(std::iter::once("tpm-vault").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{e}"));
        match cli.command {
            super::super::Command::Pcr(super::super::attest::PcrCommand::Predict(args)) => args,
            other => panic!("not pcr predict: {other:?}"),
        }
    }

    #[test]
    fn predict_keeps_the_order_of_mixed_extends() {
        let d = "11".repeat(32);
        let args = parse(&[
            "pcr",
            "predict",
            "--pcr",
            "sha256:9",
            "--extend-file",
            "a",
            "--extend-digest",
            &d,
            "--extend-file",
            "b",
        ]);
        assert_eq!(args.pcr, (HashAlg::Sha256, 9));
        assert_eq!(args.from, From::Zero);
        assert_eq!(
            args.extends,
            vec![Extend::File("a".into()), Extend::Digest(vec![0x11; 32]), Extend::File("b".into())]
        );
        let args = parse(&["pcr", "predict", "--pcr", "sha384:0", "--from", "current"]);
        assert_eq!((args.pcr, args.from, args.extends.len()), ((HashAlg::Sha384, 0), From::Current, 0));
        assert!(parse_predict_pcr("md5:9").unwrap_err().contains("unknown PCR bank"));
        assert!(parse_predict_pcr("sha256:24").unwrap_err().contains("not a PCR index"));
    }

    #[test]
    fn predicted_binding_is_what_seal_and_policy_sign_parse() {
        let report =
            PredictReport { alg: HashAlg::Sha256, pcr: 9, start: vec![0; 32], digests: vec![], value: vec![0xab; 32] };
        let binding: PcrBinding = report.binding().parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((binding.bank(), binding.pcrs(), binding.values()), ("sha256", &[9][..], &[vec![0xab; 32]][..]));
    }
}
