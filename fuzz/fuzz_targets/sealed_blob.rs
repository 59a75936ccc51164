//! Sealed blobs (`seal import`, the `blob` of `ImportSealed`): `SealedBlob::parse`, the policy
//! digest and object checks the daemon makes before TPM2_Import, and the storage-key parser
//! `seal-for --srk` uses on the same bytes.
//!
//! Properties: no panic; an accepted blob re-encodes to exactly the bytes parsed; short errors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_proto::sealed_blob::{SealedBlob, StorageKey};

fuzz_target!(|data: &[u8]| {
    let _ = StorageKey::from_public(data);
    let blob = match SealedBlob::parse(data) {
        Ok(blob) => blob,
        Err(e) => {
            assert!(e.to_string().len() <= 1024, "long error message: {e}");
            return;
        }
    };
    let again = blob.to_bytes().unwrap_or_else(|e| panic!("an accepted blob does not re-encode: {e}"));
    assert_eq!(again, data, "encode(parse(x)) != x");
    let _ = blob.policy.digest();
    let _ = blob.object_auth_policy();
});
