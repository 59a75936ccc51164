//! Secrets sealed for a device from anywhere (`tpm-vault seal-for`, `seal import`): the blob
//! format both sides agree on, and the software half of TPM 2.0 duplication that makes it.
//!
//! [`wrap`] builds a sealed data object (a `TPMT_PUBLIC` of type KEYEDHASH with a policy
//! digest computed in software, and its `TPMT_SENSITIVE`) and wraps it for a storage key
//! the sealing machine only knows the public area of, as TPM 2.0 Part 1 "Duplication" and
//! "Protected storage" describe the outer wrapper (no inner wrapper):
//! - seed: ECDH of an ephemeral P-256 key with the storage key, then
//!   `seed = KDFe(SHA-256, Z, "DUPLICATE", ephemeral.x, storage.x, 256)`; the encrypted seed
//!   is the ephemeral point (`TPMS_ECC_POINT`);
//! - `symKey = KDFa(SHA-256, seed, "STORAGE", name, "", 128)`, AES-128-CFB (IV zero) over the
//!   marshalled `TPM2B_SENSITIVE`;
//! - `hmacKey = KDFa(SHA-256, seed, "INTEGRITY", "", "", 256)`, `outerHMAC = HMAC(hmacKey,
//!   encSensitive || name)`; duplicate = `TPM2B_DIGEST(outerHMAC) || encSensitive`.
//!
//! Only that storage key's TPM can `TPM2_Import` the result (another TPM's integrity check
//! fails); the object is neither fixedTPM nor fixedParent (an imported object cannot be) but
//! its policy has no `PolicyCommandCode(Duplicate)`, so it cannot be duplicated again.
//!
//! Blob format, version 1 (all integers big-endian; see README "Secrets for a fleet"):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `TPMVSFB\0` |
//! | 1 | version (1) |
//! | 1 | flags: bit 0 = an AEAD payload follows |
//! | 1 + n | name the secret was sealed for (length, ASCII; may be empty) |
//! | 1 | policy kind: 1 = PolicyPCR, 2 = PolicyAuthorize over PCRs |
//! | 2 | PCR bank (`TPM_ALG_ID`: 0x000b = sha256) |
//! | 1 + k | PCR indices (count, then one byte each, ascending) |
//! | k × d | kind 1: the PCR values (d = bank digest length) |
//! | 2 + m | kind 2: the authority's DER SubjectPublicKeyInfo (ECC P-256) |
//! | 2 + p | `TPM2B_PUBLIC` of the sealed object |
//! | 2 + q | `TPM2B_PRIVATE`: the duplicate |
//! | 2 + s | `TPM2B_ENCRYPTED_SECRET`: the encrypted seed |
//! | 12 | flag 0 set: AES-256-GCM nonce |
//! | 4 + c | flag 0 set: ciphertext and tag; associated data = the name |
//!
//! Without a payload the sealed object holds the secret itself (at most [`MAX_DIRECT`]
//! bytes), so tpm2-tools can unseal it too; with one it holds the AES-256 key of the payload.

use aws_lc_rs::{aead, agreement, cipher, hmac, rand};
use zeroize::Zeroizing;

use crate::policy_digest::{self, sha256, PolicyError, ALG_SHA256};

/// Magic at the start of a blob.
pub const MAGIC: &[u8; 8] = b"TPMVSFB\0";
/// The blob format version this code writes.
pub const VERSION: u8 = 1;
/// Largest secret a sealed object holds directly (`MAX_SYM_DATA` of the TPM).
pub const MAX_DIRECT: usize = 128;
/// Largest blob accepted (64 MiB, what the daemon's SealService takes in one message).
pub const MAX_BLOB: usize = 64 * 1024 * 1024;
/// Largest secret `seal_for` takes: room is left in [`MAX_BLOB`] for the rest of the blob.
pub const MAX_SECRET: usize = MAX_BLOB - 4096;
/// Flag: an AEAD payload follows.
const FLAG_PAYLOAD: u8 = 1;

/// TPM_ALG_ECC.
const ALG_ECC: u16 = 0x0023;
/// TPM_ALG_KEYEDHASH.
const ALG_KEYEDHASH: u16 = 0x0008;
/// TPM_ALG_NULL.
const ALG_NULL: u16 = 0x0010;
/// TPM_ALG_AES.
const ALG_AES: u16 = 0x0006;
/// TPM_ALG_CFB.
const ALG_CFB: u16 = 0x0043;
/// TPM_ECC_NIST_P256.
const CURVE_P256: u16 = 0x0003;
/// objectAttributes bits.
const ATTR_USER_WITH_AUTH: u32 = 1 << 6;
const ATTR_ADMIN_WITH_POLICY: u32 = 1 << 7;
const ATTR_NO_DA: u32 = 1 << 10;
const ATTR_RESTRICTED: u32 = 1 << 16;
const ATTR_DECRYPT: u32 = 1 << 17;
const ATTR_SIGN: u32 = 1 << 18;
/// The TCG SRK template's attributes: fixedTPM | fixedParent | sensitiveDataOrigin |
/// userWithAuth | noDA | restricted | decrypt.
const SRK_ATTRIBUTES: u32 = 0x0003_0472;

/// Why a blob or a storage key is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    /// The bytes are not a blob of this format (or are cut short or have bytes left over).
    #[error("not a tpm-vault sealed blob: {0}")]
    Malformed(String),
    /// A newer format version.
    #[error("sealed blob version {0} is not supported (this build reads version 1)")]
    Version(u8),
    /// The storage key is not one a sealed object can be wrapped for.
    #[error("not a storage key: {0}")]
    NotStorageKey(String),
    /// The policy cannot be computed.
    #[error("policy: {0}")]
    Policy(#[from] PolicyError),
    /// The secret is empty or too large.
    #[error("secret: {0}")]
    Secret(String),
    /// The system's cryptography failed (random numbers, key agreement).
    #[error("cryptography failed: {0}")]
    Crypto(&'static str),
}

/// What the sealed object's policy is, as the device must satisfy it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobPolicy {
    /// `TPM2_PolicyPCR` over these PCRs at these values.
    Pcr {
        /// Bank (`TPM_ALG_ID`).
        bank: u16,
        /// PCR indices, ascending.
        pcrs: Vec<u8>,
        /// One value per index.
        values: Vec<Vec<u8>>,
    },
    /// `TPM2_PolicyAuthorize` by this authority over PolicyPCR of these PCRs.
    Authorized {
        /// Bank (`TPM_ALG_ID`).
        bank: u16,
        /// PCR indices the approvals cover.
        pcrs: Vec<u8>,
        /// The authority's DER SubjectPublicKeyInfo (ECC P-256).
        authority_spki: Vec<u8>,
    },
}

impl BlobPolicy {
    /// The policy digest (the sealed object's authPolicy).
    ///
    /// # Errors
    /// [`BlobError::Policy`] when it cannot be computed.
    pub fn digest(&self) -> Result<Vec<u8>, BlobError> {
        match self {
            Self::Pcr { bank, pcrs, values } => Ok(policy_digest::policy_pcr(*bank, pcrs, values)?),
            Self::Authorized { bank, pcrs, authority_spki } => {
                policy_digest::bank_digest_len(*bank)?;
                policy_digest::marshal_selection(*bank, pcrs)?;
                let point = spki_p256_point(authority_spki).ok_or(PolicyError::Authority)?;
                Ok(policy_digest::policy_authorize(&policy_digest::authority_name(&point)?, &[]))
            }
        }
    }
}

/// A parsed (or to-be-written) blob.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedBlob {
    /// The name it was sealed for (associated data of the payload); may be empty.
    pub name: String,
    /// The sealed object's policy.
    pub policy: BlobPolicy,
    /// `TPMT_PUBLIC` of the sealed object (without the TPM2B size).
    pub public: Vec<u8>,
    /// The duplicate (`TPM2B_PRIVATE` contents).
    pub duplicate: Vec<u8>,
    /// The encrypted seed (`TPM2B_ENCRYPTED_SECRET` contents).
    pub encrypted_seed: Vec<u8>,
    /// AES-256-GCM nonce and ciphertext+tag of a large secret, keyed by what the object seals.
    pub payload: Option<([u8; 12], Vec<u8>)>,
}

impl std::fmt::Debug for SealedBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedBlob")
            .field("name", &self.name)
            .field("policy", &self.policy)
            .field("payload", &self.payload.as_ref().map(|(_, c)| c.len()))
            .finish_non_exhaustive()
    }
}

/// A byte reader over a blob: every read is checked.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], BlobError> {
        if self.rest.len() < n {
            return Err(BlobError::Malformed(format!("cut short in {what}")));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }
    fn u8(&mut self, what: &str) -> Result<u8, BlobError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, BlobError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, BlobError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn tpm2b(&mut self, what: &str) -> Result<&'a [u8], BlobError> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }
}

fn put_tpm2b(out: &mut Vec<u8>, data: &[u8]) -> Result<(), BlobError> {
    let n = u16::try_from(data.len()).map_err(|_| BlobError::Malformed("field over 65535 bytes".into()))?;
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(data);
    Ok(())
}

impl SealedBlob {
    /// Parses a blob; every length is checked and nothing may follow it.
    ///
    /// # Errors
    /// [`BlobError::Malformed`] / [`BlobError::Version`].
    pub fn parse(bytes: &[u8]) -> Result<Self, BlobError> {
        if bytes.len() > MAX_BLOB {
            return Err(BlobError::Malformed(format!("{} bytes, more than {MAX_BLOB}", bytes.len())));
        }
        let mut r = Reader { rest: bytes };
        if r.take(MAGIC.len(), "magic").ok() != Some(MAGIC.as_slice()) {
            return Err(BlobError::Malformed("bad magic".into()));
        }
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(BlobError::Version(version));
        }
        let flags = r.u8("flags")?;
        if flags & !FLAG_PAYLOAD != 0 {
            return Err(BlobError::Malformed(format!("unknown flags 0x{flags:02x}")));
        }
        let n = r.u8("name")?;
        let name = std::str::from_utf8(r.take(usize::from(n), "name")?)
            .map_err(|_| BlobError::Malformed("name is not UTF-8".into()))?
            .to_owned();
        let kind = r.u8("policy kind")?;
        let bank = r.u16("PCR bank")?;
        let count = r.u8("PCR count")?;
        let pcrs = r.take(usize::from(count), "PCR indices")?.to_vec();
        if pcrs.is_empty() || pcrs.windows(2).any(|w| w[0] >= w[1]) || pcrs.iter().any(|&p| p > 23) {
            return Err(BlobError::Malformed("PCR indices must be 0-23, ascending, at least one".into()));
        }
        let policy = match kind {
            1 => {
                let len = policy_digest::bank_digest_len(bank)?;
                let values: Result<Vec<Vec<u8>>, BlobError> =
                    (0..pcrs.len()).map(|_| r.take(len, "PCR values").map(<[u8]>::to_vec)).collect();
                BlobPolicy::Pcr { bank, pcrs, values: values? }
            }
            2 => BlobPolicy::Authorized { bank, pcrs, authority_spki: r.tpm2b("authority")?.to_vec() },
            k => return Err(BlobError::Malformed(format!("unknown policy kind {k}"))),
        };
        let public = r.tpm2b("public")?.to_vec();
        let duplicate = r.tpm2b("duplicate")?.to_vec();
        let encrypted_seed = r.tpm2b("encrypted seed")?.to_vec();
        let payload = if flags & FLAG_PAYLOAD != 0 {
            let mut nonce = [0u8; 12];
            nonce.copy_from_slice(r.take(12, "nonce")?);
            let len = r.u32("payload")?;
            let len = usize::try_from(len).map_err(|_| BlobError::Malformed("payload length".into()))?;
            Some((nonce, r.take(len, "payload")?.to_vec()))
        } else {
            None
        };
        if !r.rest.is_empty() {
            return Err(BlobError::Malformed(format!("{} bytes after the end", r.rest.len())));
        }
        Ok(Self { name, policy, public, duplicate, encrypted_seed, payload })
    }

    /// The blob's bytes.
    ///
    /// # Errors
    /// [`BlobError::Malformed`] for a field too large for its length prefix.
    pub fn to_bytes(&self) -> Result<Vec<u8>, BlobError> {
        let too_big = |what: &str| BlobError::Malformed(format!("{what} too large"));
        let mut out = Vec::with_capacity(512 + self.payload.as_ref().map_or(0, |(_, c)| c.len()));
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(if self.payload.is_some() { FLAG_PAYLOAD } else { 0 });
        out.push(u8::try_from(self.name.len()).map_err(|_| too_big("name"))?);
        out.extend_from_slice(self.name.as_bytes());
        let (kind, bank, pcrs) = match &self.policy {
            BlobPolicy::Pcr { bank, pcrs, .. } => (1u8, *bank, pcrs),
            BlobPolicy::Authorized { bank, pcrs, .. } => (2u8, *bank, pcrs),
        };
        out.push(kind);
        out.extend_from_slice(&bank.to_be_bytes());
        out.push(u8::try_from(pcrs.len()).map_err(|_| too_big("PCR list"))?);
        out.extend_from_slice(pcrs);
        match &self.policy {
            BlobPolicy::Pcr { values, .. } => values.iter().for_each(|v| out.extend_from_slice(v)),
            BlobPolicy::Authorized { authority_spki, .. } => put_tpm2b(&mut out, authority_spki)?,
        }
        put_tpm2b(&mut out, &self.public)?;
        put_tpm2b(&mut out, &self.duplicate)?;
        put_tpm2b(&mut out, &self.encrypted_seed)?;
        if let Some((nonce, ciphertext)) = &self.payload {
            out.extend_from_slice(nonce);
            out.extend_from_slice(&u32::try_from(ciphertext.len()).map_err(|_| too_big("payload"))?.to_be_bytes());
            out.extend_from_slice(ciphertext);
        }
        Ok(out)
    }

    /// The authPolicy digest of the sealed object's public area, if it parses as a KEYEDHASH
    /// sealed-data object with a SHA-256 name.
    ///
    /// # Errors
    /// [`BlobError::Malformed`] otherwise.
    pub fn object_auth_policy(&self) -> Result<Vec<u8>, BlobError> {
        let mut r = Reader { rest: &self.public };
        let bad = |m: &str| BlobError::Malformed(format!("sealed object: {m}"));
        if r.u16("type")? != ALG_KEYEDHASH {
            return Err(bad("not a KEYEDHASH (sealed data) object"));
        }
        if r.u16("nameAlg")? != ALG_SHA256 {
            return Err(bad("name algorithm is not SHA-256"));
        }
        let attrs = r.u32("attributes")?;
        if attrs & (ATTR_SIGN | ATTR_DECRYPT) != 0 {
            return Err(bad("a keyed-hash key, not sealed data"));
        }
        if attrs & ATTR_USER_WITH_AUTH != 0 {
            return Err(bad("it opens with a password too (userWithAuth): only a policy may open it"));
        }
        Ok(r.tpm2b("authPolicy")?.to_vec())
    }
}

/// The public parts of a storage key a sealed object can be wrapped for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageKey {
    /// Its TPM name (`0x000b || SHA-256(TPMT_PUBLIC)`).
    pub name: Vec<u8>,
    /// Its SEC1 uncompressed point.
    pub point: Vec<u8>,
}

impl StorageKey {
    /// Parses a storage key's public area: a `TPM2B_PUBLIC` (what `tpm-vault srk public
    /// --format tpm2b` and `tpm2_readpublic -o` write) or a bare `TPMT_PUBLIC`. It must be an
    /// ECC P-256 restricted decryption key with AES-128-CFB and a SHA-256 name.
    ///
    /// # Errors
    /// [`BlobError::NotStorageKey`] naming what is wrong.
    pub fn from_public(bytes: &[u8]) -> Result<Self, BlobError> {
        // A TPM2B_PUBLIC starts with its size; a TPMT_PUBLIC with its type.
        let tpmt = match bytes.split_first_chunk::<2>() {
            Some((size, rest)) if usize::from(u16::from_be_bytes(*size)) == rest.len() => rest,
            _ => bytes,
        };
        let not = |m: &str| BlobError::NotStorageKey(m.into());
        let mut r = Reader { rest: tpmt };
        let short = |_| not("public area cut short");
        match r.u16("type").map_err(short)? {
            ALG_ECC => {}
            0x0001 => return Err(not("an RSA key: only ECC P-256 storage keys are supported")),
            t => return Err(BlobError::NotStorageKey(format!("object type 0x{t:04x} is not an ECC key"))),
        }
        if r.u16("nameAlg").map_err(short)? != ALG_SHA256 {
            return Err(not("its name algorithm is not SHA-256"));
        }
        let attrs = r.u32("attributes").map_err(short)?;
        if attrs & ATTR_RESTRICTED == 0 || attrs & ATTR_DECRYPT == 0 || attrs & ATTR_SIGN != 0 {
            return Err(not("not a restricted decryption key (restricted + decrypt, no sign)"));
        }
        r.tpm2b("authPolicy").map_err(short)?;
        let sym = r.u16("symmetric").map_err(short)?;
        let (bits, mode) = if sym == ALG_NULL {
            (0, ALG_NULL)
        } else {
            (r.u16("key bits").map_err(short)?, r.u16("mode").map_err(short)?)
        };
        if (sym, bits, mode) != (ALG_AES, 128, ALG_CFB) {
            return Err(not("its symmetric algorithm is not AES-128-CFB"));
        }
        if r.u16("scheme").map_err(short)? != ALG_NULL {
            return Err(not("a storage key has a NULL scheme"));
        }
        if r.u16("curve").map_err(short)? != CURVE_P256 {
            return Err(not("its curve is not NIST P-256"));
        }
        if r.u16("kdf").map_err(short)? != ALG_NULL {
            return Err(not("a storage key has a NULL KDF"));
        }
        let x = r.tpm2b("x").map_err(short)?;
        let y = r.tpm2b("y").map_err(short)?;
        if !r.rest.is_empty() {
            return Err(not("bytes after the public area"));
        }
        let point = point_of(x, y).ok_or_else(|| not("its point is not on the P-256 curve"))?;
        Ok(Self { name: policy_digest::name_of(tpmt), point })
    }

    /// The storage key of a P-256 public key given as DER or PEM SubjectPublicKeyInfo, taken
    /// to be the TCG-template SRK with that point (what `tpm-vault srk public` prints).
    ///
    /// # Errors
    /// [`BlobError::NotStorageKey`] if it is not an ECC P-256 key.
    pub fn from_spki_as_tcg_srk(spki: &[u8]) -> Result<Self, BlobError> {
        let point = spki_p256_point(spki)
            .ok_or_else(|| BlobError::NotStorageKey("not an ECC P-256 public key (PEM or DER)".into()))?;
        Self::from_public(&tcg_srk_public(&point)?)
    }
}

/// The TCG-template SRK's `TPMT_PUBLIC` with the given SEC1 uncompressed point.
///
/// # Errors
/// [`BlobError::NotStorageKey`] for a point that is not 65 bytes.
pub fn tcg_srk_public(point: &[u8]) -> Result<Vec<u8>, BlobError> {
    let xy = match point.split_first() {
        Some((4, xy)) if xy.len() == 64 => xy,
        _ => return Err(BlobError::NotStorageKey("not an uncompressed P-256 point".into())),
    };
    let mut out = Vec::with_capacity(90);
    out.extend_from_slice(&ALG_ECC.to_be_bytes());
    out.extend_from_slice(&ALG_SHA256.to_be_bytes());
    out.extend_from_slice(&SRK_ATTRIBUTES.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    for v in [ALG_AES, 128, ALG_CFB, ALG_NULL, CURVE_P256, ALG_NULL] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    let (x, y) = xy.split_at(32);
    put_tpm2b(&mut out, x)?;
    put_tpm2b(&mut out, y)?;
    Ok(out)
}

/// `04 || x || y` if (x, y) is a P-256 point (coordinates left-padded to 32 bytes).
fn point_of(x: &[u8], y: &[u8]) -> Option<Vec<u8>> {
    if x.len() > 32 || y.len() > 32 {
        return None;
    }
    let mut point = vec![0u8; 65];
    point[0] = 4;
    point[33 - x.len()..33].copy_from_slice(x);
    point[65 - y.len()..].copy_from_slice(y);
    // A public key parses only if the point is on the curve.
    p256::PublicKey::from_sec1_bytes(&point).ok().map(|_| point)
}

/// The uncompressed point of an ECC P-256 SubjectPublicKeyInfo (DER or PEM).
pub fn spki_p256_point(spki: &[u8]) -> Option<Vec<u8>> {
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    use p256::pkcs8::DecodePublicKey;
    let key = p256::PublicKey::from_public_key_der(spki).ok().or_else(|| {
        let pem = std::str::from_utf8(spki).ok()?;
        p256::PublicKey::from_public_key_pem(pem).ok()
    })?;
    Some(key.to_encoded_point(false).as_bytes().to_vec())
}

/// KDFa (TPM 2.0 Part 1 §11.4.10.2, SP 800-108 counter mode with HMAC-SHA-256): `bits` of key
/// from `key`, `label` (a NUL is appended), `context_u` and `context_v`.
pub fn kdfa(key: &[u8], label: &str, context_u: &[u8], context_v: &[u8], bits: u32) -> Zeroizing<Vec<u8>> {
    let bytes = (bits as usize).div_ceil(8);
    let hkey = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut out = Zeroizing::new(Vec::with_capacity(bytes + 32));
    let mut counter = 1u32;
    while out.len() < bytes {
        let mut ctx = hmac::Context::with_key(&hkey);
        ctx.update(&counter.to_be_bytes());
        ctx.update(label.as_bytes());
        ctx.update(&[0]);
        ctx.update(context_u);
        ctx.update(context_v);
        ctx.update(&bits.to_be_bytes());
        out.extend_from_slice(ctx.sign().as_ref());
        counter += 1;
    }
    out.truncate(bytes);
    out
}

/// KDFe (TPM 2.0 Part 1 §11.4.10.3, SP 800-56A concatenation KDF with SHA-256) for 256 bits.
pub fn kdfe(z: &[u8], label: &str, party_u: &[u8], party_v: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut input = Zeroizing::new(Vec::with_capacity(4 + z.len() + label.len() + 1 + 64));
    input.extend_from_slice(&1u32.to_be_bytes());
    input.extend_from_slice(z);
    input.extend_from_slice(label.as_bytes());
    input.push(0);
    input.extend_from_slice(party_u);
    input.extend_from_slice(party_v);
    Zeroizing::new(sha256(&input))
}

/// The sealed object's `TPMT_PUBLIC`: KEYEDHASH, SHA-256 name, adminWithPolicy | noDA
/// (userWithAuth clear: only the policy opens it; neither fixedTPM nor fixedParent, which an
/// imported object cannot have), `auth_policy`, NULL scheme, `unique`.
pub fn sealed_public(auth_policy: &[u8], unique: &[u8]) -> Result<Vec<u8>, BlobError> {
    let mut out = Vec::with_capacity(80);
    out.extend_from_slice(&ALG_KEYEDHASH.to_be_bytes());
    out.extend_from_slice(&ALG_SHA256.to_be_bytes());
    out.extend_from_slice(&(ATTR_ADMIN_WITH_POLICY | ATTR_NO_DA).to_be_bytes());
    put_tpm2b(&mut out, auth_policy)?;
    out.extend_from_slice(&ALG_NULL.to_be_bytes());
    put_tpm2b(&mut out, unique)?;
    Ok(out)
}

/// Random bytes from the system.
fn random<const N: usize>() -> Result<Zeroizing<[u8; N]>, BlobError> {
    let mut b = Zeroizing::new([0u8; N]);
    rand::fill(b.as_mut()).map_err(|_| BlobError::Crypto("random"))?;
    Ok(b)
}

/// What `TPM2_Import` takes of a duplicated object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportTriple {
    /// `TPMT_PUBLIC`.
    pub public: Vec<u8>,
    /// The duplicate (`TPM2B_PRIVATE` contents).
    pub duplicate: Vec<u8>,
    /// The encrypted seed (`TPM2B_ENCRYPTED_SECRET` contents).
    pub encrypted_seed: Vec<u8>,
}

/// The import triple of a sealed object holding `data` with `auth_policy`, duplicated for
/// `parent`: (`TPMT_PUBLIC`, duplicate, encrypted seed).
///
/// # Errors
/// [`BlobError::Secret`] for data over [`MAX_DIRECT`] bytes; [`BlobError::Crypto`].
pub fn wrap(parent: &StorageKey, auth_policy: &[u8], data: &[u8]) -> Result<ImportTriple, BlobError> {
    if data.len() > MAX_DIRECT {
        return Err(BlobError::Secret(format!("{} bytes, a sealed object holds at most {MAX_DIRECT}", data.len())));
    }
    let seed_value = random::<32>()?;
    let unique = sha256(&[seed_value.as_slice(), data].concat());
    let public = sealed_public(auth_policy, &unique)?;
    let name = policy_digest::name_of(&public);

    // TPM2B_SENSITIVE { TPMT_SENSITIVE { type, authValue (empty), seedValue, sealed data } }.
    let mut sensitive = Zeroizing::new(Vec::with_capacity(8 + 32 + data.len() + 2));
    sensitive.extend_from_slice(&[0, 0]); // size, set below
    sensitive.extend_from_slice(&ALG_KEYEDHASH.to_be_bytes());
    sensitive.extend_from_slice(&0u16.to_be_bytes());
    put_tpm2b(&mut sensitive, seed_value.as_slice())?;
    put_tpm2b(&mut sensitive, data)?;
    let inner = u16::try_from(sensitive.len() - 2).map_err(|_| BlobError::Crypto("sensitive size"))?;
    sensitive[..2].copy_from_slice(&inner.to_be_bytes());

    // The seed: ECDH with an ephemeral key, then KDFe.
    let ephemeral = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, &rand::SystemRandom::new())
        .map_err(|_| BlobError::Crypto("ephemeral key"))?;
    let e_point = ephemeral.compute_public_key().map_err(|_| BlobError::Crypto("ephemeral key"))?.as_ref().to_vec();
    let peer = agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, parent.point.clone());
    let (ex, ey) = e_point.get(1..).map(|xy| xy.split_at(32)).ok_or(BlobError::Crypto("ephemeral point"))?;
    let px = parent.point.get(1..33).ok_or(BlobError::Crypto("storage key point"))?;
    let seed =
        agreement::agree_ephemeral(ephemeral, peer, BlobError::Crypto("ECDH"), |z| Ok(kdfe(z, "DUPLICATE", ex, px)))?;
    let mut encrypted_seed = Vec::with_capacity(68);
    put_tpm2b(&mut encrypted_seed, ex)?;
    put_tpm2b(&mut encrypted_seed, ey)?;

    // Outer wrapper: AES-128-CFB under symKey, then the integrity HMAC.
    let sym_key = kdfa(&seed, "STORAGE", &name, &[], 128);
    let key = cipher::UnboundCipherKey::new(&cipher::AES_128, &sym_key).map_err(|_| BlobError::Crypto("AES key"))?;
    let key = cipher::EncryptingKey::cfb128(key).map_err(|_| BlobError::Crypto("AES-CFB"))?;
    let mut enc = sensitive.to_vec();
    key.less_safe_encrypt(&mut enc, cipher::EncryptionContext::Iv128([0u8; 16].into()))
        .map_err(|_| BlobError::Crypto("AES-CFB"))?;
    let hmac_key = kdfa(&seed, "INTEGRITY", &[], &[], 256);
    let mut ctx = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, &hmac_key));
    ctx.update(&enc);
    ctx.update(&name);
    let outer_hmac = ctx.sign();
    let mut duplicate = Vec::with_capacity(34 + enc.len());
    put_tpm2b(&mut duplicate, outer_hmac.as_ref())?;
    duplicate.extend_from_slice(&enc);
    Ok(ImportTriple { public, duplicate, encrypted_seed })
}

/// Seals `secret` for the device whose storage key is `parent`, under `policy`, as `name`:
/// directly in the object up to [`MAX_DIRECT`] bytes, else AES-256-GCM-encrypted under a
/// random key the object holds, with `name` as associated data.
///
/// # Errors
/// [`BlobError::Policy`] when the policy cannot be computed; [`BlobError::Secret`] for an
/// empty secret; [`BlobError::Crypto`].
pub fn seal_for(parent: &StorageKey, name: &str, policy: BlobPolicy, secret: &[u8]) -> Result<SealedBlob, BlobError> {
    if secret.is_empty() {
        return Err(BlobError::Secret("empty".into()));
    }
    if secret.len() > MAX_SECRET {
        return Err(BlobError::Secret(format!("{} bytes, more than {MAX_SECRET}", secret.len())));
    }
    let digest = policy.digest()?;
    let (object_data, payload) = if secret.len() <= MAX_DIRECT {
        (Zeroizing::new(secret.to_vec()), None)
    } else {
        let key = random::<32>()?;
        let nonce = random::<12>()?;
        let sealing = aead::LessSafeKey::new(
            aead::UnboundKey::new(&aead::AES_256_GCM, key.as_slice()).map_err(|_| BlobError::Crypto("AES-GCM key"))?,
        );
        let mut ciphertext = secret.to_vec();
        sealing
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(*nonce),
                aead::Aad::from(name.as_bytes()),
                &mut ciphertext,
            )
            .map_err(|_| BlobError::Crypto("AES-GCM"))?;
        (Zeroizing::new(key.to_vec()), Some((*nonce, ciphertext)))
    };
    let ImportTriple { public, duplicate, encrypted_seed } = wrap(parent, &digest, &object_data)?;
    Ok(SealedBlob { name: name.to_owned(), policy, public, duplicate, encrypted_seed, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn srk() -> StorageKey {
        let key = p256::SecretKey::from_slice(&[7u8; 32]).unwrap();
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        let point = key.public_key().to_encoded_point(false).as_bytes().to_vec();
        StorageKey::from_public(&tcg_srk_public(&point).unwrap()).unwrap()
    }

    fn pcr9() -> BlobPolicy {
        BlobPolicy::Pcr { bank: ALG_SHA256, pcrs: vec![9], values: vec![vec![0; 32]] }
    }

    #[test]
    fn blobs_round_trip() {
        for secret in [vec![1u8; 5], vec![2u8; 128], vec![3u8; 1000]] {
            let blob = seal_for(&srk(), "db", pcr9(), &secret).unwrap();
            assert_eq!(blob.payload.is_some(), secret.len() > MAX_DIRECT);
            let bytes = blob.to_bytes().unwrap();
            assert_eq!(SealedBlob::parse(&bytes).unwrap(), blob);
            assert_eq!(blob.object_auth_policy().unwrap(), pcr9().digest().unwrap());
            for cut in 0..bytes.len() {
                assert!(SealedBlob::parse(&bytes[..cut]).is_err(), "{cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(SealedBlob::parse(&longer).is_err());
        }
    }

    #[test]
    fn storage_key_checks() {
        let srk = srk();
        let public = tcg_srk_public(&srk.point).unwrap();
        let mut tpm2b = (public.len() as u16).to_be_bytes().to_vec();
        tpm2b.extend_from_slice(&public);
        assert_eq!(StorageKey::from_public(&tpm2b).unwrap(), srk);
        // An AK-like signing key is refused.
        let mut signing = public.clone();
        signing[4..8].copy_from_slice(&0x0005_0072u32.to_be_bytes());
        assert!(matches!(StorageKey::from_public(&signing), Err(BlobError::NotStorageKey(_))));
        let mut off_curve = public;
        let last = off_curve.len() - 1;
        off_curve[last] ^= 1;
        assert!(matches!(StorageKey::from_public(&off_curve), Err(BlobError::NotStorageKey(_))));
    }

    #[test]
    fn kdfa_matches_a_known_vector() {
        // KDFa(SHA-256, key = 32 x 0x01, "STORAGE", u = "abc", v = "", 128), computed with
        // the definition: HMAC(key, 00000001 || "STORAGE\0" || "abc" || 00000080)[..16].
        let k = kdfa(&[1u8; 32], "STORAGE", b"abc", &[], 128);
        let mut ctx = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, &[1u8; 32]));
        ctx.update(&[0, 0, 0, 1]);
        ctx.update(b"STORAGE\0abc");
        ctx.update(&[0, 0, 0, 128]);
        assert_eq!(k.as_slice(), &ctx.sign().as_ref()[..16]);
    }
}
