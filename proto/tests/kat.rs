//! The known-answer tests of `kat/checks.rs` (SHA-2, AES-256-GCM, ML-KEM, ML-DSA, the stream
//! format), one test each. scripts/test-arm64 runs the same checks as arm64 code through the
//! `tpm-vault-kat` binary.

#[path = "kat/checks.rs"]
mod checks;

#[test]
fn sha2_known_answers() {
    checks::sha2_known_answers();
}

#[test]
fn aes_256_gcm_known_answers() {
    checks::aes_256_gcm_known_answers();
}

#[test]
fn ml_kem_known_answers_decapsulate() {
    checks::ml_kem_known_answers_decapsulate();
}

#[test]
fn ml_dsa_known_answers_verify() {
    checks::ml_dsa_known_answers_verify();
}

#[test]
fn stream_format_known_answers() {
    checks::stream_format_known_answers();
}

#[test]
fn the_binary_runs_every_check() {
    assert_eq!(checks::CHECKS.len(), 5);
}
