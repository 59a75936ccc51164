//! nginx (a root master + 2 forked workers running as `nobody`, as in production where they run
//! as `www-data`) serving TLS 1.3 with the vault key through `ssl_engine pkcs11` (libp11's
//! engine, configured by `OPENSSL_CONF`): 200 handshakes from 4 concurrent curl clients all
//! succeed, both workers serve, the served certificate carries the vault key, and after the
//! daemon is killed and started again nginx keeps serving without a reload. The policy gives
//! nobody only `sign` and `public` on the key, and every signature in the audit log is nobody's
//! (the workers do not sign on the master's root connection, issue #31). A second nginx without
//! `env` directives (empty worker environment) shows the module keeps the settings it read in
//! the master before the fork.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use support::{describe, run, run_input, spki_der_of, stdout, Daemon, Proc, NOBODY};

/// Root (the master, which loads the key) may do everything; the workers' user only `sign`
/// and `public` on `key`.
fn policy(key: &str) -> String {
    format!(
        "{}\n[[rule]]\nname = \"workers\"\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"{key}\"]\noperations = [\"sign\", \"public\"]\n",
        support::allow_all_policy()
    )
}

/// Waits until the audit log has signatures of `key`, and checks that every one of them was
/// made by the workers' user; returns how many.
fn signs_by_workers(d: &Daemon, key: &str) -> usize {
    let audit = d.audit_log.clone().expect("audit log");
    let signs = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("\"op\":\"sign\"") && l.contains(&format!("\"key\":\"{key}\"")))
            .map(str::to_owned)
            .collect()
    };
    support::wait_until("signatures in the audit log", || {
        !signs(&std::fs::read_to_string(&audit).unwrap_or_default()).is_empty()
    });
    let all = signs(&std::fs::read_to_string(&audit).unwrap_or_default());
    let others: Vec<_> = all.iter().filter(|l| !l.contains(&format!("\"uid\":{NOBODY},"))).collect();
    assert!(others.is_empty(), "signatures not made by the workers' user {NOBODY}:\n{others:#?}");
    all.len()
}

/// nginx.conf for `dir`: workers answer `$pid` on 127.0.0.1:`port` with `key`'s engine URI;
/// with `pass_env`, `env` directives keep the module's variables in the workers.
fn nginx_conf(dir: &Path, port: u16, cert: &Path, key: &str, pass_env: bool) -> String {
    let d = dir.display();
    let env = if pass_env {
        "env TPM_VAULT_SOCKET;\nenv TPM_VAULT_PKCS11_TOKEN_LABEL;\nenv TPM_VAULT_PKCS11_CONFIG;\n"
    } else {
        ""
    };
    format!(
        r#"daemon off;
master_process on;
worker_processes 2;
user nobody nogroup;
pid {d}/nginx.pid;
error_log {d}/error.log info;
{env}ssl_engine pkcs11;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port} ssl;
        server_name localhost;
        ssl_certificate {cert};
        ssl_certificate_key "engine:pkcs11:pkcs11:object={key};type=private";
        ssl_protocols TLSv1.3;
        ssl_session_cache off;
        ssl_session_tickets off;
        keepalive_timeout 0;
        location / {{ return 200 "$pid\n"; }}
    }}
}}
"#,
        cert = cert.display()
    )
}

/// One HTTPS request with curl (TLS 1.3, verified against `cert`): the answering worker's pid,
/// or the failure's description.
fn request(port: u16, cert: &Path) -> Result<u32, String> {
    let out = run(Command::new("curl")
        .args(["-sS", "--max-time", "30", "--tlsv1.3", "--resolve", &format!("localhost:{port}:127.0.0.1")])
        .arg("--cacert")
        .arg(cert)
        .arg(format!("https://localhost:{port}/")));
    if !out.status.success() {
        return Err(describe(&out));
    }
    stdout(&out).trim().parse().map_err(|e| format!("body {:?}: {e}", stdout(&out)))
}

/// `total` requests from `threads` concurrent clients: (pids that answered, failures).
fn hammer(port: u16, cert: &Path, threads: usize, total: usize) -> (BTreeSet<u32>, Vec<String>) {
    let pids = Arc::new(Mutex::new(BTreeSet::new()));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (pids, failures, next, cert) = (pids.clone(), failures.clone(), next.clone(), cert.to_owned());
            std::thread::spawn(move || {
                while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < total {
                    match request(port, &cert) {
                        Ok(pid) => {
                            pids.lock().expect("lock").insert(pid);
                        }
                        Err(e) => failures.lock().expect("lock").push(e),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("client thread");
    }
    let pids = pids.lock().expect("lock").clone();
    let failures = failures.lock().expect("lock").clone();
    (pids, failures)
}

/// The DER SPKI of the certificate nginx serves, read with `openssl s_client`.
fn served_spki(d: &Daemon, port: u16) -> Vec<u8> {
    let out = run_input(
        Command::new("openssl").env_remove("OPENSSL_CONF").args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            "localhost",
            "-tls1_3",
        ]),
        Some(b""),
    );
    let text = stdout(&out);
    let begin =
        text.find("-----BEGIN CERTIFICATE-----").unwrap_or_else(|| panic!("no certificate: {}", describe(&out)));
    let end = text.find("-----END CERTIFICATE-----").expect("end of certificate") + "-----END CERTIFICATE-----".len();
    let path = d.path().join("served.pem");
    std::fs::write(&path, format!("{}\n", &text[begin..end])).expect("write served.pem");
    spki_der_of(&path, "cert")
}

/// Prints nginx's error log (for failure messages).
fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
}

/// A running nginx (see [`nginx_conf`]) for `key` of `d`, with its cert, dir and port.
struct Nginx {
    proc: Proc,
    dir: PathBuf,
    port: u16,
    cert: PathBuf,
    out_log: PathBuf,
}

impl Nginx {
    fn start(d: &Daemon, key: &str, pass_env: bool) -> Nginx {
        let cert = d.self_sign(key);
        let dir = d.path().join("nginx");
        std::fs::create_dir_all(dir.join("tmp")).expect("nginx dir");
        let conf = dir.join("nginx.conf");
        let out_log = dir.join("nginx.out");
        let error_log = dir.join("error.log");
        let (proc, port) = support::serve_on_free_port("nginx", &out_log, &[&error_log], |port| {
            std::fs::write(&conf, nginx_conf(&dir, port, &cert, key, pass_env)).expect("nginx.conf");
            let mut cmd = Command::new("/usr/sbin/nginx");
            d.module_env(&mut cmd)
                .env("OPENSSL_CONF", d.openssl_conf())
                .arg("-c")
                .arg(&conf)
                .arg("-p")
                .arg(&dir)
                .arg("-e")
                .arg(&error_log);
            cmd
        });
        Nginx { proc, dir, port, cert, out_log }
    }

    /// `total` requests from `threads` clients, all of which must succeed; the pids that answered
    /// (never the master's).
    fn serve_all(&self, threads: usize, total: usize, when: &str, d: &Daemon) -> BTreeSet<u32> {
        let (pids, failures) = hammer(self.port, &self.cert, threads, total);
        assert!(
            failures.is_empty(),
            "{when}: {} of {total} handshakes failed; first: {}\n--- error.log ---\n{}\n--- daemon ---\n{}",
            failures.len(),
            failures[0],
            log_of(&self.dir),
            d.stderr()
        );
        assert!(!pids.contains(&self.proc.pid()), "{when}: the master answered requests");
        pids
    }

    /// nginx still runs and no worker died (a crashed worker is logged "exited on signal").
    fn assert_healthy(&mut self) {
        self.proc.assert_running(&self.out_log);
        let log = log_of(&self.dir);
        assert!(!log.contains("exited on signal"), "a worker crashed:\n{log}");
    }
}

#[test]
fn nginx_workers_serve_tls13_with_the_vault_key_across_a_daemon_restart() {
    let mut d = Daemon::start_with(&policy("web"), true);
    d.create_key("web", "ecc-p256");
    d.open_to_nobody();
    let mut nginx = Nginx::start(&d, "web", true);
    assert_eq!(
        served_spki(&d, nginx.port),
        spki_der_of(&d.public_pem("web"), "pub"),
        "nginx serves a certificate whose key is not the vault key"
    );
    let pids = nginx.serve_all(4, 200, "first 200", &d);
    assert!(pids.len() >= 2, "only worker(s) {pids:?} answered 200 requests");

    d.restart();
    d.open_to_nobody();
    let after = nginx.serve_all(2, 20, "after the daemon restart", &d);
    assert!(after.is_subset(&pids), "workers changed across the daemon restart: {pids:?} then {after:?}");
    nginx.assert_healthy();
    assert!(signs_by_workers(&d, "web") >= 1);
}

/// Without `env` directives nginx's workers run with an empty environment: the module must
/// keep the socket and label it read in the master, before the fork.
#[test]
fn nginx_workers_without_the_environment_keep_the_masters_settings() {
    let d = Daemon::start_with(&policy("noenv"), true);
    d.create_key("noenv", "ecc-p256");
    d.open_to_nobody();
    let mut nginx = Nginx::start(&d, "noenv", false);
    let pids = nginx.serve_all(4, 200, "workers without environment", &d);
    assert!(pids.len() >= 2, "only worker(s) {pids:?} answered 200 requests");
    nginx.assert_healthy();
    assert!(signs_by_workers(&d, "noenv") >= 1);
}
