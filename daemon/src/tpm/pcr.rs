//! PCRs and PCR policies: reading and extending PCRs on the TPM, and computing policy digests
//! in software (so a secret can be sealed to PCR values the device will only have after the
//! next boot).
//!
//! Policy digests follow TPM 2.0 Part 3 and are computed by
//! [`tpm_vault_proto::policy_digest`], the one copy the CLI's offline `seal-for` uses too.

use std::collections::HashMap;

use tpm_vault_proto::policy_digest;
use tss_esapi::handles::PcrHandle;
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::structures::{Digest, DigestValues, PcrSelectionList, PcrSlot};
use tss_esapi::Context;

use super::error::TpmError;
use crate::model::{HashAlg, PcrBank, PcrSelection};

/// PCRs per TPM2_PCR_Read response.
const READ_CHUNK: usize = 8;

/// The TPM hash algorithm of a PCR bank.
pub fn bank_alg(bank: PcrBank) -> HashingAlgorithm {
    match bank {
        PcrBank::Sha1 => HashingAlgorithm::Sha1,
        PcrBank::Sha256 => HashingAlgorithm::Sha256,
        PcrBank::Sha384 => HashingAlgorithm::Sha384,
    }
}

fn bank_id(bank: PcrBank) -> u16 {
    match bank {
        PcrBank::Sha1 => 0x0004,
        PcrBank::Sha256 => 0x000B,
        PcrBank::Sha384 => 0x000C,
    }
}

/// The tss-esapi selection list for a selection.
///
/// # Errors
/// [`TpmError::Malformed`] for an index the TPM library cannot express.
pub fn selection_list(sel: &PcrSelection) -> Result<PcrSelectionList, TpmError> {
    let slots = slots(&sel.pcrs)?;
    PcrSelectionList::builder()
        .with_selection(bank_alg(sel.bank), &slots)
        .build()
        .map_err(|e| TpmError::from_tss("PCR selection", e))
}

fn slots(pcrs: &[u8]) -> Result<Vec<PcrSlot>, TpmError> {
    pcrs.iter()
        .map(|&i| {
            let bit =
                1u32.checked_shl(u32::from(i)).ok_or_else(|| TpmError::Malformed(format!("PCR {i} out of range")))?;
            PcrSlot::try_from(bit).map_err(|e| TpmError::Malformed(format!("PCR {i}: {e}")))
        })
        .collect()
}

/// Reads the selected PCRs, in selection order. Returns the TPM's PCR update counter too, so
/// callers can detect a change between two reads.
///
/// # Errors
/// TPM errors; [`TpmError::Malformed`] if the TPM does not have the bank.
pub fn read(ctx: &mut Context, sel: &PcrSelection) -> Result<(u32, Vec<Vec<u8>>), TpmError> {
    let mut values = Vec::with_capacity(sel.pcrs.len());
    let mut counter = 0;
    for chunk in sel.pcrs.chunks(READ_CHUNK) {
        let part = selection_list(&PcrSelection { bank: sel.bank, pcrs: chunk.to_vec() })?;
        let (update, _, digests) =
            ctx.execute_without_session(|c| c.pcr_read(part)).map_err(|e| TpmError::from_tss("TPM2_PCR_Read", e))?;
        if digests.len() != chunk.len() {
            return Err(TpmError::Malformed(format!(
                "TPM returned {} of {} PCRs of bank {} (bank not allocated?)",
                digests.len(),
                chunk.len(),
                sel.bank.as_str()
            )));
        }
        counter = update;
        values.extend(digests.value().iter().map(|d| d.value().to_vec()));
    }
    Ok((counter, values))
}

/// The PCR values the TPM last reported, per bank and index. Only a hint: a quote checks
/// remembered values against the digest the TPM signed before it returns them (so a stale
/// entry costs a read, never a wrong answer), which saves a `TPM2_PCR_Read` per quote while the
/// PCRs do not change; on a firmware TPM that is a whole secure-world round trip.
#[derive(Debug, Default)]
pub struct PcrCache {
    values: HashMap<(PcrBank, u8), Vec<u8>>,
}

impl PcrCache {
    /// The remembered values of `sel`, in selection order, if every one is known.
    pub fn get(&self, sel: &PcrSelection) -> Option<Vec<Vec<u8>>> {
        sel.pcrs.iter().map(|&i| self.values.get(&(sel.bank, i)).cloned()).collect()
    }

    /// Remembers `values` (in selection order) as just read.
    pub fn put(&mut self, sel: &PcrSelection, values: &[Vec<u8>]) {
        for (&i, v) in sel.pcrs.iter().zip(values) {
            self.values.insert((sel.bank, i), v.clone());
        }
    }
}

/// Extends a PCR with a digest of `bank`'s size (what a boot loader does). For tests and tools.
///
/// # Errors
/// TPM errors; [`TpmError::Malformed`] for a PCR index that is not extendable.
pub fn extend(ctx: &mut Context, bank: PcrBank, pcr: u8, digest: &[u8]) -> Result<(), TpmError> {
    let handle = PcrHandle::try_from(u32::from(pcr)).map_err(|e| TpmError::Malformed(format!("PCR {pcr}: {e}")))?;
    let mut values = DigestValues::new();
    let d = Digest::try_from(digest.to_vec()).map_err(|e| TpmError::from_tss("digest", e))?;
    values.set(bank_alg(bank), d);
    ctx.execute_with_session(Some(tss_esapi::interface_types::session_handles::AuthSession::Password), |c| {
        c.pcr_extend(handle, values)
    })
    .map_err(|e| TpmError::from_tss("TPM2_PCR_Extend", e))
}

/// `TPM2_PolicyPCR` digest, starting from the all-zero policy, for the given PCR values (in
/// selection order). Policy hash is SHA-256 (the vault's objects use SHA-256 names).
///
/// # Errors
/// [`TpmError::Malformed`] if a value has the wrong length for its bank.
pub fn policy_pcr_digest(sel: &PcrSelection, values: &[Vec<u8>]) -> Result<Vec<u8>, TpmError> {
    if values.len() != sel.pcrs.len() || values.iter().any(|v| v.len() != sel.bank.digest_len()) {
        return Err(TpmError::Malformed(format!(
            "need {} value(s) of {} bytes for {sel}",
            sel.pcrs.len(),
            sel.bank.digest_len()
        )));
    }
    policy_digest::policy_pcr(bank_id(sel.bank), &sel.pcrs, values)
        .map_err(|e| TpmError::Malformed(format!("{sel}: {e}")))
}

/// `TPM2_PolicyAuthorize` digest, starting from the all-zero policy.
pub fn policy_authorize_digest(key_name: &[u8], policy_ref: &[u8]) -> Vec<u8> {
    policy_digest::policy_authorize(key_name, policy_ref)
}

/// The value a PCR holds after extending `current` with `measurement` (bank hash).
pub fn extended_value(bank: PcrBank, current: &[u8], measurement: &[u8]) -> Vec<u8> {
    let data = [current, measurement].concat();
    match bank {
        PcrBank::Sha1 => {
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &data).as_ref().to_vec()
        }
        PcrBank::Sha256 => HashAlg::Sha256.digest(&data),
        PcrBank::Sha384 => HashAlg::Sha384.digest(&data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn software_authority_name_is_the_templates() {
        // seal-for computes the authority's name without a TPM: it must be the name of the
        // public area the daemon loads with TPM2_LoadExternal.
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        use tss_esapi::traits::Marshall;
        let key = p256::SecretKey::from_slice(&[9u8; 32]).unwrap_or_else(|e| panic!("{e}")).public_key();
        let point = key.to_encoded_point(false);
        let (x, y) = (point.x().unwrap_or_else(|| panic!("x")), point.y().unwrap_or_else(|| panic!("y")));
        let template = super::super::templates::external_p256(x, y).unwrap_or_else(|e| panic!("{e}"));
        let tpmt = template.marshall().unwrap_or_else(|e| panic!("{e}"));
        let want = policy_digest::name_of(&tpmt);
        assert_eq!(policy_digest::authority_name(point.as_bytes()).unwrap_or_else(|e| panic!("{e}")), want);
    }

    #[test]
    fn selection_and_values_are_checked() {
        let sel = PcrSelection::new(PcrBank::Sha256, &[0, 9, 23]).unwrap_or_else(|e| panic!("{e}"));
        assert!(policy_pcr_digest(&sel, &[vec![0; 32], vec![0; 32], vec![0; 32]]).is_ok());
        assert!(policy_pcr_digest(&sel, &[vec![0; 32]]).is_err());
    }

    #[test]
    fn extend_is_hash_of_concatenation() {
        let zero = vec![0u8; 32];
        let m = vec![1u8; 32];
        assert_eq!(extended_value(PcrBank::Sha256, &zero, &m), HashAlg::Sha256.digest(&[zero.clone(), m].concat()));
    }
}
