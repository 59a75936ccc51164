//! `tpm-vault cert enroll` / `cert renew` against the real Pebble (Let's Encrypt's ACME test
//! server), started per test on free loopback ports with its own config, its own listener
//! certificate (from a test CA) and `pebble-challtestsrv` as its DNS server (every name
//! resolves to 127.0.0.1, TXT records are set through its management API). Pebble validates
//! for real: http-01 on the port the test passes as `httpPort`, tls-alpn-01 on `tlsPort`,
//! dns-01 through challtestsrv. No test uses `PEBBLE_VA_ALWAYS_VALID`. Pebble never answers
//! `rateLimited`, so that one answer comes from a stand-in CA (the last test).

mod support;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tempfile::TempDir;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use support::{free_port, ok_text as ok, run_tool as run, Daemon, DaemonCli as _, ExampleServer};

/// Pebble and its DNS server, killed on drop.
struct Pebble {
    dir: TempDir,
    pebble: Child,
    dns: Child,
    /// `https://127.0.0.1:PORT/dir`.
    directory: String,
    management: u16,
    /// The test CA that issued Pebble's listener certificate: `--ca-bundle`.
    ca_bundle: PathBuf,
    /// Where Pebble connects for http-01 and tls-alpn-01.
    http_port: u16,
    tls_port: u16,
    /// challtestsrv's management API (`/set-txt`).
    dns_management: u16,
}

impl Pebble {
    /// Pebble issuing certificates valid for `validity_secs`, with `env` set (e.g.
    /// `PEBBLE_WFE_NONCEREJECT`); names under `blocked.test` are refused.
    fn start(env: &[(&str, &str)], validity_secs: u64) -> Pebble {
        Pebble::start_with(env, validity_secs, serde_json::json!({}))
    }

    /// As [`Pebble::start`], with more settings of Pebble's config (`extra`'s members).
    fn start_with(env: &[(&str, &str)], validity_secs: u64, extra: serde_json::Value) -> Pebble {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_bundle = listener_tls(dir.path());
        let (listen, management, http_port, tls_port) = (free_port(), free_port(), free_port(), free_port());
        let (dns_port, dns_management) = (free_port(), free_port());
        let mut config = serde_json::json!({ "pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": dir.path().join("cert.pem"),
            "privateKey": dir.path().join("key.pem"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "domainBlocklist": ["blocked.test"],
            "certificateValidityPeriod": validity_secs,
        }});
        for (key, value) in extra.as_object().into_iter().flatten() {
            config["pebble"][key] = value.clone();
        }
        let config_path = dir.path().join("pebble.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let dns = Command::new("pebble-challtestsrv")
            .close_inherited_fds()
            .args(["-dns01", &format!("127.0.0.1:{dns_port}"), "-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-management", &format!("127.0.0.1:{dns_management}"), "-defaultIPv4", "127.0.0.1"])
            .args(["-defaultIPv6", ""])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pebble-challtestsrv");
        let pebble = Command::new("pebble")
            .close_inherited_fds()
            .arg("-config")
            .arg(&config_path)
            .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pebble");
        let pebble = Pebble {
            directory: format!("https://127.0.0.1:{listen}/dir"),
            dir,
            pebble,
            dns,
            management,
            ca_bundle,
            http_port,
            tls_port,
            dns_management,
        };
        for port in [listen, management, dns_management] {
            wait_for_port(port);
        }
        pebble
    }

    /// Pebble's root CA, fetched from its management interface.
    fn root(&self) -> String {
        let out = run(Command::new("curl")
            .args(["-sSf", "--cacert"])
            .arg(&self.ca_bundle)
            .arg(format!("https://127.0.0.1:{}/roots/0", self.management)));
        ok(&out)
    }

    /// `--acme DIR --ca-bundle PEM --acme-state FILE`, the options every command here shares.
    fn args(&self) -> Vec<String> {
        vec!["--acme-state".into(), self.dir.path().join("state.json").to_string_lossy().into_owned()]
    }

    fn enroll_args(&self, name: &str, domain: &str) -> Vec<String> {
        let mut args: Vec<String> =
            vec!["cert".into(), "enroll".into(), name.into(), "--acme".into(), self.directory.clone()];
        args.extend(["--domain".into(), domain.into(), "--ca-bundle".into()]);
        args.push(self.ca_bundle.to_string_lossy().into_owned());
        args.extend(["--http-listen".into(), format!("127.0.0.1:{}", self.http_port)]);
        args.extend(self.args());
        args
    }
}

impl Pebble {
    /// Stops Pebble and its DNS server (the temp dir, with the state file, stays).
    fn stop(&mut self) {
        for child in [&mut self.pebble, &mut self.dns] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTPS certificate for localhost and 127.0.0.1 (`DIR/cert.pem`, `DIR/key.pem`) from a
/// fresh test CA, whose certificate (`DIR/listener-ca.pem`, returned) is the `--ca-bundle`.
fn listener_tls(dir: &Path) -> PathBuf {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, "ACME listener test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let ca_bundle = dir.join("listener-ca.pem");
    std::fs::write(&ca_bundle, ca_cert.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), leaf_key.serialize_pem()).unwrap();
    ca_bundle
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn cli(daemon: &Daemon, args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    daemon.cli(&args)
}

/// The first PEM certificate of `text`.
fn first_cert(text: &str) -> String {
    let start = text.find("-----BEGIN CERTIFICATE-----").expect("a certificate");
    let end = text[start..].find("-----END CERTIFICATE-----").expect("its end") + start + 25;
    format!("{}\n", &text[start..end])
}

/// The subject alternative names of the leaf stored with `key`, as `openssl x509` prints them.
fn leaf_sans(daemon: &Daemon, key: &str) -> String {
    let leaf = first_cert(&ok(&daemon.cli(&["cert", "show", key, "--pem"])));
    let path = daemon.dir.path().join(format!("{key}-leaf.pem"));
    std::fs::write(&path, leaf).unwrap();
    ok(&run(Command::new("openssl").args(["x509", "-noout", "-ext", "subjectAltName", "-in"]).arg(&path)))
}

/// `openssl x509 -pubkey` of a PEM certificate.
fn cert_pubkey(dir: &Path, cert_pem: &str) -> String {
    let path = dir.join("cert-for-pubkey.pem");
    std::fs::write(&path, cert_pem).unwrap();
    ok(&run(Command::new("openssl").args(["x509", "-noout", "-pubkey", "-in"]).arg(&path)))
}

/// The leaf `openssl s_client` is served by `addr` for `name`, verified against `root`.
fn served_leaf(addr: std::net::SocketAddr, name: &str, root: &Path) -> String {
    let out = run(Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-servername", name, "-verify_return_error"])
        .args(["-verify_hostname", name, "-CAfile"])
        .arg(root));
    let text = ok(&out);
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    first_cert(&text)
}

#[test]
fn enroll_serves_a_verified_chain_and_renew_replaces_it_live_then_rotates_the_key() {
    let daemon = Daemon::start();
    let mut pebble = Pebble::start(&[], 3600);
    let dir = daemon.dir.path();
    let out = ok(&cli(&daemon, &pebble.enroll_args("web", "web.test")));
    assert!(out.starts_with("web: enrolled, key web, chain version 1"), "{out}");

    // The leaf certifies the vault key; the chain verifies against Pebble's root.
    let chain = ok(&daemon.cli(&["cert", "show", "web", "--pem"]));
    let leaf = first_cert(&chain);
    assert_eq!(cert_pubkey(dir, &leaf), ok(&daemon.cli(&["key", "public", "web"])));
    let root = dir.join("pebble-root.pem");
    std::fs::write(&root, pebble.root()).unwrap();
    std::fs::write(dir.join("chain.pem"), &chain).unwrap();
    std::fs::write(dir.join("leaf.pem"), &leaf).unwrap();
    let verified = ok(&run(Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(&root)
        .arg("-untrusted")
        .arg(dir.join("chain.pem"))
        .arg(dir.join("leaf.pem"))));
    assert!(verified.trim_end().ends_with(": OK"), "{verified}");
    // The account key is a vault key and its URL is remembered.
    ok(&daemon.cli(&["key", "show", "acme-account"]));
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pebble.dir.path().join("state.json")).unwrap()).unwrap();
    let account = state["accounts"][0]["url"].as_str().unwrap_or_default();
    assert!(account.starts_with(&pebble.directory.replace("/dir", "/")), "{state}");

    // The example server serves that chain.
    let mut server = ExampleServer::start(&daemon, "web", false);
    assert_eq!(served_leaf(server.addr, "web.test", &root), leaf);

    // One hour of validity: not due by the default rule (a third of the lifetime)...
    let mut renew = vec!["cert".to_owned(), "renew".to_owned(), "web".to_owned()];
    renew.extend(pebble.args());
    let out = ok(&cli(&daemon, &renew));
    assert!(out.contains("web: not due") && out.contains("a third of its lifetime"), "{out}");
    assert_eq!(ok(&daemon.cli(&["cert", "show", "web", "--pem"])), chain);
    // ...but within --before 1 day: replaced, and served by the running server.
    let mut renew_now = renew.clone();
    renew_now.extend(["--before".to_owned(), "1".to_owned()]);
    let out = ok(&cli(&daemon, &renew_now));
    assert!(out.starts_with("web: renewed, key web, chain version 2"), "{out}");
    let renewed = first_cert(&ok(&daemon.cli(&["cert", "show", "web", "--pem"])));
    assert_ne!(renewed, leaf);
    assert_eq!(cert_pubkey(dir, &renewed), cert_pubkey(dir, &leaf), "same key");
    let deadline = Instant::now() + Duration::from_secs(15);
    while served_leaf(server.addr, "web.test", &root) != renewed {
        server.assert_alive();
        assert!(Instant::now() < deadline, "the running server did not pick up the renewed certificate");
        std::thread::sleep(Duration::from_millis(200));
    }

    // --new-key: a new vault key web.2 gets the certificate; web is kept.
    let mut rotate = renew_now.clone();
    rotate.push("--new-key".to_owned());
    let out = ok(&cli(&daemon, &rotate));
    assert!(out.starts_with("web: renewed with a new key, key web.2, chain version 1"), "{out}");
    assert!(out.contains("previous key web kept"), "{out}");
    let rotated = first_cert(&ok(&daemon.cli(&["cert", "show", "web.2", "--pem"])));
    assert_eq!(cert_pubkey(dir, &rotated), ok(&daemon.cli(&["key", "public", "web.2"])));
    assert_ne!(cert_pubkey(dir, &rotated), cert_pubkey(dir, &leaf));
    assert_eq!(first_cert(&ok(&daemon.cli(&["cert", "show", "web", "--pem"]))), renewed, "old key untouched");
    // The enrollment follows the new key; --all renews it (JSON output for programs).
    let mut all =
        vec!["--output".to_owned(), "json".to_owned(), "cert".to_owned(), "renew".to_owned(), "--all".to_owned()];
    all.extend(pebble.args());
    let json: serde_json::Value = serde_json::from_str(&ok(&cli(&daemon, &all))).unwrap();
    assert_eq!(json["certificates"][0]["key"], "web.2");
    assert_eq!(json["certificates"][0]["result"], "not due");

    // The CA gone: a certificate that is not due is no failure; one that is due fails, kept.
    pebble.stop();
    let out = ok(&cli(&daemon, &renew));
    assert!(out.contains("web: not due") && out.contains("not reached"), "{out}");
    let stderr = support::fails(&cli(&daemon, &renew_now), 11);
    assert!(stderr.contains("cannot connect"), "{stderr}");
    assert_eq!(first_cert(&ok(&daemon.cli(&["cert", "show", "web.2", "--pem"]))), rotated);
}

#[test]
fn ca_faults_are_reported_in_the_cas_words_and_leave_the_chain_alone() {
    let daemon = Daemon::start();
    let pebble = Pebble::start(&[], 3600);
    ok(&daemon.cli(&["key", "create", "web"]));
    ok(&daemon.cli(&["cert", "self-sign", "web", "--subject", "CN=before"]));
    let before = ok(&daemon.cli(&["cert", "show", "web", "--pem"]));

    // An identifier the CA refuses.
    let out = cli(&daemon, &pebble.enroll_args("web", "www.blocked.test"));
    let stderr = support::fails(&out, 11);
    assert!(stderr.contains("rejectedIdentifier"), "{stderr}");
    assert!(stderr.contains("www.blocked.test"), "the CA's own detail: {stderr}");
    assert_eq!(ok(&daemon.cli(&["cert", "show", "web", "--pem"])), before);

    // Validation failing: another web server holds the port Pebble checks and answers 404.
    let mut squatter = Command::new("python3")
        .close_inherited_fds()
        .args(["-m", "http.server", &pebble.http_port.to_string(), "--bind", "127.0.0.1", "--directory"])
        .arg(pebble.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    wait_for_port(pebble.http_port);
    let mut args = pebble.enroll_args("web", "web.test");
    let at = args.iter().position(|a| a == "--http-listen").unwrap() + 1;
    args[at] = format!("127.0.0.1:{}", free_port());
    let out = cli(&daemon, &args);
    let _ = squatter.kill();
    let _ = squatter.wait();
    let stderr = support::fails(&out, 11);
    assert!(stderr.contains("the CA refused: unauthorized") && stderr.contains("404"), "{stderr}");
    assert_eq!(ok(&daemon.cli(&["cert", "show", "web", "--pem"])), before);

    // A directory nobody serves.
    let mut args = pebble.enroll_args("web", "web.test");
    let at = args.iter().position(|a| a == "--acme").unwrap() + 1;
    args[at] = format!("https://127.0.0.1:{}/dir", free_port());
    let stderr = support::fails(&cli(&daemon, &args), 11);
    assert!(stderr.contains("cannot connect") && stderr.contains("refused"), "{stderr}");
    assert_eq!(ok(&daemon.cli(&["cert", "show", "web", "--pem"])), before);

    // Enrolling needs `admin` on the key.
    let limited = Daemon::start_with_policy(&format!(
        "[[rule]]\nname = \"no-admin\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"create\", \"sign\", \"public\"]\n",
        nix::unistd::getuid().as_raw()
    ));
    let stderr = support::fails(&cli(&limited, &pebble.enroll_args("web", "web.test")), 5);
    assert!(stderr.contains("`admin`"), "{stderr}");
}

#[test]
fn bad_nonces_are_retried_and_a_ca_rejecting_all_is_a_clear_error() {
    let daemon = Daemon::start();
    // Half of all nonces rejected: every request is retried until one passes.
    let flaky = Pebble::start(&[("PEBBLE_WFE_NONCEREJECT", "50")], 3600);
    let out = ok(&cli(&daemon, &flaky.enroll_args("web", "web.test")));
    assert!(out.starts_with("web: enrolled"), "{out}");
    let chain = ok(&daemon.cli(&["cert", "show", "web", "--pem"]));
    drop(flaky);

    // Every nonce rejected: a clear error, the chain kept.
    let hostile = Pebble::start(&[("PEBBLE_WFE_NONCEREJECT", "100")], 3600);
    let stderr = support::fails(&cli(&daemon, &hostile.enroll_args("web", "web.test")), 11);
    assert!(stderr.contains("badNonce"), "{stderr}");
    assert_eq!(ok(&daemon.cli(&["cert", "show", "web", "--pem"])), chain);
}

#[test]
fn tls_alpn_01_and_dns_01_are_validated_by_pebble() {
    let daemon = Daemon::start();
    let pebble = Pebble::start(&[], 3600);
    let mut args = pebble.enroll_args("alpn", "alpn.test");
    args.extend(["--challenge".into(), "tls-alpn-01".into(), "--tls-listen".into()]);
    args.push(format!("127.0.0.1:{}", pebble.tls_port));
    let out = ok(&cli(&daemon, &args));
    assert!(out.starts_with("alpn: enrolled"), "{out}");

    // dns-01: the hook publishes the TXT record in challtestsrv, which Pebble asks.
    let hook = format!(
        "f() {{ if [ \"$1\" = add ]; then p=set-txt; else p=clear-txt; fi; curl -sSf -d \"{{\\\"host\\\":\\\"$2.\\\",\\\"value\\\":\\\"$3\\\"}}\" http://127.0.0.1:{}/$p; }}; f",
        pebble.dns_management
    );
    let mut args = pebble.enroll_args("dns", "dns.test");
    args.extend(["--challenge".into(), "dns-01".into(), "--dns-hook".into(), hook.clone()]);
    let out = ok(&cli(&daemon, &args));
    assert!(out.starts_with("dns: enrolled"), "{out}");
    let sans = leaf_sans(&daemon, "dns");
    assert!(sans.contains("DNS:dns.test"), "{sans}");

    // A wildcard with its base name: the CA's identifiers, checked against the order (issue
    // #31 item 7), reach the hook as the two record names, nothing else.
    let calls = pebble.dir.path().join("hook-calls");
    let logging = format!("g() {{ echo \"$1 $2\" >> {}; {hook} \"$@\"; }}; g", calls.display());
    let mut args = pebble.enroll_args("wild", "*.wild.test");
    args.extend(["--domain".into(), "wild.test".into()]);
    args.extend(["--challenge".into(), "dns-01".into(), "--dns-hook".into(), logging]);
    let out = ok(&cli(&daemon, &args));
    assert!(out.starts_with("wild: enrolled"), "{out}");
    let sans = leaf_sans(&daemon, "wild");
    assert!(sans.contains("DNS:*.wild.test") && sans.contains("DNS:wild.test"), "{sans}");
    let calls = std::fs::read_to_string(calls).unwrap();
    let mut names: Vec<&str> = calls.lines().filter_map(|l| l.strip_prefix("add ")).collect();
    names.sort_unstable();
    assert_eq!(names, ["_acme-challenge.wild.test", "_acme-challenge.wild.test"], "{calls}");
}

#[test]
fn external_account_binding_and_ip_identifiers() {
    let daemon = Daemon::start();
    // Base64url, as CAs hand EAB keys out.
    let hmac = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";
    let pebble = Pebble::start_with(
        &[],
        3600,
        serde_json::json!({ "externalAccountBindingRequired": true, "externalAccountMACKeys": { "kid-1": hmac } }),
    );
    // Without a binding the CA refuses the account.
    let stderr = support::fails(&cli(&daemon, &pebble.enroll_args("web", "web.test")), 11);
    assert!(stderr.contains("externalAccountRequired"), "{stderr}");
    // A wrong key is refused by the CA, which checks the binding's HMAC over the vault key's JWK.
    let with_eab = |text: &str| {
        let file = daemon.dir.path().join("eab.key");
        std::fs::write(&file, text).unwrap();
        let mut args = pebble.enroll_args("web", "web.test");
        args.extend(["--eab-kid".into(), "kid-1".into(), "--eab-hmac-file".into()]);
        args.push(file.to_string_lossy().into_owned());
        args
    };
    let stderr = support::fails(&cli(&daemon, &with_eab("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n")), 11);
    assert!(stderr.contains("the CA refused"), "{stderr}");
    // The right one, and an IP address beside the name (validated by http-01 on 127.0.0.1).
    let mut args = with_eab(&format!("{hmac}\n"));
    args.extend(["--ip".into(), "127.0.0.1".into()]);
    let out = ok(&cli(&daemon, &args));
    assert!(out.starts_with("web: enrolled"), "{out}");
    let sans = leaf_sans(&daemon, "web");
    assert!(sans.contains("DNS:web.test") && sans.contains("IP Address:127.0.0.1"), "{sans}");
}

/// Pebble never rate-limits, so a stand-in CA on loopback answers `newAccount` with what
/// Let's Encrypt sends when it does: 429, a `rateLimited` problem document and `Retry-After`.
/// What is checked is this client's handling of that answer, not a CA's behaviour.
#[test]
fn rate_limited_is_reported_with_the_cas_detail_and_retry_after() {
    use http_body_util::Full;
    use hyper::body::{Bytes, Incoming};
    use rustls::pki_types::pem::PemObject as _;

    let daemon = Daemon::start();
    let dir = tempfile::tempdir().unwrap();
    let ca_bundle = listener_tls(dir.path());
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(dir.path().join("cert.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(dir.path().join("key.pem")).unwrap();
    let config =
        rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(tpm_vault_client::tls::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let directory = format!("{base}/dir");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let served = base.clone();
    runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let (acceptor, base) = (acceptor.clone(), served.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let base = base.clone();
                    async move {
                        let response = hyper::Response::builder();
                        let response = match req.uri().path() {
                            "/dir" => response.body(Full::new(Bytes::from(
                                serde_json::json!({
                                    "newNonce": format!("{base}/nonce"),
                                    "newAccount": format!("{base}/acct"),
                                    "newOrder": format!("{base}/order"),
                                })
                                .to_string(),
                            ))),
                            "/nonce" => response.header("replay-nonce", "bm9uY2U").body(Full::default()),
                            _ => response
                                .status(429)
                                .header("content-type", "application/problem+json")
                                .header("retry-after", "120")
                                .header("replay-nonce", "bm9uY2UtMg")
                                .body(Full::new(Bytes::from(
                                    serde_json::json!({
                                        "type": "urn:ietf:params:acme:error:rateLimited",
                                        "detail": "too many new registrations (10) from this IP address in the last 3h0m0s",
                                        "status": 429,
                                    })
                                    .to_string(),
                                ))),
                        };
                        Ok::<_, std::convert::Infallible>(response.unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    let state = dir.path().join("state.json");
    let out = daemon.cli(&[
        "cert",
        "enroll",
        "web",
        "--acme",
        &directory,
        "--domain",
        "web.test",
        "--ca-bundle",
        ca_bundle.to_str().unwrap(),
        "--acme-state",
        state.to_str().unwrap(),
    ]);
    let stderr = support::fails(&out, 11);
    assert_eq!(
        stderr,
        "tpm-vault: the CA refused: rateLimited: too many new registrations (10) from this IP address in the last \
         3h0m0s (retry after 120)"
    );
    let missing = daemon.cli(&["cert", "show", "web"]);
    assert_eq!(missing.status.code(), Some(3), "no chain was stored");
}
