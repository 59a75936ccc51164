//! Parameter encryption, proven on the wire: a recording TCP proxy sits between the vault and
//! swtpm and keeps every byte both ways. Sealing and unsealing through the vault's encrypted
//! sessions never show the sealed bytes; the same create through a plain password session
//! does (the control that shows the capture works). Credential activation, which also returns
//! a secret, hides it the same way.

mod support;

use support::TpmEnv;
use tpm_vault_daemon::model::{PcrBank, PcrSelection};
use tpm_vault_daemon::VaultConfig;
use tpm_vault_daemon::{
    daemon::PolicyAuth,
    formats::{pcr, templates, KeyBlob},
    TpmError,
};
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::structures::{Digest, SensitiveData};
use tss_esapi::Context;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_bytes_never_cross_the_tpm_interface_in_clear() {
    let env = TpmEnv::start();
    let proxy = support::proxy::TpmProxy::start(env.swtpm.port());
    let cfg = VaultConfig { tcti: proxy.tcti(), ..env.vault_config() };
    let vault = tpm_vault_daemon::Vault::open(cfg).await.expect("open via proxy");
    assert!(proxy.len() > 0, "traffic goes through the proxy");

    // A recognisable 32-byte secret, sealed and unsealed through the vault's sessions.
    let secret: Vec<u8> = (0u8..32).map(|i| 0xA0 ^ i.wrapping_mul(37)).collect();
    let sel = PcrSelection::new(PcrBank::Sha256, &[9]).expect("sel");
    let current = vault.pcr_read(&sel).await.expect("read");
    let policy = pcr::policy_pcr_digest(&sel, &current).expect("digest");
    let sealed = secret.clone();
    let object = vault
        .tpm()
        .call(tpm_vault_daemon::ClientKey::DAEMON, "create", move |tpm| tpm.seal_key(Some(&policy), &sealed))
        .await
        .expect("create sealed object");
    let blob = KeyBlob::try_from(&object).expect("stored object loads");
    let auth = PolicyAuth::Pcr(sel.clone());
    let opened = vault
        .tpm()
        .call(tpm_vault_daemon::ClientKey::DAEMON, "unseal", move |tpm| tpm.unseal(&blob, Some(&auth)))
        .await
        .expect("unseal");
    assert_eq!(opened.as_slice(), secret.as_slice(), "round trip through the TPM");
    assert!(!proxy.contains(&secret), "the sealed secret crossed the wire in clear");

    // A whole vault seal/unseal of a large secret: its bytes never reach the TPM at all.
    let big: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let name = tpm_vault_daemon::model::KeyName::try_from("wire").expect("name");
    let target = tpm_vault_daemon::SealTarget::Pcr { selection: sel.clone(), values: None };
    vault.seal(name.clone(), zeroize::Zeroizing::new(big.clone()), target, 0, false).await.expect("seal");
    assert_eq!(vault.unseal(&name, None).await.expect("unseal").as_slice(), big.as_slice());
    assert!(!proxy.contains(&big[..64]));

    // Control: the same create through a plain password session leaks the bytes. The vault
    // lets go of the TPM first (swtpm serves one connection), then the test drives its own
    // ESAPI context through the same proxy: the vault exposes no raw context.
    vault.shutdown(std::time::Duration::from_secs(5)).await;
    let control: Vec<u8> = (0u8..32).map(|i| 0x5A ^ i.wrapping_mul(11)).collect();
    let c = control.clone();
    let tcti = proxy.tcti();
    tokio::task::spawn_blocking(move || -> Result<(), TpmError> {
        let wrap = |what| move |e| TpmError::from_tss(what, e);
        let mut ctx = Context::new(tcti.parse().map_err(wrap("tcti"))?).map_err(wrap("connect"))?;
        let srk_template = templates::srk()?;
        let srk = ctx
            .execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.create_primary(Hierarchy::Owner, srk_template, None, None, None, None)
            })
            .map_err(wrap("TPM2_CreatePrimary"))?
            .key_handle;
        let policy = pcr::policy_pcr_digest(&sel, &current)?;
        let template = templates::sealed(Digest::try_from(policy).map_err(wrap("digest"))?)?;
        let data = SensitiveData::try_from(c).map_err(wrap("data"))?;
        ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
            ctx.create(srk, template, None, Some(data), None, None)
        })
        .map_err(wrap("TPM2_Create"))?;
        ctx.flush_context(srk.into()).map_err(wrap("flush"))
    })
    .await
    .expect("join")
    .expect("plain create");
    assert!(proxy.contains(&control), "without parameter encryption the bytes are visible");
}

/// Credential activation returns a secret too: the EK's policy session is salted and encrypts
/// the response, so the recovered credential never crosses the TPM interface in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activated_credentials_never_cross_the_tpm_interface_in_clear() {
    let env = TpmEnv::start();
    let proxy = support::proxy::TpmProxy::start(env.swtpm.port());
    let cfg = VaultConfig { tcti: proxy.tcti(), ..env.vault_config() };
    let vault = tpm_vault_daemon::Vault::open(cfg).await.expect("open via proxy");
    let ak = vault.attestation_key().await.expect("ak");
    let (ek_der, _) = vault.endorsement_key().await.expect("ek");
    // A recognisable 32-byte credential (the most TPM2_MakeCredential takes with SHA-256).
    let credential: Vec<u8> = (0u8..32).map(|i| 0xC3 ^ i.wrapping_mul(29)).collect();
    let (blob, secret) = support::make_credential(env.path(), &ek_der, &ak.name, &credential);
    let recovered = vault.activate_credential(&blob, &secret).await.expect("activate");
    assert_eq!(recovered.as_slice(), credential.as_slice(), "round trip through the TPM");
    assert!(!proxy.contains(&credential), "the credential crossed the wire in clear");
    vault.shutdown(std::time::Duration::from_secs(5)).await;
}
