//! Every RPC writes exactly one audit record and counts once in the metrics, with the gRPC code
//! as the outcome: a unary call, a stream, a stream whose set-up fails after it was granted, a
//! stream refused before any policy decision, and the calls that had none (ListKeys, GetStatus,
//! CheckAccess). The audit log is the daemon's real JSON-lines file, read back.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use prost::bytes::Bytes;
use support::{DaemonEnv, TpmEnv};
use tonic::Code;
use tpm_vault_daemon::daemon::AuditLog;
use tpm_vault_daemon::daemon::{Access, Policy};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::crypto_service_client::CryptoServiceClient;
use tpm_vault_proto::v1::status_service_client::StatusServiceClient;

/// The audit records written so far (the writer batches: wait until the count settles).
async fn records(path: &Path) -> Vec<serde_json::Value> {
    let mut last = usize::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let entries: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("audit line is JSON")).collect();
        if entries.len() == last {
            return entries;
        }
        last = entries.len();
    }
}

fn encrypt_request(key: &str, data: &[u8]) -> pb::EncryptRequest {
    pb::EncryptRequest { key_name: key.into(), context: b"ctx".to_vec(), data: Bytes::copy_from_slice(data) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_writes_exactly_one_audit_record_and_counts_once() {
    let tpm = TpmEnv::start();
    let audit_path = tpm.path().join("audit.jsonl");
    let mut policy = Policy::default();
    policy.add_file(Path::new("test.toml"), &support::allow_self_policy()).expect("policy");
    let access = Access::with_policy(policy, AuditLog::with_file(&audit_path).expect("audit file"));
    let env = DaemonEnv::start_with(tpm, Arc::new(access)).await;
    let channel = env.channel().await;
    let mut crypto = CryptoServiceClient::new(channel.clone());
    let mut status = StatusServiceClient::new(channel);

    // A unary call.
    let request = pb::CreateDataKeyRequest { name: "dk".into(), pcr_binding: None };
    crypto.create_data_key(request).await.expect("create data key");
    // A stream, to its end.
    let msgs = vec![encrypt_request("dk", b""), encrypt_request("", &[7u8; 100_000])];
    let mut stream = crypto.encrypt(tokio_stream::iter(msgs)).await.expect("encrypt").into_inner();
    while stream.message().await.expect("encrypted chunk").is_some() {}
    // A stream granted (the policy allows every name) whose set-up then fails: no such data key.
    let err = crypto.encrypt(tokio_stream::iter(vec![encrypt_request("nokey", b"x")])).await.expect_err("no key");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    // A stream refused before any policy decision: not a tpm-vault stream.
    let garbage = pb::DecryptRequest { context: vec![], data: Bytes::from_static(&[0x55; 4096]) };
    let err = crypto.decrypt(tokio_stream::iter(vec![garbage])).await.expect_err("garbage");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // Calls that make no decision of their own or check another client.
    let mut keys = env.keys().await;
    keys.list_keys(pb::ListKeysRequest { page_size: 10, page_token: String::new() }).await.expect("list");
    let check = pb::CheckAccessRequest { uid: 65534, operation: "sign".into(), key: "dk".into() };
    status.check_access(check).await.expect("check access");
    let answer = status.get_status(pb::GetStatusRequest {}).await.expect("status").into_inner();

    let entries = records(&audit_path).await;
    let of = |op: &str, key: Option<&str>| -> Vec<&serde_json::Value> {
        entries.iter().filter(|e| e["op"] == op && key.is_none_or(|k| e["key"] == k)).collect()
    };
    let one = |op: &str, key: Option<&str>, decision: &str, outcome: &str| {
        let found = of(op, key);
        assert_eq!(found.len(), 1, "{op} {key:?}: {found:#?}\nall: {entries:#?}");
        assert_eq!((found[0]["decision"].as_str(), found[0]["outcome"].as_str()), (Some(decision), Some(outcome)));
    };
    one("create", Some("dk"), "allow", "ok");
    one("encrypt", Some("dk"), "allow", "ok");
    one("encrypt", Some("nokey"), "allow", "NotFound");
    one("decrypt", None, "none", "InvalidArgument");
    one("public", None, "none", "ok");
    // CheckAccess and GetStatus (the latter written when its answer is sent, after the metrics
    // it carries were read).
    assert_eq!(of("admin", None).len(), 2, "{entries:#?}");
    assert_eq!(entries.len(), 7, "one record per call: {entries:#?}");

    // The metrics count each call once, failures as errors.
    let metric = |name: &str| answer.metrics.iter().find(|m| m.name == name).map(|m| (m.count, m.errors));
    assert_eq!(metric("rpc/CreateDataKey"), Some((1, 0)));
    assert_eq!(metric("rpc/Encrypt"), Some((2, 1)));
    assert_eq!(metric("rpc/Decrypt"), Some((1, 1)));
    assert_eq!(metric("rpc/ListKeys"), Some((1, 0)));
    assert_eq!(metric("rpc/CheckAccess"), Some((1, 0)));
    env.stop().await;
}
