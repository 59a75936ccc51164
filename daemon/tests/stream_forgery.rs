//! Issue #31, item 5: a client allowed only to `decrypt` must not be able to make a stream that
//! decrypts as authentic. Before format v3, OpenStreamKey handed such a client the stream key,
//! which is all it takes to seal new chunks under a real header: the forged stream decrypted
//! through the daemon's Decrypt. In v3 the stream ends with a commitment made by the daemon
//! under a key derived from the data key; the forger cannot get one (CommitStream needs
//! `encrypt`) and the forged stream fails at its end.

mod support;

use std::sync::Arc;

use support::{allow_self_policy, nobody_channel, run_as_nobody, DaemonEnv, TpmEnv, NOBODY};
use tpm_vault_proto::stream::{ChunkCipher, Header, COMMITMENT, TAG};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::crypto_service_client::CryptoServiceClient;

const FORGED: &[u8] = b"forged by a client that may only decrypt";

/// This process may do everything; uid nobody may only `decrypt` with data key `dk`.
fn access() -> tpm_vault_daemon::daemon::Access {
    let text = format!(
        "{}\n[[rule]]\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"dk\"]\noperations = [\"decrypt\"]\n",
        allow_self_policy()
    );
    let mut policy = tpm_vault_daemon::daemon::Policy::default();
    policy.add_file(std::path::Path::new("t.toml"), &text).expect("policy");
    tpm_vault_daemon::daemon::Access::with_policy(policy, tpm_vault_daemon::daemon::AuditLog::tracing_only())
}

async fn decrypt(
    crypto: &mut CryptoServiceClient<tonic::transport::Channel>,
    stream: &[u8],
) -> Result<Vec<u8>, tonic::Status> {
    let messages = vec![pb::DecryptRequest { context: vec![], data: stream.to_vec().into() }];
    let mut responses = crypto.decrypt(tokio_stream::iter(messages)).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = responses.message().await? {
        out.extend_from_slice(&m.data);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decrypt_only_client_cannot_forge_a_stream() {
    let env = DaemonEnv::start_with(TpmEnv::start(), Arc::new(access())).await;
    let mut crypto = CryptoServiceClient::new(env.channel().await);
    crypto
        .create_data_key(pb::CreateDataKeyRequest { name: "dk".into(), pcr_binding: None })
        .await
        .expect("create data key");
    // The owner encrypts a real stream in the daemon.
    let first = pb::EncryptRequest { key_name: "dk".into(), context: vec![], data: b"the real data".to_vec().into() };
    let mut responses = crypto.encrypt(tokio_stream::iter(vec![first])).await.expect("encrypt").into_inner();
    let mut real = Vec::new();
    while let Some(m) = responses.message().await.expect("encrypt stream") {
        real.extend_from_slice(&m.data);
    }
    assert_eq!(decrypt(&mut crypto, &real).await.expect("the real stream decrypts"), b"the real data");
    std::fs::write(env.tpm.path().join("real.sealed"), &real).expect("write");

    // The decrypt-only client forges a stream from it.
    let out = run_as_nobody(&env, "forger").await;
    assert!(out.status.success(), "forger: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix("FORGED:")).expect("the forger's stream");
    let forged: Vec<u8> =
        (0..line.len() / 2).map(|i| u8::from_str_radix(&line[2 * i..2 * i + 2], 16).expect("hex")).collect();
    let result = decrypt(&mut crypto, &forged).await;
    let (header, _) = Header::parse(&real).expect("header").expect("whole header");
    eprintln!("stream version {}; forged stream: {result:?}", header.version());
    let status = result.expect_err("the daemon's Decrypt accepted a stream forged by a decrypt-only client");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("commitment does not verify"), "{}", status.message());
    // Nor does the daemon's own check accept it.
    let (tags_digest, commitment) = tags_and_commitment(&forged);
    let verdict = crypto
        .verify_stream(pb::VerifyStreamRequest {
            key_name: "dk".into(),
            header: header.encode(),
            context: vec![],
            tags_digest: tags_digest.to_vec(),
            commitment,
        })
        .await;
    assert_eq!(verdict.expect_err("VerifyStream accepted the forgery").code(), tonic::Code::InvalidArgument);
    env.stop().await;
}

/// The tag digest and commitment of a v3 stream whose chunks all fit in one (a short stream).
fn tags_and_commitment(stream: &[u8]) -> ([u8; 32], Vec<u8>) {
    let (_, used) = Header::parse(stream).expect("header").expect("whole header");
    let end = stream.len() - COMMITMENT;
    let mut tags = tpm_vault_proto::stream::TagDigest::default();
    tags.add(&stream[end - TAG..end]);
    let _ = used;
    (tags.finish(), stream[end..].to_vec())
}

/// Runs as uid nobody ([`run_as_nobody`]): takes the real stream's header, gets its stream key
/// (OpenStreamKey: `decrypt`), is refused a commitment (CommitStream: `encrypt`), and writes a
/// stream of its own: the real header, one chunk sealed with the stream key, and the real
/// stream's commitment (the best a forger has).
#[tokio::test]
#[ignore = "run as uid nobody by a_decrypt_only_client_cannot_forge_a_stream"]
async fn forger() {
    let dir = std::path::PathBuf::from(std::env::var("TPM_VAULT_TEST_SOCKET").expect("socket"));
    let dir = dir.parent().expect("dir").to_owned();
    let real = std::fs::read(dir.join("real.sealed")).expect("real stream");
    let (header, used) = Header::parse(&real).expect("header").expect("whole header");
    let mut crypto = CryptoServiceClient::new(nobody_channel().await);
    let key = crypto
        .open_stream_key(pb::OpenStreamKeyRequest {
            key_name: "dk".into(),
            header: real[..used].to_vec(),
            context: vec![],
        })
        .await
        .expect("OpenStreamKey: a decrypt-only client gets the stream key")
        .into_inner()
        .key;
    let key: [u8; 32] = key.as_slice().try_into().expect("32-byte key");
    let cipher = ChunkCipher::new(&key, &header, b"").expect("cipher");
    let mut forged = real[..used].to_vec();
    let start = forged.len();
    forged.extend_from_slice(FORGED);
    forged.resize(forged.len() + TAG, 0);
    cipher.seal(0, true, &mut forged[start..]).expect("seal");
    if header.is_committed() {
        let refused = crypto
            .commit_stream(pb::CommitStreamRequest {
                key_name: "dk".into(),
                header: real[..used].to_vec(),
                context: vec![],
                tags_digest: vec![0; 32],
            })
            .await
            .expect_err("CommitStream answered a decrypt-only client");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        forged.extend_from_slice(&real[real.len() - COMMITMENT..]);
    }
    let hex: String = forged.iter().map(|b| format!("{b:02x}")).collect();
    println!("FORGED:{hex}");
}
