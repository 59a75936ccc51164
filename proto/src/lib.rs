//! `tpmvault.v1`: the tpm-vault gRPC API.
//!
//! The `.proto` files live in `proto/tpmvault/v1/`; the Rust code in `src/gen/` is generated from
//! them by `tests/bootstrap.rs` (run `cargo test -p tpm-vault-proto` after editing a `.proto` and
//! commit the result), so building needs no `protoc`.
//!
//! Beside the generated code, the contract both sides must agree on byte for byte or name for
//! name: [`operation`] (the access-policy vocabulary), [`signed_policy`], [`pq_oids`],
//! [`hybrid`], [`ml_kem`] (the FIPS 203 check of an ML-KEM public key), [`ml_dsa`] (the FIPS
//! 204 length check of an ML-DSA public key), [`policy_digest`] (TPM policy digests in
//! software), [`sealed_blob`] (secrets sealed for a device: the blob and its duplication), [`stream`] (the encrypted stream format) and
//! [`status`]; with the `rustls` feature, `tls_key` (the rustls signing key of a vault key). [`secret`] holds the response messages that carry secrets, hand-written so their
//! bytes are zeroized on drop.
#![deny(missing_debug_implementations)]
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

/// Version 1 of the API.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!("gen/tpmvault.v1.rs");

    pub use crate::secret::{ActivateCredentialResponse, DecapsulateResponse, UnsealResponse};

    /// Encoded `FileDescriptorSet` of the API, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("gen/tpmvault_descriptor.bin");
}

pub mod algorithm;
pub mod ml_dsa;
pub mod ml_kem;
pub mod operation;
pub mod policy_digest;
pub mod sealed_blob;
pub mod secret;
pub mod stream;
#[cfg(feature = "rustls")]
pub mod tls_key;
pub mod tls_scheme;

/// The byte strings a policy authority signs in a [`v1::SignedPolicy`] (ECDSA P-256 with
/// SHA-256 over each). Shared by the daemon (which checks them) and the CLI (which signs).
pub mod signed_policy {
    /// Domain separator of the envelope signature.
    pub const ENVELOPE_CONTEXT: &[u8] = b"tpm-vault-policy-v1";

    /// What `signature` covers: `approved_policy || policy_ref`, the message whose SHA-256 the
    /// TPM checks in `TPM2_VerifySignature` before `TPM2_PolicyAuthorize`.
    pub fn approval_message(approved_policy: &[u8], policy_ref: &[u8]) -> Vec<u8> {
        [approved_policy, policy_ref].concat()
    }

    /// What `envelope_signature` covers: the context string, the approval, and the version and
    /// expiry the daemon enforces.
    pub fn envelope_message(approved_policy: &[u8], policy_ref: &[u8], version: u64, expires_unix: i64) -> Vec<u8> {
        [ENVELOPE_CONTEXT, approved_policy, policy_ref, &version.to_be_bytes(), &expires_unix.to_be_bytes()].concat()
    }
}

/// Object identifiers of the post-quantum keys' SubjectPublicKeyInfo (`AlgorithmIdentifier`
/// with absent parameters, the raw public key as the BIT STRING): ML-DSA per RFC 9881, ML-KEM
/// per draft-ietf-lamps-kyber-certificates (NIST CSOR "id-alg-ml-kem-*"). Shared by the daemon
/// (which encodes them) and the client (which parses them).
pub mod pq_oids {
    /// `id-ml-dsa-44`.
    pub const ID_ML_DSA_44: &str = "2.16.840.1.101.3.4.3.17";
    /// `id-ml-dsa-65`.
    pub const ID_ML_DSA_65: &str = "2.16.840.1.101.3.4.3.18";
    /// `id-ml-dsa-87`.
    pub const ID_ML_DSA_87: &str = "2.16.840.1.101.3.4.3.19";
    /// `id-alg-ml-kem-768`.
    pub const ID_ALG_ML_KEM_768: &str = "2.16.840.1.101.3.4.4.2";
    /// `id-alg-ml-kem-1024`.
    pub const ID_ALG_ML_KEM_1024: &str = "2.16.840.1.101.3.4.4.3";
}

/// The hybrid signature format of `SIGNATURE_SCHEME_HYBRID`: an ECDSA P-256 signature made by a
/// TPM-resident key and an ML-DSA-65 signature, over the same message; a verifier accepts it only
/// if both halves are valid. Shared by the daemon (which makes and checks these) and the client
/// library (which checks them without the daemon).
///
/// Version 1, integers big-endian:
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 4 | magic `"TVHS"` (tpm-vault hybrid signature) |
/// | 4 | 1 | format version, 1 |
/// | 5 | 1 | algorithm pair, 1 = ECDSA P-256 with SHA-256 + ML-DSA-65 |
/// | 6 | 2 | `n`, length of the ECDSA signature (at most 72) |
/// | 8 | `n` | ECDSA signature, DER `ECDSA-Sig-Value` |
/// | 8 + `n` | 2 | `m`, length of the ML-DSA-65 signature (3309) |
/// | 10 + `n` | `m` | ML-DSA-65 signature (FIPS 204 encoding; pure ML-DSA, empty context) |
///
/// Nothing may follow. Both halves sign `M' = header || M`, where `header` is the first 6 bytes
/// (magic, version, algorithm) and `M` the message: neither half is a valid plain signature of
/// `M` (no stripping one half off to pass it as a classical or a pure ML-DSA signature), and a
/// signature cannot be re-labelled with another version or algorithm pair.
pub mod hybrid {
    use std::fmt;

    /// Magic bytes at offset 0.
    pub const MAGIC: [u8; 4] = *b"TVHS";
    /// The only format version so far.
    pub const VERSION: u8 = 1;
    /// Algorithm pair 1: ECDSA P-256 with SHA-256, and ML-DSA-65.
    pub const ALG_P256_ML_DSA_65: u8 = 1;
    /// Longest DER ECDSA P-256 signature.
    pub const MAX_ECDSA_LEN: usize = 72;
    /// Length of an ML-DSA-65 signature.
    pub const ML_DSA_65_LEN: usize = 3309;

    /// The 6-byte header: magic, version, algorithm pair.
    pub fn header() -> [u8; 6] {
        [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], VERSION, ALG_P256_ML_DSA_65]
    }

    /// `M' = header || message`: what both halves sign.
    pub fn signed_message(message: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(6 + message.len());
        m.extend_from_slice(&header());
        m.extend_from_slice(message);
        m
    }

    /// A decoded hybrid signature (the two halves, not yet verified).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct HybridSignature {
        /// DER `ECDSA-Sig-Value` over `SHA-256(M')`.
        pub ecdsa: Vec<u8>,
        /// ML-DSA-65 signature over `M'`.
        pub ml_dsa: Vec<u8>,
    }

    /// Why bytes are not a hybrid signature of this format.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum FormatError {
        /// Shorter than its headers and lengths say.
        Truncated,
        /// Does not start with `"TVHS"`.
        BadMagic,
        /// A format version this code does not know.
        UnsupportedVersion(u8),
        /// An algorithm pair this code does not know.
        UnsupportedAlgorithm(u8),
        /// A half has an impossible length.
        BadLength,
        /// Bytes after the ML-DSA signature.
        TrailingBytes,
    }

    impl fmt::Display for FormatError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Self::Truncated => f.write_str("hybrid signature is truncated"),
                Self::BadMagic => f.write_str("not a tpm-vault hybrid signature (magic is not TVHS)"),
                Self::UnsupportedVersion(v) => write!(f, "unsupported hybrid signature version {v}"),
                Self::UnsupportedAlgorithm(a) => write!(f, "unsupported hybrid algorithm pair {a}"),
                Self::BadLength => f.write_str("hybrid signature half has an impossible length"),
                Self::TrailingBytes => f.write_str("bytes after the end of the hybrid signature"),
            }
        }
    }

    impl std::error::Error for FormatError {}

    impl HybridSignature {
        /// Encodes version 1.
        ///
        /// # Errors
        /// [`FormatError::BadLength`] if a half does not fit its length field or limits.
        pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
            if self.ecdsa.is_empty() || self.ecdsa.len() > MAX_ECDSA_LEN || self.ml_dsa.len() != ML_DSA_65_LEN {
                return Err(FormatError::BadLength);
            }
            let mut out = Vec::with_capacity(10 + self.ecdsa.len() + self.ml_dsa.len());
            out.extend_from_slice(&header());
            out.extend_from_slice(&(self.ecdsa.len() as u16).to_be_bytes());
            out.extend_from_slice(&self.ecdsa);
            out.extend_from_slice(&(self.ml_dsa.len() as u16).to_be_bytes());
            out.extend_from_slice(&self.ml_dsa);
            Ok(out)
        }

        /// Decodes and checks the framing (not the signatures).
        ///
        /// # Errors
        /// [`FormatError`] naming what is wrong.
        pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
            let (head, rest) = bytes.split_at_checked(6).ok_or(FormatError::Truncated)?;
            if head[..4] != MAGIC {
                return Err(FormatError::BadMagic);
            }
            if head[4] != VERSION {
                return Err(FormatError::UnsupportedVersion(head[4]));
            }
            if head[5] != ALG_P256_ML_DSA_65 {
                return Err(FormatError::UnsupportedAlgorithm(head[5]));
            }
            let (ecdsa, rest) = take_prefixed(rest)?;
            let (ml_dsa, rest) = take_prefixed(rest)?;
            if !rest.is_empty() {
                return Err(FormatError::TrailingBytes);
            }
            if ecdsa.is_empty() || ecdsa.len() > MAX_ECDSA_LEN || ml_dsa.len() != ML_DSA_65_LEN {
                return Err(FormatError::BadLength);
            }
            Ok(Self { ecdsa: ecdsa.to_vec(), ml_dsa: ml_dsa.to_vec() })
        }
    }

    fn take_prefixed(b: &[u8]) -> Result<(&[u8], &[u8]), FormatError> {
        let (len, rest) = b.split_first_chunk::<2>().ok_or(FormatError::Truncated)?;
        rest.split_at_checked(usize::from(u16::from_be_bytes(*len))).ok_or(FormatError::Truncated)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn round_trips_and_rejects_malformed_input() {
            let sig = HybridSignature { ecdsa: vec![0x30; 70], ml_dsa: vec![7; ML_DSA_65_LEN] };
            let bytes = sig.encode().unwrap();
            assert_eq!(bytes.len(), 10 + 70 + ML_DSA_65_LEN);
            assert_eq!(&bytes[..6], b"TVHS\x01\x01");
            assert_eq!(HybridSignature::decode(&bytes), Ok(sig));
            assert_eq!(HybridSignature::decode(&bytes[..bytes.len() - 1]), Err(FormatError::Truncated));
            assert_eq!(HybridSignature::decode(&[bytes.as_slice(), &[0]].concat()), Err(FormatError::TrailingBytes));
            let mut v2 = bytes.clone();
            v2[4] = 2;
            assert_eq!(HybridSignature::decode(&v2), Err(FormatError::UnsupportedVersion(2)));
            let mut magic = bytes.clone();
            magic[0] = b'X';
            assert_eq!(HybridSignature::decode(&magic), Err(FormatError::BadMagic));
            assert_eq!(HybridSignature::decode(b""), Err(FormatError::Truncated));
            assert_eq!(signed_message(b"fw"), b"TVHS\x01\x01fw");
        }
    }
}

/// Classifies the statuses a gRPC client sees, beyond the codes the daemon itself sends.
pub mod status {
    use std::io;

    use tonic::{Code, Status};

    /// True when `status` is tonic's `UNKNOWN` for a connection that broke under the call
    /// (broken pipe, reset, closed mid-response), as when the daemon closes a connection at
    /// shutdown while the client is still writing on it. gRPC's core implementations report
    /// such failures as `UNAVAILABLE` (retryable); tonic leaves them `UNKNOWN`.
    pub fn is_broken_connection(status: &Status) -> bool {
        if status.code() != Code::Unknown {
            return false;
        }
        let mut current: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
        while let Some(e) = current {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                return matches!(
                    io.kind(),
                    io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::NotConnected
                        | io::ErrorKind::UnexpectedEof
                );
            }
            current = e.source();
        }
        false
    }

    /// `status` with a broken connection ([`is_broken_connection`]) reported as `UNAVAILABLE`,
    /// keeping its message; any other status unchanged.
    pub fn normalize(status: Status) -> Status {
        if is_broken_connection(&status) {
            Status::unavailable(format!("connection to the daemon lost: {}", status.message()))
        } else {
            status
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn only_broken_connections_become_unavailable() {
            let broken = Status::from_error(Box::new(io::Error::from(io::ErrorKind::BrokenPipe)));
            assert_eq!(broken.code(), Code::Unknown);
            assert!(is_broken_connection(&broken));
            assert_eq!(normalize(broken).code(), Code::Unavailable);
            let other = Status::from_error(Box::new(io::Error::from(io::ErrorKind::PermissionDenied)));
            assert!(!is_broken_connection(&other));
            assert_eq!(normalize(other).code(), Code::Unknown);
            assert_eq!(normalize(Status::not_found("x")).code(), Code::NotFound);
            assert_eq!(normalize(Status::unknown("plain")).code(), Code::Unknown);
        }
    }
}
