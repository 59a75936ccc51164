//! The streaming AEAD format (`Decrypt` input): `crypto::stream::Header::parse`, then (format
//! v2) the unwrapping of the header's stream key with a fixed data key, or (v1) that data key
//! itself, and a `Decryptor` over the rest, fed once whole and once in random-sized pieces the
//! way the `Decrypt` RPC receives them (header accumulated message by message).
//!
//! Input: 8 bytes that choose the piece sizes, then the stream.
//!
//! Properties: no panic; the result (plaintext released, error) does not depend on how the
//! stream is split; a stream that decrypts is the one and only encoding of its plaintext
//! (re-encrypting it under the parsed header gives back the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_vault_fuzz::{pieces, STREAM_CONTEXT, STREAM_KEY};
use tpm_vault_proto::stream::{unwrap, Decryptor, Encryptor, Header, Keying};

/// Plaintext released, and the error (as text) if the stream was rejected.
type Outcome = (Vec<u8>, Result<(), String>);

fuzz_target!(|data: &[u8]| {
    let Some((seed, stream)) = data.split_first_chunk::<8>() else { return };
    let seed = u64::from_le_bytes(*seed);
    let whole = decrypt(stream, &[stream.len()]);
    let split = decrypt(stream, &pieces(seed, stream.len()));
    assert_eq!(whole, split, "the outcome depends on message boundaries");
    if let (plain, Ok(())) = whole {
        let (header, used) = Header::parse(stream).ok().flatten().unwrap_or_else(|| panic!("header vanished"));
        assert_eq!(header.encode(), stream[..used], "header does not re-encode to its bytes");
        let key = chunk_key(&header).unwrap_or_else(|e| panic!("the key vanished: {e}"));
        let mut e = Encryptor::new(&key, &header, STREAM_CONTEXT).unwrap_or_else(|e| panic!("{e}"));
        let mut again = Vec::new();
        e.update(&plain, &mut again).unwrap_or_else(|e| panic!("{e}"));
        e.finish(&mut again).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again, stream, "an accepted stream is not the canonical encoding of its plaintext");
    }
});

/// Decrypts `stream` delivered in messages of the given sizes, like `CryptoRpc::decrypt`.
fn decrypt(stream: &[u8], sizes: &[usize]) -> Outcome {
    let mut out = Vec::new();
    let mut messages = Vec::new();
    let mut at = 0;
    for &n in sizes {
        messages.push(&stream[at..at + n]);
        at += n;
    }
    let mut messages = messages.into_iter();
    let mut buf = Vec::new();
    let (header, used) = loop {
        let Some(m) = messages.next() else { return (out, Err("truncated before the header".into())) };
        buf.extend_from_slice(m);
        match Header::parse(&buf) {
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(e) => return (out, Err(e.to_string())),
        }
    };
    let key = match chunk_key(&header) {
        Ok(k) => k,
        Err(e) => return (out, Err(e)),
    };
    let mut d = match Decryptor::new(&key, &header, STREAM_CONTEXT) {
        Ok(d) => d,
        Err(e) => return (out, Err(e.to_string())),
    };
    let rest = buf.split_off(used);
    for m in std::iter::once(rest.as_slice()).chain(messages) {
        if let Err(e) = d.update(m, &mut out) {
            return (out, Err(e.to_string()));
        }
    }
    let result = d.finish(&mut out).map_err(|e| e.to_string());
    (out, result)
}

/// The key of the stream's chunks: the stream key the header wraps (v2), unwrapped with the
/// fuzz data key, or that data key itself (v1).
fn chunk_key(header: &Header) -> Result<[u8; 32], String> {
    match header.keying {
        Keying::Wrapped { .. } => unwrap(&STREAM_KEY, header, STREAM_CONTEXT).map(|k| *k).map_err(|e| e.to_string()),
        Keying::DataKey { .. } => Ok(STREAM_KEY),
    }
}
