//! Replay: the PCR values a log implies, per bank, and the check of those values against the
//! TPM's, naming the first event at which a PCR breaks.
//!
//! A PCR starts at zero (PCR 0 at the locality of the StartupLocality EV_NO_ACTION event, if
//! the log has one) and each event that is not EV_NO_ACTION extends its digest into it:
//! `pcr = H(pcr || digest)`. PCRs 17-22 would start at all ones on a platform that never ran
//! a dynamic launch; their events are in a separate (DRTM) log, not this one.

use std::collections::BTreeMap;
use std::fmt;

use super::data::STARTUP_LOCALITY;
use super::{Event, EventLog, EventType, HashAlg};

/// Where Linux exposes the firmware's event log.
pub const DEFAULT_EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// The PCR values a log implies: for each bank the log has digests for, each PCR that any
/// event extends (and PCR 0 when the log sets its initial value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Bank -> PCR index -> value.
    pub pcrs: BTreeMap<HashAlg, BTreeMap<u32, Vec<u8>>>,
}

impl Replay {
    /// The value PCR `pcr` of bank `alg` has after the log, if the log touches it.
    pub fn value(&self, alg: HashAlg, pcr: u32) -> Option<&[u8]> {
        self.pcrs.get(&alg)?.get(&pcr).map(Vec::as_slice)
    }
}

/// Why a PCR's value and the log disagree, naming the first event to blame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Culprit {
    /// The event's digest in this bank is not the hash of its data, though its type says it
    /// must be: the log does not say what was measured (the data or the digest was altered).
    DigestDoesNotMatchData {
        /// The event's index.
        event: usize,
        /// Its offset in the log.
        offset: usize,
        /// Its type.
        event_type: EventType,
    },
    /// The TPM holds the value the log reaches just before this event: this event and the
    /// later ones of the PCR were never extended into the TPM.
    NotInTpm {
        /// The event's index.
        event: usize,
        /// Its offset in the log.
        offset: usize,
        /// Its type.
        event_type: EventType,
    },
    /// The event has no digest for this bank, so the bank cannot be replayed.
    MissingDigest {
        /// The event's index.
        event: usize,
        /// Its offset in the log.
        offset: usize,
        /// Its type.
        event_type: EventType,
    },
    /// The replayed value differs and no single event shows why (a digest was changed, an
    /// event removed, or the TPM was extended by something that did not log it).
    Unexplained {
        /// How many events the log has for this PCR.
        events: usize,
    },
}

impl Culprit {
    /// The index of the event blamed, if one is.
    pub fn event(&self) -> Option<usize> {
        match self {
            Culprit::DigestDoesNotMatchData { event, .. }
            | Culprit::NotInTpm { event, .. }
            | Culprit::MissingDigest { event, .. } => Some(*event),
            Culprit::Unexplained { .. } => None,
        }
    }

    /// A short stable name, for programs: `digest_does_not_match_data`, `not_in_tpm`, ...
    pub fn reason(&self) -> &'static str {
        match self {
            Culprit::DigestDoesNotMatchData { .. } => "digest_does_not_match_data",
            Culprit::NotInTpm { .. } => "not_in_tpm",
            Culprit::MissingDigest { .. } => "missing_digest",
            Culprit::Unexplained { .. } => "unexplained",
        }
    }
}

impl fmt::Display for Culprit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Culprit::DigestDoesNotMatchData { event, offset, event_type } => {
                write!(f, "event {event} ({event_type} at offset {offset}): its digest is not the hash of its data")
            }
            Culprit::NotInTpm { event, offset, event_type } => write!(
                f,
                "event {event} ({event_type} at offset {offset}): the TPM holds the value before it, so it and \
                 the later events were not measured"
            ),
            Culprit::MissingDigest { event, offset, event_type } => {
                write!(f, "event {event} ({event_type} at offset {offset}) has no digest for this bank")
            }
            Culprit::Unexplained { events } => {
                write!(f, "none of its {events} events alone explains the difference")
            }
        }
    }
}

/// One PCR checked against the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcrCheck {
    /// The bank.
    pub bank: HashAlg,
    /// The PCR.
    pub pcr: u32,
    /// The value the log implies.
    pub log: Vec<u8>,
    /// The value the TPM (or the quote) has.
    pub tpm: Vec<u8>,
    /// Why they disagree, or why the log cannot be trusted for this PCR; `None` if it agrees.
    pub culprit: Option<Culprit>,
}

impl PcrCheck {
    /// True if the log explains the PCR's value.
    pub fn ok(&self) -> bool {
        self.culprit.is_none()
    }
}

impl EventLog {
    /// The PCR values the log implies, for every bank it has digests for.
    pub fn replay(&self) -> Replay {
        let mut pcrs = BTreeMap::new();
        for alg in self.banks() {
            let mut bank: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
            if let Some(locality) = self.startup_locality() {
                bank.insert(0, initial_value(alg, 0, Some(locality)));
            }
            for event in self.events.iter().filter(|e| e.is_extended()) {
                let Some(digest) = event.digest(alg) else { continue };
                let value = bank.entry(event.pcr).or_insert_with(|| initial_value(alg, event.pcr, None));
                *value = alg.extend(value, digest);
            }
            pcrs.insert(alg, bank);
        }
        Replay { pcrs }
    }

    /// The locality of the StartupLocality EV_NO_ACTION event, if the log has one.
    pub fn startup_locality(&self) -> Option<u8> {
        self.events
            .iter()
            .find(|e| e.event_type == EventType::NO_ACTION && e.pcr == 0 && e.data.starts_with(STARTUP_LOCALITY))
            .and_then(|e| e.data.get(STARTUP_LOCALITY.len()).copied())
    }

    /// The events extended into PCR `pcr`, in order.
    pub fn events_for(&self, pcr: u32) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.pcr == pcr && e.is_extended())
    }

    /// Checks PCR values read from a TPM (or a verified quote) of bank `alg` against the log:
    /// for each `(pcr, value)`, the value the log implies, and the first event to blame when
    /// they differ or when an event's digest is not the hash of its data.
    pub fn check(&self, alg: HashAlg, tpm: &[(u32, Vec<u8>)]) -> Vec<PcrCheck> {
        let locality = self.startup_locality();
        tpm.iter()
            .map(|(pcr, actual)| {
                let pcr = *pcr;
                let mut value = initial_value(alg, pcr, if pcr == 0 { locality } else { None });
                let mut culprit = None;
                let mut events = 0;
                for event in self.events_for(pcr) {
                    events += 1;
                    let (index, offset, event_type) = (event.index, event.offset, event.event_type);
                    let Some(digest) = event.digest(alg) else {
                        culprit.get_or_insert(Culprit::MissingDigest { event: index, offset, event_type });
                        continue;
                    };
                    if culprit.is_none() && value == *actual {
                        culprit = Some(Culprit::NotInTpm { event: index, offset, event_type });
                    }
                    if event.data_matches_digest(alg) == Some(false) {
                        // A lying event is the better explanation than a prefix match.
                        if !matches!(culprit, Some(Culprit::DigestDoesNotMatchData { .. })) {
                            culprit = Some(Culprit::DigestDoesNotMatchData { event: index, offset, event_type });
                        }
                    }
                    value = alg.extend(&value, digest);
                }
                if value == *actual && matches!(culprit, Some(Culprit::NotInTpm { .. })) {
                    // The TPM passed through that value and went on to the log's final one.
                    culprit = None;
                }
                if value != *actual && culprit.is_none() {
                    culprit = Some(Culprit::Unexplained { events });
                }
                PcrCheck { bank: alg, pcr, log: value, tpm: actual.clone(), culprit }
            })
            .collect()
    }
}

/// A PCR's value at TPM startup as the log sees it: zero, or for PCR 0 the startup locality
/// in the last byte.
fn initial_value(alg: HashAlg, pcr: u32, locality: Option<u8>) -> Vec<u8> {
    let mut value = vec![0u8; alg.size()];
    if let (0, Some(locality), Some(last)) = (pcr, locality, value.last_mut()) {
        *last = locality;
    }
    value
}
