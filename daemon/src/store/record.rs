//! The on-disk key record (JSON, one file per key) and its encoding.
//!
//! Format version 1:
//! ```json
//! {"version":1,"name":"web","alg":"ecc-p256","created_unix":1764480000,"owner_uid":0,
//!  "tpm_name":"000b…","public":"<hex TPM2B_PUBLIC>","private":"<hex TPM2B_PRIVATE>",
//!  "has_auth":false,"pcr_policy":null,"cert_chain_pem":null}
//! ```
//! `public` and `private` are exactly what tpm2-tools' `tpm2_load -u/-r` accept. A record with a
//! certificate chain also has `"cert_version":N`, bumped each time the chain is replaced.
//!
//! ML-DSA, ML-KEM and hybrid keys also have a `"pq"` section ([`PqSection`]): the raw
//! post-quantum public key and the private material AES-256-GCM-encrypted under a 256-bit key
//! that a TPM sealed object holds. For ML-DSA and ML-KEM keys that sealed object *is* the
//! record's TPM object (`public`/`private`/`tpm_name`); a hybrid key's TPM object is its ECDSA
//! P-256 key, so its section carries the sealed object itself (`wrapping_key`). Records without
//! the section (all older ones) parse as before.

use serde::{Deserialize, Serialize};

use crate::model::{KeyAlg, KeyName, PcrSelection};

/// Current record format version.
pub const RECORD_VERSION: u32 = 1;

/// A stored key. Holds no secret: the private blob is wrapped by this TPM's SRK.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    /// Format version, [`RECORD_VERSION`].
    pub version: u32,
    /// Key name (also the file name).
    pub name: KeyName,
    /// Algorithm.
    pub alg: KeyAlg,
    /// Creation time, Unix seconds.
    pub created_unix: i64,
    /// Uid of the creating client (for owner-only access policies).
    pub owner_uid: u32,
    /// TPM object name, identifies the loaded object.
    #[serde(with = "hex_bytes")]
    pub tpm_name: Vec<u8>,
    /// TPM2B_PUBLIC.
    #[serde(with = "hex_bytes")]
    pub public: Vec<u8>,
    /// TPM2B_PRIVATE (wrapped by the SRK).
    #[serde(with = "hex_bytes")]
    pub private: Vec<u8>,
    /// Whether the key has a password.
    #[serde(default)]
    pub has_auth: bool,
    /// PCR policy the key is bound to, if any.
    #[serde(default)]
    pub pcr_policy: Option<PcrPolicy>,
    /// Certificate chain, leaf first, PEM.
    #[serde(default)]
    pub cert_chain_pem: Option<String>,
    /// Bumped each time `cert_chain_pem` is replaced, so TLS certificate resolvers that cache
    /// the chain notice a new one. Absent (0) in records that never had a certificate.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cert_version: u64,
    /// Post-quantum material (ML-DSA, ML-KEM and hybrid keys); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pq: Option<PqSection>,
}

/// A key's TPM-sealed post-quantum part. Holds no secret in clear: `ciphertext` opens only with
/// the wrapping key, which only the TPM can unseal (under the record's PCR policy, if any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PqSection {
    /// The raw public key: FIPS 204 `pk` (ML-DSA) or FIPS 203 encapsulation key `ek` (ML-KEM).
    #[serde(with = "hex_bytes")]
    pub public_key: Vec<u8>,
    /// AES-256-GCM nonce (96 bits).
    #[serde(with = "hex_bytes")]
    pub nonce: Vec<u8>,
    /// AES-256-GCM ciphertext and tag of the private material: the 32-byte seed ξ for ML-DSA,
    /// the FIPS 203 decapsulation key for ML-KEM. The associated data binds it to the key's name,
    /// algorithm and public key (see `vault::pq`).
    #[serde(with = "hex_bytes")]
    pub ciphertext: Vec<u8>,
    /// The sealed object holding the wrapping key, when it is not the record's own TPM object
    /// (hybrid keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapping_key: Option<SealedBlob>,
}

/// A TPM sealed object's blobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedBlob {
    /// TPM object name.
    #[serde(with = "hex_bytes")]
    pub tpm_name: Vec<u8>,
    /// TPM2B_PUBLIC.
    #[serde(with = "hex_bytes")]
    pub public: Vec<u8>,
    /// TPM2B_PRIVATE (wrapped by the SRK).
    #[serde(with = "hex_bytes")]
    pub private: Vec<u8>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A key's PCR binding: the selection and the values the policy requires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcrPolicy {
    /// PCRs.
    pub selection: PcrSelection,
    /// Expected values, one per PCR in selection order (hex in JSON).
    #[serde(with = "hex_list")]
    pub values: Vec<Vec<u8>>,
}

impl KeyRecord {
    /// Serialises the record.
    pub fn to_bytes(&self) -> Vec<u8> {
        json_line(self, true)
    }

    /// Parses and checks a record read from the file for `expected`.
    ///
    /// # Errors
    /// A description of what is wrong.
    pub fn from_bytes(bytes: &[u8], expected: &KeyName) -> Result<Self, String> {
        let record: KeyRecord = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        check_header(record.version, &record.name, expected)?;
        if record.public.is_empty() || record.private.is_empty() {
            return Err("empty key blob".into());
        }
        match (&record.pq, record.alg.has_pq()) {
            (Some(pq), true) if pq.nonce.len() == 12 && !pq.public_key.is_empty() => {}
            (Some(_), true) => return Err("bad post-quantum section".into()),
            (None, true) => return Err(format!("a {} key needs its post-quantum section", record.alg)),
            (Some(_), false) => return Err(format!("a {} key has no post-quantum section", record.alg)),
            (None, false) => {}
        }
        Ok(record)
    }
}

/// A record as one JSON document and a final newline; `pretty` for the small records people
/// may read, compact for sealed records (whose ciphertext can be megabytes of hex).
fn json_line(record: &impl Serialize, pretty: bool) -> Vec<u8> {
    // invariant: serialising structs of strings, numbers and hex strings cannot fail.
    let mut v = if pretty { serde_json::to_vec_pretty(record) } else { serde_json::to_vec(record) }.unwrap_or_default();
    v.push(b'\n');
    v
}

/// The checks every record kind shares: a known format version, and the record names the key
/// its file is for (so a renamed or swapped file is refused).
fn check_header(version: u32, name: &KeyName, expected: &KeyName) -> Result<(), String> {
    if version != RECORD_VERSION {
        return Err(format!("unsupported record version {version}"));
    }
    if name != expected {
        return Err(format!("record names {name:?}, file is for {expected:?}"));
    }
    Ok(())
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        hex::decode(s).map_err(serde::de::Error::custom)
    }
}

mod hex_list {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(hex::encode))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        v.into_iter().map(|s| hex::decode(s).map_err(serde::de::Error::custom)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> KeyRecord {
        KeyRecord {
            version: RECORD_VERSION,
            name: KeyName::try_from("web").unwrap_or_else(|e| panic!("{e}")),
            alg: KeyAlg::EccP256,
            created_unix: 1,
            owner_uid: 0,
            tpm_name: vec![0, 11, 1],
            public: vec![1, 2],
            private: vec![3, 4],
            has_auth: false,
            pcr_policy: None,
            cert_chain_pem: None,
            cert_version: 0,
            pq: None,
        }
    }

    #[test]
    fn round_trips_and_rejects_mismatches() {
        let r = sample();
        let bytes = r.to_bytes();
        assert_eq!(KeyRecord::from_bytes(&bytes, &r.name), Ok(r.clone()));
        let other = KeyName::try_from("other").unwrap_or_else(|e| panic!("{e}"));
        assert!(KeyRecord::from_bytes(&bytes, &other).is_err());
        assert!(KeyRecord::from_bytes(b"{", &r.name).is_err());
        assert!(KeyRecord::from_bytes(b"{\"version\":2}", &r.name).is_err());
    }

    #[test]
    fn pcr_selection_is_checked_on_load() {
        // Found by the store_record fuzz target: indices from 24 on used to reach the TPM code
        // unchecked (a shift overflow at 32, an out-of-bounds bitmap index from 24).
        let with = |pcrs: &str| {
            let values = pcrs.split(',').filter(|p| !p.is_empty()).map(|_| format!("\"{}\"", "00".repeat(32)));
            let text = format!(
                r#"{{"version":1,"name":"web","alg":"ecc-p256","created_unix":1,"owner_uid":0,
                "tpm_name":"000b01","public":"0102","private":"0304","has_auth":false,
                "pcr_policy":{{"selection":{{"bank":"sha256","pcrs":[{pcrs}]}},"values":[{}]}},
                "cert_chain_pem":null}}"#,
                values.collect::<Vec<_>>().join(",")
            );
            KeyRecord::from_bytes(text.as_bytes(), &sample().name)
        };
        let ok = with("7,9").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.pcr_policy.map(|p| p.selection.pcrs), Some(vec![7, 9]));
        for bad in ["9,32", "24", "255", "", "9,7", "9,9"] {
            assert!(with(bad).is_err(), "pcrs [{bad}] accepted");
        }
    }

    #[test]
    fn pq_section_is_optional_and_checked() {
        // A record written before post-quantum keys existed still parses, and a classical
        // record is still written without the section.
        let old = br#"{"version":1,"name":"web","alg":"ecc-p256","created_unix":1,"owner_uid":0,
            "tpm_name":"000b01","public":"0102","private":"0304","has_auth":false,
            "pcr_policy":null,"cert_chain_pem":null}"#;
        let r = sample();
        assert_eq!(KeyRecord::from_bytes(old, &r.name), Ok(r.clone()));
        assert!(!String::from_utf8_lossy(&r.to_bytes()).contains("\"pq\""));
        let pq =
            PqSection { public_key: vec![9; 1952], nonce: vec![1; 12], ciphertext: vec![2; 48], wrapping_key: None };
        let with = KeyRecord { alg: KeyAlg::MlDsa65, pq: Some(pq.clone()), ..r.clone() };
        assert_eq!(KeyRecord::from_bytes(&with.to_bytes(), &r.name), Ok(with.clone()));
        let hybrid = KeyRecord {
            alg: KeyAlg::HybridP256MlDsa65,
            pq: Some(PqSection {
                wrapping_key: Some(SealedBlob { tpm_name: vec![0, 11], public: vec![1], private: vec![2] }),
                ..pq.clone()
            }),
            ..r.clone()
        };
        assert_eq!(KeyRecord::from_bytes(&hybrid.to_bytes(), &r.name), Ok(hybrid));
        let missing = KeyRecord { pq: None, ..with.clone() };
        assert!(KeyRecord::from_bytes(&missing.to_bytes(), &r.name).is_err());
        let stray = KeyRecord { alg: KeyAlg::EccP256, ..with };
        assert!(KeyRecord::from_bytes(&stray.to_bytes(), &r.name).is_err());
    }
}

/// How a sealed secret's TPM object is authorized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SealPolicy {
    /// PolicyPCR: opens while the PCRs hold exactly these values.
    Pcr {
        /// PCRs and values.
        pcr: PcrPolicy,
    },
    /// PolicyPCR + PolicyAuthorize: opens for PCR values the authority approved.
    Authorized {
        /// PCRs an approval must cover.
        selection: PcrSelection,
        /// Authority's DER SubjectPublicKeyInfo (ECC P-256).
        #[serde(with = "hex_bytes")]
        authority_spki: Vec<u8>,
        /// Lowest approval version still accepted (raised when a newer approval is used).
        min_policy_version: u64,
    },
}

/// A sealed secret: the TPM-sealed data key and the in-core AES-256-GCM ciphertext, stored
/// together in one file so a crash leaves either the old or the new secret, never a mix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedRecord {
    /// Format version, [`RECORD_VERSION`].
    pub version: u32,
    /// Name (also the file name).
    pub name: KeyName,
    /// Creation time, Unix seconds.
    pub created_unix: i64,
    /// Uid of the sealing client.
    pub owner_uid: u32,
    /// Authorization of the sealed object.
    pub policy: SealPolicy,
    /// The sealed object's authPolicy digest.
    #[serde(with = "hex_bytes")]
    pub policy_digest: Vec<u8>,
    /// TPM object name of the sealed object.
    #[serde(with = "hex_bytes")]
    pub tpm_name: Vec<u8>,
    /// TPM2B_PUBLIC of the sealed object.
    #[serde(with = "hex_bytes")]
    pub public: Vec<u8>,
    /// TPM2B_PRIVATE of the sealed object.
    #[serde(with = "hex_bytes")]
    pub private: Vec<u8>,
    /// AES-256-GCM nonce (96 bits).
    #[serde(with = "hex_bytes")]
    pub nonce: Vec<u8>,
    /// AES-256-GCM ciphertext with tag; associated data is the record name.
    #[serde(with = "hex_bytes")]
    pub ciphertext: Vec<u8>,
}

impl SealedRecord {
    /// Serialises the record.
    pub fn to_bytes(&self) -> Vec<u8> {
        json_line(self, false)
    }

    /// Parses and checks a record read from the file for `expected`.
    ///
    /// # Errors
    /// A description of what is wrong.
    pub fn from_bytes(bytes: &[u8], expected: &KeyName) -> Result<Self, String> {
        let record: SealedRecord = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        check_header(record.version, &record.name, expected)?;
        if record.nonce.len() != 12 {
            return Err("bad nonce length".into());
        }
        Ok(record)
    }
}

/// A data key: a random 256-bit AES key sealed by the TPM (optionally PCR-bound). It never
/// leaves the daemon; the daemon unseals it once into memory and does the AES-GCM work in-core.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataKeyRecord {
    /// Format version, [`RECORD_VERSION`].
    pub version: u32,
    /// Name (also the file name).
    pub name: KeyName,
    /// Creation time, Unix seconds.
    pub created_unix: i64,
    /// Uid of the creating client.
    pub owner_uid: u32,
    /// Random id written into every stream header, so a stream names the key generation that
    /// encrypted it.
    #[serde(with = "hex_bytes")]
    pub key_id: Vec<u8>,
    /// PCR binding of the sealed object, if any.
    pub pcr_policy: Option<PcrPolicy>,
    /// TPM object name of the sealed object.
    #[serde(with = "hex_bytes")]
    pub tpm_name: Vec<u8>,
    /// TPM2B_PUBLIC of the sealed object.
    #[serde(with = "hex_bytes")]
    pub public: Vec<u8>,
    /// TPM2B_PRIVATE of the sealed object.
    #[serde(with = "hex_bytes")]
    pub private: Vec<u8>,
}

impl DataKeyRecord {
    /// Serialises the record.
    pub fn to_bytes(&self) -> Vec<u8> {
        json_line(self, true)
    }

    /// Parses and checks a record read from the file for `expected`.
    ///
    /// # Errors
    /// A description of what is wrong.
    pub fn from_bytes(bytes: &[u8], expected: &KeyName) -> Result<Self, String> {
        let record: DataKeyRecord = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        check_header(record.version, &record.name, expected)?;
        if record.key_id.len() != 16 {
            return Err("bad key id".into());
        }
        Ok(record)
    }
}
