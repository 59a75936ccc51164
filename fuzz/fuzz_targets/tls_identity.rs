//! Client certificates of the `--listen` TLS listener: `tls::client_identity`, the identity
//! access policies (`cert:...`), per-client limits and the audit log see for a peer.
//!
//! Input: a DER certificate (the listener's rustls verifier has checked its chain to the
//! configured CA; this target skips that, so the parser sees any bytes).
//!
//! Properties: no panic; an identity is never empty; a SPIFFE identity is a `spiffe://` URI SAN
//! of the certificate; otherwise the identity is the subject, and reading it back as RFC 4514
//! (`,` between RDNs in certificate order, `+` inside one, `\` escapes, `#` hex DER) gives the
//! certificate's own attributes: two different subjects never get the same identity.
#![no_main]

use libfuzzer_sys::fuzz_target;
use x509_cert::der::asn1::{Ia5StringRef, PrintableStringRef, TeletexStringRef, Utf8StringRef};
use x509_cert::der::oid::db::DB;
use x509_cert::der::{Decode, Encode, Tag, Tagged};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;

fuzz_target!(|data: &[u8]| {
    let identity = tpm_vault_daemon::daemon::client_identity(data);
    let Ok(cert) = x509_cert::Certificate::from_der(data) else {
        assert_eq!(identity, None, "an identity for bytes that are not a certificate");
        return;
    };
    let Some(identity) = identity else {
        let spiffe = spiffe_ids(&cert);
        assert!(spiffe.is_empty() && cert.tbs_certificate.subject.0.is_empty(), "a named certificate has no identity");
        return;
    };
    assert!(!identity.is_empty(), "empty identity");
    if identity.starts_with("spiffe://") && spiffe_ids(&cert).contains(&identity) {
        return;
    }
    // Otherwise the subject, attribute by attribute.
    let rdns = &cert.tbs_certificate.subject.0;
    let parts = split(&identity, ',');
    assert_eq!(parts.len(), rdns.len(), "{identity:?}: not one part per RDN");
    for (part, rdn) in parts.iter().zip(rdns) {
        let atvs = split(part, '+');
        assert_eq!(atvs.len(), rdn.0.len(), "{identity:?}: not one part per attribute");
        for (text, atv) in atvs.iter().zip(rdn.0.iter()) {
            let (kind, value) = text.split_once('=').unwrap_or_else(|| panic!("{identity:?}: no '=' in {text:?}"));
            match kind.parse::<x509_cert::der::oid::ObjectIdentifier>() {
                Ok(oid) => assert_eq!(oid, atv.oid, "{identity:?}: {kind}"),
                Err(_) => assert_eq!(DB.by_name(kind), Some(&atv.oid), "{identity:?}: {kind} names another attribute"),
            }
            match value.strip_prefix('#') {
                Some(hex) => {
                    let der = atv.value.to_der().unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(unhex(hex), Some(der), "{identity:?}: hex value");
                }
                None => {
                    let own = string_value(&atv.value).unwrap_or_else(|| panic!("{identity:?}: not a string"));
                    assert_eq!(unescape(value), Some(own.as_bytes().to_vec()), "{identity:?}: {text:?}");
                }
            }
        }
    }
});

/// The `spiffe://` URIs among the certificate's subject alternative names.
fn spiffe_ids(cert: &x509_cert::Certificate) -> Vec<String> {
    let Ok(Some((_, san))) = cert.tbs_certificate.get::<SubjectAltName>() else { return Vec::new() };
    san.0
        .iter()
        .filter_map(|n| match n {
            GeneralName::UniformResourceIdentifier(uri) if uri.as_str().starts_with("spiffe://") => {
                Some(uri.as_str().to_owned())
            }
            _ => None,
        })
        .collect()
}

/// An attribute value of one of the string types RFC 4514 writes as text.
fn string_value(value: &x509_cert::der::Any) -> Option<String> {
    let s = match value.tag() {
        Tag::PrintableString => PrintableStringRef::try_from(value).ok()?.as_str().to_owned(),
        Tag::Utf8String => Utf8StringRef::try_from(value).ok()?.as_str().to_owned(),
        Tag::Ia5String => Ia5StringRef::try_from(value).ok()?.as_str().to_owned(),
        Tag::TeletexString => TeletexStringRef::try_from(value).ok()?.as_str().to_owned(),
        _ => return None,
    };
    Some(s)
}

/// Splits at every `sep` that is not escaped by a backslash.
fn split(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&s[start..]);
    out
}

/// RFC 4514 section 3 unescaping: `\` then a special character, or two hex digits.
fn unescape(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            if matches!(b[i], b'"' | b'+' | b',' | b';' | b'<' | b'>') {
                return None; // must have been escaped
            }
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1)? {
            c @ (b' ' | b'"' | b'#' | b'+' | b',' | b';' | b'<' | b'=' | b'>' | b'\\') => {
                out.push(*c);
                i += 2;
            }
            _ => {
                out.extend(unhex(s.get(i + 1..i + 3)?)?);
                i += 3;
            }
        }
    }
    Some(out)
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}
