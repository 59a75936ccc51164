//! Is the TPM a software TPM? Keys in a software TPM (swtpm, the Microsoft reference simulator)
//! live in an ordinary process's memory and state files: anyone who can read those can copy
//! them, so such a TPM protects nothing that a key file would not. `--simulator` says so when
//! the daemon starts its own swtpm, but a TCTI pointing at a software TPM by hand (a drop-in
//! with `tcti = "swtpm:..."`, a test config carried into production) would otherwise look like
//! hardware in status and metrics.
//!
//! [`detect`] gathers every sign of a software TPM: `--simulator`; a TCTI that only software
//! TPMs speak (`swtpm:`, `mssim:`); a TPM that reports swtpm/libtpms' identity (manufacturer
//! `IBM`, vendor string `SW   TPM`), which also catches one reached through a resource manager
//! (`tabrmd:`) or a CUSE device. Virtual TPMs of cloud hypervisors report their vendor's own
//! identity and are not flagged. The daemon warns at start ([`crate::serve::server`]), and status and
//! the `tpm_vault_software_tpm` metric report it. It owns no state and does no I/O.

use std::fmt;

use super::shared::TpmInfo;

/// Why the TPM is taken for a software TPM: every sign found, in the order checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftwareTpm {
    reasons: Vec<String>,
}

impl SoftwareTpm {
    /// The signs found, in the order checked.
    pub fn reasons(&self) -> &[String] {
        &self.reasons
    }
}

impl fmt::Display for SoftwareTpm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reasons.join("; "))
    }
}

/// TCTIs that reach software TPMs only, and what speaks them.
const SOFTWARE_TCTIS: [(&str, &str); 2] =
    [("swtpm", "swtpm's TCP protocol"), ("mssim", "the Microsoft TPM simulator's TCP protocol")];

/// The identity swtpm/libtpms reports: TPM_PT_MANUFACTURER and the words of its vendor string.
const LIBTPMS_MANUFACTURER: &str = "IBM";
const LIBTPMS_VENDOR: [&str; 2] = ["SW", "TPM"];

/// Every sign that the TPM the daemon uses is a software TPM: `simulator` (the daemon started
/// its own swtpm), the TCTI `tcti`, and the identity in `info`. `None`: it looks like hardware.
pub fn detect(simulator: bool, tcti: &str, info: &TpmInfo) -> Option<SoftwareTpm> {
    let mut reasons = Vec::new();
    if simulator {
        reasons.push("the daemon's own swtpm (--simulator)".to_owned());
    }
    let tcti_name = tcti.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
    if let Some((name, what)) = SOFTWARE_TCTIS.iter().find(|(name, _)| *name == tcti_name) {
        reasons.push(format!("TCTI {name}: ({what})"));
    }
    if info.manufacturer == LIBTPMS_MANUFACTURER && info.vendor.split_whitespace().eq(LIBTPMS_VENDOR) {
        reasons.push(format!(
            "the TPM reports manufacturer {} and vendor {:?} (swtpm/libtpms)",
            info.manufacturer, info.vendor
        ));
    }
    (!reasons.is_empty()).then_some(SoftwareTpm { reasons })
}

/// The TPM's vendor string from its four 4-character words (TPM_PT_VENDOR_STRING_1..4, each
/// big-endian ASCII; absent or NUL-padded at the end): `"SW  "`, `" TPM"` give `"SW   TPM"`.
pub(super) fn vendor_string(words: &[Option<u32>]) -> String {
    let text: String = words
        .iter()
        .flatten()
        .flat_map(|w| w.to_be_bytes())
        .filter(|b| b.is_ascii_graphic() || *b == b' ')
        .map(char::from)
        .collect();
    text.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(manufacturer: &str, vendor: &str) -> TpmInfo {
        TpmInfo { manufacturer: manufacturer.into(), vendor: vendor.into(), ..TpmInfo::default() }
    }

    fn word(s: &[u8; 4]) -> Option<u32> {
        Some(u32::from_be_bytes(*s))
    }

    #[test]
    fn vendor_words_become_the_vendor_string() {
        assert_eq!(vendor_string(&[word(b"SW  "), word(b" TPM"), None, None]), "SW   TPM");
        assert_eq!(vendor_string(&[word(b"SLB9"), word(b"672\0"), word(b"\0\0\0\0"), None]), "SLB9672");
        assert_eq!(vendor_string(&[None, None, None, None]), "");
    }

    #[test]
    fn hardware_is_not_flagged() {
        for tcti in ["device:/dev/tpmrm0", "tabrmd:bus_type=system", "device"] {
            assert_eq!(detect(false, tcti, &info("IFX", "SLB9672")), None, "{tcti}");
            assert_eq!(detect(false, tcti, &info("MSFT", "")), None, "{tcti}");
            // IBM made hardware TPMs too: the manufacturer alone is not a sign.
            assert_eq!(detect(false, tcti, &info("IBM", "")), None, "{tcti}");
        }
    }

    #[test]
    fn every_sign_is_reported() {
        let sim = detect(true, "swtpm:host=127.0.0.1,port=2321", &info("IBM", "SW   TPM"))
            .unwrap_or_else(|| panic!("software"));
        assert_eq!(sim.reasons().len(), 3, "{sim}");
        assert!(sim.to_string().starts_with("the daemon's own swtpm (--simulator); TCTI swtpm: "), "{sim}");
        let by_hand = detect(false, "swtpm:port=2321", &info("IFX", "")).unwrap_or_else(|| panic!("software"));
        assert_eq!(by_hand.to_string(), "TCTI swtpm: (swtpm's TCP protocol)");
        let mssim = detect(false, "mssim", &info("", "")).unwrap_or_else(|| panic!("software"));
        assert!(mssim.to_string().starts_with("TCTI mssim: "), "{mssim}");
        // A swtpm behind a device or a resource manager is known by its identity.
        let behind = detect(false, "device:/dev/tpmrm0", &info("IBM", "SW   TPM")).unwrap_or_else(|| panic!("sw"));
        assert_eq!(behind.to_string(), "the TPM reports manufacturer IBM and vendor \"SW   TPM\" (swtpm/libtpms)");
    }
}
