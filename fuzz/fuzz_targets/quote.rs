//! The client's quote verifier and tpm2-tools file parsers (`client/src/attest`): what a
//! verifier runs on a quote that came over the network, and on files from `tpm2_quote` /
//! `tpm2_makecredential`. `Quote::verify` parses TPMT_SIGNATURE, checks the ECDSA signature,
//! then parses TPMS_ATTEST and compares nonce, selection and PCR digest; `decode_pcrs`,
//! `CredentialFile::parse` and `public_key_der` read files.
//!
//! Input: a flags byte, then fields, each a big-endian u16 length and bytes: TPMS_ATTEST,
//! TPMT_SIGNATURE, AK SubjectPublicKeyInfo (DER), nonce, PCR bank, PCR indices (one byte
//! each), PCR values (each a u8 length and bytes), an expected-values binding
//! (`sha256:9=HEX`). With flag bit 0 the harness signs the TPMS_ATTEST itself with a fixed AK
//! (so mutated attestation structures get past the signature check and reach the parser). The
//! whole input is also given to the three file parsers. The same TPMS_ATTEST, signature, AK
//! and nonce, with the PCR-bank field as the SRK's TPM2B_PUBLIC, go to the SRK certification
//! check (`SrkCertification::verify`, `verify-srk`).
//!
//! Properties: no panic; an accepted quote carries the nonce and PCR digest it was checked
//! against; an accepted SRK certification carries the nonce and the SRK's name; files that
//! parse re-encode to what they were.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p256::ecdsa::signature::Signer;
use p256::pkcs8::EncodePublicKey;
use sha2::{Digest, Sha256};
use tpm_vault_client::attest::{decode_pcrs, encode_pcrs, public_key_der, CredentialFile};
use tpm_vault_client::seal_for::SrkCertification;
use tpm_vault_client::{PcrBinding, PcrValues, Quote};

fuzz_target!(|data: &[u8]| {
    files(data);
    let Some((&flags, mut rest)) = data.split_first() else { return };
    let mut field = || {
        let (len, tail) = rest.split_first_chunk::<2>().map_or((0, &[][..]), |(l, t)| (u16::from_be_bytes(*l), t));
        let n = usize::from(len).min(tail.len());
        let (f, t) = tail.split_at(n);
        rest = t;
        f.to_vec()
    };
    let attest = field();
    let mut signature = field();
    let mut ak = field();
    let nonce = field();
    let bank_field = field();
    let bank = String::from_utf8_lossy(&bank_field).into_owned();
    let pcrs: Vec<u32> = field().into_iter().map(u32::from).collect();
    let mut values = Vec::new();
    let mut raw = field();
    while let Some((&n, tail)) = raw.split_first() {
        let n = usize::from(n).min(tail.len());
        values.push(tail[..n].to_vec());
        raw = tail[n..].to_vec();
    }
    let expected: Vec<PcrBinding> =
        std::str::from_utf8(&field()).ok().and_then(|s| s.parse().ok()).into_iter().collect();
    if flags & 1 == 1 {
        let key = ak_key();
        ak = key.verifying_key().to_public_key_der().map(|d| d.as_bytes().to_vec()).unwrap_or_default();
        signature = tpmt_signature(&key.sign(&attest));
    }
    let certification = SrkCertification {
        attest: attest.clone(),
        signature: signature.clone(),
        srk_tpm2b_public: bank_field,
        ak_public_der: ak.clone(),
    };
    if let Ok(srk) = certification.verify(&nonce) {
        assert_eq!(srk.nonce, nonce);
        assert!(certification.srk_tpm2b_public.ends_with(&srk.srk.tpm2b_public[2..]), "not the SRK given");
        let name = [&[0x00, 0x0b][..], &Sha256::digest(&srk.srk.tpm2b_public[2..])].concat();
        assert_eq!(srk.srk.name, name);
    }
    let quote = Quote { attest, signature, pcrs: PcrValues { bank, pcrs, values }, ak_public_der: ak };
    if let Ok(info) = quote.verify(&nonce, &expected) {
        assert_eq!(info.nonce, nonce);
        let digest = quote.pcrs.values.iter().fold(Sha256::new(), |h, v| h.chain_update(v)).finalize();
        assert_eq!(info.pcr_digest, digest.to_vec());
    }
});

/// The tpm2-tools file parsers on the whole input.
fn files(data: &[u8]) {
    if let Ok(values) = decode_pcrs(data) {
        let file = encode_pcrs(&values).unwrap_or_else(|e| panic!("decoded PCR file does not re-encode: {e}"));
        assert_eq!(decode_pcrs(&file).ok(), Some(values), "quote.pcrs round trip");
    }
    if let Ok(cred) = CredentialFile::parse(data) {
        assert_eq!(cred.to_bytes(), data, "credential file round trip");
    }
    let _ = public_key_der(data);
}

/// The harness's attestation key (fixed, so seeds made with it verify).
fn ak_key() -> p256::ecdsa::SigningKey {
    let scalar: [u8; 32] = std::array::from_fn(|i| i as u8 + 0x21);
    p256::ecdsa::SigningKey::from_slice(&scalar).unwrap_or_else(|e| panic!("fixed AK: {e}"))
}

/// TPMT_SIGNATURE: ECDSA (0x0018), SHA-256 (0x000B), TPM2B r, TPM2B s.
fn tpmt_signature(sig: &p256::ecdsa::Signature) -> Vec<u8> {
    let (r, s) = sig.split_bytes();
    [&[0x00, 0x18, 0x00, 0x0b, 0x00, 0x20][..], &r, &[0x00, 0x20], &s].concat()
}
