//! The daemon's access policy seen through the module: uid 65534 (nobody) may only read the
//! public part of key `seen` and nothing of key `hidden`. As nobody, `pkcs11-tool` lists `seen`
//! and not `hidden`, signing with `seen` fails with CKR_FUNCTION_REJECTED, and the daemon's
//! audit log records the denied `sign`.

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::process::Command;
use std::time::Duration;

use support::{describe, run, run_ok, stdout, Daemon, NOBODY};

fn policy() -> String {
    format!(
        "[[rule]]\nname = \"root\"\nclients = [\"uid:0\", \"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n\n\
         [[rule]]\nname = \"nobody-public\"\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"seen\"]\noperations = [\"public\"]\n",
        nix::unistd::getuid().as_raw()
    )
}

/// `pkcs11-tool --module COPY` running as nobody ([`Daemon::open_to_nobody`]'s module copy).
fn pkcs11_tool_as_nobody(d: &Daemon) -> Command {
    let mut cmd = Command::new("pkcs11-tool");
    d.module_env(&mut cmd)
        .env("HOME", d.path())
        .uid(NOBODY)
        .gid(NOBODY)
        .arg("--module")
        .arg(d.path().join("libtpm_vault_pkcs11.so"));
    cmd
}

#[test]
fn nobody_sees_only_its_key_and_its_denied_sign_is_rejected_and_audited() {
    let d = Daemon::start_with(&policy(), true);
    d.create_key("seen", "ecc-p256");
    d.create_key("hidden", "ecc-p256");
    d.open_to_nobody();
    let data = d.path().join("data.bin");
    std::fs::write(&data, b"data to sign\n").expect("data");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o644)).expect("chmod data");

    // Root sees both keys (so "not listed" below is the policy, not a listing bug).
    let root = stdout(&run_ok(d.pkcs11_tool().arg("--list-objects")));
    assert!(root.contains("label:      seen") && root.contains("label:      hidden"), "root's listing:\n{root}");

    let out = run_ok(pkcs11_tool_as_nobody(&d).arg("--list-objects"));
    let text = stdout(&out);
    assert!(text.contains("label:      seen"), "nobody does not see key seen:\n{}", describe(&out));
    assert!(!text.contains("hidden"), "nobody sees key hidden:\n{text}");

    let out = run(pkcs11_tool_as_nobody(&d)
        .args(["--sign", "--label", "seen", "-m", "ECDSA-SHA256", "--input-file"])
        .arg(&data));
    assert!(!out.status.success(), "nobody signed with seen: {}", describe(&out));
    // pkcs11-tool 0.23 has no name for CKR_FUNCTION_REJECTED (0x200): it prints
    // "rv = unknown PKCS11 error (0x200)".
    let all = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(
        all.contains("CKR_FUNCTION_REJECTED") || all.contains("(0x200)"),
        "the refusal is not CKR_FUNCTION_REJECTED (0x200): {}",
        describe(&out)
    );

    // One compact JSON object per line (serde_json, no spaces): match its fields as substrings.
    let audit = d.audit_log.clone().expect("audit log path");
    let wanted = ["\"op\":\"sign\"", "\"decision\":\"deny\"", &format!("\"uid\":{NOBODY},"), "\"key\":\"seen\""];
    let denied = |text: &str| text.lines().any(|l| wanted.iter().all(|w| l.contains(w)));
    let deadline = std::time::Instant::now() + support::TIMEOUT;
    while !denied(&std::fs::read_to_string(&audit).unwrap_or_default()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&audit).unwrap_or_default();
    assert!(denied(&text), "no denied sign of seen by uid {NOBODY} in the audit log:\n{text}");
}
