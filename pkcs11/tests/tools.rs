//! The module under the generic PKCS#11 tools: OpenSC's `pkcs11-tool` (listing, its self
//! test, signing with every mechanism family, key pair generation and deletion), GnuTLS's
//! `p11tool`, and `p11-kit list-modules` with a per-user module file. Signatures are checked
//! by `openssl` against `tpm-vault key public`.

mod support;

use std::path::Path;
use std::process::Command;

use support::{describe, openssl_verify, run, run_ok, stdout, Daemon, TOKEN_LABEL};

/// One object of `pkcs11-tool --list-objects`: its header line ("Private Key Object; EC") and
/// its `  name: value` lines.
#[derive(Debug)]
struct Listed {
    header: String,
    fields: Vec<(String, String)>,
}

impl Listed {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Parses the object part of `pkcs11-tool --list-objects` output.
fn parse_objects(text: &str) -> Vec<Listed> {
    let mut objects: Vec<Listed> = Vec::new();
    for line in text.lines() {
        if line.contains(" Object;") && !line.starts_with(' ') {
            objects.push(Listed { header: line.trim().to_owned(), fields: Vec::new() });
        } else if let (Some(obj), true) = (objects.last_mut(), line.starts_with("  ")) {
            if let Some((k, v)) = line.trim().split_once(':') {
                obj.fields.push((k.trim().to_owned(), v.trim().to_owned()));
            }
        }
    }
    objects
}

/// The objects labelled `label` whose header starts with `kind` ("Private Key", "Public Key",
/// "Certificate").
fn with_label<'a>(objects: &'a [Listed], kind: &str, label: &str) -> Vec<&'a Listed> {
    objects.iter().filter(|o| o.header.starts_with(kind) && o.field("label") == Some(label)).collect()
}

/// SHA-1 of the subjectPublicKey BIT STRING contents of a DER SPKI (the key identifier), hex.
fn key_id_hex(spki: &[u8]) -> String {
    // DER: SEQUENCE { SEQUENCE algorithm, BIT STRING key }.
    fn header(b: &[u8]) -> (u8, usize, usize) {
        let tag = b[0];
        if b[1] < 0x80 {
            (tag, 2, b[1] as usize)
        } else {
            let n = (b[1] & 0x7f) as usize;
            let len = b[2..2 + n].iter().fold(0usize, |a, &x| (a << 8) | x as usize);
            (tag, 2 + n, len)
        }
    }
    let (tag, hl, _) = header(spki);
    assert_eq!(tag, 0x30, "SPKI is not a SEQUENCE");
    let rest = &spki[hl..];
    let (_, ahl, alen) = header(rest);
    let rest = &rest[ahl + alen..];
    let (tag, bhl, blen) = header(rest);
    assert_eq!(tag, 0x03, "no BIT STRING in the SPKI");
    let bits = &rest[bhl + 1..bhl + blen];
    let out = support::run_input(Command::new("openssl").args(["dgst", "-sha1", "-r"]), Some(bits));
    assert!(out.status.success(), "openssl dgst -sha1: {}", describe(&out));
    stdout(&out).split_whitespace().next().expect("sha1 output").to_owned()
}

/// The token is listed with the test label, and a key with a certificate has exactly its three
/// objects (private key, public key, certificate) under the key's name, all with the key
/// identifier as CKA_ID; the private key is sensitive and never extractable, usable to sign.
#[test]
fn lists_the_token_and_a_keys_three_objects() {
    let d = Daemon::start();
    d.create_key("web", "ecc-p256");
    d.self_sign("web");
    let out = run_ok(d.pkcs11_tool().args(["--list-slots", "--list-objects"]));
    let text = stdout(&out);
    assert!(text.contains(&format!("token label        : {TOKEN_LABEL}")), "token not listed:\n{text}");
    let objects = parse_objects(&text);
    let expected_id = key_id_hex(&support::spki_der_of(&d.public_pem("web"), "pub"));
    for kind in ["Private Key", "Public Key", "Certificate"] {
        let found = with_label(&objects, kind, "web");
        assert_eq!(found.len(), 1, "expected one {kind} object labelled web:\n{text}");
        assert_eq!(found[0].field("ID"), Some(expected_id.as_str()), "{kind} CKA_ID:\n{text}");
    }
    let private = with_label(&objects, "Private Key", "web")[0];
    assert!(private.header.contains("EC"), "private key type: {}", private.header);
    let access = private.field("Access").unwrap_or_default();
    assert!(access.contains("sensitive") && access.contains("never extractable"), "Access: {access}\n{text}");
    assert_eq!(private.field("Usage"), Some("sign"), "private key usage:\n{text}");
    let public = with_label(&objects, "Public Key", "web")[0];
    assert_eq!(public.field("Usage"), Some("verify"), "public key usage:\n{text}");
}

/// A key without the `sign` usage (an `ssh` key here) is listed, but its private-key object
/// has no `CKA_SIGN` and `C_SignInit` refuses it: every PKCS#11 mechanism is a raw signature.
#[test]
fn a_key_without_the_sign_usage_does_not_sign() {
    let d = Daemon::start();
    run_ok(d.cli().args(["key", "create", "me", "--usage", "ssh"]));
    d.create_key("web", "ecc-p256");
    let text = stdout(&run_ok(d.pkcs11_tool().arg("--list-objects")));
    let objects = parse_objects(&text);
    let private = with_label(&objects, "Private Key", "me");
    assert_eq!(private.len(), 1, "listed:\n{text}");
    assert_ne!(private[0].field("Usage"), Some("sign"), "CKA_SIGN on an ssh key:\n{text}");
    assert_eq!(with_label(&objects, "Private Key", "web")[0].field("Usage"), Some("sign"), "{text}");
    // pkcs11-tool picks the key to sign with by CKA_ID (`--label` alone takes the first one).
    let data = data_file(&d);
    let sign_with = |name: &str| {
        let id = key_id_hex(&support::spki_der_of(&d.public_pem(name), "pub"));
        let sig = d.path().join(format!("{name}.sig"));
        let args = ["--sign", "--id", &id, "-m", "ECDSA-SHA256", "--input-file"];
        run(d.pkcs11_tool().args(args).arg(&data).arg("--output-file").arg(&sig))
    };
    let out = sign_with("me");
    assert!(!out.status.success(), "an ssh key signed through PKCS#11: {}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CKR_KEY_FUNCTION_NOT_PERMITTED"), "{}", describe(&out));
    let out = sign_with("web");
    assert!(out.status.success(), "{}", describe(&out));
}

/// `pkcs11-tool --test` (digests, signatures, verification, random) exits 0 with an EC and an
/// RSA key on the token once SHA-1 is allowed: its RSA test signs a SHA-1 DigestInfo with
/// `CKM_RSA_PKCS`, which the module refuses (`CKR_DATA_INVALID`) unless pkcs11.toml says
/// `allow_sha1_digest_info = true`.
#[test]
fn pkcs11_tool_self_test_passes() {
    let d = Daemon::start();
    d.create_key("t-ec", "ecc-p256");
    d.create_key("t-rsa", "rsa-2048");
    let out = run(d.pkcs11_tool().arg("--test"));
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(
        !out.status.success() && text.contains("CKR_DATA_INVALID"),
        "SHA-1 DigestInfo signed by default: {}",
        describe(&out)
    );
    std::fs::write(d.path().join("pkcs11.toml"), "allow_sha1_digest_info = true\n").expect("pkcs11.toml");
    let out = run(d.pkcs11_tool().arg("--test"));
    assert!(out.status.success(), "pkcs11-tool --test failed: {}", describe(&out));
}

/// Writes the data file to sign.
fn data_file(d: &Daemon) -> std::path::PathBuf {
    let path = d.path().join("data.bin");
    std::fs::write(&path, b"tpm-vault pkcs11 test data\n".repeat(50)).expect("data file");
    path
}

/// `pkcs11-tool --sign` with `mech` and extra args; returns the signature file.
fn sign(d: &Daemon, label: &str, mech: &str, extra: &[&str], data: &Path) -> std::path::PathBuf {
    let sig = d.path().join(format!("{label}-{mech}.sig"));
    run_ok(
        d.pkcs11_tool()
            .args(["--sign", "--label", label, "-m", mech])
            .args(extra)
            .arg("--input-file")
            .arg(data)
            .arg("--output-file")
            .arg(&sig),
    );
    sig
}

/// ECDSA P-256: CKM_ECDSA_SHA256 over the data, and CKM_ECDSA over a SHA-256 digest.
#[test]
fn signs_ecdsa_p256() {
    let d = Daemon::start();
    d.create_key("p256", "ecc-p256");
    let public = d.public_pem("p256");
    let data = data_file(&d);
    let sig = sign(&d, "p256", "ECDSA-SHA256", &["--signature-format", "openssl"], &data);
    openssl_verify("sha256", &public, &sig, &data, &[]);

    let digest = d.path().join("data.sha256");
    let out = run_ok(Command::new("openssl").args(["dgst", "-sha256", "-binary", "-out"]).arg(&digest).arg(&data));
    assert!(out.status.success());
    let sig = sign(&d, "p256", "ECDSA", &["--signature-format", "openssl"], &digest);
    let out = run(Command::new("openssl")
        .args(["pkeyutl", "-verify", "-pubin", "-inkey"])
        .arg(&public)
        .arg("-sigfile")
        .arg(&sig)
        .arg("-in")
        .arg(&digest));
    assert!(
        out.status.success() && stdout(&out).contains("Signature Verified Successfully"),
        "CKM_ECDSA signature over a digest: {}",
        describe(&out)
    );
}

/// ECDSA P-384 with CKM_ECDSA_SHA384.
#[test]
fn signs_ecdsa_p384() {
    let d = Daemon::start();
    d.create_key("p384", "ecc-p384");
    let public = d.public_pem("p384");
    let data = data_file(&d);
    let sig = sign(&d, "p384", "ECDSA-SHA384", &["--signature-format", "openssl"], &data);
    openssl_verify("sha384", &public, &sig, &data, &[]);
}

/// RSA-2048: CKM_SHA256_RSA_PKCS, CKM_SHA384_RSA_PKCS and CKM_SHA256_RSA_PKCS_PSS (MGF1-SHA256,
/// salt = 32).
#[test]
fn signs_rsa_2048_pkcs1_and_pss() {
    let d = Daemon::start();
    d.create_key("rsa", "rsa-2048");
    let public = d.public_pem("rsa");
    let data = data_file(&d);
    let sig = sign(&d, "rsa", "SHA256-RSA-PKCS", &[], &data);
    openssl_verify("sha256", &public, &sig, &data, &[]);
    let sig = sign(&d, "rsa", "SHA384-RSA-PKCS", &[], &data);
    openssl_verify("sha384", &public, &sig, &data, &[]);
    let sig = sign(&d, "rsa", "SHA256-RSA-PKCS-PSS", &["--mgf", "MGF1-SHA256", "--salt-len", "32"], &data);
    openssl_verify(
        "sha256",
        &public,
        &sig,
        &data,
        &["rsa_padding_mode:pss", "rsa_pss_saltlen:32", "rsa_mgf1_md:sha256"],
    );
}

/// GnuTLS's `p11tool --provider M --list-all` lists the key's objects by name.
#[test]
fn p11tool_lists_the_key() {
    let d = Daemon::start();
    d.create_key("gnutls", "ecc-p256");
    d.self_sign("gnutls");
    let out = run_ok(
        d.module_env(&mut Command::new("p11tool"))
            .env("HOME", d.path())
            .arg("--provider")
            .arg(support::module())
            .args(["--list-all", &format!("pkcs11:token={TOKEN_LABEL}")]),
    );
    let text = stdout(&out);
    assert!(text.contains("Label: gnutls"), "p11tool does not list the key:\n{text}");
    assert!(text.contains("object=gnutls;type=public"), "no public key object:\n{text}");
    assert!(text.contains("object=gnutls;type=cert"), "no certificate object:\n{text}");
}

/// A module file in `$HOME/.config/pkcs11/modules/` makes `p11-kit list-modules` load the
/// module and show its token. p11-kit 0.24 skips user configuration as root ("skipping user
/// config in program running as root" under `P11_KIT_DEBUG=conf`; pkcs11.conf(5) names only
/// setuid/setgid programs, and no documented knob forces it), so p11-kit runs as nobody, whom
/// the policy lets use the vault.
#[test]
fn p11_kit_lists_the_module_from_a_user_module_file() {
    use std::os::unix::process::CommandExt as _;
    let policy = format!(
        "{}\n[[rule]]\nname = \"nobody\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\noperations = [\"*\"]\n",
        support::allow_all_policy(),
        support::NOBODY
    );
    let d = Daemon::start_with(&policy, false);
    d.create_key("kit", "ecc-p256");
    let module = d.open_to_nobody();
    let home = d.path().join("home");
    let modules = home.join(".config/pkcs11/modules");
    std::fs::create_dir_all(&modules).expect("modules dir");
    std::fs::write(modules.join("tpm-vault.module"), format!("module: {}\n", module.display())).expect("module file");
    let out = run_ok(
        d.module_env(&mut Command::new("p11-kit"))
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .uid(support::NOBODY)
            .gid(support::NOBODY)
            .arg("list-modules"),
    );
    // One block per module: "NAME: PATH" at column 0, then indented fields and tokens.
    let text = stdout(&out);
    let mut blocks: Vec<String> = Vec::new();
    for line in text.lines() {
        match blocks.last_mut() {
            Some(block) if line.starts_with(' ') => {
                block.push('\n');
                block.push_str(line);
            }
            _ => blocks.push(line.to_owned()),
        }
    }
    let ours = blocks
        .iter()
        .find(|b| b.starts_with(&format!("tpm-vault: {}", module.display())))
        .unwrap_or_else(|| panic!("p11-kit list-modules does not show module tpm-vault:\n{}", describe(&out)));
    assert!(ours.contains(&format!("token: {TOKEN_LABEL}")), "module listed without its token:\n{ours}");
}

/// `pkcs11-tool --keypairgen --key-type EC:prime256v1 --label gen1` creates vault key `gen1`
/// (which then signs, verified against the vault's public key); `--delete-object --type
/// privkey --label gen1` is refused (`CKR_ACTION_PROHIBITED`, the key stays) until
/// `allow_destroy = true` is in pkcs11.toml, and then deletes it.
#[test]
fn generates_and_deletes_a_key_pair() {
    let d = Daemon::start();
    let out = run_ok(d.pkcs11_tool().args(["--keypairgen", "--key-type", "EC:prime256v1", "--label", "gen1"]));
    assert!(d.key_names().contains(&"gen1".to_owned()), "gen1 not in key list after keypairgen: {}", describe(&out));
    let public = d.public_pem("gen1");
    let data = data_file(&d);
    let sig = sign(&d, "gen1", "ECDSA-SHA256", &["--signature-format", "openssl"], &data);
    openssl_verify("sha256", &public, &sig, &data, &[]);

    let out = run(d.pkcs11_tool().args(["--delete-object", "--type", "privkey", "--label", "gen1"]));
    assert!(!out.status.success(), "deleted without allow_destroy: {}", describe(&out));
    assert!(d.key_names().contains(&"gen1".to_owned()), "gen1 deleted without allow_destroy");
    std::fs::write(d.path().join("pkcs11.toml"), "allow_destroy = true\n").expect("pkcs11.toml");
    let out = run_ok(d.pkcs11_tool().args(["--delete-object", "--type", "privkey", "--label", "gen1"]));
    assert!(!d.key_names().contains(&"gen1".to_owned()), "gen1 still in key list after delete: {}", describe(&out));
    let listed = run_ok(d.pkcs11_tool().arg("--list-objects"));
    assert!(!stdout(&listed).contains("label:      gen1"), "gen1 still listed:\n{}", stdout(&listed));
}

/// Without `TPM_VAULT_SOCKET` and `TPM_VAULT_PKCS11_TOKEN_LABEL`, the config file named by
/// `TPM_VAULT_PKCS11_CONFIG` gives the socket and the token label.
#[test]
fn config_file_gives_the_socket_and_the_token_label() {
    let d = Daemon::start();
    d.create_key("conf", "ecc-p256");
    let config = d.path().join("from-file.toml");
    std::fs::write(&config, format!("socket = \"{}\"\ntoken_label = \"from-config-file\"\n", d.socket.display()))
        .expect("config file");
    let out = run_ok(
        support::clean_env(&mut Command::new("pkcs11-tool"))
            .env("TPM_VAULT_PKCS11_CONFIG", &config)
            .arg("--module")
            .arg(support::module())
            .args(["--list-slots", "--list-objects"]),
    );
    let text = stdout(&out);
    assert!(text.contains("token label        : from-config-file"), "label not from the config file:\n{text}");
    assert!(text.contains("label:      conf"), "key not listed through the config file's socket:\n{text}");
}

/// `pkcs11-tool --write-object CERT.der --type cert --label NAME` (C_CreateObject of an X.509
/// certificate) stores the certificate as the key's chain: `tpm-vault cert show --pem` returns
/// it and the token lists a certificate object for the key.
#[test]
fn a_written_certificate_is_stored_with_its_key() {
    let d = Daemon::start();
    d.create_key("wcert", "ecc-p256");
    let listed = stdout(&run_ok(d.pkcs11_tool().arg("--list-objects")));
    assert!(with_label(&parse_objects(&listed), "Certificate", "wcert").is_empty(), "a certificate before:\n{listed}");
    let pem = d.path().join("wcert.pem");
    run_ok(
        d.openssl()
            .args(["req", "-new", "-x509", "-engine", "pkcs11", "-keyform", "engine", "-key"])
            .arg("pkcs11:object=wcert;type=private")
            .args(["-subj", "/CN=written", "-days", "2", "-out"])
            .arg(&pem),
    );
    let der = d.path().join("wcert.der");
    run_ok(Command::new("openssl").args(["x509", "-outform", "DER", "-in"]).arg(&pem).arg("-out").arg(&der));
    run_ok(d.pkcs11_tool().arg("--write-object").arg(&der).args(["--type", "cert", "--label", "wcert"]));

    let out = run_ok(d.cli().args(["cert", "show", "wcert", "--pem"]));
    let stored = d.path().join("stored.pem");
    std::fs::write(&stored, &out.stdout).expect("stored.pem");
    let fingerprint = |p: &Path| {
        stdout(&run_ok(Command::new("openssl").args(["x509", "-noout", "-fingerprint", "-sha256", "-in"]).arg(p)))
    };
    assert_eq!(fingerprint(&stored), fingerprint(&pem), "the vault stores another certificate");
    let listed = stdout(&run_ok(d.pkcs11_tool().arg("--list-objects")));
    let objects = parse_objects(&listed);
    let certs = with_label(&objects, "Certificate", "wcert");
    assert_eq!(certs.len(), 1, "certificate objects labelled wcert:\n{listed}");
    assert_eq!(certs[0].field("subject"), Some("DN: CN=written"), "{listed}");
}

/// With the daemon down, signing fails with CKR_DEVICE_ERROR (not a hang, not a crash).
#[test]
fn daemon_down_is_a_device_error() {
    let mut d = Daemon::start();
    d.create_key("down", "ecc-p256");
    let data = data_file(&d);
    d.stop();
    let out = run(d.pkcs11_tool().args(["--sign", "--label", "down", "-m", "ECDSA-SHA256", "--input-file"]).arg(&data));
    assert!(!out.status.success(), "signed with the daemon down: {}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CKR_DEVICE_ERROR"),
        "not CKR_DEVICE_ERROR: {}",
        describe(&out)
    );
}

/// A key whose stored chain is leaf + CA: the leaf is the key's certificate object (label and
/// CKA_ID of the key), and the CA certificate is listed as one more certificate object.
#[test]
fn a_chains_ca_certificate_is_an_extra_certificate_object() {
    let d = Daemon::start();
    d.create_key("leaf", "ecc-p256");
    let p = |s: &str| d.path().join(s);
    // A software CA signs the vault's CSR.
    run_ok(
        Command::new("openssl")
            .args(["req", "-new", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"])
            .args(["-subj", "/CN=Test CA", "-days", "2", "-keyout"])
            .arg(p("ca.key"))
            .arg("-out")
            .arg(p("ca.pem")),
    );
    let csr = run_ok(d.cli().args(["csr", "leaf", "--subject", "CN=leaf.test"]));
    std::fs::write(p("leaf.csr"), &csr.stdout).expect("csr");
    run_ok(
        Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in"])
            .arg(p("leaf.csr"))
            .arg("-CA")
            .arg(p("ca.pem"))
            .arg("-CAkey")
            .arg(p("ca.key"))
            .arg("-CAcreateserial")
            .arg("-out")
            .arg(p("leaf.pem")),
    );
    let chain = [std::fs::read(p("leaf.pem")).expect("leaf"), std::fs::read(p("ca.pem")).expect("ca")].concat();
    std::fs::write(p("chain.pem"), chain).expect("chain");
    run_ok(d.cli().args(["cert", "import", "leaf"]).arg(p("chain.pem")));

    let text = stdout(&run_ok(d.pkcs11_tool().arg("--list-objects")));
    let objects = parse_objects(&text);
    let certs: Vec<&Listed> = objects.iter().filter(|o| o.header.starts_with("Certificate")).collect();
    assert_eq!(certs.len(), 2, "certificate objects:\n{text}");
    let expected_id = key_id_hex(&support::spki_der_of(&d.public_pem("leaf"), "pub"));
    let leaf = with_label(&objects, "Certificate", "leaf");
    assert_eq!(leaf.len(), 1, "one certificate labelled leaf:\n{text}");
    assert_eq!(leaf[0].field("subject"), Some("DN: CN=leaf.test"), "{text}");
    assert_eq!(leaf[0].field("ID"), Some(expected_id.as_str()), "{text}");
    let ca: Vec<&&Listed> = certs.iter().filter(|c| c.field("subject") == Some("DN: CN=Test CA")).collect();
    assert_eq!(ca.len(), 1, "the CA certificate is not listed:\n{text}");
    assert_ne!(ca[0].field("ID"), Some(expected_id.as_str()), "the CA certificate has the key's CKA_ID:\n{text}");
}

/// RSA-3072 with CKM_SHA384_RSA_PKCS_PSS (MGF1-SHA384, salt = 48).
#[test]
fn signs_rsa_3072_pss_sha384() {
    let d = Daemon::start();
    d.create_key("rsa3k", "rsa-3072");
    let public = d.public_pem("rsa3k");
    let data = data_file(&d);
    let sig = sign(&d, "rsa3k", "SHA384-RSA-PKCS-PSS", &["--mgf", "MGF1-SHA384", "--salt-len", "48"], &data);
    openssl_verify(
        "sha384",
        &public,
        &sig,
        &data,
        &["rsa_padding_mode:pss", "rsa_pss_saltlen:48", "rsa_mgf1_md:sha384"],
    );
}

/// `pkcs11-tool --keypairgen --key-type rsa:2048 --label genrsa` creates an RSA vault key
/// that signs (CKM_SHA256_RSA_PKCS, verified against the vault's public key).
#[test]
fn generates_an_rsa_key_pair() {
    let d = Daemon::start();
    let out = run_ok(d.pkcs11_tool().args(["--keypairgen", "--key-type", "rsa:2048", "--label", "genrsa"]));
    assert!(d.key_names().contains(&"genrsa".to_owned()), "genrsa not in key list: {}", describe(&out));
    let public = d.public_pem("genrsa");
    let data = data_file(&d);
    let sig = sign(&d, "genrsa", "SHA256-RSA-PKCS", &[], &data);
    openssl_verify("sha256", &public, &sig, &data, &[]);
}
