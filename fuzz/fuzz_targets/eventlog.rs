//! The measured-boot event-log parser (`client/src/eventlog`): what a verifier runs on a log
//! that came from firmware, or over the network with a quote. `EventLog::parse` reads both
//! formats; every event's data is decoded; the log is replayed and checked against its own
//! replayed values.
//!
//! Input: the log bytes.
//!
//! Properties: no panic and no allocation beyond the input's size (lengths are checked before
//! use); an accepted log's events tile it (each starts where the previous one ended); checked
//! against its own replay, a PCR is only ever blamed on an event whose digest is not the hash
//! of its data, or one missing a digest, never "unexplained".
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_client::eventlog::{Culprit, EventLog};

fuzz_target!(|data: &[u8]| {
    let Ok(log) = EventLog::parse(data) else { return };
    assert_eq!(log.events.first().map(|e| e.offset), Some(0));
    for pair in log.events.windows(2) {
        assert!(pair[0].offset < pair[1].offset, "events out of order");
    }
    for event in &log.events {
        let _ = event.decoded().to_string();
        let _ = event.event_type.name();
    }
    let replay = log.replay();
    for (alg, values) in &replay.pcrs {
        let values: Vec<(u32, Vec<u8>)> = values.iter().map(|(pcr, v)| (*pcr, v.clone())).collect();
        for check in log.check(*alg, &values) {
            assert_eq!(check.log, check.tpm, "the replay of {alg}:{} is not its own check's value", check.pcr);
            assert!(
                !matches!(check.culprit, Some(Culprit::Unexplained { .. } | Culprit::NotInTpm { .. })),
                "{alg}:{}: {:?}",
                check.pcr,
                check.culprit
            );
        }
    }
});
