//! Memory bounds of an authorised client (issue #31, item 6), against the real daemon binary:
//! a client that asks for large answers and never reads them cannot grow the daemon's memory
//! past its budget of response bytes in flight. Before the fix, eight unread 16 MiB GetRandom
//! answers on one connection took the daemon from 18 to 162 MiB, and a few connections got it
//! OOM-killed.

mod support;

use std::time::{Duration, Instant};

use prost::Message as _;
use support::{KillOnDrop, ProcEnv};
use tpm_vault_proto::v1 as pb;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// A raw HTTP/2 connection to the daemon that never reads a response body (its receive window
/// stays closed once the first 64 KiB arrived).
async fn h2_client(socket: &std::path::Path) -> h2::client::SendRequest<bytes::Bytes> {
    let io = tokio::net::UnixStream::connect(socket).await.expect("connect");
    let (client, connection) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client.ready().await.expect("ready")
}

/// Sends one GetRandom request for `length` bytes on `client`; the response is never read.
async fn unread_random(
    client: &h2::client::SendRequest<bytes::Bytes>,
    length: u32,
) -> Option<(h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>)> {
    let mut ready = tokio::time::timeout(Duration::from_secs(5), client.clone().ready()).await.ok()?.ok()?;
    let request = http::Request::post("http://localhost/tpmvault.v1.CryptoService/GetRandom")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .ok()?;
    let (response, mut body) = ready.send_request(request, false).ok()?;
    let message = pb::GetRandomRequest { length }.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    body.send_data(framed.into(), true).ok()?;
    Some((response, body))
}

/// The attack of the issue, at the new per-call bound: many 1 MiB GetRandom answers left
/// unread on several connections. The daemon's RSS (read from /proc) stays within its budget
/// of response bytes in flight (8 MiB per client) plus slack; before the fix every answer was
/// buffered (+100 MiB here). A 16 MiB request is refused with a message naming the bound, and
/// once the hostile connections close, the client is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_answers_do_not_grow_the_daemons_memory() {
    let mut env = ProcEnv::new();
    let mut daemon = KillOnDrop(env.command().spawn().expect("spawn"));
    assert!(env.wait_note("READY=1", Duration::from_secs(30)), "{}", env.stderr());
    let pid = daemon.0.id();
    let mut crypto = pb::crypto_service_client::CryptoServiceClient::new(env.channel().await)
        .max_decoding_message_size(32 * 1024 * 1024);

    // The request: 16 MiB in one call is refused, naming the bound.
    let big = crypto.get_random(pb::GetRandomRequest { length: 16 * 1024 * 1024 }).await;
    let status = big.expect_err("a 16 MiB GetRandom was answered");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("1048576"), "{}", status.message());
    // Warm up the allocator and the DRBG with answers that are read.
    for _ in 0..4 {
        crypto.get_random(pb::GetRandomRequest { length: 1024 * 1024 }).await.expect("random");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib(pid);

    // 3 connections × 40 requests of 1 MiB, never read.
    let mut held = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..3 {
        let client = h2_client(&env.socket).await;
        for _ in 0..40 {
            if let Some(pair) = unread_random(&client, 1024 * 1024).await {
                held.push(pair);
            }
        }
        conns.push(client);
    }
    assert!(held.len() >= 100, "only {} requests went out", held.len());
    // Let the daemon answer what it will.
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        peak = peak.max(rss_kib(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let grown_mib = peak.saturating_sub(before) / 1024;
    eprintln!(
        "daemon RSS: {} MiB before, {} MiB peak with {} unread 1 MiB answers",
        before / 1024,
        peak / 1024,
        held.len()
    );
    assert!(grown_mib < 40, "the daemon grew by {grown_mib} MiB holding unread answers ({} requests)", held.len());

    // The hostile connections close: their reservations come back and the client is served.
    drop(held);
    drop(conns);
    let started = Instant::now();
    loop {
        match crypto.get_random(pb::GetRandomRequest { length: 1024 * 1024 }).await {
            Ok(r) => {
                assert_eq!(r.into_inner().data.len(), 1024 * 1024);
                break;
            }
            Err(s) if started.elapsed() < Duration::from_secs(40) => {
                eprintln!("not yet: {s:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => panic!("the client is not served again: {s:?}"),
        }
    }
    assert!(daemon.0.try_wait().expect("wait").is_none(), "the daemon exited: {}", env.stderr());
}
