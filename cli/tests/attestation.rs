//! Attestation end to end, against the real daemon over its own swtpm: quotes written by
//! `tpm-vault quote` verify in-core (library and `verify-quote`) and with tpm2-tools'
//! `tpm2_checkquote`; a wrong nonce, a flipped bit, a tampered PCR value and another AK are
//! rejected by both, ours naming the reason; without an enrolled AK (`--ak`) `verify-quote` says
//! the signer was not checked and exits 12; PCR 9 expectations; credential activation with a
//! credential made by `tpm2_makecredential`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use sha2::{Digest, Sha256};
use support::{fails, ok, Daemon, DaemonCli as _};
use tpm_vault_client::{BlockingClient, PcrBinding, QuoteError};

/// A nonce no earlier run used.
fn fresh_nonce() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let seed = format!("{}-{}-{:?}", now.as_nanos(), std::process::id(), std::thread::current().id());
    hex::encode(&Sha256::digest(seed.as_bytes())[..20])
}

fn checkquote(dir: &Path, ak: &Path, nonce: &str) -> Output {
    Command::new("tpm2_checkquote")
        .close_inherited_fds()
        .arg("-u")
        .arg(ak)
        .arg("-m")
        .arg(dir.join("quote.msg"))
        .arg("-s")
        .arg(dir.join("quote.sig"))
        .arg("-f")
        .arg(dir.join("quote.pcrs"))
        .args(["-g", "sha256", "-q", nonce])
        .output()
        .expect("run tpm2_checkquote")
}

#[track_caller]
fn checkquote_accepts(dir: &Path, nonce: &str) {
    let out = checkquote(dir, &dir.join("ak.pub.pem"), nonce);
    assert!(
        out.status.success(),
        "tpm2_checkquote rejected {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[track_caller]
fn checkquote_rejects(dir: &Path, ak: &Path, nonce: &str) {
    let out = checkquote(dir, ak, nonce);
    assert!(!out.status.success(), "tpm2_checkquote accepted {}", dir.display());
}

/// `tpm-vault quote` into `dir` (relative to the daemon's temp dir).
fn quote(d: &Daemon, dir: &str, nonce: &str, extra: &[&str]) -> PathBuf {
    let mut args = vec!["quote", "--nonce", nonce, "--out-dir", dir];
    args.extend_from_slice(extra);
    let text = String::from_utf8(ok(d.cli(&args))).unwrap();
    assert!(text.contains("tpm2_checkquote -u"), "{text}");
    d.dir.path().join(dir)
}

/// Copies a quote directory, to tamper with the copy.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for name in ["quote.msg", "quote.sig", "quote.pcrs", "ak.pub.pem"] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
}

/// The AK a verifier enrolled for the device (`attest key --ak-out`, once).
fn enrolled_ak(d: &Daemon) -> PathBuf {
    let path = d.dir.path().join("enrolled-ak.pem");
    if !path.exists() {
        ok(d.cli(&["attest", "key", "--ak-out", path.to_str().unwrap()]));
    }
    path
}

/// `verify-quote` of `dir`, against the enrolled AK unless `extra` passes another `--ak` or
/// `--allow-unenrolled-ak`.
fn verify_quote(d: &Daemon, dir: &Path, nonce: &str, extra: &[&str]) -> Output {
    let dir = dir.to_str().unwrap();
    let enrolled = enrolled_ak(d);
    let mut args = vec!["verify-quote", "--in-dir", dir, "--nonce", nonce];
    if !extra.iter().any(|a| *a == "--ak" || *a == "--allow-unenrolled-ak") {
        args.extend(["--ak", enrolled.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    d.cli(&args)
}

#[test]
fn fresh_quote_verifies_in_core_and_with_tpm2_checkquote() {
    let d = Daemon::start();
    let nonce = fresh_nonce();
    let dir = quote(&d, "q", &nonce, &[]);
    // Default selection sha256:0-9: 10 PCRs, two TPML_DIGESTs of 8.
    assert_eq!(std::fs::metadata(dir.join("quote.pcrs")).unwrap().len(), 1200);
    let out = String::from_utf8(ok(verify_quote(&d, &dir, &nonce, &[]))).unwrap();
    assert!(out.starts_with("Quote OK\n"), "{out}");
    assert!(out.contains("sha256:0,1,2,3,4,5,6,7,8,9"), "{out}");
    checkquote_accepts(&dir, &nonce);

    // Two PCRs: one TPML_DIGEST.
    let nonce2 = fresh_nonce();
    let dir2 = quote(&d, "q2", &nonce2, &["--pcrs", "sha256:7,9"]);
    assert_eq!(std::fs::metadata(dir2.join("quote.pcrs")).unwrap().len(), 668);
    ok(verify_quote(&d, &dir2, &nonce2, &[]));
    checkquote_accepts(&dir2, &nonce2);

    // The library: quote and verify in-core, the same files.
    let client = BlockingClient::connect(&d.socket).unwrap();
    let nonce3 = hex::decode(fresh_nonce()).unwrap();
    let q = client.quote(&"sha256:0,1,2,3,4,5,6,7,8,9".parse().unwrap(), &nonce3).unwrap();
    let info = q.verify(&nonce3, &[]).unwrap();
    assert_eq!(info.nonce, nonce3);
    assert_eq!(q.pcrs.pcrs, (0..10).collect::<Vec<u32>>());
    assert_eq!(q.ak_public_der, client.attestation_key().unwrap().ak_public_der);
    assert_eq!(q.verify(b"other", &[]).unwrap_err().reason(), "wrong_nonce");

    // JSON output.
    let json: serde_json::Value =
        serde_json::from_slice(&ok(verify_quote(&d, &dir, &nonce, &["--output", "json"]))).unwrap();
    assert_eq!((json["valid"].as_bool(), json["signer_enrolled"].as_bool()), (Some(true), Some(true)));
    assert_eq!(json["pcrs"].as_array().unwrap().len(), 10);
    assert!(out.contains("signer enrolled: yes"), "{out}");
}

/// Without `--ak` a quote is checked only against the `ak.pub.pem` beside it, which whoever
/// wrote the quote also wrote: `verify-quote` says so plainly (text and JSON) and exits 12,
/// unless `--allow-unenrolled-ak`. (It used to print "Quote OK" and exit 0.)
#[test]
fn without_an_enrolled_ak_verify_quote_says_so_and_exits_12() {
    let d = Daemon::start();
    let nonce = fresh_nonce();
    let dir = quote(&d, "q", &nonce, &[]);
    let dir_arg = dir.to_str().unwrap();
    let unenrolled = |extra: &[&str]| {
        let mut args = vec!["verify-quote", "--in-dir", dir_arg, "--nonce", &nonce];
        args.extend_from_slice(extra);
        d.cli(&args)
    };
    let out = unenrolled(&[]);
    let line = fails(&out, 12);
    assert!(line.contains("not against an enrolled AK") && line.contains("--ak FILE"), "{line}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("Quote OK\n"), "{text}");
    assert!(text.contains("signer enrolled: NO (the AK was not checked against an enrolled key)\n"), "{text}");
    let out = unenrolled(&["--output", "json"]);
    assert_eq!(out.status.code(), Some(12));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((json["valid"].as_bool(), json["signer_enrolled"].as_bool()), (Some(true), Some(false)));
    // Accepted on request, still saying so.
    let text = String::from_utf8(ok(unenrolled(&["--allow-unenrolled-ak"]))).unwrap();
    assert!(text.contains("signer enrolled: NO"), "{text}");
    // A rejected quote is exit 1 whatever the AK.
    let line = fails(&unenrolled(&["--allow-unenrolled-ak", "--expect", &format!("sha256:9={}", "11".repeat(32))]), 1);
    assert!(line.starts_with("tpm-vault: quote rejected: PCR sha256:9 is"), "{line}");
}

#[test]
fn tampered_quotes_are_rejected_by_both_verifiers_with_the_reason_named() {
    let d = Daemon::start();
    let nonce = fresh_nonce();
    let dir = quote(&d, "q", &nonce, &[]);
    checkquote_accepts(&dir, &nonce);

    // Wrong nonce.
    let other_nonce = fresh_nonce();
    let line = fails(&verify_quote(&d, &dir, &other_nonce, &[]), 1);
    assert!(line.starts_with("tpm-vault: quote rejected: wrong nonce:"), "{line}");
    checkquote_rejects(&dir, &dir.join("ak.pub.pem"), &other_nonce);

    // A flipped bit in the signed attest (inside the clock info).
    let flipped = d.dir.path().join("flipped");
    copy_dir(&dir, &flipped);
    let mut msg = std::fs::read(flipped.join("quote.msg")).unwrap();
    let len = msg.len();
    msg[len - 60] ^= 0x01;
    std::fs::write(flipped.join("quote.msg"), msg).unwrap();
    let line = fails(&verify_quote(&d, &flipped, &nonce, &[]), 1);
    assert!(line.starts_with("tpm-vault: quote rejected: bad signature"), "{line}");
    checkquote_rejects(&flipped, &flipped.join("ak.pub.pem"), &nonce);

    // A tampered PCR value (first byte of PCR 0's digest in the serialized file).
    let tampered = d.dir.path().join("tampered");
    copy_dir(&dir, &tampered);
    let mut pcrs = std::fs::read(tampered.join("quote.pcrs")).unwrap();
    pcrs[132 + 4 + 4 + 2] ^= 0x80;
    std::fs::write(tampered.join("quote.pcrs"), pcrs).unwrap();
    let line = fails(&verify_quote(&d, &tampered, &nonce, &[]), 1);
    assert!(line.starts_with("tpm-vault: quote rejected: PCR digest mismatch"), "{line}");
    checkquote_rejects(&tampered, &tampered.join("ak.pub.pem"), &nonce);

    // Another AK's public key.
    let other_key = d.dir.path().join("other.key");
    let other_pem = d.dir.path().join("other.pem");
    openssl(&["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"], &other_key);
    let out = Command::new("openssl")
        .close_inherited_fds()
        .args(["pkey", "-pubout", "-in"])
        .arg(&other_key)
        .arg("-out")
        .arg(&other_pem)
        .output()
        .unwrap();
    assert!(out.status.success());
    let line = fails(&verify_quote(&d, &dir, &nonce, &["--ak", other_pem.to_str().unwrap()]), 1);
    assert!(line.starts_with("tpm-vault: quote rejected: bad signature"), "{line}");
    checkquote_rejects(&dir, &other_pem, &nonce);

    // JSON names the reason for programs, and the untouched quote still verifies.
    let out = verify_quote(&d, &tampered, &nonce, &["--output", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["reason"], "pcr_digest_mismatch");
    ok(verify_quote(&d, &dir, &nonce, &[]));

    // A truncated file is malformed, not a panic.
    let truncated = d.dir.path().join("truncated");
    copy_dir(&dir, &truncated);
    std::fs::write(truncated.join("quote.pcrs"), [0u8; 100]).unwrap();
    let line = fails(&verify_quote(&d, &truncated, &nonce, &[]), 1);
    assert!(line.starts_with("tpm-vault: quote rejected: malformed quote: "), "{line}");
}

fn openssl(args: &[&str], out: &Path) {
    let status = Command::new("openssl").close_inherited_fds().args(args).arg(out).output().unwrap();
    assert!(status.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&status.stderr));
}

#[test]
fn pcr9_expectations_pass_and_fail() {
    let d = Daemon::start();
    d.extend_pcr(9, b"kernel-1");
    // A boot loader's extend: new = SHA256(old || SHA256(kernel)), from the all-zero reset value.
    let expected = Sha256::digest([&[0u8; 32][..], &Sha256::digest(b"kernel-1")[..]].concat());
    let expected = hex::encode(expected);

    let read = String::from_utf8(ok(d.cli(&["pcr", "read", "--pcrs", "sha256:9"]))).unwrap();
    assert_eq!(read, format!("  sha256:\n    9 : 0x{}\n", expected.to_uppercase()));
    let json: serde_json::Value = serde_json::from_slice(&ok(d.cli(&["pcr", "read", "--output", "json"]))).unwrap();
    assert_eq!(json["pcrs"].as_array().unwrap().len(), 24);
    assert_eq!(json["pcrs"][9]["value"], expected);

    let nonce = fresh_nonce();
    let dir = quote(&d, "q", &nonce, &[]);
    checkquote_accepts(&dir, &nonce);
    let out =
        String::from_utf8(ok(verify_quote(&d, &dir, &nonce, &["--expect", &format!("sha256:9={expected}")]))).unwrap();
    assert!(out.starts_with("Quote OK"), "{out}");
    // PCR 0 of a fresh swtpm is all zeros: two expectations at once.
    let zeros = "00".repeat(32);
    ok(verify_quote(
        &d,
        &dir,
        &nonce,
        &["--expect", &format!("sha256:9={expected}"), "--expect", &format!("0={zeros}")],
    ));

    let wrong = hex::encode(Sha256::digest(b"some other kernel"));
    let line = fails(&verify_quote(&d, &dir, &nonce, &["--expect", &format!("sha256:9={wrong}")]), 1);
    assert_eq!(line, format!("tpm-vault: quote rejected: PCR sha256:9 is {expected}, expected {wrong}"));
    let line = fails(&verify_quote(&d, &dir, &nonce, &["--expect", &format!("sha256:12={wrong}")]), 1);
    assert_eq!(line, "tpm-vault: quote rejected: PCR sha256:12 is not in the quote");

    // The library says the same.
    let client = BlockingClient::connect(&d.socket).unwrap();
    let q = client.quote(&"sha256:9".parse().unwrap(), b"n").unwrap();
    let expect: PcrBinding = format!("sha256:9={wrong}").parse().unwrap();
    match q.verify(b"n", &[expect]) {
        Err(QuoteError::PcrValueMismatch { pcr: 9, actual, .. }) => assert_eq!(hex::encode(actual), expected),
        other => panic!("expected a PCR 9 mismatch, got {other:?}"),
    }
    assert_eq!(
        client.read_pcrs(Some(&"sha256:9".parse().unwrap())).unwrap().values[0],
        hex::decode(&expected).unwrap()
    );
}

#[test]
fn credential_activation_round_trip_through_the_cli() {
    let d = Daemon::start();
    let text = String::from_utf8(ok(d.cli(&["attest", "key"]))).unwrap();
    assert!(text.contains("ek certificate: none: "), "says clearly there is no EK certificate: {text}");
    assert!(text.contains("ak public key:\n-----BEGIN PUBLIC KEY-----"), "{text}");

    let json: serde_json::Value =
        serde_json::from_slice(&ok(d.cli(&["attest", "key", "--ek-out", "ek.pem", "--output", "json"]))).unwrap();
    let ak_name = json["ak_name"].as_str().unwrap().to_owned();
    assert!(ak_name.starts_with("000b"), "{ak_name}");
    assert_eq!(json["ek_certificate"], serde_json::Value::Null);
    let dir = d.dir.path();
    std::fs::write(dir.join("secret.bin"), b"verifier-chosen credential").unwrap();
    let make = |name: &str, out: &str| {
        let out = Command::new("tpm2_makecredential")
            .close_inherited_fds()
            .current_dir(dir)
            .args(["--tcti", "none", "-G", "rsa", "-u", "ek.pem", "-s", "secret.bin", "-n", name, "-o", out])
            .output()
            .unwrap();
        assert!(out.status.success(), "tpm2_makecredential: {}", String::from_utf8_lossy(&out.stderr));
    };
    make(&ak_name, "cred");
    let secret = ok(d.cli(&["attest", "activate", "--in", "cred"]));
    assert_eq!(secret, b"verifier-chosen credential");
    let json: serde_json::Value =
        serde_json::from_slice(&ok(d.cli(&["attest", "activate", "--in", "cred", "--output", "json"]))).unwrap();
    assert_eq!(json["secret"], hex::encode(b"verifier-chosen credential"));

    // Bound to another name: refused.
    make(&format!("000b{}", "11".repeat(32)), "cred-other");
    let line = fails(&d.cli(&["attest", "activate", "--in", "cred-other"]), 5);
    assert!(line.starts_with("tpm-vault: "), "{line}");
    // Not a credential file: named before anything is sent.
    std::fs::write(dir.join("junk"), b"junk").unwrap();
    let line = fails(&d.cli(&["attest", "activate", "--in", "junk"]), 2);
    assert!(line.contains("credential file"), "{line}");

    // The library, with the parsed file.
    let client = BlockingClient::connect(&d.socket).unwrap();
    let file = tpm_vault_client::attest::CredentialFile::parse(&std::fs::read(dir.join("cred")).unwrap()).unwrap();
    let secret = client.activate_credential(&file.credential_blob, &file.encrypted_secret).unwrap();
    assert_eq!(secret.as_slice(), b"verifier-chosen credential");
}

/// The other direction: files written by tpm2-tools' own `tpm2_quote` (against a second swtpm
/// that tpm2-tools drives directly) are read and checked by `verify-quote`.
#[test]
fn verify_quote_reads_files_written_by_tpm2_quote() {
    let dir = tempfile::tempdir().unwrap();
    let swtpm = tpm_vault_daemon::harness::Swtpm::start(&dir.path().join("swtpm")).unwrap();
    let tcti = swtpm.tcti();
    // No resource manager in front of this swtpm: flush what each tool leaves loaded.
    let tool = |args: &[&str]| {
        let out = Command::new(args[0])
            .close_inherited_fds()
            .current_dir(dir.path())
            .args(&args[1..])
            .args(["-T", &tcti])
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let out = Command::new("tpm2_flushcontext").close_inherited_fds().args(["-t", "-T", &tcti]).output().unwrap();
        assert!(out.status.success(), "flush: {}", String::from_utf8_lossy(&out.stderr));
    };
    tool(&["tpm2_createek", "-c", "ek.ctx", "-G", "rsa", "-u", "ek.pub"]);
    tool(&[
        "tpm2_createak",
        "-C",
        "ek.ctx",
        "-c",
        "ak.ctx",
        "-G",
        "ecc",
        "-g",
        "sha256",
        "-s",
        "ecdsa",
        "-u",
        "ak.pub.pem",
        "-f",
        "pem",
        "-n",
        "ak.name",
    ]);
    let nonce = fresh_nonce();
    let q = dir.path().join("q");
    std::fs::create_dir_all(&q).unwrap();
    std::fs::copy(dir.path().join("ak.pub.pem"), q.join("ak.pub.pem")).unwrap();
    tool(&[
        "tpm2_quote",
        "-c",
        "ak.ctx",
        "-l",
        "sha256:0,1,2,3,4,5,6,7,8,9",
        "-q",
        &nonce,
        "-m",
        "q/quote.msg",
        "-s",
        "q/quote.sig",
        "-o",
        "q/quote.pcrs",
        "-g",
        "sha256",
    ]);
    checkquote_accepts(&q, &nonce);
    let out = support::run_cli(
        Path::new("/nonexistent/vault.sock"),
        // The AK tpm2_createak wrote is the one the verifier enrolled; q/ has a copy.
        &["verify-quote", "--in-dir", "q", "--nonce", &nonce, "--ak", "ak.pub.pem"],
        b"",
        dir.path(),
    );
    let text = String::from_utf8(ok(out)).unwrap();
    assert!(text.starts_with("Quote OK") && text.contains("signer enrolled: yes"), "{text}");
    let out = support::run_cli(
        Path::new("/nonexistent/vault.sock"),
        &["verify-quote", "--in-dir", "q", "--nonce", "00", "--ak", "ak.pub.pem"],
        b"",
        dir.path(),
    );
    assert!(fails(&out, 1).contains("wrong nonce"));
}
