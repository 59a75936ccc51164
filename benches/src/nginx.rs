//! nginx 1.22 serving TLS 1.3 for the PKCS#11 phase ([`crate::p11`]): a config in a scratch
//! directory (`daemon off`, pid, logs and temp paths in the directory, `user root` when the
//! benchmark runs as root, `ssl_protocols TLSv1.3`, `return 200 "ok\n"`), listening on a free
//! loopback port, with the server key in a file or behind libp11's OpenSSL engine (loaded from an
//! `OPENSSL_CONF` file whose engine section sets `MODULE_PATH` to the PKCS#11 module). The
//! server is stopped by its PID (SIGTERM to the master, then SIGKILL) when its guard drops.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use anyhow::{bail, Context as _, Result};

/// Debian's nginx binary.
pub const NGINX: &str = "/usr/sbin/nginx";
/// Longest wait for nginx to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Tries with a fresh port when another process took the one picked.
const PORT_TRIES: usize = 5;

/// Where the server key comes from.
#[derive(Debug, Clone)]
pub enum Key {
    /// A PEM key file.
    File(PathBuf),
    /// A libp11 engine URI (`pkcs11:...`), loaded through `openssl_conf`; `ssl_engine` says
    /// whether the config also carries `ssl_engine pkcs11;` (tpm2-pkcs11 fails with it).
    Engine { uri: String, openssl_conf: PathBuf, ssl_engine: bool },
}

/// How nginx runs its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// `master_process on; worker_processes N;` (workers forked from the master).
    Forked(usize),
    /// `master_process off;`: one process, no fork.
    Single,
}

/// One nginx configuration.
#[derive(Debug, Clone)]
pub struct Conf {
    /// Scratch directory (config, pid, logs, temp paths).
    pub dir: PathBuf,
    /// Certificate (PEM).
    pub cert: PathBuf,
    /// Server key.
    pub key: Key,
    /// Worker model.
    pub workers: Workers,
    /// Environment of nginx, each also kept for its workers with an `env` directive.
    pub env: Vec<(String, String)>,
}

/// The `nginx.conf` text of `conf` on `port`.
fn text(conf: &Conf, port: u16) -> String {
    let d = conf.dir.display();
    let workers = match conf.workers {
        Workers::Forked(n) => format!("master_process on;\nworker_processes {n};\n"),
        Workers::Single => "master_process off;\n".to_owned(),
    };
    let user = if nix::unistd::geteuid().is_root() { "user root;\n" } else { "" };
    let env: String = conf.env.iter().map(|(k, _)| format!("env {k};\n")).collect();
    let (engine, key) = match &conf.key {
        Key::File(path) => (String::new(), path.display().to_string()),
        Key::Engine { uri, ssl_engine, .. } => {
            ((if *ssl_engine { "ssl_engine pkcs11;\n" } else { "" }).to_owned(), format!("engine:pkcs11:{uri}"))
        }
    };
    format!(
        "daemon off;\n{workers}{user}pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n{env}{engine}\
         events {{ worker_connections 1024; }}\nhttp {{\n    access_log off;\n\
         \x20   client_body_temp_path {d}/tmp/body;\n    proxy_temp_path {d}/tmp/proxy;\n\
         \x20   fastcgi_temp_path {d}/tmp/fastcgi;\n    uwsgi_temp_path {d}/tmp/uwsgi;\n\
         \x20   scgi_temp_path {d}/tmp/scgi;\n    server {{\n        listen 127.0.0.1:{port} ssl;\n\
         \x20       server_name localhost;\n        ssl_certificate {cert};\n\
         \x20       ssl_certificate_key \"{key}\";\n        ssl_protocols TLSv1.3;\n\
         \x20       location / {{ return 200 \"ok\\n\"; }}\n    }}\n}}\n",
        cert = conf.cert.display()
    )
}

/// A running nginx, stopped on drop.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Nginx {
    /// Writes the config and starts nginx on a free loopback port (another try with a new port
    /// if that one was taken meanwhile); returns once the port accepts.
    ///
    /// # Errors
    /// When nginx exits during start or does not listen in time (with its error log).
    pub fn start(conf: &Conf) -> Result<Self> {
        std::fs::create_dir_all(conf.dir.join("tmp")).with_context(|| format!("{}", conf.dir.display()))?;
        let (file, log, out) = (conf.dir.join("nginx.conf"), conf.dir.join("error.log"), conf.dir.join("nginx.out"));
        for attempt in 1..=PORT_TRIES {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            std::fs::write(&file, text(conf, port)).with_context(|| format!("{}", file.display()))?;
            let stdout = File::create(&out)?;
            let mut cmd = Command::new(NGINX);
            cmd.close_inherited_fds();
            cmd.arg("-c").arg(&file).arg("-p").arg(&conf.dir).arg("-e").arg(&log);
            cmd.env_remove("OPENSSL_CONF").stdin(Stdio::null()).stdout(stdout.try_clone()?).stderr(stdout);
            if let Key::Engine { openssl_conf, .. } = &conf.key {
                cmd.env("OPENSSL_CONF", openssl_conf);
            }
            cmd.envs(conf.env.iter().map(|(k, v)| (k, v)));
            let child = cmd.spawn().context("starting nginx")?;
            let mut nginx = Self { child, addr: SocketAddr::from(([127, 0, 0, 1], port)) };
            let started = Instant::now();
            loop {
                if let Some(status) = nginx.child.try_wait()? {
                    let text = logs(&[&log, &out]);
                    if attempt < PORT_TRIES && text.contains("in use") {
                        break;
                    }
                    bail!("nginx exited during start ({status}): {}", text.trim());
                }
                if TcpStream::connect(nginx.addr).is_ok() {
                    return Ok(nginx);
                }
                if started.elapsed() > START_TIMEOUT {
                    bail!("nginx did not listen within {START_TIMEOUT:?}: {}", logs(&[&log, &out]).trim());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        bail!("nginx found no free port in {PORT_TRIES} tries")
    }
}

/// The text of `paths`, joined.
fn logs(paths: &[&Path]) -> String {
    paths.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: fast shutdown, the master stops its workers.
        crate::tls_peers::stop_child(&mut self.child, Duration::from_secs(10));
    }
}

/// An `OPENSSL_CONF` file at `path` loading libp11's engine (`engine`) with `module`; with
/// `init` false the engine is initialised later (by `ssl_engine pkcs11;`), else on loading.
///
/// # Errors
/// When it cannot be written.
pub fn openssl_conf(path: &Path, engine: &Path, module: &Path, init: bool) -> Result<PathBuf> {
    let text = format!(
        "openssl_conf = openssl_init\n\n[openssl_init]\nengines = engine_section\n\n\
         [engine_section]\npkcs11 = pkcs11_section\n\n[pkcs11_section]\nengine_id = pkcs11\n\
         dynamic_path = {}\nMODULE_PATH = {}\ninit = {}\n",
        engine.display(),
        module.display(),
        u8::from(init)
    );
    std::fs::write(path, text).with_context(|| format!("{}", path.display()))?;
    Ok(path.to_owned())
}

/// libp11's engine (`pkcs11.so` in OpenSSL's ENGINESDIR), if installed.
pub fn engine_path() -> Option<PathBuf> {
    let out = Command::new("openssl").close_inherited_fds().args(["version", "-e"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let dir = text.split_once("ENGINESDIR:")?.1.trim().trim_matches('"').to_owned();
    Some(Path::new(&dir).join("pkcs11.so")).filter(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_the_chosen_workers_key_and_env() {
        let conf = Conf {
            dir: "/t".into(),
            cert: "/t/c.pem".into(),
            key: Key::Engine {
                uri: "pkcs11:object=k;type=private".into(),
                openssl_conf: "/t/o".into(),
                ssl_engine: true,
            },
            workers: Workers::Forked(2),
            env: vec![("TPM_VAULT_SOCKET".into(), "/s".into())],
        };
        let t = text(&conf, 4433);
        for want in [
            "master_process on;\nworker_processes 2;",
            "env TPM_VAULT_SOCKET;",
            "ssl_engine pkcs11;",
            "ssl_certificate_key \"engine:pkcs11:pkcs11:object=k;type=private\";",
            "listen 127.0.0.1:4433 ssl;",
            "return 200 \"ok\\n\";",
        ] {
            assert!(t.contains(want), "{want} not in:\n{t}");
        }
        let t = text(&Conf { workers: Workers::Single, key: Key::File("/t/k.pem".into()), ..conf }, 1);
        assert!(t.contains("master_process off;") && !t.contains("ssl_engine") && t.contains("\"/t/k.pem\""), "{t}");
    }
}
