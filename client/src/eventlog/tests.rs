//! Unit tests of the parser, decoding and replay on hand-made bytes. The logs built from a
//! real TPM's extends, tpm2_eventlog agreement and the bad-input cases through the CLI are in
//! `cli/tests/eventlog.rs`.

use super::*;

/// A `TCG_PCR_EVENT` (SHA-1 format).
fn sha1_event(pcr: u32, kind: u32, digest: [u8; 20], data: &[u8]) -> Vec<u8> {
    let size = u32::try_from(data.len()).unwrap();
    [&pcr.to_le_bytes()[..], &kind.to_le_bytes(), &digest, &size.to_le_bytes(), data].concat()
}

/// The crypto-agile header event declaring `banks`.
fn header(banks: &[(u16, u16)]) -> Vec<u8> {
    let mut spec = b"Spec ID Event03\0".to_vec();
    spec.extend_from_slice(&0u32.to_le_bytes());
    spec.extend_from_slice(&[0, 2, 0, 2]);
    spec.extend_from_slice(&u32::try_from(banks.len()).unwrap().to_le_bytes());
    for (id, size) in banks {
        spec.extend_from_slice(&id.to_le_bytes());
        spec.extend_from_slice(&size.to_le_bytes());
    }
    spec.push(0);
    sha1_event(0, 3, [0; 20], &spec)
}

/// A `TCG_PCR_EVENT2` with the digests of `data` in `algs`.
fn agile_event(pcr: u32, kind: u32, algs: &[HashAlg], data: &[u8]) -> Vec<u8> {
    let mut out = [pcr.to_le_bytes(), kind.to_le_bytes(), u32::try_from(algs.len()).unwrap().to_le_bytes()].concat();
    for alg in algs {
        out.extend_from_slice(&alg.id().to_le_bytes());
        out.extend_from_slice(&alg.digest(data));
    }
    out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
    out.extend_from_slice(data);
    out
}

const BANKS: [(u16, u16); 2] = [(0x0004, 20), (0x000b, 32)];
const ALGS: [HashAlg; 2] = [HashAlg::Sha1, HashAlg::Sha256];

#[test]
fn known_answers() {
    // SHA-256("abc") and SM3("abc") (GB/T 32905-2016 example 1).
    assert_eq!(
        hex::encode(HashAlg::Sha256.digest(b"abc")),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        hex::encode(HashAlg::Sm3_256.digest(b"abc")),
        "66c7f0f462eeedd9d1f2d46bdc10e4e24167c4875cf2f7a2297da02b8f4ba8e0"
    );
    for alg in HashAlg::ALL {
        assert_eq!(alg.digest(b"").len(), alg.size());
        assert_eq!(HashAlg::from_id(alg.id()), Some(alg));
        assert_eq!(HashAlg::from_name(alg.name()), Some(alg));
    }
}

#[test]
fn crypto_agile_log_replays_with_startup_locality() {
    let mut log = header(&BANKS);
    log.extend(agile_event(0, 3, &ALGS, b"StartupLocality\0\x03"));
    log.extend(agile_event(0, 0x8000_0007, &ALGS, b"Calling EFI Application from Boot Option"));
    log.extend(agile_event(0, 4, &ALGS, &[0; 4]));
    log.extend(agile_event(9, 0xd, &ALGS, b"linux /vmlinuz\0"));
    let parsed = EventLog::parse(&log).unwrap();
    assert_eq!(parsed.format, LogFormat::CryptoAgile);
    assert_eq!(parsed.banks(), ALGS.to_vec());
    assert_eq!(parsed.events.len(), 5);
    assert_eq!(parsed.startup_locality(), Some(3));
    let replay = parsed.replay();
    let mut pcr0 = [0u8; 32];
    pcr0[31] = 3;
    let pcr0 = HashAlg::Sha256.extend(&pcr0, &HashAlg::Sha256.digest(b"Calling EFI Application from Boot Option"));
    let pcr0 = HashAlg::Sha256.extend(&pcr0, &HashAlg::Sha256.digest(&[0; 4]));
    assert_eq!(replay.value(HashAlg::Sha256, 0), Some(&pcr0[..]));
    assert_eq!(replay.value(HashAlg::Sha1, 9).map(<[u8]>::len), Some(20));
    assert_eq!(replay.value(HashAlg::Sha256, 1), None);
    assert_eq!(parsed.events[1].decoded(), EventData::StartupLocality(3));
    assert_eq!(parsed.events[2].decoded(), EventData::Text("Calling EFI Application from Boot Option".into()));
    assert_eq!(parsed.events[3].decoded(), EventData::Separator(0));
    assert_eq!(parsed.events[4].decoded(), EventData::Text("linux /vmlinuz".into()));
    assert_eq!(parsed.events[0].decoded(), EventData::Signature("Spec ID Event03".into()));
    assert_eq!(parsed.events[2].data_matches_digest(HashAlg::Sha256), Some(true));
    assert_eq!(parsed.events[4].data_matches_digest(HashAlg::Sha256), None, "EV_IPL digests are not checked");
    assert_eq!(parsed.events[4].event_type.name(), "EV_IPL");
    assert_eq!(EventType(0x1234).name(), "EV_UNKNOWN_0x00001234");

    // The check against "TPM" values: equal, a prefix (the last event never reached the TPM),
    // and an altered data byte.
    let checks = parsed.check(HashAlg::Sha256, &[(0, pcr0.clone())]);
    assert!(checks[0].ok(), "{checks:?}");
    let mut before_separator = [0u8; 32];
    before_separator[31] = 3;
    let before_separator =
        HashAlg::Sha256.extend(&before_separator, &HashAlg::Sha256.digest(b"Calling EFI Application from Boot Option"));
    let checks = parsed.check(HashAlg::Sha256, &[(0, before_separator)]);
    assert_eq!(checks[0].culprit.as_ref().and_then(Culprit::event), Some(3));
    assert_eq!(checks[0].culprit.as_ref().map(Culprit::reason), Some("not_in_tpm"));
    let mut altered = parsed.clone();
    altered.events[2].data[0] ^= 1;
    let checks = altered.check(HashAlg::Sha256, &[(0, pcr0)]);
    assert_eq!(checks[0].culprit.as_ref().map(Culprit::reason), Some("digest_does_not_match_data"));
    assert_eq!(checks[0].culprit.as_ref().and_then(Culprit::event), Some(2));
}

#[test]
fn sha1_log_replays() {
    let data = b"POST CODE";
    let digest: [u8; 20] = HashAlg::Sha1.digest(data).try_into().unwrap();
    let mut log = sha1_event(0, 1, digest, data);
    log.extend(sha1_event(4, 4, HashAlg::Sha1.digest(&[0; 4]).try_into().unwrap(), &[0; 4]));
    let parsed = EventLog::parse(&log).unwrap();
    assert_eq!(parsed.format, LogFormat::Sha1);
    assert_eq!(parsed.banks(), vec![HashAlg::Sha1]);
    let expected = HashAlg::Sha1.extend(&[0; 20], &digest);
    assert_eq!(parsed.replay().value(HashAlg::Sha1, 0), Some(&expected[..]));
    assert_eq!(parsed.events[1].offset, 32 + data.len());
}

#[test]
fn uefi_structures_decode() {
    // UEFI_VARIABLE_DATA for SecureBoot = 1 in the EFI global variable GUID.
    let guid = hex::decode("61dfe48bca93d211aa0d00e098032b8c").unwrap();
    let name: Vec<u8> = "SecureBoot".encode_utf16().flat_map(u16::to_le_bytes).collect();
    let var = [&guid[..], &10u64.to_le_bytes(), &1u64.to_le_bytes(), &name, &[1]].concat();
    assert_eq!(
        EventData::decode(EventType::EFI_VARIABLE_DRIVER_CONFIG, &var),
        EventData::UefiVariable {
            guid: "8be4df61-93ca-11d2-aa0d-00e098032b8c".into(),
            name: "SecureBoot".into(),
            value: vec![1]
        }
    );
    // A name length overrunning the data stays raw.
    let bad = [&guid[..], &u64::MAX.to_le_bytes(), &1u64.to_le_bytes()].concat();
    assert_eq!(EventData::decode(EventType::EFI_VARIABLE_BOOT, &bad), EventData::Raw(bad.clone()));
    // UEFI_IMAGE_LOAD_EVENT with its device path: `cli/tests/eventlog.rs` (replay test).
    // UTF-16 text (systemd-boot, S-CRTM versions).
    let utf16: Vec<u8> = "1.0\0".encode_utf16().flat_map(u16::to_le_bytes).collect();
    assert_eq!(EventData::decode(EventType::S_CRTM_VERSION, &utf16), EventData::Text("1.0".into()));
}

#[test]
fn bad_input_is_a_clear_error_naming_the_offset() {
    let good = {
        let mut log = header(&BANKS);
        log.extend(agile_event(9, 0xd, &ALGS, b"kernel"));
        log
    };
    let first = header(&BANKS).len();
    let err = |bytes: &[u8]| EventLog::parse(bytes).unwrap_err().to_string();

    assert_eq!(err(&[]), "event log is empty");
    // Truncated header.
    assert!(
        err(&good[..20]).starts_with("event log truncated at offset 0: TCG_PCR_EVENT header needs 32 bytes, 20 left"),
        "{}",
        err(&good[..20])
    );
    assert!(err(&good[..40]).contains("event data needs"), "{}", err(&good[..40]));
    // A digest count overrunning the buffer (and the banks declared).
    let mut overrun = good.clone();
    overrun[first + 8..first + 12].copy_from_slice(&2u32.to_le_bytes());
    overrun.truncate(first + 20);
    assert!(
        err(&overrun)
            .starts_with(&format!("event log truncated at offset {}: digest needs 20 bytes, 6 left", first + 12)),
        "{}",
        err(&overrun)
    );
    let mut many = good.clone();
    many[first + 8..first + 12].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
    assert_eq!(
        err(&many),
        format!(
            "invalid event log at offset {}: event 1 has 4294967295 digests, but the log declares 2 banks",
            first + 8
        )
    );
    // Unknown algorithm ids: in the header, and in an event.
    let unknown_header = [header(&[(0x0004, 20), (0x0027, 32)]), agile_event(9, 0xd, &ALGS, b"k")].concat();
    assert!(err(&unknown_header).contains("unknown algorithm id 0x0027 in the header"), "{}", err(&unknown_header));
    let mut unknown_event = good.clone();
    unknown_event[first + 12..first + 14].copy_from_slice(&0x0027u16.to_le_bytes());
    assert_eq!(
        err(&unknown_event),
        format!(
            "invalid event log at offset {}: event 1: algorithm 0x0027 is not declared in the log's header",
            first + 12
        )
    );
    // A 4 GiB event size: an error, not a 4 GiB allocation.
    let mut huge = good.clone();
    let size_at = first + 12 + 2 + 20 + 2 + 32;
    huge[size_at..size_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        err(&huge),
        format!("event log truncated at offset {size_at}: event data needs 4294967295 bytes, 6 left")
    );
    // A PCR index out of range.
    let mut pcr = good;
    pcr[first..first + 4].copy_from_slice(&99u32.to_le_bytes());
    assert_eq!(err(&pcr), format!("invalid event log at offset {first}: PCR index 99 is out of range (0-23)"));
    assert!(matches!(EventLog::parse(&vec![0; MAX_LOG_SIZE + 1]), Err(EventLogError::TooLarge { .. })));
}
