//! What an `ssh`-usage key signs (`crypto::ssh`, through `tpm_vault_daemon::fuzzing::ssh`): an
//! SSHSIG signed-data blob (OpenSSH `PROTOCOL.sshsig`: magic, namespace, reserved, hash
//! algorithm, H(message)), as `ssh-keygen -Y sign` or git sends it through the agent.
//!
//! Input: the bytes to sign.
//!
//! Properties: no panic; a parsed blob encodes back to exactly the input; its namespace is not
//! empty, its reserved field empty, its hash sha256 or sha512 with a digest of that length;
//! `parse` agrees; the signing plan never uses SHA-1 or RSA-PSS and for ECDSA uses the curve's
//! hash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::fuzzing::ssh::{parse, parse_sshsig, signing_plan, SshSigned, Sshsig};
use tpm_vault_daemon::model::{HashAlg, KeyAlg, Scheme};

fuzz_target!(|data: &[u8]| {
    let parsed = parse_sshsig(data);
    if data.starts_with(b"SSHSIG") {
        assert_eq!(parse(data).ok(), parsed.clone().ok().map(SshSigned::Sshsig), "parse disagrees");
    } else {
        assert!(parsed.is_err(), "no magic, yet parsed");
    }
    let Ok(sig) = parsed else { return };
    assert_eq!(encode(&sig), data, "not a canonical encoding");
    assert!(!sig.namespace.is_empty());
    assert!(matches!(sig.hash, HashAlg::Sha256 | HashAlg::Sha512));
    assert_eq!(sig.message_hash.len(), sig.hash.digest_len());
    let signed = SshSigned::Sshsig(sig);
    for (alg, want) in [
        (KeyAlg::EccP256, Some((Scheme::Ecdsa, HashAlg::Sha256))),
        (KeyAlg::EccP384, Some((Scheme::Ecdsa, HashAlg::Sha384))),
        (KeyAlg::Rsa2048, Some((Scheme::RsaPkcs1, HashAlg::Sha512))),
        (KeyAlg::MlDsa65, None),
    ] {
        assert_eq!(signing_plan(alg, b"", &signed, None, None).ok(), want, "{alg:?}");
    }
    for hash in [HashAlg::Sha1, HashAlg::Sha384] {
        assert!(signing_plan(KeyAlg::Rsa3072, b"", &signed, None, Some(hash)).is_err(), "RSA with {hash:?}");
    }
    assert!(signing_plan(KeyAlg::Rsa3072, b"", &signed, Some(Scheme::RsaPss), None).is_err());
});

fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn encode(s: &Sshsig<'_>) -> Vec<u8> {
    let mut out = b"SSHSIG".to_vec();
    string(&mut out, s.namespace.as_bytes());
    string(&mut out, b"");
    string(&mut out, s.hash.as_str().as_bytes());
    string(&mut out, s.message_hash);
    out
}
