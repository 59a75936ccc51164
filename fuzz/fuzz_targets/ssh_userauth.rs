//! What an `ssh`-usage key signs (`crypto::ssh`, through `tpm_vault_daemon::fuzzing::ssh`): an
//! SSH user-authentication request (RFC 4252 section 7), whatever a peer of `tpm-vault
//! ssh-agent` sends, parsed strictly before the daemon signs it.
//!
//! Input: the bytes to sign.
//!
//! Properties: no panic; a parsed request encodes back to exactly the input (no byte left
//! unread or read twice, so what is signed is what was checked); its session identifier is an
//! exchange hash's length and its method public-key authentication; `parse` (the Sign RPC's
//! entry) agrees with `parse_userauth`; the check against the fuzz key (`signing_plan`) passes
//! only for a request that names that key, plainly or in a certificate, with an algorithm of its
//! type, and then asks for ECDSA with SHA-256.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::fuzzing::ssh::{parse, parse_userauth, public_key_blob, signing_plan, SshSigned, UserAuth};
use tpm_vault_daemon::model::{HashAlg, KeyAlg, Scheme};

fuzz_target!(|data: &[u8]| {
    let parsed = parse_userauth(data);
    if !data.starts_with(b"SSHSIG") && data.len() >= 4 {
        assert_eq!(parse(data).ok(), parsed.clone().ok().map(SshSigned::UserAuth), "parse disagrees");
    }
    let Ok(auth) = parsed else { return };
    assert_eq!(encode(&auth), data, "not a canonical encoding");
    assert!(matches!(auth.session_id.len(), 20 | 32 | 48 | 64));
    assert_eq!(auth.host_key.is_some(), auth.method == "publickey-hostbound-v00@openssh.com");
    assert!(auth.host_key.is_some() || auth.method == "publickey");

    let blob = public_key_blob(KeyAlg::EccP256, tpm_vault_fuzz::authority_spki()).unwrap_or_default();
    assert!(!blob.is_empty(), "the fuzz key has a blob");
    let plan = signing_plan(KeyAlg::EccP256, &blob, &SshSigned::UserAuth(auth.clone()), None, None);
    if let Ok(plan) = plan {
        assert_eq!(plan, (Scheme::Ecdsa, HashAlg::Sha256));
        assert!(auth.algorithm.starts_with("ecdsa-sha2-nistp256"), "{}", auth.algorithm);
        let names =
            auth.key_blob == blob.as_slice() || auth.key_blob.windows(blob.len() - 23).any(|w| w == &blob[23..]);
        assert!(names, "a request for another key passed");
    }
    // Another key type never passes.
    assert!(signing_plan(KeyAlg::EccP384, &blob, &SshSigned::UserAuth(auth), None, None).is_err());
});

fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn encode(a: &UserAuth<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    string(&mut out, a.session_id);
    out.push(50);
    string(&mut out, a.user.as_bytes());
    string(&mut out, b"ssh-connection");
    string(&mut out, a.method.as_bytes());
    out.push(1);
    string(&mut out, a.algorithm.as_bytes());
    string(&mut out, a.key_blob);
    if let Some(h) = a.host_key {
        string(&mut out, h);
    }
    out
}
