//! `tpm-vault keylime-agent` against the real Keylime 7.14.3 (from PyPI): a registrar and a
//! push-mode verifier on loopback with sqlite in a temp `KEYLIME_DIR`, `keylime_tenant` to
//! enroll, and the vault's daemon over an swtpm whose EK certificate is signed by a local CA
//! the tenant trusts (`swtpm_setup --create-ek-cert`).
//!
//! Keylime is installed once per machine by `scripts/keylime-venv.sh` (a venv keyed by the
//! version, under /var/cache/tpm-vault-keylime or `$TPM_VAULT_KEYLIME_CACHE`); the test runs it
//! when the venv is missing.

mod support;

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{fails, Daemon, DaemonCli as _};
use tempfile::TempDir;
use tpm_vault_cli::keylime::{Agent, AgentConfig, KeylimeError};

/// The Keylime version the tests run.
const KEYLIME_VERSION: &str = "7.14.3";

/// Where the venv, the config templates and the default configs are cached.
fn cache_dir() -> PathBuf {
    std::env::var_os("TPM_VAULT_KEYLIME_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/tpm-vault-keylime"), Into::into)
}

/// The venv, installed by `scripts/keylime-venv.sh` if missing.
fn venv() -> PathBuf {
    let venv = cache_dir().join(format!("venv-{KEYLIME_VERSION}"));
    if !venv.join("bin/keylime_verifier").exists() || !cache_dir().join(format!("conf-{KEYLIME_VERSION}")).exists() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/keylime-venv.sh");
        let status = Command::new("sh").arg(&script).arg(cache_dir()).status().expect("run keylime-venv.sh");
        assert!(status.success(), "{} failed: Keylime {KEYLIME_VERSION} is not installed", script.display());
    }
    venv
}

/// A registrar and a push-mode verifier, with the tenant's settings; stopped on drop.
struct Keylime {
    dir: TempDir,
    venv: PathBuf,
    verifier_port: u16,
    registrar_port: u16,
    verifier: Option<Child>,
    registrar: Option<Child>,
}

impl Keylime {
    /// Starts both (the verifier first: it makes the CA the registrar and tenant use), trusting
    /// the EK certificates issued by the CA in `ek_ca` (PEM files).
    fn start(ek_ca: &[PathBuf]) -> Keylime {
        Keylime::start_with(ek_ca, &[])
    }

    /// [`Keylime::start`] with `verifier` settings of `verifier.conf` changed.
    fn start_with(ek_ca: &[PathBuf], verifier: &[(&str, String)]) -> Keylime {
        let venv = venv();
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("conf");
        std::fs::create_dir_all(&conf).expect("conf dir");
        let store = dir.path().join("tpm_cert_store");
        std::fs::create_dir_all(&store).expect("cert store");
        for (i, ca) in ek_ca.iter().enumerate() {
            std::fs::copy(ca, store.join(format!("ek-ca-{i}.pem"))).expect("copy EK CA");
        }
        let (verifier_port, registrar_port, registrar_tls_port) =
            (support::free_port(), support::free_port(), support::free_port());
        let defaults = cache_dir().join(format!("conf-{KEYLIME_VERSION}"));
        let edit = |file: &str, changes: &[(&str, String)]| {
            let text = std::fs::read_to_string(defaults.join(file)).expect("default config");
            let out: Vec<String> = text
                .lines()
                .map(|line| {
                    changes
                        .iter()
                        .find(|(key, _)| line.starts_with(&format!("{key} =")))
                        .map_or_else(|| line.to_owned(), |(key, value)| format!("{key} = {value}"))
                })
                .collect();
            std::fs::write(conf.join(file), out.join("\n") + "\n").expect("write config");
        };
        let mut verifier_changes = verifier.to_vec();
        verifier_changes.extend_from_slice(&[
            ("port", verifier_port.to_string()),
            ("registrar_port", registrar_tls_port.to_string()),
            ("mode", "push".into()),
            ("num_workers", "1".into()),
            ("quote_interval", "1".into()),
        ]);
        edit("verifier.conf", &verifier_changes);
        edit("registrar.conf", &[("port", registrar_port.to_string()), ("tls_port", registrar_tls_port.to_string())]);
        edit(
            "tenant.conf",
            &[
                ("verifier_port", verifier_port.to_string()),
                ("registrar_port", registrar_tls_port.to_string()),
                ("tpm_cert_store", store.display().to_string()),
            ],
        );
        for file in ["ca.conf", "logging.conf", "agent.conf"] {
            std::fs::copy(defaults.join(file), conf.join(file)).expect("copy config");
        }
        let mut keylime = Keylime { dir, venv, verifier_port, registrar_port, verifier: None, registrar: None };
        keylime.start_verifier();
        keylime.start_registrar();
        keylime
    }

    fn command(&self, program: &str) -> Command {
        let d = self.dir.path();
        let conf = d.join("conf");
        let mut cmd = Command::new(self.venv.join("bin").join(program));
        cmd.env("KEYLIME_DIR", d)
            .env("KEYLIME_TEST", "True")
            .env("KEYLIME_VERIFIER_CONFIG", conf.join("verifier.conf"))
            .env("KEYLIME_REGISTRAR_CONFIG", conf.join("registrar.conf"))
            .env("KEYLIME_TENANT_CONFIG", conf.join("tenant.conf"))
            .env("KEYLIME_CA_CONFIG", conf.join("ca.conf"))
            .env("KEYLIME_LOGGING_CONFIG", conf.join("logging.conf"))
            .current_dir(d);
        cmd
    }

    fn spawn(&self, program: &str, log: &str, port: u16) -> Child {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(log)).expect("log");
        let mut cmd = self.command(program);
        cmd.stdin(Stdio::null()).stdout(log.try_clone().expect("log")).stderr(log).process_group(0);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {program}: {e}"));
        wait_for_port(port, Duration::from_secs(90), program);
        child
    }

    fn start_verifier(&mut self) {
        self.verifier = Some(self.spawn("keylime_verifier", "verifier.log", self.verifier_port));
    }

    fn start_registrar(&mut self) {
        self.registrar = Some(self.spawn("keylime_registrar", "registrar.log", self.registrar_port));
    }

    fn stop_verifier(&mut self) {
        stop(self.verifier.take());
    }

    fn stop_registrar(&mut self) {
        stop(self.registrar.take());
    }

    fn verifier_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.verifier_port)
    }

    fn registrar_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.registrar_port)
    }

    fn verifier_ca(&self) -> PathBuf {
        self.dir.path().join("cv_ca/cacert.crt")
    }

    /// `keylime_tenant ARGS...`.
    fn tenant(&self, args: &[&str]) -> Output {
        let out = self.command("keylime_tenant").args(args).stdin(Stdio::null()).output().expect("keylime_tenant");
        out
    }

    /// Enrolls `uuid` with the verifier in push mode with `policy` as its PCR policy.
    fn enroll(&self, uuid: &str, policy: &str) {
        self.enroll_with(uuid, &["--tpm_policy", policy]);
    }

    /// Enrolls `uuid` with the verifier in push mode with the tenant's options `policies`.
    fn enroll_with(&self, uuid: &str, policies: &[&str]) {
        let mut args = vec!["-c", "add", "--push-model", "-u", uuid];
        args.extend_from_slice(policies);
        let out = self.tenant(&args);
        assert!(
            out.status.success(),
            "keylime_tenant add failed:\n{}\n{}\nverifier log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log("verifier.log")
        );
    }

    /// The verifier's attestations of `uuid`, newest first (through the admin API, mTLS with
    /// the tenant's client certificate).
    /// Attestation `index` of `uuid` (GET .../attestations/INDEX: Keylime 7.14.3's listing of
    /// all attestations answers 500 once there are two, in `APIMessageBody.include`).
    fn attestation(&self, uuid: &str, index: &str) -> Option<Value> {
        let v: Value = serde_json::from_str(&self.attestations_raw(uuid, index)).unwrap_or(Value::Null);
        Self::listing(&v).into_iter().next()
    }

    fn attestations_raw(&self, uuid: &str, index: &str) -> String {
        let ca = self.dir.path().join("cv_ca");
        let out = Command::new("curl")
            .args(["-s", "--cacert"])
            .arg(ca.join("cacert.crt"))
            .arg("--cert")
            .arg(ca.join("client-cert.crt"))
            .arg("--key")
            .arg(ca.join("client-private.pem"))
            .arg(format!("{}/v3.0/agents/{uuid}/attestations/{index}", self.verifier_url()))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn listing(v: &Value) -> Vec<Value> {
        // One attestation comes as an object, several as an array.
        let mut list = match v.get("data") {
            Some(Value::Array(a)) => a.clone(),
            Some(o @ Value::Object(_)) => vec![o.clone()],
            _ => Vec::new(),
        };
        // Keylime 7.14.3 names each attestation in `links.self` only: copy its index to `id`.
        for a in &mut list {
            if a.get("id").is_none() {
                let index = a["links"]["self"].as_str().and_then(|l| l.rsplit('/').next()).map(str::to_owned);
                a["id"] = index.map_or(Value::Null, Value::String);
            }
        }
        list.sort_by_key(|a| std::cmp::Reverse(a["id"].as_str().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)));
        list
    }

    /// Waits until attestation `index` of `uuid` has an evaluation other than pending.
    fn evaluation(&self, uuid: &str, index: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found =
                self.attestation(uuid, index).and_then(|a| a["attributes"]["evaluation"].as_str().map(str::to_owned));
            match found {
                Some(e) if e != "pending" => return e,
                _ if Instant::now() > deadline => {
                    let mut listing = self.attestations_raw(uuid, index);
                    listing.truncate(3000);
                    panic!("attestation {index} was not evaluated in time: {listing}\n{}", self.log("verifier.log"))
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    fn log(&self, name: &str) -> String {
        let mut s = String::new();
        let _ = std::fs::File::open(self.dir.path().join(name)).and_then(|mut f| f.read_to_string(&mut s));
        // The admin API's polling is noise.
        let lines: Vec<&str> = s
            .lines()
            .filter(|l| !l.contains("INFO - GET /v3.0/agents/") && !l.contains("Authorization GRANTED"))
            .filter(|l| !l.contains("Sent 201"))
            .filter(|l| !l.contains("alembic") && !l.contains("keylime_db"))
            .collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Waits (30 s at most) until the verifier's log has a line with `needle` written after
    /// byte `from` of it, and returns that line.
    fn verifier_said(&self, from: usize, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read(self.dir.path().join("verifier.log")).unwrap_or_default();
            let tail = String::from_utf8_lossy(text.get(from..).unwrap_or_default()).into_owned();
            if let Some(line) = tail.lines().find(|l| l.contains(needle)) {
                return line.to_owned();
            }
            assert!(Instant::now() < deadline, "the verifier never logged {needle:?}:\n{}", self.log("verifier.log"));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The verifier log's length now (for [`Keylime::verifier_said`]).
    fn verifier_log_len(&self) -> usize {
        std::fs::metadata(self.dir.path().join("verifier.log")).map_or(0, |m| m.len() as usize)
    }

    /// A measured-boot policy (Keylime's `example` policy's reference state) made from `log` by
    /// `keylime-policy create measured-boot` (Secure Boot off); returns its file.
    fn mb_policy(&self, log: &Path) -> PathBuf {
        let out_file = self.dir.path().join("mb-refstate.json");
        let out = self
            .command("keylime-policy")
            .args(["create", "measured-boot", "--without-secureboot", "-e"])
            .arg(log)
            .arg("-o")
            .arg(&out_file)
            .stdin(Stdio::null())
            .output()
            .expect("keylime-policy");
        assert!(
            out.status.success() && out_file.exists(),
            "keylime-policy create measured-boot: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out_file
    }
}

impl Drop for Keylime {
    fn drop(&mut self) {
        stop(self.verifier.take());
        stop(self.registrar.take());
    }
}

/// Stops the process group `child` leads (Keylime forks workers), SIGKILL after 10 s.
fn stop(child: Option<Child>) {
    let Some(mut child) = child else { return };
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
}

fn wait_for_port(port: u16, timeout: Duration, what: &str) {
    let deadline = Instant::now() + timeout;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An swtpm state with an EK certificate from a fresh local CA; returns the CA certificates
/// (root and issuer) a verifier must trust.
fn provision_tpm(dir: &Path) -> Vec<PathBuf> {
    let ca = dir.join("localca");
    std::fs::create_dir_all(&ca).expect("ca dir");
    let localca = ca.join("swtpm-localca.conf");
    std::fs::write(
        &localca,
        format!(
            "statedir = {d}\nsignkey = {d}/signkey.pem\nsigningkey = {d}/signkey.pem\nissuercert = {d}/issuercert.pem\ncertserial = {d}/certserial\n",
            d = ca.display()
        ),
    )
    .expect("localca conf");
    let setup = ca.join("swtpm_setup.conf");
    std::fs::write(
        &setup,
        format!(
            "create_certs_tool = /usr/bin/swtpm_localca\ncreate_certs_tool_config = {}\ncreate_certs_tool_options = /etc/swtpm-localca.options\n",
            localca.display()
        ),
    )
    .expect("setup conf");
    let state = dir.join("swtpm");
    std::fs::create_dir_all(&state).expect("state dir");
    let out = Command::new("swtpm_setup")
        .args(["--tpm2", "--create-ek-cert", "--overwrite", "--tpmstate"])
        .arg(&state)
        .arg("--config")
        .arg(&setup)
        .output()
        .expect("swtpm_setup");
    assert!(out.status.success(), "swtpm_setup: {}", String::from_utf8_lossy(&out.stderr));
    vec![ca.join("swtpm-localca-rootca-cert.pem"), ca.join("issuercert.pem")]
}

/// A fresh UUID (random, version 4 layout).
fn new_uuid() -> String {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).expect("urandom");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// A daemon over a provisioned swtpm (EK certificate in NV) and a Keylime deployment trusting
/// its EK CA.
fn setup() -> (Daemon, Keylime) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ek_ca = provision_tpm(dir.path());
    let daemon = Daemon::start_in_dir(dir);
    let keylime = Keylime::start(&ek_ca);
    (daemon, keylime)
}

fn config(keylime: &Keylime, uuid: &str) -> AgentConfig {
    AgentConfig {
        uuid: uuid.to_owned(),
        registrar: keylime.registrar_url(),
        verifier: keylime.verifier_url(),
        verifier_ca: Some(keylime.verifier_ca()),
        registrar_ca: None,
        interval: None,
        pcrs: tpm_vault_cli::keylime::DEFAULT_PCRS.to_vec(),
        state_dir: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// The current sha256 PCR 9, hex.
fn pcr9(daemon: &Daemon) -> String {
    let out = support::ok_text(&daemon.cli(&["--output", "json", "pcr", "read", "--pcrs", "sha256:9"]));
    let v: Value = serde_json::from_str(&out).expect("json");
    let value = v["pcrs"][0]["value"].as_str().map(str::to_owned);
    value.unwrap_or_else(|| panic!("no PCR 9 in {out}"))
}

#[test]
fn registered_device_is_attested_by_the_verifier_then_fails_after_pcr9_changes() {
    let (daemon, mut keylime) = setup();
    let uuid = new_uuid();
    let rt = runtime();
    let mut agent = rt.block_on(async { Agent::new(daemon.client().await, config(&keylime, &uuid)) }).expect("agent");
    if let Err(e) = rt.block_on(agent.register()) {
        panic!("registration: {e}\nregistrar log:\n{}", keylime.log("registrar.log"));
    }
    let policy = format!("{{\"9\": [\"{}\"]}}", pcr9(&daemon));
    keylime.enroll(&uuid, &policy);

    // Attested, repeatedly.
    let mut last = String::new();
    for _ in 0..3 {
        let started = Instant::now();
        let round = attest_when_allowed(&rt, &mut agent);
        eprintln!("attestation round {} took {:?} (swtpm, loopback verifier)", round.index, started.elapsed());
        assert!(round.pcrs.contains(&9), "{round:?}");
        assert_eq!(keylime.evaluation(&uuid, &round.index), "pass", "{}", keylime.log("verifier.log"));
        assert_ne!(round.index, last);
        last = round.index;
    }

    // PCR 9 changes: the next round fails verification, and the vault's keys keep working.
    daemon.extend_pcr(9, b"an unexpected kernel");
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "fail");
    // (Keylime 7.14.3 does not render `failure_reason` in the attestation resource.)
    support::ok(daemon.cli(&["key", "create", "still-works"]));
    support::ok(daemon.cli(&["random", "16"]));

    // The verifier goes away: the round fails at once, saying so; back, the agent attests again
    // (its session survives the verifier's restart).
    keylime.stop_verifier();
    let started = Instant::now();
    let err = rt.block_on(agent.attest_once()).expect_err("no verifier");
    assert!(matches!(err, KeylimeError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains("cannot connect"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    keylime.start_verifier();
    let round = attest_when_allowed(&rt, &mut agent);
    assert!(!round.index.is_empty());
}

/// One round, waiting as told while the verifier answers 429/503.
fn attest_when_allowed(rt: &tokio::runtime::Runtime, agent: &mut Agent) -> tpm_vault_cli::keylime::Round {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rt.block_on(agent.attest_once()) {
            Ok(round) => return round,
            Err(e) if e.retry_after().is_some() && Instant::now() < deadline => {
                std::thread::sleep(e.retry_after().unwrap_or_default().max(Duration::from_millis(200)));
            }
            Err(e) => panic!("attestation round: {e}"),
        }
    }
}

/// A provisioned swtpm (EK certificate from its own CA) and the daemon over it, with the CA
/// certificates a verifier must trust for it. The daemon grants the test's uid only what the
/// agent needs (docs/INSTALL.md, "Fleet scale"): the `quote` operation.
fn device() -> (Daemon, Vec<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ek_ca = provision_tpm(dir.path());
    let rules = format!(
        "[[rule]]\nname = \"keylime-agent\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"quote\"]\n",
        nix::unistd::getuid().as_raw()
    );
    (Daemon::start_in_dir_with_policy(dir, &rules), ek_ca)
}

const EV_NO_ACTION: u32 = 0x3;
const EV_SEPARATOR: u32 = 0x4;
const EV_S_CRTM_VERSION: u32 = 0x8;
const EV_IPL: u32 = 0xd;
const EV_EFI_VARIABLE_DRIVER_CONFIG: u32 = 0x8000_0001;
const EV_EFI_BOOT_SERVICES_APPLICATION: u32 = 0x8000_0003;
const EV_EFI_ACTION: u32 = 0x8000_0007;
const EV_EFI_PLATFORM_FIRMWARE_BLOB: u32 = 0x8000_0008;

/// A TCG2 (crypto-agile, sha256 bank) UEFI event log being written as firmware, shim and grub
/// do, each event's digest extended into the daemon's TPM as it is logged, so that the log
/// replays to the TPM's PCRs.
struct BootLog<'a> {
    daemon: &'a Daemon,
    bytes: Vec<u8>,
}

impl<'a> BootLog<'a> {
    /// The Spec ID header event (SHA-1 format, not extended): one bank, sha256. No
    /// StartupLocality event: tpm2-tools 5.4, which Keylime parses logs with, would extend it.
    fn new(daemon: &'a Daemon) -> BootLog<'a> {
        let mut spec = b"Spec ID Event03\0".to_vec();
        spec.extend_from_slice(&0u32.to_le_bytes()); // platformClass: client
        spec.extend_from_slice(&[0, 2, 2, 2]); // version 2.0 errata 2, uintnSize 2
        spec.extend_from_slice(&1u32.to_le_bytes());
        spec.extend_from_slice(&0x000bu16.to_le_bytes());
        spec.extend_from_slice(&32u16.to_le_bytes());
        spec.push(0);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&EV_NO_ACTION.to_le_bytes());
        bytes.extend_from_slice(&[0; 20]);
        bytes.extend_from_slice(&(spec.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&spec);
        BootLog { daemon, bytes }
    }

    /// Logs an event whose sha256 digest is `digest` and extends the TPM with it.
    fn event(&mut self, pcr: u32, kind: u32, data: &[u8], digest: [u8; 32]) {
        self.daemon.extend_pcr_digest(tpm_vault_daemon::model::PcrBank::Sha256, pcr as u8, &digest);
        self.bytes.extend_from_slice(&pcr.to_le_bytes());
        self.bytes.extend_from_slice(&kind.to_le_bytes());
        self.bytes.extend_from_slice(&1u32.to_le_bytes());
        self.bytes.extend_from_slice(&0x000bu16.to_le_bytes());
        self.bytes.extend_from_slice(&digest);
        self.bytes.extend_from_slice(&(data.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(data);
    }

    /// An event whose digest is the hash of its data.
    fn measured(&mut self, pcr: u32, kind: u32, data: &[u8]) {
        self.event(pcr, kind, data, sha256(data));
    }

    /// A boot with Secure Boot off (what Keylime's `example` policy checks with
    /// `has_secureboot: false`): the CRTM version and a firmware volume (PCR 0), SecureBoot = 0
    /// (PCR 7), the separators, shim and grub (PCR 4), the kernel `kernel` and its initrd
    /// (PCR 9), the kernel command line (PCR 8).
    fn boot(daemon: &'a Daemon, kernel: &[u8]) -> BootLog<'a> {
        let mut log = BootLog::new(daemon);
        log.measured(0, EV_S_CRTM_VERSION, &utf16("1.00\0"));
        let blob = [0xffc0_0000u64.to_le_bytes(), 0x40_0000u64.to_le_bytes()].concat();
        log.event(0, EV_EFI_PLATFORM_FIRMWARE_BLOB, &blob, sha256(b"the firmware volume"));
        let guid = hex::decode("61dfe48bca93d211aa0d00e098032b8c").expect("hex");
        let name = utf16("SecureBoot");
        let secure_boot = [&guid[..], &10u64.to_le_bytes(), &1u64.to_le_bytes(), &name, &[0]].concat();
        log.measured(7, EV_EFI_VARIABLE_DRIVER_CONFIG, &secure_boot);
        for pcr in 0..8 {
            log.measured(pcr, EV_SEPARATOR, &[0; 4]);
        }
        log.measured(4, EV_EFI_ACTION, b"Calling EFI Application from Boot Option");
        log.event(
            4,
            EV_EFI_BOOT_SERVICES_APPLICATION,
            &support::image_load_event("\\EFI\\debian\\shimx64.efi"),
            sha256(b"shim"),
        );
        log.event(
            4,
            EV_EFI_BOOT_SERVICES_APPLICATION,
            &support::image_load_event("\\EFI\\debian\\grubx64.efi"),
            sha256(b"grub"),
        );
        log.event(9, EV_IPL, b"/boot/vmlinuz-6.1\0", sha256(kernel));
        // grub measures the command line without its "kernel_cmdline: " label and NUL.
        let cmdline = "/boot/vmlinuz-6.1 root=/dev/vda1 ro";
        log.event(8, EV_IPL, format!("kernel_cmdline: {cmdline}\0").as_bytes(), sha256(cmdline.as_bytes()));
        log.event(9, EV_IPL, b"/boot/initrd.img-6.1\0", sha256(b"the initrd"));
        log
    }

    /// Writes the log where the daemon serves it from.
    fn install(&self) -> PathBuf {
        let path = self.daemon.dir.path().join(support::EVENT_LOG);
        std::fs::write(&path, &self.bytes).expect("write the event log");
        path
    }
}

fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}

fn utf16(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

#[test]
fn measured_boot_policy_passes_on_a_log_that_replays_then_fails_on_a_changed_boot_or_a_pcr_outside_the_log() {
    let (daemon, ek_ca) = device();
    // Keylime's `example` measured-boot policy, evaluated on every round (not only the first).
    let keylime = Keylime::start_with(
        &ek_ca,
        &[("measured_boot_policy_name", "example".into()), ("measured_boot_evaluate", "always".into())],
    );
    let mut log = BootLog::boot(&daemon, b"kernel 6.1");
    let log_file = log.install();
    let policy = keylime.mb_policy(&log_file);
    let uuid = new_uuid();
    let rt = runtime();
    let mut agent = rt.block_on(async { Agent::new(daemon.client().await, config(&keylime, &uuid)) }).expect("agent");
    if let Err(e) = rt.block_on(agent.register()) {
        panic!("registration: {e}\nregistrar log:\n{}", keylime.log("registrar.log"));
    }
    keylime.enroll_with(&uuid, &["--mb-policy", &policy.display().to_string()]);

    // An agent offering PCRs 0-9 only: Keylime asks for 0-9 and 11-15 under a measured-boot
    // policy and refuses the capabilities, saying so.
    let mut narrow = config(&keylime, &uuid);
    narrow.pcrs = (0..10).collect();
    let mut narrow = rt.block_on(async { Agent::new(daemon.client().await, narrow) }).expect("agent");
    rt.block_on(narrow.open_session()).expect("session");
    let err = rt.block_on(narrow.request_evidence()).expect_err("PCRs 11-15 missing");
    assert_eq!(err.status(), Some(http::StatusCode::UNPROCESSABLE_ENTITY), "{err}");
    assert!(err.to_string().contains("offered: sha256 PCRs 0,1,2,3,4,5,6,7,8,9,"), "{err}");
    eprintln!("offering PCRs 0-9 under a measured-boot policy: {err}");
    drop(narrow);

    // The log replays to the TPM and matches the policy: attested, with the log sent.
    for _ in 0..2 {
        let from = keylime.verifier_log_len();
        let round = attest_when_allowed(&rt, &mut agent);
        assert!(round.sent_event_log, "{round:?}");
        assert_eq!(round.pcrs, tpm_vault_cli::keylime::DEFAULT_PCRS.to_vec());
        assert_eq!(keylime.evaluation(&uuid, &round.index), "pass", "{}", keylime.log("verifier.log"));
        keylime.verifier_said(from, "Compared PCRs 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 14 against measured boot log");
        keylime.verifier_said(from, &format!("Checking measured boot log against policy for agent: {uuid}"));
    }

    // A second kernel is booted (kexec), logged and measured: the log still replays, but the
    // policy allows one kernel, this one not: a policy violation.
    let from = keylime.verifier_log_len();
    log.event(9, EV_IPL, b"/boot/vmlinuz-evil\0", sha256(b"another kernel"));
    log.install();
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "fail");
    keylime.verifier_said(
        from,
        &format!("Attestation {} for agent '{uuid}' failed verification due to policy violations", round.index),
    );

    // A PCR extended outside the log: the log no longer replays to the quoted PCRs.
    let from = keylime.verifier_log_len();
    daemon.extend_pcr(4, b"a driver nobody logged");
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "fail");
    keylime.verifier_said(from, "For PCR 4 and hash sha256 the boot event log has value");
    keylime.verifier_said(from, "the UEFI log could not be authenticated against the TPM quote");
}

/// The failures Keylime documents, against one registrar and verifier: each ends as Keylime
/// says, within seconds, and the agent's error says what happened.
#[test]
fn wrong_ak_replayed_quote_dropped_connections_restarts_and_a_tpm_reset_end_as_keylime_documents() {
    let (mut daemon, ek_ca) = device();
    let (other, other_ca) = device();
    let mut keylime = Keylime::start(&[ek_ca, other_ca].concat());
    let uuid = new_uuid();
    let rt = runtime();
    let mut agent = rt.block_on(async { Agent::new(daemon.client().await, config(&keylime, &uuid)) }).expect("agent");
    rt.block_on(agent.register()).expect("registration");
    keylime.enroll(&uuid, &format!("{{\"9\": [\"{}\"]}}", pcr9(&daemon)));
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "pass", "{}", keylime.log("verifier.log"));
    // With `quote` and nothing else: the vault's keys are out of the agent's reach.
    fails(&daemon.cli(&["key", "create", "not-for-the-agent"]), 5);
    fails(&daemon.cli(&["random", "16"]), 5);

    // Wrong AK: another TPM claims this UUID. The registrar refuses its keys (403, Keylime's
    // words passed on), and the agent's loop stops at once instead of retrying; without
    // registering, its proof of possession fails at the verifier (which holds the first AK).
    let mut impostor = rt.block_on(async { Agent::new(other.client().await, config(&keylime, &uuid)) }).expect("agent");
    let err = rt.block_on(impostor.register()).expect_err("another TPM for this UUID");
    assert_eq!(err.status(), Some(http::StatusCode::FORBIDDEN), "{err}");
    assert!(err.to_string().contains("different TPM identity"), "{err}");
    let impostor_loop = rt.block_on(async {
        let agent = Agent::new(other.client().await, config(&keylime, &uuid)).expect("agent");
        tokio::time::timeout(Duration::from_secs(20), agent.run(std::future::pending())).await
    });
    let err = impostor_loop.expect("the loop gives up instead of retrying").expect_err("refused");
    assert!(err.to_string().contains("403"), "{err}");
    let err = rt.block_on(impostor.open_session()).expect_err("not the registered AK");
    assert!(matches!(err, KeylimeError::SessionRefused { .. }), "{err}");
    assert!(err.to_string().contains("the AK is not the one registered for this UUID"), "{err}");
    eprintln!("another TPM's proof of possession: {err}");
    // The device itself is untouched.
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "pass");

    // The verifier's connection drops mid-round (after it asked for evidence, before the
    // evidence is sent): the submission fails at once, saying so; once the verifier is back,
    // the same evidence completes the round (the attestation waited in its database).
    let request = attest_request(&rt, &mut agent);
    keylime.stop_verifier();
    let evidence = rt.block_on(agent.collect(&request)).expect("quote");
    let started = Instant::now();
    let err = rt.block_on(agent.submit(&evidence)).expect_err("no verifier");
    assert!(matches!(err, KeylimeError::Unreachable { .. }) && err.to_string().contains("cannot connect"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    keylime.start_verifier();
    let round = rt.block_on(agent.submit(&evidence)).expect("the same evidence, once the verifier is back");
    assert_eq!(keylime.evaluation(&uuid, &round.index), "pass");

    // The registrar restarts: attestation does not need it; registration fails at once while
    // it is down, and succeeds again (same TPM, same keys) once it is back.
    keylime.stop_registrar();
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "pass");
    let started = Instant::now();
    let err = rt.block_on(agent.register()).expect_err("no registrar");
    assert!(matches!(err, KeylimeError::Unreachable { .. }) && err.to_string().contains("cannot connect"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    keylime.start_registrar();
    rt.block_on(agent.register()).expect("registration again");
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "pass");

    // A replayed quote. The evidence of a round already answered, sent again: refused.
    let request = attest_request(&rt, &mut agent);
    let old = rt.block_on(agent.collect(&request)).expect("quote");
    let round = rt.block_on(agent.submit(&old)).expect("evidence");
    assert_eq!(keylime.evaluation(&uuid, &round.index), "pass");
    let err = rt.block_on(agent.submit(&old)).expect_err("the attestation was answered");
    eprintln!("evidence sent twice: {err}");
    assert!(err.status().is_some_and(|s| s.is_client_error()), "{err}");
    // The same old quote as the answer to a new nonce: accepted for checking, and failed (the
    // quote does not carry the verifier's nonce).
    let _ = attest_request(&rt, &mut agent);
    let from = keylime.verifier_log_len();
    let round = rt.block_on(agent.submit(&old)).expect("evidence");
    assert_eq!(keylime.evaluation(&uuid, &round.index), "fail");
    keylime.verifier_said(from, "the TPM quote could not be authenticated");
    // The next honest round passes again.
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "pass", "{}", keylime.log("verifier.log"));

    // A TPM reset by a power cut (swtpm killed and started again: PCRs back to zero, resetCount
    // + 1, and the clock not known to be safe until the TPM writes it to NV again). PCR 9 was
    // zero, so the policy still holds; the quote's clock info does not: Keylime refuses a
    // quote whose `safe` flag is clear (`check_quote_timing`: "clock safe flag is disabled"),
    // so the round fails as a quote that cannot be authenticated, and the agent keeps sending
    // rounds (its session and registration stand: the AK is the vault's, persistent).
    let before = clock_info(&rt, &daemon);
    assert!(before.safe);
    daemon.reboot_tpm();
    let after = clock_info(&rt, &daemon);
    assert_eq!(after.reset_count, before.reset_count + 1);
    assert!(!after.safe, "{after:?}");
    let from = keylime.verifier_log_len();
    let round = attest_when_allowed(&rt, &mut agent);
    assert_eq!(keylime.evaluation(&uuid, &round.index), "fail");
    keylime.verifier_said(
        from,
        &format!(
            "Attestation {} for agent '{uuid}' failed verification because the TPM quote could not be authenticated",
            round.index
        ),
    );
}

/// The TPM's clock info, from a quote through the daemon (the vault's ECC AK).
fn clock_info(rt: &tokio::runtime::Runtime, daemon: &Daemon) -> tpm_vault_client::attest::QuoteInfo {
    let binding: tpm_vault_client::PcrBinding = "sha256:9".parse().expect("binding");
    rt.block_on(async {
        let quote = daemon.client().await.quote(&binding, b"clock").await.expect("quote");
        quote.verify(b"clock", &[]).expect("verify")
    })
}

/// A round's first step, waiting as told while the verifier answers 429/503.
fn attest_request(rt: &tokio::runtime::Runtime, agent: &mut Agent) -> tpm_vault_cli::keylime::EvidenceRequest {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rt.block_on(agent.request_evidence()) {
            Ok(request) => return request,
            Err(e) if e.status() == Some(http::StatusCode::UNAUTHORIZED) => {
                rt.block_on(agent.open_session()).expect("session");
            }
            Err(e) if e.retry_after().is_some() && Instant::now() < deadline => {
                std::thread::sleep(e.retry_after().unwrap_or_default().max(Duration::from_millis(200)));
            }
            Err(e) => panic!("capabilities: {e}"),
        }
    }
}

/// What one attestation round costs the device, on the TPM device model (the Jetson Orin
/// fTPM's command times at speed 1, behind the kernel's resource manager): the daemon calls
/// the agent makes per round (the event log, TPM2_Quote of the default PCRs with the RSA AK)
/// and per session (TPM2_Certify of the AK), counted by TPM command and timed. No Keylime
/// here: the verifier's side costs the device nothing but the two HTTPS requests.
/// Recorded in docs/BENCHMARKS.md ("Keylime round on the device model").
#[test]
fn one_round_on_the_orin_ftpm_model_costs_one_quote_and_a_certify_per_session() {
    use tpm_vault_client::attest::AkAlg;
    use tpm_vault_tpm_model::wire::cc;
    const ROUNDS: u64 = 5;
    let daemon = Daemon::start_modeled(1.0);
    // A boot's event log (the daemon reads it from disk per round: no TPM command).
    BootLog::boot(&daemon, b"kernel 6.1").install();
    let rt = runtime();
    let pcrs: tpm_vault_client::PcrBinding = format!(
        "sha256:{}",
        tpm_vault_cli::keylime::DEFAULT_PCRS.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    )
    .parse()
    .expect("PCRs");
    rt.block_on(async {
        let client = daemon.client().await;
        // Start-up: the EK and the RSA AK (created on first use), one quote and certify.
        let started = Instant::now();
        client.attestation_key_of(AkAlg::Rsa2048).await.expect("AK");
        client.quote_with(AkAlg::Rsa2048, &pcrs, &[1; 32]).await.expect("quote");
        client.certify_attestation_key(AkAlg::Rsa2048, &[2; 32]).await.expect("certify");
        eprintln!("keylime agent start-up on the orin-ftpm model (EK, RSA AK, first quote): {:?}", started.elapsed());

        let before = daemon.space().stats().tpm;
        let started = Instant::now();
        for i in 0..ROUNDS {
            client.event_log().await.expect("event log");
            client.quote_with(AkAlg::Rsa2048, &pcrs, &[i as u8; 32]).await.expect("quote");
        }
        let round = started.elapsed() / ROUNDS as u32;
        let rounds = daemon.space().stats().tpm.since(&before);

        let before = daemon.space().stats().tpm;
        let started = Instant::now();
        for i in 0..ROUNDS {
            client.certify_attestation_key(AkAlg::Rsa2048, &[i as u8; 32]).await.expect("certify");
        }
        let session = started.elapsed() / ROUNDS as u32;
        let sessions = daemon.space().stats().tpm.since(&before);

        eprintln!(
            "keylime round on the orin-ftpm model, speed 1: {round:?} per round (TPM held {:?}: {}); \
             {session:?} more per new session (TPM held {:?}: {})",
            rounds.time() / ROUNDS as u32,
            rounds.describe(ROUNDS),
            sessions.time() / ROUNDS as u32,
            sessions.describe(ROUNDS),
        );
        assert_eq!(rounds.count(cc::QUOTE), ROUNDS, "{}", rounds.describe(ROUNDS));
        assert_eq!(rounds.count(cc::CERTIFY), 0);
        assert_eq!(sessions.count(cc::CERTIFY), ROUNDS, "{}", sessions.describe(ROUNDS));
        assert_eq!(sessions.count(cc::QUOTE), 0);
        // The AK stays loaded: no key is created or loaded again per round.
        for code in [cc::CREATE, cc::CREATE_PRIMARY, cc::LOAD] {
            assert_eq!(rounds.count(code) + sessions.count(code), 0, "{}", rounds.describe(ROUNDS));
        }
        assert_eq!(daemon.space().stats().failed, 0, "resource-manager failures");
    });
}
