//! The three response messages that carry a secret (`UnsealResponse`, `DecapsulateResponse`,
//! `ActivateCredentialResponse`), written by hand so their bytes live in memory that is wiped
//! when the message is dropped.
//!
//! prost generates `bytes` fields as plain `Vec<u8>`, which leave their contents in freed
//! memory. `tests/bootstrap.rs` maps these messages with `extern_path` to the types here
//! (re-exported in [`crate::v1`], so both sides name them as before), whose field is a
//! `Zeroizing<Vec<u8>>` and whose `prost::Message` implementation encodes and decodes exactly
//! what the generated code did (the tests below check it against a `prost` derive of the same
//! `.proto` field, and the field against the descriptor set). Decoding copies the field once,
//! straight from the transport's buffer into zeroizing memory.
//!
//! What this cannot reach: the transport's own buffers. The daemon encodes a response into
//! tonic's encode buffer and hyper/h2 write it out from there; a client decodes from h2's and
//! tonic's receive buffers. Those are `bytes::BytesMut` allocations that are freed, not wiped
//! (see `docs/RELIABILITY.md`).

use std::fmt;

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use prost::DecodeError;
use zeroize::{Zeroize, Zeroizing};

/// One message with a single `bytes` field, number 1, holding a secret.
macro_rules! secret_message {
    ($(#[$doc:meta])* $name:ident { $(#[$field_doc:meta])* $field:ident }) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Default)]
        pub struct $name {
            $(#[$field_doc])*
            pub $field: Zeroizing<Vec<u8>>,
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field(stringify!($field), &format_args!("<{} bytes>", self.$field.len()))
                    .finish()
            }
        }

        impl prost::Message for $name {
            fn encode_raw(&self, buf: &mut impl BufMut) {
                if !self.$field.is_empty() {
                    prost::encoding::bytes::encode(1, &*self.$field, buf);
                }
            }

            fn merge_field(
                &mut self,
                tag: u32,
                wire_type: WireType,
                buf: &mut impl Buf,
                ctx: DecodeContext,
            ) -> Result<(), DecodeError> {
                if tag == 1 {
                    merge_secret(&mut self.$field, wire_type, buf)
                        .map_err(|mut e| {
                            e.push(stringify!($name), stringify!($field));
                            e
                        })
                } else {
                    prost::encoding::skip_field(wire_type, tag, buf, ctx)
                }
            }

            fn encoded_len(&self) -> usize {
                if self.$field.is_empty() {
                    0
                } else {
                    prost::encoding::bytes::encoded_len(1, &*self.$field)
                }
            }

            fn clear(&mut self) {
                self.$field.zeroize();
            }
        }
    };
}

secret_message! {
    /// Unseal output (`tpmvault.v1.UnsealResponse`).
    UnsealResponse {
        /// The secret.
        secret
    }
}

secret_message! {
    /// Decapsulate output (`tpmvault.v1.DecapsulateResponse`).
    DecapsulateResponse {
        /// The 32-byte shared secret.
        shared_secret
    }
}

secret_message! {
    /// ActivateCredential output (`tpmvault.v1.ActivateCredentialResponse`).
    ActivateCredentialResponse {
        /// The recovered credential.
        secret
    }
}

/// Decodes a length-delimited field into `field`, replacing what it held (the last occurrence
/// wins, as protobuf requires), with one copy straight into the zeroizing buffer: a value seen
/// earlier is wiped first, so no reallocation leaves secret bytes behind.
fn merge_secret(field: &mut Zeroizing<Vec<u8>>, wire_type: WireType, buf: &mut impl Buf) -> Result<(), DecodeError> {
    prost::encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
    let len = prost::encoding::decode_varint(buf)?;
    let len = usize::try_from(len).ok().filter(|&l| l <= buf.remaining()).ok_or_else(underflow)?;
    field.zeroize();
    field.reserve_exact(len);
    field.resize(len, 0);
    buf.copy_to_slice(field.as_mut_slice());
    Ok(())
}

/// The error prost's own `bytes` decoder gives for a length past the end of the buffer.
fn underflow() -> DecodeError {
    // prost keeps its error kinds private; its generic constructor is the way to make one.
    #[allow(deprecated)]
    DecodeError::new("buffer underflow")
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// What prost-build generates for `bytes secret = 1;` (the code these types replace).
    #[derive(Clone, PartialEq, prost::Message)]
    struct Generated {
        #[prost(bytes = "vec", tag = "1")]
        secret: Vec<u8>,
    }

    fn payloads() -> Vec<Vec<u8>> {
        vec![vec![], vec![0], vec![7; 32], (0..=255u8).cycle().take(300).collect(), vec![0xAB; 70_000]]
    }

    #[test]
    fn encodes_and_decodes_like_the_generated_type() {
        for p in payloads() {
            let ours = UnsealResponse { secret: Zeroizing::new(p.clone()) };
            let theirs = Generated { secret: p.clone() };
            assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec(), "{} bytes", p.len());
            assert_eq!(ours.encoded_len(), theirs.encoded_len());
            let decoded = UnsealResponse::decode(theirs.encode_to_vec().as_slice()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(decoded, ours);
            let back = Generated::decode(ours.encode_to_vec().as_slice()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back, theirs);
            let kem = DecapsulateResponse { shared_secret: Zeroizing::new(p.clone()) };
            assert_eq!(kem.encode_to_vec(), theirs.encode_to_vec());
            let cred = ActivateCredentialResponse { secret: Zeroizing::new(p) };
            assert_eq!(cred.encode_to_vec(), theirs.encode_to_vec());
        }
    }

    #[test]
    fn odd_input_decodes_or_fails_as_with_the_generated_type() {
        let mut cases: Vec<Vec<u8>> = vec![
            // Unknown fields before and after (varint 2, bytes 15, fixed64 3, fixed32 4).
            vec![
                0x10, 0x96, 0x01, 0x0a, 0x02, 0xAA, 0xBB, 0x7a, 0x01, 0x00, 0x19, 1, 2, 3, 4, 5, 6, 7, 8, 0x25, 1, 2,
                3, 4,
            ],
            // Field 1 twice: the last wins.
            vec![0x0a, 0x03, 1, 2, 3, 0x0a, 0x01, 9],
            // Field 1 with the wrong wire type.
            vec![0x08, 0x05],
            // A length past the end, and a truncated length.
            vec![0x0a, 0x05, 1, 2],
            vec![0x0a, 0x80],
            // Tag 0 is invalid.
            vec![0x02, 0x00],
            vec![],
        ];
        cases.push([vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f], vec![0; 8]].concat());
        for bytes in cases {
            let ours = UnsealResponse::decode(bytes.as_slice());
            let theirs = Generated::decode(bytes.as_slice());
            match (&ours, &theirs) {
                (Ok(o), Ok(t)) => assert_eq!(o.secret.as_slice(), t.secret.as_slice(), "{bytes:02x?}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{bytes:02x?}: ours {ours:?}, generated {theirs:?}"),
            }
        }
    }

    #[test]
    fn the_descriptor_has_exactly_these_fields() {
        use prost_types::field_descriptor_proto::Type;
        let set =
            prost_types::FileDescriptorSet::decode(crate::v1::FILE_DESCRIPTOR_SET).unwrap_or_else(|e| panic!("{e}"));
        for (message, field) in [
            ("UnsealResponse", "secret"),
            ("DecapsulateResponse", "shared_secret"),
            ("ActivateCredentialResponse", "secret"),
        ] {
            let found = set
                .file
                .iter()
                .flat_map(|f| f.message_type.iter())
                .find(|m| m.name() == message)
                .unwrap_or_else(|| panic!("{message} not in the descriptor set"));
            let fields: Vec<_> = found.field.iter().map(|f| (f.name(), f.number(), f.r#type())).collect();
            assert_eq!(fields, vec![(field, 1, Type::Bytes)], "{message}");
        }
    }

    #[test]
    fn debug_shows_no_secret_and_clear_wipes() {
        let mut m = DecapsulateResponse { shared_secret: Zeroizing::new(vec![0x5A; 32]) };
        let text = format!("{m:?}");
        assert_eq!(text, "DecapsulateResponse { shared_secret: <32 bytes> }");
        m.clear();
        assert!(m.shared_secret.is_empty());
    }
}
