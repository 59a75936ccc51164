//! The TPM core against a real swtpm: every algorithm and scheme, DER edge cases, object-slot
//! pressure, restarts, a replaced TPM and bad input.

mod support;

use std::collections::HashSet;

use p256::pkcs8::DecodePublicKey;
use rand::seq::SliceRandom;
use support::{key, TpmEnv};
use tpm_vault_daemon::model::{HashAlg, KeyAlg, Scheme, SignInput};
use tpm_vault_daemon::Error;
use tpm_vault_daemon::SignRequest;
use tpm_vault_daemon::TpmError;

fn req(input: SignInput, hash: HashAlg, scheme: Scheme) -> SignRequest {
    SignRequest { input, hash: Some(hash), scheme: Some(scheme) }
}

/// Verifies with aws-lc-rs (an implementation independent of the daemon's RustCrypto verifier).
fn independent_verify(alg: KeyAlg, spki: &[u8], hash: HashAlg, scheme: Scheme, msg: &[u8], sig: &[u8]) -> bool {
    use aws_lc_rs::signature as s;
    let algo: &dyn s::VerificationAlgorithm = match (alg, hash, scheme) {
        (KeyAlg::EccP256, HashAlg::Sha256, _) => &s::ECDSA_P256_SHA256_ASN1,
        (KeyAlg::EccP256, HashAlg::Sha384, _) => &s::ECDSA_P256_SHA384_ASN1,
        (KeyAlg::EccP384, HashAlg::Sha256, _) => &s::ECDSA_P384_SHA256_ASN1,
        (KeyAlg::EccP384, HashAlg::Sha384, _) => &s::ECDSA_P384_SHA384_ASN1,
        (KeyAlg::EccP256, HashAlg::Sha512, _) => &s::ECDSA_P256_SHA512_ASN1,
        (KeyAlg::EccP384, HashAlg::Sha512, _) => &s::ECDSA_P384_SHA512_ASN1,
        (_, HashAlg::Sha256, Scheme::RsaPss) => &s::RSA_PSS_2048_8192_SHA256,
        (_, HashAlg::Sha384, Scheme::RsaPss) => &s::RSA_PSS_2048_8192_SHA384,
        (_, HashAlg::Sha512, Scheme::RsaPss) => &s::RSA_PSS_2048_8192_SHA512,
        (_, HashAlg::Sha256, _) => &s::RSA_PKCS1_2048_8192_SHA256,
        (_, HashAlg::Sha384, _) => &s::RSA_PKCS1_2048_8192_SHA384,
        (_, HashAlg::Sha512, _) => &s::RSA_PKCS1_2048_8192_SHA512,
        (_, HashAlg::Sha1, _) => &s::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
    };
    // aws-lc-rs wants the raw public key for ECDSA (SEC1 point) and RSA (PKCS#1): take it
    // out of the SPKI.
    let raw = spki_subject_public_key(spki);
    s::UnparsedPublicKey::new(algo, raw).verify(msg, sig).is_ok()
}

fn spki_subject_public_key(spki: &[u8]) -> Vec<u8> {
    let info = spki::SubjectPublicKeyInfoRef::try_from(spki).expect("spki");
    info.subject_public_key.raw_bytes().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_and_scheme_signs_and_verifies_independently() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let msg = b"the vault signs this".to_vec();
    let cases = [
        (KeyAlg::EccP256, vec![Scheme::Ecdsa]),
        (KeyAlg::EccP384, vec![Scheme::Ecdsa]),
        (KeyAlg::Rsa2048, vec![Scheme::RsaPss, Scheme::RsaPkcs1]),
        (KeyAlg::Rsa3072, vec![Scheme::RsaPss, Scheme::RsaPkcs1]),
    ];
    for (alg, schemes) in cases {
        let name = key(&format!("k-{}", alg.as_str()));
        vault.create_key(name.clone(), alg, 0, None, None).await.expect("create");
        let (got_alg, spki) = vault.public_key(&name).await.expect("public");
        assert_eq!(got_alg, alg);
        for scheme in schemes {
            for hash in [HashAlg::Sha256, HashAlg::Sha384, HashAlg::Sha512] {
                // Message form: the daemon hashes.
                let out = vault
                    .sign(&name, req(SignInput::Message(msg.clone()), hash, scheme), None)
                    .await
                    .expect("sign msg");
                assert!(
                    independent_verify(alg, &spki, hash, scheme, &msg, &out.signature),
                    "{alg} {scheme:?} {hash:?} msg"
                );
                // Digest form: the caller hashes.
                let digest = hash.digest(&msg);
                let out2 = vault
                    .sign(&name, req(SignInput::Digest(digest.clone()), hash, scheme), None)
                    .await
                    .expect("sign digest");
                assert!(
                    independent_verify(alg, &spki, hash, scheme, &msg, &out2.signature),
                    "{alg} {scheme:?} {hash:?} digest"
                );
                // The daemon's own verifier agrees, and rejects a different message.
                assert!(vault
                    .verify(&name, SignInput::Digest(digest), &out2.signature, Some(hash), Some(scheme))
                    .await
                    .expect("verify"));
                assert!(!vault
                    .verify(&name, SignInput::Message(b"other".to_vec()), &out2.signature, Some(hash), Some(scheme))
                    .await
                    .expect("verify"));
            }
        }
    }
}

/// SHA-1 is taken only as a precomputed digest for RSA PKCS#1 v1.5 (what the PKCS#11 module's
/// `CKM_RSA_PKCS` with a SHA-1 DigestInfo needs); the vault never hashes with it, nor signs it
/// in another scheme.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sha1_is_only_a_legacy_pkcs1_digest() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let msg = b"legacy".to_vec();
    let rsa = key("rsa");
    vault.create_key(rsa.clone(), KeyAlg::Rsa2048, 0, None, None).await.expect("create");
    let (_, spki) = vault.public_key(&rsa).await.expect("public");
    let digest = HashAlg::Sha1.digest(&msg);
    let out = vault
        .sign(&rsa, req(SignInput::Digest(digest.clone()), HashAlg::Sha1, Scheme::RsaPkcs1), None)
        .await
        .expect("SHA-1 PKCS#1 digest");
    assert!(independent_verify(KeyAlg::Rsa2048, &spki, HashAlg::Sha1, Scheme::RsaPkcs1, &msg, &out.signature));
    assert!(vault
        .verify(&rsa, SignInput::Digest(digest.clone()), &out.signature, Some(HashAlg::Sha1), Some(Scheme::RsaPkcs1))
        .await
        .expect("verify"));
    let refused = [
        (rsa.clone(), SignInput::Message(msg.clone()), Scheme::RsaPkcs1),
        (rsa.clone(), SignInput::Digest(digest.clone()), Scheme::RsaPss),
    ];
    for (name, input, scheme) in refused {
        let err = vault.sign(&name, req(input, HashAlg::Sha1, scheme), None).await.expect_err("SHA-1 refused");
        assert!(matches!(err, tpm_vault_daemon::Error::InvalidArgument(_)), "{err:?}");
    }
    let ec = key("ec");
    vault.create_key(ec.clone(), KeyAlg::EccP256, 0, None, None).await.expect("create");
    let err =
        vault.sign(&ec, req(SignInput::Digest(digest), HashAlg::Sha1, Scheme::Ecdsa), None).await.expect_err("refused");
    assert!(matches!(err, tpm_vault_daemon::Error::InvalidArgument(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_ecdsa_signatures_are_all_valid_der() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let name = key("der");
    vault.create_key(name.clone(), KeyAlg::EccP256, 0, None, None).await.expect("create");
    let (_, spki) = vault.public_key(&name).await.expect("public");
    let vk = p256::ecdsa::VerifyingKey::from_public_key_der(&spki).expect("spki");
    let mut short = 0;
    for i in 0..1000u32 {
        let msg = i.to_be_bytes().to_vec();
        let out = vault
            .sign(&name, req(SignInput::Message(msg.clone()), HashAlg::Sha256, Scheme::Ecdsa), None)
            .await
            .expect("sign");
        let sig = p256::ecdsa::Signature::from_der(&out.signature).expect("strict DER");
        // DER integers are minimal: a 32-byte scalar with a high zero byte encodes shorter.
        if out.signature.len() < 70 {
            short += 1;
        }
        use p256::ecdsa::signature::Verifier;
        vk.verify(&msg, &sig).expect("valid");
    }
    // With 1,000 signatures, short r or s happens ~8 times on average; we only report it.
    eprintln!("signatures with a short r or s: {short}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_keys_interleaved_never_exhaust_object_memory_or_leak_handles() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let mut names = Vec::new();
    for i in 0..50 {
        let n = key(&format!("many-{i:02}"));
        vault.create_key(n.clone(), KeyAlg::EccP256, 0, None, None).await.expect("create");
        names.push(n);
    }
    let mut order: Vec<_> = names.iter().chain(names.iter()).chain(names.iter()).collect();
    order.shuffle(&mut rand::thread_rng());
    let mut handles = Vec::new();
    for name in order {
        let v = vault.clone();
        let name = name.clone();
        handles.push(tokio::spawn(async move {
            let out = v
                .sign(
                    &name,
                    req(SignInput::Message(name.as_str().as_bytes().to_vec()), HashAlg::Sha256, Scheme::Ecdsa),
                    None,
                )
                .await;
            (name, out)
        }));
    }
    for h in handles {
        let (name, out) = h.await.expect("join");
        let out = out.unwrap_or_else(|e| panic!("sign {name}: {e}"));
        assert!(vault
            .verify(&name, SignInput::Message(name.as_str().as_bytes().to_vec()), &out.signature, None, None)
            .await
            .expect("verify"));
    }
    // At most SRK + 2 keys loaded under the default budget of 3.
    assert!(vault.transient_handles().await.expect("handles") <= 3);
    vault.flush().await.expect("flush");
    assert_eq!(vault.transient_handles().await.expect("handles"), 1, "only the SRK after the count reconnects");
    let listed: HashSet<_> = vault.list(None, 1000).await.expect("list").into_iter().map(|k| k.name).collect();
    assert_eq!(listed.len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_survive_tpm_restart_and_vault_reopen() {
    let mut env = TpmEnv::start();
    let mut publics = Vec::new();
    {
        let vault = env.vault().await;
        // Every signing algorithm (ML-KEM keys decapsulate instead; tests/pq.rs restarts those).
        for alg in KeyAlg::all().filter(|a| !a.is_kem()) {
            let n = key(&format!("persist-{}", alg.as_str()));
            vault.create_key(n.clone(), alg, 0, None, None).await.expect("create");
            publics.push((n.clone(), vault.public_key(&n).await.expect("public")));
        }
        vault.flush().await.expect("flush");
        vault.shutdown(std::time::Duration::from_secs(5)).await;
    }
    env.swtpm.restart().expect("restart swtpm");
    let vault = env.vault().await;
    for (n, (alg, spki)) in publics {
        let (alg2, spki2) = vault.public_key(&n).await.expect("public");
        assert_eq!((alg, &spki), (alg2, &spki2), "public key of {n} unchanged");
        let out = vault
            .sign(&n, SignRequest { input: SignInput::Message(b"after".to_vec()), hash: None, scheme: None }, None)
            .await
            .expect("sign after restart");
        assert!(vault
            .verify(&n, SignInput::Message(b"after".to_vec()), &out.signature, None, None)
            .await
            .expect("verify"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_tpm_is_refused_and_no_record_is_lost() {
    let env = TpmEnv::start();
    {
        let vault = env.vault().await;
        vault.create_key(key("kept"), KeyAlg::EccP256, 0, None, None).await.expect("create");
        vault.shutdown(std::time::Duration::from_secs(5)).await;
    }
    // A different TPM (fresh swtpm state = new owner seed) behind the same state dir.
    let other = tpm_vault_daemon::harness::Swtpm::start(&env.path().join("other-swtpm")).expect("swtpm");
    let mut cfg = env.vault_config();
    cfg.tcti = other.tcti();
    let err = tpm_vault_daemon::Vault::open(cfg).await.expect_err("must refuse");
    assert!(matches!(err, Error::Tpm(TpmError::SrkMismatch { .. })), "{err}");
    assert!(err.to_string().contains("mismatch"), "{err}");
    assert!(env.state_dir().join("keys/kept.key").exists());
    // The right TPM still works.
    let vault = env.vault().await;
    assert!(vault
        .sign(&key("kept"), SignRequest { input: SignInput::Message(vec![1]), hash: None, scheme: None }, None)
        .await
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_typed_errors() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let ec = key("ec");
    vault.create_key(ec.clone(), KeyAlg::EccP256, 0, None, None).await.expect("create");
    let r = vault.sign(&ec, req(SignInput::Digest(vec![0; 31]), HashAlg::Sha256, Scheme::Ecdsa), None).await;
    assert!(matches!(r, Err(Error::InvalidArgument(ref m)) if m.to_string().contains("31 bytes")), "{r:?}");
    let r = vault.sign(&key("missing"), req(SignInput::Message(vec![]), HashAlg::Sha256, Scheme::Ecdsa), None).await;
    assert!(matches!(r, Err(Error::KeyNotFound(_))), "{r:?}");
    let r = vault.sign(&ec, req(SignInput::Message(vec![]), HashAlg::Sha256, Scheme::RsaPss), None).await;
    assert!(matches!(r, Err(Error::InvalidArgument(ref m)) if m.to_string().contains("not supported")), "{r:?}");
    let r = vault.create_key(ec.clone(), KeyAlg::EccP256, 0, None, None).await;
    assert!(matches!(r, Err(Error::KeyExists(_))), "{r:?}");
    for bad in ["../x", "", &"a".repeat(65), "Upper"] {
        assert!(matches!(
            tpm_vault_daemon::model::KeyName::try_from(bad),
            Err(tpm_vault_daemon::model::InvalidInput(_))
        ));
    }
    let r = vault.delete(&key("missing")).await;
    assert!(matches!(r, Err(Error::KeyNotFound(_))), "{r:?}");
}
