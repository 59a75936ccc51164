//! Sealing to PCR 9 and access checks end to end, through the `tpm-vault` binary and the
//! library, against the real daemon over its own swtpm: seal/unseal round trips, a secret that
//! stops opening when PCR 9 moves, sealing to a future value, and signed policies (an offline
//! openssl key with `policy sign --key`, and a vault key with `--vault-key`) that carry a
//! secret across a "kernel update" without re-sealing.

mod support;

use std::path::Path;
use std::process::Command;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use sha2::{Digest, Sha256};
use support::{fails, ok, Daemon, DaemonCli as _};
use tpm_vault_client::{
    AccessDecision, BlockingClient, Code, Operation, PcrBinding, PolicyApproval, PolicyAuthority, SealOptions,
};

/// PCR 9 after extending `current` with SHA-256(`kernel`).
fn extended(current: &[u8], kernel: &[u8]) -> Vec<u8> {
    Sha256::digest([current, &Sha256::digest(kernel)[..]].concat()).to_vec()
}

/// PCR 9's current value, through `pcr read --output json`.
fn pcr9(d: &Daemon) -> String {
    let json: serde_json::Value =
        serde_json::from_slice(&ok(d.cli(&["pcr", "read", "--pcrs", "sha256:9", "--output", "json"]))).unwrap();
    json["pcrs"][0]["value"].as_str().unwrap().to_owned()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// An openssl P-256 key pair in `dir`: (private PKCS#8 PEM, public SPKI PEM).
fn openssl_authority(dir: &Path, name: &str) -> (String, String) {
    let key = format!("{name}.key");
    let public = format!("{name}.pem");
    run(Command::new("openssl").close_inherited_fds().current_dir(dir).args([
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        &key,
    ]));
    run(Command::new("openssl")
        .close_inherited_fds()
        .current_dir(dir)
        .args(["pkey", "-in", &key, "-pubout", "-out", &public]));
    (key, public)
}

#[test]
fn seal_unseal_round_trip_and_pcr9_binding() {
    let d = Daemon::start();
    d.extend_pcr(9, b"kernel-1");
    let out = String::from_utf8(ok(d.cli_in(&["seal", "disk"], b"hunter2"))).unwrap();
    assert!(out.starts_with("Sealed \"disk\" to sha256:9 (policy digest "), "{out}");
    assert_eq!(ok(d.cli(&["unseal", "disk"])), b"hunter2");

    // Taken without --overwrite, replaced with it.
    let line = fails(&d.cli_in(&["seal", "disk"], b"other"), 4);
    assert!(line.starts_with("tpm-vault: "), "{line}");
    ok(d.cli_in(&["seal", "disk", "--overwrite"], b"hunter3"));
    assert_eq!(ok(d.cli(&["unseal", "disk"])), b"hunter3");

    // A binary secret larger than one gRPC default message, through files.
    let big: Vec<u8> = (0..5 * 1024 * 1024 + 3).map(|i: usize| (i.wrapping_mul(131) % 251) as u8).collect();
    std::fs::write(d.dir.path().join("big.bin"), &big).unwrap();
    ok(d.cli(&["seal", "big", "--in", "big.bin", "--pcr", "sha256:9"]));
    ok(d.cli(&["unseal", "big", "--out", "big.out"]));
    assert!(std::fs::read(d.dir.path().join("big.out")).unwrap() == big);

    // JSON.
    let json: serde_json::Value =
        serde_json::from_slice(&ok(d.cli_in(&["seal", "j", "--output", "json"], b"x"))).unwrap();
    assert_eq!(json["pcrs"], "sha256:9");
    assert_eq!(json["policy_digest"].as_str().unwrap().len(), 64);
    let json: serde_json::Value = serde_json::from_slice(&ok(d.cli(&["unseal", "j", "--output", "json"]))).unwrap();
    assert_eq!(json["secret"], hex::encode(b"x"));

    // PCR 9 moves: the secret no longer opens, and the error names PCR 9.
    d.extend_pcr(9, b"evil");
    let line = fails(&d.cli(&["unseal", "disk"]), 6);
    assert!(line.contains("sha256:9"), "{line}");

    // Delete.
    let out = String::from_utf8(ok(d.cli(&["seal", "disk", "--delete"]))).unwrap();
    assert_eq!(out, "Deleted sealed secret \"disk\"\n");
    fails(&d.cli(&["unseal", "disk"]), 3);
    fails(&d.cli(&["seal", "disk", "--delete"]), 3);

    // The library.
    let client = BlockingClient::connect(&d.socket).unwrap();
    let info = client.seal("lib", b"library secret", &SealOptions::new()).unwrap();
    assert_eq!(info.pcrs, "sha256:9");
    assert_eq!(client.unseal("lib", None).unwrap().as_slice(), b"library secret");
    let err = client.seal("lib", b"again", &SealOptions::new()).unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    client.delete_sealed("lib").unwrap();
    assert_eq!(client.unseal("lib", None).unwrap_err().code(), Code::NotFound);
}

#[test]
fn sealed_to_a_future_pcr9_value_opens_after_the_extend() {
    let d = Daemon::start();
    let now = hex::decode(pcr9(&d)).unwrap();
    let next = hex::encode(extended(&now, b"kernel-2"));
    ok(d.cli_in(&["seal", "future", "--pcr", &format!("sha256:9={next}")], b"for the next boot"));
    fails(&d.cli(&["unseal", "future"]), 6);
    d.extend_pcr(9, b"kernel-2");
    assert_eq!(pcr9(&d), next);
    assert_eq!(ok(d.cli(&["unseal", "future"])), b"for the next boot");
}

#[test]
fn signed_policies_carry_a_secret_across_a_kernel_update() {
    let d = Daemon::start();
    let dir = d.dir.path();
    let (key, public) = openssl_authority(dir, "authority");
    d.extend_pcr(9, b"kernel-A");
    let a = pcr9(&d);

    let out = String::from_utf8(ok(d.cli_in(&["seal", "fleet", "--authorized-by", &public], b"fleet secret"))).unwrap();
    assert!(out.contains("approved by the policy authority"), "{out}");
    // Without an approval: refused, naming why.
    let line = fails(&d.cli(&["unseal", "fleet"]), 2);
    assert!(line.starts_with("tpm-vault: "), "{line}");

    // The authority approves kernel A, offline.
    let approve = |value: &str, version: &str, out: &str| {
        let text = String::from_utf8(ok(d.cli(&[
            "policy",
            "sign",
            "--key",
            &key,
            "--pcr",
            &format!("sha256:9={value}"),
            "--version",
            version,
            "--out",
            out,
        ])))
        .unwrap();
        assert!(text.starts_with("Approved sha256:9 (policy digest "), "{text}");
    };
    approve(&a, "1", "a.policy");
    assert_eq!(ok(d.cli(&["unseal", "fleet", "--policy", "a.policy"])), b"fleet secret");

    // Kernel update: PCR 9 = C. The old approval no longer opens it, a new one does.
    d.extend_pcr(9, b"kernel-C");
    let c = pcr9(&d);
    assert_eq!(c, hex::encode(extended(&hex::decode(&a).unwrap(), b"kernel-C")));
    let line = fails(&d.cli(&["unseal", "fleet", "--policy", "a.policy"]), 6);
    assert!(line.contains("sha256:9"), "{line}");
    approve(&c, "2", "c.policy");
    assert_eq!(ok(d.cli(&["unseal", "fleet", "--policy", "c.policy"])), b"fleet secret");

    // Revoked: an older version for C, after version 2 was used.
    approve(&c, "1", "c-old.policy");
    let line = fails(&d.cli(&["unseal", "fleet", "--policy", "c-old.policy"]), 5);
    assert!(line.contains("revoked"), "{line}");

    // Another authority's approval for C: refused.
    let (other_key, _) = openssl_authority(dir, "other");
    ok(d.cli(&[
        "policy",
        "sign",
        "--key",
        &other_key,
        "--pcr",
        &format!("sha256:9={c}"),
        "--version",
        "3",
        "--out",
        "forged.policy",
    ]));
    fails(&d.cli(&["unseal", "fleet", "--policy", "forged.policy"]), 5);

    // A SEC1 key works too, and the library's offline signer produces what the CLI does.
    run(Command::new("openssl").close_inherited_fds().current_dir(dir).args([
        "ec",
        "-in",
        &key,
        "-out",
        "authority.sec1",
    ]));
    let pem = std::fs::read_to_string(dir.join("authority.sec1")).unwrap();
    assert!(pem.contains("BEGIN EC PRIVATE KEY"), "{pem}");
    let authority = PolicyAuthority::from_pem(&pem).unwrap();
    let approval =
        PolicyApproval::new(&format!("sha256:9={c}").parse::<PcrBinding>().unwrap()).unwrap().with_version(4);
    let policy = authority.sign(&approval);
    let client = BlockingClient::connect(&d.socket).unwrap();
    assert_eq!(client.unseal("fleet", Some(&policy.to_bytes())).unwrap().as_slice(), b"fleet secret");
    assert_eq!(std::fs::read_to_string(dir.join(&public)).unwrap(), authority.public_key_pem());

    // JSON of policy sign.
    let json: serde_json::Value = serde_json::from_slice(&ok(d.cli(&[
        "policy",
        "sign",
        "--key",
        &key,
        "--pcr",
        &format!("sha256:9={c}"),
        "--out",
        "j.policy",
        "--output",
        "json",
    ])))
    .unwrap();
    assert_eq!(json["pcrs"][0]["value"], c);
    assert_eq!(json["approved_policy"].as_str().unwrap().len(), 64);
}

#[test]
fn a_vault_key_signs_policies_through_the_daemon() {
    let d = Daemon::start();
    ok(d.cli(&["key", "create", "authority", "--usage", "policy"]));
    std::fs::write(d.dir.path().join("authority.pem"), ok(d.cli(&["key", "public", "authority"]))).unwrap();
    // Key usages: a `sign` key approves no policy, the `policy` key signs nothing raw.
    ok(d.cli(&["key", "create", "web"]));
    let zero = format!("sha256:9={}", "00".repeat(32));
    let refused = d.cli(&["policy", "sign", "--vault-key", "web", "--pcr", &zero, "--out", "web.policy"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("needs usage policy"), "{refused:?}");
    std::fs::write(d.dir.path().join("m"), b"m").unwrap();
    let refused = d.cli(&["sign", "authority", "--in", "m", "--out", "m.sig"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("needs usage sign"), "{refused:?}");
    d.extend_pcr(9, b"kernel-A");
    ok(d.cli_in(&["seal", "device", "--authorized-by", "authority.pem"], b"device secret"));
    d.extend_pcr(9, b"kernel-B");
    let b = pcr9(&d);
    let text = String::from_utf8(ok(d.cli(&[
        "policy",
        "sign",
        "--vault-key",
        "authority",
        "--pcr",
        &format!("sha256:9={b}"),
        "--version",
        "1",
        "--out",
        "b.policy",
    ])))
    .unwrap();
    assert!(text.starts_with("Approved sha256:9 (policy digest "), "{text}");
    // The library: SignPolicy with the vault key, the same approval.
    let client = BlockingClient::connect(&d.socket).unwrap();
    let approval = PolicyApproval::new(&format!("sha256:9={b}").parse().unwrap()).unwrap().with_version(2);
    let policy = client.sign_policy("authority", &approval).unwrap();
    assert_eq!(policy.approved_policy(), approval.policy_digest());
    assert_eq!(policy.pcrs().selection(), "sha256:9");
    // Signing without values, or with neither authority, is a usage error.
    let out = d.cli(&["policy", "sign", "--vault-key", "authority", "--pcr", "sha256:9", "--out", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let out = d.cli(&["policy", "sign", "--pcr", &format!("sha256:9={b}"), "--out", "x"]);
    assert_eq!(out.status.code(), Some(2));
    // Daemon limitation (see the ignored test below): an authorized unseal fails with
    // RESOURCE_EXHAUSTED while any vault key is loaded, so let the authority key go first. The
    // secret recorded the authority's public key at seal time; the approvals stay valid.
    ok(d.cli(&["key", "delete", "authority"]));
    assert_eq!(ok(d.cli(&["unseal", "device", "--policy", "b.policy"])), b"device secret");
    assert_eq!(client.unseal("device", Some(&policy.to_bytes())).unwrap().as_slice(), b"device secret");
}

/// Regression test for a (fixed) daemon bug: `run_policy` (daemon/src/tpm/actor.rs) loaded the policy
/// authority with TPM2_LoadExternal without making room in the key LRU first (nor evicting and
/// retrying on TPM_RC_OBJECT_MEMORY as `load` does), so with SRK + one vault key + the sealed
/// object, a 3-slot TPM (swtpm, many fTPMs) has no slot left: RESOURCE_EXHAUSTED.
#[test]
fn authorized_unseal_works_while_a_vault_key_is_loaded() {
    let d = Daemon::start();
    let (key, public) = openssl_authority(d.dir.path(), "authority");
    ok(d.cli_in(&["seal", "s", "--authorized-by", &public], b"secret"));
    let now = pcr9(&d);
    ok(d.cli(&["policy", "sign", "--key", &key, "--pcr", &format!("sha256:9={now}"), "--out", "p"]));
    ok(d.cli(&["key", "create", "busy"]));
    ok(d.cli_in(&["sign", "busy", "--in", "-", "--out", "sig"], b"m"));
    assert_eq!(ok(d.cli(&["unseal", "s", "--policy", "p"])), b"secret");
}

#[test]
fn access_check_reports_the_decision_and_the_rule() {
    let d = Daemon::start();
    let uid = nix::unistd::getuid().as_raw().to_string();
    let out =
        String::from_utf8(ok(d.cli(&["access", "check", "--uid", &uid, "--op", "sign", "--key", "web-1"]))).unwrap();
    assert!(out.starts_with(&format!("allow: uid {uid}")), "{out}");
    assert!(out.trim_end().ends_with("may sign on key \"web-1\" (rule \"test-self\")"), "{out}");

    let denied = d.cli(&["access", "check", "--uid", "4242", "--op", "delete", "--key", "web-1"]);
    assert_eq!(denied.status.code(), Some(5));
    assert!(denied.stderr.is_empty(), "{}", String::from_utf8_lossy(&denied.stderr));
    let out = String::from_utf8(denied.stdout).unwrap();
    assert!(out.starts_with("deny: uid 4242"), "{out}");
    assert!(out.trim_end().ends_with("may not delete on key \"web-1\" (no rule allows it)"), "{out}");

    let json = d.cli(&["access", "check", "--uid", "4242", "--op", "quote", "--output", "json"]);
    assert_eq!(json.status.code(), Some(5));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["allowed"], false);
    assert_eq!(json["operation"], "quote");
    assert_eq!(json["rule"], serde_json::Value::Null);

    fails(&d.cli(&["access", "check", "--uid", &uid, "--op", "sign", "--key", "Bad/Name"]), 2);

    let client = BlockingClient::connect(&d.socket).unwrap();
    let check = client.check_access(nix::unistd::getuid().as_raw(), Operation::Quote, None).unwrap();
    assert_eq!(check.decision, AccessDecision::Allow { rule: "test-self".into() });
    assert!(!client.check_access(4242, Operation::Admin, None).unwrap().is_allowed());
}
