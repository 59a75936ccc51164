//! The in-core quote verifier: what `tpm2_checkquote` checks, with a specific error for each
//! way a quote can fail.
//!
//! Owns the parsers of the TPM structures involved (TPMS_ATTEST with TPMS_QUOTE_INFO,
//! TPMT_SIGNATURE, TPML_PCR_SELECTION; TPM 2.0 Part 2, big-endian) and the order of the checks:
//! the signature first (nothing in an unsigned structure is trusted), then the header, the
//! nonce, the PCR selection, the PCR digest and finally the values the caller expects. The
//! parsers never panic and never allocate more than their input's size: every length is
//! checked against the bytes that are actually there.
//!
//! It does not decide whether the attestation key is trustworthy (that is the caller's
//! business: compare it with the key enrolled for the device, or use credential activation).

use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;
use sha2::{Digest, Sha256};

use super::Quote;
use crate::eventlog::{Culprit, EventLog, EventLogError, HashAlg, PcrCheck};
use crate::PcrBinding;

/// TPM_GENERATED_VALUE: the TPM puts it first in every structure it signs.
const TPM_GENERATED_VALUE: u32 = 0xff54_4347;
/// TPM_ST_ATTEST_QUOTE.
const TPM_ST_ATTEST_QUOTE: u16 = 0x8018;
/// TPM_ALG_ECDSA.
const TPM_ALG_ECDSA: u16 = 0x0018;
/// TPM_ALG_SHA256.
const TPM_ALG_SHA256: u16 = 0x000b;
/// HASH_COUNT bound of a TPML_PCR_SELECTION (tpm2-tss TPM2_NUM_PCR_BANKS).
const MAX_PCR_BANKS: u32 = 16;
/// PCR_SELECT_MAX: bitmap bytes of a TPMS_PCR_SELECTION (32 PCRs).
const MAX_SELECT_BYTES: u8 = 4;
/// Size of an ECC P-256 scalar.
const P256_SCALAR: usize = 32;

/// Why a TPM structure (or a file holding one) could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The input ends before the structure does.
    #[error("{what} is truncated: {needed} bytes needed at offset {offset}, {available} left")]
    Truncated {
        /// The structure or field being read.
        what: &'static str,
        /// Where it starts.
        offset: usize,
        /// Bytes it needs.
        needed: usize,
        /// Bytes there are.
        available: usize,
    },
    /// Bytes follow the end of the structure.
    #[error("{what} has {count} unexpected trailing bytes")]
    TrailingBytes {
        /// The structure.
        what: &'static str,
        /// How many bytes follow it.
        count: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("{what}: {field} is {value:#x}, expected {expected}")]
    BadField {
        /// The structure.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What would have been valid.
        expected: &'static str,
    },
    /// The input is not what it should be, for a reason that is not about one field.
    #[error("{what}: {reason}")]
    Invalid {
        /// The structure or file.
        what: &'static str,
        /// Why.
        reason: &'static str,
    },
}

/// Why a quote was rejected. Each check has its own variant, so a verifier (or a person) knows
/// exactly what failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuoteError {
    /// A structure (TPMS_ATTEST, TPMT_SIGNATURE, the AK public key, a file) does not parse.
    #[error("malformed quote: {0}")]
    Malformed(#[from] ParseError),
    /// The signature is not ECDSA with SHA-256, the only scheme of the vault's AK.
    #[error("unsupported signature: algorithm {sig_alg:#06x} with hash {hash:#06x} (expected ECDSA 0x0018 with SHA-256 0x000b)")]
    UnsupportedSignature {
        /// TPMT_SIGNATURE sigAlg.
        sig_alg: u16,
        /// The signature's hash algorithm.
        hash: u16,
    },
    /// The signature does not verify with the attestation key: the quote was altered, or made
    /// by another key.
    #[error("bad signature: the quote was not signed by this attestation key, or it was altered")]
    BadSignature,
    /// The signed structure is not a TPM-generated quote (wrong magic or attestation type).
    #[error("not a quote: magic {magic:#010x} and type {kind:#06x} (expected {TPM_GENERATED_VALUE:#010x} and {TPM_ST_ATTEST_QUOTE:#06x})")]
    NotAQuote {
        /// TPMS_ATTEST magic.
        magic: u32,
        /// TPMS_ATTEST type.
        kind: u16,
    },
    /// The quote was made over another nonce: it may be a replay.
    #[error("wrong nonce: the quote is over {}, expected {}", hex::encode(.actual), hex::encode(.expected))]
    WrongNonce {
        /// The nonce the verifier sent.
        expected: Vec<u8>,
        /// The quote's extraData.
        actual: Vec<u8>,
    },
    /// The PCRs the quote covers are not the ones whose values were given.
    #[error("PCR selection mismatch: the quote covers {quoted}, the values given are for {given}")]
    SelectionMismatch {
        /// What the signed quote selects, e.g. `sha256:0,1,2`.
        quoted: String,
        /// What the PCR values are for.
        given: String,
    },
    /// The PCR values given do not hash to the quote's PCR digest: they are not the values the
    /// TPM quoted.
    #[error("PCR digest mismatch: the quoted digest is {}, the PCR values hash to {}", hex::encode(.quoted), hex::encode(.computed))]
    PcrDigestMismatch {
        /// pcrDigest from the signed quote.
        quoted: Vec<u8>,
        /// SHA-256 of the given values.
        computed: Vec<u8>,
    },
    /// A quoted PCR does not hold the value the verifier expects.
    #[error("PCR {bank}:{pcr} is {}, expected {}", hex::encode(.actual), hex::encode(.expected))]
    PcrValueMismatch {
        /// Bank.
        bank: String,
        /// Index.
        pcr: u32,
        /// The expected value.
        expected: Vec<u8>,
        /// The quoted value.
        actual: Vec<u8>,
    },
    /// A PCR the verifier has an expectation for is not in the quote.
    #[error("PCR {bank}:{pcr} is not in the quote")]
    PcrNotQuoted {
        /// Bank.
        bank: String,
        /// Index.
        pcr: u32,
    },
    /// The event log given with the quote does not parse.
    #[error("event log: {0}")]
    EventLogMalformed(#[from] EventLogError),
    /// The event log has no digests for the quoted bank.
    #[error("the event log has no {bank} digests (its banks: {banks})")]
    EventLogBank {
        /// The quoted bank.
        bank: String,
        /// The log's banks.
        banks: String,
    },
    /// A quoted PCR is not what the event log replays to, or an event behind it does not say
    /// what was measured.
    #[error("event log does not explain PCR {bank}:{pcr}: {culprit}")]
    EventLogMismatch {
        /// Bank.
        bank: String,
        /// Index.
        pcr: u32,
        /// The first event to blame.
        culprit: Culprit,
    },
}

impl QuoteError {
    /// A short stable name of the failure, for programs: `bad_signature`, `wrong_nonce`, ...
    pub fn reason(&self) -> &'static str {
        match self {
            QuoteError::Malformed(_) => "malformed",
            QuoteError::UnsupportedSignature { .. } => "unsupported_signature",
            QuoteError::BadSignature => "bad_signature",
            QuoteError::NotAQuote { .. } => "not_a_quote",
            QuoteError::WrongNonce { .. } => "wrong_nonce",
            QuoteError::SelectionMismatch { .. } => "selection_mismatch",
            QuoteError::PcrDigestMismatch { .. } => "pcr_digest_mismatch",
            QuoteError::PcrValueMismatch { .. } => "pcr_value_mismatch",
            QuoteError::PcrNotQuoted { .. } => "pcr_not_quoted",
            QuoteError::EventLogMalformed(_) => "eventlog_malformed",
            QuoteError::EventLogBank { .. } => "eventlog_bank",
            QuoteError::EventLogMismatch { .. } => "eventlog_mismatch",
        }
    }
}

/// What a verified quote says, beyond the PCR values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuoteInfo {
    /// qualifiedSigner: the AK's qualified name.
    pub signer: Vec<u8>,
    /// extraData: the verifier's nonce.
    pub nonce: Vec<u8>,
    /// TPM clock, milliseconds (advances while the TPM is powered).
    pub clock: u64,
    /// TPM resets (reboots) since the last TPM2_Clear.
    pub reset_count: u32,
    /// TPM restarts (resume from hibernation) since the last reset.
    pub restart_count: u32,
    /// True if the clock was not rolled back since it was last set.
    pub safe: bool,
    /// TPM firmware version.
    pub firmware_version: u64,
    /// The PCR digest the TPM signed.
    pub pcr_digest: Vec<u8>,
}

impl Quote {
    /// Checks the quote: the AK's signature, that it is a TPM-generated quote, the nonce, that
    /// the PCR values are those the TPM quoted, and that each PCR named in `expected` holds the
    /// value given there (bindings without values are ignored).
    ///
    /// This is what `tpm2_checkquote -u AK -m quote.msg -s quote.sig -f quote.pcrs -q NONCE`
    /// checks. It does not say whether the AK belongs to the device you think: check
    /// `ak_public_der` against the key you enrolled.
    ///
    /// # Errors
    /// The first check that fails, as a [`QuoteError`] naming it.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{BlockingClient, PcrBinding};
    ///
    /// let client = BlockingClient::connect("/run/tpm-vault/vault.sock")?;
    /// let nonce = b"verifier nonce".to_vec();
    /// let quote = client.quote(&"sha256:0,7,9".parse()?, &nonce)?;
    /// let expected: PcrBinding = format!("sha256:9={}", "00".repeat(32)).parse()?;
    /// match quote.verify(&nonce, &[expected]) {
    ///     Ok(info) => println!("quote OK, TPM clock {}", info.clock),
    ///     Err(e) => println!("rejected: {e}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verify(&self, nonce: &[u8], expected: &[PcrBinding]) -> Result<QuoteInfo, QuoteError> {
        let key = VerifyingKey::from_public_key_der(&self.ak_public_der).map_err(|_| ParseError::Invalid {
            what: "attestation key",
            reason: "not an ECC P-256 SubjectPublicKeyInfo",
        })?;
        let signature = parse_signature(&self.signature)?;
        key.verify(&self.attest, &signature).map_err(|_| QuoteError::BadSignature)?;
        let attest = parse_attest(&self.attest)?;
        if attest.nonce != nonce {
            return Err(QuoteError::WrongNonce { expected: nonce.to_vec(), actual: attest.nonce });
        }
        check_selection(&attest.selection, &self.pcrs.bank, &self.pcrs.pcrs)?;
        if self.pcrs.values.len() != self.pcrs.pcrs.len() {
            return Err(ParseError::Invalid { what: "PCR values", reason: "not one value per PCR" }.into());
        }
        let computed = self.pcrs.values.iter().fold(Sha256::new(), |h, v| h.chain_update(v)).finalize().to_vec();
        if computed != attest.pcr_digest {
            return Err(QuoteError::PcrDigestMismatch { quoted: attest.pcr_digest, computed });
        }
        for binding in expected {
            for (pcr, value) in binding.pcrs().iter().zip(binding.values()) {
                let actual = if binding.bank() == self.pcrs.bank { self.pcrs.value(*pcr) } else { None };
                let Some(actual) = actual else {
                    return Err(QuoteError::PcrNotQuoted { bank: binding.bank().to_owned(), pcr: *pcr });
                };
                if actual != value.as_slice() {
                    return Err(QuoteError::PcrValueMismatch {
                        bank: binding.bank().to_owned(),
                        pcr: *pcr,
                        expected: value.clone(),
                        actual: actual.to_vec(),
                    });
                }
            }
        }
        Ok(QuoteInfo {
            signer: attest.signer,
            nonce: attest.nonce,
            clock: attest.clock,
            reset_count: attest.reset_count,
            restart_count: attest.restart_count,
            safe: attest.safe,
            firmware_version: attest.firmware_version,
            pcr_digest: attest.pcr_digest,
        })
    }
}

impl Quote {
    /// Checks that `log` explains the quoted PCR values: each replays to the quoted value and
    /// no event behind it has a digest that is not the hash of its data. Call it after
    /// [`Quote::verify`] (which proves the values are the TPM's); it returns every quoted
    /// PCR's check, for printing the events behind them.
    ///
    /// # Errors
    /// [`QuoteError::EventLogBank`] if the log has no digests of the quoted bank,
    /// [`QuoteError::EventLogMismatch`] naming the first PCR and event that break.
    pub fn check_event_log(&self, log: &EventLog) -> Result<Vec<PcrCheck>, QuoteError> {
        let bank_error = || QuoteError::EventLogBank { bank: self.pcrs.bank.clone(), banks: join_banks(&log.banks()) };
        let alg = HashAlg::from_name(&self.pcrs.bank).ok_or_else(bank_error)?;
        if !log.banks().contains(&alg) {
            return Err(bank_error());
        }
        let values: Vec<(u32, Vec<u8>)> = self.pcrs.iter().map(|(pcr, value)| (pcr, value.to_vec())).collect();
        let checks = log.check(alg, &values);
        if let Some(bad) = checks.iter().find(|c| !c.ok()) {
            if let Some(culprit) = &bad.culprit {
                return Err(QuoteError::EventLogMismatch {
                    bank: self.pcrs.bank.clone(),
                    pcr: bad.pcr,
                    culprit: culprit.clone(),
                });
            }
        }
        Ok(checks)
    }
}

/// `sha1, sha256`.
fn join_banks(banks: &[HashAlg]) -> String {
    banks.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
}

/// A parsed TPMS_ATTEST of type quote.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Attest {
    pub(crate) signer: Vec<u8>,
    pub(crate) nonce: Vec<u8>,
    pub(crate) clock: u64,
    pub(crate) reset_count: u32,
    pub(crate) restart_count: u32,
    pub(crate) safe: bool,
    pub(crate) firmware_version: u64,
    /// `(hashAlg, ascending indices)` per TPMS_PCR_SELECTION, in order.
    pub(crate) selection: Vec<(u16, Vec<u32>)>,
    pub(crate) pcr_digest: Vec<u8>,
}

/// Parses a marshalled TPMS_ATTEST that must be a quote.
pub(crate) fn parse_attest(bytes: &[u8]) -> Result<Attest, QuoteError> {
    let mut r = Reader::new(bytes, "TPMS_ATTEST");
    let magic = r.u32()?;
    let kind = r.u16()?;
    if magic != TPM_GENERATED_VALUE || kind != TPM_ST_ATTEST_QUOTE {
        return Err(QuoteError::NotAQuote { magic, kind });
    }
    let signer = r.tpm2b("qualifiedSigner")?.to_vec();
    let nonce = r.tpm2b("extraData")?.to_vec();
    let clock = r.u64()?;
    let reset_count = r.u32()?;
    let restart_count = r.u32()?;
    let safe = match r.u8()? {
        0 => false,
        1 => true,
        other => {
            return Err(ParseError::BadField {
                what: "TPMS_CLOCK_INFO",
                field: "safe",
                value: other.into(),
                expected: "0 or 1",
            }
            .into())
        }
    };
    let firmware_version = r.u64()?;
    let selection = read_pcr_selection(&mut r)?;
    let pcr_digest = r.tpm2b("pcrDigest")?.to_vec();
    r.finish()?;
    Ok(Attest { signer, nonce, clock, reset_count, restart_count, safe, firmware_version, selection, pcr_digest })
}

/// Parses a marshalled TPMT_SIGNATURE that must be ECDSA with SHA-256 over P-256.
pub(crate) fn parse_signature(bytes: &[u8]) -> Result<Signature, QuoteError> {
    let mut r = Reader::new(bytes, "TPMT_SIGNATURE");
    let sig_alg = r.u16()?;
    let hash = r.u16()?;
    if sig_alg != TPM_ALG_ECDSA || hash != TPM_ALG_SHA256 {
        return Err(QuoteError::UnsupportedSignature { sig_alg, hash });
    }
    let sig_r = scalar(r.tpm2b("signatureR")?, "signatureR")?;
    let sig_s = scalar(r.tpm2b("signatureS")?, "signatureS")?;
    r.finish()?;
    Signature::from_scalars(sig_r, sig_s).map_err(|_| {
        ParseError::Invalid { what: "TPMT_SIGNATURE", reason: "r or s is zero or not below the order" }.into()
    })
}

/// A big-endian ECC parameter left-padded to 32 bytes (the TPM strips leading zeros).
fn scalar(bytes: &[u8], field: &'static str) -> Result<[u8; P256_SCALAR], ParseError> {
    let digits = {
        let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
        &bytes[first..]
    };
    if digits.len() > P256_SCALAR {
        return Err(ParseError::BadField {
            what: "TPMT_SIGNATURE",
            field,
            value: bytes.len() as u64,
            expected: "at most 32 significant bytes",
        });
    }
    let mut out = [0u8; P256_SCALAR];
    out[P256_SCALAR - digits.len()..].copy_from_slice(digits);
    Ok(out)
}

/// Reads a big-endian TPML_PCR_SELECTION into `(hashAlg, ascending indices)` per bank.
fn read_pcr_selection(r: &mut Reader<'_>) -> Result<Vec<(u16, Vec<u32>)>, ParseError> {
    let count = r.u32()?;
    if count > MAX_PCR_BANKS {
        return Err(ParseError::BadField {
            what: "TPML_PCR_SELECTION",
            field: "count",
            value: count.into(),
            expected: "at most 16",
        });
    }
    let mut banks = Vec::new();
    for _ in 0..count {
        let hash = r.u16()?;
        let size = r.u8()?;
        if size > MAX_SELECT_BYTES {
            return Err(ParseError::BadField {
                what: "TPMS_PCR_SELECTION",
                field: "sizeofSelect",
                value: size.into(),
                expected: "at most 4",
            });
        }
        let bitmap = r.take(usize::from(size), "pcrSelect")?;
        banks.push((hash, bitmap_indices(bitmap)));
    }
    Ok(banks)
}

/// The PCR indices set in a pcrSelect bitmap, ascending (bit n of byte n/8 is PCR n).
pub(crate) fn bitmap_indices(bitmap: &[u8]) -> Vec<u32> {
    let mut pcrs = Vec::new();
    for (byte, bits) in (0u32..).zip(bitmap) {
        for bit in 0..8 {
            if bits & (1 << bit) != 0 {
                pcrs.push(byte * 8 + bit);
            }
        }
    }
    pcrs
}

/// TPM_ALG_ID of a PCR bank name.
pub(crate) fn bank_alg(bank: &str) -> Option<u16> {
    match bank {
        "sha1" => Some(0x0004),
        "sha256" => Some(0x000b),
        "sha384" => Some(0x000c),
        "sha512" => Some(0x000d),
        _ => None,
    }
}

/// PCR bank name of a TPM_ALG_ID, and its digest size.
pub(crate) fn alg_bank(alg: u16) -> Option<(&'static str, usize)> {
    match alg {
        0x0004 => Some(("sha1", 20)),
        0x000b => Some(("sha256", 32)),
        0x000c => Some(("sha384", 48)),
        0x000d => Some(("sha512", 64)),
        _ => None,
    }
}

/// The signed selection must be exactly one bank, the values' bank, with the same PCRs in the
/// same (ascending) order: the digest is over the values in that order.
fn check_selection(quoted: &[(u16, Vec<u32>)], bank: &str, pcrs: &[u32]) -> Result<(), QuoteError> {
    let same = match (quoted, bank_alg(bank)) {
        ([(alg, indices)], Some(given)) => *alg == given && indices.as_slice() == pcrs,
        _ => false,
    };
    if same {
        return Ok(());
    }
    let describe = |alg: u16, indices: &[u32]| {
        let name = alg_bank(alg).map_or_else(|| format!("alg {alg:#06x}"), |(name, _)| name.to_owned());
        let list: Vec<String> = indices.iter().map(u32::to_string).collect();
        format!("{name}:{}", list.join(","))
    };
    let quoted: Vec<String> = quoted.iter().map(|(alg, indices)| describe(*alg, indices)).collect();
    let list: Vec<String> = pcrs.iter().map(u32::to_string).collect();
    Err(QuoteError::SelectionMismatch {
        quoted: if quoted.is_empty() { "no PCRs".to_owned() } else { quoted.join(" + ") },
        given: format!("{bank}:{}", list.join(",")),
    })
}

/// A bounds-checked cursor over a byte string; big-endian by default (TPM marshalling).
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { bytes, at: 0, what }
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], ParseError> {
        let available = self.bytes.len() - self.at;
        if n > available {
            return Err(ParseError::Truncated { what: field, offset: self.at, needed: n, available });
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ParseError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, self.what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ParseError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, ParseError> {
        self.array().map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, ParseError> {
        self.array().map(u32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, ParseError> {
        self.array().map(u64::from_be_bytes)
    }

    pub(crate) fn u16_le(&mut self) -> Result<u16, ParseError> {
        self.array().map(u16::from_le_bytes)
    }

    pub(crate) fn u32_le(&mut self) -> Result<u32, ParseError> {
        self.array().map(u32::from_le_bytes)
    }

    /// A TPM2B: big-endian u16 size, then that many bytes.
    pub(crate) fn tpm2b(&mut self, field: &'static str) -> Result<&'a [u8], ParseError> {
        let size = self.u16()?;
        self.take(usize::from(size), field)
    }

    /// The bytes read so far.
    pub(crate) fn consumed(&self) -> &'a [u8] {
        &self.bytes[..self.at]
    }

    /// Fails if any input is left.
    pub(crate) fn finish(&self) -> Result<(), ParseError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            count => Err(ParseError::TrailingBytes { what: self.what, count }),
        }
    }
}
