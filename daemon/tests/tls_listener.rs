//! The daemon's gRPC-over-TLS listener (`--listen`): server key in the TPM, client
//! certificates required, client certificate subjects (or SPIFFE IDs) matched by access
//! policies; plus the certificate operations of the vault it relies on.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, PublicKeyData, SanType, SignatureAlgorithm,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use spki::der::Decode as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tpm_vault_daemon::daemon::AuditLog;
use tpm_vault_daemon::daemon::Ctx;
use tpm_vault_daemon::daemon::Metrics;
use tpm_vault_daemon::daemon::{self, TlsListener};
use tpm_vault_daemon::daemon::{Access, Policy};
use tpm_vault_daemon::model::{HashAlg, KeyAlg, KeyName, Scheme, SignInput};
use tpm_vault_daemon::{Error, Vault};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::key_service_client::KeyServiceClient;

use support::{key, TpmEnv};

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

    /// A client certificate (software key) for `subject` attributes, with optional URI SAN.
    fn client(&self, attrs: &[(DnType, &str)], uri: Option<&str>) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (ty, value) in attrs {
            params.distinguished_name.push(ty.clone(), *value);
        }
        if let Some(uri) = uri {
            params.subject_alt_names.push(SanType::URI(uri.try_into().unwrap()));
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.der().clone(), PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
    }
}

/// A vault key's public half, for a CA to certify.
struct VaultPublic(Vec<u8>);

impl PublicKeyData for VaultPublic {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

async fn server_leaf(vault: &Vault, name: &KeyName, ca: &TestCa) -> String {
    let (_, spki) = vault.public_key(name).await.unwrap();
    let raw = spki::SubjectPublicKeyInfoRef::from_der(&spki).unwrap().subject_public_key.raw_bytes().to_vec();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "tpm-vaultd");
    params.signed_by(&VaultPublic(raw), &ca.issuer).unwrap().pem()
}

fn client_config(
    server_ca: &TestCa,
    cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::pem::PemObject::from_pem_slice(server_ca.pem.as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(daemon::provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match cert {
        Some((c, k)) => builder.with_client_auth_cert(vec![c], k).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(config).connect(name, tcp).await
}

async fn channel(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let config = config.clone();
            async move { tls_connect(addr, config).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
}

async fn sign(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    name: &str,
) -> Result<pb::SignResponse, tonic::Status> {
    let channel = channel(addr, config).await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let request = pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Message(b"over TLS".to_vec())),
        ..Default::default()
    };
    KeyServiceClient::new(channel).sign(request).await.map(tonic::Response::into_inner)
}

/// A daemon with the Unix socket and the TLS listener, in this test's runtime.
struct TlsDaemon {
    env: TpmEnv,
    vault: Vault,
    addr: SocketAddr,
    server_ca: TestCa,
    client_ca: TestCa,
    listener_key: KeyName,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsDaemon {
    async fn start() -> TlsDaemon {
        Self::start_with(None).await
    }

    /// With `partner`, a second CA in the client CA file, and `CN=agent-1,O=Example` pinned to
    /// the first (`listen_client_ca_pins`).
    async fn start_with(partner: Option<&TestCa>) -> TlsDaemon {
        let env = TpmEnv::start();
        let vault = env.vault().await;
        let uid = nix::unistd::getuid().as_raw();
        let listener_key = key("listener");
        for k in ["listener", "svc"] {
            vault.create_key(key(k), KeyAlg::EccP256, uid, None, None).await.unwrap();
        }
        let server_ca = TestCa::new("Server CA");
        let client_ca = TestCa::new("Client CA");
        let leaf = server_leaf(&vault, &listener_key, &server_ca).await;
        vault.set_certificate(&listener_key, &format!("{leaf}{}", server_ca.pem)).await.unwrap();
        let ca_path = env.path().join("client-ca.pem");
        std::fs::write(&ca_path, format!("{}{}", client_ca.pem, partner.map_or("", |p| p.pem.as_str()))).unwrap();
        let team_ca_path = env.path().join("team-ca.pem");
        std::fs::write(&team_ca_path, &client_ca.pem).unwrap();
        let pins = match partner {
            Some(_) => {
                vec![(team_ca_path, vec!["CN=agent-1,O=Example".to_owned(), "spiffe://example.org/*".to_owned()])]
            }
            None => Vec::new(),
        };

        let policy_text = format!(
            "[[rule]]\nname = \"self\"\nclients = [\"uid:{uid}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n\n\
             [[rule]]\nname = \"agent-1\"\nclients = [\"cert:CN=agent-1,O=Example\"]\nkeys = [\"svc\"]\n\
             operations = [\"sign\", \"public\"]\n\n\
             [[rule]]\nname = \"partner-1\"\nclients = [\"cert:CN=partner-1,O=Example\"]\nkeys = [\"svc\"]\n\
             operations = [\"sign\"]\n\n\
             [[rule]]\nname = \"spiffe\"\nclients = [\"cert:spiffe://example.org/agent-3\"]\nkeys = [\"svc\"]\n\
             operations = [\"sign\"]\n\n\
             [[rule]]\nname = \"own\"\nclients = [\"any\"]\nkeys = [\"own-*\"]\n\
             operations = [\"create\", \"sign\", \"public\", \"delete\"]\nowner_only = true\n"
        );
        let mut policy = Policy::default();
        policy.add_file(std::path::Path::new("tls.toml"), &policy_text).unwrap();
        let access = Arc::new(Access::with_policy(policy, AuditLog::tracing_only()));

        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let tls =
            TlsListener::bind(&vault, addr, &listener_key, &ca_path).await.unwrap().with_pins(&pins).await.unwrap();
        let addr = tls.local_addr().unwrap();
        let unix = tpm_vault_daemon::daemon::bind_unix(&env.path().join("vault.sock")).unwrap();
        let unix = tokio::net::UnixListener::from_std(unix).unwrap();
        let ctx = Ctx::new(vault.clone(), Arc::new(Metrics::default()), access);
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stop_rx.await;
            };
            tpm_vault_daemon::daemon::serve_ctx_with_tls(
                ctx,
                unix,
                Some(tls),
                shutdown,
                Duration::from_secs(5),
                &Default::default(),
            )
            .await
            .unwrap();
        });
        TlsDaemon { env, vault, addr, server_ca, client_ca, listener_key, stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        if let Err(e) = self.task.await {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        self.vault.shutdown(Duration::from_secs(5)).await;
        drop(self.env);
    }
}

fn agent(ca: &TestCa, cn: &str) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    ca.client(&[(DnType::CommonName, cn), (DnType::OrganizationName, "Example")], None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_and_matched_by_policy() {
    let d = TlsDaemon::start().await;

    // Allowed by the cert:CN=agent-1,O=Example rule: Sign works, and the signature verifies.
    let allowed = client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-1")));
    let out = sign(d.addr, allowed.clone(), "svc").await.unwrap();
    let valid = d
        .vault
        .verify(
            &key("svc"),
            SignInput::Message(b"over TLS".to_vec()),
            &out.signature,
            Some(HashAlg::Sha256),
            Some(Scheme::Ecdsa),
        )
        .await
        .unwrap();
    assert!(valid);
    // ... but only sign and public on svc.
    let channel = channel(d.addr, allowed).await.unwrap();
    let err = KeyServiceClient::new(channel)
        .create_key(pb::CreateKeyRequest { name: "new".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("CN=agent-1,O=Example"), "{err:?}");

    // A valid certificate the policy does not name: PERMISSION_DENIED.
    let other = client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-2")));
    assert_eq!(sign(d.addr, other, "svc").await.unwrap_err().code(), Code::PermissionDenied);

    // A SPIFFE ID in a URI SAN is the identity, whatever the subject.
    let spiffe = d.client_ca.client(&[(DnType::CommonName, "whatever")], Some("spiffe://example.org/agent-3"));
    sign(d.addr, client_config(&d.server_ca, Some(spiffe)), "svc").await.unwrap();

    // No client certificate: the handshake fails (TLS 1.3 reports it on the first read).
    let anonymous = client_config(&d.server_ca, None);
    let failed = async {
        let mut tls = tls_connect(d.addr, anonymous.clone()).await?;
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        let mut buf = [0u8; 64];
        let n = tls.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed"));
        }
        Ok(n)
    }
    .await;
    let err = failed.expect_err("a client without a certificate must not get through");
    assert!(err.to_string().to_lowercase().contains("certificate") || err.to_string() == "closed", "{err}");
    assert!(sign(d.addr, anonymous, "svc").await.is_err());

    // A certificate from a CA the listener does not trust.
    let stranger = TestCa::new("Client CA");
    assert!(sign(d.addr, client_config(&d.server_ca, Some(agent(&stranger, "agent-1"))), "svc").await.is_err());

    // The Unix socket still serves alongside.
    let unix = Endpoint::from_static("http://tpm-vaultd")
        .connect_with_connector(tower::service_fn({
            let path = d.env.path().join("vault.sock");
            move |_| {
                let path = path.clone();
                async move { tokio::net::UnixStream::connect(path).await.map(hyper_util::rt::TokioIo::new) }
            }
        }))
        .await
        .unwrap();
    let key_info =
        KeyServiceClient::new(unix).get_key(pb::GetKeyRequest { name: "svc".into() }).await.unwrap().into_inner();
    assert_eq!(key_info.name, "svc");

    // A new server certificate is served from the next handshake on, without a restart.
    let new_leaf = server_leaf(&d.vault, &d.listener_key, &d.server_ca).await;
    let stored = d.vault.set_certificate(&d.listener_key, &new_leaf).await.unwrap();
    assert_eq!(stored.version, 2);
    let tls = tls_connect(d.addr, client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-1")))).await.unwrap();
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let expected: CertificateDer<'static> =
        rustls::pki_types::pem::PemObject::from_pem_slice(new_leaf.as_bytes()).unwrap();
    assert_eq!(served, expected);
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    drop(tls);
    d.stop().await;
}

/// A key created over TLS belongs to the certificate identity that created it: owner-only rules
/// let that certificate (and no other, nor any local uid) use it, and the record says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_created_over_tls_belong_to_the_certificate() {
    let d = TlsDaemon::start().await;
    let agent1 = channel(d.addr, client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-1")))).await.unwrap();
    let agent2 = channel(d.addr, client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-2")))).await.unwrap();
    let create = pb::CreateKeyRequest { name: "own-agent".into(), ..Default::default() };
    let created = KeyServiceClient::new(agent1.clone()).create_key(create).await.unwrap().into_inner();
    // The creator signs with it; another certificate may not.
    sign(d.addr, client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-1"))), "own-agent").await.unwrap();
    assert_eq!(created.owner_uid, u32::MAX, "no uid owns it");
    let e = sign(d.addr, client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-2"))), "own-agent").await;
    assert_eq!(e.unwrap_err().code(), Code::PermissionDenied);
    let get = pb::GetKeyRequest { name: "own-agent".into() };
    assert_eq!(KeyServiceClient::new(agent2.clone()).get_key(get).await.unwrap_err().code(), Code::PermissionDenied);
    // The record names the certificate.
    let record = std::fs::read_to_string(d.env.state_dir().join("keys/own-agent.key")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["owner_certificate"], "CN=agent-1,O=Example");
    assert_eq!(record["owner_uid"], u32::MAX);
    // A key agent-2 creates is agent-2's, and agent-1 cannot delete it.
    let create = pb::CreateKeyRequest { name: "own-other".into(), ..Default::default() };
    KeyServiceClient::new(agent2).create_key(create).await.unwrap();
    let delete = pb::DeleteKeyRequest { name: "own-other".into() };
    let e = KeyServiceClient::new(agent1.clone()).delete_key(delete).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // The creator lists only its own.
    let list = KeyServiceClient::new(agent1.clone()).list_keys(pb::ListKeysRequest::default()).await.unwrap();
    assert_eq!(list.into_inner().keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["own-agent", "svc"]);
    let delete = pb::DeleteKeyRequest { name: "own-agent".into() };
    KeyServiceClient::new(agent1).delete_key(delete).await.unwrap();
    d.stop().await;
}

/// The in-process TPM signer on a current-thread runtime: a plain wait for the TPM actor.
#[tokio::test(flavor = "current_thread")]
async fn listener_works_on_a_current_thread_runtime() {
    let d = TlsDaemon::start().await;
    let allowed = client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-1")));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let config = allowed.clone();
        let addr = d.addr;
        tasks.spawn(async move { sign(addr, config, "svc").await });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    d.stop().await;
}

#[tokio::test]
async fn certificate_operations_check_the_key_and_the_chain() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let (a, b) = (key("a"), key("b"));
    for k in [&a, &b] {
        vault.create_key(k.clone(), KeyAlg::EccP256, 0, None, None).await.unwrap();
    }
    assert!(matches!(vault.certificate(&a).await, Err(Error::NoCertificate(_))));
    assert!(matches!(vault.certificate(&key("none")).await, Err(Error::KeyNotFound(_))));
    let ca = TestCa::new("CA");
    let leaf_a = server_leaf(&vault, &a, &ca).await;
    // b's chain cannot start with a's certificate.
    assert!(matches!(vault.set_certificate(&b, &leaf_a).await, Err(Error::InvalidArgument(_))));
    assert!(matches!(vault.set_certificate(&a, "garbage").await, Err(Error::InvalidArgument(_))));
    let first = vault.set_certificate(&a, &format!("{leaf_a}{}", ca.pem)).await.unwrap();
    assert_eq!(first.version, 1);
    assert_eq!(first.chain_pem.matches("BEGIN CERTIFICATE").count(), 2);
    // Versions survive a reopen (they are in the record).
    vault.shutdown(Duration::from_secs(5)).await;
    let vault = env.vault().await;
    assert_eq!(vault.certificate(&a).await.unwrap(), first);
    let second = vault.set_certificate(&a, &leaf_a).await.unwrap();
    assert_eq!(second.version, 2);
    // The TLS identity of a client certificate: subject in certificate order, or SPIFFE ID.
    let (cert, _) = ca.client(&[(DnType::CommonName, "agent-1"), (DnType::OrganizationName, "Example, Inc.")], None);
    assert_eq!(daemon::client_identity(&cert).as_deref(), Some("CN=agent-1,O=Example\\, Inc."));
    let (cert, _) = ca.client(&[(DnType::CommonName, "x")], Some("spiffe://example.org/a"));
    assert_eq!(daemon::client_identity(&cert).as_deref(), Some("spiffe://example.org/a"));
    assert_eq!(daemon::client_identity(b"junk"), None);
    vault.shutdown(Duration::from_secs(5)).await;
}

/// The real binary: `--listen` with a key that has no certificate stops the daemon at start,
/// naming the key, before anything is bound.
#[test]
fn daemon_refuses_to_listen_without_a_certificate() {
    let env = support::ProcEnv::new();
    let ca = env.tpm.path().join("client-ca.pem");
    std::fs::write(&ca, TestCa::new("CA").pem).unwrap();
    let mut cmd = env.command();
    cmd.args(["--listen", "127.0.0.1:0", "--listen-key", "nokey", "--listen-client-ca"]).arg(&ca);
    let mut child = support::KillOnDrop(cmd.spawn().unwrap());
    let status = support::wait_exit(&mut child.0, Duration::from_secs(60));
    let stderr = env.stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("TLS listener key nokey"), "{stderr}");
    assert!(!env.socket.exists(), "nothing may be bound");
}

/// Runs `call` for at most 5 s; whether it succeeded, and how long it took.
async fn timed<T>(what: &str, call: impl std::future::Future<Output = Result<T, tonic::Status>>) -> (bool, Duration) {
    let start = std::time::Instant::now();
    let ok = matches!(tokio::time::timeout(Duration::from_secs(5), call).await, Ok(Ok(_)));
    let took = start.elapsed();
    eprintln!("{what}: {} in {took:?}", if ok { "ok" } else { "FAILED" });
    (ok, took)
}

/// Whether the peer still holds `stream` open: nothing to read yet (or data, such as the
/// server's HTTP/2 settings) rather than end of file or an error.
async fn still_open<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> bool {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(Duration::from_millis(20), stream.read(&mut buf)).await {
        Err(_) => true,
        Ok(Ok(n)) => n > 0,
        Ok(Err(_)) => false,
    }
}

/// The real binary with `RLIMIT_NOFILE` 256 (soft and hard, so raising it cannot help) and a
/// TLS listener: clients with a certificate hold every TLS connection the daemon lets them,
/// then 512 more TCP connections that never start a handshake are opened and held, and
/// meanwhile a Unix-socket client (connected before, and a new one after) signs and creates a
/// key (a store write) within 1 s each. Before the bounds were fitted into the limit the daemon
/// took 512 TLS connections and ran out of descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_flood_leaves_descriptors_for_the_unix_socket_and_the_store() {
    use tpm_vault_daemon::harness::CloseInheritedFds as _;
    const LIMIT: u64 = 256;
    let mut env = support::ProcEnv::new();
    let uid = nix::unistd::getuid().as_raw();
    let (server_ca, client_ca) = (TestCa::new("Server CA"), TestCa::new("Client CA"));
    {
        let vault = env.tpm.vault().await;
        for k in ["listener", "svc"] {
            vault.create_key(key(k), KeyAlg::EccP256, uid, None, None).await.unwrap();
        }
        let leaf = server_leaf(&vault, &key("listener"), &server_ca).await;
        vault.set_certificate(&key("listener"), &format!("{leaf}{}", server_ca.pem)).await.unwrap();
        vault.shutdown(Duration::from_secs(5)).await;
    }
    let ca_path = env.tpm.path().join("client-ca.pem");
    std::fs::write(&ca_path, &client_ca.pem).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut cmd = std::process::Command::new("prlimit");
    cmd.close_inherited_fds();
    cmd.arg(format!("--nofile={LIMIT}:{LIMIT}")).arg("--").arg(env!("CARGO_BIN_EXE_tpm-vaultd")).args(env.args());
    cmd.args(["--listen", &addr.to_string(), "--listen-key", "listener", "--listen-client-ca"]).arg(&ca_path);
    env.child_env(&mut cmd);
    let _child = support::KillOnDrop(cmd.spawn().unwrap());
    assert!(env.wait_note("READY=1", Duration::from_secs(60)), "no READY=1; stderr:\n{}", env.stderr());
    let stderr = env.stderr();
    assert!(stderr.contains("RLIMIT_NOFILE 256 (hard limit 256)"), "{stderr}");
    assert!(
        stderr.contains("in force 176 on the Unix socket (per client 128), 16 on the TLS listener"),
        "the WARN naming the bounds in force: {stderr}"
    );
    let mut before = env.keys().await;

    // Clients with a certificate: every connection they can get, kept.
    let config = client_config(&server_ca, Some(agent(&client_ca, "flood")));
    let mut tls = Vec::new();
    for _ in 0..LIMIT {
        if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(5), tls_connect(addr, config.clone())).await {
            tls.push(stream);
        }
    }
    // Then TCP connections that never send a byte.
    let mut tcp = Vec::new();
    for _ in 0..2 * LIMIT {
        let connect = tokio::net::TcpStream::connect(addr);
        if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(200), connect).await {
            tcp.push(stream);
        }
    }
    let mut tls_open = 0;
    for stream in &mut tls {
        tls_open += usize::from(still_open(stream).await);
    }
    let mut tcp_open = 0;
    for stream in &mut tcp {
        tcp_open += usize::from(still_open(stream).await);
    }

    let unix = || {
        let endpoint = Endpoint::from_shared(format!("unix://{}", env.socket.display())).unwrap();
        async move { endpoint.connect().await.ok().map(KeyServiceClient::new) }
    };
    let create = |name: &str| pb::CreateKeyRequest { name: name.into(), ..Default::default() };
    let results = [
        timed("sign on a connection opened before the flood", before.sign(support::sign_request("svc"))).await,
        timed("create a key on it", before.create_key(create("during-flood-1"))).await,
        timed("connect anew and sign", async {
            let mut keys = unix().await.ok_or_else(|| tonic::Status::unavailable("connect"))?;
            keys.sign(support::sign_request("svc")).await
        })
        .await,
        timed("connect anew and create a key", async {
            let mut keys = unix().await.ok_or_else(|| tonic::Status::unavailable("connect"))?;
            keys.create_key(create("during-flood-2")).await
        })
        .await,
    ];
    eprintln!(
        "held: {tls_open} of {} TLS connections with a certificate, {tcp_open} of {} idle TCP connections",
        tls.len(),
        tcp.len()
    );
    for (ok, took) in results {
        assert!(ok && took < Duration::from_secs(1), "{results:?}; daemon stderr:\n{}", env.stderr());
    }
    assert!(tls_open <= 16, "TLS connections past the bound in force: {tls_open}");
    drop((tls, tcp));
}

/// Issue #31, item 7: with two CAs in the client CA file, either could issue a certificate for
/// any identity. `CN=agent-1,O=Example` (and every SPIFFE ID) is pinned to the team CA: a
/// certificate for it from the partner CA is refused after the handshake, while the partner CA
/// still vouches for the identities no pin names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_identity_is_only_accepted_from_its_ca() {
    let partner = TestCa::new("Partner CA");
    let d = TlsDaemon::start_with(Some(&partner)).await;
    // The team CA's agent-1 signs, as before.
    sign(d.addr, client_config(&d.server_ca, Some(agent(&d.client_ca, "agent-1"))), "svc").await.unwrap();
    // The partner CA's certificate for its own identity works too.
    sign(d.addr, client_config(&d.server_ca, Some(agent(&partner, "partner-1"))), "svc").await.unwrap();
    // The partner CA claiming agent-1, or a pinned SPIFFE ID: refused (the connection closes).
    let forged = sign(d.addr, client_config(&d.server_ca, Some(agent(&partner, "agent-1"))), "svc").await;
    assert!(forged.is_err(), "a partner-issued agent-1 certificate got through: {forged:?}");
    assert_ne!(forged.unwrap_err().code(), Code::Ok);
    let spiffe = partner.client(&[(DnType::CommonName, "whatever")], Some("spiffe://example.org/agent-3"));
    assert!(sign(d.addr, client_config(&d.server_ca, Some(spiffe)), "svc").await.is_err());
    // The team CA's SPIFFE ID still works.
    let spiffe = d.client_ca.client(&[(DnType::CommonName, "whatever")], Some("spiffe://example.org/agent-3"));
    sign(d.addr, client_config(&d.server_ca, Some(spiffe)), "svc").await.unwrap();
    d.stop().await;
}
