//! The encrypted stream format: [`tpm_vault_proto::stream`], shared with the client library
//! (which encrypts and decrypts v2 and v3 streams in the caller's process). The daemon wraps and
//! unwraps stream keys with its data keys (`vault::datakey`) and serves the `Encrypt` /
//! `Decrypt` RPCs for callers that cannot run AES themselves.

pub use tpm_vault_proto::stream::{
    commit, mac_key, unwrap, verify, wrap, DataKeyId, Decryptor, Encryptor, Header, Keying, StreamError, CHUNK,
    MAX_HEADER,
};

impl From<StreamError> for crate::error::Error {
    fn from(e: StreamError) -> Self {
        crate::error::Error::invalid(e.0)
    }
}
