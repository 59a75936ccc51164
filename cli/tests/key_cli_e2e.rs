//! The key commands of the `tpm-vault` binary against the real daemon over its own swtpm: the
//! README tour verified by `openssl dgst` for every algorithm and scheme, key passwords, and
//! the exit status and one-line stderr of every error the key API can produce (SPEC section 4).

mod support;

use std::path::Path;
use std::process::{Command, Output};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use support::{fails, ok, run_cli, Daemon, DaemonCli as _};

/// `openssl ARGS...` in `dir`.
fn openssl(dir: &Path, args: &[&str]) -> Output {
    Command::new("openssl")
        .close_inherited_fds()
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (is it installed?)")
}

/// The README tour: create, sign, export, `openssl dgst -verify`, `tpm-vault verify`.
fn tour(d: &Daemon, name: &str, create: &[&str], sign: &[&str], dgst: &[&str]) {
    let dir = d.dir.path();
    let sig = format!("{name}.sig");
    let pem = format!("{name}.pem");
    ok(d.cli(&[&["key", "create", name][..], create].concat()));
    let out = ok(d.cli(&[&["sign", name, "--in", "f", "--out", &sig][..], sign].concat()));
    assert!(out.is_empty(), "sign prints nothing in text mode");
    std::fs::write(dir.join(&pem), ok(d.cli(&["key", "public", name]))).unwrap();
    let verified = openssl(dir, &[&["dgst"][..], dgst, &["-verify", &pem, "-signature", &sig, "f"]].concat());
    assert_eq!(
        String::from_utf8_lossy(&verified.stdout),
        "Verified OK\n",
        "{name}: openssl stderr: {}",
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(verified.status.success());
    let out = ok(d.cli(&[&["verify", name, "--in", "f", "--sig", &sig][..], sign].concat()));
    assert_eq!(out, b"Verified OK\n");
}

#[test]
fn readme_tour_verifies_with_openssl() {
    let d = Daemon::start();
    std::fs::write(d.dir.path().join("f"), "hello\n").unwrap();
    // Exactly the README's commands.
    tour(&d, "web", &[], &[], &["-sha256"]);
    tour(&d, "web384", &["--alg", "ecc-p384"], &[], &["-sha384"]);
    tour(
        &d,
        "rsa-pss",
        &["--alg", "rsa-2048"],
        &["--scheme", "pss"],
        &["-sha256", "-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:32"],
    );
    tour(&d, "rsa-pkcs1", &["--alg", "rsa-2048"], &["--scheme", "pkcs1"], &["-sha256"]);

    // A signature over other data fails both checks.
    std::fs::write(d.dir.path().join("g"), "hello!\n").unwrap();
    let out = d.cli(&["verify", "web", "--in", "g", "--sig", "web.sig"]);
    assert_eq!(fails(&out, 1), "Verification failure");
    let openssl_out = openssl(d.dir.path(), &["dgst", "-sha256", "-verify", "web.pem", "-signature", "web.sig", "g"]);
    assert!(!openssl_out.status.success());

    // The rest of the tour.
    let list = String::from_utf8(ok(d.cli(&["key", "list"]))).unwrap();
    for name in ["web", "web384", "rsa-pss", "rsa-pkcs1"] {
        assert!(list.lines().any(|l| l.starts_with(name)), "{name} listed: {list}");
    }
    let show: serde_json::Value =
        serde_json::from_slice(&ok(d.cli(&["--output", "json", "key", "show", "web"]))).unwrap();
    assert_eq!(show["algorithm"], "ecc-p256");
    assert!(String::from_utf8(ok(d.cli(&["status"]))).unwrap().contains("simulator:"));
}

/// `tpm-vault status` names the software TPM and the rules in force; with no rule in force the
/// refusal says plainly that every request is denied.
#[test]
fn status_shows_the_software_tpm_and_the_rules_in_force() {
    let d = Daemon::start();
    let status = String::from_utf8(ok(d.cli(&["status"]))).unwrap();
    for row in [
        "software tpm:    YES: the daemon's own swtpm (--simulator); TCTI swtpm: (swtpm's TCP protocol); \
         the TPM reports manufacturer IBM and vendor \"SW   TPM\" (swtpm/libtpms). Keys are NOT hardware-protected\n",
        "tpm:             IBM \"SW   TPM\" (firmware ",
        "tpm reconnects:  0\n",
        "policy:          1 rule(s) from fixed policy (embedded)\n",
    ] {
        assert!(status.contains(row), "{row:?} in\n{status}");
    }
    let json: serde_json::Value = serde_json::from_slice(&ok(d.cli(&["--output", "json", "status"]))).unwrap();
    assert_eq!(
        (&json["software_tpm"], &json["policy_rules"], &json["tpm_vendor"]),
        (&true.into(), &1.into(), &"SW   TPM".into())
    );
    drop(d);
    let none = Daemon::start_with_policy("# no rules\n");
    let line = fails(&none.cli(&["status"]), 5);
    assert!(line.ends_with("by the access policy: no access rules are in force, so every request is denied"), "{line}");
}

#[test]
fn key_passwords_from_env_and_file() {
    let d = Daemon::start();
    let dir = d.dir.path();
    std::fs::write(dir.join("f"), "to be signed\n").unwrap();
    std::fs::write(dir.join("pw"), "s3cret\n").unwrap();
    std::fs::write(dir.join("wrong"), "s3cres\n").unwrap();
    let show = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&ok(d.cli(&["--output", "json", "key", "show", name]))).unwrap()
    };

    // From a file (its final newline dropped).
    ok(d.cli(&["key", "create", "guarded", "--auth-file", "pw"]));
    assert_eq!(show("guarded")["has_auth"], true);
    let line = fails(&d.cli(&["sign", "guarded", "--in", "f", "--out", "s"]), 5);
    assert_eq!(line, "tpm-vault: key guarded needs its password");
    let line = fails(&d.cli(&["sign", "guarded", "--in", "f", "--out", "s", "--auth-file", "wrong"]), 10);
    assert_eq!(line, "tpm-vault: wrong key password");
    ok(d.cli(&["sign", "guarded", "--in", "f", "--out", "s", "--auth-file", "pw"]));
    std::fs::write(dir.join("guarded.pem"), ok(d.cli(&["key", "public", "guarded"]))).unwrap();
    let v = openssl(dir, &["dgst", "-sha256", "-verify", "guarded.pem", "-signature", "s", "f"]);
    assert_eq!(String::from_utf8_lossy(&v.stdout), "Verified OK\n");
    // The password on stdin.
    ok(d.cli_in(&["sign", "guarded", "--in", "f", "--out", "s2", "--auth-file", "-"], b"s3cret"));
    let line = fails(&d.cli_in(&["sign", "guarded", "--in", "-", "--out", "s", "--auth-file", "-"], b"x"), 2);
    assert_eq!(line, "tpm-vault: --in and --auth-file cannot both be read from standard input");

    // From TPM_VAULT_KEY_AUTH with --auth.
    let with_env = |args: &[&str], password: &str| -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tpm-vault"));
        cmd.close_inherited_fds();
        cmd.arg("--socket").arg(&d.socket).args(args).current_dir(dir).env("TPM_VAULT_KEY_AUTH", password);
        cmd.output().unwrap()
    };
    ok(with_env(&["key", "create", "env-key", "--auth"], "from-env"));
    assert_eq!(show("env-key")["has_auth"], true);
    ok(with_env(&["sign", "env-key", "--in", "f", "--out", "s3", "--auth"], "from-env"));
    assert_eq!(
        fails(&with_env(&["sign", "env-key", "--in", "f", "--out", "s3", "--auth"], "nope"), 10),
        "tpm-vault: wrong key password"
    );
    // Set but not asked for: a key without password is created.
    ok(with_env(&["key", "create", "plain"], "ignored"));
    assert_eq!(show("plain")["has_auth"], false);
    let line = fails(&d.cli(&["key", "create", "k", "--auth"]), 2);
    assert_eq!(line, "tpm-vault: --auth: the TPM_VAULT_KEY_AUTH environment variable is not set or empty");

    // Bad passwords and combinations are refused before anything is created.
    std::fs::write(dir.join("long"), "x".repeat(33)).unwrap();
    let line = fails(&d.cli(&["key", "create", "k", "--auth-file", "long"]), 2);
    assert_eq!(line, "tpm-vault: --auth-file long: the key password has 33 bytes; at most 32 are allowed");
    let line = fails(&d.cli(&["key", "create", "k", "--auth-file", "pw", "--pcr", "sha256:9"]), 2);
    assert!(line.contains("either PCR-bound"), "{line}");
    let line = fails(&d.cli(&["key", "create", "k", "--auth-file", "missing"]), 1);
    assert_eq!(line, "tpm-vault: cannot read missing: No such file or directory");
    let out = d.cli(&["key", "create", "k", "--auth", "--auth-file", "pw"]);
    assert_eq!(out.status.code(), Some(2), "usage error");
    assert_eq!(fails(&d.cli(&["key", "show", "k"]), 3), "tpm-vault: key \"k\" not found");
}

#[test]
fn every_key_error_has_its_exit_status_and_one_line() {
    let mut d = Daemon::start();
    let dir = d.dir.path().to_path_buf();
    std::fs::write(dir.join("f"), "hello\n").unwrap();
    std::fs::write(dir.join("short-digest"), [0u8; 31]).unwrap();
    ok(d.cli(&["key", "create", "web"]));

    // NOT_FOUND: 3.
    for args in [
        &["key", "show", "nope"][..],
        &["key", "public", "nope"],
        &["key", "delete", "nope"],
        &["sign", "nope", "--in", "f", "--out", "s"],
        &["verify", "nope", "--in", "f", "--sig", "f"],
    ] {
        assert_eq!(fails(&d.cli(args), 3), "tpm-vault: key \"nope\" not found", "{args:?}");
    }
    // ALREADY_EXISTS: 4.
    assert_eq!(fails(&d.cli(&["key", "create", "web"]), 4), "tpm-vault: key \"web\" already exists");
    // INVALID_ARGUMENT: 2 (bad name, digest length, scheme that does not suit the key).
    let line = fails(&d.cli(&["key", "create", "Bad_Name"]), 2);
    assert_eq!(line, "tpm-vault: invalid key name \"Bad_Name\": must match [a-z0-9][a-z0-9._-]{0,63}");
    let line = fails(&d.cli(&["key", "show", &"a".repeat(65)]), 2);
    assert!(line.starts_with("tpm-vault: invalid key name"), "{line}");
    let line = fails(&d.cli(&["sign", "web", "--digest", "--in", "short-digest", "--out", "s"]), 2);
    assert!(line.contains("digest"), "{line}");
    let line = fails(&d.cli(&["sign", "web", "--scheme", "pss", "--in", "f", "--out", "s"]), 2);
    assert!(line.starts_with("tpm-vault: "), "{line}");
    // FAILED_PRECONDITION: 6 (a key bound to PCR values the TPM does not have).
    let future = format!("sha256:9={}", "ab".repeat(32));
    ok(d.cli(&["key", "create", "bound", "--pcr", &future]));
    let line = fails(&d.cli(&["sign", "bound", "--in", "f", "--out", "s"]), 6);
    assert!(line.starts_with("tpm-vault: "), "{line}");
    // PERMISSION_DENIED (5) for a wrong password is in `key_passwords_from_env_and_file`.

    // UNAVAILABLE: 7, when the TPM is gone (the daemon answers, the TPM does not).
    d.kill_tpm();
    let started = std::time::Instant::now();
    let line = fails(&d.cli(&["key", "create", "after-tpm-died"]), 7);
    eprintln!("TPM unreachable reported in {:?}: {line}", started.elapsed());
    assert_eq!(line, "tpm-vault: TPM unavailable; retry later");

    // UNAVAILABLE: 7, when the daemon is not running.
    let gone = dir.join("gone.sock");
    let out = run_cli(&gone, &["key", "list"], b"", &dir);
    assert_eq!(
        fails(&out, 7),
        format!("tpm-vault: cannot connect to {}: No such file or directory (is tpm-vaultd running?)", gone.display())
    );
    drop(std::os::unix::net::UnixListener::bind(&gone).unwrap());
    let out = run_cli(&gone, &["encrypt", "k"], b"data", &dir);
    assert!(fails(&out, 7).ends_with("Connection refused (is tpm-vaultd running?)"));
}

#[test]
fn access_policy_denials_are_permission_denied() {
    let uid = nix::unistd::getuid().as_raw();
    let d = Daemon::start_with_policy(&format!(
        "[[rule]]\nname = \"no-delete\"\nclients = [\"uid:{uid}\"]\nkeys = [\"*\"]\n\
         operations = [\"create\", \"public\", \"sign\", \"encrypt\", \"decrypt\"]\n"
    ));
    std::fs::write(d.dir.path().join("f"), "x").unwrap();
    ok(d.cli(&["key", "create", "web"]));
    ok(d.cli(&["sign", "web", "--in", "f", "--out", "s"]));
    for args in [&["key", "delete", "web"][..], &["random", "16"], &["datakey", "delete", "web"]] {
        let line = fails(&d.cli(args), 5);
        assert!(line.starts_with("tpm-vault: "), "{args:?}: {line}");
    }
    ok(d.cli(&["key", "show", "web"]));
}

/// A caller who may not open the daemon's socket gets its own exit status (9, not 7's "retry
/// later") and a message naming the group that may connect.
#[test]
fn a_socket_the_caller_may_not_open_is_exit_9_naming_the_group() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    assert_eq!(nix::unistd::getuid().as_raw(), 0, "this test runs the CLI as uid 65534: run as root");
    let d = Daemon::start();
    // The directory is open to all, the socket to root and its group (root) only.
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o660)).expect("chmod socket");
    let out = Command::new(env!("CARGO_BIN_EXE_tpm-vault"))
        .close_inherited_fds()
        .arg("--socket")
        .arg(&d.socket)
        .args(["key", "list"])
        .current_dir("/")
        .env_remove("TPM_VAULT_SOCKET")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run tpm-vault as uid 65534");
    assert_eq!(
        fails(&out, 9),
        format!(
            "tpm-vault: cannot connect to {}: Permission denied (only root and members of group 'root' may use \
             the vault: ask to be added to it)",
            d.socket.display()
        )
    );
    // Root still connects.
    ok(d.cli(&["key", "list"]));
}
