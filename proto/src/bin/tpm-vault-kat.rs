//! `tpm-vault-kat`: runs the known-answer tests of `proto/tests/kat/checks.rs` (SHA-256/384,
//! AES-256-GCM, ML-KEM, ML-DSA, the stream format) in this process and prints one line per check
//! and `N passed, N failed`; exits 1 if any fails. A test tool, not in the package:
//! scripts/cross-arm64 `--kat` builds it for aarch64 together with the shipped crates (so it
//! reuses their dependencies, features and profile), and scripts/test-arm64 runs it under
//! qemu-aarch64.

#[path = "../../tests/kat/checks.rs"]
mod checks;

fn main() {
    let (mut passed, mut failed) = (0, 0);
    for (name, check) in checks::CHECKS {
        // A failed check panics (assert); the panic message is printed by the default hook.
        if std::panic::catch_unwind(check).is_ok() {
            println!("ok: {name}");
            passed += 1;
        } else {
            println!("FAILED: {name}");
            failed += 1;
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
