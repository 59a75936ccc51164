//! TPM public areas (the `public` blob of every key record, what `tpm2_load -u` reads):
//! `tss_esapi::structures::PublicBuffer::unmarshall` + `Public::try_from` (libtss2-mu), then
//! `tpm::convert::public_key_der` for each key algorithm the vault supports.
//!
//! Properties: no panic; an accepted public area re-marshals, and unmarshals again to the same
//! value; SPKI DER produced for an algorithm parses as a key of that algorithm.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p256::pkcs8::DecodePublicKey;
use tpm_vault_daemon::formats::convert::public_key_der;
use tpm_vault_daemon::model::KeyAlg;
use tss_esapi::structures::{Public, PublicBuffer};
use tss_esapi::traits::{Marshall, UnMarshall};

fuzz_target!(|data: &[u8]| {
    let Ok(public) = PublicBuffer::unmarshall(data).and_then(Public::try_from) else { return };
    if let Ok(bytes) = PublicBuffer::try_from(public.clone()).and_then(|b| b.marshall()) {
        let again = PublicBuffer::unmarshall(&bytes).and_then(Public::try_from);
        assert_eq!(again.ok().as_ref(), Some(&public), "public area does not survive a marshal round trip");
    }
    for alg in KeyAlg::all() {
        let Ok(der) = public_key_der(alg, &public) else { continue };
        let parses = match alg {
            KeyAlg::EccP256 => p256::PublicKey::from_public_key_der(&der).is_ok(),
            KeyAlg::EccP384 => spki_algorithm(&der).is_some_and(|oid| oid == EC),
            _ if alg.is_rsa() => spki_algorithm(&der).is_some_and(|oid| oid == RSA),
            _ => spki_algorithm(&der).is_some(),
        };
        assert!(parses, "{alg}: public_key_der produced an unusable SPKI");
    }
});

const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

/// The algorithm OID of a DER SubjectPublicKeyInfo.
fn spki_algorithm(der: &[u8]) -> Option<Vec<u8>> {
    let spki = p256::pkcs8::spki::SubjectPublicKeyInfoRef::try_from(der).ok()?;
    Some(spki.algorithm.oid.as_bytes().to_vec())
}
