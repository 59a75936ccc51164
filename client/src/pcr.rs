//! PCR bindings: which PCR values a key's use depends on, and their text form.
//!
//! Owns the `BANK:IDX[,IDX]` / `BANK:IDX=HEX[,IDX=HEX]` syntax (the one tpm2-tools and the
//! SPEC use, e.g. `sha256:9` or `sha256:9=<64 hex digits>`) and the checks that can be made
//! without a TPM. It does not know whether a bank is enabled on a given TPM: the daemon does.

use std::fmt;
use std::str::FromStr;

use tpm_vault_proto::v1 as proto;

use crate::Error;

/// PCR banks the API accepts, with their digest sizes.
const BANKS: &[(&str, usize)] = &[("sha1", 20), ("sha256", 32), ("sha384", 48)];

/// The bank used when a selection names none (`9,10`), as in the API.
const DEFAULT_BANK: &str = "sha256";

/// Highest PCR index of a PC-client TPM.
const MAX_PCR: u32 = 23;

/// A key's binding to PCR values (TPM2_PolicyPCR).
///
/// Parse it from text or build it with [`PcrBinding::current`] / [`PcrBinding::expected`]:
///
/// ```
/// use tpm_vault_client::PcrBinding;
///
/// let at_creation: PcrBinding = "sha256:9,10".parse()?;
/// assert_eq!(at_creation.pcrs(), &[9, 10]);
/// assert!(at_creation.values().is_empty());
///
/// let future: PcrBinding = format!("sha256:9={}", "ab".repeat(32)).parse()?;
/// assert_eq!(future.values()[0], vec![0xab; 32]);
/// # Ok::<(), tpm_vault_client::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PcrBinding {
    /// Bank name, `sha256` unless given; the daemon rejects banks the TPM lacks.
    bank: String,
    /// Indices in the order given, because `values` follow that order.
    pcrs: Vec<u32>,
    /// Expected values, one per index; empty means "the values at key creation".
    values: Vec<Vec<u8>>,
}

impl PcrBinding {
    /// A binding to the values the PCRs hold when the key is created.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an unknown bank, an index above 23, a repeated index or no
    /// index at all.
    pub fn current(bank: &str, pcrs: impl IntoIterator<Item = u32>) -> Result<PcrBinding, Error> {
        let binding = PcrBinding { bank: bank.to_owned(), pcrs: pcrs.into_iter().collect(), values: Vec::new() };
        binding.check()?;
        Ok(binding)
    }

    /// A binding to given (possibly future) PCR values.
    ///
    /// # Errors
    /// As [`PcrBinding::current`], and when a value's length is not the bank's digest size.
    pub fn expected(bank: &str, values: impl IntoIterator<Item = (u32, Vec<u8>)>) -> Result<PcrBinding, Error> {
        let (pcrs, values) = values.into_iter().unzip();
        let binding = PcrBinding { bank: bank.to_owned(), pcrs, values };
        binding.check()?;
        Ok(binding)
    }

    /// The PCR bank, e.g. `"sha256"`.
    pub fn bank(&self) -> &str {
        &self.bank
    }

    /// The PCR indices.
    pub fn pcrs(&self) -> &[u32] {
        &self.pcrs
    }

    /// The expected values, one per index; empty when bound to the values at creation.
    pub fn values(&self) -> &[Vec<u8>] {
        &self.values
    }

    /// Converts a binding reported by the daemon, without judging it.
    pub(crate) fn from_proto(binding: proto::PcrBinding) -> PcrBinding {
        let bank = if binding.bank.is_empty() { DEFAULT_BANK.to_owned() } else { binding.bank };
        PcrBinding { bank, pcrs: binding.pcrs, values: binding.values }
    }

    /// The API form of this binding.
    pub(crate) fn to_proto(&self) -> proto::PcrBinding {
        proto::PcrBinding { bank: self.bank.clone(), pcrs: self.pcrs.clone(), values: self.values.clone() }
    }

    fn check(&self) -> Result<(), Error> {
        let digest_len = BANKS.iter().find(|(name, _)| *name == self.bank).map(|(_, len)| *len).ok_or_else(|| {
            let names: Vec<&str> = BANKS.iter().map(|(name, _)| *name).collect();
            invalid(format!("unknown PCR bank {:?} (expected one of: {})", self.bank, names.join(", ")))
        })?;
        if self.pcrs.is_empty() {
            return Err(invalid("no PCR index given".to_owned()));
        }
        for (at, &pcr) in self.pcrs.iter().enumerate() {
            if pcr > MAX_PCR {
                return Err(invalid(format!("PCR index {pcr} is out of range (0-{MAX_PCR})")));
            }
            if self.pcrs[..at].contains(&pcr) {
                return Err(invalid(format!("PCR {pcr} is given twice")));
            }
        }
        if !self.values.is_empty() {
            if self.values.len() != self.pcrs.len() {
                return Err(invalid("give a value for every PCR or for none".to_owned()));
            }
            for (pcr, value) in self.pcrs.iter().zip(&self.values) {
                if value.len() != digest_len {
                    return Err(invalid(format!(
                        "value of PCR {pcr} has {} bytes, but {} digests have {digest_len}",
                        value.len(),
                        self.bank
                    )));
                }
            }
        }
        Ok(())
    }
}

impl FromStr for PcrBinding {
    type Err = Error;

    /// Parses `BANK:IDX[,IDX...]` or `BANK:IDX=HEX[,IDX=HEX...]`; the bank defaults to `sha256`.
    fn from_str(text: &str) -> Result<PcrBinding, Error> {
        parse_selection(text).map_err(|e| match e {
            Error::InvalidInput(why) => Error::InvalidInput(format!("invalid PCR selection {text:?}: {why}")),
            other => other,
        })
    }
}

/// [`PcrBinding::from_str`] without the "invalid PCR selection" context, for callers (like
/// clap) that add their own.
pub fn parse_selection(text: &str) -> Result<PcrBinding, Error> {
    let (bank, list) = match text.split_once(':') {
        Some((bank, list)) => (bank.trim(), list),
        None => (DEFAULT_BANK, text),
    };
    let mut pcrs = Vec::new();
    let mut values = Vec::new();
    for item in list.split(',') {
        let item = item.trim();
        let (index, value) = match item.split_once('=') {
            Some((index, value)) => (index.trim(), Some(value.trim())),
            None => (item, None),
        };
        let pcr = index.parse::<u32>().map_err(|_| {
            invalid(if index.is_empty() {
                "empty PCR index".to_owned()
            } else {
                format!("{index:?} is not a PCR index (0-{MAX_PCR})")
            })
        })?;
        pcrs.push(pcr);
        if let Some(value) = value {
            let digits = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")).unwrap_or(value);
            let bytes = hex::decode(digits).map_err(|e| invalid(format!("value of PCR {pcr} is not hex: {e}")))?;
            values.push(bytes);
        }
    }
    if !values.is_empty() && values.len() != pcrs.len() {
        return Err(invalid("give a value for every PCR or for none".to_owned()));
    }
    let binding = PcrBinding { bank: bank.to_owned(), pcrs, values };
    binding.check()?;
    Ok(binding)
}

impl fmt::Display for PcrBinding {
    /// The text form, which [`FromStr`] parses back: `sha256:9,10` or `sha256:9=HEX`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.bank)?;
        for (at, pcr) in self.pcrs.iter().enumerate() {
            if at > 0 {
                f.write_str(",")?;
            }
            write!(f, "{pcr}")?;
            if let Some(value) = self.values.get(at) {
                write!(f, "={}", hex::encode(value))?;
            }
        }
        Ok(())
    }
}

fn invalid(why: String) -> Error {
    Error::InvalidInput(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PcrBinding, String> {
        text.parse::<PcrBinding>().map_err(|e| e.to_string())
    }

    #[test]
    fn parses_indices() {
        let b = parse("sha256:9").unwrap();
        assert_eq!((b.bank(), b.pcrs()), ("sha256", &[9][..]));
        assert!(b.values().is_empty());
        let b = parse("sha384:0, 7 ,23").unwrap();
        assert_eq!((b.bank(), b.pcrs()), ("sha384", &[0, 7, 23][..]));
        let b = parse("sha1:4").unwrap();
        assert_eq!(b.bank(), "sha1");
    }

    #[test]
    fn bank_defaults_to_sha256() {
        let b = parse("9,10").unwrap();
        assert_eq!((b.bank(), b.pcrs()), ("sha256", &[9, 10][..]));
    }

    #[test]
    fn parses_values() {
        let v9 = "00".repeat(32);
        let v10 = format!("0x{}", "Ff".repeat(32));
        let b = parse(&format!("sha256:9={v9},10={v10}")).unwrap();
        assert_eq!(b.pcrs(), &[9, 10]);
        assert_eq!(b.values(), &[vec![0; 32], vec![0xff; 32]]);
        let b = parse(&format!("sha1:1={}", "12".repeat(20))).unwrap();
        assert_eq!(b.values()[0].len(), 20);
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "sha256:9".to_owned(),
            "sha384:0,1,2".to_owned(),
            format!("sha256:9={},3={}", "ab".repeat(32), "cd".repeat(32)),
        ] {
            let b = parse(&text).unwrap();
            assert_eq!(b.to_string(), text);
            assert_eq!(parse(&b.to_string()).unwrap(), b);
        }
    }

    #[test]
    fn rejects_bad_selections() {
        let cases = [
            ("md5:9", "unknown PCR bank \"md5\""),
            ("sha256:", "empty PCR index"),
            ("sha256", "\"sha256\" is not a PCR index"),
            ("sha256:24", "PCR index 24 is out of range (0-23)"),
            ("sha256:-1", "\"-1\" is not a PCR index"),
            ("sha256:9,9", "PCR 9 is given twice"),
            ("sha256:9,", "empty PCR index"),
            ("sha256:x", "\"x\" is not a PCR index"),
            ("sha256:9=zz", "value of PCR 9 is not hex"),
            ("sha256:9=abcd", "value of PCR 9 has 2 bytes, but sha256 digests have 32"),
        ];
        for (text, expected) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.starts_with(&format!("invalid PCR selection {text:?}: ")), "{text}: {err}");
            assert!(err.contains(expected), "{text}: {err}");
        }
        let mixed = format!("sha256:9={},10", "00".repeat(32));
        assert!(parse(&mixed).unwrap_err().contains("give a value for every PCR or for none"));
    }

    #[test]
    fn constructors_check_input() {
        assert!(PcrBinding::current("sha256", [9]).is_ok());
        assert!(PcrBinding::current("sha256", []).is_err());
        assert!(PcrBinding::current("sha512", [9]).is_err());
        assert!(PcrBinding::expected("sha256", [(9, vec![0; 32])]).is_ok());
        assert!(PcrBinding::expected("sha256", [(9, vec![0; 20])]).is_err());
    }

    #[test]
    fn proto_round_trip() {
        let b = parse("sha256:9,10").unwrap();
        assert_eq!(PcrBinding::from_proto(b.to_proto()), b);
        let empty_bank = proto::PcrBinding { bank: String::new(), pcrs: vec![9], values: vec![] };
        assert_eq!(PcrBinding::from_proto(empty_bank).bank(), "sha256");
    }
}
