//! The measured-boot event log end to end, against the real daemon over its own swtpm: logs
//! written by the test (a small log writer below, crypto-agile with several banks, and
//! SHA-1-only) while the test extends the TPM's PCRs with the same digests, as firmware does;
//! `eventlog replay` equals the TPM in every bank and agrees with tpm2-tools'
//! `tpm2_eventlog`; `quote --with-eventlog` and `verify-quote --eventlog` accept the log and
//! name the PCR and event of an altered one; a bank the TPM lacks; `pcr predict` against the
//! TPM's own extends; the kernel-update flow with a secret sealed `--authorized-by`; bad
//! logs rejected with a clear error.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256, Sha384};
use support::{fails, ok, Daemon, DaemonCli as _, EVENT_LOG};
use tpm_vault_daemon::harness::CloseInheritedFds as _;
use tpm_vault_daemon::model::PcrBank;

/// A bank of the log writer: TPM_ALG_ID, name, hash.
#[derive(Clone, Copy)]
struct Bank {
    id: u16,
    hash: fn(&[u8]) -> Vec<u8>,
    /// The daemon's bank, to extend the TPM with; `None` for a bank the test does not extend.
    tpm: Option<PcrBank>,
}

const SHA1: Bank = Bank {
    id: 0x0004,
    hash: |d| aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, d).as_ref().to_vec(),
    tpm: Some(PcrBank::Sha1),
};
const SHA256: Bank = Bank { id: 0x000b, hash: |d| Sha256::digest(d).to_vec(), tpm: Some(PcrBank::Sha256) };
const SHA384: Bank = Bank { id: 0x000c, hash: |d| Sha384::digest(d).to_vec(), tpm: Some(PcrBank::Sha384) };
/// SM3-256: libtpms has no such bank, so its digests never reach the TPM.
const SM3: Bank = Bank {
    id: 0x0012,
    hash: |d| {
        use sm3::Digest as _;
        sm3::Sm3::digest(d).to_vec()
    },
    tpm: None,
};

const EV_NO_ACTION: u32 = 0x3;
const EV_SEPARATOR: u32 = 0x4;
const EV_POST_CODE: u32 = 0x1;
const EV_S_CRTM_VERSION: u32 = 0x8;
const EV_IPL: u32 = 0xd;
const EV_EFI_VARIABLE_DRIVER_CONFIG: u32 = 0x8000_0001;
const EV_EFI_BOOT_SERVICES_APPLICATION: u32 = 0x8000_0003;
const EV_EFI_ACTION: u32 = 0x8000_0007;

/// Writes a log in the format firmware does and extends the daemon's TPM with each event's
/// digests (the firmware's two duties).
struct LogWriter<'a> {
    daemon: &'a Daemon,
    banks: Vec<Bank>,
    /// `false`: the SHA-1-only format.
    agile: bool,
    bytes: Vec<u8>,
    /// Offsets and indices of the events written, for the tests that alter one.
    offsets: Vec<usize>,
}

impl<'a> LogWriter<'a> {
    /// A crypto-agile log declaring `banks`: the SHA-1 header event with the Spec ID event,
    /// then StartupLocality 0.
    fn agile(daemon: &'a Daemon, banks: &[Bank]) -> LogWriter<'a> {
        let mut spec = b"Spec ID Event03\0".to_vec();
        spec.extend_from_slice(&0u32.to_le_bytes()); // platformClass: client
        spec.extend_from_slice(&[0, 2, 2, 2]); // version 2.0 errata 2, uintnSize 2 (64-bit)
        spec.extend_from_slice(&(banks.len() as u32).to_le_bytes());
        for bank in banks {
            spec.extend_from_slice(&bank.id.to_le_bytes());
            spec.extend_from_slice(&((bank.hash)(b"").len() as u16).to_le_bytes());
        }
        spec.push(0); // vendorInfoSize
        let mut w = LogWriter { daemon, banks: banks.to_vec(), agile: true, bytes: Vec::new(), offsets: Vec::new() };
        w.sha1_event(0, EV_NO_ACTION, [0; 20], &spec);
        w.event_with(0, EV_NO_ACTION, b"StartupLocality\0\0", |_| vec![0; 0]);
        w
    }

    /// A SHA-1-only log.
    fn sha1(daemon: &'a Daemon) -> LogWriter<'a> {
        LogWriter { daemon, banks: vec![SHA1], agile: false, bytes: Vec::new(), offsets: Vec::new() }
    }

    fn sha1_event(&mut self, pcr: u32, kind: u32, digest: [u8; 20], data: &[u8]) {
        self.offsets.push(self.bytes.len());
        self.bytes.extend_from_slice(&pcr.to_le_bytes());
        self.bytes.extend_from_slice(&kind.to_le_bytes());
        self.bytes.extend_from_slice(&digest);
        self.bytes.extend_from_slice(&(data.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(data);
    }

    /// An event whose digests are the hash of `data`, extended into the TPM.
    fn event(&mut self, pcr: u32, kind: u32, data: &[u8]) {
        self.event_with(pcr, kind, data, |bank| (bank.hash)(data));
    }

    /// An event with the digests `digest_of` gives (an empty one: EV_NO_ACTION's zeros).
    fn event_with(&mut self, pcr: u32, kind: u32, data: &[u8], digest_of: impl Fn(&Bank) -> Vec<u8>) {
        let digests: Vec<(Bank, Vec<u8>)> = self
            .banks
            .iter()
            .map(|b| {
                let d = digest_of(b);
                let d = if d.is_empty() { vec![0; (b.hash)(b"").len()] } else { d };
                (*b, d)
            })
            .collect();
        if kind != EV_NO_ACTION {
            for (bank, digest) in &digests {
                if let Some(tpm) = bank.tpm {
                    self.daemon.extend_pcr_digest(tpm, pcr as u8, digest);
                }
            }
        }
        if !self.agile {
            self.sha1_event(pcr, kind, digests[0].1.clone().try_into().unwrap(), data);
            return;
        }
        self.offsets.push(self.bytes.len());
        self.bytes.extend_from_slice(&pcr.to_le_bytes());
        self.bytes.extend_from_slice(&kind.to_le_bytes());
        self.bytes.extend_from_slice(&(digests.len() as u32).to_le_bytes());
        for (bank, digest) in &digests {
            self.bytes.extend_from_slice(&bank.id.to_le_bytes());
            self.bytes.extend_from_slice(digest);
        }
        self.bytes.extend_from_slice(&(data.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(data);
    }

    /// A boot like OVMF's and a boot loader's: CRTM version, firmware, Secure Boot variable,
    /// separators, the boot loader image, its EFI action, the kernel command line (EV_IPL).
    fn boot(mut self) -> Vec<u8> {
        let crtm: Vec<u8> = "1.00\0".encode_utf16().flat_map(u16::to_le_bytes).collect();
        self.event(0, EV_S_CRTM_VERSION, &crtm);
        self.event(0, EV_POST_CODE, b"ACPI DATA");
        self.event(7, EV_EFI_VARIABLE_DRIVER_CONFIG, &secure_boot_variable());
        for pcr in [0, 1, 2, 3, 4, 5, 6, 7] {
            self.event(pcr, EV_SEPARATOR, &[0; 4]);
        }
        self.event_with(4, EV_EFI_BOOT_SERVICES_APPLICATION, &image_load(), |b| {
            (b.hash)(b"the boot loader's PE image")
        });
        self.event(4, EV_EFI_ACTION, b"Calling EFI Application from Boot Option");
        self.event(8, EV_IPL, b"grub_cmd: linux /vmlinuz root=/dev/vda1\0");
        self.event_with(9, EV_IPL, b"/boot/vmlinuz\0", |b| (b.hash)(b"kernel image"));
        self.event(14, EV_IPL, b"MokList\0");
        self.bytes
    }
}

/// UEFI_VARIABLE_DATA of SecureBoot = 1 (EFI global variable GUID).
fn secure_boot_variable() -> Vec<u8> {
    let guid = hex::decode("61dfe48bca93d211aa0d00e098032b8c").unwrap();
    let name: Vec<u8> = "SecureBoot".encode_utf16().flat_map(u16::to_le_bytes).collect();
    [&guid[..], &10u64.to_le_bytes(), &1u64.to_le_bytes(), &name, &[1]].concat()
}

/// UEFI_IMAGE_LOAD_EVENT of \EFI\BOOT\BOOTX64.EFI on PciRoot(0x0)/Pci(0x1f,0x2).
fn image_load() -> Vec<u8> {
    support::image_load_event("\\EFI\\BOOT\\BOOTX64.EFI")
}

fn json(out: Vec<u8>) -> serde_json::Value {
    serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)))
}

/// The TPM's value of `bank:pcr`, through the daemon.
fn tpm_pcr(d: &Daemon, bank: &str, pcr: u32) -> String {
    let read = json(ok(d.cli(&["pcr", "read", "--pcrs", &format!("{bank}:{pcr}"), "--output", "json"])));
    read["pcrs"][0]["value"].as_str().unwrap().to_owned()
}

/// `tpm2_eventlog FILE`'s `pcrs:` section: bank -> PCR -> lowercase hex.
fn tpm2_eventlog(file: &Path, extra: &[&str]) -> BTreeMap<String, BTreeMap<String, String>> {
    let out = Command::new("tpm2_eventlog").close_inherited_fds().args(extra).arg(file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tpm2_eventlog: {}{text}", String::from_utf8_lossy(&out.stderr));
    let mut pcrs: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut bank = None;
    for line in text.lines().skip_while(|l| l.trim_end() != "pcrs:").skip(1) {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_suffix(':').filter(|n| !n.contains(' ')) {
            bank = Some(name.to_owned());
        } else if let (Some(bank), Some((pcr, value))) = (&bank, trimmed.split_once(':')) {
            let value = value.trim().trim_start_matches("0x").to_lowercase();
            pcrs.entry(bank.clone()).or_default().insert(pcr.trim().to_owned(), value);
        }
    }
    assert!(!pcrs.is_empty(), "no pcrs section in: {text}");
    pcrs
}

/// `eventlog replay --output json`'s `pcrs` object as a map.
fn replay_pcrs(replay: &serde_json::Value) -> BTreeMap<String, BTreeMap<String, String>> {
    serde_json::from_value(replay["pcrs"].clone()).unwrap()
}

#[test]
fn replay_equals_the_tpm_in_every_bank_and_agrees_with_tpm2_eventlog() {
    let d = Daemon::start();
    let writer = LogWriter::agile(&d, &[SHA1, SHA256, SHA384]);
    // The StartupLocality event: from its offset to the end of what the writer has so far.
    let locality_event = writer.offsets[1]..writer.bytes.len();
    let log = writer.boot();
    let path = d.dir.path().join(EVENT_LOG);
    std::fs::write(&path, &log).unwrap();

    // From the daemon (no --log): every bank compared, and agreeing.
    let replay = json(ok(d.cli(&["eventlog", "replay", "--output", "json"])));
    assert_eq!(replay["tpm_agrees"], true, "{replay}");
    assert_eq!(replay["format"], "crypto_agile");
    let pcrs = replay_pcrs(&replay);
    assert_eq!(pcrs.keys().collect::<Vec<_>>(), ["sha1", "sha256", "sha384"]);
    for (bank, values) in &pcrs {
        assert_eq!(replay["tpm"][bank]["compared"], true, "{bank}: {replay}");
        let pcrs: Vec<&String> = values.keys().collect();
        assert_eq!(pcrs, ["0", "1", "14", "2", "3", "4", "5", "6", "7", "8", "9"], "{bank}");
        for (pcr, value) in values {
            assert_eq!(value, &tpm_pcr(&d, bank, pcr.parse().unwrap()), "{bank}:{pcr}");
        }
    }
    // PCR 9 is the hash chain of the kernel's digest, from zero.
    let pcr9 = Sha256::digest([&[0u8; 32][..], &Sha256::digest(b"kernel image")].concat());
    assert_eq!(pcrs["sha256"]["9"], hex::encode(pcr9));

    // Text: the TPM agrees.
    let text = String::from_utf8(ok(d.cli(&["eventlog", "replay"]))).unwrap();
    assert!(text.contains("TPM agrees with the log: yes"), "{text}");
    assert!(text.starts_with(&format!("daemon:{}: 18 events, crypto_agile log", path.display())), "{text}");

    // tpm2_eventlog on the same file: the same PCRs, bank by bank. tpm2-tools 5.4 extends
    // the StartupLocality EV_NO_ACTION event's zero digest into PCR 0 (the TPM does not, see
    // above), so it gets the log without that event; at locality 0 our replay is the same.
    let mut stripped = log[..locality_event.start].to_vec();
    stripped.extend_from_slice(&log[locality_event.end..]);
    let stripped_path = d.dir.path().join("stripped.bin");
    std::fs::write(&stripped_path, &stripped).unwrap();
    let theirs = tpm2_eventlog(&stripped_path, &[]);
    for file in [&path, &stripped_path] {
        let args = ["eventlog", "replay", "--log", file.to_str().unwrap(), "--offline", "--output", "json"];
        let offline = json(ok(d.cli(&args)));
        assert_eq!(offline["tpm_agrees"], serde_json::Value::Null);
        assert_eq!(replay_pcrs(&offline), theirs, "{}", file.display());
    }

    // show: types named, digests, data decoded.
    let show = json(ok(d.cli(&["eventlog", "show", "--output", "json"])));
    let events = show["events"].as_array().unwrap();
    assert_eq!(events.len(), 18);
    assert_eq!(show["banks"], serde_json::json!(["sha1", "sha256", "sha384"]));
    assert_eq!(events[0]["type"], "EV_NO_ACTION");
    assert_eq!(events[0]["data"]["signature"], "Spec ID Event03");
    assert_eq!(events[1]["data"], serde_json::json!({ "kind": "startup_locality", "locality": 0 }));
    assert_eq!(events[2]["type"], "EV_S_CRTM_VERSION");
    assert_eq!(events[2]["data"]["text"], "1.00");
    let variable = &events[4];
    assert_eq!(variable["type"], "EV_EFI_VARIABLE_DRIVER_CONFIG");
    assert_eq!(variable["data"]["name"], "SecureBoot");
    assert_eq!(variable["data"]["guid"], "8be4df61-93ca-11d2-aa0d-00e098032b8c");
    assert_eq!(variable["data_matches_digest"]["sha384"], true);
    let image = &events[13];
    assert_eq!(image["type"], "EV_EFI_BOOT_SERVICES_APPLICATION");
    assert_eq!(image["data"]["device_path"], "PciRoot(0x0)/Pci(0x1f,0x2)/\\EFI\\BOOT\\BOOTX64.EFI");
    assert_eq!(image["digests"]["sha256"], hex::encode(Sha256::digest(b"the boot loader's PE image")));
    assert_eq!(events[15]["data"]["text"], "grub_cmd: linux /vmlinuz root=/dev/vda1");
    assert_eq!(events[16]["data"]["text"], "/boot/vmlinuz");
    let pcr9 = String::from_utf8(ok(d.cli(&["eventlog", "show", "--pcr", "9"]))).unwrap();
    assert!(pcr9.contains("PCR 9 EV_IPL") && pcr9.contains("\"/boot/vmlinuz\""), "{pcr9}");
    assert!(!pcr9.contains("PCR 8 "), "{pcr9}");
}

#[test]
fn a_sha1_log_and_a_bank_the_tpm_lacks() {
    let d = Daemon::start();
    let path = d.dir.path().join(EVENT_LOG);
    // SHA-1-only format.
    let mut w = LogWriter::sha1(&d);
    w.event(0, EV_POST_CODE, b"POST CODE");
    w.event(0, EV_SEPARATOR, &[0; 4]);
    w.event(8, EV_IPL, b"linux /vmlinuz\0");
    std::fs::write(&path, &w.bytes).unwrap();
    let replay = json(ok(d.cli(&["eventlog", "replay", "--output", "json"])));
    assert_eq!((replay["format"].as_str(), replay["tpm_agrees"].as_bool()), (Some("sha1"), Some(true)), "{replay}");
    assert_eq!(replay["pcrs"]["sha1"]["8"], tpm_pcr(&d, "sha1", 8));
    let file = d.dir.path().join("sha1.bin");
    std::fs::write(&file, &w.bytes).unwrap();
    assert_eq!(replay_pcrs(&replay), tpm2_eventlog(&file, &["--eventlog-version=1"]));

    // A crypto-agile log with an SM3-256 bank (libtpms has none): the other banks are
    // compared and agree, SM3 is replayed and reported as not compared.
    let d = Daemon::start();
    let log = LogWriter::agile(&d, &[SHA256, SM3]).boot();
    std::fs::write(d.dir.path().join(EVENT_LOG), &log).unwrap();
    let replay = json(ok(d.cli(&["eventlog", "replay", "--output", "json"])));
    assert_eq!(replay["tpm_agrees"], true, "{replay}");
    assert_eq!(replay["tpm"]["sha256"]["agrees"], true);
    assert_eq!(replay["tpm"]["sm3_256"]["compared"], false);
    assert!(replay["tpm"]["sm3_256"]["reason"].as_str().unwrap().contains("sm3_256"), "{replay}");
    let sm3_pcr9 = {
        use sm3::Digest as _;
        let kernel = sm3::Sm3::digest(b"kernel image");
        hex::encode(sm3::Sm3::digest([&[0u8; 32][..], &kernel].concat()))
    };
    assert_eq!(replay["pcrs"]["sm3_256"]["9"], sm3_pcr9);
    let text = String::from_utf8(ok(d.cli(&["eventlog", "replay"]))).unwrap();
    assert!(text.contains("sm3_256: (not compared with the TPM:"), "{text}");
}

#[test]
fn verify_quote_checks_the_log_and_names_the_pcr_and_event_that_break() {
    let d = Daemon::start();
    let mut w = LogWriter::agile(&d, &[SHA1, SHA256]);
    w.event(0, EV_SEPARATOR, &[0; 4]);
    w.event(4, EV_EFI_ACTION, b"Calling EFI Application from Boot Option");
    w.event(4, EV_SEPARATOR, &[0; 4]);
    w.event_with(9, EV_IPL, b"/boot/vmlinuz\0", |b| (b.hash)(b"kernel image"));
    let offsets = w.offsets.clone();
    std::fs::write(d.dir.path().join(EVENT_LOG), &w.bytes).unwrap();
    let log = w.bytes;

    let nonce = "0011223344556677";
    let text = String::from_utf8(ok(d.cli(&[
        "quote",
        "--nonce",
        nonce,
        "--out-dir",
        "q",
        "--pcrs",
        "sha256:0,4,7,9",
        "--with-eventlog",
    ])))
    .unwrap();
    assert!(text.contains("Event log: "), "{text}");
    let dir = d.dir.path().join("q");
    assert_eq!(std::fs::read(dir.join("eventlog.bin")).unwrap(), log);
    let verify = |eventlog: &Path, extra: &[&str]| {
        let mut args =
            vec!["verify-quote", "--in-dir", "q", "--nonce", nonce, "--eventlog", eventlog.to_str().unwrap()];
        // The AK beside the quote: this test is about the log, not about enrollment.
        args.push("--allow-unenrolled-ak");
        args.extend_from_slice(extra);
        d.cli(&args)
    };
    let out = String::from_utf8(ok(verify(&dir.join("eventlog.bin"), &["--show-events"]))).unwrap();
    assert!(out.starts_with("Quote OK\n"), "{out}");
    assert!(out.contains("event log: explains 4 quoted PCRs"), "{out}");
    assert!(out.contains("PCR sha256:4 = ") && out.contains("EV_EFI_ACTION"), "{out}");
    let json_out = json(ok(verify(&dir.join("eventlog.bin"), &["--show-events", "--output", "json"])));
    let pcr9 = &json_out["eventlog"]["pcrs"][3];
    assert_eq!((pcr9["pcr"].as_u64(), pcr9["ok"].as_bool()), (Some(9), Some(true)));
    assert_eq!(pcr9["events"][0]["type"], "EV_IPL");

    // Event 3 (PCR 4's EV_EFI_ACTION) altered: its data, then its sha256 digest.
    let event3 = offsets[3];
    let altered = |name: &str, at: usize| {
        let mut bytes = log.clone();
        bytes[at] ^= 0x01;
        let file = d.dir.path().join(name);
        std::fs::write(&file, bytes).unwrap();
        file
    };
    // Header (4+4) + count (4) + sha1 (2+20) + sha256 (2+32) + size (4): the data.
    let data_at = event3 + 4 + 4 + 4 + 22 + 34 + 4;
    let line = fails(&verify(&altered("data.bin", data_at), &[]), 1);
    assert_eq!(
        line,
        format!(
            "tpm-vault: quote rejected: event log does not explain PCR sha256:4: event 3 (EV_EFI_ACTION at offset \
             {event3}): its digest is not the hash of its data"
        )
    );
    let sha256_at = event3 + 4 + 4 + 4 + 22 + 2;
    let line = fails(&verify(&altered("digest.bin", sha256_at), &[]), 1);
    assert!(line.contains("PCR sha256:4: event 3 (EV_EFI_ACTION at offset"), "{line}");
    // The kernel's digest (EV_IPL: the digest is of the image, not the data) altered: PCR 9 named.
    let line = fails(&verify(&altered("kernel.bin", offsets[5] + 4 + 4 + 4 + 22 + 2), &[]), 1);
    assert!(line.contains("event log does not explain PCR sha256:9: none of its 1 events alone explains"), "{line}");
    // An event the TPM never saw, appended: named.
    let mut extra = log.clone();
    let appended_at = extra.len();
    extra.extend_from_slice(&9u32.to_le_bytes());
    extra.extend_from_slice(&EV_IPL.to_le_bytes());
    extra.extend_from_slice(&2u32.to_le_bytes());
    extra.extend_from_slice(&SHA1.id.to_le_bytes());
    extra.extend_from_slice(&(SHA1.hash)(b"initrd"));
    extra.extend_from_slice(&SHA256.id.to_le_bytes());
    extra.extend_from_slice(&(SHA256.hash)(b"initrd"));
    extra.extend_from_slice(&0u32.to_le_bytes());
    let file = d.dir.path().join("extra.bin");
    std::fs::write(&file, extra).unwrap();
    let line = fails(&verify(&file, &[]), 1);
    assert!(
        line.contains(&format!(
            "PCR sha256:9: event 6 (EV_IPL at offset {appended_at}): the TPM holds the value before it"
        )),
        "{line}"
    );
    // JSON names the reason; a garbage log is malformed, not a panic.
    let out = verify(&file, &["--output", "json"]);
    assert_eq!(json(out.stdout)["reason"], "eventlog_mismatch");
    let garbage = d.dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"not a log").unwrap();
    let line = fails(&verify(&garbage, &[]), 1);
    assert!(line.starts_with("tpm-vault: quote rejected: event log: event log truncated at offset 0"), "{line}");
}

#[test]
fn no_log_is_not_found_and_the_request_is_audited() {
    let uid = nix::unistd::getuid().as_raw();
    let d = Daemon::start_with_policy_and_audit(&format!(
        "[[rule]]\nname = \"verifier\"\nclients = [\"uid:{uid}\"]\nkeys = [\"*\"]\noperations = [\"quote\"]\n"
    ));
    let line = fails(&d.cli(&["eventlog", "show"]), 3);
    assert!(line.contains(&format!("no event log at {}", d.dir.path().join(EVENT_LOG).display())), "{line}");
    let line = fails(&d.cli(&["quote", "--nonce", "ab", "--out-dir", "q", "--with-eventlog"]), 3);
    assert!(line.contains("no event log"), "{line}");
    assert!(!d.dir.path().join("q").exists(), "nothing written without the log");
    std::fs::write(d.dir.path().join(EVENT_LOG), b"served as is").unwrap();
    let line = fails(&d.cli(&["eventlog", "show"]), 2);
    assert!(line.starts_with("tpm-vault: daemon:"), "{line}");
    // Audited like every request: the two NOT_FOUND and the one served.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let audit = d.audit_log();
        let outcomes: Vec<&str> =
            audit.iter().filter(|r| r["op"] == "quote").filter_map(|r| r["outcome"].as_str()).collect();
        if outcomes == ["NotFound", "NotFound", "ok"] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{audit:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // A caller without the quote operation is refused.
    let d = Daemon::start_with_policy(&format!(
        "[[rule]]\nname = \"signer\"\nclients = [\"uid:{uid}\"]\nkeys = [\"*\"]\noperations = [\"sign\"]\n"
    ));
    std::fs::write(d.dir.path().join(EVENT_LOG), b"x").unwrap();
    fails(&d.cli(&["eventlog", "show"]), 5);
}

#[test]
fn pcr_predict_equals_what_the_tpm_reaches() {
    let d = Daemon::start();
    let dir = d.dir.path();
    std::fs::write(dir.join("vmlinuz"), b"a kernel image").unwrap();
    for (bank, tpm, hash) in [("sha256", PcrBank::Sha256, SHA256.hash), ("sha384", PcrBank::Sha384, SHA384.hash)] {
        // One extend, from the current value.
        d.extend_pcr_digest(tpm, 10, &hash(b"earlier"));
        let digest = hash(b"one");
        let predicted = String::from_utf8(ok(d.cli(&[
            "pcr",
            "predict",
            "--pcr",
            &format!("{bank}:10"),
            "--from",
            "current",
            "--extend-digest",
            &hex::encode(&digest),
        ])))
        .unwrap();
        d.extend_pcr_digest(tpm, 10, &digest);
        assert_eq!(predicted.trim(), format!("{bank}:10={}", tpm_pcr(&d, bank, 10)));
        // Several, digests and a file mixed, from the current value.
        let (a, b) = (hash(b"a"), hash(b"b"));
        let predicted = json(ok(d.cli(&[
            "pcr",
            "predict",
            "--pcr",
            &format!("{bank}:11"),
            "--from",
            "current",
            "--extend-digest",
            &hex::encode(&a),
            "--extend-file",
            "vmlinuz",
            "--extend-digest",
            &hex::encode(&b),
            "--output",
            "json",
        ])));
        for digest in [a, hash(b"a kernel image"), b] {
            d.extend_pcr_digest(tpm, 11, &digest);
        }
        assert_eq!(predicted["value"], tpm_pcr(&d, bank, 11));
        assert_eq!(predicted["binding"], format!("{bank}:11={}", tpm_pcr(&d, bank, 11)));
        // From zero (a PCR nothing extended) and from a given value.
        let predicted = json(ok(d.cli(&[
            "pcr",
            "predict",
            "--pcr",
            &format!("{bank}:12"),
            "--extend-file",
            "vmlinuz",
            "--output",
            "json",
        ])));
        d.extend_pcr_digest(tpm, 12, &hash(b"a kernel image"));
        assert_eq!(predicted["value"], tpm_pcr(&d, bank, 12));
        let from = tpm_pcr(&d, bank, 12);
        let predicted = json(ok(d.cli(&[
            "pcr",
            "predict",
            "--pcr",
            &format!("{bank}:12"),
            "--from",
            &from,
            "--extend-digest",
            &hex::encode(hash(b"c")),
            "--output",
            "json",
        ])));
        d.extend_pcr_digest(tpm, 12, &hash(b"c"));
        assert_eq!(predicted["value"], tpm_pcr(&d, bank, 12));
    }
    // Bad input: a digest of the wrong size, a missing file.
    let line = fails(&d.cli(&["pcr", "predict", "--pcr", "sha256:9", "--extend-digest", "abcd"]), 2);
    assert!(line.contains("has 2 bytes, but sha256 digests have 32"), "{line}");
    let line = fails(&d.cli(&["pcr", "predict", "--pcr", "sha256:9", "--extend-file", "missing"]), 1);
    assert!(line.contains("cannot read missing"), "{line}");
}

#[test]
fn kernel_update_flow_with_an_authorized_secret() {
    let mut d = Daemon::start();
    let dir = d.dir.path().to_owned();
    let run = |args: &[&str]| {
        let out = Command::new("openssl").close_inherited_fds().current_dir(&dir).args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}");
    };
    run(&["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "authority.key"]);
    run(&["pkey", "-in", "authority.key", "-pubout", "-out", "authority.pem"]);
    std::fs::write(dir.join("vmlinuz-1"), b"kernel one").unwrap();
    std::fs::write(dir.join("vmlinuz-2"), b"kernel two").unwrap();
    // The boot loader measures kernel 1 into PCR 9.
    let boot = |d: &Daemon, kernel: &[u8]| d.extend_pcr_digest(PcrBank::Sha256, 9, &Sha256::digest(kernel));
    boot(&d, b"kernel one");

    // Seal to the authority; approve kernel 1 (version 1) from its predicted PCR 9.
    ok(d.cli_in(&["seal", "disk", "--authorized-by", "authority.pem"], b"disk key"));
    let predict = |kernel: &str| {
        String::from_utf8(ok(d.cli(&[
            "pcr",
            "predict",
            "--pcr",
            "sha256:9",
            "--from",
            "zero",
            "--extend-file",
            kernel,
        ])))
        .unwrap()
        .trim()
        .to_owned()
    };
    let sign = |d: &Daemon, binding: &str, version: &str, out: &str| {
        ok(d.cli(&["policy", "sign", "--key", "authority.key", "--pcr", binding, "--version", version, "--out", out]));
    };
    let one = predict("vmlinuz-1");
    assert_eq!(one, format!("sha256:9={}", tpm_pcr(&d, "sha256", 9)));
    sign(&d, &one, "1", "one.policy");
    assert_eq!(ok(d.cli(&["unseal", "disk", "--policy", "one.policy"])), b"disk key");

    // Build kernel 2, predict its PCR 9, approve it with a higher version; deploy; reboot.
    let two = predict("vmlinuz-2");
    sign(&d, &two, "2", "two.policy");
    d.reboot_tpm();
    assert_eq!(tpm_pcr(&d, "sha256", 9), "00".repeat(32), "a reboot resets PCR 9");
    boot(&d, b"kernel two");
    assert_eq!(two, format!("sha256:9={}", tpm_pcr(&d, "sha256", 9)));
    assert_eq!(ok(d.cli(&["unseal", "disk", "--policy", "two.policy"])), b"disk key");
    // The old approval opens nothing any more: version 1 is revoked once version 2 was used,
    // and even re-signed with a higher version, kernel 1's PCR 9 is not the TPM's.
    let line = fails(&d.cli(&["unseal", "disk", "--policy", "one.policy"]), 5);
    assert!(line.contains("version 1 was revoked"), "{line}");
    sign(&d, &one, "3", "one-again.policy");
    let line = fails(&d.cli(&["unseal", "disk", "--policy", "one-again.policy"]), 6);
    assert!(line.contains("sha256:9"), "{line}");
}

#[test]
fn bad_logs_are_clear_errors() {
    let d = Daemon::start();
    let dir = d.dir.path();
    let w = LogWriter::agile(&d, &[SHA1, SHA256]);
    let mut good = w.bytes;
    let first = good.len();
    good.extend_from_slice(&9u32.to_le_bytes());
    good.extend_from_slice(&EV_IPL.to_le_bytes());
    good.extend_from_slice(&1u32.to_le_bytes());
    good.extend_from_slice(&SHA256.id.to_le_bytes());
    good.extend_from_slice(&(SHA256.hash)(b"k"));
    good.extend_from_slice(&1u32.to_le_bytes());
    good.push(b'k');
    let show = |name: &str, bytes: &[u8]| {
        let file = dir.join(name);
        std::fs::write(&file, bytes).unwrap();
        fails(&d.cli(&["eventlog", "show", "--log", file.to_str().unwrap()]), 2)
    };
    ok(d.cli(&["eventlog", "show", "--log", {
        std::fs::write(dir.join("good.bin"), &good).unwrap();
        dir.join("good.bin").to_str().unwrap()
    }]));
    let line = show("truncated.bin", &good[..30]);
    assert!(
        line.ends_with("truncated.bin: event log truncated at offset 0: TCG_PCR_EVENT header needs 32 bytes, 30 left"),
        "{line}"
    );
    let mut overrun = good[..first + 12 + 2 + 10].to_vec();
    overrun[first + 8..first + 12].copy_from_slice(&2u32.to_le_bytes());
    let line = show("overrun.bin", &overrun);
    assert!(
        line.ends_with(&format!("event log truncated at offset {}: digest needs 32 bytes, 10 left", first + 12)),
        "{line}"
    );
    let mut unknown = good.clone();
    unknown[first + 12..first + 14].copy_from_slice(&0x0027u16.to_le_bytes());
    let line = show("unknown.bin", &unknown);
    assert!(
        line.ends_with(&format!(
            "invalid event log at offset {}: event {}: algorithm 0x0027 is not declared in the log's header",
            first + 12,
            2
        )),
        "{line}"
    );
    let mut huge = good.clone();
    let size_at = first + 12 + 34;
    huge[size_at..size_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let line = show("huge.bin", &huge);
    assert!(
        line.ends_with(&format!("event log truncated at offset {size_at}: event data needs 4294967295 bytes, 1 left")),
        "{line}"
    );
}

/// A hostile log (issue #31 item 7): a UEFI variable name and a device-path file name carrying
/// terminal escapes (ESC sequences, BEL, DEL, a C1 CSI, a bidi override) reach `eventlog show`'s
/// text output escaped, with no raw control byte; JSON keeps the exact name, all escaped too.
#[test]
fn hostile_names_are_escaped_in_text_output() {
    let d = Daemon::start();
    let hostile = "Secure\u{1b}[2J\u{1b}]0;owned\u{7}Boot\u{7f}\u{9b}31m\u{202e}é";
    let utf16 = |s: &str| -> Vec<u8> { s.encode_utf16().flat_map(u16::to_le_bytes).collect() };
    let guid = hex::decode("61dfe48bca93d211aa0d00e098032b8c").unwrap();
    let name = utf16(hostile);
    let chars = hostile.encode_utf16().count() as u64;
    let variable = [&guid[..], &chars.to_le_bytes(), &1u64.to_le_bytes(), &name, &[1]].concat();
    let file = utf16("\\EFI\u{1b}[31m\\evil\r.efi\0");
    let mut path = vec![4, 4];
    path.extend_from_slice(&((file.len() + 4) as u16).to_le_bytes());
    path.extend_from_slice(&file);
    path.extend_from_slice(&[0x7f, 0xff, 4, 0]);
    let image = [
        &0u64.to_le_bytes()[..],
        &0x1000u64.to_le_bytes(),
        &0u64.to_le_bytes(),
        &(path.len() as u64).to_le_bytes(),
        &path,
    ]
    .concat();
    let mut w = LogWriter::agile(&d, &[SHA256]);
    w.event(7, EV_EFI_VARIABLE_DRIVER_CONFIG, &variable);
    w.event(4, EV_EFI_BOOT_SERVICES_APPLICATION, &image);
    let log = d.dir.path().join("hostile.bin");
    std::fs::write(&log, &w.bytes).unwrap();

    let out = ok(d.cli(&["eventlog", "show", "--log", log.to_str().unwrap()]));
    let text = String::from_utf8(out.clone()).unwrap();
    let raw: Vec<char> =
        text.chars().filter(|&c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c)).collect();
    assert!(raw.is_empty(), "raw control characters {raw:?} in:\n{text}");
    assert!(
        text.contains("variable 8be4df61-93ca-11d2-aa0d-00e098032b8c:Secure\\x1b[2J\\x1b]0;owned\\x07Boot\\x7f\\u{9b}31m\\u{202e}é (1 bytes)"),
        "{text}"
    );
    assert!(text.contains("image \\EFI\\x1b[31m\\evil\\x0d.efi (4096 bytes)"), "{text}");

    let out = ok(d.cli(&["eventlog", "show", "--log", log.to_str().unwrap(), "--output", "json"]));
    let text = String::from_utf8(out.clone()).unwrap();
    let raw: Vec<char> =
        text.chars().filter(|&c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c)).collect();
    assert!(raw.is_empty(), "raw control characters {raw:?} in:\n{text}");
    let events = json(out);
    let events = events["events"].as_array().unwrap();
    assert!(events.iter().any(|e| e["data"]["name"] == hostile), "{events:?}");
    assert!(events.iter().any(|e| e["data"]["device_path"] == "\\EFI\u{1b}[31m\\evil\r.efi"), "{events:?}");
}
