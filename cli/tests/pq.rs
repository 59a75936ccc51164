//! Post-quantum keys from the client side, against the real daemon over its own swtpm: the
//! `tpm-vault` commands (`key create --alg ml-dsa-*/ml-kem-*/hybrid-p256-mldsa65`,
//! `sign`/`verify`, `kem encap`/`kem decap`, `key public`), the library's in-core verifiers for
//! ML-DSA and hybrid signatures, and the TLS defaults' key-exchange order.

mod support;

use support::{fails, ok, Daemon, DaemonCli as _};
use tpm_vault_client::hybrid::HybridSignature;
use tpm_vault_client::{verify_hybrid, KeyAlgorithm, SignInput, SignOptions, SignatureScheme};

fn text(out: Vec<u8>) -> String {
    String::from_utf8(out).expect("utf-8")
}

#[test]
fn hybrid_firmware_signing_with_the_cli_and_the_offline_verifier() {
    let d = Daemon::start();
    let dir = d.dir.path();
    let image = support::data(1536 * 1024); // above the 1 MiB inline limit: sent whole anyway
    std::fs::write(dir.join("fw.bin"), &image).unwrap();
    let created = text(ok(d.cli(&["key", "create", "fw", "--alg", "hybrid-p256-mldsa65"])));
    assert!(created.contains("hybrid-p256-mldsa65"), "{created}");
    ok(d.cli(&["sign", "fw", "--in", "fw.bin", "--scheme", "hybrid", "--out", "fw.sig"]));
    assert_eq!(ok(d.cli(&["verify", "fw", "--in", "fw.bin", "--sig", "fw.sig"])), b"Verified OK\n");
    let sig = std::fs::read(dir.join("fw.sig")).unwrap();
    assert_eq!(&sig[..6], b"TVHS\x01\x01");

    // `key public` prints both halves; DER has no room for two keys.
    let pem = text(ok(d.cli(&["key", "public", "fw"])));
    assert_eq!(pem.matches("-----BEGIN PUBLIC KEY-----").count(), 2, "{pem}");
    assert!(fails(&d.cli(&["key", "public", "fw", "--format", "der"]), 2).contains("two public keys"));
    let json: serde_json::Value =
        serde_json::from_slice(&ok(d.cli(&["--output", "json", "key", "public", "fw"]))).unwrap();
    assert!(json["ml_dsa_der"].as_str().is_some_and(|h| h.len() > 3000));

    // The device side: the library verifies without the daemon, and needs both halves.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let public = rt.block_on(async { d.client().await.public_key("fw").await.unwrap() });
    assert_eq!(public.algorithm, KeyAlgorithm::HybridP256MlDsa65);
    assert!(public.verify_signature(&image, &sig).unwrap());
    let (ml_dsa_der, _) = public.ml_dsa.clone().unwrap();
    assert!(verify_hybrid(&public.der, &ml_dsa_der, &image, &sig).unwrap());
    let parts = HybridSignature::decode(&sig).unwrap();
    let mut broken_ecdsa = parts.clone();
    broken_ecdsa.ecdsa[10] ^= 0x40;
    let mut broken_ml_dsa = parts.clone();
    broken_ml_dsa.ml_dsa[3000] ^= 0x01;
    for (what, bad) in [("ECDSA", broken_ecdsa), ("ML-DSA", broken_ml_dsa)] {
        let bytes = bad.encode().unwrap();
        assert!(!public.verify_signature(&image, &bytes).unwrap(), "{what} half broken: accepted offline");
        std::fs::write(dir.join("bad.sig"), &bytes).unwrap();
        assert_eq!(fails(&d.cli(&["verify", "fw", "--in", "fw.bin", "--sig", "bad.sig"]), 1), "Verification failure");
    }
    let mut tampered = image.clone();
    tampered[12345] ^= 1;
    assert!(!public.verify_signature(&tampered, &sig).unwrap());

    // Hybrid keys sign messages whole: a digest, or a message above 4 MiB, is refused.
    std::fs::write(dir.join("digest"), [0u8; 32]).unwrap();
    fails(&d.cli(&["sign", "fw", "--in", "digest", "--digest", "--out", "x.sig"]), 2);
    std::fs::write(dir.join("huge.bin"), support::data(4 * 1024 * 1024 + 1)).unwrap();
    let err = fails(&d.cli(&["sign", "fw", "--in", "huge.bin", "--out", "x.sig"]), 2);
    assert!(err.contains("manifest"), "{err}");
}

#[test]
fn ml_dsa_keys_sign_and_verify_for_every_parameter_set() {
    let d = Daemon::start();
    let dir = d.dir.path();
    std::fs::write(dir.join("m"), b"release notes").unwrap();
    for alg in ["ml-dsa-44", "ml-dsa-65", "ml-dsa-87"] {
        ok(d.cli(&["key", "create", alg, "--alg", alg]));
        let sig = format!("{alg}.sig");
        ok(d.cli(&["sign", alg, "--in", "m", "--out", &sig]));
        assert_eq!(ok(d.cli(&["verify", alg, "--in", "m", "--sig", &sig])), b"Verified OK\n");
        assert_eq!(ok(d.cli(&["verify", alg, "--in", "m", "--sig", &sig, "--scheme", "ml-dsa"])), b"Verified OK\n");
        let pem = text(ok(d.cli(&["key", "public", alg])));
        assert_eq!(pem.matches("BEGIN PUBLIC KEY").count(), 1);
        let json: serde_json::Value =
            serde_json::from_slice(&ok(d.cli(&["--output", "json", "sign", alg, "--in", "m", "--out", "-"]))).unwrap();
        assert_eq!(json["scheme"], "ml-dsa");
        assert_eq!(json["hash"], "unspecified");
        let err = fails(&d.cli(&["sign", alg, "--in", "m", "--out", "x", "--scheme", "ecdsa"]), 2);
        assert!(err.contains("not supported"), "{err}");
    }
    let list = text(ok(d.cli(&["key", "list"])));
    for alg in ["ml-dsa-44", "ml-dsa-65", "ml-dsa-87"] {
        assert!(list.lines().any(|l| l.starts_with(alg) && l.contains(alg)), "{list}");
    }
    // The library: sign (a 2 MiB message goes whole), verify in-core and through the daemon.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = d.client().await;
        let message = support::data(2 * 1024 * 1024);
        let options = SignOptions::new();
        let sig = client.sign("ml-dsa-65", SignInput::Message(message.clone()), &options).await.unwrap();
        assert_eq!(sig.scheme(), SignatureScheme::MlDsa);
        let public = client.public_key("ml-dsa-65").await.unwrap();
        assert!(public.verify_signature(&message, sig.bytes()).unwrap());
        assert!(tpm_vault_client::verify_ml_dsa(&public.der, &message, sig.bytes()).unwrap());
        assert!(client.verify("ml-dsa-65", SignInput::Message(message.clone()), sig.bytes(), &options).await.unwrap());
        assert!(!public.verify_signature(&message[1..], sig.bytes()).unwrap());
        let err = client.sign("ml-dsa-65", SignInput::Digest(vec![0; 32]), &options).await.unwrap_err();
        assert_eq!(err.code(), tpm_vault_client::Code::InvalidArgument);
    });
}

#[test]
fn kem_encap_and_decap_agree() {
    let d = Daemon::start();
    for alg in ["ml-kem-768", "ml-kem-1024"] {
        ok(d.cli(&["key", "create", alg, "--alg", alg]));
        let out = text(ok(d.cli(&["kem", "encap", alg])));
        let secret = out.lines().find_map(|l| l.strip_prefix("shared secret: ")).expect("secret line").to_owned();
        assert_eq!(secret.len(), 64, "{out}");
        assert!(out.contains(&format!("{alg}.ct")), "{out}");
        let ct = format!("{alg}.ct");
        let recovered = text(ok(d.cli(&["kem", "decap", alg, "--in", &ct])));
        assert_eq!(recovered.trim_end(), secret, "{alg}");
        // JSON, ciphertext in the object, decapsulated from stdin.
        let json: serde_json::Value =
            serde_json::from_slice(&ok(d.cli(&["--output", "json", "kem", "encap", alg, "--out", "-"]))).unwrap();
        let ct = hex::decode(json["ciphertext"].as_str().unwrap()).unwrap();
        let decap: serde_json::Value =
            serde_json::from_slice(&ok(d.cli_in(&["--output", "json", "kem", "decap", alg, "--in", "-"], &ct)))
                .unwrap();
        assert_eq!(decap["shared_secret"], json["shared_secret"]);
        // A truncated ciphertext is INVALID_ARGUMENT (exit 2); signing with a KEM key too.
        let err = fails(&d.cli_in(&["kem", "decap", alg, "--in", "-"], &ct[1..]), 2);
        assert!(err.contains("ciphertexts are"), "{err}");
        std::fs::write(d.dir.path().join("m"), b"x").unwrap();
        fails(&d.cli(&["sign", alg, "--in", "m", "--out", "s"]), 2);
    }
    // Encapsulating to a signing key, or decapsulating with one, is refused.
    ok(d.cli(&["key", "create", "signer", "--alg", "ml-dsa-44"]));
    fails(&d.cli(&["kem", "encap", "signer"]), 2);
    std::fs::write(d.dir.path().join("ct"), [0u8; 1088]).unwrap();
    fails(&d.cli(&["kem", "decap", "signer", "--in", "ct"]), 2);
    // The library does the same.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = d.client().await;
        let sent = client.encapsulate("ml-kem-1024").await.unwrap();
        assert_eq!(sent.ciphertext.len(), 1568);
        let secret = client.decapsulate("ml-kem-1024", &sent.ciphertext).await.unwrap();
        assert_eq!(secret.as_slice(), sent.shared_secret());
    });
}

#[test]
fn tls_defaults_offer_x25519mlkem768_first() {
    use std::sync::Arc;

    use rustls::server::{ClientHello, ResolvesServerCert};
    use rustls::sign::CertifiedKey;
    use rustls::NamedGroup;

    #[derive(Debug)]
    struct NoCert;
    impl ResolvesServerCert for NoCert {
        fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            None
        }
    }

    let expected = [NamedGroup::X25519MLKEM768, NamedGroup::X25519, NamedGroup::secp256r1];
    let names = |p: &rustls::crypto::CryptoProvider| p.kx_groups.iter().map(|g| g.name()).collect::<Vec<_>>();
    let client = tpm_vault_client::tls::client_config(rustls::RootCertStore::empty(), None).unwrap();
    assert_eq!(names(client.crypto_provider()), expected);
    let server = tpm_vault_client::tls::server_config(Arc::new(NoCert)).unwrap();
    assert_eq!(names(server.crypto_provider()), expected);
    assert_eq!(names(&tpm_vault_client::tls::default_provider()), expected);
}
