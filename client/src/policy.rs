//! Signed PCR policies: approvals of PCR values by a policy authority, for secrets sealed with
//! an authority (TPM2_PolicyAuthorize).
//!
//! Owns the [`SignedPolicy`] file format (the protobuf `tpmvault.v1.SignedPolicy`), the
//! TPM2_PolicyPCR digest computed in software, and offline signing with an ECC P-256 private
//! key held in a PEM file ([`PolicyAuthority`]), which produces exactly what the daemon's
//! `SignPolicy` produces with a vault key. It does not talk to the daemon.

use std::fmt;

use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{DecodePrivateKey, EncodePublicKey};
use prost::Message;
use sha2::{Digest, Sha256};
use tpm_vault_proto::signed_policy;
use tpm_vault_proto::v1 as proto;
use zeroize::Zeroizing;

use crate::attest::{bank_alg, public_key_pem, PcrValues};
use crate::{Error, PcrBinding};

/// TPM_CC_PolicyPCR.
const CC_POLICY_PCR: u32 = 0x0000_017F;
/// Version of the SignedPolicy format.
const FORMAT_VERSION: u32 = 1;
/// A signed policy file larger than this is something else.
pub const MAX_SIGNED_POLICY: usize = 64 * 1024;

/// PCR values to approve, with the approval's version and expiry.
///
/// ```
/// use tpm_vault_client::{PcrBinding, PolicyApproval};
///
/// let pcr9: PcrBinding = format!("sha256:9={}", "ab".repeat(32)).parse()?;
/// let approval = PolicyApproval::new(&pcr9)?.with_version(2).with_expiry(1_900_000_000);
/// assert_eq!(approval.policy_digest().len(), 32);
/// # Ok::<(), tpm_vault_client::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyApproval {
    /// The approved values, indices ascending (the order TPM2_PolicyPCR hashes them in).
    binding: PcrBinding,
    /// Approval counter: once an approval with a higher version opened a secret, the daemon
    /// refuses lower ones for it.
    version: u64,
    /// Expiry, Unix seconds; 0 = never.
    expires_unix: i64,
}

impl PolicyApproval {
    /// An approval of the values in `binding` (version 0, no expiry).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if `binding` has no values: an approval names the values it
    /// approves.
    pub fn new(binding: &PcrBinding) -> Result<PolicyApproval, Error> {
        if binding.values().is_empty() {
            return Err(Error::InvalidInput(format!(
                "give the PCR values to approve, e.g. {}=HEX",
                binding
                    .pcrs()
                    .first()
                    .map_or_else(|| format!("{}:9", binding.bank()), |p| format!("{}:{p}", binding.bank()))
            )));
        }
        let mut pairs: Vec<(u32, Vec<u8>)> =
            binding.pcrs().iter().copied().zip(binding.values().iter().cloned()).collect();
        pairs.sort_by_key(|(pcr, _)| *pcr);
        let binding = PcrBinding::expected(binding.bank(), pairs)?;
        Ok(PolicyApproval { binding, version: 0, expires_unix: 0 })
    }

    /// Sets the approval counter (default 0).
    pub fn with_version(mut self, version: u64) -> PolicyApproval {
        self.version = version;
        self
    }

    /// Sets the expiry in Unix seconds (default 0: never).
    pub fn with_expiry(mut self, expires_unix: i64) -> PolicyApproval {
        self.expires_unix = expires_unix;
        self
    }

    /// The approved values.
    pub fn binding(&self) -> &PcrBinding {
        &self.binding
    }

    /// The approval counter.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The expiry, Unix seconds; 0 = never.
    pub fn expires_unix(&self) -> i64 {
        self.expires_unix
    }

    /// The TPM2_PolicyPCR digest of the approved values (SHA-256 policy, from the zero
    /// digest): the `approved_policy` the authority signs.
    pub fn policy_digest(&self) -> Vec<u8> {
        policy_pcr_digest(&self.binding)
    }

    /// The `SignPolicy` request for a vault key.
    pub(crate) fn to_request(&self, key_name: &str) -> proto::SignPolicyRequest {
        proto::SignPolicyRequest {
            key_name: key_name.to_owned(),
            pcrs: Some(self.binding.to_proto()),
            policy_version: self.version,
            expires_unix: self.expires_unix,
        }
    }
}

/// `TPM2_PolicyPCR` digest, from the all-zero policy, of a binding with values in ascending
/// index order: `SHA256(0^32 || TPM_CC_PolicyPCR || TPML_PCR_SELECTION || SHA256(values))`.
fn policy_pcr_digest(binding: &PcrBinding) -> Vec<u8> {
    let mut bitmap = [0u8; 3];
    for &pcr in binding.pcrs() {
        // PcrBinding guarantees indices 0-23.
        if let Some(byte) = bitmap.get_mut((pcr / 8) as usize) {
            *byte |= 1 << (pcr % 8);
        }
    }
    let values = binding.values().iter().fold(Sha256::new(), |h, v| h.chain_update(v)).finalize();
    Sha256::new()
        .chain_update([0u8; 32])
        .chain_update(CC_POLICY_PCR.to_be_bytes())
        .chain_update(1u32.to_be_bytes())
        .chain_update(bank_alg(binding.bank()).unwrap_or(0).to_be_bytes())
        .chain_update([3u8])
        .chain_update(bitmap)
        .chain_update(values)
        .finalize()
        .to_vec()
}

/// An approval of PCR values, signed by a policy authority: the `--policy` file of
/// `tpm-vault unseal` (protobuf-encoded `tpmvault.v1.SignedPolicy`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedPolicy(proto::SignedPolicy);

impl SignedPolicy {
    /// Decodes a signed policy file.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if the bytes are not a SignedPolicy.
    pub fn from_bytes(bytes: &[u8]) -> Result<SignedPolicy, Error> {
        proto::SignedPolicy::decode(bytes)
            .map(SignedPolicy)
            .map_err(|e| Error::InvalidInput(format!("not a signed policy: {e}")))
    }

    /// Encodes the policy for a file.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.encode_to_vec()
    }

    /// The approved PCR values.
    pub fn pcrs(&self) -> PcrValues {
        PcrValues { bank: self.0.pcr_bank.clone(), pcrs: self.0.pcrs.clone(), values: self.0.pcr_values.clone() }
    }

    /// The approved TPM2_PolicyPCR digest.
    pub fn approved_policy(&self) -> &[u8] {
        &self.0.approved_policy
    }

    /// The approval counter.
    pub fn version(&self) -> u64 {
        self.0.policy_version
    }

    /// The expiry, Unix seconds; 0 = never.
    pub fn expires_unix(&self) -> i64 {
        self.0.expires_unix
    }

    /// The authority's public key, DER SubjectPublicKeyInfo (informational).
    pub fn authority_spki(&self) -> &[u8] {
        &self.0.authority_spki
    }

    /// The API message.
    pub fn as_proto(&self) -> &proto::SignedPolicy {
        &self.0
    }
}

impl From<proto::SignedPolicy> for SignedPolicy {
    fn from(policy: proto::SignedPolicy) -> SignedPolicy {
        SignedPolicy(policy)
    }
}

/// Why a policy authority's private key could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyKeyError {
    /// No `PRIVATE KEY` or `EC PRIVATE KEY` PEM block in the file.
    #[error("no PEM private key found (expected \"PRIVATE KEY\" or \"EC PRIVATE KEY\")")]
    NoPrivateKey,
    /// The key is encrypted with a passphrase.
    #[error("the private key is encrypted; decrypt it first (openssl pkey -in KEY -out PLAIN)")]
    Encrypted,
    /// The key is not an ECC P-256 key (or its encoding is broken).
    #[error("not an ECC P-256 private key")]
    NotP256,
}

/// An offline policy authority: an ECC P-256 private key from a PEM file, signing approvals
/// exactly as the daemon's `SignPolicy` does with a vault key.
///
/// ```
/// use tpm_vault_client::{PcrBinding, PolicyApproval, PolicyAuthority};
///
/// # fn demo(pem: &str) -> Result<(), Box<dyn std::error::Error>> {
/// let authority = PolicyAuthority::from_pem(pem)?;
/// let pcr9: PcrBinding = format!("sha256:9={}", "ab".repeat(32)).parse()?;
/// let policy = authority.sign(&PolicyApproval::new(&pcr9)?.with_version(1));
/// std::fs::write("kernel-2.policy", policy.to_bytes())?;
/// # Ok(()) }
/// ```
pub struct PolicyAuthority {
    /// The private key; zeroized on drop by p256.
    key: SigningKey,
}

impl fmt::Debug for PolicyAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyAuthority").finish_non_exhaustive()
    }
}

impl PolicyAuthority {
    /// Loads a PEM private key: PKCS#8 (`openssl genpkey -algorithm EC -pkeyopt
    /// ec_paramgen_curve:P-256`) or SEC1 (`openssl ecparam -name prime256v1 -genkey`; an
    /// `EC PARAMETERS` block before it is skipped).
    ///
    /// # Errors
    /// [`PolicyKeyError`] when there is no unencrypted P-256 private key in `pem`.
    pub fn from_pem(pem: &str) -> Result<PolicyAuthority, PolicyKeyError> {
        let mut encrypted = false;
        for (label, block) in pem_blocks(pem) {
            let decode = || {
                p256::pkcs8::der::pem::decode_vec(block.as_bytes())
                    .map(|(_, der)| Zeroizing::new(der))
                    .map_err(|_| PolicyKeyError::NotP256)
            };
            match label {
                "PRIVATE KEY" => {
                    let der = decode()?;
                    let key = p256::SecretKey::from_pkcs8_der(&der).map_err(|_| PolicyKeyError::NotP256)?;
                    return Ok(PolicyAuthority { key: key.into() });
                }
                "EC PRIVATE KEY" => {
                    let der = decode()?;
                    let key = p256::SecretKey::from_sec1_der(&der).map_err(|_| PolicyKeyError::NotP256)?;
                    return Ok(PolicyAuthority { key: key.into() });
                }
                "ENCRYPTED PRIVATE KEY" => encrypted = true,
                _ => {}
            }
        }
        Err(if encrypted { PolicyKeyError::Encrypted } else { PolicyKeyError::NoPrivateKey })
    }

    /// The authority's public key, DER SubjectPublicKeyInfo (what `seal --authorized-by`
    /// takes).
    pub fn public_key_der(&self) -> Vec<u8> {
        // Encoding a valid P-256 point cannot fail; an empty key would be refused by the daemon.
        self.key.verifying_key().to_public_key_der().map(|d| d.as_bytes().to_vec()).unwrap_or_default()
    }

    /// The authority's public key, PEM.
    pub fn public_key_pem(&self) -> String {
        public_key_pem(&self.public_key_der()).unwrap_or_default()
    }

    /// Signs an approval: the TPM-checked signature over `approved_policy || policy_ref` and
    /// the daemon-checked envelope signature over the version and expiry.
    pub fn sign(&self, approval: &PolicyApproval) -> SignedPolicy {
        let approved = approval.policy_digest();
        let signature: Signature = self.key.sign(&signed_policy::approval_message(&approved, &[]));
        let envelope: Signature =
            self.key.sign(&signed_policy::envelope_message(&approved, &[], approval.version, approval.expires_unix));
        SignedPolicy(proto::SignedPolicy {
            format_version: FORMAT_VERSION,
            pcr_bank: approval.binding.bank().to_owned(),
            pcrs: approval.binding.pcrs().to_vec(),
            pcr_values: approval.binding.values().to_vec(),
            approved_policy: approved,
            policy_ref: Vec::new(),
            signature: signature.to_der().as_bytes().to_vec(),
            policy_version: approval.version,
            expires_unix: approval.expires_unix,
            envelope_signature: envelope.to_der().as_bytes().to_vec(),
            authority_spki: self.public_key_der(),
        })
    }
}

/// The PEM blocks of a text, as `(label, whole block)`, skipping anything malformed.
fn pem_blocks(text: &str) -> impl Iterator<Item = (&str, &str)> {
    const BEGIN: &str = "-----BEGIN ";
    let mut rest = text;
    std::iter::from_fn(move || loop {
        let start = rest.find(BEGIN)?;
        let after = &rest[start + BEGIN.len()..];
        let Some(label_end) = after.find("-----") else {
            rest = "";
            return None;
        };
        let label = &after[..label_end];
        let end_marker = format!("-----END {label}-----");
        match rest[start..].find(&end_marker) {
            Some(end) => {
                let block = &rest[start..start + end + end_marker.len()];
                rest = &rest[start + end + end_marker.len()..];
                return Some((label, block));
            }
            None => rest = after,
        }
    })
}

#[cfg(test)]
mod tests {
    use p256::ecdsa::signature::Verifier;
    use p256::ecdsa::VerifyingKey;
    use p256::pkcs8::{DecodePublicKey, EncodePrivateKey, LineEnding};

    use super::*;

    fn key() -> p256::SecretKey {
        p256::SecretKey::from_bytes(&[5u8; 32].into()).unwrap()
    }

    fn approval() -> PolicyApproval {
        let binding: PcrBinding = format!("sha256:9={}", "ab".repeat(32)).parse().unwrap();
        PolicyApproval::new(&binding).unwrap().with_version(3).with_expiry(1_900_000_000)
    }

    /// The daemon's `policy_pcr_digest` for sha256:9 = ab..ab, computed by hand from TPM 2.0
    /// Part 3 (and cross-checked against the TPM in tests/sealing.rs).
    #[test]
    fn policy_digest_follows_policy_pcr() {
        let values = Sha256::digest([0xab; 32]);
        let mut buf = vec![0u8; 32];
        buf.extend_from_slice(&[0x00, 0x00, 0x01, 0x7f]);
        buf.extend_from_slice(&[0, 0, 0, 1, 0x00, 0x0b, 3, 0x00, 0x02, 0x00]);
        buf.extend_from_slice(&values);
        assert_eq!(approval().policy_digest(), Sha256::digest(&buf).to_vec());
    }

    #[test]
    fn values_are_sorted_and_required() {
        let a = format!("sha256:10={},9={}", "0a".repeat(32), "09".repeat(32));
        let approval = PolicyApproval::new(&a.parse().unwrap()).unwrap();
        assert_eq!(approval.binding().pcrs(), &[9, 10]);
        assert_eq!(approval.binding().values()[0], vec![9; 32]);
        let err = PolicyApproval::new(&"sha256:9".parse().unwrap()).unwrap_err();
        assert_eq!(err.to_string(), "give the PCR values to approve, e.g. sha256:9=HEX");
    }

    #[test]
    fn signatures_verify_like_the_daemon_checks_them() {
        let authority = PolicyAuthority { key: key().into() };
        let policy = authority.sign(&approval());
        let p = policy.as_proto();
        assert_eq!(p.format_version, 1);
        assert_eq!((p.pcr_bank.as_str(), p.pcrs.as_slice()), ("sha256", &[9][..]));
        assert_eq!(p.approved_policy, approval().policy_digest());
        let vk = VerifyingKey::from_public_key_der(&p.authority_spki).unwrap();
        let sig = Signature::from_der(&p.signature).unwrap();
        vk.verify(&signed_policy::approval_message(&p.approved_policy, &[]), &sig).unwrap();
        let env = Signature::from_der(&p.envelope_signature).unwrap();
        vk.verify(&signed_policy::envelope_message(&p.approved_policy, &[], 3, 1_900_000_000), &env).unwrap();
        assert_eq!(SignedPolicy::from_bytes(&policy.to_bytes()).unwrap(), policy);
        assert_eq!(policy.version(), 3);
        assert_eq!(policy.expires_unix(), 1_900_000_000);
        assert!(SignedPolicy::from_bytes(b"\xff\xff\xff").is_err());
    }

    #[test]
    fn loads_pkcs8_and_sec1_pem() {
        let pkcs8 = key().to_pkcs8_pem(LineEnding::LF).unwrap();
        let a = PolicyAuthority::from_pem(&pkcs8).unwrap();
        let sec1 = key().to_sec1_pem(LineEnding::LF).unwrap();
        let with_params =
            format!("-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{}", *sec1);
        let b = PolicyAuthority::from_pem(&with_params).unwrap();
        assert_eq!(a.public_key_der(), b.public_key_der());
        assert!(a.public_key_pem().starts_with("-----BEGIN PUBLIC KEY-----"));
        assert!(format!("{a:?}").starts_with("PolicyAuthority"));
    }

    #[test]
    fn refuses_other_keys() {
        assert_eq!(PolicyAuthority::from_pem("hello").unwrap_err(), PolicyKeyError::NoPrivateKey);
        let public = public_key_pem(&PolicyAuthority { key: key().into() }.public_key_der()).unwrap();
        assert_eq!(PolicyAuthority::from_pem(&public).unwrap_err(), PolicyKeyError::NoPrivateKey);
        let encrypted = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        assert_eq!(PolicyAuthority::from_pem(encrypted).unwrap_err(), PolicyKeyError::Encrypted);
        let p384 = p384::SecretKey::from_bytes(&[5u8; 48].into()).unwrap().to_pkcs8_pem(LineEnding::LF).unwrap();
        assert_eq!(PolicyAuthority::from_pem(&p384).unwrap_err(), PolicyKeyError::NotP256);
        let garbage = "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n";
        assert_eq!(PolicyAuthority::from_pem(garbage).unwrap_err(), PolicyKeyError::NotP256);
        assert_eq!(PolicyAuthority::from_pem("-----BEGIN X").unwrap_err(), PolicyKeyError::NoPrivateKey);
    }
}
