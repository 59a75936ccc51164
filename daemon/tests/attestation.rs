//! Attestation against a real swtpm: quotes whose PCR values match the quoted digest and
//! whose signature verifies with the AK, the EK, and a credential-activation round trip with a
//! MakeCredential done by tpm2-tools in software (`--tcti none`).

mod support;

use p256::ecdsa::signature::Verifier;
use p256::pkcs8::DecodePublicKey;
use std::time::Duration;

use support::proxy::TpmProxy;
use support::TpmEnv;
use tpm_vault_daemon::model::{HashAlg, PcrBank, PcrSelection};
use tpm_vault_daemon::spawn::CloseInheritedFds as _;
use tpm_vault_daemon::{Error, Vault, VaultConfig};

fn pcrs_0_9() -> PcrSelection {
    PcrSelection::new(PcrBank::Sha256, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).expect("sel")
}

/// Pulls (extraData, pcrDigest) out of a TPMS_ATTEST quote.
fn nonce_and_digest(attest: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut at = 6; // magic + type
    let name_len = usize::from(u16::from_be_bytes([attest[at], attest[at + 1]]));
    at += 2 + name_len;
    let extra_len = usize::from(u16::from_be_bytes([attest[at], attest[at + 1]]));
    let extra = attest[at + 2..at + 2 + extra_len].to_vec();
    let digest = attest[attest.len() - 32..].to_vec();
    (extra, digest)
}

/// r || s of a marshalled ECDSA TPMT_SIGNATURE.
fn ecdsa_from_tpmt(sig: &[u8]) -> p256::ecdsa::Signature {
    assert_eq!(&sig[..4], &[0x00, 0x18, 0x00, 0x0b], "ECDSA with SHA-256");
    let rl = usize::from(u16::from_be_bytes([sig[4], sig[5]]));
    let r = &sig[6..6 + rl];
    let sl = usize::from(u16::from_be_bytes([sig[6 + rl], sig[7 + rl]]));
    let s = &sig[8 + rl..8 + rl + sl];
    let mut rb = [0u8; 32];
    rb[32 - r.len()..].copy_from_slice(r);
    let mut sb = [0u8; 32];
    sb[32 - s.len()..].copy_from_slice(s);
    p256::ecdsa::Signature::from_scalars(rb, sb).expect("scalars")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quote_is_signed_by_the_ak_and_matches_the_returned_pcrs() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    vault.pcr_extend(PcrBank::Sha256, 9, HashAlg::Sha256.digest(b"kernel")).await.expect("extend");
    let nonce = b"fresh verifier nonce".to_vec();
    let q = vault.quote(pcrs_0_9(), nonce.clone()).await.expect("quote");
    let (extra, digest) = nonce_and_digest(&q.attest);
    assert_eq!(extra, nonce);
    assert_eq!(digest, HashAlg::Sha256.digest(&q.values.concat()), "values hash to the quoted digest");
    assert_eq!(q.values.len(), 10);
    assert_eq!(q.values[9], vault.pcr_read(&PcrSelection::new(PcrBank::Sha256, &[9]).expect("s")).await.expect("r")[0]);
    let vk = p256::ecdsa::VerifyingKey::from_public_key_der(&q.ak.spki).expect("ak");
    vk.verify(&q.attest, &ecdsa_from_tpmt(&q.signature)).expect("AK signature verifies");
    let mut tampered = q.attest.clone();
    tampered[20] ^= 1;
    assert!(vk.verify(&tampered, &ecdsa_from_tpmt(&q.signature)).is_err());
    // The AK is created once and kept.
    let again = vault.quote(pcrs_0_9(), vec![1]).await.expect("quote");
    assert_eq!(again.ak.spki, q.ak.spki);
    // Nonce bounds.
    assert!(matches!(vault.quote(pcrs_0_9(), vec![]).await, Err(Error::InvalidArgument(_))));
    assert!(matches!(vault.quote(pcrs_0_9(), vec![0; 65]).await, Err(Error::InvalidArgument(_))));
}

/// A quote costs one TPM command while the PCRs stay put: the values read for an earlier quote
/// are returned when they hash to the new quote's digest, and read again once a PCR changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotes_read_the_pcrs_again_only_when_they_changed() {
    // TPM2_PCR_Read of one bank's 3 PCRs: tag NO_SESSIONS, size 20, TPM_CC_PCR_Read.
    const PCR_READ: [u8; 10] = [0x80, 0x01, 0, 0, 0, 0x14, 0, 0, 0x01, 0x7E];
    let env = TpmEnv::start();
    let proxy = TpmProxy::start(env.swtpm.port());
    let vault = Vault::open(VaultConfig { tcti: proxy.tcti(), ..env.vault_config() }).await.expect("open");
    let sel = PcrSelection::new(PcrBank::Sha256, &[0, 7, 9]).expect("sel");
    let quoted = |attest: &[u8], values: &[Vec<u8>]| {
        assert_eq!(nonce_and_digest(attest).1, HashAlg::Sha256.digest(&values.concat()), "values are the quoted ones");
    };
    let before = proxy.count(&PCR_READ);
    let first = vault.quote(sel.clone(), vec![1]).await.expect("quote");
    quoted(&first.attest, &first.values);
    assert_eq!(proxy.count(&PCR_READ) - before, 1, "the first quote reads the PCRs");
    for n in 2..5u8 {
        let q = vault.quote(sel.clone(), vec![n]).await.expect("quote");
        quoted(&q.attest, &q.values);
        assert_eq!(q.values, first.values);
    }
    assert_eq!(proxy.count(&PCR_READ) - before, 1, "quotes over unchanged PCRs read nothing");
    vault.pcr_extend(PcrBank::Sha256, 9, HashAlg::Sha256.digest(b"next kernel")).await.expect("extend");
    let after = vault.quote(sel.clone(), vec![9]).await.expect("quote");
    quoted(&after.attest, &after.values);
    assert_ne!(after.values[2], first.values[2], "PCR 9 changed");
    assert_eq!(after.values[..2], first.values[..2]);
    assert_eq!(proxy.count(&PCR_READ) - before, 2, "a changed PCR is read again");
    vault.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_activation_round_trip() {
    let env = TpmEnv::start();
    let vault = env.vault().await;
    let ak = vault.attestation_key().await.expect("ak");
    let (ek_der, cert) = vault.endorsement_key().await.expect("ek");
    assert!(cert.is_none(), "a bare swtpm has no EK certificate");
    let dir = env.path();
    let ek_pem = p256::pkcs8::der::pem::encode_string("PUBLIC KEY", p256::pkcs8::der::pem::LineEnding::LF, &ek_der)
        .expect("pem");
    std::fs::write(dir.join("ek.pem"), ek_pem).expect("write");
    std::fs::write(dir.join("secret.bin"), b"verifier-chosen credential").expect("write");
    let out = std::process::Command::new("tpm2_makecredential")
        .close_inherited_fds()
        .args(["--tcti", "none", "-G", "rsa", "-u"])
        .arg(dir.join("ek.pem"))
        .arg("-s")
        .arg(dir.join("secret.bin"))
        .args(["-n", &hex::encode(&ak.name), "-o"])
        .arg(dir.join("cred.out"))
        .output()
        .expect("tpm2_makecredential");
    assert!(out.status.success(), "makecredential: {}", String::from_utf8_lossy(&out.stderr));
    let cred = std::fs::read(dir.join("cred.out")).expect("cred");
    // tpm2-tools credential file: magic 0xBADCC0DE, version 1, TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET.
    assert_eq!(&cred[..4], &[0xBA, 0xDC, 0xC0, 0xDE]);
    let blob_len = usize::from(u16::from_be_bytes([cred[8], cred[9]]));
    let blob = &cred[8..10 + blob_len];
    let secret = &cred[10 + blob_len..];
    let recovered = vault.activate_credential(blob, secret).await.expect("activate");
    assert_eq!(recovered, b"verifier-chosen credential");
    // A credential bound to another name is refused.
    let out = std::process::Command::new("tpm2_makecredential")
        .close_inherited_fds()
        .args(["--tcti", "none", "-G", "rsa", "-u"])
        .arg(dir.join("ek.pem"))
        .arg("-s")
        .arg(dir.join("secret.bin"))
        .args(["-n", &format!("000b{}", "11".repeat(32)), "-o"])
        .arg(dir.join("cred2.out"))
        .output()
        .expect("tpm2_makecredential");
    assert!(out.status.success());
    let cred = std::fs::read(dir.join("cred2.out")).expect("cred");
    let blob_len = usize::from(u16::from_be_bytes([cred[8], cred[9]]));
    let r = vault.activate_credential(&cred[8..10 + blob_len], &cred[10 + blob_len..]).await;
    assert!(matches!(r, Err(Error::PermissionDenied(_))), "{r:?}");
}
