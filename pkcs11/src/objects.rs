//! The token's objects: for every vault key the caller may see, a private-key object, a
//! public-key object and a certificate object per certificate of its stored chain.
//!
//! Object handles come from a per-process table of (key name, role) → handle, filled from a
//! counter the first time an object is seen and never reused, so there are no collisions (a
//! hash of the name kept only 24 bits where `CK_ULONG` is 32 bits) and a handle stays the same
//! after every refresh and `C_Finalize`/`C_Initialize`; a forked child inherits the table, so
//! nginx's master finds the key, forks, and its workers use the parent's handles. `CKA_ID` is the key's
//! subject key identifier (SHA-1 of the public key's BIT STRING, RFC 5280 §4.2.1.2 method 1),
//! shared by the key's three objects; `CKA_LABEL` is the key's name. The private part is
//! sensitive and never extractable: it exists only inside the TPM (or, for ML-DSA, sealed by it).

use std::collections::HashMap;
use std::sync::Arc;

use cryptoki_sys::*;
use parking_lot::Mutex;
use spki::der::{Decode as _, Encode as _};
use tpm_vault_client::algorithm::{Curve, Family, ParameterSet, TpmKey};
use tpm_vault_client::{KeyAlgorithm, KeyInfo, KeyUsage};

/// What kind of key, with what its attributes need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyKind {
    /// ECDSA on a NIST curve.
    Ec {
        /// The curve.
        curve: Curve,
    },
    /// RSA; the modulus and public exponent, big-endian.
    Rsa {
        /// Modulus n.
        modulus: Vec<u8>,
        /// Public exponent e.
        exponent: Vec<u8>,
    },
    /// ML-DSA (FIPS 204) at a parameter set (`CKP_ML_DSA_*`), with its signature length.
    MlDsa {
        /// `CKP_ML_DSA_44/65/87`.
        parameter_set: CK_ULONG,
        /// Bytes in a signature.
        signature_len: usize,
    },
}

/// A vault key as the token shows it.
#[derive(Debug)]
pub(crate) struct Key {
    /// The vault key's name (`CKA_LABEL`).
    pub(crate) name: String,
    /// What its attributes need.
    pub(crate) kind: KeyKind,
    /// Whether using it needs a password (`CKA_ALWAYS_AUTHENTICATE`).
    pub(crate) has_auth: bool,
    /// Whether the key has the `sign` usage (raw signatures, what every PKCS#11 mechanism
    /// makes): `CKA_SIGN` of the private-key object. An `ssh`- or `policy`-only key is listed
    /// (its public key and certificates) but cannot sign here.
    pub(crate) can_sign: bool,
    /// DER SubjectPublicKeyInfo.
    pub(crate) spki: Vec<u8>,
    /// The SubjectPublicKeyInfo's BIT STRING: the EC point, the RSAPublicKey, the ML-DSA key.
    pub(crate) public_bits: Vec<u8>,
    /// `CKA_ID`: the subject key identifier.
    pub(crate) id: Vec<u8>,
}

/// Whether the token shows keys of `algorithm` (not ML-KEM, not hybrid): those [`Key::new`] takes.
pub(crate) fn usable(algorithm: KeyAlgorithm) -> bool {
    algorithm.info().is_some_and(|a| matches!(a.family, Family::Ecc | Family::Rsa | Family::MlDsa))
}

/// The PKCS#11 parameter set (`CKP_ML_DSA_*`) of an ML-DSA parameter set.
pub(crate) fn ml_dsa_parameter_set(set: ParameterSet) -> CK_ULONG {
    match set {
        ParameterSet::MlDsa44 => CKP_ML_DSA_44,
        ParameterSet::MlDsa65 => CKP_ML_DSA_65,
        ParameterSet::MlDsa87 => CKP_ML_DSA_87,
    }
}

impl Key {
    /// The token's view of a vault key, or `None` for keys that PKCS#11 cannot use here
    /// (ML-KEM, hybrid) or a public key that does not parse.
    pub(crate) fn new(info: &KeyInfo, spki: Vec<u8>) -> Option<Key> {
        let parsed = spki::SubjectPublicKeyInfoRef::from_der(&spki).ok()?;
        let public_bits = parsed.subject_public_key.raw_bytes().to_vec();
        let alg = info.algorithm.info()?;
        let kind = match (alg.family, alg.tpm_key) {
            (Family::Ecc, Some(TpmKey::Ecc(curve))) => KeyKind::Ec { curve },
            (Family::Rsa, _) => {
                use rsa::pkcs8::DecodePublicKey as _;
                use rsa::traits::PublicKeyParts as _;
                let key = rsa::RsaPublicKey::from_public_key_der(&spki).ok()?;
                KeyKind::Rsa { modulus: key.n().to_bytes_be(), exponent: key.e().to_bytes_be() }
            }
            (Family::MlDsa, _) => {
                KeyKind::MlDsa { parameter_set: ml_dsa_parameter_set(alg.ml_dsa()?), signature_len: alg.signature_len? }
            }
            _ => return None,
        };
        let id =
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &public_bits).as_ref().to_vec();
        let can_sign = info.allows(KeyUsage::Sign);
        Some(Key { name: info.name.clone(), kind, has_auth: info.has_auth, can_sign, spki, public_bits, id })
    }

    /// `CKK_*`.
    pub(crate) fn key_type(&self) -> CK_KEY_TYPE {
        match self.kind {
            KeyKind::Ec { .. } => CKK_EC,
            KeyKind::Rsa { .. } => CKK_RSA,
            KeyKind::MlDsa { .. } => CKK_ML_DSA,
        }
    }

    /// Bytes in one signature, in the PKCS#11 encoding (ECDSA: r || s).
    pub(crate) fn signature_len(&self) -> usize {
        match &self.kind {
            KeyKind::Ec { curve } => 2 * curve.field_len(),
            KeyKind::Rsa { modulus, .. } => modulus.len(),
            KeyKind::MlDsa { signature_len, .. } => *signature_len,
        }
    }
}

/// A certificate of a key's stored chain.
#[derive(Debug)]
pub(crate) struct Cert {
    /// DER.
    der: Vec<u8>,
    /// DER of the subject Name.
    subject: Vec<u8>,
    /// DER of the issuer Name.
    issuer: Vec<u8>,
    /// DER INTEGER of the serial number.
    serial: Vec<u8>,
    /// The certificate's SubjectPublicKeyInfo, DER.
    spki: Vec<u8>,
}

impl Cert {
    /// Parses a PEM chain, leaf first; `None` if any certificate does not parse.
    pub(crate) fn chain(pem: &str) -> Option<Vec<Cert>> {
        let certs = x509_cert::Certificate::load_pem_chain(pem.as_bytes()).ok()?;
        certs.iter().map(Cert::from_parsed).collect()
    }

    /// Parses one DER certificate.
    pub(crate) fn from_der(der: &[u8]) -> Option<Cert> {
        Cert::from_parsed(&x509_cert::Certificate::from_der(der).ok()?)
    }

    /// The parts the attributes need.
    fn from_parsed(cert: &x509_cert::Certificate) -> Option<Cert> {
        let tbs = &cert.tbs_certificate;
        Some(Cert {
            der: cert.to_der().ok()?,
            subject: tbs.subject.to_der().ok()?,
            issuer: tbs.issuer.to_der().ok()?,
            serial: tbs.serial_number.to_der().ok()?,
            spki: tbs.subject_public_key_info.to_der().ok()?,
        })
    }

    /// DER of the certificate.
    pub(crate) fn der(&self) -> &[u8] {
        &self.der
    }

    /// DER SubjectPublicKeyInfo.
    pub(crate) fn spki(&self) -> &[u8] {
        &self.spki
    }
}

/// An attribute's value, or the fact that it may not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Attr {
    /// The value's bytes as PKCS#11 lays them out (`CK_ULONG` native-endian, `CK_BBOOL` 1 byte).
    Value(Vec<u8>),
    /// A secret that never leaves the TPM: `CKR_ATTRIBUTE_SENSITIVE`.
    Sensitive,
}

/// What an object is to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// The private key.
    Private,
    /// The public key.
    Public,
    /// Certificate `n` of the stored chain (0 = the leaf).
    Certificate(u8),
}

/// Certificates of a chain that get an object (the leaf and up to 200 issuers).
pub(crate) const MAX_CHAIN: usize = 201;

/// An object on the token.
#[derive(Debug)]
pub(crate) struct Object {
    /// Its stable handle.
    pub(crate) handle: CK_OBJECT_HANDLE,
    /// What it is to its key.
    pub(crate) role: Role,
    /// The key it belongs to.
    pub(crate) key: Arc<Key>,
    /// Its attributes.
    attrs: Vec<(CK_ATTRIBUTE_TYPE, Attr)>,
}

impl Object {
    /// The attribute `kind`, if the object has it.
    pub(crate) fn attr(&self, kind: CK_ATTRIBUTE_TYPE) -> Option<&Attr> {
        self.attrs.iter().find(|(t, _)| *t == kind).map(|(_, v)| v)
    }

    /// True if every attribute of `template` is one of the object's, with the same value.
    /// A sensitive attribute never matches.
    pub(crate) fn matches(&self, template: &[(CK_ATTRIBUTE_TYPE, Vec<u8>)]) -> bool {
        template.iter().all(|(kind, value)| matches!(self.attr(*kind), Some(Attr::Value(v)) if v == value))
    }
}

/// Every handle given out in this process, by key name and role, and the next one.
struct Handles {
    /// (key name, role) → handle.
    by_object: HashMap<(String, Role), CK_OBJECT_HANDLE>,
    /// The next handle to give (1 first; 0 is `CK_INVALID_HANDLE`).
    next: CK_OBJECT_HANDLE,
}

/// The handle table, inherited by forked children (see the `fork` hooks).
static HANDLES: Mutex<Option<Handles>> = Mutex::new(None);

/// The handle of `key`'s object in `role`: the one it had before in this process, or the next
/// unused one. `CK_INVALID_HANDLE` (0) only once every `CK_ULONG` has been given out.
pub(crate) fn handle(name: &str, role: Role) -> CK_OBJECT_HANDLE {
    let mut table = HANDLES.lock();
    let table = table.get_or_insert_with(|| Handles { by_object: HashMap::new(), next: 1 });
    if let Some(&handle) = table.by_object.get(&(name.to_owned(), role)) {
        return handle;
    }
    let handle = table.next;
    let Some(next) = handle.checked_add(1) else { return CK_INVALID_HANDLE };
    table.next = next;
    table.by_object.insert((name.to_owned(), role), handle);
    handle
}

/// `pthread_atfork` hooks for the handle table's lock.
pub(crate) mod fork {
    use super::HANDLES;

    /// Before `fork`: take the lock.
    pub(crate) fn prepare() {
        std::mem::forget(HANDLES.lock());
    }

    /// After `fork`, in the parent: release it.
    pub(crate) fn parent() {
        // SAFETY: `prepare` took the lock on this thread and forgot the guard.
        #[allow(unsafe_code)]
        unsafe {
            HANDLES.force_unlock();
        }
    }

    /// After `fork`, in the child: start it afresh.
    pub(crate) fn child() {
        // SAFETY: in the child hook, on the lock `prepare` took.
        #[allow(unsafe_code)]
        unsafe {
            crate::reset_in_child(&HANDLES);
        }
    }
}

/// The objects of `key` with its stored chain (leaf first).
pub(crate) fn objects(key: &Arc<Key>, chain: &[Cert]) -> Vec<Object> {
    let subject =
        chain.first().filter(|leaf| leaf.spki == key.spki).map(|leaf| leaf.subject.clone()).unwrap_or_default();
    let mut out = vec![
        Object {
            handle: handle(&key.name, Role::Private),
            role: Role::Private,
            key: Arc::clone(key),
            attrs: private_attrs(key, &subject),
        },
        Object {
            handle: handle(&key.name, Role::Public),
            role: Role::Public,
            key: Arc::clone(key),
            attrs: public_attrs(key, &subject),
        },
    ];
    for (n, cert) in chain.iter().take(MAX_CHAIN).enumerate() {
        let n = u8::try_from(n).unwrap_or(u8::MAX);
        let role = Role::Certificate(n);
        out.push(Object {
            handle: handle(&key.name, role),
            role,
            key: Arc::clone(key),
            attrs: cert_attrs(key, cert, n),
        });
    }
    out
}

/// A `CK_ULONG` attribute value.
pub(crate) fn ulong(v: CK_ULONG) -> Attr {
    Attr::Value(v.to_ne_bytes().to_vec())
}

/// A `CK_BBOOL` attribute value.
fn flag(v: bool) -> Attr {
    Attr::Value(vec![if v { CK_TRUE } else { CK_FALSE }])
}

/// A byte-string attribute value.
fn bytes(v: &[u8]) -> Attr {
    Attr::Value(v.to_vec())
}

/// Attributes every object has.
fn storage_attrs(class: CK_OBJECT_CLASS, label: &str, destroyable: bool) -> Vec<(CK_ATTRIBUTE_TYPE, Attr)> {
    vec![
        (CKA_CLASS, ulong(class)),
        (CKA_TOKEN, flag(true)),
        (CKA_PRIVATE, flag(false)),
        (CKA_MODIFIABLE, flag(false)),
        (CKA_COPYABLE, flag(false)),
        (CKA_DESTROYABLE, flag(destroyable)),
        (CKA_LABEL, bytes(label.as_bytes())),
    ]
}

/// Attributes both key objects have.
fn key_attrs(key: &Key, class: CK_OBJECT_CLASS, subject: &[u8]) -> Vec<(CK_ATTRIBUTE_TYPE, Attr)> {
    let mut attrs = storage_attrs(class, &key.name, true);
    let (generator, mechanisms) = for_key(key);
    let allowed: Vec<u8> = mechanisms.iter().flat_map(|m| m.to_ne_bytes()).collect();
    attrs.extend([
        (CKA_ID, bytes(&key.id)),
        (CKA_KEY_TYPE, ulong(key.key_type())),
        (CKA_START_DATE, bytes(&[])),
        (CKA_END_DATE, bytes(&[])),
        (CKA_DERIVE, flag(false)),
        (CKA_LOCAL, flag(true)),
        (CKA_KEY_GEN_MECHANISM, ulong(generator)),
        (CKA_ALLOWED_MECHANISMS, Attr::Value(allowed)),
        (CKA_SUBJECT, bytes(subject)),
        (CKA_PUBLIC_KEY_INFO, bytes(&key.spki)),
    ]);
    match &key.kind {
        KeyKind::Ec { curve } => {
            attrs.push((CKA_EC_PARAMS, bytes(curve.oid_der())));
            attrs.push((CKA_EC_POINT, bytes(&octet_string(&key.public_bits))));
        }
        KeyKind::Rsa { modulus, exponent } => {
            attrs.push((CKA_MODULUS, bytes(modulus)));
            attrs.push((CKA_MODULUS_BITS, ulong((8 * modulus.len()) as CK_ULONG)));
            attrs.push((CKA_PUBLIC_EXPONENT, bytes(exponent)));
        }
        KeyKind::MlDsa { parameter_set, .. } => attrs.push((CKA_PARAMETER_SET, ulong(*parameter_set))),
    }
    attrs
}

/// The private-key object's attributes.
fn private_attrs(key: &Key, subject: &[u8]) -> Vec<(CK_ATTRIBUTE_TYPE, Attr)> {
    let mut attrs = key_attrs(key, CKO_PRIVATE_KEY, subject);
    attrs.extend([
        (CKA_SENSITIVE, flag(true)),
        (CKA_ALWAYS_SENSITIVE, flag(true)),
        (CKA_EXTRACTABLE, flag(false)),
        (CKA_NEVER_EXTRACTABLE, flag(true)),
        (CKA_SIGN, flag(key.can_sign)),
        (CKA_SIGN_RECOVER, flag(false)),
        (CKA_DECRYPT, flag(false)),
        (CKA_UNWRAP, flag(false)),
        (CKA_WRAP_WITH_TRUSTED, flag(false)),
        (CKA_ALWAYS_AUTHENTICATE, flag(key.has_auth)),
    ]);
    let secrets: &[CK_ATTRIBUTE_TYPE] = match key.kind {
        KeyKind::Ec { .. } => &[CKA_VALUE],
        KeyKind::Rsa { .. } => {
            &[CKA_PRIVATE_EXPONENT, CKA_PRIME_1, CKA_PRIME_2, CKA_EXPONENT_1, CKA_EXPONENT_2, CKA_COEFFICIENT]
        }
        KeyKind::MlDsa { .. } => &[CKA_VALUE, CKA_SEED],
    };
    attrs.extend(secrets.iter().map(|&t| (t, Attr::Sensitive)));
    attrs
}

/// The public-key object's attributes.
fn public_attrs(key: &Key, subject: &[u8]) -> Vec<(CK_ATTRIBUTE_TYPE, Attr)> {
    let mut attrs = key_attrs(key, CKO_PUBLIC_KEY, subject);
    attrs.extend([
        (CKA_VERIFY, flag(true)),
        (CKA_VERIFY_RECOVER, flag(false)),
        (CKA_ENCRYPT, flag(false)),
        (CKA_WRAP, flag(false)),
        (CKA_TRUSTED, flag(false)),
    ]);
    if matches!(key.kind, KeyKind::MlDsa { .. }) {
        attrs.push((CKA_VALUE, bytes(&key.public_bits)));
    }
    attrs
}

/// A certificate object's attributes; the leaf (n = 0) shares the key's label and id.
fn cert_attrs(key: &Key, cert: &Cert, n: u8) -> Vec<(CK_ATTRIBUTE_TYPE, Attr)> {
    let leaf = n == 0;
    let label = if leaf { key.name.clone() } else { format!("{} issuer {n}", key.name) };
    let id = if leaf {
        key.id.clone()
    } else {
        let bits = spki::SubjectPublicKeyInfoRef::from_der(&cert.spki)
            .map(|s| s.subject_public_key.raw_bytes().to_vec())
            .unwrap_or_default();
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &bits).as_ref().to_vec()
    };
    let mut attrs = storage_attrs(CKO_CERTIFICATE, &label, false);
    attrs.extend([
        (CKA_ID, bytes(&id)),
        (CKA_CERTIFICATE_TYPE, ulong(CKC_X_509)),
        (CKA_TRUSTED, flag(false)),
        // 1: token user (the key's own); 2: authority.
        (CKA_CERTIFICATE_CATEGORY, ulong(if leaf { 1 } else { 2 })),
        (CKA_START_DATE, bytes(&[])),
        (CKA_END_DATE, bytes(&[])),
        (CKA_SUBJECT, bytes(&cert.subject)),
        (CKA_ISSUER, bytes(&cert.issuer)),
        (CKA_SERIAL_NUMBER, bytes(&cert.serial)),
        (CKA_VALUE, bytes(&cert.der)),
        (CKA_URL, bytes(&[])),
        (CKA_HASH_OF_SUBJECT_PUBLIC_KEY, bytes(&[])),
        (CKA_HASH_OF_ISSUER_PUBLIC_KEY, bytes(&[])),
        (CKA_JAVA_MIDP_SECURITY_DOMAIN, ulong(0)),
        (CKA_PUBLIC_KEY_INFO, bytes(&cert.spki)),
    ]);
    attrs
}

/// DER OCTET STRING around `content` (`CKA_EC_POINT`).
fn octet_string(content: &[u8]) -> Vec<u8> {
    let mut out = vec![0x04];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else if len < 0x100 {
        out.extend([0x81, len as u8]);
    } else {
        out.extend([0x82, (len >> 8) as u8, len as u8]);
    }
    out.extend_from_slice(content);
    out
}

/// A key's `CKA_KEY_GEN_MECHANISM` and `CKA_ALLOWED_MECHANISMS`.
fn for_key(key: &Key) -> (CK_MECHANISM_TYPE, Vec<CK_MECHANISM_TYPE>) {
    match key.kind {
        KeyKind::Ec { .. } => {
            (CKM_EC_KEY_PAIR_GEN, vec![CKM_ECDSA, CKM_ECDSA_SHA256, CKM_ECDSA_SHA384, CKM_ECDSA_SHA512])
        }
        KeyKind::Rsa { .. } => (
            CKM_RSA_PKCS_KEY_PAIR_GEN,
            vec![
                CKM_RSA_PKCS,
                CKM_SHA256_RSA_PKCS,
                CKM_SHA384_RSA_PKCS,
                CKM_SHA512_RSA_PKCS,
                CKM_RSA_PKCS_PSS,
                CKM_SHA256_RSA_PKCS_PSS,
                CKM_SHA384_RSA_PKCS_PSS,
                CKM_SHA512_RSA_PKCS_PSS,
            ],
        ),
        KeyKind::MlDsa { .. } => (CKM_ML_DSA_KEY_PAIR_GEN, vec![CKM_ML_DSA]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_stable_distinct_and_never_zero() {
        let a = handle("web", Role::Private);
        assert_eq!(a, handle("web", Role::Private));
        assert_ne!(a, handle("web", Role::Public));
        assert_ne!(a, handle("web2", Role::Private));
        assert_ne!(handle("web", Role::Certificate(0)), handle("web", Role::Certificate(1)));
        assert!(a != 0);
    }

    /// Issue #31: 24 bits of a hash collided after a few thousand keys; the table never does.
    #[test]
    fn many_keys_never_share_a_handle() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..20_000 {
            let name = format!("k{i}");
            for role in [Role::Private, Role::Public, Role::Certificate(0)] {
                assert!(seen.insert(handle(&name, role)), "{name} {role:?} collides");
            }
        }
        assert!(seen.iter().all(|&h| h != CK_INVALID_HANDLE && h <= CK_ULONG::from(u32::MAX)));
    }

    #[test]
    fn ec_point_is_an_octet_string() {
        let point = [4u8; 65];
        let der = octet_string(&point);
        assert_eq!(&der[..2], &[0x04, 65]);
        assert_eq!(&der[2..], &point);
        assert_eq!(&octet_string(&[1; 200])[..3], &[0x04, 0x81, 200]);
    }
}
