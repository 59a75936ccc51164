//! Post-quantum public keys as DER SubjectPublicKeyInfo: the client's parsers (what
//! `KemPublicKey::from_spki`, `verify_ml_dsa` and `PublicKey::verify_signature` read, e.g. a key
//! file given to `tpm-vault kem encapsulate` or a key a device stored) and the daemon's
//! (`crypto::pq::raw_public_key`).
//!
//! Properties: no panic; the client and the daemon accept the same keys for the same
//! algorithm; an accepted ML-KEM key passes the FIPS 203 input check (the right size and every
//! coefficient below q, checked here independently) and encapsulates; whatever is accepted is
//! the only encoding of its key (`spki_der` of the raw key gives the input back).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::formats::pq::{ml_kem_sizes, raw_public_key, spki_der};
use tpm_vault_daemon::model::KeyAlg;

const PQ: [KeyAlg; 5] = [KeyAlg::MlDsa44, KeyAlg::MlDsa65, KeyAlg::MlDsa87, KeyAlg::MlKem768, KeyAlg::MlKem1024];

fuzz_target!(|data: &[u8]| {
    let daemon: Vec<(KeyAlg, Vec<u8>)> =
        PQ.iter().filter_map(|&alg| raw_public_key(alg, data).ok().map(|raw| (alg, raw))).collect();
    assert!(daemon.len() <= 1, "one SPKI, several algorithms");
    for (alg, raw) in &daemon {
        assert_eq!(spki_der(*alg, raw).ok().as_deref(), Some(data), "{alg}: not the only encoding");
    }
    let daemon_kem = daemon.iter().find(|(alg, _)| ml_kem_sizes(*alg).is_some());

    let client_kem = tpm_vault_client::KemPublicKey::from_spki(data);
    if let Ok(key) = &client_kem {
        let (alg, raw) = daemon_kem.unwrap_or_else(|| panic!("the client accepts an ML-KEM key the daemon refuses"));
        assert!(
            tpm_vault_fuzz::fips203_ok(*alg == KeyAlg::MlKem768, raw),
            "{alg}: accepted a key that fails the FIPS 203 input check"
        );
        let (_, _, ct_len) = ml_kem_sizes(*alg).unwrap_or_else(|| panic!("{alg}"));
        let enc = key.encapsulate().unwrap_or_else(|e| panic!("accepted key does not encapsulate: {e}"));
        assert_eq!((enc.ciphertext.len(), enc.shared_secret().len()), (ct_len, 32));
    } else if let Some((alg, raw)) = daemon_kem {
        panic!("{alg}: the daemon accepts a key the client refuses ({} bytes)", raw.len());
    }

    // ML-DSA: the client's parse of the key (a wrong signature is Ok(false), a key it does not
    // take is Err).
    let client_dsa = tpm_vault_client::verify_ml_dsa(data, b"m", &[0; 16]);
    let daemon_dsa = daemon.iter().any(|(alg, _)| ml_kem_sizes(*alg).is_none());
    assert_eq!(client_dsa.is_ok(), daemon_dsa, "the client and the daemon disagree on an ML-DSA key");
    if let Ok(valid) = client_dsa {
        assert!(!valid, "a 16-byte ML-DSA signature verified");
    }
});
