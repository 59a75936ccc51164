//! Certificates for vault keys: PKCS#10 requests and self-signed certificates signed by the
//! TPM (assembled with rcgen), and the checks a certificate chain passes before it is stored
//! with its key (in the key record's `cert_chain_pem`, replaced atomically, with a version
//! counter that TLS certificate resolvers watch).
//!
//! Signing is an async *pre-sign*: rcgen's [`rcgen::SigningKey::sign`] is synchronous, so the
//! request or certificate is built twice with the same parameters. The first pass captures the
//! to-be-signed bytes; they are signed through the TPM actor like any other message
//! ([`Vault::sign`], which handles passwords and PCR policies); the second pass replays that
//! signature and checks that rcgen asked for exactly the same bytes. No thread blocks.
//!
//! This module does not do TLS (see [`crate::serve::tls`]) and does not verify chain signatures: a
//! chain is checked for form (PEM, X.509), for its leaf holding the key's public key, and for
//! leaf-first issuing order.

use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::Arc;

use rcgen::string::Ia5String;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyUsagePurpose,
    PublicKeyData, SanType, SerialNumber, SignatureAlgorithm,
};
use spki::der::Decode as _;
use tpm_vault_proto::algorithm::{Curve, Family};
use x509_cert::der::Encode as _;

use super::{Loaded, Password, SignRequest, Vault};
use crate::error::{ChainArg, Error, Invalid, SubjectArg};
use crate::model::{HashAlg, KeyName, Scheme, SignInput};

/// Longest chain PEM accepted by [`Vault::set_certificate`].
pub const MAX_CHAIN_PEM: usize = 256 * 1024;
/// Most certificates in a chain.
pub const MAX_CHAIN_LEN: usize = 16;
/// Validity of a self-signed certificate when none is given.
pub const DEFAULT_DAYS: u32 = 365;
/// Longest validity of a self-signed certificate (about 100 years).
pub const MAX_DAYS: u32 = 36_500;
/// Longest DN attribute value (RFC 5280 upper bounds are 64 for most attributes).
const MAX_ATTRIBUTE: usize = 64;
/// Most subject alternative names.
const MAX_SANS: usize = 100;
/// Backdating of `notBefore`, for peers whose clocks lag a little.
const BACKDATE: time::Duration = time::Duration::hours(1);

/// Subject and alternative names of a request or certificate, parsed and checked at the RPC
/// edge.
#[derive(Debug, Clone)]
pub struct CertSubject {
    dn: DistinguishedName,
    sans: Vec<SanType>,
}

impl CertSubject {
    /// Parses `subject` (`CN=device-1,O=Example`; `\,` escapes a comma) and the alternative
    /// names.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the attribute or name at fault.
    pub fn parse(subject: &str, dns: &[String], ips: &[String], uris: &[String]) -> Result<Self, Error> {
        let mut dn = DistinguishedName::new();
        let mut seen = Vec::new();
        for part in split_unescaped(subject) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (key, value) =
                part.split_once('=').ok_or_else(|| Error::from(Invalid::from(SubjectArg::NotKeyValue(short(part)))))?;
            let (key, value) = (key.trim(), value.trim());
            let ty = dn_type(key)?;
            if seen.contains(&ty) {
                return Err(Invalid::from(SubjectArg::Twice(key.to_owned())).into());
            }
            if value.is_empty() || value.chars().count() > MAX_ATTRIBUTE || value.chars().any(char::is_control) {
                return Err(Invalid::from(SubjectArg::Value { key: key.to_owned(), max: MAX_ATTRIBUTE }).into());
            }
            if ty == DnType::CountryName && !(value.len() == 2 && value.chars().all(|c| c.is_ascii_alphabetic())) {
                return Err(Invalid::from(SubjectArg::Country).into());
            }
            seen.push(ty.clone());
            dn.push(ty, value);
        }
        if seen.is_empty() {
            return Err(Invalid::from(SubjectArg::Required).into());
        }
        let mut sans = Vec::new();
        for d in dns {
            let ok = !d.is_empty()
                && d.len() <= 253
                && d.split('.').all(|l| !l.is_empty() && l.len() <= 63)
                && d.bytes()
                    .enumerate()
                    .all(|(i, b)| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || (b == b'*' && i == 0));
            if !ok {
                return Err(Invalid::from(SubjectArg::Dns(short(d))).into());
            }
            sans.push(SanType::DnsName(ia5(d)?));
        }
        for ip in ips {
            let addr: IpAddr = ip.parse().map_err(|_| Error::from(Invalid::from(SubjectArg::Ip(short(ip)))))?;
            sans.push(SanType::IpAddress(addr));
        }
        for uri in uris {
            let ok = uri.split_once("://").is_some_and(|(scheme, rest)| !scheme.is_empty() && !rest.is_empty())
                && uri.len() <= 2048
                && uri.bytes().all(|b| b.is_ascii_graphic());
            if !ok {
                return Err(Invalid::from(SubjectArg::Uri(short(uri))).into());
            }
            sans.push(SanType::URI(ia5(uri)?));
        }
        if sans.len() > MAX_SANS {
            return Err(Invalid::from(SubjectArg::TooManyNames(MAX_SANS)).into());
        }
        Ok(Self { dn, sans })
    }
}

/// A key's stored certificate chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChain {
    /// Key name.
    pub name: KeyName,
    /// PEM certificates, leaf first.
    pub chain_pem: String,
    /// Replacement counter (see [`crate::store::KeyRecord::cert_version`]).
    pub version: u64,
    /// The key's TPM object name.
    pub tpm_name: Vec<u8>,
}

impl Vault {
    /// A PKCS#10 certificate signing request for `name`, signed by the TPM. Returns PEM and DER.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], [`Error::InvalidArgument`], and the errors of [`Vault::sign`].
    pub async fn create_csr(
        &self,
        name: &KeyName,
        subject: CertSubject,
        auth: Option<Password>,
    ) -> Result<(String, Vec<u8>), Error> {
        let loaded = self.load(name).await?;
        let key = TpmPublicKey::of(&loaded)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject.dn;
        params.subject_alt_names = subject.sans;
        params.key_identifier_method = KeyIdMethod::PreSpecified(key.key_id());
        // A request carries no serial: the CA assigns it (rcgen refuses one here).
        params.serial_number = None;
        let der = self
            .presign(name, &key, auth, |signer| params.serialize_request(signer).map(|csr| csr.der().to_vec()))
            .await?;
        Ok((pem("CERTIFICATE REQUEST", &der), der))
    }

    /// Issues a self-signed certificate for `name` (signed by the TPM) valid for `days` days
    /// from an hour ago, and stores it as the key's chain.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], [`Error::InvalidArgument`], the errors of [`Vault::sign`] and
    /// store errors.
    pub async fn self_sign(
        &self,
        name: &KeyName,
        subject: CertSubject,
        days: u32,
        auth: Option<Password>,
    ) -> Result<StoredChain, Error> {
        let days = if days == 0 { DEFAULT_DAYS } else { days };
        if days > MAX_DAYS {
            return Err(Error::invalid(format!("validity longer than {MAX_DAYS} days")));
        }
        let loaded = self.load(name).await?;
        let key = TpmPublicKey::of(&loaded)?;
        let now = time::OffsetDateTime::from_unix_timestamp(super::unix_now())
            .map_err(|e| Error::Internal(format!("clock: {e}")))?;
        let mut serial = [0u8; 16];
        self.random(&mut serial)?;
        serial[0] &= 0x7f;
        serial[0] |= 0x01;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject.dn;
        params.subject_alt_names = subject.sans;
        let clock = || Error::Internal("certificate validity out of range".into());
        params.not_before = now.checked_sub(BACKDATE).ok_or_else(clock)?;
        params.not_after = now.checked_add(time::Duration::days(i64::from(days))).ok_or_else(clock)?;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.key_identifier_method = KeyIdMethod::PreSpecified(key.key_id());
        let der = self.presign(name, &key, auth, |signer| params.self_signed(signer).map(|c| c.der().to_vec())).await?;
        let stored = self.set_certificate(name, &pem("CERTIFICATE", &der)).await?;
        tracing::info!(key = %name, days, "self-signed certificate issued");
        Ok(stored)
    }

    /// Checks `chain_pem` (PEM certificates, leaf first) against the key and stores it in the
    /// key's record, replacing any earlier chain and bumping the version.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::InvalidArgument`] when the PEM does not parse, the
    /// leaf's public key is not the key's, or the chain is out of order; store errors.
    pub async fn set_certificate(&self, name: &KeyName, chain_pem: &str) -> Result<StoredChain, Error> {
        if chain_pem.len() > MAX_CHAIN_PEM {
            return Err(Invalid::from(ChainArg::TooLarge(MAX_CHAIN_PEM)).into());
        }
        let _guard = self.inner.cert_lock.lock().await;
        let loaded = self.load(name).await?;
        let normalized = check_chain(chain_pem, &loaded.spki)?;
        let mut record = loaded.record.clone();
        record.cert_chain_pem = Some(normalized);
        record.cert_version = record.cert_version.saturating_add(1);
        // Under `cert_lock`, so a delete cannot slip in between the read and the write.
        self.replace_record(name, &record).await?;
        let stored = chain_of(&record).ok_or_else(|| Error::Internal("stored chain vanished".into()))?;
        let fresh = Arc::new(Loaded {
            record,
            blob: loaded.blob.clone(),
            spki: loaded.spki.clone(),
            wrap: loaded.wrap.clone(),
            pq_spki: loaded.pq_spki.clone(),
        });
        if let Ok(mut cache) = self.inner.cache.lock() {
            cache.insert(name.clone(), fresh);
        }
        tracing::info!(key = %name, version = stored.version, "certificate chain stored");
        Ok(stored)
    }

    /// The key's stored certificate chain.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`]; [`Error::NoCertificate`] if it has none; store errors.
    pub async fn certificate(&self, name: &KeyName) -> Result<StoredChain, Error> {
        let loaded = self.load(name).await?;
        chain_of(&loaded.record).ok_or_else(|| Error::NoCertificate(name.clone()))
    }

    /// Signs with rcgen's synchronous signer interface through the async TPM path: `build` runs
    /// once to capture the bytes to sign, once more to embed the signature.
    async fn presign<T>(
        &self,
        name: &KeyName,
        key: &TpmPublicKey,
        auth: Option<Password>,
        build: impl Fn(&PreSigner<'_>) -> Result<T, rcgen::Error>,
    ) -> Result<T, Error> {
        let capture = PreSigner { key, mode: Mode::Capture(RefCell::new(None)) };
        build(&capture).map_err(|e| Error::invalid(format!("cannot build the request: {e}")))?;
        let tbs = match capture.mode {
            Mode::Capture(cell) => cell.into_inner(),
            Mode::Replay { .. } => None,
        }
        .ok_or_else(|| Error::Internal("rcgen asked for no signature".into()))?;
        let request =
            SignRequest { input: SignInput::Message(tbs.clone()), hash: Some(key.hash), scheme: Some(key.scheme) };
        let signature = self.sign(name, request, auth).await?.signature;
        let replay = PreSigner { key, mode: Mode::Replay { message: tbs, signature } };
        build(&replay).map_err(|e| Error::Internal(format!("second pass of the TPM-signed structure: {e}")))
    }
}

/// The key's stored chain, if it has one.
fn chain_of(record: &crate::store::KeyRecord) -> Option<StoredChain> {
    record.cert_chain_pem.as_ref().map(|pem| StoredChain {
        name: record.name.clone(),
        chain_pem: pem.clone(),
        version: record.cert_version,
        tpm_name: record.object.tpm_name.clone(),
    })
}

/// A vault key's public half as rcgen sees it, plus how the TPM signs for that algorithm.
struct TpmPublicKey {
    /// The BIT STRING content of the SubjectPublicKeyInfo.
    raw: Vec<u8>,
    alg: &'static SignatureAlgorithm,
    hash: HashAlg,
    scheme: Scheme,
}

impl TpmPublicKey {
    fn of(loaded: &Loaded) -> Result<Self, Error> {
        let spki = spki::SubjectPublicKeyInfoRef::from_der(&loaded.spki)
            .map_err(|e| Error::Internal(format!("key SPKI: {e}")))?;
        let raw = spki.subject_public_key.raw_bytes().to_vec();
        let info = loaded.record.alg.info();
        let (alg, hash, scheme) = match (info.family, info.curve()) {
            (_, Some(Curve::NistP256)) => (&rcgen::PKCS_ECDSA_P256_SHA256, HashAlg::Sha256, Scheme::Ecdsa),
            (_, Some(Curve::NistP384)) => (&rcgen::PKCS_ECDSA_P384_SHA384, HashAlg::Sha384, Scheme::Ecdsa),
            // PKCS#1 v1.5 for certificate signatures: what every verifier accepts.
            (Family::Rsa, _) => (&rcgen::PKCS_RSA_SHA256, HashAlg::Sha256, Scheme::RsaPkcs1),
            _ => {
                let other = loaded.record.alg;
                return Err(Error::invalid(format!(
                    "certificates and CSRs are not supported for {other} keys (only ECC and RSA keys)"
                )));
            }
        };
        Ok(Self { raw, alg, hash, scheme })
    }

    /// RFC 7093 method 1 key identifier (truncated SHA-256 of the public key), as rcgen
    /// computes it with a crypto backend; set explicitly so it never depends on rcgen features.
    fn key_id(&self) -> Vec<u8> {
        let mut id = HashAlg::Sha256.digest(&self.raw);
        id.truncate(20);
        id
    }
}

/// rcgen's signer during [`Vault::presign`].
struct PreSigner<'a> {
    key: &'a TpmPublicKey,
    mode: Mode,
}

enum Mode {
    /// First pass: remember what to sign, return a placeholder.
    Capture(RefCell<Option<Vec<u8>>>),
    /// Second pass: return the TPM's signature for exactly this message.
    Replay { message: Vec<u8>, signature: Vec<u8> },
}

impl PublicKeyData for PreSigner<'_> {
    fn der_bytes(&self) -> &[u8] {
        &self.key.raw
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.key.alg
    }
}

impl rcgen::SigningKey for PreSigner<'_> {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        match &self.mode {
            Mode::Capture(cell) => {
                *cell.borrow_mut() = Some(msg.to_vec());
                Ok(vec![0; 64])
            }
            Mode::Replay { message, signature } if message.as_slice() == msg => Ok(signature.clone()),
            Mode::Replay { .. } => Err(rcgen::Error::RemoteKeyError),
        }
    }
}

/// Parses and checks a chain; returns it re-encoded as clean PEM (one block per certificate).
///
/// # Errors
/// [`Error::InvalidArgument`] naming what is wrong with the chain.
pub fn check_chain(chain_pem: &str, key_spki: &[u8]) -> Result<String, Error> {
    let certs = parse_chain(chain_pem)?;
    let Some(leaf) = certs.first() else {
        return Err(Invalid::from(ChainArg::Empty).into());
    };
    if certs.len() > MAX_CHAIN_LEN {
        return Err(Invalid::from(ChainArg::TooMany(MAX_CHAIN_LEN)).into());
    }
    let key =
        spki::SubjectPublicKeyInfoRef::from_der(key_spki).map_err(|e| Error::Internal(format!("key SPKI: {e}")))?;
    let theirs = &leaf.tbs_certificate.subject_public_key_info;
    let same_alg = theirs.algorithm.oid == key.algorithm.oid
        && (theirs.algorithm.oid == RSA_ENCRYPTION
            || theirs.algorithm.parameters.as_ref().map(|p| p.to_der().ok()).unwrap_or_default()
                == key.algorithm.parameters.as_ref().map(|p| p.to_der().ok()).unwrap_or_default());
    if !same_alg || theirs.subject_public_key.raw_bytes() != key.subject_public_key.raw_bytes() {
        return Err(Invalid::from(ChainArg::NotThisKey).into());
    }
    for (i, pair) in certs.windows(2).enumerate() {
        if pair[0].tbs_certificate.issuer != pair[1].tbs_certificate.subject {
            return Err(Invalid::from(ChainArg::NotIssuedBy { cert: i + 1, issuer: i + 2 }).into());
        }
    }
    let mut out = String::new();
    for cert in &certs {
        let der = cert.to_der().map_err(|e| Error::Internal(format!("re-encoding a certificate: {e}")))?;
        out.push_str(&pem("CERTIFICATE", &der));
    }
    Ok(out)
}

/// `rsaEncryption`, whose NULL parameters some encoders omit.
const RSA_ENCRYPTION: x509_cert::spki::ObjectIdentifier =
    x509_cert::spki::ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

/// Parses every PEM block of `text`; each must be a CERTIFICATE.
///
/// # Errors
/// [`Error::InvalidArgument`] for text without a certificate, or any other block.
pub fn parse_chain(text: &str) -> Result<Vec<x509_cert::Certificate>, Error> {
    let mut certs = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let block = &rest[start..];
        let label_end = block[11..].find("-----").map(|i| i + 11).ok_or_else(|| bad_pem("unterminated BEGIN line"))?;
        let label = &block[11..label_end];
        let end_marker = format!("-----END {label}-----");
        let end = block.find(&end_marker).ok_or_else(|| bad_pem(&format!("no END line for {}", short(label))))?;
        let whole = &block[..end + end_marker.len()];
        if label != "CERTIFICATE" {
            return Err(Invalid::from(ChainArg::NotCertificate(short(label))).into());
        }
        let (_, der) = x509_cert::der::pem::decode_vec(whole.as_bytes()).map_err(|e| bad_pem(&e.to_string()))?;
        let cert = <x509_cert::Certificate as x509_cert::der::Decode>::from_der(&der)
            .map_err(|e| Error::from(Invalid::from(ChainArg::X509 { n: certs.len() + 1, why: e.to_string() })))?;
        certs.push(cert);
        rest = &block[end + end_marker.len()..];
    }
    if certs.is_empty() {
        return Err(Invalid::from(ChainArg::NoBlock).into());
    }
    Ok(certs)
}

fn bad_pem(why: &str) -> Error {
    Invalid::from(ChainArg::Pem(why.to_owned())).into()
}

/// PEM armour with 64-column lines.
pub(crate) fn pem(label: &str, der: &[u8]) -> String {
    use p256::pkcs8::der::pem::{encode_string, LineEnding};
    encode_string(label, LineEnding::LF, der).unwrap_or_default()
}

fn split_unescaped(s: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    if let Some(last) = parts.last_mut() {
                        last.push(next);
                    }
                }
            }
            ',' => parts.push(String::new()),
            c => {
                if let Some(last) = parts.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    parts
}

fn dn_type(key: &str) -> Result<DnType, Error> {
    Ok(match key.to_ascii_uppercase().as_str() {
        "CN" => DnType::CommonName,
        "O" => DnType::OrganizationName,
        "OU" => DnType::OrganizationalUnitName,
        "C" => DnType::CountryName,
        "ST" => DnType::StateOrProvinceName,
        "L" => DnType::LocalityName,
        _ => return Err(Invalid::from(SubjectArg::Unsupported(short(key))).into()),
    })
}

fn ia5(s: &str) -> Result<Ia5String, Error> {
    Ia5String::try_from(s.to_owned()).map_err(|_| Error::from(Invalid::from(SubjectArg::NotAscii(short(s)))))
}

fn short(s: &str) -> String {
    crate::model::truncate_for_message(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_parse_in_order_and_reject_nonsense() {
        let s = CertSubject::parse("CN=device-1, O=Example\\, Inc.", &["a.example".into()], &["10.0.0.1".into()], &[])
            .unwrap_or_else(|e| panic!("{e}"));
        let order: Vec<_> = s.dn.iter().map(|(t, _)| t.clone()).collect();
        assert_eq!(order, vec![DnType::CommonName, DnType::OrganizationName]);
        assert_eq!(s.sans.len(), 2);
        for bad in ["", "CN", "XX=1", "CN=a,CN=b", "C=Germany"] {
            assert!(CertSubject::parse(bad, &[], &[], &[]).is_err(), "{bad:?}");
        }
        assert!(CertSubject::parse("CN=a", &["bad name".into()], &[], &[]).is_err());
        assert!(CertSubject::parse("CN=a", &[], &["1.2.3".into()], &[]).is_err());
        assert!(CertSubject::parse("CN=a", &[], &[], &["nope".into()]).is_err());
        assert!(CertSubject::parse("CN=a", &[], &[], &["spiffe://example.org/agent".into()]).is_ok());
    }

    #[test]
    fn chains_must_be_pem_certificates() {
        assert!(parse_chain("").is_err());
        assert!(parse_chain("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").is_err());
        assert!(parse_chain("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").is_err());
    }
}
