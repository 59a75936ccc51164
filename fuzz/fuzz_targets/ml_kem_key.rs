//! Raw ML-KEM encapsulation keys, wrapped in the SubjectPublicKeyInfo the daemon exports
//! (`crypto::pq::spki_der`) and parsed by the client (`KemPublicKey::from_spki`, before it
//! encapsulates to a vault key) and the daemon (`crypto::pq::raw_public_key`). The fuzzer
//! mutates the key bytes themselves, so it reaches the coefficient checks that `pq_spki` has to
//! get through DER first to reach.
//!
//! Input: a first byte that picks the parameter set (even: ML-KEM-768, odd: ML-KEM-1024), then
//! the key.
//!
//! Properties: no panic; both accept exactly the keys that pass the FIPS 203 section 7.2 input
//! check (`tpm_vault_fuzz::fips203_ok`: the size, and decoding then re-encoding gives the same
//! bytes); an accepted key encapsulates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::formats::pq::{raw_public_key, spki_der};
use tpm_vault_daemon::model::KeyAlg;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, ek)) = data.split_first() else { return };
    let alg = if mode % 2 == 0 { KeyAlg::MlKem768 } else { KeyAlg::MlKem1024 };
    let valid = tpm_vault_fuzz::fips203_ok(alg == KeyAlg::MlKem768, ek);
    let spki = spki_der(alg, ek).unwrap_or_else(|e| panic!("{e}"));
    let daemon = raw_public_key(alg, &spki);
    assert_eq!(daemon.is_ok(), valid, "daemon: {alg} key accepted {}, FIPS 203 check {valid}", daemon.is_ok());
    match tpm_vault_client::KemPublicKey::from_spki(&spki) {
        Ok(key) => {
            assert!(valid, "client: accepted an {alg} key that fails the FIPS 203 input check");
            key.encapsulate().unwrap_or_else(|e| panic!("accepted key does not encapsulate: {e}"));
        }
        Err(e) => assert!(!valid, "client: refused a valid {alg} key: {e}"),
    }
});
