//! Known-answer tests of the in-core cryptography the vault leans on: SHA-256/384 and
//! AES-256-GCM (published vectors), ML-KEM decapsulation and ML-DSA verification (the published
//! FIPS 203/204 vectors of `daemon/tests/data`, see its README), and the encrypted stream format
//! (SPEC §7: v1 and v2 streams of fixed keys, nonces and plaintext, `tests/data/stream.kat`).
//!
//! Shared by `proto/tests/kat.rs` (they run with the other tests) and the `tpm-vault-kat` binary
//! (`proto/src/bin/tpm-vault-kat.rs`), which scripts/test-arm64 builds for aarch64 with the
//! shipped crates and runs under qemu-aarch64, so aws-lc's ARMv8 code paths (AES and PMULL
//! instructions, the NEON SHA-2 and ML-KEM code) give the same answers as the x86-64 ones. The
//! vectors are compiled in (`include_str!`): the binary runs wherever it is copied.

use std::collections::HashMap;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use aws_lc_rs::digest::{digest, SHA256, SHA384};
use aws_lc_rs::kem::{Ciphertext, DecapsulationKey, ML_KEM_1024, ML_KEM_768};
use aws_lc_rs::signature::{self, UnparsedPublicKey};
use tpm_vault_proto::stream::{self, DataKeyId, Decryptor, Encryptor, Header, Keying};

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A `.kat` file: `key = hex` lines, `#` comments.
fn kat(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn field(v: &HashMap<String, String>, key: &str) -> Vec<u8> {
    unhex(v.get(key).unwrap_or_else(|| panic!("field {key}")))
}

pub fn sha2_known_answers() {
    // FIPS 180-2, appendix B and D: "abc" and the two-block messages.
    let two_block_256 = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    let two_block_512 = b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    let cases: [(&'static aws_lc_rs::digest::Algorithm, &[u8], &str); 4] = [
        (&SHA256, b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        (&SHA256, two_block_256, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
        (
            &SHA384,
            b"abc",
            "cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed8086072ba1e7cc2358baeca134c825a7",
        ),
        (
            &SHA384,
            two_block_512,
            "09330c33f71147e83d192fc782cd1b4753111b173b3b05d22fa08086e3b0f712fcc7c71a557e2db966c3e9fa91746039",
        ),
    ];
    for (alg, msg, want) in cases {
        assert_eq!(hex(digest(alg, msg).as_ref()), want, "{alg:?} of {} bytes", msg.len());
    }
    // One million 'a' (FIPS 180-2 B.3), through the streaming interface in odd pieces.
    let mut ctx = aws_lc_rs::digest::Context::new(&SHA256);
    let piece = [b'a'; 999];
    let mut left = 1_000_000;
    while left > 0 {
        let n = left.min(piece.len());
        ctx.update(&piece[..n]);
        left -= n;
    }
    assert_eq!(hex(ctx.finish().as_ref()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

pub fn aes_256_gcm_known_answers() {
    // The GCM specification's (McGrew and Viega) test cases 13 to 16: AES-256, 96-bit IVs.
    let k15 = "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308";
    let p15 = "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255";
    let c15 = "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad";
    let cases = [
        // (key, iv, plaintext, aad, ciphertext, tag)
        (
            "00".repeat(32),
            "000000000000000000000000",
            String::new(),
            "",
            String::new(),
            "530f8afbc74536b9a963b4f1c4cb738b",
        ),
        (
            "00".repeat(32),
            "000000000000000000000000",
            "00".repeat(16),
            "",
            "cea7403d4d606b6e074ec5d3baf39d18".into(),
            "d0d1c8a799996bf0265b98b5d48ab919",
        ),
        (k15.into(), "cafebabefacedbaddecaf888", p15.into(), "", c15.into(), "b094dac5d93471bdec1a502270e3cc6c"),
        (
            k15.into(),
            "cafebabefacedbaddecaf888",
            p15[..120].into(),
            "feedfacedeadbeeffeedfacedeadbeefabaddad2",
            c15[..120].into(),
            "76fc6ece0f4e1768cddf8853bb2d551b",
        ),
    ];
    for (i, (key, iv, plain, aad, want_ct, want_tag)) in cases.iter().enumerate() {
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &unhex(key)).expect("key"));
        let nonce = || Nonce::try_assume_unique_for_key(&unhex(iv)).expect("nonce");
        let aad = unhex(aad);
        let mut buf = unhex(plain);
        let tag = key.seal_in_place_separate_tag(nonce(), Aad::from(aad.as_slice()), &mut buf).expect("seal");
        assert_eq!((hex(&buf), hex(tag.as_ref())), (want_ct.clone(), (*want_tag).to_owned()), "case {}", 13 + i);
        buf.extend_from_slice(tag.as_ref());
        let opened = key.open_in_place(nonce(), Aad::from(aad.as_slice()), &mut buf).expect("open").to_vec();
        assert_eq!(hex(&opened), *plain, "case {} opens", 13 + i);
        // A flipped bit of the tag is refused.
        let last = buf.len() - 1;
        buf[last] ^= 1;
        assert!(key.open_in_place(nonce(), Aad::from(aad.as_slice()), &mut buf).is_err(), "case {} tampered", 13 + i);
    }
}

pub fn ml_kem_known_answers_decapsulate() {
    let cases = [
        (include_str!("../../../daemon/tests/data/mlkem768_decap.kat"), &ML_KEM_768, 2400),
        (include_str!("../../../daemon/tests/data/mlkem1024_decap.kat"), &ML_KEM_1024, 3168),
    ];
    for (text, alg, dk_len) in cases {
        let v = kat(text);
        let (dk, c, k) = (field(&v, "dk"), field(&v, "c"), field(&v, "k"));
        assert_eq!(dk.len(), dk_len, "dk size");
        let key = DecapsulationKey::new(alg, &dk).expect("dk");
        let shared = key.decapsulate(Ciphertext::from(c.as_slice())).expect("decapsulate");
        assert_eq!(hex(shared.as_ref()), hex(&k), "ML-KEM-{}: shared secret", dk_len / 384 * 256 / 2);
        let mut bad = c.clone();
        bad[0] ^= 0x01;
        let other = key.decapsulate(Ciphertext::from(bad.as_slice())).expect("implicit rejection");
        assert_ne!(other.as_ref(), k.as_slice(), "tampered ciphertext");
    }
}

pub fn ml_dsa_known_answers_verify() {
    let cases: [(&str, &'static signature::PqdsaVerificationAlgorithm); 3] = [
        (include_str!("../../../daemon/tests/data/mldsa44_verify.kat"), &signature::ML_DSA_44),
        (include_str!("../../../daemon/tests/data/mldsa65_verify.kat"), &signature::ML_DSA_65),
        (include_str!("../../../daemon/tests/data/mldsa87_verify.kat"), &signature::ML_DSA_87),
    ];
    for (text, alg) in cases {
        let v = kat(text);
        let (pk, msg, sig) = (field(&v, "pk"), field(&v, "msg"), field(&v, "sig"));
        assert_eq!(v.get("result").map(String::as_str), Some("valid"));
        UnparsedPublicKey::new(alg, &pk).verify(&msg, &sig).expect("valid vector rejected");
        let mut bad = sig.clone();
        bad[sig.len() / 2] ^= 0x01;
        assert!(UnparsedPublicKey::new(alg, &pk).verify(&msg, &bad).is_err(), "tampered signature accepted");
    }
}

/// The fixed inputs of the stream vectors.
const DATA_KEY: [u8; 32] = [0x33; 32];
const STREAM_KEY: [u8; 32] = [0x44; 32];
const CONTEXT: &[u8] = b"kat-context";
const CHUNK: u32 = 64;

fn plaintext() -> Vec<u8> {
    (0..200u32).map(|i| (i * 7 + 3) as u8).collect()
}

fn encrypt(key: &[u8; 32], header: &Header) -> Vec<u8> {
    let mut e = Encryptor::new(key, header, CONTEXT).expect("encryptor");
    let mut out = Vec::new();
    e.update(&plaintext(), &mut out).expect("update");
    e.finish(&mut out).expect("finish");
    out
}

fn decrypt(data_key: &[u8; 32], sealed: &[u8]) -> Vec<u8> {
    let (header, n) = Header::parse(sealed).expect("header").expect("complete header");
    let key = match header.keying {
        Keying::Wrapped { .. } => *stream::unwrap(data_key, &header, CONTEXT).expect("unwrap"),
        Keying::DataKey { .. } => *data_key,
    };
    let mut d = Decryptor::new(&key, &header, CONTEXT).expect("decryptor");
    let mut out = Vec::new();
    d.update(&sealed[n..], &mut out).expect("update");
    d.finish(&mut out).expect("finish");
    out
}

pub fn stream_format_known_answers() {
    let want = kat(include_str!("../data/stream.kat"));
    let id = [0x11; 16];
    // The fixture's v2 stream (0.2's format, no commitment): still read, made only by tests.
    let v2 = stream::wrap_version(
        &DATA_KEY,
        DataKeyId { name: "kat", id },
        CHUNK,
        CONTEXT,
        [0x22; 12],
        &STREAM_KEY,
        stream::VERSION_2,
    )
    .expect("wrap");
    let v1 = Header {
        key_name: "kat".into(),
        key_id: id,
        chunk_size: CHUNK,
        keying: Keying::DataKey { nonce_prefix: [0x55; 7] },
    };
    for (name, header, key) in [("v2", &v2, &STREAM_KEY), ("v1", &v1, &DATA_KEY)] {
        let sealed = encrypt(key, header);
        assert_eq!(hex(&sealed), hex(&field(&want, name)), "stream {name} differs from tests/data/stream.kat");
        assert_eq!(decrypt(&DATA_KEY, &field(&want, name)), plaintext(), "stream {name} decrypts");
    }
}

/// Every check, by name.
pub const CHECKS: [(&str, fn()); 5] = [
    ("sha2_known_answers", sha2_known_answers),
    ("aes_256_gcm_known_answers", aes_256_gcm_known_answers),
    ("ml_kem_known_answers_decapsulate", ml_kem_known_answers_decapsulate),
    ("ml_dsa_known_answers_verify", ml_dsa_known_answers_verify),
    ("stream_format_known_answers", stream_format_known_answers),
];
