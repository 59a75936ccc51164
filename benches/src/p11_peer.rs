//! The tpm2-pkcs11 peer of the PKCS#11 phase ([`crate::p11`]), what PKCS#11 users of TPM keys
//! run today, on the benchmark's swtpm. It needs a resource manager (bare swtpm fails with
//! 0x902), so every use runs tpm2-abrmd on a private D-Bus session bus ([`crate::tls_peers`]'s
//! `Bus` and `Abrmd`); swtpm serves one client at a time, so that happens while no daemon holds
//! the swtpm, and abrmd is stopped again before the next phase.
//!
//! Set-up, once per run (untimed): a forgiving dictionary-attack policy (forked nginx workers
//! make the module fail HMAC checks, and three failures lock the TPM), a persistent primary key
//! at [`PRIMARY`], then `tpm2_ptool init`, `addtoken`, `addkey` (P-256) in a store in the
//! scratch directory; its public key (read with `pkcs11-tool`) is certified by a software CA,
//! since `openssl req -engine pkcs11` fails with this module.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{ensure, Context as _, Result};

use crate::tls_peers::{abrmd_missing, on_path, Abrmd, Bus};

/// The module Debian's `libtpm2-pkcs11-1` installs.
pub const MODULE: &str = "/usr/lib/x86_64-linux-gnu/pkcs11/libtpm2_pkcs11.so";
/// What to install for this peer (Debian/Ubuntu).
pub const INSTALL: &str =
    "apt-get install -y libtpm2-pkcs11-1 libtpm2-pkcs11-tools tpm2-abrmd libtss2-tcti-tabrmd0 dbus tpm2-tools opensc";
/// Persistent handle of the token's primary key.
const PRIMARY: &str = "0x81000002";
/// Token label, key label and user PIN.
pub const TOKEN: &str = "tok";
/// Label of the token's P-256 key.
pub const KEY: &str = "k1";
/// The token's user PIN.
pub const PIN: &str = "1234";

/// The PKCS#11 URI of the peer's private key, with its PIN, for libp11's OpenSSL engine.
pub fn engine_uri() -> String {
    format!("pkcs11:token={TOKEN};object={KEY};type=private;pin-value={PIN}")
}

/// Why the peer cannot run here, if it cannot (without `pkcs11-tool` it runs, but not nginx).
pub fn missing() -> Option<String> {
    let mut missing = Vec::new();
    if !Path::new(MODULE).is_file() {
        missing.push(format!("{MODULE} (libtpm2-pkcs11-1)"));
    }
    for (cmd, package) in [
        ("tpm2_ptool", "libtpm2-pkcs11-tools"),
        ("tpm2_createprimary", "tpm2-tools"),
        ("tpm2_dictionarylockout", "tpm2-tools"),
    ] {
        if !on_path(cmd) {
            missing.push(format!("`{cmd}` ({package})"));
        }
    }
    let mut why: Vec<String> = Vec::new();
    if !missing.is_empty() {
        why.push(format!("not installed: {}", missing.join(", ")));
    }
    why.extend(abrmd_missing());
    (!why.is_empty()).then(|| format!("{}: `{INSTALL}`", why.join("; ")))
}

/// The peer's token, made once per run.
#[derive(Debug, Clone)]
pub struct Tpm2Peer {
    /// Scratch directory (store, bus socket, logs, certificate).
    dir: PathBuf,
    /// TCTI of the swtpm.
    tcti: String,
    /// Certificate of the token's key (PEM); none without `pkcs11-tool` (opensc) to read its
    /// public key.
    pub cert: Option<PathBuf>,
}

impl Tpm2Peer {
    /// Makes the token and its key on the swtpm at `tcti` (see the module docs).
    ///
    /// # Errors
    /// Any step's failure, with its output.
    pub fn setup(tcti: &str, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir.join("store")).with_context(|| format!("{}", dir.display()))?;
        let mut peer = Self { dir: dir.to_owned(), tcti: tcti.to_owned(), cert: None };
        let read_public = on_path("pkcs11-tool");
        let (prim, public) = (dir.join("prim.ctx").display().to_string(), dir.join("pub.der").display().to_string());
        peer.with_abrmd(|env| {
            let handle = format!("--primary-handle={PRIMARY}");
            let steps: [(&str, Vec<&str>); 6] = [
                ("tpm2_dictionarylockout", vec!["-s", "-n", "1000", "-t", "1", "-l", "1"]),
                ("tpm2_createprimary", vec!["-C", "o", "-G", "ecc256", "-c", &prim]),
                ("tpm2_evictcontrol", vec!["-C", "o", "-c", &prim, PRIMARY]),
                ("tpm2_ptool", vec!["init", &handle]),
                ("tpm2_ptool", vec!["addtoken", "--pid=1", "--label=tok", "--userpin=1234", "--sopin=5678"]),
                (
                    "tpm2_ptool",
                    vec!["addkey", "--label=tok", "--key-label=k1", "--id=01", "--userpin=1234", "--algorithm=ecc256"],
                ),
            ];
            steps.iter().try_for_each(|(cmd, args)| run(cmd, args, env))?;
            let read = ["--module", MODULE, "--read-object", "--type", "pubkey", "--label", KEY, "-o", &public];
            if read_public {
                run("pkcs11-tool", &read, env)?;
            }
            Ok(())
        })?;
        if read_public {
            peer.certify().context("certifying the tpm2-pkcs11 key")?;
            peer.cert = Some(dir.join("tpm2-cert.pem"));
        }
        Ok(peer)
    }

    /// The token's store (`TPM2_PKCS11_STORE`).
    pub fn store(&self) -> PathBuf {
        self.dir.join("store")
    }

    /// A software CA's certificate for the token key's public key (`openssl x509 -new
    /// -force_pubkey`, v3: a subjectAltName for localhost).
    fn certify(&self) -> Result<()> {
        let s = |p: &str| self.dir.join(p).display().to_string();
        let (der, pem, ca_key, ca, cert) = (s("pub.der"), s("pub.pem"), s("ca.key"), s("ca.pem"), s("tpm2-cert.pem"));
        run("openssl", &["pkey", "-pubin", "-inform", "DER", "-in", &der, "-out", &pem], &[])?;
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=bench CA"];
        run("openssl", &[&["req", "-x509"][..], &ec, &["-keyout", &ca_key, "-out", &ca]].concat(), &[])?;
        // Extensions make it an X.509 v3 certificate, which rustls clients require (v1 is
        // `UnsupportedCertVersion` to them).
        let ext = s("ext.cnf");
        std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n")
            .with_context(|| ext.clone())?;
        let x509 = ["x509", "-new", "-subj", "/CN=localhost", "-days", "30", "-force_pubkey", &pem, "-extfile", &ext];
        run("openssl", &[&x509[..], &["-CA", &ca, "-CAkey", &ca_key, "-out", &cert]].concat(), &[])
    }

    /// The module's environment while abrmd serves on the bus at `bus`.
    fn env(&self, bus: &str) -> Vec<(String, String)> {
        [
            ("DBUS_SESSION_BUS_ADDRESS", bus.to_owned()),
            ("TPM2_PKCS11_TCTI", "tabrmd:bus_type=session".to_owned()),
            ("TPM2TOOLS_TCTI", "tabrmd:bus_type=session".to_owned()),
            ("TPM2_PKCS11_STORE", self.store().display().to_string()),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into()
    }

    /// Runs `f` with the module's environment while tpm2-abrmd serves the swtpm; stops abrmd
    /// and its bus afterwards (also on errors) and flushes what was left loaded.
    ///
    /// # Errors
    /// Start failures, `f`'s error, the flush.
    pub fn with_abrmd<T>(&self, f: impl FnOnce(&[(String, String)]) -> Result<T>) -> Result<T> {
        let result = {
            let bus = Bus::start(&self.dir)?;
            let abrmd = Abrmd::start(&self.tcti, &bus.address, &self.dir.join("tpm2-abrmd.log"))?;
            let r = f(&self.env(&bus.address));
            drop(abrmd);
            drop(bus);
            r
        };
        let flushed = crate::sign::raw::flush_leftovers(&self.tcti).context("flushing after tpm2-abrmd");
        let value = result?;
        flushed?;
        Ok(value)
    }
}

/// Runs `cmd ARGS` with `env`; fails with its output when it fails.
fn run(cmd: &str, args: &[&str], env: &[(String, String)]) -> Result<()> {
    let out = Command::new(cmd)
        .close_inherited_fds()
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("OPENSSL_CONF")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd}"))?;
    ensure!(
        out.status.success(),
        "`{cmd} {}` failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
