//! Attestation against a real swtpm: quotes whose PCR values match the quoted digest and
//! whose signature verifies with the AK, the EK, and a credential-activation round trip with a
//! MakeCredential done by tpm2-tools in software (`--tcti none`), with its errors.

mod support;

use p256::ecdsa::signature::Verifier;
use p256::pkcs8::DecodePublicKey;
use std::time::Duration;

use support::proxy::TpmProxy;
use support::TpmEnv;
use tpm_vault_daemon::model::{HashAlg, PcrBank, PcrSelection};
use tpm_vault_daemon::TpmError;
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
    let (blob, secret) = support::make_credential(env.path(), &ek_der, &ak.name, b"verifier-chosen credential");
    let recovered = vault.activate_credential(&blob, &secret).await.expect("activate");
    assert_eq!(recovered.as_slice(), b"verifier-chosen credential");
    // A credential bound to another name is refused, and the client is told so.
    let other = hex::decode(format!("000b{}", "11".repeat(32))).expect("hex");
    let (blob, secret) = support::make_credential(env.path(), &ek_der, &other, b"verifier-chosen credential");
    let err = vault.activate_credential(&blob, &secret).await.expect_err("another AK's credential");
    assert!(matches!(err, Error::Tpm(TpmError::CredentialRejected(_))), "{err:?}");
    let status = tonic::Status::from(&err);
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(status.message(), "the credential was not made for this TPM's AK and EK");
}

/// Only a credential the TPM rejects is PERMISSION_DENIED: a TPM failure on the way (here the
/// EK's policy session, TPM2_PolicySecret, answered TPM_RC_VALUE by a fault-injecting proxy,
/// then TPM_RC_RETRY past the bound) is reported like the same failure of any other command.
/// (Not TPM2_CreatePrimary: a replaced answer to a command that succeeded would leave its
/// object in the TPM, unknown to the vault.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activation_failures_of_the_tpm_are_not_permission_denied() {
    const CC_POLICY_SECRET: u32 = 0x0000_0151;
    const RC_VALUE: u32 = 0x0000_0084;
    let env = TpmEnv::start();
    let proxy = TpmProxy::start(env.swtpm.port());
    let vault = Vault::open(VaultConfig { tcti: proxy.tcti(), ..env.vault_config() }).await.expect("open");
    let ak = vault.attestation_key().await.expect("ak");
    let (ek_der, _) = vault.endorsement_key().await.expect("ek");
    let (blob, secret) = support::make_credential(env.path(), &ek_der, &ak.name, b"credential");
    proxy.inject(CC_POLICY_SECRET, RC_VALUE, 1);
    let err = vault.activate_credential(&blob, &secret).await.expect_err("the EK's policy fails");
    assert!(matches!(err, Error::Tpm(TpmError::Command { command: "TPM2_PolicySecret", .. })), "{err:?}");
    assert_eq!(tonic::Status::from(&err).code(), tonic::Code::Internal);
    proxy.inject_retry(CC_POLICY_SECRET, 1_000);
    let err = vault.activate_credential(&blob, &secret).await.expect_err("TPM busy");
    assert!(matches!(err, Error::Tpm(TpmError::Busy(_))), "{err:?}");
    assert_eq!(tonic::Status::from(&err).code(), tonic::Code::ResourceExhausted);
    proxy.inject_retry(CC_POLICY_SECRET, 0);
    let recovered = vault.activate_credential(&blob, &secret).await.expect("works again");
    assert_eq!(recovered.as_slice(), b"credential");
    vault.shutdown(Duration::from_secs(5)).await;
}
