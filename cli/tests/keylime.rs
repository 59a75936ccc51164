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
use support::{Daemon, DaemonCli as _};
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
        edit(
            "verifier.conf",
            &[
                ("port", verifier_port.to_string()),
                ("registrar_port", registrar_tls_port.to_string()),
                ("mode", "push".into()),
                ("num_workers", "1".into()),
                ("quote_interval", "1".into()),
            ],
        );
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
        let out = self.tenant(&["-c", "add", "--push-model", "-u", uuid, "--tpm_policy", policy]);
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
