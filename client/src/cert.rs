//! Certificates of vault keys: requests (CSR) and self-signed certificates signed by the TPM,
//! and the chain stored with each key ([`Client::create_csr`], [`Client::self_sign`],
//! [`Client::set_certificate`], [`Client::certificate`]).
//!
//! Owns the friendly types ([`CertSubject`], [`CertificateChain`]) and the `dns:`/`ip:`/`uri:`
//! alternative-name syntax of the CLI. Chains are checked by the daemon, not here; TLS use of
//! the chain is in [`crate::tls`].

use std::fmt;
use std::str::FromStr;

use tpm_vault_proto::v1 as proto;

use crate::{Client, Error};

/// The subject and alternative names of a request or certificate.
///
/// ```
/// use tpm_vault_client::CertSubject;
///
/// let subject = CertSubject::new("CN=device-1,O=Example").with_sans("dns:device-1.example,ip:10.0.0.7")?;
/// assert_eq!(subject.dns_names, ["device-1.example"]);
/// # Ok::<(), tpm_vault_client::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertSubject {
    /// Distinguished name, `CN=device-1,O=Example` (encoded in the order written; `\,`
    /// escapes a comma). Attributes: CN, O, OU, C, ST, L.
    pub subject: String,
    /// DNS names.
    pub dns_names: Vec<String>,
    /// IP addresses.
    pub ip_addresses: Vec<String>,
    /// URIs, e.g. a SPIFFE ID.
    pub uris: Vec<String>,
}

impl CertSubject {
    /// A subject without alternative names.
    pub fn new(subject: impl Into<String>) -> CertSubject {
        CertSubject { subject: subject.into(), ..CertSubject::default() }
    }

    /// Adds alternative names written as `dns:NAME`, `ip:ADDR` or `uri:URI`, comma-separated.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an entry without one of those prefixes or an invalid IP.
    pub fn with_sans(mut self, sans: &str) -> Result<CertSubject, Error> {
        for entry in sans.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match entry.parse::<San>()? {
                San::Dns(d) => self.dns_names.push(d),
                San::Ip(i) => self.ip_addresses.push(i),
                San::Uri(u) => self.uris.push(u),
            }
        }
        Ok(self)
    }

    pub(crate) fn to_proto(&self) -> proto::CertificateSubject {
        proto::CertificateSubject {
            subject: self.subject.clone(),
            dns_names: self.dns_names.clone(),
            ip_addresses: self.ip_addresses.clone(),
            uris: self.uris.clone(),
        }
    }
}

/// One subject alternative name, as the CLI writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum San {
    /// `dns:NAME`.
    Dns(String),
    /// `ip:ADDR`.
    Ip(String),
    /// `uri:URI`.
    Uri(String),
}

impl FromStr for San {
    type Err = Error;

    fn from_str(s: &str) -> Result<San, Error> {
        match s.split_once(':') {
            Some(("dns", v)) if !v.is_empty() => Ok(San::Dns(v.to_owned())),
            Some(("ip", v)) => v
                .parse::<std::net::IpAddr>()
                .map(|_| San::Ip(v.to_owned()))
                .map_err(|_| Error::InvalidInput(format!("{v:?} is not an IP address"))),
            Some(("uri", v)) if !v.is_empty() => Ok(San::Uri(v.to_owned())),
            _ => Err(Error::InvalidInput(format!(
                "alternative name {s:?} must be dns:NAME, ip:ADDR or uri:URI (e.g. dns:device-1.example)"
            ))),
        }
    }
}

impl fmt::Display for San {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            San::Dns(v) => write!(f, "dns:{v}"),
            San::Ip(v) => write!(f, "ip:{v}"),
            San::Uri(v) => write!(f, "uri:{v}"),
        }
    }
}

/// A key's certificate chain as stored by the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateChain {
    /// Key name.
    pub name: String,
    /// PEM certificates, leaf first.
    pub chain_pem: String,
    /// Increases each time the chain is replaced.
    pub version: u64,
    /// TPM object name of the key (hex); changes if the key is re-created.
    pub tpm_name: String,
}

impl From<proto::CertificateChain> for CertificateChain {
    fn from(c: proto::CertificateChain) -> CertificateChain {
        CertificateChain { name: c.name, chain_pem: c.chain_pem, version: c.version, tpm_name: c.tpm_name }
    }
}

impl Client {
    /// A PKCS#10 certificate signing request for `name`, signed by the TPM, as PEM.
    ///
    /// # Errors
    /// `NotFound`, `InvalidArgument` (bad subject or names), `PermissionDenied` (needs `sign`),
    /// and the errors of [`Client::sign`].
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{CertSubject, Client};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let csr = client.create_csr("web", &CertSubject::new("CN=web.example")).await?;
    /// std::fs::write("web.csr", csr).ok();
    /// # Ok(()) }
    /// ```
    pub async fn create_csr(&self, name: &str, subject: &CertSubject) -> Result<String, Error> {
        let request = self.request(proto::CreateCsrRequest {
            name: name.to_owned(),
            subject: Some(subject.to_proto()),
            auth: Vec::new(),
        });
        Ok(self.keys.clone().create_csr(request).await?.into_inner().pem)
    }

    /// Issues a self-signed certificate for `name` (signed by the TPM), valid for `days` days
    /// (0 = 365), and stores it as the key's chain.
    ///
    /// # Errors
    /// As [`Client::create_csr`]; also needs `create` (the stored chain is replaced).
    pub async fn self_sign(&self, name: &str, subject: &CertSubject, days: u32) -> Result<CertificateChain, Error> {
        let request = self.request(proto::CreateSelfSignedCertificateRequest {
            name: name.to_owned(),
            subject: Some(subject.to_proto()),
            days,
            auth: Vec::new(),
        });
        Ok(self.keys.clone().create_self_signed_certificate(request).await?.into_inner().into())
    }

    /// Stores a certificate chain (PEM, the key's own certificate first) with `name`.
    ///
    /// # Errors
    /// `InvalidArgument` when the PEM does not parse, the first certificate is not for this
    /// key, or the chain is out of order; `NotFound`; `PermissionDenied` (needs `create`).
    pub async fn set_certificate(&self, name: &str, chain_pem: &str) -> Result<CertificateChain, Error> {
        let request =
            self.request(proto::SetCertificateRequest { name: name.to_owned(), chain_pem: chain_pem.to_owned() });
        Ok(self.keys.clone().set_certificate(request).await?.into_inner().into())
    }

    /// The chain stored with `name`.
    ///
    /// # Errors
    /// `NotFound` when the key or its certificate does not exist; `PermissionDenied` (needs
    /// `public`).
    pub async fn certificate(&self, name: &str) -> Result<CertificateChain, Error> {
        let request = self.request(proto::GetCertificateRequest { name: name.to_owned() });
        Ok(self.keys.clone().get_certificate(request).await?.into_inner().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sans_parse() {
        let s = CertSubject::new("CN=a").with_sans("dns:a.example, ip:::1,uri:spiffe://x/y").unwrap();
        assert_eq!(s.dns_names, ["a.example"]);
        assert_eq!(s.ip_addresses, ["::1"]);
        assert_eq!(s.uris, ["spiffe://x/y"]);
        assert!(CertSubject::new("CN=a").with_sans("a.example").is_err());
        assert!(CertSubject::new("CN=a").with_sans("ip:300.1.1.1").is_err());
        assert_eq!(San::Dns("x".into()).to_string(), "dns:x");
    }
}
