//! The TPM event log: parsing, decoding and replaying a measured-boot log.
//!
//! Owns the parser of the log format of the TCG PC Client Platform Firmware Profile (PFP) as
//! Linux exposes it in `/sys/kernel/security/tpm0/binary_bios_measurements` ([`EventLog::parse`]):
//! the SHA-1 `TCG_PCR_EVENT` header carrying the `Spec ID Event03` structure, then crypto-agile
//! `TCG_PCR_EVENT2` entries with one digest per bank the header declares (SHA-1, SHA-256,
//! SHA-384, SHA-512, SM3-256). Logs without that header are read in the older SHA-1-only
//! format (every entry a `TCG_PCR_EVENT`). Event types are named (`event_type`), event data is
//! decoded where it is text, a UEFI variable, an image load or a firmware blob (`data`), and
//! [`EventLog::replay`] computes the PCR values the log implies, checks them against the
//! TPM's and names the first event at which a PCR breaks (`replay`).
//!
//! The log is untrusted input (it comes from firmware, and for a verifier over the network):
//! every length is checked against the bytes that are actually there before anything is
//! allocated, sizes are bounded ([`MAX_LOG_SIZE`], at most [`MAX_BANKS`] banks), and every
//! error names the byte offset where the input went wrong. The parser never panics (it is
//! fuzzed: `fuzz/fuzz_targets/eventlog.rs`).
//!
//! It does not read files or talk to the daemon: the CLI (`eventlog show|replay`,
//! `verify-quote --eventlog`) and [`Client::event_log`](crate::Client::event_log) do.
//!
//! No crate was fit to use: `eventlog-rs` (0.1) reads confidential-computing (TDX) logs with
//! unchecked lengths and `anyhow` errors, `tcg-log-core-rs` (0.1, "early, API may change")
//! reads Windows WBCL buffers; neither replays every bank nor reports offsets.

mod data;
mod event_type;
mod replay;

pub use data::{DevicePathNode, EventData};
pub use event_type::EventType;
pub use replay::{Culprit, PcrCheck, Replay, DEFAULT_EVENT_LOG};

use std::fmt;

/// Largest log accepted (real logs are 10-200 KiB; the TPM spec has no bound).
pub const MAX_LOG_SIZE: usize = 4 * 1024 * 1024;

/// Most banks (digest algorithms) a log may declare.
pub const MAX_BANKS: usize = 16;

/// Highest PCR index an event may name (a PC-client TPM has PCRs 0-23).
pub const MAX_PCR: u32 = 23;

/// EV_NO_ACTION: events that are logged but not extended.
const EV_NO_ACTION: u32 = 0x3;
/// Size of a `TCG_PCR_EVENT` header before its data: pcrIndex, eventType, SHA-1 digest, eventSize.
const SHA1_EVENT_HEADER: usize = 4 + 4 + 20 + 4;
/// Signature of the crypto-agile log's first event.
const SPEC_ID_03: &[u8; 16] = b"Spec ID Event03\0";

/// A PCR bank's hash algorithm, with its TPM_ALG_ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HashAlg {
    /// SHA-1 (TPM_ALG_SHA1, 0x0004).
    Sha1,
    /// SHA-256 (TPM_ALG_SHA256, 0x000B).
    Sha256,
    /// SHA-384 (TPM_ALG_SHA384, 0x000C).
    Sha384,
    /// SHA-512 (TPM_ALG_SHA512, 0x000D).
    Sha512,
    /// SM3-256 (TPM_ALG_SM3_256, 0x0012).
    Sm3_256,
}

impl HashAlg {
    /// Every algorithm, in TPM_ALG_ID order.
    pub const ALL: [HashAlg; 5] = [HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha384, HashAlg::Sha512, HashAlg::Sm3_256];

    /// The algorithm with TPM_ALG_ID `id`, if it is one of these.
    pub fn from_id(id: u16) -> Option<HashAlg> {
        HashAlg::ALL.into_iter().find(|alg| alg.id() == id)
    }

    /// The algorithm (bank) called `name` (`sha1`, `sha256`, `sha384`, `sha512`, `sm3_256`).
    pub fn from_name(name: &str) -> Option<HashAlg> {
        HashAlg::ALL.into_iter().find(|alg| alg.name() == name)
    }

    /// TPM_ALG_ID.
    pub fn id(self) -> u16 {
        match self {
            HashAlg::Sha1 => 0x0004,
            HashAlg::Sha256 => 0x000b,
            HashAlg::Sha384 => 0x000c,
            HashAlg::Sha512 => 0x000d,
            HashAlg::Sm3_256 => 0x0012,
        }
    }

    /// The bank's name, as tpm2-tools and the API write it.
    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Sha1 => "sha1",
            HashAlg::Sha256 => "sha256",
            HashAlg::Sha384 => "sha384",
            HashAlg::Sha512 => "sha512",
            HashAlg::Sm3_256 => "sm3_256",
        }
    }

    /// Digest size in bytes.
    pub fn size(self) -> usize {
        match self {
            HashAlg::Sha1 => 20,
            HashAlg::Sha256 | HashAlg::Sm3_256 => 32,
            HashAlg::Sha384 => 48,
            HashAlg::Sha512 => 64,
        }
    }

    /// The digest of `data`.
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        use aws_lc_rs::digest::{digest, SHA1_FOR_LEGACY_USE_ONLY, SHA256, SHA384, SHA512};
        use sm3::Digest as _;
        match self {
            HashAlg::Sha1 => digest(&SHA1_FOR_LEGACY_USE_ONLY, data).as_ref().to_vec(),
            HashAlg::Sha256 => digest(&SHA256, data).as_ref().to_vec(),
            HashAlg::Sha384 => digest(&SHA384, data).as_ref().to_vec(),
            HashAlg::Sha512 => digest(&SHA512, data).as_ref().to_vec(),
            HashAlg::Sm3_256 => sm3::Sm3::digest(data).to_vec(),
        }
    }

    /// TPM2_PCR_Extend: the value a PCR holding `pcr` takes when `digest` is extended into it,
    /// `H(pcr || digest)`.
    pub fn extend(self, pcr: &[u8], digest: &[u8]) -> Vec<u8> {
        self.digest(&[pcr, digest].concat())
    }
}

impl fmt::Display for HashAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which of the two log formats a log is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Crypto-agile (TPM 2.0 firmware): a `Spec ID Event03` header, then `TCG_PCR_EVENT2`.
    CryptoAgile,
    /// SHA-1 only (TPM 1.2 firmware, or TPM 2.0 firmware in SHA-1 mode): `TCG_PCR_EVENT` entries.
    Sha1,
}

/// The crypto-agile log's header (`TCG_EfiSpecIDEvent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecId {
    /// Platform class: 0 client, 1 server.
    pub platform_class: u32,
    /// Spec version, `(major, minor, errata)`.
    pub version: (u8, u8, u8),
    /// UINTN size of the firmware: 1 for 32-bit, 2 for 64-bit.
    pub uintn_size: u8,
    /// The banks every event carries a digest for, in the header's order.
    pub banks: Vec<HashAlg>,
    /// Vendor information.
    pub vendor_info: Vec<u8>,
}

/// One event of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Position in the log, counting the header event as 0.
    pub index: usize,
    /// Byte offset of the event in the log.
    pub offset: usize,
    /// The PCR it was extended into (or would be, for EV_NO_ACTION).
    pub pcr: u32,
    /// Its type.
    pub event_type: EventType,
    /// One digest per bank, in the log's order (a SHA-1 log: one SHA-1 digest).
    pub digests: Vec<(HashAlg, Vec<u8>)>,
    /// The event data, raw.
    pub data: Vec<u8>,
}

impl Event {
    /// The event's digest for `alg`, if it carries one.
    pub fn digest(&self, alg: HashAlg) -> Option<&[u8]> {
        self.digests.iter().find(|(a, _)| *a == alg).map(|(_, d)| d.as_slice())
    }

    /// True if the event is extended into its PCR (every type but EV_NO_ACTION).
    pub fn is_extended(&self) -> bool {
        self.event_type.0 != EV_NO_ACTION
    }

    /// The event data, decoded as far as its type says how.
    pub fn decoded(&self) -> EventData {
        EventData::decode(self.event_type, &self.data)
    }

    /// For event types whose digest is defined as the hash of the event data: whether the
    /// `alg` digest matches the data (`Some(false)`: the log does not tell what was measured).
    /// `None` when the type's digest covers something else (an image, a firmware blob) or
    /// the event has no such digest.
    pub fn data_matches_digest(&self, alg: HashAlg) -> Option<bool> {
        let digest = self.digest(alg)?;
        let covered = self.event_type.digest_covers_data(&self.data)?;
        Some(covered.iter().any(|part| alg.digest(part) == digest))
    }
}

/// A parsed event log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLog {
    /// The format.
    pub format: LogFormat,
    /// The crypto-agile header, if the log has one.
    pub spec_id: Option<SpecId>,
    /// All events in order, including the header event (index 0).
    pub events: Vec<Event>,
}

/// Why a log could not be parsed. Each variant names the byte offset where it went wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventLogError {
    /// The log ends inside a structure.
    #[error("event log truncated at offset {offset}: {what} needs {needed} bytes, {available} left")]
    Truncated {
        /// Where the structure starts.
        offset: usize,
        /// The structure or field.
        what: &'static str,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the log.
        available: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("invalid event log at offset {offset}: {reason}")]
    Invalid {
        /// Where the field is.
        offset: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The log is larger than [`MAX_LOG_SIZE`].
    #[error("event log of {size} bytes is larger than the {MAX_LOG_SIZE} bytes accepted")]
    TooLarge {
        /// Its size.
        size: usize,
    },
    /// The log has no event at all.
    #[error("event log is empty")]
    Empty,
}

impl EventLog {
    /// Parses a log in either format (the crypto-agile one if its first event is a
    /// `Spec ID Event03` header, the SHA-1 one otherwise).
    ///
    /// # Errors
    /// [`EventLogError`] naming the offset of the first malformed structure.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::eventlog::{EventLog, HashAlg};
    ///
    /// let bytes = std::fs::read("/sys/kernel/security/tpm0/binary_bios_measurements")?;
    /// let log = EventLog::parse(&bytes)?;
    /// let replay = log.replay();
    /// if let Some(pcr7) = replay.value(HashAlg::Sha256, 7) {
    ///     println!("PCR 7 should be {}", hex::encode(pcr7));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parse(bytes: &[u8]) -> Result<EventLog, EventLogError> {
        if bytes.len() > MAX_LOG_SIZE {
            return Err(EventLogError::TooLarge { size: bytes.len() });
        }
        if bytes.is_empty() {
            return Err(EventLogError::Empty);
        }
        let mut r = Reader { bytes, at: 0 };
        let first = read_sha1_event(&mut r, 0)?;
        let spec_id = if first.event_type.0 == EV_NO_ACTION && first.pcr == 0 && first.data.starts_with(SPEC_ID_03) {
            Some(parse_spec_id(&first.data, first.offset + SHA1_EVENT_HEADER)?)
        } else {
            None
        };
        let mut events = vec![first];
        while r.remaining() > 0 {
            let index = events.len();
            let event = match &spec_id {
                Some(spec) => read_agile_event(&mut r, index, &spec.banks)?,
                None => read_sha1_event(&mut r, index)?,
            };
            events.push(event);
        }
        let format = if spec_id.is_some() { LogFormat::CryptoAgile } else { LogFormat::Sha1 };
        Ok(EventLog { format, spec_id, events })
    }

    /// The banks the log has digests for: the header's list, or SHA-1 for a SHA-1 log.
    pub fn banks(&self) -> Vec<HashAlg> {
        match &self.spec_id {
            Some(spec) => spec.banks.clone(),
            None => vec![HashAlg::Sha1],
        }
    }
}

/// A bounds-checked little-endian reader.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// The next `len` bytes, or a truncation error naming `what` and where it started.
    fn take(&mut self, len: u64, what: &'static str, start: usize) -> Result<&'a [u8], EventLogError> {
        let available = self.remaining();
        let n = usize::try_from(len).ok().filter(|&n| n <= available).ok_or(EventLogError::Truncated {
            offset: start,
            what,
            needed: len,
            available,
        })?;
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, EventLogError> {
        let at = self.at;
        Ok(self.take(1, what, at)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, EventLogError> {
        let at = self.at;
        let b = self.take(2, what, at)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, EventLogError> {
        let at = self.at;
        let b = self.take(4, what, at)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn invalid(offset: usize, reason: String) -> EventLogError {
    EventLogError::Invalid { offset, reason }
}

/// The PCR index field, checked.
fn read_pcr(r: &mut Reader<'_>) -> Result<u32, EventLogError> {
    let at = r.at;
    let pcr = r.u32("pcrIndex")?;
    if pcr > MAX_PCR {
        return Err(invalid(at, format!("PCR index {pcr} is out of range (0-{MAX_PCR})")));
    }
    Ok(pcr)
}

/// The eventSize field and the data it announces (checked against what is left before any
/// allocation, so a 4 GiB size in a 100-byte log is an error, not an allocation).
fn read_data(r: &mut Reader<'_>) -> Result<Vec<u8>, EventLogError> {
    let at = r.at;
    let size = r.u32("eventSize")?;
    Ok(r.take(u64::from(size), "event data", at)?.to_vec())
}

/// A `TCG_PCR_EVENT`: pcrIndex, eventType, SHA-1 digest, eventSize, event.
fn read_sha1_event(r: &mut Reader<'_>, index: usize) -> Result<Event, EventLogError> {
    let offset = r.at;
    if r.remaining() < SHA1_EVENT_HEADER {
        return Err(EventLogError::Truncated {
            offset,
            what: "TCG_PCR_EVENT header",
            needed: SHA1_EVENT_HEADER as u64,
            available: r.remaining(),
        });
    }
    let pcr = read_pcr(r)?;
    let event_type = EventType(r.u32("eventType")?);
    let digest = r.take(20, "SHA-1 digest", offset)?.to_vec();
    let data = read_data(r)?;
    Ok(Event { index, offset, pcr, event_type, digests: vec![(HashAlg::Sha1, digest)], data })
}

/// A `TCG_PCR_EVENT2`: pcrIndex, eventType, TPML_DIGEST_VALUES, eventSize, event.
fn read_agile_event(r: &mut Reader<'_>, index: usize, banks: &[HashAlg]) -> Result<Event, EventLogError> {
    let offset = r.at;
    let pcr = read_pcr(r)?;
    let event_type = EventType(r.u32("eventType")?);
    let count_at = r.at;
    let count = r.u32("digest count")?;
    if count as usize > banks.len() {
        return Err(invalid(
            count_at,
            format!("event {index} has {count} digests, but the log declares {} banks", banks.len()),
        ));
    }
    let mut digests = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let alg_at = r.at;
        let id = r.u16("digest algorithm")?;
        let alg = HashAlg::from_id(id).filter(|alg| banks.contains(alg)).ok_or_else(|| {
            invalid(alg_at, format!("event {index}: algorithm {id:#06x} is not declared in the log's header"))
        })?;
        if digests.iter().any(|(a, _)| *a == alg) {
            return Err(invalid(alg_at, format!("event {index}: two {alg} digests")));
        }
        let digest = r.take(alg.size() as u64, "digest", alg_at)?.to_vec();
        digests.push((alg, digest));
    }
    let data = read_data(r)?;
    Ok(Event { index, offset, pcr, event_type, digests, data })
}

/// The `TCG_EfiSpecIDEvent` in the header event's data, which starts at `base` in the log
/// (errors name offsets in the log, not in the data).
fn parse_spec_id(data: &[u8], base: usize) -> Result<SpecId, EventLogError> {
    let mut r = Reader { bytes: data, at: 0 };
    spec_id_fields(&mut r).map_err(|e| match e {
        EventLogError::Truncated { offset, what, needed, available } => {
            EventLogError::Truncated { offset: base + offset, what, needed, available }
        }
        EventLogError::Invalid { offset, reason } => invalid(base + offset, reason),
        other => other,
    })
}

fn spec_id_fields(r: &mut Reader<'_>) -> Result<SpecId, EventLogError> {
    r.take(16, "Spec ID signature", 0)?;
    let platform_class = r.u32("platformClass")?;
    let minor = r.u8("specVersionMinor")?;
    let major = r.u8("specVersionMajor")?;
    let errata = r.u8("specErrata")?;
    let uintn_size = r.u8("uintnSize")?;
    let count_at = r.at;
    let count = r.u32("numberOfAlgorithms")?;
    if count == 0 || count as usize > MAX_BANKS {
        return Err(invalid(count_at, format!("the header declares {count} banks (1 to {MAX_BANKS} accepted)")));
    }
    let mut banks = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let alg_at = r.at;
        let id = r.u16("algorithmId")?;
        let size = r.u16("digestSize")?;
        let alg = HashAlg::from_id(id).ok_or_else(|| {
            invalid(alg_at, format!("unknown algorithm id {id:#06x} in the header (digest size {size})"))
        })?;
        if usize::from(size) != alg.size() {
            return Err(invalid(alg_at, format!("{alg} digests have {} bytes, the header says {size}", alg.size())));
        }
        if banks.contains(&alg) {
            return Err(invalid(alg_at, format!("the header declares {alg} twice")));
        }
        banks.push(alg);
    }
    let vendor_size = r.u8("vendorInfoSize")?;
    let at = r.at;
    let vendor_info = r.take(u64::from(vendor_size), "vendorInfo", at)?.to_vec();
    Ok(SpecId { platform_class, version: (major, minor, errata), uintn_size, banks, vendor_info })
}

#[cfg(test)]
mod tests;
