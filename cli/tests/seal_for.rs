//! Secrets sealed for a device from anywhere, end to end on swtpm: `srk public`, `seal-for`
//! run with no daemon, `seal import` and `unseal` on the device (PCR policy holds, then moves),
//! and the refusals that change nothing: a blob for another TPM, a tampered blob, a replay
//! under a name in use, a key that is not a storage key. Interoperability: the vault's blob
//! imports and unseals with tpm2-tools on a swtpm the vault does not run.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::{fails, ok, run_cli, Daemon, DaemonCli as _};
use tpm_vault_daemon::harness::{CloseInheritedFds as _, Swtpm};
use tpm_vault_proto::sealed_blob::SealedBlob;

/// `tpm-vault` with a socket where no daemon listens, in `dir`: what `seal-for` runs on a
/// machine without a daemon or a TPM.
fn offline(dir: &Path, args: &[&str], stdin: &[u8]) -> Output {
    run_cli(&dir.join("no-daemon.sock"), args, stdin, dir)
}

fn pcr9(d: &Daemon) -> String {
    let json: serde_json::Value =
        serde_json::from_slice(&ok(d.cli(&["pcr", "read", "--pcrs", "sha256:9", "--output", "json"]))).unwrap();
    json["pcrs"][0]["value"].as_str().unwrap().to_owned()
}

#[test]
fn sealed_elsewhere_imports_and_unseals_only_while_the_policy_holds() {
    let d = Daemon::start();
    let dir = d.dir.path();
    d.extend_pcr(9, b"kernel-1");
    let pcr = format!("sha256:9={}", pcr9(&d));
    ok(d.cli(&["srk", "public", "--format", "tpm2b", "--out", "srk.pub"]));
    let pem = String::from_utf8(ok(d.cli(&["srk", "public"]))).unwrap();
    assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----"), "{pem}");
    std::fs::write(dir.join("srk.pem"), &pem).unwrap();

    // Small secret: held by the sealed object itself.
    let blob = ok(offline(dir, &["seal-for", "--srk", "srk.pub", "wifi", "--pcr", &pcr], b"psk-123"));
    assert!(blob.starts_with(b"TPMVSFB\0\x01"), "{:?}", &blob[..16]);
    let out = String::from_utf8(ok(d.cli_in(&["seal", "import", "wifi"], &blob))).unwrap();
    assert!(out.starts_with("Imported \"wifi\" bound to sha256:9"), "{out}");
    assert_eq!(ok(d.cli(&["unseal", "wifi"])), b"psk-123");

    // Large secret, SRK given as PEM (the TCG template): AES-256-GCM payload under a sealed key.
    let big = support::data(100_000);
    let blob_big = ok(offline(dir, &["seal-for", "--srk", "srk.pem", "db", "--pcr", &pcr], &big));
    // The payload is bound to the name it was sealed as.
    let line = fails(&d.cli_in(&["seal", "import", "other"], &blob_big), 2);
    assert!(line.contains("sealed as \"db\""), "{line}");
    ok(d.cli_in(&["seal", "import", "db"], &blob_big));
    assert_eq!(ok(d.cli(&["unseal", "db"])), big);

    // A replay under a name in use: ALREADY_EXISTS, the secret unchanged.
    let other = ok(offline(dir, &["seal-for", "--srk", "srk.pub", "wifi", "--pcr", &pcr], b"evil"));
    fails(&d.cli_in(&["seal", "import", "wifi"], &other), 4);
    fails(&d.cli_in(&["seal", "import", "wifi"], &blob), 4);
    assert_eq!(ok(d.cli(&["unseal", "wifi"])), b"psk-123");

    // A tampered blob: the TPM's integrity check refuses it; nothing is stored.
    let mut parsed = SealedBlob::parse(&blob).unwrap();
    let last = parsed.duplicate.len() - 1;
    parsed.duplicate[last] ^= 1;
    let line = fails(&d.cli_in(&["seal", "import", "tampered"], &parsed.to_bytes().unwrap()), 2);
    assert!(line.contains("another TPM") && line.contains("altered"), "{line}");
    fails(&d.cli(&["unseal", "tampered"]), 3);
    // A policy description that is not the object's: refused before the TPM.
    let mut lying = SealedBlob::parse(&blob).unwrap();
    lying.policy =
        tpm_vault_proto::sealed_blob::BlobPolicy::Pcr { bank: 0x000b, pcrs: vec![9], values: vec![vec![7; 32]] };
    let line = fails(&d.cli_in(&["seal", "import", "lying"], &lying.to_bytes().unwrap()), 2);
    assert!(line.contains("does not match"), "{line}");
    // Garbage.
    fails(&d.cli_in(&["seal", "import", "junk"], b"not a blob"), 2);

    // A blob made for another TPM.
    let d2 = Daemon::start();
    ok(d2.cli(&["srk", "public", "--format", "tpm2b", "--out", "srk2.pub"]));
    std::fs::copy(d2.dir.path().join("srk2.pub"), dir.join("srk2.pub")).unwrap();
    let foreign = ok(offline(dir, &["seal-for", "--srk", "srk2.pub", "foreign", "--pcr", &pcr], b"x"));
    let line = fails(&d.cli_in(&["seal", "import", "foreign"], &foreign), 2);
    assert!(line.contains("another TPM"), "{line}");
    fails(&d.cli(&["unseal", "foreign"]), 3);
    // ... which its own TPM takes.
    ok(d2.cli_in(&["seal", "import", "foreign"], &foreign));

    // Bad input to seal-for: a key that is not a storage key, a policy without values.
    let mut signing = std::fs::read(dir.join("srk.pub")).unwrap();
    signing[6..10].copy_from_slice(&0x0005_0072u32.to_be_bytes()); // sign, not decrypt
    std::fs::write(dir.join("signing.pub"), &signing).unwrap();
    let line = fails(&offline(dir, &["seal-for", "--srk", "signing.pub", "x", "--pcr", &pcr], b"s"), 2);
    assert!(line.contains("not a storage key"), "{line}");
    let line = fails(&offline(dir, &["seal-for", "--srk", "srk.pub", "x", "--pcr", "sha256:9"], b"s"), 2);
    assert!(line.contains("values"), "{line}");
    assert_eq!(
        offline(dir, &["seal-for", "--srk", "srk.pub", "x", "--pcr", "sha256:9=abcd"], b"s").status.code(),
        Some(2)
    );

    // PCR 9 moves: neither secret opens, and the error names PCR 9.
    d.extend_pcr(9, b"evil");
    let line = fails(&d.cli(&["unseal", "wifi"]), 6);
    assert!(line.contains("sha256:9"), "{line}");
    fails(&d.cli(&["unseal", "db"]), 6);
}

/// Runs a tpm2-tools command against `tcti` in `dir`.
/// swtpm has 3 object slots and no resource manager: each step flushes what it left loaded.
fn tpm2(dir: &Path, tcti: &str, args: &[&str]) -> Vec<u8> {
    let out = tpm2_raw(dir, tcti, args);
    tpm2_raw(dir, tcti, &["tpm2_flushcontext", "-t"]);
    out
}

fn tpm2_raw(dir: &Path, tcti: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(args[0])
        .close_inherited_fds()
        .current_dir(dir)
        .env("TPM2TOOLS_TCTI", tcti)
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn tpm2b(data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(data);
    out
}

#[test]
fn seal_for_output_imports_and_unseals_with_tpm2_tools() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let swtpm = Swtpm::start(&dir.join("swtpm")).unwrap();
    let tcti = swtpm.tcti();
    // A storage key made by tpm2-tools (its own template), its public area read by tpm2-tools.
    tpm2(dir, &tcti, &["tpm2_createprimary", "-C", "o", "-g", "sha256", "-G", "ecc256:aes128cfb", "-c", "prim.ctx"]);
    tpm2(dir, &tcti, &["tpm2_readpublic", "-c", "prim.ctx", "-o", "prim.pub"]);
    let zero = "0".repeat(64);
    let blob = ok(offline(
        dir,
        &["seal-for", "--srk", "prim.pub", "tools", "--pcr", &format!("sha256:9={zero}")],
        b"opened by tpm2-tools",
    ));
    let blob = SealedBlob::parse(&blob).unwrap();
    std::fs::write(dir.join("obj.pub"), tpm2b(&blob.public)).unwrap();
    std::fs::write(dir.join("obj.dup"), tpm2b(&blob.duplicate)).unwrap();
    std::fs::write(dir.join("obj.seed"), tpm2b(&blob.encrypted_seed)).unwrap();
    tpm2(
        dir,
        &tcti,
        &["tpm2_import", "-C", "prim.ctx", "-u", "obj.pub", "-i", "obj.dup", "-s", "obj.seed", "-r", "obj.priv"],
    );
    tpm2(dir, &tcti, &["tpm2_load", "-C", "prim.ctx", "-u", "obj.pub", "-r", "obj.priv", "-c", "obj.ctx"]);
    tpm2(dir, &tcti, &["tpm2_startauthsession", "--policy-session", "-S", "session.ctx"]);
    tpm2(dir, &tcti, &["tpm2_policypcr", "-S", "session.ctx", "-l", "sha256:9"]);
    let secret = tpm2(dir, &tcti, &["tpm2_unseal", "-p", "session:session.ctx", "-c", "obj.ctx"]);
    tpm2(dir, &tcti, &["tpm2_flushcontext", "-s"]);
    assert_eq!(secret, b"opened by tpm2-tools");
}

#[test]
fn sealed_elsewhere_to_a_policy_authority_opens_with_a_signed_policy() {
    let d = Daemon::start();
    let dir = d.dir.path();
    d.extend_pcr(9, b"kernel-1");
    let pcr = format!("sha256:9={}", pcr9(&d));
    for args in [
        &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "authority.key"][..],
        &["pkey", "-in", "authority.key", "-pubout", "-out", "authority.pem"][..],
    ] {
        let out = Command::new("openssl").close_inherited_fds().current_dir(dir).args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}");
    }
    ok(d.cli(&["srk", "public", "--out", "srk.pem"]));
    let blob =
        ok(offline(dir, &["seal-for", "--srk", "srk.pem", "fleet", "--authorized-by", "authority.pem"], b"s3cret"));
    let out = String::from_utf8(ok(d.cli_in(&["seal", "import", "fleet"], &blob))).unwrap();
    assert!(out.contains("sha256:9"), "{out}");
    // Without an approval: refused; with one signed offline for the current PCR 9: opens.
    fails(&d.cli(&["unseal", "fleet"]), 2);
    ok(offline(
        dir,
        &["policy", "sign", "--key", "authority.key", "--pcr", &pcr, "--version", "1", "--out", "k1.policy"],
        b"",
    ));
    assert_eq!(ok(d.cli(&["unseal", "fleet", "--policy", "k1.policy"])), b"s3cret");
    // A kernel update: approve the new value, no re-seal.
    d.extend_pcr(9, b"kernel-2");
    fails(&d.cli(&["unseal", "fleet", "--policy", "k1.policy"]), 6);
    let pcr2 = format!("sha256:9={}", pcr9(&d));
    ok(offline(
        dir,
        &["policy", "sign", "--key", "authority.key", "--pcr", &pcr2, "--version", "2", "--out", "k2.policy"],
        b"",
    ));
    assert_eq!(ok(d.cli(&["unseal", "fleet", "--policy", "k2.policy"])), b"s3cret");
}

/// A TPM2B at `at` in `b`: (contents, offset after it).
fn take_tpm2b(b: &[u8], at: usize) -> (&[u8], usize) {
    let n = usize::from(u16::from_be_bytes([b[at], b[at + 1]]));
    (&b[at + 2..at + 2 + n], at + 2 + n)
}

#[test]
fn the_ak_certifies_the_srk_over_a_nonce() {
    use p256::ecdsa::signature::Verifier;
    use p256::pkcs8::DecodePublicKey;
    let d = Daemon::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let c = rt.block_on(tpm_vault_client::Client::connect(&d.socket)).unwrap();
    let nonce = b"fleet-nonce-0001";
    let cert = rt.block_on(c.certify_srk(nonce)).unwrap();
    let srk = rt.block_on(c.srk_public()).unwrap();
    assert_eq!(cert.srk_tpm2b_public, srk.tpm2b_public);
    // TPMS_ATTEST: magic, TPM_ST_ATTEST_CERTIFY, signer, extraData = nonce, clock info,
    // firmware, then the certified name = the SRK's name.
    let a = &cert.attest;
    assert_eq!(&a[..6], &[0xff, 0x54, 0x43, 0x47, 0x80, 0x17]);
    let (_, at) = take_tpm2b(a, 6);
    let (extra, at) = take_tpm2b(a, at);
    assert_eq!(extra, nonce);
    let (name, _) = take_tpm2b(a, at + 17 + 8);
    assert_eq!(name, srk.name);
    assert_eq!(name, tpm_vault_proto::policy_digest::name_of(&srk.tpm2b_public[2..]));
    // TPMT_SIGNATURE: ECDSA-SHA256 by the AK over the attest.
    let s = &cert.signature;
    assert_eq!(&s[..4], &[0x00, 0x18, 0x00, 0x0b]);
    let (r, at) = take_tpm2b(s, 4);
    let (sv, _) = take_tpm2b(s, at);
    let pad = |v: &[u8]| {
        let mut out = [0u8; 32];
        out[32 - v.len()..].copy_from_slice(v);
        out
    };
    let sig = p256::ecdsa::Signature::from_scalars(pad(r), pad(sv)).unwrap();
    let ak = p256::ecdsa::VerifyingKey::from_public_key_der(&cert.ak_public_der).unwrap();
    assert!(ak.verify(a, &sig).is_ok());
    let mut altered = a.clone();
    let last = altered.len() - 1;
    altered[last] ^= 1;
    assert!(ak.verify(&altered, &sig).is_err());
}
