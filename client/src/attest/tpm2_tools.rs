//! File formats of tpm2-tools, so quotes and credentials move between tpm-vault and
//! `tpm2_checkquote` / `tpm2_makecredential`.
//!
//! - `quote.pcrs`: tpm2-tools 5.x's default ("serialized") PCR file, a raw dump of its C
//!   structures in host (little-endian) order: a `TPML_PCR_SELECTION` (u32 count, then 16
//!   `TPMS_PCR_SELECTION` slots of {u16 hashAlg, u8 sizeofSelect, u8 pcrSelect[4], pad} = 132
//!   bytes), a u32 count N, then N `TPML_DIGEST` (u32 count, then 8 `TPM2B_DIGEST` slots of
//!   {u16 size, u8 buffer[64]} = 532 bytes), holding the values in selection order, 8 per
//!   `TPML_DIGEST` (the most one `TPM2_PCR_Read` returns).
//! - credential files (`tpm2_makecredential -o`): big-endian magic 0xBADCC0DE, version 1, a
//!   `TPM2B_ID_OBJECT` and a `TPM2B_ENCRYPTED_SECRET`.
//!
//! Decoders never panic and reject anything but the exact layout.

use super::verify::{alg_bank, bank_alg, bitmap_indices, Reader};
use super::{ParseError, PcrValues};

/// `TPMS_PCR_SELECTION` slots in a `TPML_PCR_SELECTION` (TPM2_NUM_PCR_BANKS).
const SELECTION_SLOTS: usize = 16;
/// Size of one `TPMS_PCR_SELECTION` slot in memory: 2 + 1 + 4, padded to 8.
const SELECTION_SLOT_SIZE: usize = 8;
/// pcrSelect bytes in memory (TPM2_PCR_SELECT_MAX).
const SELECT_BYTES: usize = 4;
/// sizeofSelect tpm2-tools writes: 3 bytes cover PCRs 0-23.
const SIZEOF_SELECT: u8 = 3;
/// Size of the serialized `TPML_PCR_SELECTION`.
const SELECTION_SIZE: usize = 4 + SELECTION_SLOTS * SELECTION_SLOT_SIZE;
/// `TPM2B_DIGEST` slots per `TPML_DIGEST`.
const DIGEST_SLOTS: usize = 8;
/// Buffer of a `TPM2B_DIGEST` in memory (sizeof(TPMU_HA)).
const DIGEST_BUFFER: usize = 64;
/// Size of a serialized `TPML_DIGEST`.
const DIGEST_LIST_SIZE: usize = 4 + DIGEST_SLOTS * (2 + DIGEST_BUFFER);
/// Most `TPML_DIGEST` structures tpm2-tools reads (TPM2_MAX_PCRS).
const MAX_DIGEST_LISTS: u32 = 32;
/// Magic of a tpm2-tools credential file.
const CREDENTIAL_MAGIC: u32 = 0xBADC_C0DE;
/// Version of a tpm2-tools credential file.
const CREDENTIAL_VERSION: u32 = 1;

/// Encodes PCR values as tpm2-tools' serialized `quote.pcrs` (what `tpm2_quote -o` writes and
/// `tpm2_checkquote -f` reads). Values go in ascending PCR order.
///
/// # Errors
/// [`ParseError::Invalid`] for an unknown bank, an index above 23, a repeated index, a value
/// count that does not match, or a value longer than 64 bytes.
///
/// ```
/// use tpm_vault_client::attest::{decode_pcrs, encode_pcrs, PcrValues};
///
/// let values = PcrValues { bank: "sha256".into(), pcrs: vec![0, 9], values: vec![vec![0; 32], vec![1; 32]] };
/// let file = encode_pcrs(&values)?;
/// assert_eq!(file.len(), 668);
/// assert_eq!(decode_pcrs(&file)?, values);
/// # Ok::<(), tpm_vault_client::attest::ParseError>(())
/// ```
pub fn encode_pcrs(values: &PcrValues) -> Result<Vec<u8>, ParseError> {
    let invalid = |reason| ParseError::Invalid { what: "PCR values", reason };
    let alg = bank_alg(&values.bank).ok_or(invalid("unknown PCR bank"))?;
    if values.pcrs.len() != values.values.len() {
        return Err(invalid("not one value per PCR"));
    }
    let mut pairs: Vec<(u32, &[u8])> = values.iter().collect();
    pairs.sort_by_key(|(pcr, _)| *pcr);
    if pairs.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(invalid("a PCR is given twice"));
    }
    let mut bitmap = [0u8; SELECT_BYTES];
    for (pcr, value) in &pairs {
        if *pcr >= u32::from(SIZEOF_SELECT) * 8 {
            return Err(invalid("PCR index above 23"));
        }
        if value.len() > DIGEST_BUFFER {
            return Err(invalid("PCR value longer than 64 bytes"));
        }
        bitmap[(*pcr / 8) as usize] |= 1 << (pcr % 8);
    }
    let lists = pairs.chunks(DIGEST_SLOTS).count();
    let mut out = Vec::with_capacity(SELECTION_SIZE + 4 + lists * DIGEST_LIST_SIZE);
    // TPML_PCR_SELECTION: one bank in slot 0, the other 15 slots zero.
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&alg.to_le_bytes());
    out.push(SIZEOF_SELECT);
    out.extend_from_slice(&bitmap);
    out.push(0);
    out.resize(SELECTION_SIZE, 0);
    // tpm2_pcrs: count, then the TPML_DIGESTs.
    out.extend_from_slice(&(lists as u32).to_le_bytes());
    for chunk in pairs.chunks(DIGEST_SLOTS) {
        let start = out.len();
        out.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        for (_, value) in chunk {
            out.extend_from_slice(&(value.len() as u16).to_le_bytes());
            out.extend_from_slice(value);
            out.resize(out.len() + DIGEST_BUFFER - value.len(), 0);
        }
        out.resize(start + DIGEST_LIST_SIZE, 0);
    }
    Ok(out)
}

/// Decodes tpm2-tools' serialized `quote.pcrs` (one bank; values in selection order).
///
/// # Errors
/// [`ParseError`] for a truncated or oversized file, several banks, an unknown bank, a
/// bitmap wider than 4 bytes, a digest whose size is not the bank's, or a number of values
/// that differs from the number of selected PCRs.
pub fn decode_pcrs(file: &[u8]) -> Result<PcrValues, ParseError> {
    const WHAT: &str = "PCR file";
    let mut r = Reader::new(file, WHAT);
    let count = r.u32_le()?;
    if count as usize > SELECTION_SLOTS {
        return Err(ParseError::BadField {
            what: WHAT,
            field: "selection count",
            value: count.into(),
            expected: "at most 16",
        });
    }
    let mut banks = Vec::new();
    for slot in 0..SELECTION_SLOTS {
        let alg = r.u16_le()?;
        let size = r.u8()?;
        let bitmap = r.take(SELECT_BYTES, "pcrSelect")?;
        r.u8()?;
        if slot >= count as usize {
            continue;
        }
        if usize::from(size) > SELECT_BYTES {
            return Err(ParseError::BadField {
                what: WHAT,
                field: "sizeofSelect",
                value: size.into(),
                expected: "at most 4",
            });
        }
        let pcrs = bitmap_indices(&bitmap[..usize::from(size)]);
        if !pcrs.is_empty() {
            banks.push((alg, pcrs));
        }
    }
    let [(alg, pcrs)] = <[_; 1]>::try_from(banks)
        .map_err(|_| ParseError::Invalid { what: WHAT, reason: "must select PCRs of exactly one bank" })?;
    let (bank, digest_len) = alg_bank(alg).ok_or(ParseError::BadField {
        what: WHAT,
        field: "hashAlg",
        value: alg.into(),
        expected: "sha1, sha256, sha384 or sha512",
    })?;
    let lists = r.u32_le()?;
    if lists > MAX_DIGEST_LISTS {
        return Err(ParseError::BadField {
            what: WHAT,
            field: "digest list count",
            value: lists.into(),
            expected: "at most 32",
        });
    }
    let mut values = Vec::new();
    for _ in 0..lists {
        let used = r.u32_le()?;
        if used as usize > DIGEST_SLOTS {
            return Err(ParseError::BadField {
                what: WHAT,
                field: "TPML_DIGEST count",
                value: used.into(),
                expected: "at most 8",
            });
        }
        for slot in 0..DIGEST_SLOTS {
            let size = r.u16_le()?;
            let buffer = r.take(DIGEST_BUFFER, "TPM2B_DIGEST")?;
            if slot < used as usize {
                if usize::from(size) != digest_len {
                    return Err(ParseError::BadField {
                        what: WHAT,
                        field: "digest size",
                        value: size.into(),
                        expected: "the bank's digest size",
                    });
                }
                values.push(buffer[..digest_len].to_vec());
            }
        }
    }
    r.finish()?;
    if values.len() != pcrs.len() {
        return Err(ParseError::Invalid {
            what: WHAT,
            reason: "the number of values differs from the number of selected PCRs",
        });
    }
    Ok(PcrValues { bank: bank.to_owned(), pcrs, values })
}

/// A credential made by `tpm2_makecredential` (or `TPM2_MakeCredential`) for the AK, to be
/// recovered with [`Client::activate_credential`](crate::Client::activate_credential).
#[derive(Clone, PartialEq, Eq)]
pub struct CredentialFile {
    /// The `TPM2B_ID_OBJECT`, with its size prefix.
    pub credential_blob: Vec<u8>,
    /// The `TPM2B_ENCRYPTED_SECRET`, with its size prefix.
    pub encrypted_secret: Vec<u8>,
}

impl std::fmt::Debug for CredentialFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialFile")
            .field("credential_blob_len", &self.credential_blob.len())
            .field("encrypted_secret_len", &self.encrypted_secret.len())
            .finish_non_exhaustive()
    }
}

impl CredentialFile {
    /// Parses a tpm2-tools credential file.
    ///
    /// # Errors
    /// [`ParseError`] for a wrong magic or version, truncation or trailing bytes.
    pub fn parse(file: &[u8]) -> Result<CredentialFile, ParseError> {
        const WHAT: &str = "credential file";
        let mut r = Reader::new(file, WHAT);
        let magic = r.u32()?;
        if magic != CREDENTIAL_MAGIC {
            return Err(ParseError::BadField {
                what: WHAT,
                field: "magic",
                value: magic.into(),
                expected: "0xbadcc0de",
            });
        }
        let version = r.u32()?;
        if version != CREDENTIAL_VERSION {
            return Err(ParseError::BadField { what: WHAT, field: "version", value: version.into(), expected: "1" });
        }
        let start = r.consumed().len();
        r.tpm2b("TPM2B_ID_OBJECT")?;
        let middle = r.consumed().len();
        r.tpm2b("TPM2B_ENCRYPTED_SECRET")?;
        r.finish()?;
        Ok(CredentialFile { credential_blob: file[start..middle].to_vec(), encrypted_secret: file[middle..].to_vec() })
    }

    /// Encodes the file as `tpm2_makecredential` writes it.
    pub fn to_bytes(&self) -> Vec<u8> {
        [
            &CREDENTIAL_MAGIC.to_be_bytes()[..],
            &CREDENTIAL_VERSION.to_be_bytes(),
            &self.credential_blob,
            &self.encrypted_secret,
        ]
        .concat()
    }
}
