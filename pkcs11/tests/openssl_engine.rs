//! OpenSSL 3 through libp11's engine (`engines-3/pkcs11.so`, loaded from an `OPENSSL_CONF`
//! whose engine section sets `MODULE_PATH` to the module): a self-signed certificate made by
//! `openssl req -x509` with the vault key, and TLS 1.3 handshakes served by `openssl s_server`
//! with that key and checked by `openssl s_client`.

mod support;

use std::process::Command;

use support::{describe, run_input, run_ok, spki_der_of, stdout, Daemon};

/// `openssl req -new -x509` signed through the engine: returns the certificate's path after
/// checking its public key is the vault key's and that it verifies as its own trust anchor.
fn engine_self_signed(d: &Daemon, name: &str) -> std::path::PathBuf {
    let cert = d.path().join(format!("{name}.engine-cert.pem"));
    run_ok(
        d.openssl()
            .args(["req", "-new", "-x509", "-engine", "pkcs11", "-keyform", "engine", "-key"])
            .arg(format!("pkcs11:object={name};type=private"))
            .args(["-subj", "/CN=localhost", "-days", "2"])
            .args(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "subjectAltName=DNS:localhost"])
            .arg("-out")
            .arg(&cert),
    );
    assert_eq!(
        spki_der_of(&cert, "cert"),
        spki_der_of(&d.public_pem(name), "pub"),
        "the certificate's public key is not the vault key's"
    );
    let out = run_ok(Command::new("openssl").arg("verify").arg("-CAfile").arg(&cert).arg(&cert));
    assert!(stdout(&out).contains(": OK"), "openssl verify: {}", describe(&out));
    cert
}

/// Serves TLS 1.3 from `openssl s_server -www` with the engine key and makes `handshakes`
/// verified `s_client` connections to it.
fn serve_tls13(d: &Daemon, name: &str, cert: &std::path::Path, handshakes: usize) {
    let log = d.path().join(format!("s_server-{name}.log"));
    let (mut server, port) = support::serve_on_free_port("openssl s_server", &log, &[], |port| {
        let mut cmd = d.openssl();
        cmd.args(["s_server", "-engine", "pkcs11", "-keyform", "engine", "-key"])
            .arg(format!("pkcs11:object={name};type=private"))
            .arg("-cert")
            .arg(cert)
            .args(["-accept", &format!("127.0.0.1:{port}"), "-tls1_3", "-www"]);
        cmd
    });
    for i in 0..handshakes {
        let out = run_input(
            Command::new("openssl")
                .env_remove("OPENSSL_CONF")
                .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-servername", "localhost"])
                .args(["-tls1_3", "-verify_return_error", "-ign_eof", "-CAfile"])
                .arg(cert),
            Some(b"GET / HTTP/1.0\r\n\r\n"),
        );
        let text = stdout(&out);
        assert!(
            out.status.success() && text.contains("Verify return code: 0 (ok)") && text.contains("TLSv1.3"),
            "handshake {i} with the {name} key failed: {}\n--- s_server log ---\n{}",
            describe(&out),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(text.contains("HTTP/1.0 200 ok"), "handshake {i}: no HTTP answer:\n{text}");
    }
    server.assert_running(&log);
}

/// ECDSA P-256: certificate through `openssl req`, then TLS 1.3 with `s_server`.
#[test]
fn ecdsa_p256_certificate_and_tls13() {
    let d = Daemon::start();
    d.create_key("e256", "ecc-p256");
    let cert = engine_self_signed(&d, "e256");
    serve_tls13(&d, "e256", &cert, 3);
}

/// ECDSA P-384 likewise.
#[test]
fn ecdsa_p384_certificate_and_tls13() {
    let d = Daemon::start();
    d.create_key("e384", "ecc-p384");
    let cert = engine_self_signed(&d, "e384");
    serve_tls13(&d, "e384", &cert, 3);
}

/// RSA-2048: the certificate is signed PKCS#1 v1.5 (a SHA-256 DigestInfo through CKM_RSA_PKCS),
/// the TLS 1.3 CertificateVerify is RSA-PSS.
#[test]
fn rsa_2048_certificate_and_tls13() {
    let d = Daemon::start();
    d.create_key("r2048", "rsa-2048");
    let cert = engine_self_signed(&d, "r2048");
    serve_tls13(&d, "r2048", &cert, 3);
}
