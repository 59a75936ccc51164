//! Quote verification and file formats on synthetic quotes signed by a software P-256 key,
//! plus hostile input for every parser (no daemon needed; the TPM-made quotes are checked in
//! `tests/attestation.rs`).

use p256::ecdsa::signature::Signer;
use p256::ecdsa::SigningKey;
use p256::pkcs8::EncodePublicKey;
use sha2::{Digest, Sha256};

use super::verify::{parse_attest, parse_signature};
use super::*;

fn signing_key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32].into()).unwrap()
}

fn spki(key: &SigningKey) -> Vec<u8> {
    key.verifying_key().to_public_key_der().unwrap().as_bytes().to_vec()
}

/// A TPMS_ATTEST quote over `pcrs` of `bank_alg` with `digest`.
fn attest(magic: u32, kind: u16, nonce: &[u8], bank_alg: u16, pcrs: &[u32], digest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&magic.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    let signer = [0x00, 0x0b, 0xaa, 0xbb];
    out.extend_from_slice(&(signer.len() as u16).to_be_bytes());
    out.extend_from_slice(&signer);
    out.extend_from_slice(&(nonce.len() as u16).to_be_bytes());
    out.extend_from_slice(nonce);
    out.extend_from_slice(&123_456u64.to_be_bytes()); // clock
    out.extend_from_slice(&7u32.to_be_bytes()); // resetCount
    out.extend_from_slice(&0u32.to_be_bytes()); // restartCount
    out.push(1); // safe
    out.extend_from_slice(&0x2019_1023_0016_3100u64.to_be_bytes());
    let mut bitmap = [0u8; 3];
    for &p in pcrs {
        bitmap[(p / 8) as usize] |= 1 << (p % 8);
    }
    out.extend_from_slice(&1u32.to_be_bytes());
    out.extend_from_slice(&bank_alg.to_be_bytes());
    out.push(3);
    out.extend_from_slice(&bitmap);
    out.extend_from_slice(&(digest.len() as u16).to_be_bytes());
    out.extend_from_slice(digest);
    out
}

/// TPMT_SIGNATURE of `key` over `message`, with r and s stripped of leading zeros as a TPM
/// may send them.
fn tpmt_signature(key: &SigningKey, message: &[u8]) -> Vec<u8> {
    let sig: p256::ecdsa::Signature = key.sign(message);
    let (r, s) = sig.split_bytes();
    let strip = |b: &[u8]| b.iter().skip_while(|&&x| x == 0).copied().collect::<Vec<u8>>();
    let (r, s) = (strip(&r), strip(&s));
    let mut out = vec![0x00, 0x18, 0x00, 0x0b];
    out.extend_from_slice(&(r.len() as u16).to_be_bytes());
    out.extend_from_slice(&r);
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(&s);
    out
}

fn values() -> PcrValues {
    PcrValues { bank: "sha256".into(), pcrs: vec![0, 7, 9], values: vec![vec![0; 32], vec![7; 32], vec![9; 32]] }
}

fn pcr_digest(values: &PcrValues) -> Vec<u8> {
    Sha256::digest(values.values.concat()).to_vec()
}

const NONCE: &[u8] = b"fresh nonce";

fn quote_with(key: &SigningKey, attest: Vec<u8>) -> Quote {
    Quote { signature: tpmt_signature(key, &attest), attest, pcrs: values(), ak_public_der: spki(key) }
}

fn good_quote() -> Quote {
    let key = signing_key(1);
    quote_with(&key, attest(0xff54_4347, 0x8018, NONCE, 0x000b, &[0, 7, 9], &pcr_digest(&values())))
}

#[test]
fn good_quote_verifies() {
    let info = good_quote().verify(NONCE, &[]).unwrap();
    assert_eq!(info.nonce, NONCE);
    assert_eq!(info.clock, 123_456);
    assert_eq!(info.reset_count, 7);
    assert!(info.safe);
    assert_eq!(info.signer, [0x00, 0x0b, 0xaa, 0xbb]);
    assert_eq!(info.pcr_digest, pcr_digest(&values()));
    let expect: PcrBinding = format!("sha256:9={},0={}", "09".repeat(32), "00".repeat(32)).parse().unwrap();
    good_quote().verify(NONCE, &[expect, "sha256:7".parse().unwrap()]).unwrap();
}

#[test]
fn short_scalars_are_padded() {
    // Find a signature whose r or s has a leading zero byte, to exercise the padding.
    let key = signing_key(2);
    let found = (0u32..2000).find_map(|i| {
        let mut nonce = NONCE.to_vec();
        nonce.extend_from_slice(&i.to_be_bytes());
        let q = quote_with(&key, attest(0xff54_4347, 0x8018, &nonce, 0x000b, &[0, 7, 9], &pcr_digest(&values())));
        (q.signature.len() < 4 + 2 + 32 + 2 + 32).then_some((q, nonce))
    });
    let (quote, nonce) = found.expect("a short scalar within 2000 tries");
    quote.verify(&nonce, &[]).unwrap();
}

#[test]
fn wrong_nonce_is_named() {
    let err = good_quote().verify(b"another nonce", &[]).unwrap_err();
    assert_eq!(err, QuoteError::WrongNonce { expected: b"another nonce".to_vec(), actual: NONCE.to_vec() });
    assert_eq!(err.reason(), "wrong_nonce");
    assert!(err.to_string().starts_with("wrong nonce: the quote is over 667265736820"), "{err}");
}

#[test]
fn every_flipped_bit_of_the_attest_is_a_bad_signature() {
    let quote = good_quote();
    for byte in 0..quote.attest.len() {
        let mut q = quote.clone();
        q.attest[byte] ^= 0x10;
        assert_eq!(q.verify(NONCE, &[]), Err(QuoteError::BadSignature), "byte {byte}");
    }
}

#[test]
fn another_aks_key_is_a_bad_signature() {
    let mut quote = good_quote();
    quote.ak_public_der = spki(&signing_key(3));
    assert_eq!(quote.verify(NONCE, &[]), Err(QuoteError::BadSignature));
}

#[test]
fn tampered_signature_is_a_bad_signature() {
    let mut quote = good_quote();
    let last = quote.signature.len() - 1;
    quote.signature[last] ^= 1;
    assert_eq!(quote.verify(NONCE, &[]), Err(QuoteError::BadSignature));
}

#[test]
fn tampered_pcr_value_is_a_digest_mismatch() {
    let mut quote = good_quote();
    quote.pcrs.values[1][0] ^= 1;
    let err = quote.verify(NONCE, &[]).unwrap_err();
    assert!(matches!(err, QuoteError::PcrDigestMismatch { .. }), "{err:?}");
    assert_eq!(err.reason(), "pcr_digest_mismatch");
}

#[test]
fn other_pcrs_are_a_selection_mismatch() {
    let mut quote = good_quote();
    quote.pcrs.pcrs = vec![0, 7, 10];
    let err = quote.verify(NONCE, &[]).unwrap_err();
    assert_eq!(err, QuoteError::SelectionMismatch { quoted: "sha256:0,7,9".into(), given: "sha256:0,7,10".into() });
    let mut quote = good_quote();
    quote.pcrs.bank = "sha1".into();
    assert!(matches!(quote.verify(NONCE, &[]), Err(QuoteError::SelectionMismatch { .. })));
    let mut quote = good_quote();
    quote.pcrs.pcrs = vec![7, 0, 9];
    assert!(matches!(quote.verify(NONCE, &[]), Err(QuoteError::SelectionMismatch { .. })));
}

#[test]
fn expected_values_are_checked() {
    let expect: PcrBinding = format!("sha256:9={}", "aa".repeat(32)).parse().unwrap();
    let err = good_quote().verify(NONCE, &[expect]).unwrap_err();
    assert_eq!(
        err,
        QuoteError::PcrValueMismatch { bank: "sha256".into(), pcr: 9, expected: vec![0xaa; 32], actual: vec![9; 32] }
    );
    assert!(err.to_string().starts_with("PCR sha256:9 is 0909"), "{err}");
    let expect: PcrBinding = format!("sha256:10={}", "aa".repeat(32)).parse().unwrap();
    assert_eq!(good_quote().verify(NONCE, &[expect]), Err(QuoteError::PcrNotQuoted { bank: "sha256".into(), pcr: 10 }));
    let expect: PcrBinding = format!("sha1:9={}", "aa".repeat(20)).parse().unwrap();
    assert_eq!(good_quote().verify(NONCE, &[expect]), Err(QuoteError::PcrNotQuoted { bank: "sha1".into(), pcr: 9 }));
}

#[test]
fn signed_non_quotes_are_named() {
    let key = signing_key(1);
    let digest = pcr_digest(&values());
    let certify = quote_with(&key, attest(0xff54_4347, 0x8017, NONCE, 0x000b, &[0, 7, 9], &digest));
    assert_eq!(certify.verify(NONCE, &[]), Err(QuoteError::NotAQuote { magic: 0xff54_4347, kind: 0x8017 }));
    let foreign = quote_with(&key, attest(0x1234_5678, 0x8018, NONCE, 0x000b, &[0, 7, 9], &digest));
    assert_eq!(foreign.verify(NONCE, &[]).unwrap_err().reason(), "not_a_quote");
}

#[test]
fn other_signature_schemes_are_unsupported() {
    let mut quote = good_quote();
    quote.signature[1] = 0x14; // RSASSA
    assert_eq!(quote.verify(NONCE, &[]), Err(QuoteError::UnsupportedSignature { sig_alg: 0x0014, hash: 0x000b }));
    let mut quote = good_quote();
    quote.signature[3] = 0x0c; // SHA-384
    assert!(matches!(quote.verify(NONCE, &[]), Err(QuoteError::UnsupportedSignature { .. })));
}

#[test]
fn bad_ak_key_is_malformed() {
    let mut quote = good_quote();
    quote.ak_public_der = b"not a key".to_vec();
    let err = quote.verify(NONCE, &[]).unwrap_err();
    assert!(matches!(err, QuoteError::Malformed(ParseError::Invalid { what: "attestation key", .. })), "{err:?}");
}

#[test]
fn trailing_bytes_are_malformed() {
    let key = signing_key(1);
    let mut bytes = attest(0xff54_4347, 0x8018, NONCE, 0x000b, &[0, 7, 9], &pcr_digest(&values()));
    bytes.push(0);
    let err = quote_with(&key, bytes).verify(NONCE, &[]).unwrap_err();
    assert_eq!(err, QuoteError::Malformed(ParseError::TrailingBytes { what: "TPMS_ATTEST", count: 1 }));
    let mut quote = good_quote();
    quote.signature.push(0);
    assert!(matches!(quote.verify(NONCE, &[]), Err(QuoteError::Malformed(ParseError::TrailingBytes { .. }))));
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn parsers_survive_truncation() {
    let quote = good_quote();
    for len in 0..quote.attest.len() {
        assert!(parse_attest(&quote.attest[..len]).is_err(), "attest truncated to {len}");
    }
    for len in 0..quote.signature.len() {
        assert!(parse_signature(&quote.signature[..len]).is_err(), "signature truncated to {len}");
    }
    let pcrs = encode_pcrs(&values()).unwrap();
    for len in 0..pcrs.len() {
        assert!(decode_pcrs(&pcrs[..len]).is_err(), "pcrs truncated to {len}");
    }
    let cred = CredentialFile { credential_blob: vec![0, 3, 1, 2, 3], encrypted_secret: vec![0, 2, 9, 9] }.to_bytes();
    for len in 0..cred.len() {
        assert!(CredentialFile::parse(&cred[..len]).is_err(), "credential truncated to {len}");
    }
}

#[test]
fn parsers_survive_garbage() {
    let good = good_quote();
    for seed in 0..2000u64 {
        let len = (seed % 300) as usize;
        let mut bytes = noise(seed, len);
        let _ = parse_attest(&bytes);
        let _ = parse_signature(&bytes);
        let _ = decode_pcrs(&bytes);
        let _ = CredentialFile::parse(&bytes);
        let _ = public_key_der(&bytes);
        // Garbage behind a valid header reaches the deeper fields.
        if len >= 6 {
            bytes[..6].copy_from_slice(&[0xff, 0x54, 0x43, 0x47, 0x80, 0x18]);
            let _ = parse_attest(&bytes);
            bytes[..4].copy_from_slice(&[0x00, 0x18, 0x00, 0x0b]);
            let _ = parse_signature(&bytes);
            bytes[..4].copy_from_slice(&[0xBA, 0xDC, 0xC0, 0xDE]);
            let _ = CredentialFile::parse(&bytes);
        }
        // Through the whole verifier too (fewer: each try is an ECDSA verification).
        if seed % 50 == 0 {
            let mut quote = good.clone();
            quote.attest = noise(seed, len);
            assert!(quote.verify(NONCE, &[]).is_err());
        }
    }
    // Garbage in every field of a well-sized PCR file.
    let pcrs = encode_pcrs(&values()).unwrap();
    for seed in 0..500u64 {
        let mut bytes = pcrs.clone();
        let at = (seed as usize * 7) % bytes.len();
        bytes[at] ^= noise(seed, 1)[0] | 1;
        let _ = decode_pcrs(&bytes);
    }
    let mut huge = vec![0u8; 4];
    huge.extend_from_slice(&[0xff; 8]);
    assert!(parse_attest(&[0xff, 0x54, 0x43, 0x47, 0x80, 0x18, 0xff, 0xff]).is_err());
    assert!(decode_pcrs(&huge).is_err());
}

#[test]
fn pcr_file_layout_matches_tpm2_tools() {
    let ten =
        PcrValues { bank: "sha256".into(), pcrs: (0..10).collect(), values: (0..10u8).map(|i| vec![i; 32]).collect() };
    let file = encode_pcrs(&ten).unwrap();
    assert_eq!(file.len(), 1200);
    assert_eq!(&file[..4], &1u32.to_le_bytes());
    assert_eq!(&file[4..12], &[0x0b, 0x00, 3, 0xff, 0x03, 0x00, 0x00, 0x00]);
    assert!(file[12..132].iter().all(|&b| b == 0));
    assert_eq!(&file[132..136], &2u32.to_le_bytes());
    assert_eq!(&file[136..140], &8u32.to_le_bytes());
    assert_eq!(&file[140..142], &32u16.to_le_bytes());
    assert_eq!(&file[142..174], &[0u8; 32]);
    assert_eq!(&file[140 + 66..142 + 66], &32u16.to_le_bytes());
    assert_eq!(file[142 + 66], 1);
    assert_eq!(&file[136 + 532..140 + 532], &2u32.to_le_bytes());
    assert_eq!(file[140 + 532 + 2], 8);
    assert_eq!(decode_pcrs(&file).unwrap(), ten);
    assert_eq!(encode_pcrs(&values()).unwrap().len(), 668);
}

#[test]
fn pcr_file_rejects_what_it_cannot_represent() {
    let mut bad = values();
    bad.pcrs = vec![0, 7, 24];
    assert!(encode_pcrs(&bad).is_err());
    let mut bad = values();
    bad.bank = "md5".into();
    assert!(encode_pcrs(&bad).is_err());
    let mut bad = values();
    bad.values.pop();
    assert!(encode_pcrs(&bad).is_err());
    // Unsorted input is written in ascending order.
    let unsorted = PcrValues { bank: "sha1".into(), pcrs: vec![9, 1], values: vec![vec![9; 20], vec![1; 20]] };
    let decoded = decode_pcrs(&encode_pcrs(&unsorted).unwrap()).unwrap();
    assert_eq!(decoded.pcrs, vec![1, 9]);
    assert_eq!(decoded.values, vec![vec![1; 20], vec![9; 20]]);
    // A digest size that is not the bank's.
    let mut file = encode_pcrs(&values()).unwrap();
    file[140] = 20;
    assert!(matches!(decode_pcrs(&file), Err(ParseError::BadField { field: "digest size", .. })));
    // Trailing bytes.
    let mut file = encode_pcrs(&values()).unwrap();
    file.push(0);
    assert!(matches!(decode_pcrs(&file), Err(ParseError::TrailingBytes { .. })));
}

#[test]
fn credential_file_round_trip() {
    let mut file = vec![0xBA, 0xDC, 0xC0, 0xDE, 0, 0, 0, 1];
    file.extend_from_slice(&[0, 3, 1, 2, 3, 0, 2, 9, 8]);
    let cred = CredentialFile::parse(&file).unwrap();
    assert_eq!(cred.credential_blob, [0, 3, 1, 2, 3]);
    assert_eq!(cred.encrypted_secret, [0, 2, 9, 8]);
    assert_eq!(cred.to_bytes(), file);
    let mut bad = file.clone();
    bad[7] = 2;
    assert!(matches!(CredentialFile::parse(&bad), Err(ParseError::BadField { field: "version", .. })));
    let mut bad = file.clone();
    bad[0] = 0;
    assert!(matches!(CredentialFile::parse(&bad), Err(ParseError::BadField { field: "magic", .. })));
    let mut bad = file;
    bad.push(0);
    assert!(matches!(CredentialFile::parse(&bad), Err(ParseError::TrailingBytes { .. })));
}

#[test]
fn public_key_files() {
    let der = spki(&signing_key(1));
    let pem = public_key_pem(&der).unwrap();
    assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----\n"));
    assert_eq!(public_key_der(pem.as_bytes()).unwrap(), der);
    assert_eq!(public_key_der(&der).unwrap(), der);
    let wrong = pem.replace("PUBLIC KEY", "CERTIFICATE");
    assert!(public_key_der(wrong.as_bytes()).is_err());
}

#[test]
fn pcr_values_helpers() {
    let v = values();
    assert_eq!(v.value(7), Some(&[7u8; 32][..]));
    assert_eq!(v.value(8), None);
    assert_eq!(v.selection(), "sha256:0,7,9");
    assert_eq!(
        v.to_binding().unwrap().to_string(),
        format!("sha256:0={},7={},9={}", "00".repeat(32), "07".repeat(32), "09".repeat(32))
    );
}
