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
//! the section (all older ones) parse as before. The section's public key is checked whenever a
//! record is read ([`crate::crypto::pq::check_public_key`]: an ML-DSA key's length, an ML-KEM
//! key's FIPS 203 input check), so a record edited on disk is refused as corrupt.
//!
//! A key record has `"usages":["sign","ssh","policy"]` (a non-empty subset, [`Usages`]); a
//! record without it was written before usages existed and has all three, which is what such
//! a key could do then (`key set-usage` narrows it, and writes the field).
//!
//! Every record kind names its creator ([`Owner`]): `owner_uid`, and for a client of the TLS
//! listener also `"owner_certificate"` (its certificate identity; `owner_uid` is then
//! [`Owner::CERTIFICATE_UID`]). Records without it (all older ones) are owned by their uid.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::model::{KeyAlg, KeyName, Owner, PcrSelection, Usages};

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
    /// The key's algorithm (its TPM template, and its in-core half for hybrid keys).
    pub alg: KeyAlg,
    /// Creation time, Unix seconds.
    pub created_unix: i64,
    /// Uid of the creating client (for owner-only access policies).
    pub owner_uid: u32,
    /// The creating TLS client's certificate identity (subject or SPIFFE ID); absent for a
    /// local client (and in records older than it), whose uid is `owner_uid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_certificate: Option<String>,
    /// The key's TPM object (for ML-DSA and ML-KEM keys: the sealed wrapping key).
    #[serde(flatten)]
    pub object: TpmObject,
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
    /// What the key may be used for ([`KeyRecord::usages`]). `None` in records older than
    /// usages, which keep every usage ([`Usages::LEGACY`]: what they could do when they were
    /// written) and are written back unchanged until `key set-usage` narrows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usages: Option<Usages>,
}

impl KeyRecord {
    /// What the key may be used for.
    pub fn usages(&self) -> Usages {
        self.usages.unwrap_or(Usages::LEGACY)
    }
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
    pub wrapping_key: Option<TpmObject>,
}

/// A TPM object as the state directory keeps it: its name and the blobs `TPM2_Load` takes.
/// Every record kind embeds one (flattened, so its three fields sit at the record's top level);
/// a hybrid key's [`PqSection`] holds a second one. The TPM layer turns it into a loadable
/// object (`tpm::KeyBlob`) and back; nothing else reads the blobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpmObject {
    /// TPM object name (nameAlg || H(TPMT_PUBLIC)): identifies the loaded object.
    #[serde(with = "hex_bytes")]
    pub tpm_name: Vec<u8>,
    /// TPM2B_PUBLIC, as `tpm2_load -u` accepts it.
    #[serde(with = "hex_bytes")]
    pub public: Vec<u8>,
    /// TPM2B_PRIVATE (wrapped by this TPM's SRK), as `tpm2_load -r` accepts it.
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
    /// The bank and the PCRs of it the key is bound to.
    pub selection: PcrSelection,
    /// Expected values, one per PCR in selection order (hex in JSON).
    #[serde(with = "hex_list")]
    pub values: Vec<Vec<u8>>,
}

/// [`Record::name`], [`Record::version`] and [`Record::owner`] from the `name`, `version`,
/// `owner_uid` and `owner_certificate` fields every kind has.
macro_rules! header_fields {
    () => {
        fn name(&self) -> &KeyName {
            &self.name
        }

        fn version(&self) -> u32 {
            self.version
        }

        fn owner(&self) -> Owner {
            Owner::from_fields(self.owner_uid, self.owner_certificate.as_deref())
        }
    };
}

/// What every record kind shares, and what the store's generic table ([`super::Table`]) needs:
/// its name, its format version, how it is written, and the checks a parsed record must pass.
pub trait Record: Serialize + DeserializeOwned {
    /// Written pretty-printed (small records people may read) or compact (sealed records, whose
    /// ciphertext can be megabytes of hex).
    const PRETTY: bool;

    /// The largest file a record of this kind may be: a larger one is refused unread
    /// ([`super::trust::read`]).
    const MAX_FILE: u64;

    /// The record's name (also its file name).
    fn name(&self) -> &KeyName;

    /// The record's format version.
    fn version(&self) -> u32;

    /// Who created the record (owner-only access rules compare the caller with it).
    fn owner(&self) -> Owner;

    /// The checks of this kind beyond the shared header (blob and nonce lengths, sections).
    ///
    /// # Errors
    /// A description of what is wrong.
    fn check(&self) -> Result<(), String>;

    /// Serialises the record: one JSON document and a final newline.
    fn to_bytes(&self) -> Vec<u8> {
        // invariant: serialising structs of strings, numbers and hex strings cannot fail.
        let mut v =
            if Self::PRETTY { serde_json::to_vec_pretty(self) } else { serde_json::to_vec(self) }.unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Parses and checks a record read from the file for `expected`: a known format version,
    /// the record names the key its file is for (so a renamed or swapped file is refused), and
    /// the kind's own [`Record::check`].
    ///
    /// # Errors
    /// A description of what is wrong.
    fn from_bytes(bytes: &[u8], expected: &KeyName) -> Result<Self, String> {
        let record: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if record.version() != RECORD_VERSION {
            return Err(format!("unsupported record version {}", record.version()));
        }
        if record.name() != expected {
            return Err(format!("record names {:?}, file is for {expected:?}", record.name()));
        }
        record.check()?;
        Ok(record)
    }
}

impl Record for KeyRecord {
    const PRETTY: bool = true;
    /// A certificate chain of up to 256 KiB of PEM, the largest post-quantum section (ML-KEM-1024:
    /// a 1,568-byte public key, a 3,168-byte private key, both in hex) and the TPM blobs fit
    /// several times over.
    const MAX_FILE: u64 = 1024 * 1024;

    header_fields!();

    fn check(&self) -> Result<(), String> {
        if self.object.public.is_empty() || self.object.private.is_empty() {
            return Err("empty key blob".into());
        }
        match (&self.pq, self.alg.has_pq()) {
            // The public key is checked as one received from elsewhere: a record edited on disk
            // must not hand out (or encapsulate to) a key that is not one.
            (Some(pq), true) if pq.nonce.len() == 12 => match crate::crypto::pq::pq_part(self.alg) {
                Some(part) => crate::crypto::pq::check_public_key(part, &pq.public_key),
                None => Err(format!("a {} key has no post-quantum part", self.alg)),
            },
            (Some(_), true) => Err("bad post-quantum section".into()),
            (None, true) => Err(format!("a {} key needs its post-quantum section", self.alg)),
            (Some(_), false) => Err(format!("a {} key has no post-quantum section", self.alg)),
            (None, false) => Ok(()),
        }
    }
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
            owner_certificate: None,
            object: TpmObject { tpm_name: vec![0, 11, 1], public: vec![1, 2], private: vec![3, 4] },
            has_auth: false,
            pcr_policy: None,
            cert_chain_pem: None,
            cert_version: 0,
            pq: None,
            usages: None,
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
        // Unknown fields are refused, the flattened TPM object's neighbours included.
        let text = String::from_utf8_lossy(&bytes).replacen("\"has_auth\"", "\"stray\": 1,\n  \"has_auth\"", 1);
        assert!(KeyRecord::from_bytes(text.as_bytes(), &r.name).is_err_and(|e| e.contains("stray")), "{text}");
    }

    #[test]
    fn the_owner_is_the_uid_or_the_certificate() {
        let r = sample();
        assert_eq!(r.owner(), Owner::Uid(0));
        assert!(!String::from_utf8_lossy(&r.to_bytes()).contains("owner_certificate"), "old format kept");
        let (owner_uid, owner_certificate) = Owner::Certificate("CN=agent-1".into()).to_fields();
        let by_tls = KeyRecord { owner_uid, owner_certificate, ..r.clone() };
        let back = KeyRecord::from_bytes(&by_tls.to_bytes(), &r.name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.owner(), Owner::Certificate("CN=agent-1".into()));
        assert_eq!(back.owner_uid, Owner::CERTIFICATE_UID);
    }

    #[test]
    fn usages_are_optional_and_a_record_without_them_has_all() {
        use crate::model::Usage;
        let r = sample();
        assert_eq!(r.usages(), Usages::LEGACY);
        assert!(!String::from_utf8_lossy(&r.to_bytes()).contains("usages"), "old format kept");
        let ssh = KeyRecord { usages: Usages::new([Usage::Ssh, Usage::Sign]), ..r.clone() };
        let text = String::from_utf8_lossy(&ssh.to_bytes()).into_owned();
        assert!(text.contains("\"usages\": [\n    \"sign\",\n    \"ssh\"\n  ]"), "{text}");
        let back = KeyRecord::from_bytes(text.as_bytes(), &r.name).unwrap_or_else(|e| panic!("{e}"));
        assert!(back.usages().contains(Usage::Ssh) && !back.usages().contains(Usage::Policy));
        let legacy = String::from_utf8_lossy(&r.to_bytes()).into_owned();
        let with = |usages: &str| legacy.replacen("\"has_auth\"", &format!("\"usages\": {usages},\n  \"has_auth\""), 1);
        assert_eq!(
            KeyRecord::from_bytes(with("[\"policy\"]").as_bytes(), &r.name).map(|k| k.usages()),
            Ok(Usages::new([Usage::Policy]).unwrap_or(Usages::LEGACY))
        );
        for bad in ["[]", "[\"root\"]", "\"sign\"", "null"] {
            assert!(KeyRecord::from_bytes(with(bad).as_bytes(), &r.name).is_err() || bad == "null", "{bad} accepted");
        }
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
                wrapping_key: Some(TpmObject { tpm_name: vec![0, 11], public: vec![1], private: vec![2] }),
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

    /// The section's public key is checked on every read, as a key from elsewhere is: an ML-DSA
    /// key (a hybrid key's too) of another length and an ML-KEM key of another length or with a
    /// coefficient not below the modulus make the record corrupt.
    #[test]
    fn pq_public_keys_are_checked_when_read() {
        let r = sample();
        let with = |alg: KeyAlg, public_key: Vec<u8>| {
            let wrapping_key = (alg == KeyAlg::HybridP256MlDsa65).then(|| TpmObject {
                tpm_name: vec![0, 11],
                public: vec![1],
                private: vec![2],
            });
            let pq = PqSection { public_key, nonce: vec![1; 12], ciphertext: vec![2; 48], wrapping_key };
            KeyRecord::from_bytes(&KeyRecord { alg, pq: Some(pq), ..r.clone() }.to_bytes(), &r.name).map(|_| ())
        };
        for (alg, len) in [
            (KeyAlg::MlDsa44, 1312),
            (KeyAlg::MlDsa65, 1952),
            (KeyAlg::MlDsa87, 2592),
            (KeyAlg::HybridP256MlDsa65, 1952),
            (KeyAlg::MlKem768, 1184),
            (KeyAlg::MlKem1024, 1568),
        ] {
            assert_eq!(with(alg, vec![0; len]), Ok(()), "{alg}");
            for bad in [0, len - 1, len + 1] {
                let err = with(alg, vec![0; bad]).expect_err("wrong length accepted");
                assert!(err.contains(&format!("is {bad} bytes, not {len}")), "{alg}: {err}");
            }
        }
        let mut ek = vec![0; 1184];
        ek[1] = 0xf0;
        ek[2] = 0xff;
        let err = with(KeyAlg::MlKem768, ek).expect_err("coefficient 4095 accepted");
        assert!(err.contains("coefficient 1 is 4095"), "{err}");
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
    /// The creating TLS client's certificate identity (subject or SPIFFE ID); absent for a
    /// local client (and in records older than it), whose uid is `owner_uid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_certificate: Option<String>,
    /// Authorization of the sealed object.
    pub policy: SealPolicy,
    /// The sealed object's authPolicy digest.
    #[serde(with = "hex_bytes")]
    pub policy_digest: Vec<u8>,
    /// The sealed object (holding the 256-bit key).
    #[serde(flatten)]
    pub object: TpmObject,
    /// AES-256-GCM nonce (96 bits).
    #[serde(with = "hex_bytes")]
    pub nonce: Vec<u8>,
    /// AES-256-GCM ciphertext with tag; associated data is the record name.
    #[serde(with = "hex_bytes")]
    pub ciphertext: Vec<u8>,
}

impl Record for SealedRecord {
    const PRETTY: bool = false;
    /// The ciphertext of the largest secret Seal takes (64 MiB, `rpc::seal::MAX_SECRET`, checked
    /// there against this cap) in hex, plus room for the rest.
    const MAX_FILE: u64 = 2 * 64 * 1024 * 1024 + 1024 * 1024;

    header_fields!();

    fn check(&self) -> Result<(), String> {
        if self.nonce.len() != 12 {
            return Err("bad nonce length".into());
        }
        Ok(())
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
    /// The creating TLS client's certificate identity (subject or SPIFFE ID); absent for a
    /// local client (and in records older than it), whose uid is `owner_uid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_certificate: Option<String>,
    /// Random id written into every stream header, so a stream names the key generation that
    /// encrypted it.
    #[serde(with = "hex_bytes")]
    pub key_id: Vec<u8>,
    /// PCR binding of the sealed object, if any.
    pub pcr_policy: Option<PcrPolicy>,
    /// The sealed object (holding the 256-bit key).
    #[serde(flatten)]
    pub object: TpmObject,
}

impl Record for DataKeyRecord {
    const PRETTY: bool = true;
    /// A sealed 256-bit key, a PCR policy and a key id: a few KiB.
    const MAX_FILE: u64 = 64 * 1024;

    header_fields!();

    fn check(&self) -> Result<(), String> {
        if self.key_id.len() != 16 {
            return Err("bad key id".into());
        }
        Ok(())
    }
}
