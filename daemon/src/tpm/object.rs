//! TPM objects between the store and the TPM: the one place that marshals and unmarshals the
//! blobs a record keeps ([`TpmObject`]) into what `TPM2_Load` takes ([`KeyBlob`]), and
//! computes an object's name.
//!
//! The blobs are exactly what tpm2-tools writes and `tpm2_load -u/-r` accepts: TPM2B_PUBLIC
//! marshalled by the TSS, and TPM2B_PRIVATE as a 2-byte big-endian size and the wrapped bytes.

use tss_esapi::structures::{Private, Public, PublicBuffer};
use tss_esapi::traits::{Marshall, UnMarshall};

use super::error::TpmError;
use crate::model::HashAlg;
use crate::store::TpmObject;

/// A key as the TPM needs it to load: the wrapped blobs and the object's name (its identity in
/// the LRU of loaded objects).
#[derive(Clone)]
pub struct KeyBlob {
    /// TPM object name (nameAlg || H(public)); identifies the loaded object.
    pub name: Vec<u8>,
    /// Public area.
    pub public: Public,
    /// TPM-wrapped private area (only this TPM's SRK can unwrap it).
    pub private: Private,
}

impl std::fmt::Debug for KeyBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyBlob").field("name", &hex::encode(&self.name)).finish_non_exhaustive()
    }
}

impl TryFrom<&TpmObject> for KeyBlob {
    type Error = TpmError;

    /// Unmarshals a stored object.
    ///
    /// # Errors
    /// [`TpmError::Malformed`] when a blob does not decode.
    fn try_from(object: &TpmObject) -> Result<Self, TpmError> {
        let public = PublicBuffer::unmarshall(&object.public)
            .and_then(Public::try_from)
            .map_err(|e| TpmError::Malformed(format!("public blob: {e}")))?;
        let private = unmarshal_private(&object.private).ok_or_else(|| TpmError::Malformed("private blob".into()))?;
        Ok(Self { name: object.tpm_name.clone(), public, private })
    }
}

/// The stored form of an object the TPM created: its name and both blobs marshalled.
///
/// # Errors
/// [`TpmError::Malformed`] if the public area does not marshal.
pub(crate) fn stored(public: Public, private: &Private) -> Result<TpmObject, TpmError> {
    let tpm_name = object_name(&public)?;
    let public = PublicBuffer::try_from(public)
        .and_then(|b| b.marshall())
        .map_err(|e| TpmError::from_tss("marshal public", e))?;
    Ok(TpmObject { tpm_name, public, private: marshal_private(private) })
}

/// TPM object name: nameAlg (SHA-256, 0x000b) || SHA-256(TPMT_PUBLIC).
fn object_name(public: &Public) -> Result<Vec<u8>, TpmError> {
    let tpmt = public.marshall().map_err(|e| TpmError::from_tss("marshal public", e))?;
    let mut name = vec![0x00, 0x0b];
    name.extend_from_slice(&HashAlg::Sha256.digest(&tpmt));
    Ok(name)
}

/// TPM2B_PRIVATE: 2-byte big-endian size, then the wrapped bytes (what tpm2-tools writes).
fn marshal_private(p: &Private) -> Vec<u8> {
    let v = p.value();
    let mut out = Vec::with_capacity(v.len() + 2);
    out.extend_from_slice(&(v.len() as u16).to_be_bytes());
    out.extend_from_slice(v);
    out
}

/// Parses a TPM2B_PRIVATE as written by `marshal_private`; `None` if the size prefix does not
/// match or the blob is too large for the TPM.
fn unmarshal_private(b: &[u8]) -> Option<Private> {
    let (len, rest) = b.split_first_chunk::<2>()?;
    if usize::from(u16::from_be_bytes(*len)) != rest.len() {
        return None;
    }
    Private::try_from(rest.to_vec()).ok()
}
