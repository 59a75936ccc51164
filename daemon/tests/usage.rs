//! Key usages against a real daemon on swtpm, over gRPC: a `policy` key approves PCR policies
//! and signs nothing raw, a `sign` key signs raw and approves nothing, an `ssh` key signs only
//! an SSH user-authentication request naming it or an SSHSIG blob (never a TLS 1.3
//! CertificateVerify), usages suit the algorithm, and `SetKeyUsage` narrows and never widens.
//! These are the signatures the review got from a forwarded agent (`docs/RELIABILITY.md`).

mod support;

use p256::ecdsa::signature::Verifier as _;
use p256::pkcs8::DecodePublicKey as _;
use support::DaemonEnv;
use tonic::Code;
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::seal_service_client::SealServiceClient;

fn create(name: &str, alg: pb::KeyAlgorithm, usages: &[pb::KeyUsage]) -> pb::CreateKeyRequest {
    pb::CreateKeyRequest {
        name: name.into(),
        algorithm: alg as i32,
        usages: usages.iter().map(|&u| u as i32).collect(),
        ..Default::default()
    }
}

fn raw(name: &str, message: &[u8]) -> pb::SignRequest {
    pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Message(message.to_vec())),
        ..Default::default()
    }
}

fn ssh(name: &str, message: &[u8]) -> pb::SignRequest {
    pb::SignRequest { purpose: pb::SignPurpose::Ssh as i32, ..raw(name, message) }
}

fn approval(key: &str) -> pb::SignPolicyRequest {
    pb::SignPolicyRequest {
        key_name: key.into(),
        pcrs: Some(pb::PcrBinding { bank: "sha256".into(), pcrs: vec![9], values: vec![vec![0x5a; 32]] }),
        policy_version: 7,
        expires_unix: 0,
    }
}

fn usages(key: &pb::Key) -> Vec<pb::KeyUsage> {
    key.usages().collect()
}

/// The content a TLS 1.3 server signs in CertificateVerify (RFC 8446 section 4.4.3).
fn tls13_certificate_verify() -> Vec<u8> {
    let mut content = vec![0x20; 64];
    content.extend_from_slice(b"TLS 1.3, server CertificateVerify\0");
    content.extend_from_slice(&[0xab; 32]);
    content
}

fn string(bytes: &[u8]) -> Vec<u8> {
    let mut v = (bytes.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}

/// The OpenSSH blob of a P-256 key.
fn p256_blob(spki: &[u8]) -> Vec<u8> {
    let key = p256::PublicKey::from_public_key_der(spki).expect("spki");
    let point = p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&key, false);
    [string(b"ecdsa-sha2-nistp256"), string(b"nistp256"), string(point.as_bytes())].concat()
}

/// What an SSH client signs to log in with `blob` (RFC 4252 section 7, host-bound variant).
fn userauth(blob: &[u8]) -> Vec<u8> {
    let mut d = string(&[0x11; 32]);
    d.push(50);
    d.extend(string(b"alice"));
    d.extend(string(b"ssh-connection"));
    d.extend(string(b"publickey-hostbound-v00@openssh.com"));
    d.push(1);
    d.extend(string(b"ecdsa-sha2-nistp256"));
    d.extend(string(blob));
    d.extend(string(&[string(b"ssh-ed25519"), string(&[3; 32])].concat()));
    d
}

fn sshsig() -> Vec<u8> {
    let mut d = b"SSHSIG".to_vec();
    d.extend(string(b"file"));
    d.extend(string(b""));
    d.extend(string(b"sha512"));
    d.extend(string(&[0x42; 64]));
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_key_approves_policies_and_signs_nothing_raw() {
    let env = DaemonEnv::start().await;
    let mut keys = env.keys().await;
    let mut seal = SealServiceClient::new(env.channel().await);
    let key = keys.create_key(create("authority", pb::KeyAlgorithm::EccP256, &[pb::KeyUsage::Policy])).await;
    assert_eq!(usages(&key.expect("create").into_inner()), [pb::KeyUsage::Policy]);
    let approved = seal.sign_policy(approval("authority")).await.expect("SignPolicy").into_inner();
    // A raw signature over the very message an approval signs: the forgery of the review.
    let message = tpm_vault_proto::signed_policy::approval_message(&approved.approved_policy, &[]);
    let err = keys.sign(raw("authority", &message)).await.expect_err("a policy key signed raw");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("needs usage sign"), "{err:?}");
    let err = keys.sign(ssh("authority", &sshsig())).await.expect_err("a policy key signed for ssh");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // Certificates and CSRs are raw signatures too.
    let csr = pb::CreateCsrRequest {
        name: "authority".into(),
        subject: Some(pb::CertificateSubject { subject: "CN=x".into(), ..Default::default() }),
        auth: vec![],
    };
    assert_eq!(keys.create_csr(csr).await.expect_err("csr").code(), Code::PermissionDenied);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_key_signs_raw_and_approves_no_policy() {
    let env = DaemonEnv::start().await;
    let mut keys = env.keys().await;
    let mut seal = SealServiceClient::new(env.channel().await);
    // No usage given: `sign`.
    let key = keys.create_key(create("web", pb::KeyAlgorithm::EccP256, &[])).await.expect("create").into_inner();
    assert_eq!(usages(&key), [pb::KeyUsage::Sign]);
    keys.sign(raw("web", &tls13_certificate_verify())).await.expect("raw signature");
    let err = seal.sign_policy(approval("web")).await.expect_err("a sign key approved a policy");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("needs usage policy"), "{err:?}");
    let err = keys.sign(ssh("web", &sshsig())).await.expect_err("a sign key signed for ssh");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssh_key_signs_ssh_logins_and_sshsig_only() {
    let env = DaemonEnv::start().await;
    let mut keys = env.keys().await;
    keys.create_key(create("me", pb::KeyAlgorithm::EccP256, &[pb::KeyUsage::Ssh])).await.expect("create");
    keys.create_key(create("other", pb::KeyAlgorithm::EccP256, &[pb::KeyUsage::Ssh])).await.expect("create");
    let spki = |name: &str| {
        let mut keys = keys.clone();
        let name = name.to_owned();
        async move { keys.get_public_key(pb::GetPublicKeyRequest { name }).await.expect("public").into_inner().der }
    };
    let (mine, other) = (spki("me").await, spki("other").await);
    let verifying = p256::ecdsa::VerifyingKey::from_public_key_der(&mine).expect("spki");

    // The TLS handshake signature of the review: refused raw and as SSH data.
    let tls = tls13_certificate_verify();
    let err = keys.sign(raw("me", &tls)).await.expect_err("an ssh key signed raw");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = keys.sign(ssh("me", &tls)).await.expect_err("TLS content passed as SSH data");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("not SSH signing data"), "{err:?}");

    // A login: signed over SHA-256 of the whole request, as SSH verifies it.
    let login = userauth(&p256_blob(&mine));
    let sig = keys.sign(ssh("me", &login)).await.expect("userauth").into_inner();
    assert_eq!((sig.scheme(), sig.hash()), (pb::SignatureScheme::Ecdsa, pb::HashAlgorithm::Sha256));
    let der = p256::ecdsa::Signature::from_der(&sig.signature).expect("der");
    verifying.verify(&login, &der).expect("valid userauth signature");

    // A login request for another key, a digest, a trailing byte, another hash: refused.
    let err = keys.sign(ssh("me", &userauth(&p256_blob(&other)))).await.expect_err("other key");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let digest = pb::SignRequest { input: Some(pb::sign_request::Input::Digest(vec![0; 32])), ..ssh("me", &[]) };
    assert_eq!(keys.sign(digest).await.expect_err("digest").code(), Code::InvalidArgument);
    let mut trailing = login.clone();
    trailing.push(0);
    assert_eq!(keys.sign(ssh("me", &trailing)).await.expect_err("trailing").code(), Code::InvalidArgument);
    let sha384 = pb::SignRequest { hash: pb::HashAlgorithm::Sha384 as i32, ..ssh("me", &login) };
    assert_eq!(keys.sign(sha384).await.expect_err("sha384").code(), Code::InvalidArgument);

    // SSHSIG (ssh-keygen -Y sign, git commit signing).
    let blob = sshsig();
    let sig = keys.sign(ssh("me", &blob)).await.expect("sshsig").into_inner();
    verifying.verify(&blob, &p256::ecdsa::Signature::from_der(&sig.signature).expect("der")).expect("valid");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usages_suit_the_algorithm_and_are_only_narrowed() {
    let env = DaemonEnv::start().await;
    let mut keys = env.keys().await;
    for (alg, usage) in [
        (pb::KeyAlgorithm::MlDsa44, pb::KeyUsage::Ssh),
        (pb::KeyAlgorithm::EccP384, pb::KeyUsage::Policy),
        (pb::KeyAlgorithm::EccP256, pb::KeyUsage::Unspecified),
    ] {
        let err = keys.create_key(create("k", alg, &[usage])).await.expect_err("unsuitable usage");
        assert_eq!(err.code(), Code::InvalidArgument, "{alg:?} {usage:?}: {err:?}");
    }
    let both = [pb::KeyUsage::Sign, pb::KeyUsage::Policy];
    keys.create_key(create("k", pb::KeyAlgorithm::EccP256, &both)).await.expect("create");
    keys.sign(raw("k", b"before")).await.expect("raw signature before narrowing");

    let set = |usages: &[pb::KeyUsage]| pb::SetKeyUsageRequest {
        name: "k".into(),
        usages: usages.iter().map(|&u| u as i32).collect(),
    };
    let narrowed = keys.set_key_usage(set(&[pb::KeyUsage::Policy])).await.expect("narrow").into_inner();
    assert_eq!(usages(&narrowed), [pb::KeyUsage::Policy]);
    let err = keys.sign(raw("k", b"after")).await.expect_err("narrowed key signed raw");
    assert_eq!(err.code(), Code::PermissionDenied);
    for widen in [&[pb::KeyUsage::Sign][..], &[pb::KeyUsage::Policy, pb::KeyUsage::Ssh], &[]] {
        let err = keys.set_key_usage(set(widen)).await.expect_err("widened");
        assert_eq!(err.code(), Code::InvalidArgument, "{widen:?}: {err:?}");
    }
    let missing = pb::SetKeyUsageRequest { name: "nope".into(), usages: vec![pb::KeyUsage::Sign as i32] };
    assert_eq!(keys.set_key_usage(missing).await.expect_err("missing").code(), Code::NotFound);

    // The narrowing is on disk: a daemon restarted over the same state keeps it.
    let got = keys.get_key(pb::GetKeyRequest { name: "k".into() }).await.expect("get").into_inner();
    assert_eq!(usages(&got), [pb::KeyUsage::Policy]);
    let record = std::fs::read_to_string(env.tpm.state_dir().join("keys/k.key")).expect("record");
    assert!(record.contains("\"usages\": [\n    \"policy\"\n  ]"), "{record}");
    env.stop().await;
}
