//! Attestation on the TPM: quotes with the attestation key, the endorsement key and its
//! certificate, and credential activation. Functions run on the actor thread against a live
//! context (the actor passes its own); no files, no gRPC.

use tss_esapi::abstraction::ek;
use tss_esapi::abstraction::AsymmetricAlgorithmSelection;
use tss_esapi::attributes::SessionAttributesBuilder;
use tss_esapi::constants::{CapabilityType, SessionType};
use tss_esapi::handles::{AuthHandle, KeyHandle, ObjectHandle, SessionHandle};
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    CapabilityData, Data, Digest, EncryptedSecret, IdObject, Nonce, Public, SignatureScheme, SymmetricDefinition,
};
use tss_esapi::traits::Marshall;
use tss_esapi::Context;
use zeroize::Zeroizing;

use super::error::{wrap, TpmError};
use super::pcr;
use crate::model::PcrSelection;

/// TCG NV index of the RSA 2048 EK certificate.
const EK_CERT_NV_RSA2048: u32 = 0x01c0_0002;

/// A quote as the TPM returned it.
#[derive(Debug, Clone)]
pub struct Quote {
    /// Marshalled TPMS_ATTEST (what was signed).
    pub attest: Vec<u8>,
    /// Marshalled TPMT_SIGNATURE.
    pub signature: Vec<u8>,
    /// The PCR digest inside the attest structure.
    pub pcr_digest: Vec<u8>,
}

/// Quotes the selected PCRs with the (loaded) attestation key over `nonce`.
///
/// # Errors
/// TPM errors.
pub fn quote(ctx: &mut Context, ak: KeyHandle, nonce: &[u8], sel: &PcrSelection) -> Result<Quote, TpmError> {
    let data = Data::try_from(nonce.to_vec()).map_err(wrap("qualifying data"))?;
    let list = pcr::selection_list(sel)?;
    let (attest, signature) = ctx
        .execute_with_session(Some(AuthSession::Password), |c| c.quote(ak, data, SignatureScheme::Null, list))
        .map_err(wrap("TPM2_Quote"))?;
    let pcr_digest = match attest.attested() {
        tss_esapi::structures::AttestInfo::Quote { info } => info.pcr_digest().value().to_vec(),
        _ => return Err(TpmError::Malformed("TPM2_Quote returned a non-quote attestation".into())),
    };
    Ok(Quote {
        attest: attest.marshall().map_err(wrap("marshal attest"))?,
        signature: signature.marshall().map_err(wrap("marshal signature"))?,
        pcr_digest,
    })
}

/// TPM2_Certify of the (loaded) attestation key by itself over `nonce`: the proof of
/// possession a Keylime verifier asks for before it accepts evidence (the attest structure
/// names the AK and carries the nonce, and the AK's signature covers it). Returns the
/// marshalled TPMS_ATTEST and TPMT_SIGNATURE.
///
/// # Errors
/// TPM errors.
pub fn certify_self(ctx: &mut Context, ak: KeyHandle, nonce: &[u8]) -> Result<(Vec<u8>, Vec<u8>), TpmError> {
    let data = Data::try_from(nonce.to_vec()).map_err(wrap("qualifying data"))?;
    let (attest, signature) = ctx
        .execute_with_sessions((Some(AuthSession::Password), Some(AuthSession::Password), None), |c| {
            c.certify(ak.into(), ak, data, SignatureScheme::Null)
        })
        .map_err(wrap("TPM2_Certify"))?;
    Ok((attest.marshall().map_err(wrap("marshal attest"))?, signature.marshall().map_err(wrap("marshal signature"))?))
}

/// Creates the RSA 2048 EK (TCG default template) as a transient primary. The caller flushes it.
///
/// # Errors
/// TPM errors.
pub fn create_ek(ctx: &mut Context) -> Result<KeyHandle, TpmError> {
    ek::create_ek_object_2(ctx, AsymmetricAlgorithmSelection::Rsa(RsaKeyBits::Rsa2048), None)
        .map_err(wrap("TPM2_CreatePrimary(EK)"))
}

/// The EK public area.
///
/// # Errors
/// TPM errors.
pub fn ek_public(ctx: &mut Context) -> Result<Public, TpmError> {
    let ek = create_ek(ctx)?;
    let public = ctx.read_public(ek).map(|(p, _, _)| p);
    let _ = ctx.flush_context(ek.into());
    public.map_err(wrap("TPM2_ReadPublic"))
}

/// The EK certificate (DER) from its TCG NV index, or `None` if this TPM has none (firmware
/// TPMs and fresh swtpm instances often do not).
///
/// # Errors
/// TPM errors other than "no such index".
pub fn ek_certificate(ctx: &mut Context) -> Result<Option<Vec<u8>>, TpmError> {
    let (data, _) =
        ctx.get_capability(CapabilityType::Handles, EK_CERT_NV_RSA2048, 1).map_err(wrap("TPM2_GetCapability"))?;
    let present =
        matches!(data, CapabilityData::Handles(ref list) if list.iter().any(|h| u32::from(*h) == EK_CERT_NV_RSA2048));
    if !present {
        return Ok(None);
    }
    ek::retrieve_ek_pubcert(ctx, AsymmetricAlgorithmSelection::Rsa(RsaKeyBits::Rsa2048))
        .map(Some)
        .map_err(wrap("TPM2_NV_Read(EK certificate)"))
}

/// TPM2_ActivateCredential: recovers the secret a verifier bound to the AK's name and
/// encrypted to the EK (TPM2_MakeCredential), proving both live in this TPM.
///
/// The EK's policy session (PolicySecret with the endorsement hierarchy) is salted with `salt`
/// (the SRK) and encrypts the response, so the recovered secret crosses the TPM interface
/// encrypted, as an unsealed secret does.
///
/// # Errors
/// [`TpmError::CredentialRejected`] when the TPM refuses the credential (one made for another
/// AK or EK fails its integrity check); other TPM errors, classified.
pub fn activate_credential(
    ctx: &mut Context,
    salt: KeyHandle,
    ak: KeyHandle,
    credential_blob: &[u8],
    encrypted_secret: &[u8],
) -> Result<Zeroizing<Vec<u8>>, TpmError> {
    let blob = IdObject::try_from(credential_blob.to_vec()).map_err(wrap("credential blob"))?;
    let secret = EncryptedSecret::try_from(encrypted_secret.to_vec()).map_err(wrap("encrypted secret"))?;
    let ek = create_ek(ctx)?;
    let result = (|| {
        let session = ctx
            .start_auth_session(
                Some(salt),
                None,
                None,
                SessionType::Policy,
                SymmetricDefinition::AES_128_CFB,
                HashingAlgorithm::Sha256,
            )
            .map_err(wrap("TPM2_StartAuthSession"))?
            .ok_or_else(|| TpmError::Malformed("no session".into()))?;
        let policy = PolicySession::try_from(session).map_err(wrap("policy session"))?;
        let (attrs, mask) = SessionAttributesBuilder::new().with_encrypt(true).build();
        let r = ctx
            .tr_sess_set_attributes(session, attrs, mask)
            .map_err(wrap("Esys_TRSess_SetAttributes"))
            .and_then(|()| {
                ctx.execute_with_session(Some(AuthSession::Password), |c| {
                    c.policy_secret(
                        policy,
                        AuthHandle::Endorsement,
                        Nonce::default(),
                        Digest::default(),
                        Nonce::default(),
                        None,
                    )
                })
                .map_err(wrap("TPM2_PolicySecret"))
            })
            .and_then(|_| {
                ctx.execute_with_sessions((Some(AuthSession::Password), Some(session), None), |c| {
                    c.activate_credential(ak, ek, blob.clone(), secret.clone())
                })
                .map_err(TpmError::from_activation)
            });
        let _ = ctx.flush_context(ObjectHandle::from(SessionHandle::from(session)));
        r
    })();
    let _ = ctx.flush_context(ek.into());
    result.map(|d| Zeroizing::new(d.value().to_vec()))
}
