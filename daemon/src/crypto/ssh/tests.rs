use super::*;

fn string(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, bytes);
    out
}

fn userauth(session: usize, method: &str, algorithm: &str, key: &[u8], host: Option<&[u8]>) -> Vec<u8> {
    let mut d = string(&vec![7; session]);
    d.push(50);
    d.extend(string(b"root"));
    d.extend(string(b"ssh-connection"));
    d.extend(string(method.as_bytes()));
    d.push(1);
    d.extend(string(algorithm.as_bytes()));
    d.extend(string(key));
    if let Some(h) = host {
        d.extend(string(h));
    }
    d
}

fn sshsig(namespace: &str, hash: &str, len: usize) -> Vec<u8> {
    let mut d = b"SSHSIG".to_vec();
    d.extend(string(namespace.as_bytes()));
    d.extend(string(b""));
    d.extend(string(hash.as_bytes()));
    d.extend(string(&vec![1; len]));
    d
}

fn p256_blob() -> Vec<u8> {
    use p256::pkcs8::EncodePublicKey as _;
    let key = p256::SecretKey::from_slice(&[5u8; 32]).unwrap().public_key();
    public_key_blob(KeyAlg::EccP256, key.to_public_key_der().unwrap().as_bytes()).unwrap()
}

#[test]
fn userauth_requests_parse_and_name_the_key() {
    let key = p256_blob();
    for (method, host) in [("publickey", None), ("publickey-hostbound-v00@openssh.com", Some(&b"hostkey"[..]))] {
        let data = userauth(32, method, "ecdsa-sha2-nistp256", &key, host);
        let parsed = parse(&data).unwrap();
        let SshSigned::UserAuth(auth) = &parsed else { panic!("{parsed:?}") };
        assert_eq!((auth.user, auth.method, auth.host_key), ("root", method, host));
        assert_eq!(signing_plan(KeyAlg::EccP256, &key, &parsed, None, None), Ok((Scheme::Ecdsa, HashAlg::Sha256)));
        assert!(signing_plan(KeyAlg::EccP256, &key, &parsed, None, Some(HashAlg::Sha384)).is_err());
        assert!(signing_plan(KeyAlg::EccP256, &key, &parsed, Some(Scheme::RsaPss), None).is_err());
        assert_eq!(signing_plan(KeyAlg::EccP256, b"other", &parsed, None, None), Err(SshDataError::OtherKey));
        assert!(signing_plan(KeyAlg::EccP384, &key, &parsed, None, None).is_err());
    }
    // A certificate of the key: type, nonce, then the key's fields.
    let mut cert = string(b"ecdsa-sha2-nistp256-cert-v01@openssh.com");
    cert.extend(string(&[9; 32]));
    cert.extend(&key[4 + 19..]);
    cert.extend(string(b"more certificate fields"));
    let data = userauth(48, "publickey", "ecdsa-sha2-nistp256-cert-v01@openssh.com", &cert, None);
    let parsed = parse(&data).unwrap();
    assert!(signing_plan(KeyAlg::EccP256, &key, &parsed, None, None).is_ok());
    let in_point = cert.len() - 30;
    cert[in_point] ^= 1;
    let data = userauth(48, "publickey", "ecdsa-sha2-nistp256-cert-v01@openssh.com", &cert, None);
    assert!(signing_plan(KeyAlg::EccP256, &key, &parse(&data).unwrap(), None, None).is_err());
}

/// Found by the `ssh_userauth` fuzz target: a request asking for `ecdsa-sha2-nistp384` and
/// naming a P-256 blob passed the check of a P-384 key whose blob was that P-256 one. The key's
/// own blob must be of the key's type.
#[test]
fn a_key_whose_blob_is_of_another_type_signs_nothing() {
    let key = p256_blob();
    let data = userauth(32, "publickey", "ecdsa-sha2-nistp384", &key, None);
    let parsed = parse(&data).unwrap();
    assert_eq!(signing_plan(KeyAlg::EccP384, &key, &parsed, None, None), Err(SshDataError::OtherKey));
}

#[test]
fn malformed_userauth_requests_are_refused() {
    let key = p256_blob();
    let good = userauth(32, "publickey", "ecdsa-sha2-nistp256", &key, None);
    for cut in 0..good.len() {
        assert!(parse(&good[..cut]).is_err(), "truncated at {cut}");
    }
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(parse(&trailing), Err(SshDataError::Trailing(1)));
    assert_eq!(parse(&userauth(33, "publickey", "x", &key, None)), Err(SshDataError::SessionId(33)));
    assert_eq!(parse(&userauth(32, "password", "x", &key, None)), Err(SshDataError::Method));
    let mut no_flag = good.clone();
    let flag = 4 + 32 + 1 + 8 + 18 + 13;
    assert_eq!(no_flag[flag], 1);
    no_flag[flag] = 0;
    assert_eq!(parse(&no_flag), Err(SshDataError::NoSignatureFlag));
    let mut other_type = good;
    other_type[36] = 51;
    assert_eq!(parse(&other_type), Err(SshDataError::MessageType(51)));
}

#[test]
fn sshsig_blobs_parse() {
    let data = sshsig("file", "sha512", 64);
    let parsed = parse(&data).unwrap();
    assert_eq!(parsed, SshSigned::Sshsig(Sshsig { namespace: "file", hash: HashAlg::Sha512, message_hash: &[1; 64] }));
    assert_eq!(signing_plan(KeyAlg::Rsa2048, b"", &parsed, None, None), Ok((Scheme::RsaPkcs1, HashAlg::Sha512)));
    assert!(signing_plan(KeyAlg::Rsa2048, b"", &parsed, None, Some(HashAlg::Sha1)).is_err());
    assert_eq!(signing_plan(KeyAlg::EccP384, b"", &parsed, None, None), Ok((Scheme::Ecdsa, HashAlg::Sha384)));
    assert!(parse(&sshsig("", "sha512", 64)).is_err(), "empty namespace");
    assert!(parse(&sshsig("file", "sha512", 32)).is_err(), "short hash");
    assert!(parse(&sshsig("file", "sha1", 20)).is_err(), "sha1");
    let good = sshsig("git", "sha256", 32);
    for cut in 0..good.len() {
        assert!(parse(&good[..cut]).is_err(), "truncated at {cut}");
    }
    let mut reserved = b"SSHSIG".to_vec();
    reserved.extend(string(b"file"));
    reserved.extend(string(b"x"));
    reserved.extend(string(b"sha256"));
    reserved.extend(string(&[0; 32]));
    assert_eq!(parse(&reserved), Err(SshDataError::Reserved));
}

/// What the review's forwarded agent got signed: neither parses.
#[test]
fn tls_certificate_verify_and_policy_approvals_are_not_ssh() {
    let mut tls13 = vec![0x20u8; 64];
    tls13.extend(b"TLS 1.3, server CertificateVerify\0");
    tls13.extend([0xab; 32]);
    assert!(parse(&tls13).is_err());
    let mut approval = b"tpm-vault-policy-v1".to_vec();
    approval.extend([0; 32]);
    assert!(parse(&approval).is_err());
    assert!(parse(b"").is_err());
    assert!(parse(b"SSH").is_err());
}

#[test]
fn rsa_blobs_use_mpints() {
    let mut out = Vec::new();
    put_mpint(&mut out, &[0, 0x80, 1]);
    assert_eq!(out, [0, 0, 0, 3, 0, 0x80, 1]);
    out.clear();
    put_mpint(&mut out, &[1, 0, 1]);
    assert_eq!(out, [0, 0, 0, 3, 1, 0, 1]);
}

/// The committed fuzz seeds (`fuzz/corpus/ssh_*`, written by `fuzz/tests/seeds.rs`) are what
/// they say: requests for the fuzz key pass, the TLS content is refused.
#[test]
fn fuzz_seeds_parse() {
    use p256::pkcs8::EncodePublicKey as _;
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let read = |f: &str| std::fs::read(corpus.join(f)).unwrap();
    let scalar: [u8; 32] = std::array::from_fn(|i| i as u8 + 1);
    let spki = p256::SecretKey::from_slice(&scalar).unwrap().public_key().to_public_key_der().unwrap();
    let key = public_key_blob(KeyAlg::EccP256, spki.as_bytes()).unwrap();
    for f in ["publickey.bin", "hostbound.bin", "certificate.bin"] {
        let data = read(&format!("ssh_userauth/{f}"));
        let parsed = parse(&data).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(signing_plan(KeyAlg::EccP256, &key, &parsed, None, None).is_ok(), "{f}");
    }
    let rsa = read("ssh_userauth/rsa-sha2-512.bin");
    let rsa = parse(&rsa).unwrap();
    assert!(matches!(rsa, SshSigned::UserAuth(UserAuth { algorithm: "rsa-sha2-512", .. })));
    for f in ["ssh_sshsig/file-sha512.bin", "ssh_sshsig/git-sha256.bin"] {
        assert!(matches!(parse(&read(f)), Ok(SshSigned::Sshsig(_))), "{f}");
    }
    for f in ["ssh_userauth/tls13-certificate-verify.bin", "ssh_sshsig/tls13-certificate-verify.bin"] {
        assert!(parse(&read(f)).is_err(), "{f}");
    }
}
