//! OpenSSH with the module: `ssh-keygen -D` prints the vault key, `ssh -I` logs into an sshd the
//! test starts (as root, on loopback, its own host key and authorized_keys), and `ssh-add -s`
//! loads the key into an `ssh-agent` that then logs in too. For ECDSA P-256 and RSA-2048 (with
//! OpenSSH's preferred `rsa-sha2-512`, a SHA-512 DigestInfo the TPM signs, and with
//! `rsa-sha2-256`).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{describe, run, run_input, run_ok, stdout, Daemon, Proc};

/// The key's OpenSSH public key ("TYPE BASE64") from its SPKI PEM.
fn openssh_public(pem: &Path) -> String {
    let out = run_ok(Command::new("ssh-keygen").args(["-i", "-m", "PKCS8", "-f"]).arg(pem));
    first_two_fields(stdout(&out).trim())
}

fn first_two_fields(line: &str) -> String {
    line.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

/// A running sshd accepting `authorized` for root on 127.0.0.1:`port`.
struct Sshd {
    proc: Proc,
    port: u16,
    log: PathBuf,
}

fn start_sshd(dir: &Path, authorized: &str) -> Sshd {
    std::fs::create_dir_all(dir).expect("sshd dir");
    std::fs::create_dir_all("/run/sshd").expect("/run/sshd (privilege separation directory)");
    let host_key = dir.join("host_ed25519");
    run_ok(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(&host_key));
    std::fs::write(dir.join("authorized_keys"), format!("{authorized}\n")).expect("authorized_keys");
    let config = dir.join("sshd_config");
    let log = dir.join("sshd.log");
    let (proc, port) = support::serve_on_free_port("sshd", &log, &[], |port| {
        std::fs::write(
            &config,
            format!(
                "ListenAddress 127.0.0.1:{port}\nHostKey {}\nPidFile {}\nAuthorizedKeysFile {}\n\
                 PermitRootLogin yes\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 PubkeyAcceptedAlgorithms ecdsa-sha2-nistp256,ecdsa-sha2-nistp384,rsa-sha2-512,rsa-sha2-256\n",
                host_key.display(),
                dir.join("sshd.pid").display(),
                dir.join("authorized_keys").display()
            ),
        )
        .expect("sshd_config");
        let mut cmd = Command::new("/usr/sbin/sshd");
        cmd.arg("-D").arg("-e").arg("-f").arg(&config);
        cmd
    });
    Sshd { proc, port, log }
}

/// `ssh ... root@127.0.0.1 echo hello` with `extra` options; asserts it prints hello.
fn ssh_hello(d: &Daemon, sshd: &mut Sshd, extra: &[&str], agent: Option<&Path>, what: &str) {
    let mut cmd = Command::new("ssh");
    d.module_env(&mut cmd).env_remove("SSH_AUTH_SOCK").env_remove("SSH_AGENT_PID");
    if let Some(sock) = agent {
        cmd.env("SSH_AUTH_SOCK", sock);
    }
    cmd.args(["-F", "/dev/null", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"])
        .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-o", "LogLevel=ERROR"])
        .args(extra)
        .args(["-p", &sshd.port.to_string(), "root@127.0.0.1", "echo", "hello"]);
    let out = run(&mut cmd);
    assert!(
        out.status.success() && stdout(&out).trim() == "hello",
        "{what}: {}\n--- sshd log ---\n{}",
        describe(&out),
        std::fs::read_to_string(&sshd.log).unwrap_or_default()
    );
    sshd.proc.assert_running(&sshd.log);
}

/// The whole OpenSSH round for one key.
fn openssh_round(alg: &str, name: &str, client_algs: &[&str]) {
    let d = Daemon::start();
    d.create_key(name, alg);
    let expected = openssh_public(&d.public_pem(name));
    let module = support::module();

    // ssh-keygen -D: the module's keys in OpenSSH format.
    let out = run_ok(d.module_env(&mut Command::new("ssh-keygen")).arg("-D").arg(&module));
    let listed: Vec<String> = stdout(&out).lines().map(first_two_fields).collect();
    assert!(listed.contains(&expected), "ssh-keygen -D does not print the vault key {expected}:\n{}", describe(&out));

    // ssh -I: login with the module in the client. With IdentitiesOnly=yes, ssh uses a
    // PKCS#11 key only if it is also named by an IdentityFile (its public half will do):
    // sshconnect2.c pubkey_prepare drops the others.
    let mut sshd = start_sshd(&d.path().join("sshd"), &expected);
    let identity = d.path().join(format!("{name}.ssh.pub"));
    std::fs::write(&identity, format!("{expected}\n")).expect("identity file");
    let identity_arg = identity.display().to_string();
    let module_arg = module.display().to_string();
    let mut opts = vec!["-o", "IdentitiesOnly=yes", "-i", identity_arg.as_str(), "-I", module_arg.as_str()];
    opts.extend_from_slice(client_algs);
    ssh_hello(&d, &mut sshd, &opts, None, "ssh -I");

    // ssh-agent + ssh-add -s: the agent's PKCS#11 helper holds the key.
    let sock = d.path().join("agent.sock");
    let agent_log = d.path().join("agent.log");
    let mut agent_cmd = Command::new("ssh-agent");
    d.module_env(&mut agent_cmd).arg("-D").arg("-a").arg(&sock).arg("-P").arg(&module);
    let mut agent = Proc::spawn("ssh-agent", &mut agent_cmd, &agent_log);
    support::wait_until("the agent's socket", || {
        agent.assert_running(&agent_log);
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let askpass = d.path().join("askpass");
    std::fs::write(&askpass, "#!/bin/sh\necho\n").expect("askpass");
    std::fs::set_permissions(&askpass, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod askpass");
    let out = run_input(
        d.module_env(&mut Command::new("ssh-add"))
            .env("SSH_AUTH_SOCK", &sock)
            .env("SSH_ASKPASS", &askpass)
            .env("SSH_ASKPASS_REQUIRE", "force")
            .arg("-s")
            .arg(&module),
        Some(b"\n"),
    );
    assert!(
        out.status.success(),
        "ssh-add -s: {}\n--- agent ---\n{}",
        describe(&out),
        std::fs::read_to_string(&agent_log).unwrap_or_default()
    );
    let out = run_ok(Command::new("ssh-add").env("SSH_AUTH_SOCK", &sock).arg("-L"));
    let listed: Vec<String> = stdout(&out).lines().map(first_two_fields).collect();
    assert!(listed.contains(&expected), "ssh-add -L does not list the vault key {expected}:\n{}", describe(&out));
    let mut opts = vec!["-o", "IdentitiesOnly=no"];
    opts.extend_from_slice(client_algs);
    ssh_hello(&d, &mut sshd, &opts, Some(&sock), "ssh through the agent");
    agent.assert_running(&agent_log);
}

#[test]
fn ecdsa_p256_key_logs_in_with_ssh_and_through_the_agent() {
    openssh_round("ecc-p256", "ssh-ec", &[]);
}

/// RSA: OpenSSH's default choice (rsa-sha2-512), then rsa-sha2-256 only.
#[test]
fn rsa_2048_key_logs_in_with_ssh_and_through_the_agent() {
    openssh_round("rsa-2048", "ssh-rsa", &["-o", "PubkeyAcceptedAlgorithms=rsa-sha2-512"]);
    openssh_round("rsa-2048", "ssh-rsa", &["-o", "PubkeyAcceptedAlgorithms=rsa-sha2-256"]);
}
