//! Key records of the state directory (`keys/*.key`, `sealed/*`, `datakeys/*`):
//! `KeyRecord::from_bytes`, `SealedRecord::from_bytes` and `DataKeyRecord::from_bytes` on
//! arbitrary bytes, then what the vault does next with an accepted record without a TPM:
//! unmarshal its TPM2B_PUBLIC / TPM2B_PRIVATE blobs, convert the public key to SPKI, and
//! compute the PCR policy digest of its PCR binding.
//!
//! Properties: no panic; an accepted record names the expected key and survives
//! `to_bytes` → `from_bytes` unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::formats::store::{
    DataKeyRecord, KeyRecord, PcrPolicy, Record as _, SealPolicy, SealedRecord, TpmObject,
};
use tpm_vault_daemon::formats::{convert, pcr, KeyBlob};
use tpm_vault_daemon::model::{KeyAlg, KeyName};

fuzz_target!(|data: &[u8]| {
    // The file name the store would have read: the fixed seed name, and the name the record
    // claims (so mutated names still reach the checks after the name comparison).
    let mut names = vec![KeyName::try_from(tpm_vault_fuzz::RECORD_NAME).unwrap_or_else(|e| panic!("{e}"))];
    if let Some(claimed) = serde_json::from_slice::<serde_json::Value>(data)
        .ok()
        .and_then(|v| v.get("name").and_then(|n| n.as_str()).and_then(|n| KeyName::try_from(n).ok()))
    {
        names.push(claimed);
    }
    for expected in &names {
        if let Ok(r) = KeyRecord::from_bytes(data, expected) {
            assert_eq!(&r.name, expected);
            assert_eq!(KeyRecord::from_bytes(&r.to_bytes(), expected).as_ref(), Ok(&r), "key record round trip");
            blobs(&r.object, Some(r.alg));
            if let Some(p) = &r.pcr_policy {
                pcr_policy(p);
            }
        }
        if let Ok(r) = SealedRecord::from_bytes(data, expected) {
            assert_eq!(&r.name, expected);
            assert_eq!(SealedRecord::from_bytes(&r.to_bytes(), expected).as_ref(), Ok(&r), "sealed record round trip");
            blobs(&r.object, None);
            match &r.policy {
                SealPolicy::Pcr { pcr } => pcr_policy(pcr),
                SealPolicy::Authorized { selection, authority_spki, .. } => {
                    let _ = pcr::selection_list(selection);
                    let _ = tpm_vault_daemon::formats::seal::authority_der(authority_spki);
                }
            }
        }
        if let Ok(r) = DataKeyRecord::from_bytes(data, expected) {
            assert_eq!(&r.name, expected);
            assert_eq!(DataKeyRecord::from_bytes(&r.to_bytes(), expected).as_ref(), Ok(&r), "data key round trip");
            blobs(&r.object, None);
            if let Some(p) = &r.pcr_policy {
                pcr_policy(p);
            }
        }
    }
});

/// What loading a record's object does before it reaches the TPM.
fn blobs(object: &TpmObject, alg: Option<KeyAlg>) {
    if let (Ok(blob), Some(alg)) = (KeyBlob::try_from(object), alg) {
        let _ = convert::public_key_der(alg, &blob.public);
    }
}

/// What a PCR-bound object's policy session computes from the record.
fn pcr_policy(p: &PcrPolicy) {
    let _ = pcr::selection_list(&p.selection);
    let _ = pcr::policy_pcr_digest(&p.selection, &p.values);
    let _ = p.selection.to_string();
}
