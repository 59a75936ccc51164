//! PCR bindings (`tpmvault.v1.PcrBinding` of Seal, CreateKey, CreateDataKey, Quote and
//! ReadPcrs): `prost` decoding, then the RPC layer's parse (`rpc::pcr_binding`, through
//! `tpm_vault_daemon::fuzzing`), then what the vault does next without a TPM: the PCR selection
//! list and, with values, the policy digest.
//!
//! Properties: no panic; an accepted binding selects exactly the PCRs named (9 if none), in one
//! bank; with values, one value per selected PCR, each the value given for that PCR (no value
//! given is dropped or moved to another PCR), of the bank's digest size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tpm_vault_daemon::formats::pcr;
use tpm_vault_daemon::model::{PcrBank, PcrSelection};
use tpm_vault_proto::v1::PcrBinding;

fuzz_target!(|data: &[u8]| {
    let Ok(binding) = PcrBinding::decode(data) else { return };
    let Ok(target) = tpm_vault_daemon::fuzzing::pcr_binding(binding.clone()) else { return };
    let bank: PcrBank = binding.bank.parse().unwrap_or_else(|e| panic!("accepted bank {:?}: {e}", binding.bank));
    let sel = &target.selection;
    assert_eq!(sel.bank, bank);
    let named: Vec<u32> =
        if binding.pcrs.is_empty() { vec![PcrSelection::DEFAULT_INDEX] } else { binding.pcrs.clone() };
    let mut expected: Vec<u8> = named.iter().map(|&i| u8::try_from(i).unwrap_or_else(|e| panic!("{e}"))).collect();
    expected.sort_unstable();
    expected.dedup();
    assert_eq!(sel.pcrs, expected, "selection differs from the PCRs named");
    assert!(sel.pcrs.iter().all(|&i| u32::from(i) <= PcrSelection::MAX_INDEX));
    let _ = pcr::selection_list(sel);
    match &target.values {
        None => assert!(binding.values.is_empty(), "values given but dropped"),
        Some(values) => {
            assert_eq!(values.len(), sel.pcrs.len());
            for (index, value) in named.iter().zip(&binding.values) {
                let at = sel.pcrs.iter().position(|&p| u32::from(p) == *index).unwrap_or_else(|| panic!("PCR {index}"));
                assert_eq!(&values[at], value, "PCR {index} is bound to another value than the one given");
                assert_eq!(value.len(), bank.digest_len());
            }
            pcr::policy_pcr_digest(sel, values).unwrap_or_else(|e| panic!("accepted values: {e}"));
        }
    }
});
