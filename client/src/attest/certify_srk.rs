//! The offline check of an SRK certification (`tpm-vault verify-srk`): that a trusted
//! attestation key certified, over the verifier's nonce, the very storage key whose public area
//! came with it, so that `seal-for` seals for a key that lives in the AK's TPM.
//!
//! Owns the TPMS_ATTEST parser for TPM_ST_ATTEST_CERTIFY (TPMS_CERTIFY_INFO) and the order of
//! the checks: the signature first (nothing in an unsigned structure is trusted), then the
//! header, the nonce, the certified name against the name of the public area given, and last
//! whether that public area is a storage key `seal-for` can seal for. It does not decide whether
//! the AK is the device's (the caller passes the key it enrolled) and it touches no file.

use p256::ecdsa::signature::Verifier;
use p256::ecdsa::VerifyingKey;
use p256::pkcs8::{DecodePublicKey, EncodePublicKey};
use sha2::{Digest, Sha256, Sha384, Sha512};
use tpm_vault_proto::sealed_blob::StorageKey;

use super::verify::{parse_signature, Reader};
use super::{public_key_pem, ParseError, QuoteError};
use crate::seal_for::{SrkCertification, SrkPublic};

/// TPM_GENERATED_VALUE: the TPM puts it first in every structure it signs.
const TPM_GENERATED_VALUE: u32 = 0xff54_4347;
/// TPM_ST_ATTEST_CERTIFY.
const TPM_ST_ATTEST_CERTIFY: u16 = 0x8017;
/// TPM_ALG_RSASSA.
const TPM_ALG_RSASSA: u16 = 0x0014;
/// TPM_ALG_SHA256.
const TPM_ALG_SHA256: u16 = 0x000b;

/// Why an SRK certification was rejected. Each check has its own variant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SrkCertError {
    /// A structure (TPMS_ATTEST, TPMT_SIGNATURE, the AK public key, the SRK's TPM2B_PUBLIC)
    /// does not parse.
    #[error("malformed certification: {0}")]
    Malformed(ParseError),
    /// The signature is not one of the vault's AKs make: ECDSA (ECC AK) or RSASSA (RSA AK),
    /// with SHA-256.
    #[error("unsupported signature: algorithm {sig_alg:#06x} with hash {hash:#06x} (expected ECDSA 0x0018 from an ECC P-256 AK or RSASSA 0x0014 from an RSA AK, with SHA-256 0x000b)")]
    UnsupportedSignature {
        /// TPMT_SIGNATURE sigAlg.
        sig_alg: u16,
        /// The signature's hash algorithm.
        hash: u16,
    },
    /// The signature does not verify with the attestation key: the certification was altered,
    /// or made by another key (another TPM's AK).
    #[error("bad signature: the certification was not signed by this attestation key, or it was altered")]
    BadSignature,
    /// The signed structure is not a TPM-generated TPM2_Certify (wrong magic or type).
    #[error("not a TPM2_Certify attestation: magic {magic:#010x} and type {kind:#06x} (expected {TPM_GENERATED_VALUE:#010x} and {TPM_ST_ATTEST_CERTIFY:#06x})")]
    NotACertification {
        /// TPMS_ATTEST magic.
        magic: u32,
        /// TPMS_ATTEST type.
        kind: u16,
    },
    /// The certification was made over another nonce: it may be a replay.
    #[error("wrong nonce: the certification is over {}, expected {}", hex::encode(.actual), hex::encode(.expected))]
    WrongNonce {
        /// The nonce the verifier sent.
        expected: Vec<u8>,
        /// The attestation's extraData.
        actual: Vec<u8>,
    },
    /// The key the AK certified is not the one whose public area came with it (e.g. another
    /// TPM's SRK was put in its place).
    #[error("the SRK public is not the certified key: the AK certified name {}, the SRK public's name is {}", hex::encode(.certified), hex::encode(.computed))]
    NameMismatch {
        /// The name in the signed TPMS_CERTIFY_INFO.
        certified: Vec<u8>,
        /// nameAlg || H(TPMT_PUBLIC) of the public area given.
        computed: Vec<u8>,
    },
    /// The certified key is not a storage key `seal-for` can seal for.
    #[error("the certified key is not a storage key seal-for can use: {0}")]
    NotAStorageKey(String),
}

impl SrkCertError {
    /// A short stable name of the failure, for programs: `bad_signature`, `wrong_nonce`, ...
    pub fn reason(&self) -> &'static str {
        match self {
            SrkCertError::Malformed(_) => "malformed",
            SrkCertError::UnsupportedSignature { .. } => "unsupported_signature",
            SrkCertError::BadSignature => "bad_signature",
            SrkCertError::NotACertification { .. } => "not_a_certification",
            SrkCertError::WrongNonce { .. } => "wrong_nonce",
            SrkCertError::NameMismatch { .. } => "name_mismatch",
            SrkCertError::NotAStorageKey(_) => "not_a_storage_key",
        }
    }
}

impl From<ParseError> for SrkCertError {
    fn from(e: ParseError) -> Self {
        SrkCertError::Malformed(e)
    }
}

/// What a verified SRK certification says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertifiedSrk {
    /// The certified storage key: its TPM2B_PUBLIC, SubjectPublicKeyInfo and name.
    pub srk: SrkPublic,
    /// qualifiedSigner: the AK's qualified name.
    pub signer: Vec<u8>,
    /// extraData: the verifier's nonce.
    pub nonce: Vec<u8>,
    /// TPM clock, milliseconds.
    pub clock: u64,
    /// TPM resets since the last TPM2_Clear.
    pub reset_count: u32,
    /// TPM restarts since the last reset.
    pub restart_count: u32,
    /// TPM firmware version.
    pub firmware_version: u64,
}

impl SrkCertification {
    /// Checks that the attestation key `ak_public_der` (ECC P-256, or RSA as a Keylime
    /// registrar holds it) signed a TPM2_Certify over `nonce` of
    /// the key whose public area is `srk_tpm2b_public`, and that this key is a storage key
    /// `seal-for` can seal for. Offline: no daemon, no TPM.
    ///
    /// It does not say whether the AK is the device's: set `ak_public_der` to the key you
    /// enrolled for it (or that Keylime attested), not one that came with the certification.
    ///
    /// # Errors
    /// The first check that fails, as an [`SrkCertError`] naming it.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::Client;
    ///
    /// # async fn demo(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let nonce = b"fleet nonce 0001".to_vec();
    /// let mut cert = client.certify_srk(&nonce).await?;
    /// cert.ak_public_der = std::fs::read("device-1.ak.der")?; // the AK enrolled for the device
    /// let srk = cert.verify(&nonce)?.srk;
    /// std::fs::write("device-1.srk", &srk.tpm2b_public)?; // for seal-for --srk
    /// # Ok(()) }
    /// ```
    pub fn verify(&self, nonce: &[u8]) -> Result<CertifiedSrk, SrkCertError> {
        check_signature(&self.ak_public_der, &self.signature, &self.attest)?;
        let attest = parse_certify(&self.attest)?;
        if attest.nonce != nonce {
            return Err(SrkCertError::WrongNonce { expected: nonce.to_vec(), actual: attest.nonce });
        }
        let tpmt = tpmt_public(&self.srk_tpm2b_public)?;
        let computed = name_of(tpmt)?;
        if computed != attest.name {
            return Err(SrkCertError::NameMismatch { certified: attest.name, computed });
        }
        let storage = StorageKey::from_public(tpmt).map_err(|e| SrkCertError::NotAStorageKey(e.to_string()))?;
        let invalid = |reason| SrkCertError::NotAStorageKey(reason);
        let public_der = p256::PublicKey::from_sec1_bytes(&storage.point)
            .ok()
            .and_then(|k| k.to_public_key_der().ok())
            .ok_or_else(|| invalid("its point is not a P-256 public key".into()))?
            .as_bytes()
            .to_vec();
        let public_pem = public_key_pem(&public_der)?;
        let size = u16::try_from(tpmt.len()).map_err(|_| invalid("its public area is too large".into()))?;
        let mut tpm2b_public = size.to_be_bytes().to_vec();
        tpm2b_public.extend_from_slice(tpmt);
        Ok(CertifiedSrk {
            srk: SrkPublic { tpm2b_public, public_der, public_pem, name: computed },
            signer: attest.signer,
            nonce: attest.nonce,
            clock: attest.clock,
            reset_count: attest.reset_count,
            restart_count: attest.restart_count,
            firmware_version: attest.firmware_version,
        })
    }
}

/// Checks `signature` (a TPMT_SIGNATURE) over `attest` with the AK `ak_der`: ECDSA-SHA256 for
/// an ECC P-256 AK, RSASSA-PKCS1-v1_5-SHA256 for an RSA AK (the one a Keylime registrar holds).
fn check_signature(ak_der: &[u8], signature: &[u8], attest: &[u8]) -> Result<(), SrkCertError> {
    if let Ok(key) = VerifyingKey::from_public_key_der(ak_der) {
        let signature = parse_signature(signature).map_err(|e| match e {
            QuoteError::UnsupportedSignature { sig_alg, hash } => SrkCertError::UnsupportedSignature { sig_alg, hash },
            QuoteError::Malformed(p) => SrkCertError::Malformed(p),
            _ => SrkCertError::Malformed(ParseError::Invalid { what: "TPMT_SIGNATURE", reason: "does not parse" }),
        })?;
        return key.verify(attest, &signature).map_err(|_| SrkCertError::BadSignature);
    }
    let key = rsa::RsaPublicKey::from_public_key_der(ak_der).map_err(|_| ParseError::Invalid {
        what: "attestation key",
        reason: "neither an ECC P-256 nor an RSA SubjectPublicKeyInfo",
    })?;
    let mut r = Reader::new(signature, "TPMT_SIGNATURE");
    let sig_alg = r.u16()?;
    let hash = r.u16()?;
    if sig_alg != TPM_ALG_RSASSA || hash != TPM_ALG_SHA256 {
        return Err(SrkCertError::UnsupportedSignature { sig_alg, hash });
    }
    let sig = r.tpm2b("signature")?;
    r.finish()?;
    let sig = rsa::pkcs1v15::Signature::try_from(sig).map_err(|_| SrkCertError::BadSignature)?;
    rsa::pkcs1v15::VerifyingKey::<Sha256>::new(key).verify(attest, &sig).map_err(|_| SrkCertError::BadSignature)
}

/// A parsed TPMS_ATTEST of type certify.
struct Certify {
    signer: Vec<u8>,
    nonce: Vec<u8>,
    clock: u64,
    reset_count: u32,
    restart_count: u32,
    firmware_version: u64,
    /// TPMS_CERTIFY_INFO name: the certified object's name.
    name: Vec<u8>,
}

/// Parses a marshalled TPMS_ATTEST that must be a TPM2_Certify.
fn parse_certify(bytes: &[u8]) -> Result<Certify, SrkCertError> {
    let mut r = Reader::new(bytes, "TPMS_ATTEST");
    let magic = r.u32()?;
    let kind = r.u16()?;
    if magic != TPM_GENERATED_VALUE || kind != TPM_ST_ATTEST_CERTIFY {
        return Err(SrkCertError::NotACertification { magic, kind });
    }
    let signer = r.tpm2b("qualifiedSigner")?.to_vec();
    let nonce = r.tpm2b("extraData")?.to_vec();
    let clock = r.u64()?;
    let reset_count = r.u32()?;
    let restart_count = r.u32()?;
    let safe = r.u8()?;
    if safe > 1 {
        return Err(ParseError::BadField {
            what: "TPMS_CLOCK_INFO",
            field: "safe",
            value: safe.into(),
            expected: "0 or 1",
        }
        .into());
    }
    let firmware_version = r.u64()?;
    let name = r.tpm2b("name")?.to_vec();
    r.tpm2b("qualifiedName")?;
    r.finish()?;
    Ok(Certify { signer, nonce, clock, reset_count, restart_count, firmware_version, name })
}

/// The TPMT_PUBLIC inside a TPM2B_PUBLIC (a bare TPMT_PUBLIC is taken as it is).
fn tpmt_public(bytes: &[u8]) -> Result<&[u8], SrkCertError> {
    match bytes.split_first_chunk::<2>() {
        Some((size, rest)) if usize::from(u16::from_be_bytes(*size)) == rest.len() => Ok(rest),
        Some(_) if bytes.len() >= 4 => Ok(bytes),
        _ => Err(ParseError::Invalid { what: "SRK public", reason: "too short for a public area" }.into()),
    }
}

/// The TPM name of a TPMT_PUBLIC: nameAlg || H_nameAlg(TPMT_PUBLIC).
fn name_of(tpmt: &[u8]) -> Result<Vec<u8>, SrkCertError> {
    let alg = match tpmt {
        [_, _, a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => return Err(ParseError::Invalid { what: "SRK public", reason: "too short for a public area" }.into()),
    };
    let digest = match alg {
        0x000b => Sha256::digest(tpmt).to_vec(),
        0x000c => Sha384::digest(tpmt).to_vec(),
        0x000d => Sha512::digest(tpmt).to_vec(),
        other => {
            return Err(ParseError::BadField {
                what: "SRK public",
                field: "nameAlg",
                value: other.into(),
                expected: "SHA-256, SHA-384 or SHA-512",
            }
            .into())
        }
    };
    let mut name = alg.to_be_bytes().to_vec();
    name.extend_from_slice(&digest);
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TPMS_ATTEST of `kind` over `nonce` certifying `name`.
    fn attest(kind: u16, nonce: &[u8], name: &[u8]) -> Vec<u8> {
        let mut a = TPM_GENERATED_VALUE.to_be_bytes().to_vec();
        a.extend_from_slice(&kind.to_be_bytes());
        for field in [&b"signer"[..], nonce] {
            a.extend_from_slice(&(field.len() as u16).to_be_bytes());
            a.extend_from_slice(field);
        }
        a.extend_from_slice(&[0; 17]);
        a.extend_from_slice(&[0; 8]);
        for field in [name, &b"qualified"[..]] {
            a.extend_from_slice(&(field.len() as u16).to_be_bytes());
            a.extend_from_slice(field);
        }
        a
    }

    #[test]
    fn parses_a_certify_and_refuses_a_quote() {
        let c = parse_certify(&attest(TPM_ST_ATTEST_CERTIFY, b"n", b"\x00\x0bname")).unwrap();
        assert_eq!((c.nonce, c.name, c.signer), (b"n".to_vec(), b"\x00\x0bname".to_vec(), b"signer".to_vec()));
        assert!(matches!(
            parse_certify(&attest(0x8018, b"n", b"x")),
            Err(SrkCertError::NotACertification { kind: 0x8018, .. })
        ));
        let mut long = attest(TPM_ST_ATTEST_CERTIFY, b"n", b"x");
        long.push(0);
        assert!(matches!(parse_certify(&long), Err(SrkCertError::Malformed(ParseError::TrailingBytes { .. }))));
        let short = attest(TPM_ST_ATTEST_CERTIFY, b"n", b"x");
        assert!(matches!(parse_certify(&short[..short.len() - 1]), Err(SrkCertError::Malformed(_))));
    }

    #[test]
    fn names_follow_the_name_algorithm() {
        let tpmt = [0x00, 0x23, 0x00, 0x0c, 1, 2, 3];
        let name = name_of(&tpmt).unwrap();
        assert_eq!(&name[..2], &[0x00, 0x0c]);
        assert_eq!(name[2..], Sha384::digest(tpmt)[..]);
        assert!(name_of(&[0x00, 0x23, 0x00, 0x04]).is_err());
        assert_eq!(tpmt_public(&[0, 3, 9, 9, 9]).unwrap(), &[9, 9, 9]);
    }
}
