//! Certificate input of KeyService: the chain PEM of `SetCertificate`
//! (`vault::cert::check_chain`, with `parse_chain`) and the subject and alternative names of
//! `CreateCsr` / `CreateSelfSignedCertificate` (`vault::cert::CertSubject::parse`).
//!
//! Input: a first byte that picks the parser (even: chain, odd: subject), then UTF-8. For a
//! subject, the first line is the DN and each further line `dns:`, `ip:` or `uri:` one name.
//! A chain is checked against the public key of its own first certificate (so the issuing-order
//! checks and re-encoding run) and against an unrelated key.
//!
//! Properties: no panic; error messages stay short (they go back to the peer, and a long one
//! echoing the input makes the client drop its HTTP/2 connection); an accepted chain comes back
//! as PEM that is accepted again unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::formats::cert::{check_chain, parse_chain, CertSubject};
use x509_cert::der::Encode;

/// Longest acceptable error message (as in daemon/tests/garbage.rs).
const MAX_MESSAGE: usize = 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    if mode % 2 == 0 {
        chain(text);
    } else {
        subject(text);
    }
});

fn chain(text: &str) {
    let own =
        parse_chain(text).ok().and_then(|certs| certs.first()?.tbs_certificate.subject_public_key_info.to_der().ok());
    for spki in own.iter().map(Vec::as_slice).chain([tpm_vault_fuzz::authority_spki()]) {
        match check_chain(text, spki) {
            Ok(clean) => {
                assert!(clean.starts_with("-----BEGIN CERTIFICATE-----\n"));
                let again = check_chain(&clean, spki).unwrap_or_else(|e| panic!("re-encoded chain rejected: {e}"));
                assert_eq!(again, clean, "re-encoding is not stable");
            }
            Err(e) => short(&e.to_string()),
        }
    }
}

fn subject(text: &str) {
    let mut lines = text.split('\n');
    let dn = lines.next().unwrap_or_default();
    let (mut dns, mut ips, mut uris) = (Vec::new(), Vec::new(), Vec::new());
    for line in lines {
        if let Some(v) = line.strip_prefix("dns:") {
            dns.push(v.to_owned());
        } else if let Some(v) = line.strip_prefix("ip:") {
            ips.push(v.to_owned());
        } else if let Some(v) = line.strip_prefix("uri:") {
            uris.push(v.to_owned());
        }
    }
    if let Err(e) = CertSubject::parse(dn, &dns, &ips, &uris) {
        short(&e.to_string());
    }
}

fn short(msg: &str) {
    let start: String = msg.chars().take(200).collect();
    assert!(msg.len() <= MAX_MESSAGE, "{} byte error message: {start:?}...", msg.len());
}
