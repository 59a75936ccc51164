//! ACME (RFC 8555) enrollment and renewal for vault keys, on the instant-acme crate.
//!
//! - [`Ca`]: an account at a CA whose key is a vault key (`jws`: ES256 signatures made in the
//!   TPM), and [`Ca::issue`], which orders a certificate for a vault key: the challenges are
//!   answered (`challenge`), the CSR is made and signed by the daemon ([`Client::create_csr`]),
//!   the chain fetched. Storing it ([`Client::set_certificate`]) is the caller's last step, so a
//!   failure anywhere leaves the stored chain as it was;
//! - [`renewal_due`]: whether a chain should be renewed (`--before DAYS`, the CA's ARI window
//!   (RFC 9773), or a third of its lifetime);
//! - `state`: what is remembered between runs (account URLs, enrollments), as JSON;
//! - `http`: the HTTPS client the requests travel on.
//!
//! Errors from the CA keep the CA's own words: [`AcmeError::Ca`] carries the problem document
//! (type, detail, subproblems) and the `Retry-After` of a `rateLimited` answer.

mod challenge;
mod http;
mod jws;
pub(crate) mod state;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use instant_acme::{
    Account, AuthorizationStatus, CertificateIdentifier, ExternalAccountKey, Identifier, NewAccount, NewOrder,
    OrderStatus, Problem, RetryPolicy,
};
use x509_cert::der::Decode as _;

pub(crate) use challenge::Method;
pub(crate) use jws::EabKey;

use tpm_vault_client::{CertSubject, Client, Error, KeyAlgorithm};

/// How long validation and issuance may take before giving up.
const ORDER_TIMEOUT: Duration = Duration::from_secs(180);

/// Why enrollment or renewal failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcmeError {
    /// The vault refused or failed (the CLI's usual exit statuses apply).
    #[error(transparent)]
    Vault(#[from] Error),
    /// The CA answered with a problem document.
    #[error("the CA refused: {}", problem_line(.problem, .retry_after.as_deref()))]
    Ca {
        /// The CA's problem document.
        problem: Problem,
        /// `Retry-After` of the answer, if any.
        retry_after: Option<String>,
    },
    /// The CA could not be reached, or spoke no ACME.
    #[error("ACME server {url}: {reason}")]
    Unreachable {
        /// The directory URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// A challenge could not be answered (port busy, hook failed, type not offered).
    #[error("challenge: {0}")]
    Challenge(String),
    /// Anything else the protocol ran into (timeouts, missing data).
    #[error("ACME: {0}")]
    Protocol(String),
    /// The state file or a certificate could not be read.
    #[error("{0}")]
    Local(String),
}

/// `rejectedIdentifier: detail [for "x": ...] (retry after N)`.
fn problem_line(problem: &Problem, retry_after: Option<&str>) -> String {
    let kind = problem.r#type.as_deref().unwrap_or("error");
    let mut line = format!(
        "{}: {}",
        kind.trim_start_matches("urn:ietf:params:acme:error:"),
        problem.detail.as_deref().unwrap_or("no detail")
    );
    for sub in &problem.subproblems {
        let who = sub.identifier.as_ref().map(|i| i.authorized(false).to_string()).unwrap_or_default();
        line.push_str(&format!("; {who}: {}", sub.detail.as_deref().unwrap_or("")));
    }
    if let Some(after) = retry_after {
        line.push_str(&format!(" (retry after {after})"));
    }
    line
}

/// An account at a CA, its key in the vault.
pub(crate) struct Ca {
    account: Account,
    key: jws::AccountKey,
    last: Arc<Mutex<jws::LastProblem>>,
    directory: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("directory", &self.directory).field("account", &self.account.id()).finish()
    }
}

/// How to reach a CA and which account to use.
#[derive(Debug)]
pub(crate) struct Connect<'a> {
    /// The directory URL.
    pub(crate) directory: &'a str,
    /// PEM bundle trusted for the CA's HTTPS (None: the system's).
    pub(crate) ca_bundle: Option<&'a std::path::Path>,
    /// The vault key of the account (created, ECDSA P-256, when missing).
    pub(crate) account_key: &'a str,
    /// The account URL, when known.
    pub(crate) account_url: Option<&'a str>,
    /// `mailto:` contacts for a new account.
    pub(crate) contact: &'a [String],
    /// External Account Binding for a new account.
    pub(crate) eab: Option<EabKey>,
}

impl Ca {
    /// Opens the account (creating the account key and registering, on first use).
    pub(crate) async fn connect(client: &Client, how: Connect<'_>) -> Result<Ca, AcmeError> {
        let unreachable = |reason: String| AcmeError::Unreachable { url: how.directory.to_owned(), reason };
        let https = http::HttpsClient::new(how.ca_bundle).map_err(AcmeError::Local)?;
        match client.key(how.account_key).await {
            Ok(_) => {}
            Err(e) if e.code() == tonic::Code::NotFound => {
                client.create_key(how.account_key, KeyAlgorithm::EccP256, None).await?;
            }
            Err(e) => return Err(e.into()),
        }
        let key = jws::AccountKey::load(client, how.account_key).await?;
        let last = Arc::new(Mutex::new(jws::LastProblem::default()));
        let crate_eab = how.eab.as_ref().map(|e| ExternalAccountKey::new(e.kid.clone(), &e.hmac));
        let signed = jws::VaultSigned::new(Arc::new(https), key.clone(), how.eab, last.clone());
        let builder = Account::builder_with_http(Box::new(signed));
        let ca_error = |e| ca_error(e, &last, how.directory);
        let account = match how.account_url {
            Some(url) => {
                // The crate wants a key of its own; every signature it makes is replaced.
                let (_, throwaway) =
                    instant_acme::Key::generate_pkcs8().map_err(|e| AcmeError::Protocol(e.to_string()))?;
                builder
                    .from_parts(url.to_owned(), throwaway, how.directory.to_owned())
                    .await
                    .map_err(|e| unreachable(error_text(&e)))?
            }
            None => {
                let contact: Vec<&str> = how.contact.iter().map(String::as_str).collect();
                let new = NewAccount { contact: &contact, terms_of_service_agreed: true, only_return_existing: false };
                builder
                    .create(&new, how.directory.to_owned(), crate_eab.as_ref())
                    .await
                    .map_err(|e| match e {
                        instant_acme::Error::Api(_) => ca_error(e),
                        other => unreachable(error_text(&other)),
                    })?
                    .0
            }
        };
        Ok(Ca { account, key, last, directory: how.directory.to_owned() })
    }

    /// The account URL.
    pub(crate) fn account_url(&self) -> &str {
        self.account.id()
    }

    /// The vault key of the account.
    pub(crate) fn account_key(&self) -> &str {
        self.key.name()
    }

    /// Orders a certificate for vault key `key` naming `domains` and `ips`, proving control
    /// with `method`; returns the PEM chain (not stored yet).
    pub(crate) async fn issue(
        &self,
        client: &Client,
        key: &str,
        domains: &[String],
        ips: &[IpAddr],
        method: &Method,
        replaces: Option<CertificateIdentifier<'static>>,
    ) -> Result<String, AcmeError> {
        let identifiers: Vec<Identifier> = domains
            .iter()
            .map(|d| Identifier::Dns(d.clone()))
            .chain(ips.iter().map(|ip| Identifier::Ip(*ip)))
            .collect();
        if identifiers.is_empty() {
            return Err(Error::InvalidInput("give at least one --domain or --ip".into()).into());
        }
        let mut new_order = NewOrder::new(&identifiers);
        if let Some(replaces) = replaces {
            new_order = new_order.replaces(replaces);
        }
        let mut order = self.account.new_order(&new_order).await.map_err(|e| self.ca_error(e))?;
        let mut responder = challenge::Responder::start(method, &identifiers).await?;
        let validated = self.validate(&mut order, &mut responder, method).await;
        responder.finish().await;
        validated?;
        let subject = CertSubject {
            subject: format!("CN={}", domains.first().map_or_else(|| ips[0].to_string(), Clone::clone)),
            dns_names: domains.to_vec(),
            ip_addresses: ips.iter().map(ToString::to_string).collect(),
            uris: Vec::new(),
        };
        let csr = client.create_csr(key, &subject).await?;
        let (_, der) = x509_cert::der::pem::decode_vec(csr.as_bytes())
            .map_err(|e| AcmeError::Protocol(format!("the vault's CSR does not parse: {e}")))?;
        order.finalize_csr(&der).await.map_err(|e| self.ca_error(e))?;
        let retries = RetryPolicy::new().timeout(ORDER_TIMEOUT);
        order.poll_certificate(&retries).await.map_err(|e| self.ca_error(e))
    }

    /// Answers every pending authorization of `order` and waits until it is ready.
    async fn validate(
        &self,
        order: &mut instant_acme::Order,
        responder: &mut challenge::Responder,
        method: &Method,
    ) -> Result<(), AcmeError> {
        let mut authorizations = order.authorizations();
        while let Some(authorization) = authorizations.next().await {
            let mut authorization = authorization.map_err(|e| self.ca_error(e))?;
            match authorization.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => {
                    return Err(AcmeError::Protocol(format!(
                        "authorization for {} is {other:?}",
                        authorization.identifier()
                    )))
                }
            }
            let identifier = authorization.identifier().identifier.clone();
            let wildcard = authorization.identifier().wildcard;
            let offered: Vec<String> = authorization.challenges.iter().map(|c| format!("{:?}", c.r#type)).collect();
            let Some(mut challenge) = authorization.challenge(method.challenge_type()) else {
                return Err(AcmeError::Challenge(format!(
                    "the CA offers no {} challenge for {identifier:?} (it offers {})",
                    method.name(),
                    offered.join(", ")
                )));
            };
            let key_authorization = self.key.key_authorization(&challenge.token);
            responder.present(&identifier, wildcard, &challenge.token, &key_authorization).await?;
            challenge.set_ready().await.map_err(|e| self.ca_error(e))?;
        }
        let retries = RetryPolicy::new().timeout(ORDER_TIMEOUT);
        let status = order.poll_ready(&retries).await.map_err(|e| self.ca_error(e))?;
        if status == OrderStatus::Ready {
            return Ok(());
        }
        // Invalid: the failed challenge says why, in the CA's words.
        let mut authorizations = order.authorizations();
        while let Some(Ok(mut authorization)) = authorizations.next().await {
            if let Ok(state) = authorization.refresh().await {
                if let Some(problem) = state.challenges.iter().find_map(|c| c.error.clone()) {
                    return Err(AcmeError::Ca { problem, retry_after: None });
                }
            }
        }
        Err(AcmeError::Protocol(format!("the order became {status:?}")))
    }

    /// The CA's suggested renewal window for `chain_pem`'s leaf, when it offers ARI.
    pub(crate) async fn renewal_window(
        &self,
        chain_pem: &str,
    ) -> Option<(SystemTime, SystemTime, CertificateIdentifier<'static>)> {
        let id = certificate_id(chain_pem)?;
        let (info, _) = self.account.renewal_info(&id).await.ok()?;
        let window = info.suggested_window;
        Some((window.start.into(), window.end.into(), id))
    }

    fn ca_error(&self, e: instant_acme::Error) -> AcmeError {
        ca_error(e, &self.last, &self.directory)
    }
}

/// Maps the crate's errors: problem documents keep the CA's words and `Retry-After`.
fn ca_error(e: instant_acme::Error, last: &Mutex<jws::LastProblem>, directory: &str) -> AcmeError {
    match e {
        instant_acme::Error::Api(problem) => {
            let retry_after = last.lock().ok().and_then(|mut l| l.retry_after.take());
            AcmeError::Ca { problem, retry_after }
        }
        instant_acme::Error::Other(source) if source.to_string().contains("cannot connect") => {
            AcmeError::Unreachable { url: directory.to_owned(), reason: source.to_string() }
        }
        other => AcmeError::Protocol(error_text(&other)),
    }
}

/// An error and its causes on one line.
fn error_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The leaf of a PEM chain.
pub(crate) fn leaf(chain_pem: &str) -> Option<x509_cert::Certificate> {
    use rustls::pki_types::pem::PemObject as _;
    let der = rustls::pki_types::CertificateDer::pem_slice_iter(chain_pem.as_bytes()).next()?.ok()?;
    x509_cert::Certificate::from_der(&der).ok()
}

/// The leaf's validity: not before, not after.
pub(crate) fn validity(chain_pem: &str) -> Option<(SystemTime, SystemTime)> {
    let cert = leaf(chain_pem)?;
    let v = &cert.tbs_certificate.validity;
    Some((v.not_before.to_system_time(), v.not_after.to_system_time()))
}

/// The RFC 9773 identifier of the chain's leaf: authority key identifier and serial.
fn certificate_id(chain_pem: &str) -> Option<CertificateIdentifier<'static>> {
    use x509_cert::der::oid::AssociatedOid as _;
    use x509_cert::ext::pkix::AuthorityKeyIdentifier;
    let cert = leaf(chain_pem)?;
    let tbs = &cert.tbs_certificate;
    let aki = tbs.extensions.as_ref()?.iter().find(|e| e.extn_id == AuthorityKeyIdentifier::OID)?;
    let aki = AuthorityKeyIdentifier::from_der(aki.extn_value.as_bytes()).ok()?;
    let key_id = aki.key_identifier?;
    Some(
        CertificateIdentifier::new(
            rustls::pki_types::Der::from_slice(key_id.as_bytes()),
            rustls::pki_types::Der::from_slice(tbs.serial_number.as_bytes()),
        )
        .into_owned(),
    )
}

/// Why a chain is (or is not yet) due for renewal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Due {
    /// Renew now.
    pub(crate) now: bool,
    /// When renewal becomes due.
    pub(crate) from: SystemTime,
    /// Which rule: `--before`, `ARI`, `a third of its lifetime`.
    pub(crate) rule: &'static str,
}

/// Whether a leaf valid from `not_before` to `not_after` is due at `now`: within `before` of
/// expiry if given, else from the start of the CA's ARI window if there is one, else in the
/// last third of its lifetime.
pub(crate) fn renewal_due(
    not_before: SystemTime,
    not_after: SystemTime,
    now: SystemTime,
    before: Option<Duration>,
    ari_start: Option<SystemTime>,
) -> Due {
    let (from, rule) = match (before, ari_start) {
        (Some(before), _) => (not_after.checked_sub(before).unwrap_or(SystemTime::UNIX_EPOCH), "--before"),
        (None, Some(start)) => (start, "the CA's renewal window (ARI)"),
        (None, None) => {
            let lifetime = not_after.duration_since(not_before).unwrap_or_default();
            (not_after.checked_sub(lifetime / 3).unwrap_or(SystemTime::UNIX_EPOCH), "a third of its lifetime")
        }
    };
    Due { now: now >= from, from, rule }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_by_third_of_lifetime_before_and_ari() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let end = t0 + Duration::from_secs(90 * 86400);
        let day = Duration::from_secs(86400);
        // Third of 90 days: due from day 60.
        assert!(!renewal_due(t0, end, t0 + 59 * day, None, None).now);
        let due = renewal_due(t0, end, t0 + 61 * day, None, None);
        assert!(due.now && due.rule == "a third of its lifetime");
        assert_eq!(due.from, t0 + 60 * day);
        // --before wins over ARI; ARI over the default.
        assert!(renewal_due(t0, end, t0 + day, Some(90 * day), Some(end)).now);
        assert!(renewal_due(t0, end, t0 + 2 * day, None, Some(t0 + day)).now);
        assert!(!renewal_due(t0, end, t0 + 61 * day, None, Some(t0 + 80 * day)).now);
    }

    #[test]
    fn ari_identifier_is_the_leafs_authority_key_id_and_serial() {
        use base64::prelude::{Engine as _, BASE64_URL_SAFE_NO_PAD};
        use x509_cert::der::oid::AssociatedOid as _;
        use x509_cert::ext::pkix::SubjectKeyIdentifier;
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut params = rcgen::CertificateParams::new(vec!["a.test".to_owned()]).unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&[0x00, 0x9a, 0x01]));
        params.use_authority_key_identifier_extension = true;
        let issued = params.signed_by(&rcgen::KeyPair::generate().unwrap(), &issuer).unwrap();
        let id = certificate_id(&format!("{}{}", issued.pem(), ca_cert.pem())).unwrap();
        assert_eq!(id.serial, BASE64_URL_SAFE_NO_PAD.encode([0x00, 0x9a, 0x01]));
        // RFC 9773: the keyIdentifier's bytes, which are the issuer's subject key identifier.
        let extensions = leaf(&ca_cert.pem()).unwrap().tbs_certificate.extensions.unwrap();
        let ski = extensions.into_iter().find(|e| e.extn_id == SubjectKeyIdentifier::OID).unwrap();
        let ski = SubjectKeyIdentifier::from_der(ski.extn_value.as_bytes()).unwrap();
        assert_eq!(id.authority_key_identifier, BASE64_URL_SAFE_NO_PAD.encode(ski.0.as_bytes()));
        assert!(certificate_id("no pem").is_none());
    }

    #[test]
    fn problem_lines_keep_the_ca_words() {
        let problem: Problem = serde_json::from_value(serde_json::json!({
            "type": "urn:ietf:params:acme:error:rateLimited",
            "detail": "too many certificates",
            "status": 429
        }))
        .unwrap();
        let e = AcmeError::Ca { problem, retry_after: Some("3600".into()) };
        assert_eq!(e.to_string(), "the CA refused: rateLimited: too many certificates (retry after 3600)");
    }
}
