//! Validated domain types shared by every layer: key names, algorithms, hashes, schemes and
//! PCR selections.
//!
//! Input from the network is parsed into these types at the `rpc/` edge ("parse, don't
//! validate"), so the store and the TPM layer only ever see valid values. This module owns no
//! I/O and no TPM types.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tpm_vault_proto::algorithm::{self, Algorithm, Family, TpmKey};
use tpm_vault_proto::v1::{HashAlgorithm, KeyAlgorithm, SignatureScheme};

/// Input that is not a valid domain value: the message names the field and the rule. The RPC
/// layer answers it as INVALID_ARGUMENT (`Error::InvalidArgument`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

/// A key name: `[a-z0-9][a-z0-9._-]{0,63}`. Anything else (paths, upper case, empty) is refused,
/// so a name is always a safe file name and a safe glob subject.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyName(String);

impl KeyName {
    /// Longest accepted name, in bytes.
    pub const MAX_LEN: usize = 64;

    /// The attestation key's record name (kept apart from user keys in the store).
    pub(crate) fn attestation_key() -> Self {
        Self("ak".to_owned())
    }

    /// The RSA attestation key's record name.
    pub(crate) fn attestation_key_rsa() -> Self {
        Self("ak-rsa".to_owned())
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for KeyName {
    type Error = InvalidInput;

    fn try_from(s: &str) -> Result<Self, InvalidInput> {
        let bytes = s.as_bytes();
        let valid_first = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let valid_rest = |b: u8| valid_first(b) || matches!(b, b'.' | b'_' | b'-');
        let ok = !bytes.is_empty()
            && bytes.len() <= Self::MAX_LEN
            && valid_first(bytes[0])
            && bytes[1..].iter().all(|&b| valid_rest(b));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidInput(format!(
                "invalid key name {:?}: must match [a-z0-9][a-z0-9._-]{{0,63}}",
                truncate_for_message(s)
            )))
        }
    }
}

impl TryFrom<String> for KeyName {
    type Error = InvalidInput;

    fn try_from(s: String) -> Result<Self, InvalidInput> {
        Self::try_from(s.as_str())
    }
}

impl From<KeyName> for String {
    fn from(n: KeyName) -> String {
        n.0
    }
}

impl fmt::Display for KeyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who created a record: owner-only access rules compare the caller with it. A record keeps
/// it as `owner_uid` plus, for a TLS client, `owner_certificate` (see `store::record`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A local client on the Unix socket, by uid.
    Uid(u32),
    /// A client of the TLS listener, by its certificate identity (subject or SPIFFE ID).
    Certificate(String),
}

impl Owner {
    /// The `owner_uid` a record made by a TLS client holds: `(uid_t)-1`, which no process can
    /// have (`setuid(-1)` means "leave unchanged"), so no local client ever matches it.
    pub const CERTIFICATE_UID: u32 = u32::MAX;

    /// The owner a record's `owner_uid` and `owner_certificate` fields name.
    pub fn from_fields(uid: u32, certificate: Option<&str>) -> Self {
        match certificate {
            Some(c) => Self::Certificate(c.to_owned()),
            None => Self::Uid(uid),
        }
    }

    /// The record fields for this owner: `owner_uid` and `owner_certificate`.
    pub fn to_fields(&self) -> (u32, Option<String>) {
        match self {
            Self::Uid(u) => (*u, None),
            Self::Certificate(c) => (Self::CERTIFICATE_UID, Some(c.clone())),
        }
    }
}

impl From<u32> for Owner {
    fn from(uid: u32) -> Self {
        Self::Uid(uid)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uid(u) => write!(f, "uid {u}"),
            Self::Certificate(c) => write!(f, "certificate {c:?}"),
        }
    }
}

/// Shortens untrusted input before it is echoed in an error message.
pub(crate) fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 80;
    if s.len() <= MAX {
        s.to_owned()
    } else {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    }
}

/// Key algorithm: an API [`KeyAlgorithm`] that is never `Unspecified`. ECC and RSA private parts
/// are generated inside the TPM; TPMs cannot do ML-DSA or ML-KEM, so those are generated in-core
/// and sealed by the TPM (see `vault::pq`). What each algorithm is (its TPM key, schemes,
/// hashes, OIDs...) is in the one table [`tpm_vault_proto::algorithm`]; records store its name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
pub struct KeyAlg(KeyAlgorithm);

// The constants stand for the API's values and read like the enum variants they replace, in
// expressions and in patterns alike.
#[allow(non_upper_case_globals)]
impl KeyAlg {
    /// ECDSA on NIST P-256.
    pub const EccP256: KeyAlg = KeyAlg(KeyAlgorithm::EccP256);
    /// ECDSA on NIST P-384.
    pub const EccP384: KeyAlg = KeyAlg(KeyAlgorithm::EccP384);
    /// RSA with a 2048-bit modulus.
    pub const Rsa2048: KeyAlg = KeyAlg(KeyAlgorithm::Rsa2048);
    /// RSA with a 3072-bit modulus.
    pub const Rsa3072: KeyAlg = KeyAlg(KeyAlgorithm::Rsa3072);
    /// ML-DSA-44 (FIPS 204), TPM-sealed.
    pub const MlDsa44: KeyAlg = KeyAlg(KeyAlgorithm::MlDsa44);
    /// ML-DSA-65 (FIPS 204), TPM-sealed.
    pub const MlDsa65: KeyAlg = KeyAlg(KeyAlgorithm::MlDsa65);
    /// ML-DSA-87 (FIPS 204), TPM-sealed.
    pub const MlDsa87: KeyAlg = KeyAlg(KeyAlgorithm::MlDsa87);
    /// ML-KEM-768 (FIPS 203), TPM-sealed; decapsulation only.
    pub const MlKem768: KeyAlg = KeyAlg(KeyAlgorithm::MlKem768);
    /// ML-KEM-1024 (FIPS 203), TPM-sealed; decapsulation only.
    pub const MlKem1024: KeyAlg = KeyAlg(KeyAlgorithm::MlKem1024);
    /// An ECC P-256 key in the TPM paired with a TPM-sealed ML-DSA-65 key, for hybrid signatures.
    pub const HybridP256MlDsa65: KeyAlg = KeyAlg(KeyAlgorithm::HybridP256MlDsa65);
}

impl KeyAlg {
    /// Every algorithm, in documentation order.
    pub fn all() -> impl Iterator<Item = KeyAlg> {
        algorithm::ALL.iter().map(|a| KeyAlg(a.id))
    }

    /// The algorithm of an API value; `None` for `Unspecified`.
    pub fn from_api(alg: KeyAlgorithm) -> Option<KeyAlg> {
        alg.info().map(|_| KeyAlg(alg))
    }

    /// The API value.
    pub fn api(self) -> KeyAlgorithm {
        self.0
    }

    /// The algorithm's row of [`tpm_vault_proto::algorithm`].
    pub fn info(self) -> &'static Algorithm {
        // invariant: a KeyAlg is only made from a value with a row (`from_api`, the constants,
        // `all`), so the fallback row is never used.
        self.0.info().unwrap_or(&algorithm::ALL[0])
    }

    /// The CLI / file-format name (`ecc-p256`, ...).
    pub fn as_str(self) -> &'static str {
        self.info().name
    }

    /// The algorithm of the key that lives in the TPM: the key itself for ECC and RSA, the
    /// ECDSA half (P-256) of a hybrid key, none for ML-DSA and ML-KEM keys (whose TPM object is
    /// the sealed wrapping key).
    pub fn tpm_key(self) -> Option<TpmKey> {
        self.info().tpm_key
    }

    /// True for the keys that carry TPM-sealed post-quantum material (ML-DSA, ML-KEM, hybrid).
    pub fn has_pq(self) -> bool {
        self.info().pq.is_some()
    }

    /// True for ML-KEM keys.
    pub fn is_kem(self) -> bool {
        self.info().family == Family::MlKem
    }

    /// True for ML-DSA keys (not hybrid ones).
    pub fn is_ml_dsa(self) -> bool {
        self.info().family == Family::MlDsa
    }

    /// True for the RSA algorithms.
    pub fn is_rsa(self) -> bool {
        self.info().family == Family::Rsa
    }

    /// The hash used when the caller names none.
    pub fn default_hash(self) -> HashAlg {
        HashAlg::from_api(self.info().default_hash).unwrap_or(HashAlg::Sha256)
    }

    /// The scheme used when the caller names none (ML-KEM keys do not sign; theirs is refused
    /// by [`KeyAlg::check_scheme`]).
    pub fn default_scheme(self) -> Scheme {
        self.info().default_scheme().and_then(Scheme::from_api).unwrap_or(Scheme::MlDsa)
    }

    /// Checks that `scheme` can be used with this key.
    ///
    /// # Errors
    /// [`InvalidInput`] naming the pair when it does not fit.
    pub fn check_scheme(self, scheme: Scheme) -> Result<(), InvalidInput> {
        if self.is_kem() {
            return Err(InvalidInput(format!(
                "a {} key does not sign; it decapsulates (Decapsulate, `tpm-vault kem decap`)",
                self.as_str()
            )));
        }
        if self.info().signs_with(scheme.api()) {
            Ok(())
        } else {
            Err(InvalidInput(format!("scheme {} is not supported by a {} key", scheme.as_str(), self.as_str())))
        }
    }
}

impl FromStr for KeyAlg {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, InvalidInput> {
        algorithm::by_name(s).map(|a| KeyAlg(a.id)).ok_or_else(|| {
            let names: Vec<&str> = algorithm::names().collect();
            InvalidInput(format!(
                "unknown key algorithm {:?} (expected one of {})",
                truncate_for_message(s),
                names.join(", ")
            ))
        })
    }
}

impl TryFrom<String> for KeyAlg {
    type Error = InvalidInput;

    fn try_from(s: String) -> Result<Self, InvalidInput> {
        s.parse()
    }
}

impl From<KeyAlg> for &'static str {
    fn from(a: KeyAlg) -> &'static str {
        a.as_str()
    }
}

impl fmt::Debug for KeyAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for KeyAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Hash algorithm for signatures. SHA-256 is preferred: Arm cores accelerate it, not SHA-512.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HashAlg {
    /// SHA-256.
    #[serde(rename = "sha256")]
    Sha256,
    /// SHA-384.
    #[serde(rename = "sha384")]
    Sha384,
    /// SHA-512 (where the TPM has it).
    #[serde(rename = "sha512")]
    Sha512,
    /// SHA-1: legacy, only for RSASSA-PKCS1-v1_5 over a digest the caller made (see
    /// [`HashAlg::check_use`]).
    #[serde(rename = "sha1")]
    Sha1,
}

impl HashAlg {
    /// The hash of an API value; `None` for `Unspecified`.
    pub fn from_api(hash: HashAlgorithm) -> Option<HashAlg> {
        match hash {
            HashAlgorithm::Unspecified => None,
            HashAlgorithm::Sha256 => Some(Self::Sha256),
            HashAlgorithm::Sha384 => Some(Self::Sha384),
            HashAlgorithm::Sha512 => Some(Self::Sha512),
            HashAlgorithm::Sha1 => Some(Self::Sha1),
        }
    }

    /// The API value.
    pub fn api(self) -> HashAlgorithm {
        match self {
            Self::Sha256 => HashAlgorithm::Sha256,
            Self::Sha384 => HashAlgorithm::Sha384,
            Self::Sha512 => HashAlgorithm::Sha512,
            Self::Sha1 => HashAlgorithm::Sha1,
        }
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha384 => 48,
            Self::Sha512 => 64,
            Self::Sha1 => 20,
        }
    }

    /// Name as used by the CLI and OpenSSL.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
            Self::Sha1 => "sha1",
        }
    }

    /// Refuses SHA-1 except for RSASSA-PKCS1-v1_5 over a precomputed digest: the vault never
    /// hashes a message with SHA-1, and never signs a SHA-1 digest in a scheme that has a
    /// modern use (ECDSA and PSS callers can always use SHA-256).
    ///
    /// # Errors
    /// `InvalidArgument` naming the rule.
    pub fn check_use(self, scheme: Scheme, digest_given: bool) -> Result<(), InvalidInput> {
        if self == Self::Sha1 && !(scheme == Scheme::RsaPkcs1 && digest_given) {
            return Err(InvalidInput(
                "SHA-1 is accepted only for RSA PKCS#1 v1.5 signatures of a precomputed digest (legacy)".into(),
            ));
        }
        Ok(())
    }

    /// Hashes `data` in-core (aws-lc-rs: SHA extensions / SHA-NI where the CPU has them).
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        let alg = match self {
            Self::Sha256 => &aws_lc_rs::digest::SHA256,
            Self::Sha384 => &aws_lc_rs::digest::SHA384,
            Self::Sha512 => &aws_lc_rs::digest::SHA512,
            Self::Sha1 => &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
        };
        aws_lc_rs::digest::digest(alg, data).as_ref().to_vec()
    }
}

/// Signature scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scheme {
    /// ECDSA; output is DER `ECDSA-Sig-Value`.
    #[serde(rename = "ecdsa")]
    Ecdsa,
    /// RSASSA-PSS with salt length = hash length (what TLS 1.3 requires).
    #[serde(rename = "pss")]
    RsaPss,
    /// RSASSA-PKCS1-v1_5.
    #[serde(rename = "pkcs1")]
    RsaPkcs1,
    /// ML-DSA (FIPS 204, pure, empty context) over the whole message.
    #[serde(rename = "ml-dsa")]
    MlDsa,
    /// ECDSA P-256 (TPM) + ML-DSA-65 (sealed) over the same message, in the
    /// [`tpm_vault_proto::hybrid`] format.
    #[serde(rename = "hybrid")]
    Hybrid,
}

impl Scheme {
    /// The scheme of an API value; `None` for `Unspecified`.
    pub fn from_api(scheme: SignatureScheme) -> Option<Scheme> {
        match scheme {
            SignatureScheme::Unspecified => None,
            SignatureScheme::Ecdsa => Some(Self::Ecdsa),
            SignatureScheme::RsaPss => Some(Self::RsaPss),
            SignatureScheme::RsaPkcs1 => Some(Self::RsaPkcs1),
            SignatureScheme::MlDsa => Some(Self::MlDsa),
            SignatureScheme::Hybrid => Some(Self::Hybrid),
        }
    }

    /// The API value.
    pub fn api(self) -> SignatureScheme {
        match self {
            Self::Ecdsa => SignatureScheme::Ecdsa,
            Self::RsaPss => SignatureScheme::RsaPss,
            Self::RsaPkcs1 => SignatureScheme::RsaPkcs1,
            Self::MlDsa => SignatureScheme::MlDsa,
            Self::Hybrid => SignatureScheme::Hybrid,
        }
    }

    /// Name as used by the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ecdsa => "ecdsa",
            Self::RsaPss => "pss",
            Self::RsaPkcs1 => "pkcs1",
            Self::MlDsa => "ml-dsa",
            Self::Hybrid => "hybrid",
        }
    }
}

/// What a key may be used for (a key's usages are fixed at creation and only ever narrowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Usage {
    /// Raw signatures over any message or digest: TLS, PKCS#11, CSRs, certificates.
    #[serde(rename = "sign")]
    Sign,
    /// SSH signatures only: over what parses as an SSH user-authentication request or an
    /// SSHSIG blob ([`crate::crypto::ssh`]).
    #[serde(rename = "ssh")]
    Ssh,
    /// PCR-policy approvals only (SignPolicy).
    #[serde(rename = "policy")]
    Policy,
}

impl Usage {
    /// Every usage, in documentation order.
    pub const ALL: [Usage; 3] = [Self::Sign, Self::Ssh, Self::Policy];

    /// The CLI / record name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sign => "sign",
            Self::Ssh => "ssh",
            Self::Policy => "policy",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Self::Sign => 1,
            Self::Ssh => 2,
            Self::Policy => 4,
        }
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A non-empty set of [`Usage`]s. In a key record: a list of names (`["sign"]`); a record
/// without the field predates usages and has all of them ([`Usages::LEGACY`]), which is what
/// such a key could do.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<Usage>", into = "Vec<Usage>")]
pub struct Usages(u8);

impl Usages {
    /// What a key created without `--usage` may do: raw signatures.
    pub const DEFAULT: Usages = Usages(1);
    /// What a key from before usages may do: everything it could then.
    pub const LEGACY: Usages = Usages(7);

    /// The set of `usages`; `None` when it is empty.
    pub fn new(usages: impl IntoIterator<Item = Usage>) -> Option<Usages> {
        let bits = usages.into_iter().fold(0, |acc, u| acc | u.bit());
        (bits != 0).then_some(Usages(bits))
    }

    /// Whether `usage` is in the set.
    pub fn contains(self, usage: Usage) -> bool {
        self.0 & usage.bit() != 0
    }

    /// Whether every usage of `self` is in `other`.
    pub fn is_subset_of(self, other: Usages) -> bool {
        self.0 & !other.0 == 0
    }

    /// The usages in documentation order.
    pub fn iter(self) -> impl Iterator<Item = Usage> {
        Usage::ALL.into_iter().filter(move |u| self.contains(*u))
    }
}

impl fmt::Debug for Usages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl fmt::Display for Usages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Usage::as_str).collect();
        f.write_str(&names.join(","))
    }
}

impl TryFrom<Vec<Usage>> for Usages {
    type Error = String;

    fn try_from(v: Vec<Usage>) -> Result<Usages, String> {
        Usages::new(v).ok_or_else(|| "a key needs at least one usage".to_owned())
    }
}

impl From<Usages> for Vec<Usage> {
    fn from(u: Usages) -> Vec<Usage> {
        u.iter().collect()
    }
}

/// What a signature covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignInput {
    /// A message, hashed in-core by the daemon (never on the TPM).
    Message(Vec<u8>),
    /// A precomputed digest whose length must match the hash.
    Digest(Vec<u8>),
}

impl SignInput {
    /// The largest message accepted for in-daemon hashing.
    pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

    /// Returns the digest to sign, hashing a message or checking a digest's length.
    ///
    /// # Errors
    /// [`InvalidInput`] for a digest of the wrong length or an oversize message.
    pub fn into_digest(self, hash: HashAlg) -> Result<Vec<u8>, InvalidInput> {
        match self {
            Self::Message(m) if m.len() > Self::MAX_MESSAGE => Err(InvalidInput(format!(
                "message of {} bytes exceeds the {} byte limit; send a digest instead",
                m.len(),
                Self::MAX_MESSAGE
            ))),
            Self::Message(m) => Ok(hash.digest(&m)),
            Self::Digest(d) if d.len() == hash.digest_len() => Ok(d),
            Self::Digest(d) => Err(InvalidInput(format!(
                "digest is {} bytes but {} needs {}",
                d.len(),
                hash.as_str(),
                hash.digest_len()
            ))),
        }
    }
}

/// A PCR bank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PcrBank {
    /// SHA-1 bank.
    #[serde(rename = "sha1")]
    Sha1,
    /// SHA-256 bank (the default).
    #[serde(rename = "sha256")]
    Sha256,
    /// SHA-384 bank.
    #[serde(rename = "sha384")]
    Sha384,
}

impl PcrBank {
    /// Bank name (`sha256`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sha1 => "sha1",
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
        }
    }

    /// PCR value length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Self::Sha1 => 20,
            Self::Sha256 => 32,
            Self::Sha384 => 48,
        }
    }
}

impl FromStr for PcrBank {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, InvalidInput> {
        match s {
            "" | "sha256" => Ok(Self::Sha256),
            "sha1" => Ok(Self::Sha1),
            "sha384" => Ok(Self::Sha384),
            other => Err(InvalidInput(format!(
                "unknown PCR bank {:?} (expected sha1, sha256 or sha384)",
                truncate_for_message(other)
            ))),
        }
    }
}

/// What a PCR-bound object is bound to: these PCRs, at the given values (in selection order)
/// or, when `values` is `None`, at their values when the object is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcrTarget {
    /// The bank and the PCRs of it the object is bound to.
    pub selection: PcrSelection,
    /// Expected values; `None` = the current ones.
    pub values: Option<Vec<Vec<u8>>>,
}

/// A set of PCR indices in one bank, sorted and without duplicates.
///
/// Deserialising (state records) checks the same invariants as [`PcrSelection::new`] and also
/// that the stored indices are already in canonical order, since stored PCR values follow it:
/// a record edited or corrupted on disk is refused when read instead of reaching the TPM code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StoredPcrSelection")]
pub struct PcrSelection {
    /// The bank.
    pub bank: PcrBank,
    /// Indices 0-23, ascending.
    pub pcrs: Vec<u8>,
}

impl PcrSelection {
    /// Highest PCR index on a PC-client TPM.
    pub const MAX_INDEX: u32 = 23;
    /// The PCR a binding uses when the request names none: 9, where boot loaders measure the
    /// kernel and initrd (so a secret sealed to it opens only under the same boot).
    pub const DEFAULT_INDEX: u32 = 9;

    /// The default binding: [`PcrSelection::DEFAULT_INDEX`] of `bank`.
    pub fn default_in(bank: PcrBank) -> Self {
        Self { bank, pcrs: vec![Self::DEFAULT_INDEX as u8] }
    }

    /// Builds a selection, sorting and de-duplicating the indices.
    ///
    /// # Errors
    /// [`InvalidInput`] for an empty list or an index above 23.
    pub fn new(bank: PcrBank, indices: &[u32]) -> Result<Self, InvalidInput> {
        if indices.is_empty() {
            return Err(InvalidInput("empty PCR selection".into()));
        }
        let mut pcrs = Vec::with_capacity(indices.len());
        for &i in indices {
            if i > Self::MAX_INDEX {
                return Err(InvalidInput(format!("PCR index {i} out of range 0-{}", Self::MAX_INDEX)));
            }
            pcrs.push(i as u8);
        }
        pcrs.sort_unstable();
        pcrs.dedup();
        Ok(Self { bank, pcrs })
    }
}

/// The serialised form of a [`PcrSelection`], before its checks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredPcrSelection {
    bank: PcrBank,
    pcrs: Vec<u8>,
}

impl TryFrom<StoredPcrSelection> for PcrSelection {
    type Error = InvalidInput;

    fn try_from(raw: StoredPcrSelection) -> Result<Self, InvalidInput> {
        let indices: Vec<u32> = raw.pcrs.iter().map(|&i| u32::from(i)).collect();
        let sel = Self::new(raw.bank, &indices)?;
        if sel.pcrs != raw.pcrs {
            return Err(InvalidInput("PCR indices are not in ascending order without duplicates".into()));
        }
        Ok(sel)
    }
}

impl fmt::Display for PcrSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.bank.as_str())?;
        for (i, p) in self.pcrs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_follow_the_spec() {
        for good in ["a", "web", "0", "web-1.prod_x", &"a".repeat(64)] {
            assert!(KeyName::try_from(good).is_ok(), "{good}");
        }
        for bad in ["", "../x", "Web", "-a", ".a", "a/b", "a b", "é", &"a".repeat(65), "a\0"] {
            assert!(matches!(KeyName::try_from(bad), Err(InvalidInput(_))), "{bad:?}");
        }
    }

    #[test]
    fn digest_length_is_checked() {
        let d = SignInput::Digest(vec![0; 31]).into_digest(HashAlg::Sha256);
        assert!(matches!(d, Err(InvalidInput(m)) if m.contains("31 bytes")));
        assert_eq!(SignInput::Digest(vec![1; 48]).into_digest(HashAlg::Sha384).ok(), Some(vec![1; 48]));
        let m = SignInput::Message(b"abc".to_vec()).into_digest(HashAlg::Sha256).ok();
        assert_eq!(
            m.map(hex::encode).as_deref(),
            Some("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
    }

    #[test]
    fn schemes_must_fit_the_key() {
        assert!(KeyAlg::EccP256.check_scheme(Scheme::Ecdsa).is_ok());
        assert!(KeyAlg::EccP256.check_scheme(Scheme::RsaPss).is_err());
        assert!(KeyAlg::Rsa2048.check_scheme(Scheme::Ecdsa).is_err());
        assert!(KeyAlg::Rsa3072.check_scheme(Scheme::RsaPkcs1).is_ok());
        assert!(KeyAlg::MlDsa65.check_scheme(Scheme::MlDsa).is_ok());
        assert!(KeyAlg::MlDsa65.check_scheme(Scheme::Ecdsa).is_err());
        assert!(KeyAlg::EccP256.check_scheme(Scheme::MlDsa).is_err());
        assert!(KeyAlg::HybridP256MlDsa65.check_scheme(Scheme::Hybrid).is_ok());
        assert!(KeyAlg::HybridP256MlDsa65.check_scheme(Scheme::Ecdsa).is_err());
        assert!(
            matches!(KeyAlg::MlKem768.check_scheme(Scheme::MlDsa), Err(InvalidInput(m)) if m.contains("decapsulates"))
        );
    }

    #[test]
    fn algorithm_names_round_trip() {
        for alg in KeyAlg::all() {
            assert_eq!(alg.as_str().parse::<KeyAlg>().ok(), Some(alg));
            assert_eq!(serde_json::to_string(&alg).ok(), Some(format!("\"{}\"", alg.as_str())));
        }
        assert_eq!(KeyAlg::HybridP256MlDsa65.tpm_key(), KeyAlg::EccP256.tpm_key());
        assert_eq!(KeyAlg::MlKem1024.tpm_key(), None);
        assert!(!KeyAlg::Rsa2048.has_pq() && KeyAlg::MlDsa44.has_pq() && KeyAlg::HybridP256MlDsa65.has_pq());
    }

    #[test]
    fn pcr_selection_sorts_and_bounds() {
        let s = PcrSelection::new(PcrBank::Sha256, &[9, 0, 9]).ok();
        assert_eq!(s.map(|s| s.to_string()).as_deref(), Some("sha256:0,9"));
        assert!(PcrSelection::new(PcrBank::Sha256, &[24]).is_err());
        assert!(PcrSelection::new(PcrBank::Sha256, &[]).is_err());
    }
}
