//! The device's SRK, authenticated for a fleet, end to end on swtpm: `attest srk` on the device
//! (the AK certifies the SRK over a nonce, TPM2_Certify), `verify-srk` offline (no daemon, no
//! TPM) against the AK enrolled for the device, and `seal-for` with what it wrote. Each forgery
//! is refused with its own message and exit status 1: a wrong nonce, another TPM's SRK put in
//! place of the certified one, an altered signature or attestation, another TPM's AK, a quote
//! passed off as a certification.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::{fails, ok, run_cli, Daemon, DaemonCli as _};
use tpm_vault_client::attest::AkAlg;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

const NONCE: &str = "f1ee70000000000000000000000000a1";

/// `tpm-vault` in `dir` with a socket where no daemon listens.
fn offline(dir: &Path, args: &[&str]) -> Output {
    run_cli(&dir.join("no-daemon.sock"), args, b"", dir)
}

/// A copy of the certification directory `from` as `to` (in the same parent), for tampering.
fn copy(dir: &Path, from: &str, to: &str) {
    support::copy_dir(&dir.join(from), &dir.join(to));
}

fn verify(dir: &Path, in_dir: &str, nonce: &str, ak: &str) -> Output {
    offline(dir, &["verify-srk", "--in-dir", in_dir, "--nonce", nonce, "--ak", ak, "--out", "device.srk"])
}

#[test]
fn a_certified_srk_verifies_offline_and_each_forgery_is_refused() {
    let d = Daemon::start();
    let other = Daemon::start();
    let dir = d.dir.path();
    // Enrolment: the fleet keeps each device's AK.
    ok(d.cli(&["attest", "key", "--ak-out", "ak.pem"]));
    ok(other.cli(&["attest", "key", "--ak-out", "ak.pem"]));
    std::fs::copy(other.dir.path().join("ak.pem"), dir.join("other-ak.pem")).unwrap();

    let text = String::from_utf8(ok(d.cli(&["attest", "srk", "--nonce", NONCE, "--out-dir", "att"]))).unwrap();
    assert!(text.starts_with("Certified the SRK (name 000b"), "{text}");
    for f in ["srk.pub", "srk.pem", "certify.msg", "certify.sig", "ak.pub.pem"] {
        assert!(dir.join("att").join(f).is_file(), "{f} missing");
    }
    let srk = ok(d.cli(&["srk", "public", "--format", "tpm2b"]));
    assert_eq!(std::fs::read(dir.join("att/srk.pub")).unwrap(), srk);
    assert_eq!(std::fs::read(dir.join("att/ak.pub.pem")).unwrap(), std::fs::read(dir.join("ak.pem")).unwrap());
    // tpm2-tools reads the attestation as a TPM2_Certify.
    let printed = Command::new("tpm2_print")
        .close_inherited_fds()
        .args(["-t", "TPMS_ATTEST"])
        .arg(dir.join("att/certify.msg"))
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains("8017") && printed.contains(NONCE), "{printed}");

    // The good path, offline: the SRK written is the device's, and seal-for takes it.
    let report = String::from_utf8(ok(verify(dir, "att", NONCE, "ak.pem"))).unwrap();
    assert!(report.starts_with("SRK certification OK"), "{report}");
    assert_eq!(std::fs::read(dir.join("device.srk")).unwrap(), srk);
    let to_stdout = ok(offline(dir, &["verify-srk", "--in-dir", "att", "--nonce", NONCE, "--ak", "ak.pem"]));
    assert_eq!(to_stdout, srk);
    let pem = ok(offline(
        dir,
        &["verify-srk", "--in-dir", "att", "--nonce", &NONCE.to_uppercase(), "--ak", "ak.pem", "--format", "pem"],
    ));
    assert_eq!(pem, ok(d.cli(&["srk", "public"])));
    let json: serde_json::Value = serde_json::from_slice(&ok(offline(
        dir,
        &["verify-srk", "--in-dir", "att", "--nonce", NONCE, "--ak", "ak.pem", "--output", "json"],
    )))
    .unwrap();
    assert_eq!(json["valid"], true);
    assert_eq!(json["srk_tpm2b_public"], hex::encode(&srk));
    assert_eq!(json["nonce"], NONCE);
    let pcrs: serde_json::Value =
        serde_json::from_slice(&ok(d.cli(&["pcr", "read", "--pcrs", "sha256:9", "--output", "json"]))).unwrap();
    let pcr = format!("sha256:9={}", pcrs["pcrs"][0]["value"].as_str().unwrap());
    let blob =
        run_cli(&dir.join("no-daemon.sock"), &["seal-for", "--srk", "device.srk", "wifi", "--pcr", &pcr], b"psk", dir);
    ok(d.cli_in(&["seal", "import", "wifi"], &ok(blob)));
    assert_eq!(ok(d.cli(&["unseal", "wifi"])), b"psk");

    // Another nonce: a replay.
    let line = fails(&verify(dir, "att", "00", "ak.pem"), 1);
    assert!(line.contains("wrong nonce"), "{line}");
    let json: serde_json::Value = serde_json::from_slice(
        &offline(dir, &["verify-srk", "--in-dir", "att", "--nonce", "00", "--ak", "ak.pem", "--output", "json"]).stdout,
    )
    .unwrap();
    assert_eq!((&json["valid"], &json["reason"]), (&false.into(), &"wrong_nonce".into()));

    // Another TPM's SRK in place of the certified one.
    copy(dir, "att", "swapped");
    std::fs::write(dir.join("swapped/srk.pub"), ok(other.cli(&["srk", "public", "--format", "tpm2b"]))).unwrap();
    let line = fails(&verify(dir, "swapped", NONCE, "ak.pem"), 1);
    assert!(line.contains("not the certified key"), "{line}");

    // An altered signature, an altered attestation.
    copy(dir, "att", "badsig");
    let mut sig = std::fs::read(dir.join("badsig/certify.sig")).unwrap();
    sig[10] ^= 0x40;
    std::fs::write(dir.join("badsig/certify.sig"), sig).unwrap();
    let line = fails(&verify(dir, "badsig", NONCE, "ak.pem"), 1);
    assert!(line.contains("bad signature"), "{line}");
    copy(dir, "att", "badmsg");
    let mut msg = std::fs::read(dir.join("badmsg/certify.msg")).unwrap();
    let last = msg.len() - 1;
    msg[last] ^= 1;
    std::fs::write(dir.join("badmsg/certify.msg"), msg).unwrap();
    let line = fails(&verify(dir, "badmsg", NONCE, "ak.pem"), 1);
    assert!(line.contains("bad signature"), "{line}");

    // Another TPM's AK: neither this certification nor the other TPM's own verifies with it.
    let line = fails(&verify(dir, "att", NONCE, "other-ak.pem"), 1);
    assert!(line.contains("bad signature"), "{line}");
    ok(other.cli(&["attest", "srk", "--nonce", NONCE, "--out-dir", "att"]));
    support::copy_dir(&other.dir.path().join("att"), &dir.join("other-att"));
    let line = fails(&verify(dir, "other-att", NONCE, "ak.pem"), 1);
    assert!(line.contains("bad signature"), "{line}");

    // A quote by the same AK over the same nonce is signed, but is no certification.
    ok(d.cli(&["quote", "--pcrs", "sha256:9", "--nonce", NONCE, "--out-dir", "q"]));
    copy(dir, "att", "quote");
    std::fs::copy(dir.join("q/quote.msg"), dir.join("quote/certify.msg")).unwrap();
    std::fs::copy(dir.join("q/quote.sig"), dir.join("quote/certify.sig")).unwrap();
    let line = fails(&verify(dir, "quote", NONCE, "ak.pem"), 1);
    assert!(line.contains("not a TPM2_Certify"), "{line}");

    // Nothing was written by a refused check, and --ak is required.
    std::fs::remove_file(dir.join("device.srk")).unwrap();
    fails(&verify(dir, "swapped", NONCE, "ak.pem"), 1);
    assert!(!dir.join("device.srk").exists());
    let out = offline(dir, &["verify-srk", "--in-dir", "att", "--nonce", NONCE]);
    assert_eq!(out.status.code(), Some(2));
}

/// `scripts/fleet-seal` over `devices` with `secrets` and `policy`: (exit status, stdout, stderr).
fn fleet_seal(fleet: &Path, policy: &[&str]) -> (Option<i32>, String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fleet-seal");
    let out = Command::new(script)
        .close_inherited_fds()
        .current_dir(fleet)
        .env("TPM_VAULT", env!("CARGO_BIN_EXE_tpm-vault"))
        .env("TPM_VAULT_SOCKET", fleet.join("no-daemon.sock"))
        .args(["devices", "secrets"])
        .args(policy)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn the_fleet_script_seals_only_for_devices_whose_srk_verifies() {
    let devices = [Daemon::start(), Daemon::start(), Daemon::start()];
    let fleet = tempfile::tempdir().unwrap();
    let fleet = fleet.path();
    std::fs::create_dir_all(fleet.join("secrets")).unwrap();
    std::fs::write(fleet.join("secrets/wifi"), b"psk-for-the-fleet").unwrap();
    let big = support::data(10_000);
    std::fs::write(fleet.join("secrets/db"), &big).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for (i, d) in devices.iter().enumerate() {
        let dev = fleet.join(format!("devices/dev{i}"));
        std::fs::create_dir_all(&dev).unwrap();
        let nonce = format!("{:032x}", 0xf1ee7_u128 + i as u128);
        std::fs::write(dev.join("nonce"), format!("{nonce}\n")).unwrap();
        if i == 1 {
            // Enrolled by the fleet itself: the ECC AK.
            ok(d.cli(&["attest", "key", "--ak-out", "ak.pem"]));
            std::fs::copy(d.dir.path().join("ak.pem"), dev.join("ak.pem")).unwrap();
            ok(d.cli(&["attest", "srk", "--nonce", &nonce, "--out-dir", "srk-cert"]));
        } else {
            // Enrolled through Keylime: the registrar holds the RSA AK the agent registers, as
            // a TPM2B_PUBLIC (`aik_tpm`); tpm2-tools turns it into the PEM verify-srk takes.
            let client = rt.block_on(tpm_vault_client::Client::connect(&d.socket)).unwrap();
            let ak = rt.block_on(client.attestation_key_of(AkAlg::Rsa2048)).unwrap();
            std::fs::write(dev.join("ak.tpm2b"), &ak.ak_tpm2b_public).unwrap();
            let pem = Command::new("tpm2_print")
                .close_inherited_fds()
                .args(["-t", "TPM2B_PUBLIC", "-f", "pem"])
                .arg(dev.join("ak.tpm2b"))
                .output()
                .unwrap();
            assert!(pem.status.success(), "tpm2_print: {}", String::from_utf8_lossy(&pem.stderr));
            assert!(String::from_utf8_lossy(&pem.stdout).starts_with("-----BEGIN PUBLIC KEY-----"));
            std::fs::write(dev.join("ak.pem"), &pem.stdout).unwrap();
            ok(d.cli(&["attest", "srk", "--ak-alg", "rsa-2048", "--nonce", &nonce, "--out-dir", "srk-cert"]));
        }
        support::copy_dir(&d.dir.path().join("srk-cert"), &dev.join("srk-cert"));
    }
    // dev1's ECC AK does not verify dev0's RSA-signed certification, nor the reverse.
    let cross = |cert: &str, ak: &str| {
        let nonce = std::fs::read_to_string(fleet.join(format!("devices/{cert}/nonce"))).unwrap();
        let certs = format!("devices/{cert}/srk-cert");
        let ak = format!("devices/{ak}/ak.pem");
        run_cli(
            &fleet.join("none.sock"),
            &["verify-srk", "--in-dir", &certs, "--nonce", nonce.trim(), "--ak", &ak],
            b"",
            fleet,
        )
    };
    assert!(fails(&cross("dev0", "dev1"), 1).contains("unsupported signature"));
    assert!(fails(&cross("dev1", "dev0"), 1).contains("unsupported signature"));
    ok(cross("dev0", "dev0"));
    // An RSA signature altered.
    support::copy_dir(&fleet.join("devices/dev0"), &fleet.join("devices/dev0x"));
    let mut sig = std::fs::read(fleet.join("devices/dev0x/srk-cert/certify.sig")).unwrap();
    sig[100] ^= 1;
    std::fs::write(fleet.join("devices/dev0x/srk-cert/certify.sig"), sig).unwrap();
    assert!(fails(&cross("dev0x", "dev0"), 1).contains("bad signature"));
    std::fs::remove_dir_all(fleet.join("devices/dev0x")).unwrap();
    // dev2's files were swapped for dev0's SRK on the way: its certification fails.
    std::fs::copy(fleet.join("devices/dev0/srk-cert/srk.pub"), fleet.join("devices/dev2/srk-cert/srk.pub")).unwrap();

    let pcr = format!("sha256:9={}", "00".repeat(32));
    let (code, stdout, stderr) = fleet_seal(fleet, &["--pcr", &pcr]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert_eq!(stdout, "dev0: 2 blobs\ndev1: 2 blobs\n", "{stderr}");
    assert!(stderr.contains("dev2: SRK not verified") && stderr.contains("not the certified key"), "{stderr}");
    assert!(!fleet.join("devices/dev2/blobs").exists() && !fleet.join("devices/dev2/srk.pub").exists());

    // Delivered, each device imports its own blobs and opens them; not another's.
    for (i, d) in devices.iter().take(2).enumerate() {
        let blobs = fleet.join(format!("devices/dev{i}/blobs"));
        ok(d.cli_in(&["seal", "import", "wifi"], &std::fs::read(blobs.join("wifi.blob")).unwrap()));
        ok(d.cli_in(&["seal", "import", "db"], &std::fs::read(blobs.join("db.blob")).unwrap()));
        assert_eq!(ok(d.cli(&["unseal", "wifi"])), b"psk-for-the-fleet");
        assert_eq!(ok(d.cli(&["unseal", "db"])), big);
    }
    let line = fails(
        &devices[1].cli_in(
            &["seal", "import", "foreign"],
            &std::fs::read(fleet.join("devices/dev0/blobs/wifi.blob")).unwrap(),
        ),
        2,
    );
    assert!(line.contains("another TPM"), "{line}");
}
