//! `tpm-vault ssh-agent` against the real OpenSSH programs: `ssh-add -L`, `ssh-keygen -Y
//! sign/verify`, `ssh` logging into an `sshd` that the test starts on loopback (user keys, a
//! host key served with `HostKeyAgent`, CA-signed host and user certificates), a uid without
//! `sign` (listed, refused, audited), garbage sent straight to the agent socket, and key
//! usages: only `ssh` keys are served (a `sign` key only when named), they sign only SSH data,
//! and a forwarded connection (`ssh -A`, or a session-bind saying so) gets no signature unless
//! `--allow-forwarding`.
//!
//! Needs `openssh-client` and `openssh-server`, and root (sshd; running the agent as uid 65534).

mod support;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{ok, Daemon, DaemonCli as _};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(60);
/// The uid that the access-policy test runs the agent as.
const NOBODY: u32 = 65534;

/// A running `tpm-vault ssh-agent`, killed on drop.
struct Agent {
    child: Child,
    socket: PathBuf,
    stderr: PathBuf,
}

impl Agent {
    /// Starts the agent for `daemon` on `dir/agent.sock` with `args`, as `uid` if given.
    fn start(daemon: &Daemon, dir: &Path, args: &[&str], uid: Option<u32>) -> Agent {
        let socket = dir.join("agent.sock");
        let stderr = dir.join("agent.stderr");
        let mut command = Command::new(env!("CARGO_BIN_EXE_tpm-vault"));
        command
            .close_inherited_fds()
            .arg("--socket")
            .arg(&daemon.socket)
            .args(["ssh-agent", "--listen"])
            .arg(&socket)
            .args(args)
            .env_remove("TPM_VAULT_SOCKET")
            .env_remove("LISTEN_FDS")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("agent stderr"));
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        let child = command.spawn().expect("spawn tpm-vault ssh-agent");
        let mut agent = Agent { child, socket, stderr };
        let deadline = Instant::now() + WAIT;
        while UnixStream::connect(&agent.socket).is_err() {
            if let Ok(Some(status)) = agent.child.try_wait() {
                panic!("the agent exited with {status}: {}", agent.log());
            }
            assert!(Instant::now() < deadline, "the agent did not listen within {WAIT:?}: {}", agent.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        agent
    }

    /// What the agent wrote on stderr so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Runs an OpenSSH program with `SSH_AUTH_SOCK` set to this agent.
    fn run(&self, program: &str, args: &[&str], cwd: &Path) -> Output {
        output_within(
            Command::new(program)
                .close_inherited_fds()
                .args(args)
                .current_dir(cwd)
                .env("SSH_AUTH_SOCK", &self.socket)
                .stdin(Stdio::null()),
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `command` to completion, killing it after [`WAIT`].
fn output_within(command: &mut Command) -> Output {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let (mut out, mut err) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: out_reader.join().expect("stdout"), stderr: err_reader.join().expect("stderr") }
}

/// Runs `program args` in `cwd` (no agent) and asserts success; returns stdout as text.
fn must(program: &str, args: &[&str], cwd: &Path) -> String {
    let out =
        output_within(Command::new(program).close_inherited_fds().args(args).current_dir(cwd).stdin(Stdio::null()));
    assert!(out.status.success(), "{program} {args:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first two fields (type, base64) of an OpenSSH public key line.
fn key_fields(line: &str) -> String {
    line.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

/// Creates vault key `name` (`alg`) with the `ssh` usage and writes its OpenSSH public key to
/// `dir/name.pub` (made by `ssh-keygen -i -m PKCS8` from `tpm-vault key public`); returns that
/// line.
fn vault_key(daemon: &Daemon, dir: &Path, name: &str, alg: &str) -> String {
    ok(daemon.cli(&["key", "create", name, "--alg", alg, "--usage", "ssh"]));
    openssh_public(daemon, dir, name)
}

/// [`vault_key`] for a host key that sshd reads through `HostKeyAgent`: it signs key-exchange
/// hashes, which are no SSH signing data, so it has the `sign` usage (raw signatures) and the
/// agent serves it only when `--keys` names it.
fn host_key(daemon: &Daemon, dir: &Path, name: &str, alg: &str) -> String {
    ok(daemon.cli(&["key", "create", name, "--alg", alg, "--usage", "sign"]));
    openssh_public(daemon, dir, name)
}

/// Writes the OpenSSH public key of existing vault key `name` to `dir/name.pub`.
fn openssh_public(daemon: &Daemon, dir: &Path, name: &str) -> String {
    let pem = ok(daemon.cli(&["key", "public", name]));
    let pem_path = dir.join(format!("{name}.pem"));
    std::fs::write(&pem_path, pem).expect("write pem");
    let line = must("ssh-keygen", &["-i", "-m", "PKCS8", "-f", pem_path.to_str().expect("path")], dir);
    let line = format!("{} {name}\n", key_fields(&line));
    std::fs::write(dir.join(format!("{name}.pub")), &line).expect("write pub");
    line
}

/// A temp dir that uid 65534 (sshd's privilege-separated child too) can traverse.
fn temp_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// A running `sshd -D -e` on 127.0.0.1, killed on drop.
struct Sshd {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Sshd {
    /// Starts sshd in `dir` with `extra` config lines (host keys, authentication) on a free
    /// loopback port, retrying on a port clash.
    fn start(dir: &Path, extra: &str) -> Sshd {
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        for attempt in 0.. {
            let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
            let config = dir.join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nPidFile {pid}\nStrictModes no\nUsePAM no\n\
                     PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                     LogLevel VERBOSE\n{extra}",
                    pid = dir.join("sshd.pid").display()
                ),
            )
            .expect("sshd_config");
            let log = dir.join(format!("sshd-{attempt}.log"));
            let child = Command::new("/usr/sbin/sshd")
                .close_inherited_fds()
                .args(["-D", "-e", "-f"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("sshd log"))
                .spawn()
                .expect("spawn sshd");
            let mut sshd = Sshd { child, port, log };
            let deadline = Instant::now() + WAIT;
            loop {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return sshd;
                }
                if let Ok(Some(status)) = sshd.child.try_wait() {
                    let log = sshd.log();
                    assert!(attempt < 5 && log.contains("Address already in use"), "sshd exited with {status}: {log}");
                    break;
                }
                assert!(Instant::now() < deadline, "sshd did not listen within {WAIT:?}: {}", sshd.log());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        unreachable!()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `ssh root@127.0.0.1 -p PORT echo logged-in` with the agent, `known_hosts` and `options`.
    fn ssh(&self, agent: &Agent, dir: &Path, known_hosts: &str, options: &[&str]) -> Output {
        self.ssh_run(agent, dir, known_hosts, options, &[], "echo logged-in")
    }

    /// `ssh FLAGS root@127.0.0.1 -p PORT COMMAND` with the agent, `known_hosts` and `options`.
    fn ssh_run(
        &self,
        agent: &Agent,
        dir: &Path,
        known_hosts: &str,
        options: &[&str],
        flags: &[&str],
        command: &str,
    ) -> Output {
        let known = dir.join("known_hosts");
        std::fs::write(&known, known_hosts).expect("known_hosts");
        let mut args = vec![
            "-F".to_owned(),
            "/dev/null".to_owned(),
            "-p".to_owned(),
            self.port.to_string(),
            "-o".to_owned(),
            "BatchMode=yes".to_owned(),
            "-o".to_owned(),
            format!("UserKnownHostsFile={}", known.display()),
            "-o".to_owned(),
            "GlobalKnownHostsFile=/dev/null".to_owned(),
            "-o".to_owned(),
            format!("IdentityAgent={}", agent.socket.display()),
            "-o".to_owned(),
            "ConnectTimeout=30".to_owned(),
        ];
        for o in options {
            args.push("-o".to_owned());
            args.push((*o).to_owned());
        }
        args.extend(flags.iter().map(|f| (*f).to_owned()));
        args.extend(["root@127.0.0.1".to_owned(), command.to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        agent.run("ssh", &args, dir)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that an `ssh` run logged in.
#[track_caller]
fn logged_in(out: &Output, sshd: &Sshd, agent: &Agent) {
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "logged-in",
        "ssh: {}\n{}\nsshd: {}\nagent: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        sshd.log(),
        agent.log()
    );
}

/// A plain host key for sshd (not a vault one), in `dir/name`.
fn file_key(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    must("ssh-keygen", &["-q", "-t", "ed25519", "-N", "", "-C", name, "-f", path.to_str().expect("path")], dir);
    path
}

fn require_root() {
    assert_eq!(
        nix::unistd::getuid().as_raw(),
        0,
        "these tests start sshd and run the agent as another uid: run as root"
    );
}

#[test]
fn ssh_add_lists_the_vault_keys_and_ssh_keygen_signs_through_the_agent() {
    let daemon = Daemon::start();
    let dir = temp_dir();
    let d = dir.path();
    let keys = [
        ("p256", "ecc-p256", "ecdsa-sha2-nistp256"),
        ("p384", "ecc-p384", "ecdsa-sha2-nistp384"),
        ("rsa", "rsa-2048", "ssh-rsa"),
    ];
    let lines: Vec<String> = keys.iter().map(|(name, alg, _)| vault_key(&daemon, d, name, alg)).collect();
    // A post-quantum key has no OpenSSH form, a key without the `ssh` usage is not served:
    // neither is listed.
    ok(daemon.cli(&["key", "create", "pq", "--alg", "ml-dsa-44"]));
    ok(daemon.cli(&["key", "create", "tls", "--alg", "ecc-p256"]));
    let agent = Agent::start(&daemon, d, &[], None);

    let listed = agent.run("ssh-add", &["-L"], d);
    assert!(listed.status.success(), "ssh-add -L: {}", String::from_utf8_lossy(&listed.stderr));
    let listed: Vec<String> = String::from_utf8_lossy(&listed.stdout).lines().map(key_fields).collect();
    let mut expected: Vec<String> = lines.iter().map(|l| key_fields(l)).collect();
    expected.sort();
    let mut got = listed.clone();
    got.sort();
    assert_eq!(got, expected, "ssh-add -L");
    for ((_, _, ssh_type), line) in keys.iter().zip(&lines) {
        assert!(line.starts_with(ssh_type), "{line}");
    }

    // --keys limits what is served.
    let only = temp_dir();
    let limited = Agent::start(&daemon, only.path(), &["--keys", "p3*"], None);
    let out = limited.run("ssh-add", &["-L"], d);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().map(key_fields).collect::<Vec<_>>(),
        [key_fields(&lines[1])]
    );

    std::fs::write(d.join("file"), b"a file to sign\n").expect("write file");
    for ((name, _, _), line) in keys.iter().zip(&lines) {
        let out = agent.run("ssh-keygen", &["-Y", "sign", "-f", &format!("{name}.pub"), "-n", "file", "file"], d);
        assert!(
            out.status.success(),
            "ssh-keygen -Y sign with {name}: {}\nagent: {}",
            String::from_utf8_lossy(&out.stderr),
            agent.log()
        );
        std::fs::write(d.join("allowed_signers"), format!("tester@example {}\n", key_fields(line))).expect("signers");
        let verify = output_within(
            Command::new("ssh-keygen")
                .close_inherited_fds()
                .args(["-Y", "verify", "-f", "allowed_signers", "-I", "tester@example", "-n", "file", "-s", "file.sig"])
                .current_dir(d)
                .stdin(std::fs::File::open(d.join("file")).expect("file")),
        );
        assert!(
            verify.status.success(),
            "ssh-keygen -Y verify of {name}: {}{}",
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        );
        std::fs::remove_file(d.join("file.sig")).expect("rm sig");
    }

    // Keys live in the vault: ssh-add of a key file and ssh-add -D are refused.
    let file = file_key(d, "local");
    let add = agent.run("ssh-add", &[file.to_str().expect("path")], d);
    assert!(!add.status.success(), "ssh-add of a file key must fail");
    let remove_all = agent.run("ssh-add", &["-D"], d);
    assert!(!remove_all.status.success(), "ssh-add -D must fail");
    assert_eq!(agent.run("ssh-add", &["-L"], d).stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count(), 3);
}

#[test]
fn ssh_logs_into_sshd_with_p256_and_rsa_vault_keys() {
    require_root();
    ssh_login_with_vault_keys(&Daemon::start());
}

/// The same through the TPM device model (issue #36: the kernel's resource manager, the Orin
/// fTPM's times at 1/50).
#[test]
fn ssh_logs_into_sshd_through_the_device_model() {
    require_root();
    let daemon = Daemon::start_modeled(0.02);
    ssh_login_with_vault_keys(&daemon);
    assert_eq!(daemon.space().stats().failed, 0, "resource-manager failures");
}

fn ssh_login_with_vault_keys(daemon: &Daemon) {
    let dir = temp_dir();
    let d = dir.path();
    let p256 = vault_key(daemon, d, "user-p256", "ecc-p256");
    let rsa = vault_key(daemon, d, "user-rsa", "rsa-2048");
    let host = file_key(d, "host_ed25519");
    std::fs::write(d.join("authorized_keys"), format!("{p256}{rsa}")).expect("authorized_keys");
    let agent = Agent::start(daemon, d, &[], None);
    let sshd = Sshd::start(
        d,
        &format!("HostKey {}\nAuthorizedKeysFile {}\n", host.display(), d.join("authorized_keys").display()),
    );
    let host_pub = std::fs::read_to_string(host.with_extension("pub")).expect("host pub");
    let known = format!("[127.0.0.1]:{} {}\n", sshd.port, key_fields(&host_pub));
    for name in ["user-p256", "user-rsa"] {
        let identity = format!("IdentityFile={}", d.join(format!("{name}.pub")).display());
        let out = sshd.ssh(&agent, d, &known, &["StrictHostKeyChecking=yes", "IdentitiesOnly=yes", &identity]);
        logged_in(&out, &sshd, &agent);
        let log = sshd.log();
        let fingerprint = must("ssh-keygen", &["-l", "-f", &format!("{name}.pub")], d);
        let fingerprint = fingerprint.split_whitespace().nth(1).expect("fingerprint").to_owned();
        assert!(log.contains(&fingerprint), "sshd accepted {name} ({fingerprint}): {log}");
    }
}

#[test]
fn sshd_serves_a_vault_host_key_through_host_key_agent() {
    require_root();
    let daemon = Daemon::start();
    let dir = temp_dir();
    let d = dir.path();
    let host = host_key(&daemon, d, "host-key", "ecc-p256");
    let user = vault_key(&daemon, d, "user", "ecc-p384");
    std::fs::write(d.join("authorized_keys"), &user).expect("authorized_keys");
    // The host key is named (raw signatures of key-exchange hashes), `*` serves the ssh keys.
    let agent = Agent::start(&daemon, d, &["--keys", "host-key", "--keys", "*"], None);
    let sshd = Sshd::start(
        d,
        &format!(
            "HostKeyAgent {}\nHostKey {}\nAuthorizedKeysFile {}\n",
            agent.socket.display(),
            d.join("host-key.pub").display(),
            d.join("authorized_keys").display()
        ),
    );
    let identity = format!("IdentityFile={}", d.join("user.pub").display());
    let opts = ["StrictHostKeyChecking=yes", "IdentitiesOnly=yes", identity.as_str()];
    let known = format!("[127.0.0.1]:{} {}\n", sshd.port, key_fields(&host));
    logged_in(&sshd.ssh(&agent, d, &known, &opts), &sshd, &agent);

    // Another key in known_hosts: refused.
    let other = file_key(d, "other");
    let other_pub = std::fs::read_to_string(other.with_extension("pub")).expect("other pub");
    // Same key type, so ssh compares it rather than negotiating another algorithm.
    let other_p256 = {
        let path = d.join("other_p256");
        must("ssh-keygen", &["-q", "-t", "ecdsa", "-b", "256", "-N", "", "-f", path.to_str().expect("path")], d);
        std::fs::read_to_string(path.with_extension("pub")).expect("pub")
    };
    for wrong in [other_p256, other_pub] {
        let known = format!("[127.0.0.1]:{} {}\n", sshd.port, key_fields(&wrong));
        let out = sshd.ssh(&agent, d, &known, &opts);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "ssh must refuse a host key that is not in known_hosts");
        assert!(stderr.contains("Host key verification failed"), "{stderr}");
    }
}

#[test]
fn ca_signed_host_and_user_certificates_of_vault_keys() {
    require_root();
    let daemon = Daemon::start();
    let dir = temp_dir();
    let d = dir.path();
    host_key(&daemon, d, "host-key", "ecc-p256");
    vault_key(&daemon, d, "user", "rsa-2048");
    let ca = file_key(d, "ca");
    let ca_path = ca.to_str().expect("path");
    must(
        "ssh-keygen",
        &["-q", "-s", ca_path, "-I", "vault-host", "-h", "-n", "127.0.0.1", "-V", "-5m:+1h", "host-key.pub"],
        d,
    );
    must("ssh-keygen", &["-q", "-s", ca_path, "-I", "vault-user", "-n", "root", "-V", "-5m:+1h", "user.pub"], d);
    let agent = Agent::start(
        &daemon,
        d,
        &[
            "--keys",
            "host-key",
            "--keys",
            "user",
            "--cert",
            "user=user-cert.pub",
            "--cert",
            "host-key=host-key-cert.pub",
        ],
        None,
    );
    let listed = String::from_utf8_lossy(&agent.run("ssh-add", &["-L"], d).stdout).into_owned();
    let user_cert = std::fs::read_to_string(d.join("user-cert.pub")).expect("user cert");
    assert!(listed.lines().any(|l| key_fields(l) == key_fields(&user_cert)), "cert listed: {listed}");
    assert!(listed.contains("ecdsa-sha2-nistp256-cert-v01@openssh.com"), "{listed}");

    // No authorized_keys: only the CA-signed user certificate gets in.
    let sshd = Sshd::start(
        d,
        &format!(
            "HostKeyAgent {}\nHostKey {}\nHostCertificate {}\nTrustedUserCAKeys {}\nAuthorizedKeysFile none\n",
            agent.socket.display(),
            d.join("host-key.pub").display(),
            d.join("host-key-cert.pub").display(),
            ca.with_extension("pub").display()
        ),
    );
    let ca_pub = std::fs::read_to_string(ca.with_extension("pub")).expect("ca pub");
    let known = format!("@cert-authority * {}\n", key_fields(&ca_pub));
    let out = sshd.ssh(&agent, d, &known, &["StrictHostKeyChecking=yes"]);
    logged_in(&out, &sshd, &agent);
    let log = sshd.log();
    assert!(log.contains("vault-user"), "logged in with the user certificate: {log}");
    let debug = sshd.ssh(&agent, d, &known, &["StrictHostKeyChecking=yes", "LogLevel=DEBUG"]);
    let stderr = String::from_utf8_lossy(&debug.stderr);
    assert!(stderr.contains("ECDSA-CERT") || stderr.contains("cert-v01"), "host certificate used: {stderr}");

    // Without the CA line the same host is not trusted.
    let out = sshd.ssh(&agent, d, "", &["StrictHostKeyChecking=yes"]);
    assert!(!out.status.success());
}

#[test]
fn a_uid_without_sign_sees_the_key_but_its_signature_is_refused_and_audited() {
    require_root();
    let me = nix::unistd::getuid().as_raw();
    let daemon = Daemon::start_with_policy_and_audit(&format!(
        "[[rule]]\nname = \"root-all\"\nclients = [\"uid:{me}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n\n\
         [[rule]]\nname = \"nobody-public\"\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"web\"]\noperations = [\"public\"]\n"
    ));
    // Let uid 65534 reach the daemon's socket.
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
    let dir = temp_dir();
    let d = dir.path();
    let web = vault_key(&daemon, d, "web", "ecc-p256");
    vault_key(&daemon, d, "other", "ecc-p256");
    let agent_dir = d.join("agent");
    std::fs::create_dir(&agent_dir).expect("agent dir");
    nix::unistd::chown(&agent_dir, Some(NOBODY.into()), Some(NOBODY.into())).expect("chown");
    let agent = Agent::start(&daemon, &agent_dir, &[], Some(NOBODY));

    // The socket is the agent user's, mode 0600.
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(&agent.socket).expect("socket");
    assert_eq!(meta.uid(), NOBODY);
    assert_eq!(meta.mode() & 0o777, 0o600);

    let listed = agent.run("ssh-add", &["-L"], d);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert_eq!(listed.lines().map(key_fields).collect::<Vec<_>>(), [key_fields(&web)], "only web: {listed}");

    std::fs::write(d.join("file"), b"data\n").expect("file");
    let out = agent.run("ssh-keygen", &["-Y", "sign", "-f", "web.pub", "-n", "file", "file"], d);
    assert!(!out.status.success(), "signing without `sign` must fail");
    assert!(!d.join("file.sig").exists());
    let deadline = Instant::now() + WAIT;
    loop {
        let log = daemon.audit_log();
        let denied =
            log.iter().any(|e| e["uid"] == NOBODY && e["op"] == "sign" && e["key"] == "web" && e["decision"] == "deny");
        if denied {
            break;
        }
        assert!(Instant::now() < deadline, "no audited denial: {log:?}\nagent: {}", agent.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The agent still serves.
    assert!(agent.run("ssh-add", &["-L"], d).status.success());
}

/// Sends `frame` raw and reads one reply frame (`None` if the agent closed the connection).
fn exchange(stream: &mut UnixStream, frame: &[u8]) -> Option<Vec<u8>> {
    stream.write_all(frame).ok()?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).ok()?;
    Some(body)
}

/// A length-prefixed frame of `body`.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// An SSH string.
fn string(bytes: &[u8]) -> Vec<u8> {
    frame(bytes)
}

fn connect(agent: &Agent) -> UnixStream {
    let stream = UnixStream::connect(&agent.socket).expect("connect agent");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    stream
}

#[test]
fn garbage_gets_agent_failure_and_the_agent_keeps_serving() {
    const FAILURE: &[u8] = &[5];
    let daemon = Daemon::start();
    let dir = temp_dir();
    let d = dir.path();
    vault_key(&daemon, d, "rsa", "rsa-2048");
    vault_key(&daemon, d, "ec", "ecc-p256");
    let agent = Agent::start(&daemon, d, &[], None);
    let mut s = connect(&agent);

    // Identities work on a raw connection (type 12).
    let answer = exchange(&mut s, &frame(&[11])).expect("identities");
    assert_eq!(answer[0], 12);
    assert_eq!(&answer[1..5], &[0, 0, 0, 2]);

    let unknown_blob = {
        let mut blob = string(b"ssh-ed25519");
        blob.extend(string(&[9u8; 32]));
        blob
    };
    let sign_with = |blob: &[u8], flags: u32| sign_frame(blob, &sshsig_data(), flags);
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        ("empty message", frame(&[])),
        ("unknown type", frame(&[200, 1, 2, 3])),
        ("identities with trailing bytes", frame(&[11, 0])),
        ("truncated sign request", frame(&[13, 0, 0, 0, 40, 1, 2])),
        ("sign request with an inner length past the end", frame(&[13, 0xff, 0xff, 0xff, 0xf0, 0, 0])),
        ("unknown key blob", sign_with(&unknown_blob, 0)),
        ("junk key blob", sign_with(b"\x00\x00\x00\x03abc\xff\xff", 0)),
        ("add identity", {
            let mut body = vec![17];
            body.extend(string(b"ssh-ed25519"));
            body.extend(string(&[1u8; 32]));
            body.extend(string(&[2u8; 64]));
            body.extend(string(b"comment"));
            frame(&body)
        }),
        ("remove all identities", frame(&[19])),
        (
            "lock",
            frame(&{
                let mut b = vec![22];
                b.extend(string(b"pw"));
                b
            }),
        ),
        (
            "unknown extension",
            frame(&{
                let mut b = vec![27];
                b.extend(string(b"nonsense@example.com"));
                b
            }),
        ),
        (
            "malformed session-bind",
            frame(&{
                let mut b = vec![27];
                b.extend(string(b"session-bind@openssh.com"));
                b.extend([0, 0, 0, 1, 0]);
                b
            }),
        ),
    ];
    for (what, message) in &garbage {
        assert_eq!(exchange(&mut s, message).as_deref(), Some(FAILURE), "{what}");
    }

    // The malformed session-bind marked that connection as possibly forwarded: no signatures
    // there. SHA-1 ssh-rsa (no SHA-2 flag) is refused; rsa-sha2-256 works on a fresh connection.
    let rsa_blob = openssh_blob(d, "rsa");
    assert_eq!(exchange(&mut s, &sign_with(&rsa_blob, 2)).as_deref(), Some(FAILURE), "after a bad bind");
    let mut s = connect(&agent);
    let answer = exchange(&mut s, &frame(&[11])).expect("identities");
    assert!(answer.windows(rsa_blob.len()).any(|w| w == rsa_blob.as_slice()));
    assert_eq!(exchange(&mut s, &sign_with(&rsa_blob, 0)).as_deref(), Some(FAILURE), "ssh-rsa SHA-1");
    let signed = exchange(&mut s, &sign_with(&rsa_blob, 2)).expect("rsa-sha2-256");
    assert_eq!(signed[0], 14, "SSH_AGENT_SIGN_RESPONSE");
    assert!(signed.windows(12).any(|w| w == b"rsa-sha2-256"));

    // An impossible length closes the connection; the agent keeps serving others.
    let mut s2 = connect(&agent);
    assert_eq!(exchange(&mut s2, &[0xff, 0xff, 0xff, 0xff, 11]), None, "oversized length");
    let mut s3 = connect(&agent);
    assert_eq!(exchange(&mut s3, &frame(&[11])).map(|a| a[0]), Some(12));
    // A half-sent message on one connection does not block the others.
    let mut s4 = connect(&agent);
    s4.write_all(&[0, 0, 0, 100, 13]).expect("partial");
    assert_eq!(exchange(&mut s3, &frame(&[11])).map(|a| a[0]), Some(12));
    drop(s4);
    assert!(agent.run("ssh-add", &["-L"], d).status.success(), "agent: {}", agent.log());
}

/// The OpenSSH key blob of `dir/name.pub`.
fn openssh_blob(dir: &Path, name: &str) -> Vec<u8> {
    let line = std::fs::read_to_string(dir.join(format!("{name}.pub"))).expect("pub");
    base64_decode(line.split_whitespace().nth(1).expect("b64"))
}

/// An `SSH_AGENTC_SIGN_REQUEST` frame for key `blob` over `data` with `flags`.
fn sign_frame(blob: &[u8], data: &[u8], flags: u32) -> Vec<u8> {
    let mut body = vec![13];
    body.extend(string(blob));
    body.extend(string(data));
    body.extend(flags.to_be_bytes());
    frame(&body)
}

/// An SSHSIG signed-data blob (namespace `file`, a SHA-512 message hash).
fn sshsig_data() -> Vec<u8> {
    let mut d = b"SSHSIG".to_vec();
    d.extend(string(b"file"));
    d.extend(string(b""));
    d.extend(string(b"sha512"));
    d.extend(string(&[0x42; 64]));
    d
}

/// A `session-bind@openssh.com` extension frame with `is_forwarding`, whose host key and
/// signature are junk (the forwarding mark counts whether or not the signature checks).
fn session_bind(is_forwarding: bool) -> Vec<u8> {
    let mut body = vec![27];
    body.extend(string(b"session-bind@openssh.com"));
    body.extend(string(&[string(b"ssh-ed25519"), string(&[7; 32])].concat()));
    body.extend(string(&[0x33; 32]));
    body.extend(string(&[string(b"ssh-ed25519"), string(&[8; 64])].concat()));
    body.push(u8::from(is_forwarding));
    frame(&body)
}

/// The agent is no signing oracle: it serves `ssh` keys for SSH data only (a TLS 1.3
/// CertificateVerify content is refused by the daemon), and a connection a session-bind marks
/// as forwarded gets no signature unless `--allow-forwarding`. The review got both signatures
/// over `ssh -A` from the code before usages.
#[test]
fn the_agent_signs_only_ssh_data_and_not_for_forwarded_connections() {
    const FAILURE: &[u8] = &[5];
    let daemon = Daemon::start();
    let dir = temp_dir();
    let d = dir.path();
    vault_key(&daemon, d, "me", "ecc-p256");
    let agent = Agent::start(&daemon, d, &[], None);
    let blob = openssh_blob(d, "me");

    let mut plain = connect(&agent);
    let signed = exchange(&mut plain, &sign_frame(&blob, &sshsig_data(), 0)).expect("sshsig");
    assert_eq!(signed[0], 14, "SSHSIG signed: {}", agent.log());
    let mut tls13 = vec![0x20; 64];
    tls13.extend(b"TLS 1.3, server CertificateVerify\0");
    tls13.extend([0xab; 32]);
    assert_eq!(exchange(&mut plain, &sign_frame(&blob, &tls13, 0)).as_deref(), Some(FAILURE), "TLS content");
    assert!(agent.log().contains("not SSH signing data"), "{}", agent.log());

    // A session-bind for authentication leaves the connection usable; one for forwarding does
    // not, and a later bind cannot undo it.
    let mut auth = connect(&agent);
    assert_eq!(exchange(&mut auth, &session_bind(false)).as_deref(), Some(FAILURE), "junk signature");
    assert_eq!(exchange(&mut auth, &sign_frame(&blob, &sshsig_data(), 0)).map(|a| a[0]), Some(14));
    let mut forwarded = connect(&agent);
    exchange(&mut forwarded, &session_bind(true)).expect("bind answer");
    exchange(&mut forwarded, &session_bind(false)).expect("bind answer");
    assert_eq!(exchange(&mut forwarded, &sign_frame(&blob, &sshsig_data(), 0)).as_deref(), Some(FAILURE));
    assert_eq!(exchange(&mut forwarded, &frame(&[11])).map(|a| a[0]), Some(12), "still lists");
    let log = agent.log();
    assert!(log.contains("forwarded connection"), "{log}");
    let me = format!("pid {} uid {}", std::process::id(), nix::unistd::getuid().as_raw());
    assert!(log.contains(&format!("connection from {me}")), "peer logged: {log}");

    let allowing = temp_dir();
    let agent = Agent::start(&daemon, allowing.path(), &["--allow-forwarding"], None);
    let mut forwarded = connect(&agent);
    exchange(&mut forwarded, &session_bind(true)).expect("bind answer");
    assert_eq!(exchange(&mut forwarded, &sign_frame(&blob, &sshsig_data(), 0)).map(|a| a[0]), Some(14));
}

/// `ssh -A` to a real sshd, then `ssh-keygen -Y sign` on the "remote" side through the
/// forwarded agent: refused (OpenSSH's client binds the forwarded connection with
/// is-forwarding), and allowed with `--allow-forwarding`.
#[test]
fn ssh_minus_a_gives_the_remote_host_no_signatures() {
    require_root();
    let daemon = Daemon::start();
    let dir = temp_dir();
    let d = dir.path();
    let me = vault_key(&daemon, d, "me", "ecc-p256");
    let host = file_key(d, "host_ed25519");
    std::fs::write(d.join("authorized_keys"), &me).expect("authorized_keys");
    std::fs::write(d.join("file"), b"signed on the remote host\n").expect("file");
    let sshd = Sshd::start(
        d,
        &format!(
            "HostKey {}\nAuthorizedKeysFile {}\nAllowAgentForwarding yes\n",
            host.display(),
            d.join("authorized_keys").display()
        ),
    );
    let host_pub = std::fs::read_to_string(host.with_extension("pub")).expect("host pub");
    let known = format!("[127.0.0.1]:{} {}\n", sshd.port, key_fields(&host_pub));
    let identity = format!("IdentityFile={}", d.join("me.pub").display());
    let options = ["StrictHostKeyChecking=yes", "IdentitiesOnly=yes", identity.as_str()];
    let remote = format!("cd {} && ssh-keygen -Y sign -f me.pub -n file file && echo signed-remotely", d.display());
    for (allow, expect_signed) in [(false, false), (true, true)] {
        let _ = std::fs::remove_file(d.join("file.sig"));
        let agent_dir = temp_dir();
        let args: &[&str] = if allow { &["--allow-forwarding"] } else { &[] };
        let agent = Agent::start(&daemon, agent_dir.path(), args, None);
        let out = sshd.ssh_run(&agent, d, &known, &options, &["-A"], &remote);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let context = format!(
            "allow {allow}: {}\n{stdout}\n{}\nagent: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            agent.log()
        );
        // The login itself (a local, bound-for-authentication connection) always works.
        assert!(sshd.log().contains("Accepted publickey"), "{context}");
        assert_eq!(stdout.contains("signed-remotely"), expect_signed, "{context}");
        assert_eq!(d.join("file.sig").exists(), expect_signed, "{context}");
        if !expect_signed {
            assert!(agent.log().contains("forwarded connection"), "{context}");
        }
    }
}

/// Standard base64 (OpenSSH public key lines).
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[test]
fn the_agent_serves_a_socket_passed_by_systemd() {
    let daemon = Daemon::start();
    let dir = temp_dir();
    let d = dir.path();
    let line = vault_key(&daemon, d, "web", "ecc-p256");
    let socket = d.join("activated.sock");
    // systemd-socket-activate binds the socket and starts the agent on the first connection.
    let child = Command::new("systemd-socket-activate")
        .close_inherited_fds()
        .arg("-l")
        .arg(&socket)
        .arg("-E")
        .arg(format!("TPM_VAULT_SOCKET={}", daemon.socket.display()))
        .args([env!("CARGO_BIN_EXE_tpm-vault"), "ssh-agent"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("activate.stderr")).expect("stderr"))
        .spawn()
        .expect("spawn systemd-socket-activate");
    let mut agent = Agent { child, socket, stderr: d.join("activate.stderr") };
    let deadline = Instant::now() + WAIT;
    while !agent.socket.exists() {
        assert!(agent.child.try_wait().expect("wait").is_none(), "exited: {}", agent.log());
        assert!(Instant::now() < deadline, "no socket: {}", agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = agent.run("ssh-add", &["-L"], d);
    assert!(out.status.success(), "ssh-add -L: {}\n{}", String::from_utf8_lossy(&out.stderr), agent.log());
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().map(key_fields).collect::<Vec<_>>(), [key_fields(&line)]);
}
