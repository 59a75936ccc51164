//! KeyService over gRPC on a Unix socket, against a real swtpm: every error code the key API
//! can produce, asserted exactly.

mod support;

use support::DaemonEnv;
use tonic::Code;
use tpm_vault_proto::v1 as pb;

fn sign_req(name: &str, input: pb::sign_request::Input) -> pb::SignRequest {
    pb::SignRequest { name: name.into(), input: Some(input), hash: 0, scheme: 0, auth: vec![], purpose: 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_sign_verify_public_list_delete() {
    let env = DaemonEnv::start().await;
    let mut c = env.keys().await;
    let key = c
        .create_key(pb::CreateKeyRequest {
            name: "web".into(),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            usages: vec![],
        })
        .await
        .expect("create")
        .into_inner();
    assert_eq!(key.algorithm, pb::KeyAlgorithm::EccP256 as i32);
    assert_eq!(key.tpm_name.len(), 68, "sha256 name: 2 + 32 bytes in hex");
    let sig =
        c.sign(sign_req("web", pb::sign_request::Input::Message(b"hello".to_vec()))).await.expect("sign").into_inner();
    assert_eq!(sig.scheme, pb::SignatureScheme::Ecdsa as i32);
    assert_eq!(sig.hash, pb::HashAlgorithm::Sha256 as i32);
    let pubkey = c.get_public_key(pb::GetPublicKeyRequest { name: "web".into() }).await.expect("public").into_inner();
    assert!(pubkey.pem.starts_with("-----BEGIN PUBLIC KEY-----"));
    // Independent check with the p256 crate.
    use p256::ecdsa::signature::Verifier;
    use p256::pkcs8::DecodePublicKey;
    let vk = p256::ecdsa::VerifyingKey::from_public_key_der(&pubkey.der).expect("spki");
    vk.verify(b"hello", &p256::ecdsa::Signature::from_der(&sig.signature).expect("der")).expect("valid");
    let v = c
        .verify(pb::VerifyRequest {
            name: "web".into(),
            input: Some(pb::verify_request::Input::Message(b"hello".to_vec())),
            signature: sig.signature.clone(),
            hash: 0,
            scheme: 0,
        })
        .await
        .expect("verify")
        .into_inner();
    assert!(v.valid);
    let list =
        c.list_keys(pb::ListKeysRequest { page_size: 0, page_token: String::new() }).await.expect("list").into_inner();
    assert_eq!(list.keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), vec!["web"]);
    c.delete_key(pb::DeleteKeyRequest { name: "web".into() }).await.expect("delete");
    let err = c.get_key(pb::GetKeyRequest { name: "web".into() }).await.expect_err("gone");
    assert_eq!(err.code(), Code::NotFound);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_codes_are_exact() {
    let env = DaemonEnv::start().await;
    let mut c = env.keys().await;
    let create = |name: &str, alg: i32| pb::CreateKeyRequest {
        name: name.into(),
        algorithm: alg,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    };
    c.create_key(create("k", 0)).await.expect("create");
    // ALREADY_EXISTS
    assert_eq!(c.create_key(create("k", 0)).await.expect_err("dup").code(), Code::AlreadyExists);
    // INVALID_ARGUMENT: bad names, unknown enum, wrong digest length, scheme mismatch, no input.
    for bad in ["../x", "", "UPPER", &"a".repeat(65)] {
        let e = c.create_key(create(bad, 0)).await.expect_err("bad name");
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}");
        assert!(e.message().contains("invalid key name"), "{}", e.message());
    }
    assert_eq!(c.create_key(create("x", 99)).await.expect_err("enum").code(), Code::InvalidArgument);
    let e = c.sign(sign_req("k", pb::sign_request::Input::Digest(vec![0; 20]))).await.expect_err("digest");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("20 bytes"), "{}", e.message());
    let mut r = sign_req("k", pb::sign_request::Input::Message(vec![1]));
    r.scheme = pb::SignatureScheme::RsaPss as i32;
    assert_eq!(c.sign(r).await.expect_err("scheme").code(), Code::InvalidArgument);
    let r = pb::SignRequest { name: "k".into(), input: None, hash: 0, scheme: 0, auth: vec![], purpose: 0 };
    assert_eq!(c.sign(r).await.expect_err("no input").code(), Code::InvalidArgument);
    // NOT_FOUND on every key RPC.
    assert_eq!(c.get_key(pb::GetKeyRequest { name: "nope".into() }).await.expect_err("nf").code(), Code::NotFound);
    assert_eq!(
        c.delete_key(pb::DeleteKeyRequest { name: "nope".into() }).await.expect_err("nf").code(),
        Code::NotFound
    );
    assert_eq!(
        c.get_public_key(pb::GetPublicKeyRequest { name: "nope".into() }).await.expect_err("nf").code(),
        Code::NotFound
    );
    let e = c.sign(sign_req("nope", pb::sign_request::Input::Message(vec![1]))).await.expect_err("nf");
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("nope"));
    // Oversize message: INVALID_ARGUMENT over the 4 MiB sign limit.
    let big = sign_req("k", pb::sign_request::Input::Message(vec![0; 5 * 1024 * 1024]));
    assert_eq!(c.sign(big).await.expect_err("big").code(), Code::InvalidArgument);
    // Beyond the server's 8 MiB message limit (the client is allowed to send it).
    let mut unlimited = env.keys().await.max_encoding_message_size(64 << 20);
    let huge = sign_req("k", pb::sign_request::Input::Message(vec![0; 9 * 1024 * 1024]));
    let e = unlimited.sign(huge).await.expect_err("huge");
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    // PERMISSION_DENIED: a password-protected key used without its password; UNAUTHENTICATED: a
    // wrong password (scripts tell it apart from a policy denial).
    let mut p = create("locked", 0);
    p.auth = b"s3cret".to_vec();
    c.create_key(p).await.expect("create with auth");
    let e = c.sign(sign_req("locked", pb::sign_request::Input::Message(vec![1]))).await.expect_err("no pw");
    assert_eq!(e.code(), Code::PermissionDenied);
    let mut r = sign_req("locked", pb::sign_request::Input::Message(vec![1]));
    r.auth = b"s3cret".to_vec();
    c.sign(r).await.expect("right password signs");
    let mut r = sign_req("locked", pb::sign_request::Input::Message(vec![1]));
    r.auth = b"wrong".to_vec();
    assert_eq!(c.sign(r).await.expect_err("wrong pw").code(), Code::Unauthenticated);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpm_gone_is_unavailable_quickly_and_recovers() {
    let mut env = DaemonEnv::start().await;
    let mut c = env.keys().await;
    c.create_key(pb::CreateKeyRequest {
        name: "k".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("create");
    env.tpm.swtpm.kill();
    let start = std::time::Instant::now();
    let e = c.sign(sign_req("k", pb::sign_request::Input::Message(vec![1]))).await.expect_err("down");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
    env.tpm.swtpm.restart().expect("restart");
    // The actor reconnects with backoff (at most 5 s between attempts).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        match c.sign(sign_req("k", pb::sign_request::Input::Message(vec![1]))).await {
            Ok(_) => break,
            Err(e) if e.code() == Code::Unavailable && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("did not recover: {e:?}"),
        }
    }
    env.stop().await;
}
