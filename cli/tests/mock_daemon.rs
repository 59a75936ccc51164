//! The client and the `tpm-vault` binary against a scripted stand-in for the daemon.
//!
//! The stand-in serves the real `tpmvault.v1` services on a temporary Unix socket, from its own
//! thread and runtime (so blocking and async clients, and the binary, can all use it). It checks
//! the wire side of the client: request fields, paging, client-side hashing of large messages,
//! error statuses. It says nothing about TPM behaviour; the daemon's own tests do.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use sha2::Digest as _;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};
use tpm_vault_client::proto::key_service_server::{KeyService, KeyServiceServer};
use tpm_vault_client::proto::status_service_server::{StatusService, StatusServiceServer};
use tpm_vault_client::proto::{self, sign_request, verify_request};
use tpm_vault_client::{
    BlockingClient, Client, HashAlgorithm, KeyAlgorithm, PcrBinding, SignInput, SignOptions, SignatureScheme, TpmState,
};

/// Keys the stand-in lists: more than two pages of 1000.
const LISTED_KEYS: usize = 2_345;

/// What the stand-in remembers of the requests it got.
#[derive(Debug, Default)]
struct Seen {
    create: Option<proto::CreateKeyRequest>,
    sign: Option<proto::SignRequest>,
    list_pages: Vec<(u32, String)>,
    deleted: Vec<String>,
}

#[derive(Debug, Default)]
struct Mock {
    seen: Mutex<Seen>,
    /// How many keys `ListKeys` reports (`usize::MAX`: it pages forever).
    key_count: usize,
    /// `ListKeys` answers pages without keys (but with a next page).
    empty_pages: bool,
}

fn key(name: &str, algorithm: KeyAlgorithm) -> proto::Key {
    proto::Key {
        name: name.to_owned(),
        algorithm: algorithm.into(),
        tpm_name: "000b".to_owned() + &"ab".repeat(32),
        created_unix: 1_764_481_740,
        pcr_binding: None,
        owner_uid: 1000,
        has_auth: false,
        usages: vec![],
    }
}

/// Keys named `p384*` are P-384, `rsa*` RSA-2048, the rest P-256; `missing*` do not exist.
fn lookup(name: &str) -> Result<proto::Key, Status> {
    if name.starts_with("missing") {
        return Err(Status::not_found(format!("key {name:?} not found")));
    }
    let algorithm = if name.starts_with("p384") {
        KeyAlgorithm::EccP384
    } else if name.starts_with("rsa") {
        KeyAlgorithm::Rsa2048
    } else {
        KeyAlgorithm::EccP256
    };
    Ok(key(name, algorithm))
}

/// The stand-in "signature": the hash name, a colon and the digest it signed.
fn fake_signature(hash: HashAlgorithm, digest: &[u8]) -> Vec<u8> {
    let mut out = format!("{hash:?}:").into_bytes();
    out.extend_from_slice(digest);
    out
}

fn digest_of(hash: HashAlgorithm, message: &[u8]) -> Vec<u8> {
    match hash {
        HashAlgorithm::Sha384 => sha2::Sha384::digest(message).to_vec(),
        _ => sha2::Sha256::digest(message).to_vec(),
    }
}

fn natural(name: &str, hash: HashAlgorithm) -> Result<HashAlgorithm, Status> {
    Ok(match hash {
        HashAlgorithm::Unspecified if lookup(name)?.algorithm() == KeyAlgorithm::EccP384 => HashAlgorithm::Sha384,
        HashAlgorithm::Unspecified => HashAlgorithm::Sha256,
        other => other,
    })
}

#[tonic::async_trait]
impl KeyService for Mock {
    async fn create_key(&self, request: Request<proto::CreateKeyRequest>) -> Result<Response<proto::Key>, Status> {
        let request = request.into_inner();
        if request.name == "taken" {
            return Err(Status::already_exists("key \"taken\" already exists"));
        }
        let mut created = key(&request.name, request.algorithm());
        created.pcr_binding = request.pcr_binding.clone();
        self.seen.lock().unwrap().create = Some(request);
        Ok(Response::new(created))
    }

    async fn get_key(&self, request: Request<proto::GetKeyRequest>) -> Result<Response<proto::Key>, Status> {
        lookup(&request.into_inner().name).map(Response::new)
    }

    async fn set_key_usage(&self, request: Request<proto::SetKeyUsageRequest>) -> Result<Response<proto::Key>, Status> {
        let request = request.into_inner();
        let mut key = lookup(&request.name)?;
        key.usages = request.usages;
        Ok(Response::new(key))
    }

    async fn list_keys(
        &self,
        request: Request<proto::ListKeysRequest>,
    ) -> Result<Response<proto::ListKeysResponse>, Status> {
        let request = request.into_inner();
        self.seen.lock().unwrap().list_pages.push((request.page_size, request.page_token.clone()));
        let start: usize =
            if request.page_token.is_empty() { 0 } else { request.page_token.trim_start_matches("k").parse().unwrap() };
        let end = (start + request.page_size as usize).min(self.key_count);
        let keys = if self.empty_pages {
            Vec::new()
        } else {
            (start..end).map(|i| key(&format!("k{i:05}"), KeyAlgorithm::EccP256)).collect()
        };
        let next_page_token = if end < self.key_count { format!("k{end:05}") } else { String::new() };
        Ok(Response::new(proto::ListKeysResponse { keys, next_page_token }))
    }

    async fn delete_key(
        &self,
        request: Request<proto::DeleteKeyRequest>,
    ) -> Result<Response<proto::DeleteKeyResponse>, Status> {
        let name = request.into_inner().name;
        lookup(&name)?;
        self.seen.lock().unwrap().deleted.push(name);
        Ok(Response::new(proto::DeleteKeyResponse {}))
    }

    async fn get_public_key(
        &self,
        request: Request<proto::GetPublicKeyRequest>,
    ) -> Result<Response<proto::PublicKey>, Status> {
        let key = lookup(&request.into_inner().name)?;
        Ok(Response::new(proto::PublicKey {
            der: vec![0x30, 0x59, 0x30, 0x13],
            pem: "-----BEGIN PUBLIC KEY-----\nMFkwEw==\n-----END PUBLIC KEY-----".to_owned(),
            algorithm: key.algorithm,
            ..Default::default()
        }))
    }

    async fn sign(&self, request: Request<proto::SignRequest>) -> Result<Response<proto::SignResponse>, Status> {
        let request = request.into_inner();
        let hash = natural(&request.name, request.hash())?;
        let digest = match &request.input {
            Some(sign_request::Input::Message(m)) => digest_of(hash, m),
            Some(sign_request::Input::Digest(d)) => d.clone(),
            None => return Err(Status::invalid_argument("no input")),
        };
        if digest.len() != digest_of(hash, b"").len() {
            return Err(Status::invalid_argument(format!(
                "digest has {} bytes, {hash:?} needs {}",
                digest.len(),
                digest_of(hash, b"").len()
            )));
        }
        let scheme = match request.scheme() {
            SignatureScheme::Unspecified => SignatureScheme::Ecdsa,
            other => other,
        };
        self.seen.lock().unwrap().sign = Some(request);
        Ok(Response::new(proto::SignResponse {
            signature: fake_signature(hash, &digest),
            scheme: scheme.into(),
            hash: hash.into(),
        }))
    }

    async fn verify(&self, request: Request<proto::VerifyRequest>) -> Result<Response<proto::VerifyResponse>, Status> {
        let request = request.into_inner();
        let hash = natural(&request.name, request.hash())?;
        let digest = match &request.input {
            Some(verify_request::Input::Message(m)) => digest_of(hash, m),
            Some(verify_request::Input::Digest(d)) => d.clone(),
            None => return Err(Status::invalid_argument("no input")),
        };
        Ok(Response::new(proto::VerifyResponse { valid: request.signature == fake_signature(hash, &digest) }))
    }

    async fn create_csr(
        &self,
        _request: Request<proto::CreateCsrRequest>,
    ) -> Result<Response<proto::CreateCsrResponse>, Status> {
        Err(Status::unimplemented("not in the mock"))
    }

    async fn set_certificate(
        &self,
        _request: Request<proto::SetCertificateRequest>,
    ) -> Result<Response<proto::CertificateChain>, Status> {
        Err(Status::unimplemented("not in the mock"))
    }

    async fn get_certificate(
        &self,
        _request: Request<proto::GetCertificateRequest>,
    ) -> Result<Response<proto::CertificateChain>, Status> {
        Err(Status::unimplemented("not in the mock"))
    }

    async fn create_self_signed_certificate(
        &self,
        _request: Request<proto::CreateSelfSignedCertificateRequest>,
    ) -> Result<Response<proto::CertificateChain>, Status> {
        Err(Status::unimplemented("not in the mock"))
    }

    async fn decapsulate(
        &self,
        _request: Request<proto::DecapsulateRequest>,
    ) -> Result<Response<proto::DecapsulateResponse>, Status> {
        Err(Status::unimplemented("not in the mock"))
    }
}

#[tonic::async_trait]
impl StatusService for Mock {
    async fn get_status(&self, _request: Request<proto::GetStatusRequest>) -> Result<Response<proto::Status>, Status> {
        Ok(Response::new(proto::Status {
            version: "0.1.0".into(),
            tcti: "swtpm:host=127.0.0.1,port=2321".into(),
            simulator: true,
            tpm_state: TpmState::Ready.into(),
            tpm_manufacturer: "IBM".into(),
            tpm_vendor: "SW   TPM".into(),
            software_tpm: true,
            software_tpm_reason: "TCTI swtpm: (swtpm's TCP protocol)".into(),
            tpm_reconnects: 2,
            policy_rules: 0,
            policy_source: "/etc/tpm-vault/policies (1 file(s))".into(),
            key_count: self.key_count as u64,
            uptime_seconds: 3_725,
            metrics: vec![proto::Metric { name: "rpc/Sign".into(), count: 10, errors: 1, p50_us: 800, p99_us: 2_500 }],
            ..Default::default()
        }))
    }

    async fn check_access(
        &self,
        _request: Request<proto::CheckAccessRequest>,
    ) -> Result<Response<proto::CheckAccessResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

/// A running stand-in; stops when dropped.
struct MockDaemon {
    mock: Arc<Mock>,
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl MockDaemon {
    fn start(key_count: usize) -> MockDaemon {
        MockDaemon::start_with(Mock { key_count, ..Mock::default() })
    }

    fn start_with(mock: Mock) -> MockDaemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("vault.sock");
        let mock = Arc::new(mock);
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let mock = Arc::clone(&mock);
            let socket = socket.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                runtime.block_on(async move {
                    let listener = UnixListener::bind(&socket).unwrap();
                    ready_tx.send(()).unwrap();
                    let serve = tonic::transport::Server::builder()
                        .add_service(KeyServiceServer::from_arc(Arc::clone(&mock)))
                        .add_service(StatusServiceServer::from_arc(mock))
                        .serve_with_incoming(UnixListenerStream::new(listener));
                    // Not a graceful shutdown: a client on the test's (blocked) runtime could
                    // never close its connection. Dropping the runtime ends every connection.
                    tokio::select! {
                        result = serve => result.unwrap(),
                        _ = stopped => {}
                    }
                });
            })
        };
        ready_rx.recv().unwrap();
        MockDaemon { mock, socket, stop: Some(stop), thread: Some(thread), _dir: dir }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.mock.seen.lock().unwrap()
    }

    /// Runs the `tpm-vault` binary against this daemon.
    fn cli(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        run_cli(&self.socket, args, stdin)
    }
}

impl Drop for MockDaemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run_cli(socket: &Path, args: &[&str], stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    use std::process::Stdio;

    let mut child = Command::new(env!("CARGO_BIN_EXE_tpm-vault"))
        .close_inherited_fds()
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("TPM_VAULT_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(stdin) = stdin {
        pipe.write_all(stdin).unwrap();
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

// ---- library ----

#[tokio::test]
async fn create_key_sends_algorithm_and_binding() {
    let daemon = MockDaemon::start(0);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let binding: PcrBinding = "sha256:9,10".parse().unwrap();
    let key = client.create_key("disk", KeyAlgorithm::Rsa3072, Some(binding.clone())).await.unwrap();
    assert_eq!(key.name, "disk");
    assert_eq!(key.algorithm, KeyAlgorithm::Rsa3072);
    assert_eq!(key.pcr_binding, Some(binding));
    let seen = daemon.seen();
    let request = seen.create.as_ref().unwrap();
    assert_eq!(request.algorithm(), KeyAlgorithm::Rsa3072);
    assert_eq!(request.pcr_binding.as_ref().unwrap().pcrs, [9, 10]);
    assert!(request.auth.is_empty());
}

#[tokio::test]
async fn errors_carry_code_and_message() {
    let daemon = MockDaemon::start(0);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let err = client.key("missing").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.to_string(), "key \"missing\" not found");
    let err = client.create_key("taken", KeyAlgorithm::Unspecified, None).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
}

#[tokio::test]
async fn list_keys_follows_pages() {
    let daemon = MockDaemon::start(LISTED_KEYS);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let keys = client.list_keys().await.unwrap();
    assert_eq!(keys.len(), LISTED_KEYS);
    assert_eq!(keys[0].name, "k00000");
    assert_eq!(keys[LISTED_KEYS - 1].name, format!("k{:05}", LISTED_KEYS - 1));
    let pages = &daemon.seen().list_pages;
    assert_eq!(pages, &[(1000, String::new()), (1000, "k01000".to_owned()), (1000, "k02000".to_owned())]);
}

/// A daemon (or a process posing as one on a planted socket, issue #31) that pages forever
/// gets an error once the pages or their bytes pass the client's bounds, not the caller's memory.
#[tokio::test]
async fn list_keys_stops_a_daemon_that_pages_forever() {
    let daemon = MockDaemon::start(usize::MAX);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let err = client.list_keys().await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert!(err.to_string().contains("bytes"), "{err}");
    let pages = daemon.seen().list_pages.len();
    assert!(pages < tpm_vault_client::MAX_LIST_PAGES, "{pages} pages read");
    drop(daemon);

    let daemon = MockDaemon::start_with(Mock { key_count: usize::MAX, empty_pages: true, ..Mock::default() });
    let client = Client::connect(&daemon.socket).await.unwrap();
    let err = client.list_keys().await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert!(err.to_string().contains("pages"), "{err}");
    assert_eq!(daemon.seen().list_pages.len(), tpm_vault_client::MAX_LIST_PAGES);
}

#[tokio::test]
async fn small_messages_are_sent_whole() {
    let daemon = MockDaemon::start(0);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let signature = client.sign("web", SignInput::Message(b"hello".to_vec()), &SignOptions::new()).await.unwrap();
    assert_eq!(signature.hash(), HashAlgorithm::Sha256);
    assert_eq!(signature.scheme(), SignatureScheme::Ecdsa);
    assert!(matches!(daemon.seen().sign.as_ref().unwrap().input, Some(sign_request::Input::Message(_))));
    let options = SignOptions::new();
    assert!(client.verify("web", SignInput::Message(b"hello".to_vec()), signature.bytes(), &options).await.unwrap());
    assert!(!client.verify("web", SignInput::Message(b"hellO".to_vec()), signature.bytes(), &options).await.unwrap());
}

#[tokio::test]
async fn large_messages_are_hashed_with_the_keys_natural_hash() {
    let daemon = MockDaemon::start(0);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let message = vec![7u8; 3 * 1024 * 1024];
    let signature = client.sign("p384-key", SignInput::Message(message.clone()), &SignOptions::new()).await.unwrap();
    let expected = sha2::Sha384::digest(&message).to_vec();
    assert_eq!(signature.bytes(), fake_signature(HashAlgorithm::Sha384, &expected));
    let seen = daemon.seen();
    let request = seen.sign.as_ref().unwrap();
    assert_eq!(request.hash(), HashAlgorithm::Sha384);
    assert_eq!(request.input, Some(sign_request::Input::Digest(expected.clone())));
}

#[tokio::test]
async fn sign_passes_hash_and_scheme() {
    let daemon = MockDaemon::start(0);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let options = SignOptions::new().with_hash(HashAlgorithm::Sha384).with_scheme(SignatureScheme::RsaPkcs1);
    let signature = client.sign("rsa", SignInput::Digest(vec![1; 48]), &options).await.unwrap();
    assert_eq!(signature.scheme(), SignatureScheme::RsaPkcs1);
    let err = client.sign("rsa", SignInput::Digest(vec![1; 20]), &options).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn public_key_delete_and_status() {
    let daemon = MockDaemon::start(3);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let public = client.public_key("p384").await.unwrap();
    assert_eq!(public.algorithm, KeyAlgorithm::EccP384);
    assert!(public.pem.starts_with("-----BEGIN PUBLIC KEY-----"));
    client.delete_key("web").await.unwrap();
    assert_eq!(daemon.seen().deleted, ["web"]);
    let status = client.status().await.unwrap();
    assert_eq!(status.tpm_state, TpmState::Ready);
    assert_eq!(status.key_count, 3);
    assert!(status.simulator);
}

#[tokio::test]
async fn clones_share_the_connection_concurrently() {
    let daemon = MockDaemon::start(5);
    let client = Client::connect(&daemon.socket).await.unwrap();
    let calls = (0..32).map(|i| {
        let client = client.clone();
        tokio::spawn(async move { client.key(&format!("k{i}")).await })
    });
    for call in calls {
        call.await.unwrap().unwrap();
    }
}

#[test]
fn blocking_client_works() {
    let daemon = MockDaemon::start(2);
    let client = BlockingClient::connect(&daemon.socket).unwrap();
    assert_eq!(client.list_keys().unwrap().len(), 2);
    let signature = client.sign("web", SignInput::Digest(vec![0; 32]), &SignOptions::new()).unwrap();
    assert!(client.verify("web", SignInput::Digest(vec![0; 32]), signature.bytes(), &SignOptions::new()).unwrap());
    assert_eq!(client.key("missing").unwrap_err().code(), Code::NotFound);
}

// ---- the tpm-vault binary ----

#[test]
fn cli_key_commands() {
    let daemon = MockDaemon::start(2);

    let out = daemon.cli(&["key", "create", "disk", "--alg", "ecc-p384", "--pcr", "sha256:9"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("algorithm:   ecc-p384"), "{}", stdout(&out));
    assert!(stdout(&out).contains("sha256:9 (values at creation)"));

    let out = daemon.cli(&["key", "list"], None);
    assert_eq!(stdout(&out).lines().count(), 3, "{}", stdout(&out));

    let out = daemon.cli(&["--output", "json", "key", "list"], None);
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["keys"][1]["name"], "k00001");

    let out = daemon.cli(&["key", "public", "web"], None);
    assert!(stdout(&out).ends_with("-----END PUBLIC KEY-----\n"));
    let out = daemon.cli(&["key", "public", "web", "--format", "der"], None);
    assert_eq!(out.stdout, [0x30, 0x59, 0x30, 0x13]);

    let out = daemon.cli(&["key", "delete", "web"], None);
    assert!(out.status.success());
    assert_eq!(stdout(&out), "Deleted key \"web\"\n");
}

#[test]
fn cli_errors_are_one_line_with_exit_codes() {
    let daemon = MockDaemon::start(0);
    let out = daemon.cli(&["key", "show", "missing"], None);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(stderr(&out), "tpm-vault: key \"missing\" not found\n");
    assert!(out.stdout.is_empty());

    let out = daemon.cli(&["key", "create", "taken"], None);
    assert_eq!(out.status.code(), Some(4));

    let dir = tempfile::tempdir().unwrap();
    let out = run_cli(&dir.path().join("none.sock"), &["status"], None);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(stderr(&out).lines().count(), 1);
    assert!(stderr(&out).ends_with("(is tpm-vaultd running?)\n"), "{}", stderr(&out));

    let out = daemon.cli(&["key", "create", "x", "--alg", "dsa"], None);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn cli_sign_and_verify() {
    let daemon = MockDaemon::start(0);
    let dir = tempfile::tempdir().unwrap();
    let message = dir.path().join("msg");
    let sig = dir.path().join("msg.sig");
    std::fs::write(&message, b"hello").unwrap();
    let (m, s) = (message.to_str().unwrap(), sig.to_str().unwrap());

    let out = daemon.cli(&["sign", "web", "--in", m, "--out", s], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    let signature = std::fs::read(&sig).unwrap();
    assert_eq!(signature, fake_signature(HashAlgorithm::Sha256, &sha2::Sha256::digest(b"hello")));

    let out = daemon.cli(&["verify", "web", "--in", m, "--sig", s], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "Verified OK\n");

    let out = daemon.cli(&["verify", "web", "--in", "-", "--sig", s], Some(b"tampered"));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "Verification failure\n");
    assert!(out.stdout.is_empty());

    // stdin to stdout, digest input
    let digest = sha2::Sha384::digest(b"x");
    let out = daemon.cli(&["sign", "p384", "--in", "-", "--digest", "--out", "-"], Some(&digest));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, fake_signature(HashAlgorithm::Sha384, &digest));

    // JSON: the signature is in the object
    let out = daemon.cli(&["--output", "json", "sign", "web", "--in", m, "--out", "-"], None);
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["hash"], "sha256");
    assert_eq!(value["scheme"], "ecdsa");
    assert_eq!(value["signature"], hex::encode(&signature));
}

#[test]
fn cli_signs_large_stdin_by_streaming_a_hash() {
    let daemon = MockDaemon::start(0);
    let message = vec![3u8; 5 * 1024 * 1024 + 17];
    let out = daemon.cli(&["sign", "p384", "--in", "-", "--out", "-"], Some(&message));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, fake_signature(HashAlgorithm::Sha384, &sha2::Sha384::digest(&message)));
}

#[test]
fn cli_status() {
    let daemon = MockDaemon::start(4);
    let out = daemon.cli(&["status"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("simulator:       yes (keys are NOT hardware-protected)"), "{text}");
    assert!(text.contains("uptime:          1h 2m 5s"), "{text}");
    assert!(text.contains("rpc/Sign"), "{text}");
    for row in [
        "software tpm:    YES: TCTI swtpm: (swtpm's TCP protocol). Keys are NOT hardware-protected\n",
        "tpm:             IBM \"SW   TPM\"\n",
        "tpm reconnects:  2\n",
        "policy:          NO rules in force: every request is denied (/etc/tpm-vault/policies (1 file(s)))\n",
    ] {
        assert!(text.contains(row), "{row:?} in\n{text}");
    }
    let out = daemon.cli(&["status", "--output", "json"], None);
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["tpm_state"], "ready");
    assert_eq!(value["metrics"][0]["p99_us"], 2500);
    assert_eq!(value["software_tpm"], true);
    assert_eq!(value["policy_rules"], 0);
    assert_eq!(value["tpm_reconnects"], 2);
}
