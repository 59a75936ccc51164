//! TLS with vault keys, end to end over a real daemon and swtpm: CSRs that OpenSSL verifies,
//! chains issued by a test CA (rcgen, software key), `cert import` checks, the example HTTPS
//! server against `openssl s_client`, curl and rustls (X25519MLKEM768), 200 concurrent
//! handshakes on both runtime flavours, certificate rotation and an RSA-PSS key.

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use rcgen::{BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tpm_vault_client::tls::{self, SigningClient, VaultCertResolver, VaultSigningKey};
use tpm_vault_client::{CertSubject, ClientBuilder, KeyAlgorithm};

use support::{ok_text as ok, run_tool as run, Daemon, DaemonCli as _, ExampleServer};

/// A CA with a software P-256 key.
struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        TestCa { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// Issues a certificate from a PEM CSR (subject and SANs as requested).
    fn issue(&self, csr_pem: &str) -> String {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).unwrap();
        csr.signed_by(&self.issuer).unwrap().pem()
    }
}

/// `tpm-vault key create NAME --alg ALG`, then a CSR for CN=localhost issued by `ca` and
/// imported with the CA as chain. Returns the leaf PEM.
fn key_with_ca_cert(daemon: &Daemon, ca: &TestCa, name: &str, alg: &str) -> String {
    ok(&daemon.cli(&["key", "create", name, "--alg", alg]));
    let csr =
        ok(&daemon.cli(&["csr", name, "--subject", "CN=localhost,O=Example", "--san", "dns:localhost,ip:127.0.0.1"]));
    let leaf = ca.issue(&csr);
    let chain = daemon.dir.path().join(format!("{name}-chain.pem"));
    std::fs::write(&chain, format!("{leaf}{}", ca.pem)).unwrap();
    let out = ok(&daemon.cli(&["cert", "import", name, chain.to_str().unwrap()]));
    assert!(out.contains("chain of 2 certificate(s)"), "{out}");
    leaf
}

#[test]
fn csr_verifies_and_ca_issued_chain_is_checked_on_import() {
    let daemon = Daemon::start();
    let dir = daemon.dir.path();
    ok(&daemon.cli(&["key", "create", "device"]));
    let csr = ok(&daemon.cli(&[
        "csr",
        "device",
        "--subject",
        "CN=device-1,O=Example",
        "--san",
        "dns:device-1.example,ip:10.0.0.7",
        "--san",
        "uri:spiffe://example.org/device-1",
    ]));
    assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"), "{csr}");
    std::fs::write(dir.join("req.pem"), &csr).unwrap();
    let verify = run(Command::new("openssl")
        .close_inherited_fds()
        .args(["req", "-in", "req.pem", "-verify", "-noout"])
        .current_dir(dir));
    ok(&verify);
    assert!(String::from_utf8_lossy(&verify.stderr).contains("verify OK"), "{verify:?}");
    let text = ok(&run(Command::new("openssl")
        .close_inherited_fds()
        .args(["req", "-in", "req.pem", "-noout", "-text"])
        .current_dir(dir)));
    assert!(text.contains("CN = device-1, O = Example") || text.contains("CN=device-1, O=Example"), "{text}");
    assert!(text.contains("DNS:device-1.example") && text.contains("IP Address:10.0.0.7"), "{text}");
    assert!(text.contains("URI:spiffe://example.org/device-1"), "{text}");

    // A test CA issues the leaf; OpenSSL accepts it and its key is the vault key.
    let ca = TestCa::new("Test CA");
    let leaf = ca.issue(&csr);
    std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.join("leaf.pem"), &leaf).unwrap();
    let verified = ok(&run(Command::new("openssl")
        .close_inherited_fds()
        .args(["verify", "-CAfile", "ca.pem", "leaf.pem"])
        .current_dir(dir)));
    assert!(verified.contains("leaf.pem: OK"), "{verified}");
    let leaf_key = ok(&run(Command::new("openssl")
        .close_inherited_fds()
        .args(["x509", "-noout", "-pubkey", "-in", "leaf.pem"])
        .current_dir(dir)));
    let vault_key = ok(&daemon.cli(&["key", "public", "device"]));
    assert_eq!(leaf_key.trim(), vault_key.trim());

    // No certificate yet: NOT_FOUND (exit 3).
    assert_eq!(daemon.cli(&["cert", "show", "device"]).status.code(), Some(3));
    // Import: leaf then CA.
    std::fs::write(dir.join("chain.pem"), format!("{leaf}{}", ca.pem)).unwrap();
    ok(&daemon.cli(&["cert", "import", "device", "chain.pem"]));
    let shown = ok(&daemon.cli(&["cert", "show", "device"]));
    assert!(shown.contains("CN=device-1,O=Example") && shown.contains("CN=Test CA"), "{shown}");
    assert!(shown.contains("version:") && shown.contains(" 1"), "{shown}");
    let pem = ok(&daemon.cli(&["cert", "show", "device", "--pem"]));
    assert_eq!(pem.matches("BEGIN CERTIFICATE").count(), 2);
    let json = ok(&daemon.cli(&["--output", "json", "cert", "show", "device"]));
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["version"], 1);
    assert_eq!(value["certificates"][0]["subject"], "CN=device-1,O=Example");

    // Rejected: a leaf for another key, a chain in the wrong order, and not PEM at all.
    let other = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["device-1.example".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "device-1");
    let foreign = params.signed_by(&other, &ca.issuer).unwrap().pem();
    std::fs::write(dir.join("foreign.pem"), format!("{foreign}{}", ca.pem)).unwrap();
    let refused = daemon.cli(&["cert", "import", "device", "foreign.pem"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("public key is not this key's"), "{refused:?}");
    std::fs::write(dir.join("reversed.pem"), format!("{}{leaf}", ca.pem)).unwrap();
    assert_eq!(daemon.cli(&["cert", "import", "device", "reversed.pem"]).status.code(), Some(2));
    std::fs::write(dir.join("unordered.pem"), format!("{leaf}{}{}", ca.pem, TestCa::new("Other CA").pem)).unwrap();
    let unordered = daemon.cli(&["cert", "import", "device", "unordered.pem"]);
    assert!(String::from_utf8_lossy(&unordered.stderr).contains("not issued by"), "{unordered:?}");
    std::fs::write(dir.join("junk.pem"), "hello").unwrap();
    assert_eq!(daemon.cli(&["cert", "import", "device", "junk.pem"]).status.code(), Some(2));
    // The refused imports left the stored chain alone.
    let json = ok(&daemon.cli(&["--output", "json", "cert", "show", "device"]));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&json).unwrap()["version"], 1);

    // Self-signed: stored, version bumped, accepted by OpenSSL as its own anchor.
    let self_signed = ok(&daemon.cli(&["cert", "self-sign", "device", "--subject", "CN=device-1", "--days", "7"]));
    std::fs::write(dir.join("self.pem"), &self_signed).unwrap();
    let verified = ok(&run(Command::new("openssl")
        .close_inherited_fds()
        .args(["verify", "-CAfile", "self.pem", "self.pem"])
        .current_dir(dir)));
    assert!(verified.contains("OK"), "{verified}");
    let json = ok(&daemon.cli(&["--output", "json", "cert", "show", "device"]));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&json).unwrap()["version"], 2);
    let bad = daemon.cli(&["csr", "device", "--subject", "XX=nope"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}

fn roots(ca_pem: &str) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    roots
}

/// One HTTPS `GET /` with rustls; returns the response head line and the key-exchange group.
async fn https_get(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> std::io::Result<(String, String)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").expect("server name");
    let mut tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
    let group = tls.get_ref().1.negotiated_key_exchange_group().map(|g| format!("{:?}", g.name())).unwrap_or_default();
    tls.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").await?;
    let mut response = Vec::new();
    tls.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    Ok((text.lines().next().unwrap_or_default().to_owned(), group))
}

#[test]
fn example_server_speaks_to_openssl_curl_and_rustls() {
    let daemon = Daemon::start();
    let ca = TestCa::new("Test CA");
    key_with_ca_cert(&daemon, &ca, "web", "ecc-p256");
    let dir = daemon.dir.path();
    std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
    let mut server = ExampleServer::start(&daemon, "web", false);
    let addr = server.addr.to_string();

    let s_client = run(Command::new("openssl")
        .close_inherited_fds()
        .args(["s_client", "-connect", &addr, "-tls1_3", "-CAfile", "ca.pem", "-servername", "localhost"])
        .current_dir(dir));
    let text = String::from_utf8_lossy(&s_client.stdout);
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    assert!(text.contains("TLSv1.3"), "{text}");
    assert!(text.contains("CN = localhost, O = Example") || text.contains("CN=localhost, O=Example"), "{text}");

    let port = server.addr.port();
    let curl = ok(&run(Command::new("curl")
        .close_inherited_fds()
        .args(["-sS", "--cacert", "ca.pem", "-w", "\n%{http_code}", "--resolve"])
        .arg(format!("localhost:{port}:127.0.0.1"))
        .arg(format!("https://localhost:{port}/"))
        .current_dir(dir)));
    assert!(curl.ends_with("\n200"), "{curl}");
    assert!(curl.contains("TPM-resident"), "{curl}");

    let config = Arc::new(tls::client_config(roots(&ca.pem), None).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (status, group) = rt.block_on(https_get(server.addr, config)).unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(group, "X25519MLKEM768");
    server.assert_alive();
}

/// Opens `n` TLS connections at once against `server`, each doing a full handshake and a GET.
fn hammer(server: &mut ExampleServer, ca_pem: &str, n: usize) {
    let config = Arc::new(tls::client_config(roots(ca_pem), None).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let addr = server.addr;
    let started = Instant::now();
    let results = rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            let config = config.clone();
            tasks.spawn(async move { https_get(addr, config).await });
        }
        tokio::time::timeout(Duration::from_secs(180), async {
            let mut out = Vec::new();
            while let Some(r) = tasks.join_next().await {
                out.push(r.expect("client task"));
            }
            out
        })
        .await
        .expect("handshakes did not finish within 180 s: deadlock?")
    });
    let failed: Vec<_> = results.iter().filter(|r| !matches!(r, Ok((s, _)) if s == "HTTP/1.1 200 OK")).collect();
    assert!(failed.is_empty(), "{} of {n} failed, e.g. {:?}", failed.len(), failed.first());
    eprintln!("{n} concurrent handshakes in {:?}", started.elapsed());
    server.assert_alive();
}

#[test]
fn two_hundred_concurrent_handshakes_on_a_current_thread_runtime() {
    let daemon = Daemon::start();
    let ca = TestCa::new("Test CA");
    key_with_ca_cert(&daemon, &ca, "web", "ecc-p256");
    let mut server = ExampleServer::start(&daemon, "web", true);
    hammer(&mut server, &ca.pem, 200);
}

/// Through the TPM device model (issue #36: the kernel's resource manager, the Orin fTPM's
/// times at 1/50): concurrent handshakes all succeed.
#[test]
fn concurrent_handshakes_through_the_device_model() {
    let daemon = Daemon::start_modeled(0.02);
    let ca = TestCa::new("Test CA");
    key_with_ca_cert(&daemon, &ca, "web", "ecc-p256");
    let mut server = ExampleServer::start(&daemon, "web", false);
    hammer(&mut server, &ca.pem, 40);
    let space = daemon.space().stats();
    assert_eq!(space.failed, 0, "resource-manager failures: {}", space.tpm.describe(1));
}

#[test]
fn two_hundred_concurrent_handshakes_on_a_multi_thread_runtime() {
    let daemon = Daemon::start();
    let ca = TestCa::new("Test CA");
    key_with_ca_cert(&daemon, &ca, "web", "ecc-p256");
    let mut server = ExampleServer::start(&daemon, "web", false);
    hammer(&mut server, &ca.pem, 200);
}

/// An in-process tokio-rustls server on the test's runtime, serving `resolver`; answers each
/// connection with one line.
async fn serve_in_process(resolver: Arc<VaultCertResolver>) -> SocketAddr {
    let config = Arc::new(tls::server_config(resolver).unwrap());
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let mut buf = [0u8; 512];
                    let _ = tls.read(&mut buf).await;
                    let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    addr
}

/// Server and clients on one current-thread runtime, signing through the daemon: no deadlock,
/// and a rotated certificate is served without a restart.
#[test]
fn in_process_signing_on_a_current_thread_runtime_follows_rotation() {
    let daemon = Daemon::start();
    let ca = TestCa::new("Test CA");
    key_with_ca_cert(&daemon, &ca, "web", "ecc-p256");
    let signer = SigningClient::connect_blocking(ClientBuilder::new(&daemon.socket)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let resolver = Arc::new(VaultCertResolver::new(&signer, "web", Duration::from_millis(200)).await.unwrap());
        assert_eq!(resolver.version(), Some(1));
        let key = VaultSigningKey::new(&signer, "web").await.unwrap();
        let certified = tls::certified_key(&signer, "web").await.unwrap();
        assert!(certified.keys_match().is_ok());
        assert_eq!(
            rustls::sign::SigningKey::public_key(&key).map(|k| k.to_vec()),
            certified.key.public_key().map(|k| k.to_vec())
        );
        let addr = serve_in_process(resolver.clone()).await;
        let config = Arc::new(tls::client_config(roots(&ca.pem), None).unwrap());
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..20 {
            tasks.spawn(https_get(addr, config.clone()));
        }
        while let Some(r) = tasks.join_next().await {
            assert_eq!(r.unwrap().unwrap().0, "HTTP/1.1 200 OK");
        }

        // Rotate: a new leaf from a second CA. The resolver notices within its poll interval.
        let ca2 = TestCa::new("Second CA");
        let client = tpm_vault_client::Client::connect(&daemon.socket).await.unwrap();
        let csr = client
            .create_csr("web", &CertSubject::new("CN=localhost").with_sans("dns:localhost").unwrap())
            .await
            .unwrap();
        let chain = client.set_certificate("web", &format!("{}{}", ca2.issue(&csr), ca2.pem)).await.unwrap();
        assert_eq!(chain.version, 2);
        let deadline = Instant::now() + Duration::from_secs(20);
        while resolver.version() != Some(2) {
            assert!(Instant::now() < deadline, "rotation not picked up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let old = Arc::new(tls::client_config(roots(&ca.pem), None).unwrap());
        assert!(https_get(addr, old).await.is_err(), "the old CA must no longer verify the server");
        let new = Arc::new(tls::client_config(roots(&ca2.pem), None).unwrap());
        assert_eq!(https_get(addr, new).await.unwrap().0, "HTTP/1.1 200 OK");
    });
}

/// An RSA key signs TLS 1.3 handshakes with RSA-PSS through the daemon.
#[test]
fn rsa_keys_sign_handshakes_with_pss() {
    let daemon = Daemon::start();
    let ca = TestCa::new("Test CA");
    key_with_ca_cert(&daemon, &ca, "rsa", "rsa-2048");
    let signer = SigningClient::connect_blocking(ClientBuilder::new(&daemon.socket)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let key = VaultSigningKey::new(&signer, "rsa").await.unwrap();
        use rustls::sign::SigningKey as _;
        assert_eq!(key.algorithm(), rustls::SignatureAlgorithm::RSA);
        assert!(key.choose_scheme(&[rustls::SignatureScheme::RSA_PKCS1_SHA256]).is_none());
        let signer_for = key.choose_scheme(&[rustls::SignatureScheme::RSA_PSS_SHA256]).unwrap();
        assert_eq!(signer_for.scheme(), rustls::SignatureScheme::RSA_PSS_SHA256);
        let resolver = Arc::new(VaultCertResolver::new(&signer, "rsa", Duration::ZERO).await.unwrap());
        let addr = serve_in_process(resolver).await;
        let config = Arc::new(tls::client_config(roots(&ca.pem), None).unwrap());
        assert_eq!(https_get(addr, config).await.unwrap().0, "HTTP/1.1 200 OK");
    });
    let client_alg = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { daemon.client().await.public_key("rsa").await.unwrap().algorithm });
    assert_eq!(client_alg, KeyAlgorithm::Rsa2048);
}
