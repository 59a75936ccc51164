//! Signed PCR policies (the `signed_policy` bytes of `Unseal`): `prost` decoding of
//! `tpmvault.v1.SignedPolicy`, then the daemon's software approval check
//! (`vault::seal::check_approval`) against a fixed policy authority, for the PCR selection the
//! approval itself names and for the default one (sha256:9).
//!
//! Properties: no panic; an accepted approval really is signed by the authority over its own
//! PCR values, is not expired and not revoked; decoding is stable under re-encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p256::ecdsa::signature::Verifier;
use prost::Message;
use tpm_vault_daemon::daemon::PolicyAuth;
use tpm_vault_daemon::formats::seal::check_approval;
use tpm_vault_daemon::model::{PcrBank, PcrSelection};
use tpm_vault_proto::signed_policy;
use tpm_vault_proto::v1::SignedPolicy;

fuzz_target!(|data: &[u8]| {
    let Ok(approval) = SignedPolicy::decode(data) else { return };
    let again = SignedPolicy::decode(approval.encode_to_vec().as_slice()).unwrap_or_else(|e| panic!("re-decode: {e}"));
    assert_eq!(again, approval, "decode(encode(x)) != x");

    let mut selections = vec![PcrSelection::new(PcrBank::Sha256, &[9]).unwrap_or_else(|e| panic!("{e}"))];
    if let Ok(own) = approval.pcr_bank.parse::<PcrBank>().and_then(|b| PcrSelection::new(b, &approval.pcrs)) {
        selections.push(own);
    }
    let spki = tpm_vault_fuzz::authority_spki();
    for sel in &selections {
        // The conversion the Unseal handler makes at the edge.
        let converted = tpm_vault_daemon::daemon::SignedPolicy::from(approval.clone());
        let auth = match check_approval(&converted, sel, spki, tpm_vault_fuzz::MIN_POLICY_VERSION) {
            Ok(auth) => auth,
            Err(e) => {
                // The message goes back to the peer of Unseal: it must stay short.
                assert!(e.to_string().len() <= 1024, "long error message: {e}");
                continue;
            }
        };
        // Accepted: it must be what the TPM will accept too.
        let PolicyAuth::Authorized { selection, approved_policy, .. } = auth else {
            panic!("an approval converted to a plain PCR policy")
        };
        assert_eq!(&selection, sel);
        assert_eq!(approved_policy, approval.approved_policy);
        assert!(approval.policy_version >= tpm_vault_fuzz::MIN_POLICY_VERSION, "revoked approval accepted");
        let vk = tpm_vault_fuzz::authority().verifying_key().to_owned();
        let sig = p256::ecdsa::Signature::from_der(&approval.signature).unwrap_or_else(|e| panic!("{e}"));
        let msg = signed_policy::approval_message(&approval.approved_policy, &approval.policy_ref);
        assert!(vk.verify(&msg, &sig).is_ok(), "accepted an approval the authority did not sign");
        let digest = tpm_vault_daemon::formats::pcr::policy_pcr_digest(sel, &approval.pcr_values)
            .unwrap_or_else(|e| panic!("accepted approval with bad PCR values: {e}"));
        assert_eq!(digest, approval.approved_policy);
    }
});
