//! ActivateCredential's inputs, the marshalled TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET
//! from TPM2_MakeCredential: the vault's `strip_tpm2b` checks (through
//! `tpm_vault_daemon::fuzzing::credential_inputs`), then the tss-esapi buffers the TPM layer
//! builds from them.
//!
//! Input: a 2-byte big-endian length of the credential blob, the blob, then the secret.
//!
//! Properties: no panic; an accepted input is exactly its size prefix and that many bytes
//! (1 or more), and fits the TPM layer's buffers (so it never turns into an INTERNAL error);
//! error messages are short.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tss_esapi::structures::{EncryptedSecret, IdObject};

fuzz_target!(|data: &[u8]| {
    let Some((blob, secret)) = tpm_vault_fuzz::split_message(data) else { return };
    match tpm_vault_daemon::fuzzing::credential_inputs(blob, secret) {
        Ok((b, s)) => {
            for (given, stripped) in [(blob, &b), (secret, &s)] {
                assert!(!stripped.is_empty());
                assert_eq!(&given[2..], stripped.as_slice());
                assert_eq!(usize::from(u16::from_be_bytes([given[0], given[1]])), stripped.len());
            }
            IdObject::try_from(b).unwrap_or_else(|e| panic!("accepted blob the TPM layer refuses: {e}"));
            EncryptedSecret::try_from(s).unwrap_or_else(|e| panic!("accepted secret the TPM layer refuses: {e}"));
        }
        Err(e) => assert!(e.to_string().len() <= 200, "long error: {e}"),
    }
});
