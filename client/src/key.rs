//! Key metadata and public keys, as returned by the daemon.
//!
//! Plain data converted from the API messages; no I/O here. Creating, listing and deleting keys
//! are [`Client`](crate::Client) methods.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tpm_vault_proto::v1 as proto;

use crate::{KeyAlgorithm, KeyUsage, PcrBinding};

/// A key's metadata. The private part never leaves the TPM, so there is none here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    /// The key's name, `[a-z0-9][a-z0-9._-]{0,63}`.
    pub name: String,
    /// Its algorithm.
    pub algorithm: KeyAlgorithm,
    /// TPM object name (nameAlg || digest of the public area), hex: identifies the TPM object.
    pub tpm_name: String,
    /// Creation time in seconds since the Unix epoch, as the daemon reports it.
    pub created_unix: i64,
    /// The PCR values the key's use depends on, if any.
    pub pcr_binding: Option<PcrBinding>,
    /// Uid of the client that created the key, which access policies may refer to.
    pub owner_uid: u32,
    /// Whether using the key needs a password.
    pub has_auth: bool,
    /// What the key may be used for (`sign`, `ssh`, `policy`), enforced by the daemon. Keys
    /// created before usages existed have all three; empty only from a daemon older than
    /// usages (whose keys can do everything).
    pub usages: Vec<KeyUsage>,
}

impl KeyInfo {
    /// Whether the key may be used for `usage` (always true against a daemon older than
    /// usages, which reports none and enforces none).
    pub fn allows(&self, usage: KeyUsage) -> bool {
        self.usages.is_empty() || self.usages.contains(&usage)
    }

    /// The creation time; `None` if the daemon reported a time before the epoch.
    pub fn created(&self) -> Option<SystemTime> {
        let secs = u64::try_from(self.created_unix).ok()?;
        UNIX_EPOCH.checked_add(Duration::from_secs(secs))
    }
}

impl From<proto::Key> for KeyInfo {
    fn from(key: proto::Key) -> KeyInfo {
        KeyInfo {
            algorithm: key.algorithm(),
            usages: key.usages().collect(),
            name: key.name,
            tpm_name: key.tpm_name,
            created_unix: key.created_unix,
            pcr_binding: key.pcr_binding.map(PcrBinding::from_proto),
            owner_uid: key.owner_uid,
            has_auth: key.has_auth,
        }
    }
}

/// A key's public part as a SubjectPublicKeyInfo, readable by OpenSSL (ML-DSA keys: RFC 9881
/// `id-ml-dsa-*`; ML-KEM keys: `id-alg-ml-kem-*`, draft-ietf-lamps-kyber-certificates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    /// DER SubjectPublicKeyInfo (a hybrid key's ECDSA P-256 half).
    pub der: Vec<u8>,
    /// The same as PEM (`-----BEGIN PUBLIC KEY-----`).
    pub pem: String,
    /// The key's algorithm.
    pub algorithm: KeyAlgorithm,
    /// A hybrid key's ML-DSA-65 half: DER SubjectPublicKeyInfo and PEM. `None` for other keys.
    pub ml_dsa: Option<(Vec<u8>, String)>,
}

impl From<proto::PublicKey> for PublicKey {
    fn from(key: proto::PublicKey) -> PublicKey {
        let ml_dsa = (!key.ml_dsa_der.is_empty()).then(|| (key.ml_dsa_der.clone(), key.ml_dsa_pem.clone()));
        PublicKey { algorithm: key.algorithm(), der: key.der, pem: key.pem, ml_dsa }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_from_proto() {
        let key = KeyInfo::from(proto::Key {
            name: "web".into(),
            algorithm: KeyAlgorithm::EccP384 as i32,
            tpm_name: "000b".into(),
            created_unix: 10,
            pcr_binding: Some(proto::PcrBinding { bank: "sha256".into(), pcrs: vec![9], values: vec![] }),
            owner_uid: 1000,
            has_auth: true,
            usages: vec![KeyUsage::Ssh as i32, 99],
        });
        assert_eq!(key.usages, [KeyUsage::Ssh], "unknown usages are dropped");
        assert!(key.allows(KeyUsage::Ssh) && !key.allows(KeyUsage::Sign));
        assert_eq!(key.algorithm, KeyAlgorithm::EccP384);
        assert_eq!(key.created(), UNIX_EPOCH.checked_add(Duration::from_secs(10)));
        assert_eq!(key.pcr_binding.map(|b| b.to_string()).as_deref(), Some("sha256:9"));
    }

    #[test]
    fn unknown_algorithm_is_unspecified() {
        let key = KeyInfo::from(proto::Key { algorithm: 99, ..Default::default() });
        assert_eq!(key.algorithm, KeyAlgorithm::Unspecified);
        assert_eq!(key.created(), Some(UNIX_EPOCH));
        assert!(key.allows(KeyUsage::Policy), "a daemon without usages enforces none");
    }
}
