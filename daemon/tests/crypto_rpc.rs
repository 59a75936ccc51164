//! CryptoService over gRPC against a real swtpm: streamed AES-256-GCM round trips at the chunk
//! edges, tampering of every kind rejected with nothing released from the failing chunk on, a
//! PCR-bound data key that stops working once PCR 9 moves, bounded memory for a long stream,
//! and random bytes.

mod support;

use prost::bytes::Bytes;
use support::DaemonEnv;
use tonic::Code;
use tpm_vault_daemon::model::{HashAlg, PcrBank};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::crypto_service_client::CryptoServiceClient;

const CHUNK: usize = 64 * 1024;

async fn client(env: &DaemonEnv) -> CryptoServiceClient<tonic::transport::Channel> {
    CryptoServiceClient::new(env.channel().await).max_decoding_message_size(64 << 20)
}

async fn encrypt(
    c: &mut CryptoServiceClient<tonic::transport::Channel>,
    key: &str,
    ctx: &[u8],
    data: &[u8],
) -> Result<Vec<u8>, tonic::Status> {
    let mut msgs = vec![pb::EncryptRequest { key_name: key.into(), context: ctx.to_vec(), data: Bytes::new() }];
    msgs.extend(data.chunks(100_000).map(|d| pb::EncryptRequest {
        key_name: String::new(),
        context: vec![],
        data: Bytes::copy_from_slice(d),
    }));
    let mut stream = c.encrypt(tokio_stream::iter(msgs)).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await? {
        out.extend_from_slice(&m.data);
    }
    Ok(out)
}

/// Decrypts; returns what was released before any error, and the error.
async fn decrypt(
    c: &mut CryptoServiceClient<tonic::transport::Channel>,
    ctx: &[u8],
    data: &[u8],
) -> (Vec<u8>, Option<tonic::Status>) {
    let mut msgs = vec![pb::DecryptRequest { context: ctx.to_vec(), data: Bytes::new() }];
    msgs.extend(data.chunks(100_000).map(|d| pb::DecryptRequest { context: vec![], data: Bytes::copy_from_slice(d) }));
    let mut out = Vec::new();
    let mut stream = match c.decrypt(tokio_stream::iter(msgs)).await {
        Ok(s) => s.into_inner(),
        Err(e) => return (out, Some(e)),
    };
    loop {
        match stream.message().await {
            Ok(Some(m)) => out.extend_from_slice(&m.data),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) % 253) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_at_the_chunk_edges() {
    let env = DaemonEnv::start().await;
    let mut c = client(&env).await;
    let dk = c
        .create_data_key(pb::CreateDataKeyRequest { name: "dk".into(), pcr_binding: None })
        .await
        .expect("create")
        .into_inner();
    assert_eq!(dk.key_id.len(), 32);
    for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 3] {
        let plain = data(len);
        let sealed = encrypt(&mut c, "dk", b"ctx", &plain).await.expect("encrypt");
        assert!(sealed.len() > plain.len(), "header and tags added");
        assert!(
            !sealed.windows(64.min(len.max(1))).any(|w| len >= 64 && w == &plain[..64]),
            "no plaintext in the output"
        );
        let (out, err) = decrypt(&mut c, b"ctx", &sealed).await;
        assert!(err.is_none(), "len {len}: {err:?}");
        assert!(out == plain, "len {len}");
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_wrong_key_and_wrong_context_are_rejected() {
    let env = DaemonEnv::start().await;
    let mut c = client(&env).await;
    for name in ["dk-a", "dk-b"] {
        c.create_data_key(pb::CreateDataKeyRequest { name: name.into(), pcr_binding: None }).await.expect("create");
    }
    let plain = data(3 * CHUNK + 100);
    let sealed = encrypt(&mut c, "dk-a", b"tenant-1", &plain).await.expect("encrypt");
    let header_len = 8 + 2 + 4 + 16 + 4 + 12 + 48; // format v2: the wrapped stream key
    let sealed_chunk = CHUNK + 16;
    // A flipped bit in the third chunk: the first two chunks are released, nothing after.
    let mut t = sealed.clone();
    t[header_len + 2 * sealed_chunk + 10] ^= 1;
    let (out, err) = decrypt(&mut c, b"tenant-1", &t).await;
    let err = err.expect("rejected");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("chunk 2"), "{}", err.message());
    assert_eq!(out, plain[..2 * CHUNK].to_vec());
    // Truncated (final chunk dropped).
    let (_, err) = decrypt(&mut c, b"tenant-1", &sealed[..header_len + 3 * sealed_chunk]).await;
    assert!(err.expect("truncated").message().contains("truncated"));
    // Reordered chunks.
    let mut r = sealed.clone();
    let (a, b) = (header_len, header_len + sealed_chunk);
    r[a..a + sealed_chunk].copy_from_slice(&sealed[b..b + sealed_chunk]);
    r[b..b + sealed_chunk].copy_from_slice(&sealed[a..a + sealed_chunk]);
    let (out, err) = decrypt(&mut c, b"tenant-1", &r).await;
    assert!(err.is_some() && out.is_empty());
    // A chunk from another stream under the same key.
    let other = encrypt(&mut c, "dk-a", b"tenant-1", &plain).await.expect("encrypt");
    let mut s = sealed.clone();
    s[b..b + sealed_chunk].copy_from_slice(&other[b..b + sealed_chunk]);
    let (out, err) = decrypt(&mut c, b"tenant-1", &s).await;
    assert!(err.is_some());
    assert_eq!(out.len(), CHUNK, "only the chunk before the spliced one");
    // Wrong context.
    let (out, err) = decrypt(&mut c, b"tenant-2", &sealed).await;
    assert!(err.is_some() && out.is_empty());
    // Wrong key: the header renamed to the other data key.
    let mut w = sealed.clone();
    w[10..14].copy_from_slice(b"dk-b");
    let (out, err) = decrypt(&mut c, b"tenant-1", &w).await;
    assert!(err.is_some() && out.is_empty(), "{err:?}");
    // Garbage.
    let (_, err) = decrypt(&mut c, b"", b"definitely not a stream").await;
    assert_eq!(err.expect("garbage").code(), Code::InvalidArgument);
    // Unknown key.
    let e = encrypt(&mut c, "nope", b"", b"x").await.expect_err("unknown key");
    assert_eq!(e.code(), Code::NotFound);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcr9_bound_data_key_stops_after_extend() {
    let env = DaemonEnv::start().await;
    let mut c = client(&env).await;
    let binding = pb::PcrBinding { bank: "sha256".into(), pcrs: vec![9], values: vec![] };
    c.create_data_key(pb::CreateDataKeyRequest { name: "bound".into(), pcr_binding: Some(binding) })
        .await
        .expect("create");
    let sealed = encrypt(&mut c, "bound", b"", b"boot secret").await.expect("encrypt");
    assert_eq!(decrypt(&mut c, b"", &sealed).await.0, b"boot secret");
    env.vault.pcr_extend(PcrBank::Sha256, 9, HashAlg::Sha256.digest(b"other kernel")).await.expect("extend");
    // Still cached in memory: keeps working until the cached copy is dropped.
    assert!(decrypt(&mut c, b"", &sealed).await.1.is_none());
    assert!(env.vault.evict_data_keys() >= 1);
    let (out, err) = decrypt(&mut c, b"", &sealed).await;
    let err = err.expect("refused after the extend");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("sha256:9"), "{}", err.message());
    assert!(out.is_empty());
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_stream_memory_stays_bounded() {
    let env = DaemonEnv::start().await;
    let mut c = client(&env).await;
    c.create_data_key(pb::CreateDataKeyRequest { name: "big".into(), pcr_binding: None }).await.expect("create");
    let total: usize = std::env::var("TPM_VAULT_STREAM_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(256) << 20;
    let rss_before = rss_kib();
    // Encrypt a generated stream and decrypt it on the fly, never holding it whole.
    let piece = Bytes::from(vec![0x5Au8; 256 * 1024]);
    let n = total / piece.len();
    let reqs =
        std::iter::once(pb::EncryptRequest { key_name: "big".into(), context: vec![], data: Bytes::new() }).chain(
            (0..n).map(move |_| pb::EncryptRequest { key_name: String::new(), context: vec![], data: piece.clone() }),
        );
    let mut enc = c.encrypt(tokio_stream::iter(reqs)).await.expect("encrypt").into_inner();
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::DecryptRequest>(4);
    let mut dec_client = client(&env).await;
    let dec = tokio::spawn(async move {
        let mut s =
            dec_client.decrypt(tokio_stream::wrappers::ReceiverStream::new(rx)).await.expect("decrypt").into_inner();
        let mut bytes = 0usize;
        let mut peak = 0u64;
        while let Some(m) = s.message().await.expect("message") {
            assert!(m.data.iter().all(|&b| b == 0x5A));
            bytes += m.data.len();
            peak = peak.max(rss_kib());
        }
        (bytes, peak)
    });
    while let Some(m) = enc.message().await.expect("enc message") {
        tx.send(pb::DecryptRequest { context: vec![], data: m.data }).await.expect("send");
    }
    drop(tx);
    let (bytes, peak) = dec.await.expect("join");
    assert_eq!(bytes, n * 256 * 1024);
    let growth_mib = peak.saturating_sub(rss_before) / 1024;
    eprintln!("streamed {} MiB through encrypt+decrypt; RSS growth {growth_mib} MiB", bytes >> 20);
    assert!(growth_mib < 64, "RSS grew by {growth_mib} MiB");
    env.stop().await;
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_are_fast_and_bounded() {
    let env = DaemonEnv::start().await;
    let mut c = client(&env).await;
    let a = c.get_random(pb::GetRandomRequest { length: 1 << 20 }).await.expect("random").into_inner().data;
    let b = c.get_random(pb::GetRandomRequest { length: 1 << 20 }).await.expect("random").into_inner().data;
    assert_eq!(a.len(), 1 << 20);
    assert_ne!(a, b);
    assert_eq!(c.get_random(pb::GetRandomRequest { length: 0 }).await.expect_err("zero").code(), Code::InvalidArgument);
    // At most 1 MiB per call (issue #31): one past it is refused with a message naming the bound.
    for length in [(1 << 20) + 1, 17 << 20] {
        let e = c.get_random(pb::GetRandomRequest { length }).await.expect_err("too big");
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("at most") || e.message().contains("1048576"), "{}", e.message());
    }
    env.stop().await;
}
