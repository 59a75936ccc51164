//! Bounds that hold before authorization (issue #19), against a daemon over its own swtpm:
//! the HTTP/2 stream bound a connection is told, the per-client connection bound, and a
//! message prefix over a method's bound refused at once instead of the daemon waiting for (and
//! reserving) the declared 64 MiB.

mod support;

use std::io::Read as _;
use std::time::{Duration, Instant};

use support::{allow_self_access, DaemonEnv, TpmEnv};
use tpm_vault_daemon::daemon::ServeLimits;
use tpm_vault_proto::v1 as pb;

async fn daemon(limits: ServeLimits) -> DaemonEnv {
    DaemonEnv::start_limited(TpmEnv::start(), std::sync::Arc::new(allow_self_access()), limits).await
}

/// A raw HTTP/2 client connection to the daemon's socket.
async fn h2_client(env: &DaemonEnv) -> h2::client::SendRequest<bytes::Bytes> {
    let io = tokio::net::UnixStream::connect(&env.socket).await.expect("connect");
    let (client, connection) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client.ready().await.expect("ready")
}

fn grpc_request(path: &str) -> http::Request<()> {
    http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

async fn sign_once(env: &DaemonEnv) {
    let mut keys = env.keys().await;
    keys.sign(pb::SignRequest {
        name: "k".into(),
        input: Some(pb::sign_request::Input::Message(b"m".to_vec())),
        hash: 0,
        scheme: 0,
        auth: vec![],
        purpose: 0,
    })
    .await
    .expect("sign");
}

/// A connection is told how many requests it may have open at once, and 10,000 requests
/// started on one connection (never finished) leave another client signing within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_connection_are_bounded_and_others_keep_signing() {
    let limits = ServeLimits { max_streams_per_connection: 100, ..ServeLimits::default() };
    let env = daemon(limits).await;
    let mut keys = env.keys().await;
    keys.create_key(pb::CreateKeyRequest {
        name: "k".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("create");
    let client = h2_client(&env).await;
    // The server's SETTINGS arrive with the handshake; give them a moment to be applied.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(client.current_max_send_streams(), 100, "SETTINGS_MAX_CONCURRENT_STREAMS");
    // Open Encrypt streams that never send a message, as fast as the client may.
    let opener = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..10_000 {
            let Ok(ready) = tokio::time::timeout(Duration::from_millis(50), client.clone().ready()).await else {
                break; // the server's bound: no more streams until one finishes
            };
            let Ok(mut ready) = ready else { break };
            match ready.send_request(grpc_request("/tpmvault.v1.CryptoService/Encrypt"), false) {
                Ok(pair) => held.push(pair),
                Err(_) => break,
            }
        }
        held
    });
    let started = Instant::now();
    sign_once(&env).await;
    assert!(started.elapsed() < Duration::from_secs(1), "signing took {:?} under the stream flood", started.elapsed());
    let held = opener.await.expect("opener");
    assert!(held.len() <= 10_000, "{}", held.len());
    let started = Instant::now();
    sign_once(&env).await;
    assert!(started.elapsed() < Duration::from_secs(1), "signing took {:?} with streams held", started.elapsed());
    drop(held);
    env.stop().await;
}

/// One client uid gets at most `max_connections_per_client` connections; the next is closed
/// at once, and a slot is free again when one of them closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_client_are_bounded() {
    let limits = ServeLimits { max_connections_per_client: 20, ..ServeLimits::default() };
    let env = daemon(limits).await;
    let mut idle: Vec<std::os::unix::net::UnixStream> =
        (0..20).map(|_| std::os::unix::net::UnixStream::connect(&env.socket).expect("connect")).collect();
    // Connections are admitted in accept order: one more is closed by the daemon, unread.
    let closed_at_once = |socket: &std::path::Path| {
        let mut extra = std::os::unix::net::UnixStream::connect(socket).expect("connect");
        extra.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let mut byte = [0u8; 1];
        match extra.read(&mut byte) {
            Ok(0) => true,  // closed by the daemon
            Ok(_) => false, // served: the daemon's HTTP/2 SETTINGS
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    };
    let socket = env.socket.clone();
    let refused = tokio::task::spawn_blocking(move || closed_at_once(&socket)).await.expect("task");
    assert!(refused, "the 21st connection of one uid was kept open");
    // One closes: the next connection is served again.
    drop(idle.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(2), async {
            let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", env.socket.display()))
                .map_err(|e| e.to_string())?
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            let mut status = pb::status_service_client::StatusServiceClient::new(channel);
            status.get_status(pb::GetStatusRequest {}).await.map_err(|e| e.to_string())
        })
        .await;
        if matches!(attempt, Ok(Ok(_))) {
            break;
        }
        assert!(Instant::now() < deadline, "no connection admitted after one closed: {attempt:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(idle);
    env.stop().await;
}

/// An Unseal whose message prefix declares 64 MiB (Seal's bound, the service's) is refused at
/// once with OUT_OF_RANGE: Unseal takes 64 KiB. Before, the daemon reserved the 64 MiB and
/// waited for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_prefix_on_unseal_is_refused_at_once() {
    let env = daemon(ServeLimits::default()).await;
    let mut client = h2_client(&env).await;
    let (response, mut body) =
        client.send_request(grpc_request("/tpmvault.v1.SealService/Unseal"), false).expect("send");
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&(64u32 << 20).to_be_bytes());
    body.send_data(bytes::Bytes::from(prefix), false).expect("prefix");
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("no answer in 5 s: the daemon waits for the 64 MiB")
        .expect("response");
    let (parts, mut answer) = response.into_parts();
    let status = match parts.headers.get("grpc-status") {
        Some(code) => code.clone(),
        None => {
            while answer.data().await.is_some() {}
            let trailers = answer.trailers().await.expect("trailers").expect("grpc trailers");
            trailers.get("grpc-status").expect("grpc-status").clone()
        }
    };
    assert_eq!(status, "11", "OUT_OF_RANGE");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // Seal itself still takes large secrets.
    let mut seal =
        pb::seal_service_client::SealServiceClient::new(env.channel().await).max_encoding_message_size(usize::MAX);
    seal.seal(pb::SealRequest { name: "big".into(), secret: vec![7; 2 << 20], ..Default::default() })
        .await
        .expect("a 2 MiB secret seals");
    env.stop().await;
}
