//! Hybrid signatures (`SIGNATURE_SCHEME_HYBRID`, the `tpm_vault_proto::hybrid` format) as the
//! daemon's Verify (`crypto::pq::verify_hybrid`) and the client library
//! (`tpm_vault_client::verify_hybrid`) check them, under a fixed key pair (the fuzz authority's
//! P-256 key and `tpm_vault_fuzz::ml_dsa_65`).
//!
//! Input: a 2-byte big-endian message length, the message, then the signature.
//!
//! Properties: no panic; a signature that decodes re-encodes to the same bytes (one encoding
//! per signature); the daemon and the client agree; an accepted signature has a valid ECDSA
//! half and a valid ML-DSA-65 half over `header || message`, and neither half alone verifies
//! the plain message.
#![no_main]

use aws_lc_rs::signature::{KeyPair, UnparsedPublicKey, ML_DSA_65};
use libfuzzer_sys::fuzz_target;
use p256::ecdsa::signature::Verifier;
use tpm_vault_proto::hybrid::{signed_message, HybridSignature};

fuzz_target!(|data: &[u8]| {
    let Some((message, sig)) = tpm_vault_fuzz::split_message(data) else { return };
    let ml_dsa = tpm_vault_fuzz::ml_dsa_65().public_key();
    let ml_dsa_spki = aws_lc_rs::encoding::AsDer::as_der(ml_dsa).unwrap_or_else(|e| panic!("ML-DSA SPKI: {e}"));
    let ecdsa_spki = tpm_vault_fuzz::authority_spki();

    let decoded = HybridSignature::decode(sig);
    if let Ok(parts) = &decoded {
        assert_eq!(parts.encode().as_deref(), Ok(sig), "a decoded hybrid signature re-encodes differently");
    }
    let daemon = tpm_vault_daemon::formats::pq::verify_hybrid(ecdsa_spki, ml_dsa.as_ref(), message, sig)
        .unwrap_or_else(|e| panic!("daemon: {e}"));
    let client = tpm_vault_client::verify_hybrid(ecdsa_spki, ml_dsa_spki.as_ref(), message, sig)
        .unwrap_or_else(|e| panic!("client: {e}"));
    assert_eq!(daemon, client, "the daemon and the client disagree");
    if !daemon {
        return;
    }
    let Ok(parts) = decoded else { panic!("accepted a signature that does not decode") };
    let vk = tpm_vault_fuzz::authority().verifying_key().to_owned();
    let ecdsa = p256::ecdsa::Signature::from_der(&parts.ecdsa).unwrap_or_else(|e| panic!("accepted ECDSA half: {e}"));
    let signed = signed_message(message);
    assert!(vk.verify(&signed, &ecdsa).is_ok(), "accepted an ECDSA half that does not verify");
    let pq = UnparsedPublicKey::new(&ML_DSA_65, ml_dsa.as_ref());
    assert!(pq.verify(&signed, &parts.ml_dsa).is_ok(), "accepted an ML-DSA half that does not verify");
    // Domain separation: no half is a plain signature of the message.
    assert!(vk.verify(message, &ecdsa).is_err(), "the ECDSA half is a plain signature of the message");
    assert!(pq.verify(message, &parts.ml_dsa).is_err(), "the ML-DSA half is a plain signature of the message");
});
