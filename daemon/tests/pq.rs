//! Post-quantum keys: published FIPS 203/204 known-answer vectors (`tests/data/`, see its
//! README) checked with aws-lc-rs, then ML-DSA and ML-KEM keys sealed by a real swtpm: round
//! trips for every parameter set through the daemon, PCR 9 binding, hybrid ECDSA + ML-DSA
//! signatures, and the kx-group order of the TLS defaults.

mod support;

use std::collections::HashMap;

use aws_lc_rs::kem::{Ciphertext, DecapsulationKey, ML_KEM_1024, ML_KEM_768};
use aws_lc_rs::signature::{self, UnparsedPublicKey};

/// A `tests/data/*.kat` file: `key = hex` lines, `#` comments.
fn kat(file: &str) -> HashMap<String, String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn hex_field(v: &HashMap<String, String>, key: &str) -> Vec<u8> {
    hex::decode(v.get(key).unwrap_or_else(|| panic!("field {key}"))).expect("hex")
}

#[test]
fn ml_dsa_known_answers_verify() {
    let cases: [(&str, &'static signature::PqdsaVerificationAlgorithm, usize, usize); 3] = [
        ("mldsa44_verify.kat", &signature::ML_DSA_44, 1312, 2420),
        ("mldsa65_verify.kat", &signature::ML_DSA_65, 1952, 3309),
        ("mldsa87_verify.kat", &signature::ML_DSA_87, 2592, 4627),
    ];
    for (file, alg, pk_len, sig_len) in cases {
        let v = kat(file);
        let (pk, msg, sig) = (hex_field(&v, "pk"), hex_field(&v, "msg"), hex_field(&v, "sig"));
        assert_eq!((pk.len(), sig.len()), (pk_len, sig_len), "{file}: sizes");
        assert_eq!(v.get("result").map(String::as_str), Some("valid"));
        UnparsedPublicKey::new(alg, &pk).verify(&msg, &sig).unwrap_or_else(|_| panic!("{file}: valid vector rejected"));
        // One flipped bit anywhere must fail.
        let mut bad = sig.clone();
        bad[sig_len / 2] ^= 0x01;
        assert!(UnparsedPublicKey::new(alg, &pk).verify(&msg, &bad).is_err(), "{file}: tampered signature accepted");
        assert!(UnparsedPublicKey::new(alg, &pk).verify(b"Hello world!", &sig).is_err(), "{file}: other message");
    }
}

#[test]
fn ml_kem_known_answers_decapsulate() {
    for (file, alg, dk_len) in [("mlkem768_decap.kat", &ML_KEM_768, 2400), ("mlkem1024_decap.kat", &ML_KEM_1024, 3168)]
    {
        let v = kat(file);
        let (dk, c, k) = (hex_field(&v, "dk"), hex_field(&v, "c"), hex_field(&v, "k"));
        assert_eq!(dk.len(), dk_len, "{file}: dk size");
        let key = DecapsulationKey::new(alg, &dk).expect("dk");
        let shared = key.decapsulate(Ciphertext::from(c.as_slice())).expect("decapsulate");
        assert_eq!(hex::encode(shared.as_ref()), hex::encode(&k), "{file}: shared secret");
        // A modified ciphertext decapsulates (implicit rejection) to something else.
        let mut bad = c.clone();
        bad[0] ^= 0x01;
        let other = key.decapsulate(Ciphertext::from(bad.as_slice())).expect("implicit rejection");
        assert_ne!(other.as_ref(), k.as_slice(), "{file}: tampered ciphertext");
    }
}

// ---- Through the vault and the daemon, over a real swtpm. ----

use std::time::Duration;

use aws_lc_rs::kem::EncapsulationKey;
use support::{key, DaemonEnv, TpmEnv};
use tonic::Code;
use tpm_vault_daemon::formats::pq::raw_public_key;
use tpm_vault_daemon::model::{KeyAlg, PcrBank, PcrSelection, PcrTarget, Scheme, SignInput};
use tpm_vault_daemon::Error;
use tpm_vault_daemon::SignRequest;
use tpm_vault_proto::hybrid::{self, HybridSignature};
use tpm_vault_proto::v1 as pb;

fn create(name: &str, alg: pb::KeyAlgorithm) -> pb::CreateKeyRequest {
    pb::CreateKeyRequest { name: name.into(), algorithm: alg as i32, pcr_binding: None, auth: vec![], usages: vec![] }
}

fn sign_msg(name: &str, message: &[u8], scheme: pb::SignatureScheme) -> pb::SignRequest {
    pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Message(message.to_vec())),
        hash: 0,
        scheme: scheme as i32,
        auth: vec![],
        purpose: 0,
    }
}

fn verify_msg(name: &str, message: &[u8], signature: &[u8]) -> pb::VerifyRequest {
    pb::VerifyRequest {
        name: name.into(),
        input: Some(pb::verify_request::Input::Message(message.to_vec())),
        signature: signature.to_vec(),
        hash: 0,
        scheme: 0,
    }
}

fn ml_dsa_params(alg: KeyAlg) -> &'static signature::PqdsaVerificationAlgorithm {
    match alg {
        KeyAlg::MlDsa44 => &signature::ML_DSA_44,
        KeyAlg::MlDsa65 => &signature::ML_DSA_65,
        _ => &signature::ML_DSA_87,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_parameter_set_round_trips_through_the_daemon() {
    let env = DaemonEnv::start().await;
    let mut c = env.keys().await;
    let message = b"firmware image v1.2.3".to_vec();
    for (pb_alg, alg, sig_len) in [
        (pb::KeyAlgorithm::MlDsa44, KeyAlg::MlDsa44, 2420),
        (pb::KeyAlgorithm::MlDsa65, KeyAlg::MlDsa65, 3309),
        (pb::KeyAlgorithm::MlDsa87, KeyAlg::MlDsa87, 4627),
    ] {
        let name = alg.as_str();
        let created = c.create_key(create(name, pb_alg)).await.expect("create").into_inner();
        assert_eq!(created.algorithm, pb_alg as i32);
        assert!(!created.has_auth);
        let public =
            c.get_public_key(pb::GetPublicKeyRequest { name: name.into() }).await.expect("public").into_inner();
        assert!(public.pem.starts_with("-----BEGIN PUBLIC KEY-----"));
        assert!(public.ml_dsa_der.is_empty());
        // RFC 9881 SPKI: the same DER header as the Wycheproof vectors' publicKeyDer.
        if let Some(file) = match alg {
            KeyAlg::MlDsa44 => Some("mldsa44_verify.kat"),
            KeyAlg::MlDsa87 => Some("mldsa87_verify.kat"),
            _ => None,
        } {
            let prefix = hex_field(&kat(file), "spki_prefix");
            assert!(public.der.starts_with(&prefix), "{name}: SPKI header");
        }
        let sig = c.sign(sign_msg(name, &message, pb::SignatureScheme::Unspecified)).await.expect("sign").into_inner();
        assert_eq!(sig.scheme, pb::SignatureScheme::MlDsa as i32);
        assert_eq!(sig.hash, pb::HashAlgorithm::Unspecified as i32);
        assert_eq!(sig.signature.len(), sig_len, "{name}");
        // Independently, with aws-lc-rs and the exported SPKI.
        UnparsedPublicKey::new(ml_dsa_params(alg), &public.der).verify(&message, &sig.signature).expect("valid");
        assert!(c.verify(verify_msg(name, &message, &sig.signature)).await.expect("verify").into_inner().valid);
        let mut bad = sig.signature.clone();
        bad[100] ^= 1;
        assert!(!c.verify(verify_msg(name, &message, &bad)).await.expect("verify").into_inner().valid);
        assert!(!c.verify(verify_msg(name, b"other", &sig.signature)).await.expect("verify").into_inner().valid);
        // ML-DSA signs messages: a digest, a hash or a classical scheme is INVALID_ARGUMENT.
        let mut digest = sign_msg(name, b"", pb::SignatureScheme::Unspecified);
        digest.input = Some(pb::sign_request::Input::Digest(vec![0; 32]));
        let err = c.sign(digest).await.expect_err("digest");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("not digests"), "{}", err.message());
        let mut hashed = sign_msg(name, &message, pb::SignatureScheme::MlDsa);
        hashed.hash = pb::HashAlgorithm::Sha256 as i32;
        assert_eq!(c.sign(hashed).await.expect_err("hash").code(), Code::InvalidArgument);
        let ecdsa = c.sign(sign_msg(name, &message, pb::SignatureScheme::Ecdsa)).await.expect_err("ecdsa");
        assert_eq!(ecdsa.code(), Code::InvalidArgument);
        let decap = pb::DecapsulateRequest { name: name.into(), ciphertext: vec![0; 1088] };
        assert_eq!(c.decapsulate(decap).await.expect_err("decap").code(), Code::InvalidArgument);
    }
    for (pb_alg, alg, ct_len) in
        [(pb::KeyAlgorithm::MlKem768, KeyAlg::MlKem768, 1088), (pb::KeyAlgorithm::MlKem1024, KeyAlg::MlKem1024, 1568)]
    {
        let name = alg.as_str();
        c.create_key(create(name, pb_alg)).await.expect("create");
        let public =
            c.get_public_key(pb::GetPublicKeyRequest { name: name.into() }).await.expect("public").into_inner();
        let kem = if alg == KeyAlg::MlKem768 { &ML_KEM_768 } else { &ML_KEM_1024 };
        let ek = EncapsulationKey::new(kem, &raw_public_key(alg, &public.der).expect("SPKI")).expect("ek");
        for _ in 0..3 {
            let (ct, secret) = ek.encapsulate().expect("encapsulate");
            assert_eq!(ct.as_ref().len(), ct_len);
            let got = c
                .decapsulate(pb::DecapsulateRequest { name: name.into(), ciphertext: ct.as_ref().to_vec() })
                .await
                .expect("decapsulate")
                .into_inner();
            assert_eq!(got.shared_secret.as_slice(), secret.as_ref(), "{name}");
        }
        let short = pb::DecapsulateRequest { name: name.into(), ciphertext: vec![0; ct_len - 1] };
        assert_eq!(c.decapsulate(short).await.expect_err("short").code(), Code::InvalidArgument);
        let err = c.sign(sign_msg(name, &message, pb::SignatureScheme::Unspecified)).await.expect_err("kem sign");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("decapsulates"), "{}", err.message());
    }
    // Post-quantum keys cannot have a password, nor certificates.
    let mut pw = create("pw", pb::KeyAlgorithm::MlDsa65);
    pw.auth = b"secret".to_vec();
    assert_eq!(c.create_key(pw).await.expect_err("password").code(), Code::InvalidArgument);
    let csr = pb::CreateCsrRequest {
        name: "ml-dsa-65".into(),
        subject: Some(pb::CertificateSubject { subject: "CN=x".into(), ..Default::default() }),
        auth: vec![],
    };
    assert_eq!(c.create_csr(csr).await.expect_err("csr").code(), Code::InvalidArgument);
    let listed = c.list_keys(pb::ListKeysRequest { page_size: 0, page_token: String::new() }).await.expect("list");
    assert_eq!(listed.into_inner().keys.len(), 5);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_keys_survive_a_restart_and_deletion_is_final() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let name = key("fw");
    vault.create_key(name.clone(), KeyAlg::MlDsa87, 0, None, None).await.expect("create");
    let kem = key("kem");
    vault.create_key(kem.clone(), KeyAlg::MlKem1024, 0, None, None).await.expect("create");
    // The record holds the public key and ciphertext only: 32-byte seed + 16-byte tag.
    let record = std::fs::read_to_string(env.state_dir().join("keys/fw.key")).expect("record");
    let json: serde_json::Value = serde_json::from_str(&record).expect("json");
    assert_eq!(json["alg"], "ml-dsa-87");
    assert_eq!(json["pq"]["ciphertext"].as_str().map(str::len), Some(2 * (32 + 16)));
    assert_eq!(json["pq"]["public_key"].as_str().map(str::len), Some(2 * 2592));
    let kem_record = std::fs::read_to_string(env.state_dir().join("keys/kem.key")).expect("record");
    let json: serde_json::Value = serde_json::from_str(&kem_record).expect("json");
    assert_eq!(json["pq"]["ciphertext"].as_str().map(str::len), Some(2 * (3168 + 16)));
    let (_, spki) = vault.public_key(&name).await.expect("public");
    vault.shutdown(Duration::from_secs(5)).await;
    drop(vault);

    let vault = env.vault().await;
    let req = || SignRequest { input: SignInput::Message(b"after restart".to_vec()), hash: None, scheme: None };
    let out = vault.sign(&name, req(), None).await.expect("sign after restart");
    assert_eq!((out.scheme, out.hash), (Scheme::MlDsa, None));
    UnparsedPublicKey::new(&signature::ML_DSA_87, &spki).verify(b"after restart", &out.signature).expect("valid");
    let (_, kem_spki) = vault.public_key(&kem).await.expect("public");
    let ek =
        EncapsulationKey::new(&ML_KEM_1024, &raw_public_key(KeyAlg::MlKem1024, &kem_spki).expect("raw")).expect("ek");
    let (ct, secret) = ek.encapsulate().expect("encap");
    assert_eq!(vault.decapsulate(&kem, ct.as_ref()).await.expect("decap").as_slice(), secret.as_ref());
    // Re-created under the same name: a new key, never the old cached one.
    vault.delete(&name).await.expect("delete");
    vault.create_key(name.clone(), KeyAlg::MlDsa87, 0, None, None).await.expect("re-create");
    let again = vault.sign(&name, req(), None).await.expect("sign");
    assert!(UnparsedPublicKey::new(&signature::ML_DSA_87, &spki).verify(b"after restart", &again.signature).is_err());
    vault.shutdown(Duration::from_secs(5)).await;
}

/// A key record's stored post-quantum public key is checked whenever the record is read back,
/// as a key from elsewhere is: an ML-KEM key edited on disk (a coefficient above the modulus) or
/// an ML-DSA key cut short makes the record corrupt, with an error naming the file and the
/// fault, instead of being handed out as the key's (and encapsulated to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_key_edited_on_disk_is_refused_when_the_record_is_read() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    vault.create_key(key("kem"), KeyAlg::MlKem768, 0, None, None).await.expect("create");
    vault.create_key(key("fw"), KeyAlg::MlDsa65, 0, None, None).await.expect("create");
    vault.shutdown(Duration::from_secs(5)).await;
    drop(vault);
    let edit = |file: &str, change: &dyn Fn(&mut Vec<u8>)| {
        let path = env.state_dir().join("keys").join(file);
        let text = std::fs::read_to_string(&path).expect("record");
        let mut json: serde_json::Value = serde_json::from_str(&text).expect("json");
        let mut pk = hex::decode(json["pq"]["public_key"].as_str().expect("public key")).expect("hex");
        change(&mut pk);
        json["pq"]["public_key"] = hex::encode(&pk).into();
        std::fs::write(&path, serde_json::to_vec_pretty(&json).expect("json")).expect("write");
    };
    // Coefficient 1 (the high nibble of byte 1 and byte 2) := 4095.
    edit("kem.key", &|ek| {
        ek[1] |= 0xf0;
        ek[2] = 0xff;
    });
    edit("fw.key", &|pk| {
        pk.pop();
    });

    let vault = env.vault().await;
    let err = vault.public_key(&key("kem")).await.expect_err("a tampered ML-KEM key was handed out").to_string();
    assert!(err.contains("kem.key") && err.contains("coefficient 1 is 4095"), "{err}");
    let err = vault.decapsulate(&key("kem"), &[0; 1088]).await.expect_err("decapsulated").to_string();
    assert!(err.contains("coefficient 1 is 4095"), "{err}");
    let err = vault.public_key(&key("fw")).await.expect_err("a short ML-DSA key was handed out").to_string();
    assert!(err.contains("fw.key") && err.contains("ML-DSA-65 public key is 1951 bytes, not 1952"), "{err}");
    vault.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcr9_bound_ml_dsa_key_stops_signing_once_pcr9_moves_and_its_copy_is_evicted() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let pcr9 = PcrSelection::new(PcrBank::Sha256, &[9]).expect("selection");
    let measurement = |s: &str| tpm_vault_daemon::model::HashAlg::Sha256.digest(s.as_bytes());
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("kernel-1")).await.expect("extend");
    let name = key("boot-signer");
    let info = vault
        .create_key(name.clone(), KeyAlg::MlDsa65, 0, None, Some(PcrTarget { selection: pcr9.clone(), values: None }))
        .await
        .expect("create");
    assert_eq!(info.pcr_policy.map(|p| p.selection), Some(pcr9));
    let req = || SignRequest { input: SignInput::Message(b"update".to_vec()), hash: None, scheme: None };
    vault.sign(&name, req(), None).await.expect("sign in the measured state");
    // Only the TPM can open it: evicted, it unseals again (PCR 9 unchanged) and still signs.
    assert_eq!(vault.evict_pq_keys(), 1);
    vault.sign(&name, req(), None).await.expect("sign after re-unseal");
    // PCR 9 moves. The copy already in memory keeps working until it is evicted...
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("evil")).await.expect("extend");
    vault.sign(&name, req(), None).await.expect("cached copy");
    assert_eq!(vault.evict_pq_keys(), 1);
    // ...and then the TPM refuses to unseal it: FAILED_PRECONDITION naming PCR 9.
    for _ in 0..2 {
        match vault.sign(&name, req(), None).await {
            Err(Error::PcrMismatch(m)) => assert!(m.contains("sha256:9"), "names PCR 9: {m}"),
            other => panic!("expected PcrMismatch, got {other:?}"),
        }
    }
    let status = tonic::Status::from(&Error::PcrMismatch("x".into()));
    assert_eq!(status.code(), Code::FailedPrecondition);
    // A PCR-bound ML-KEM key behaves the same.
    let kem = key("boot-kem");
    let pcr = PcrSelection::new(PcrBank::Sha256, &[9]).expect("selection");
    vault
        .create_key(kem.clone(), KeyAlg::MlKem768, 0, None, Some(PcrTarget { selection: pcr, values: None }))
        .await
        .expect("create");
    let (_, spki) = vault.public_key(&kem).await.expect("public");
    let ek = EncapsulationKey::new(&ML_KEM_768, &raw_public_key(KeyAlg::MlKem768, &spki).expect("raw")).expect("ek");
    let (ct, secret) = ek.encapsulate().expect("encap");
    assert_eq!(vault.decapsulate(&kem, ct.as_ref()).await.expect("decap").as_slice(), secret.as_ref());
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("evil-2")).await.expect("extend");
    vault.evict_pq_keys();
    assert!(matches!(vault.decapsulate(&kem, ct.as_ref()).await, Err(Error::PcrMismatch(_))));
    vault.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_signatures_need_both_halves() {
    use p256::ecdsa::signature::{Signer, Verifier};
    use p256::pkcs8::DecodePublicKey;
    let env = DaemonEnv::start().await;
    let mut c = env.keys().await;
    let created = c.create_key(create("fw", pb::KeyAlgorithm::HybridP256MlDsa65)).await.expect("create").into_inner();
    assert_eq!(created.algorithm, pb::KeyAlgorithm::HybridP256MlDsa65 as i32);
    let public = c.get_public_key(pb::GetPublicKeyRequest { name: "fw".into() }).await.expect("public").into_inner();
    let ecdsa_key = p256::ecdsa::VerifyingKey::from_public_key_der(&public.der).expect("ECDSA half is P-256");
    assert!(public.ml_dsa_pem.starts_with("-----BEGIN PUBLIC KEY-----"));
    let image = vec![0x5a; 300_000];
    let sig = c.sign(sign_msg("fw", &image, pb::SignatureScheme::Hybrid)).await.expect("sign").into_inner();
    assert_eq!(sig.scheme, pb::SignatureScheme::Hybrid as i32);
    assert_eq!(sig.hash, pb::HashAlgorithm::Sha256 as i32);
    let parts = HybridSignature::decode(&sig.signature).expect("format");
    // Each half on its own, independently: both sign M' = header || message.
    let signed = hybrid::signed_message(&image);
    ecdsa_key.verify(&signed, &p256::ecdsa::Signature::from_der(&parts.ecdsa).expect("der")).expect("ECDSA half");
    UnparsedPublicKey::new(&signature::ML_DSA_65, &public.ml_dsa_der)
        .verify(&signed, &parts.ml_dsa)
        .expect("ML-DSA half");
    // Neither half is a valid plain signature of the message (no stripping).
    assert!(ecdsa_key.verify(&image, &p256::ecdsa::Signature::from_der(&parts.ecdsa).expect("der")).is_err());
    assert!(UnparsedPublicKey::new(&signature::ML_DSA_65, &public.ml_dsa_der).verify(&image, &parts.ml_dsa).is_err());
    // The daemon's verifier (and the default scheme) accepts it...
    assert!(c.verify(verify_msg("fw", &image, &sig.signature)).await.expect("verify").into_inner().valid);
    let again = c.sign(sign_msg("fw", b"v2", pb::SignatureScheme::Unspecified)).await.expect("default scheme");
    assert!(c.verify(verify_msg("fw", b"v2", &again.into_inner().signature)).await.expect("verify").into_inner().valid);
    // ...and rejects it with either half broken, or both swapped for other valid signatures.
    let encode = |ecdsa: Vec<u8>, ml_dsa: Vec<u8>| HybridSignature { ecdsa, ml_dsa }.encode().expect("encode");
    let mut bad_ecdsa = parts.clone();
    let last = bad_ecdsa.ecdsa.len() - 1;
    bad_ecdsa.ecdsa[last] ^= 1;
    let mut bad_ml_dsa = parts.clone();
    bad_ml_dsa.ml_dsa[7] ^= 1;
    let foreign_ecdsa: p256::ecdsa::Signature =
        p256::ecdsa::SigningKey::from_slice(&[7; 32]).expect("key").sign(&signed);
    let other = HybridSignature::decode(
        &c.sign(sign_msg("fw", b"other", pb::SignatureScheme::Hybrid)).await.expect("sign").into_inner().signature,
    )
    .expect("format");
    for (what, bytes) in [
        ("ECDSA half broken", encode(bad_ecdsa.ecdsa, parts.ml_dsa.clone())),
        ("ML-DSA half broken", encode(parts.ecdsa.clone(), bad_ml_dsa.ml_dsa)),
        ("ECDSA half from another key", encode(foreign_ecdsa.to_der().as_bytes().to_vec(), parts.ml_dsa.clone())),
        ("ML-DSA half of another message", encode(parts.ecdsa.clone(), other.ml_dsa.clone())),
        ("ECDSA half of another message", encode(other.ecdsa.clone(), parts.ml_dsa.clone())),
        ("truncated", sig.signature[..sig.signature.len() - 1].to_vec()),
        ("ECDSA half alone", parts.ecdsa.clone()),
        ("version 2", [&b"TVHS\x02"[..], &sig.signature[5..]].concat()),
    ] {
        let valid = c.verify(verify_msg("fw", &image, &bytes)).await.expect("verify").into_inner().valid;
        assert!(!valid, "accepted: {what}");
        let offline = tpm_vault_daemon::formats::pq::verify_hybrid(
            &public.der,
            &raw_public_key(KeyAlg::MlDsa65, &public.ml_dsa_der).expect("raw"),
            &image,
            &bytes,
        );
        assert!(!offline.expect("verifier"), "in-core verifier accepted: {what}");
    }
    // Hybrid keys sign hybrid only, whole messages only.
    for scheme in [pb::SignatureScheme::Ecdsa, pb::SignatureScheme::MlDsa] {
        let err = c.sign(sign_msg("fw", &image, scheme)).await.expect_err("single half");
        assert_eq!(err.code(), Code::InvalidArgument, "{scheme:?}");
    }
    let mut digest = sign_msg("fw", b"", pb::SignatureScheme::Hybrid);
    digest.input = Some(pb::sign_request::Input::Digest(vec![0; 32]));
    assert_eq!(c.sign(digest).await.expect_err("digest").code(), Code::InvalidArgument);
    env.stop().await;
}

#[test]
fn daemon_tls_defaults_prefer_x25519mlkem768() {
    use rustls::NamedGroup;
    let groups: Vec<NamedGroup> = tpm_vault_daemon::daemon::provider().kx_groups.iter().map(|g| g.name()).collect();
    assert_eq!(groups, [NamedGroup::X25519MLKEM768, NamedGroup::X25519, NamedGroup::secp256r1]);
}
