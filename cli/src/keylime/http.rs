//! The JSON-over-HTTP(S) exchanges with Keylime's registrar and verifier: one connection and
//! one HTTP/1.1 request per call (hyper, rustls with the project's aws-lc-rs provider), with a
//! deadline, the way `crate::acme` talks to an ACME CA.
//!
//! Owns the transport only: status, `Retry-After` and the JSON body go back to the caller, who
//! knows what they mean. `http://` is allowed because Keylime registers agents over plain HTTP
//! (the registrar's `port`; what is sent there is public: the EK, the AK, a MakeCredential
//! blob); the verifier is always reached over TLS.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::KeylimeError;

/// Where Debian (and derivatives) keep the system's trusted CAs.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Longest time one exchange (connect, TLS, request, whole response) may take.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest response body accepted (Keylime's answers are a few KiB; an attestation listing
/// with its evidence may be larger).
const MAX_RESPONSE: usize = 4 * 1024 * 1024;

/// A response: status, the `Retry-After` seconds if any, and the body parsed as JSON (`Null`
/// when empty or not JSON).
#[derive(Debug, Clone)]
pub(crate) struct JsonResponse {
    /// HTTP status.
    pub status: StatusCode,
    /// `Retry-After` in seconds (429 and 503 carry it).
    pub retry_after: Option<u64>,
    /// The body.
    pub body: serde_json::Value,
}

/// A client for one server (`http://` or `https://` base URL).
#[derive(Clone)]
pub(crate) struct JsonClient {
    base: http::Uri,
    tls: Option<TlsConnector>,
    timeout: Duration,
    /// `application/json` (registrar) or `application/vnd.api+json` (the verifier's JSON:API
    /// push endpoints refuse anything else).
    content_type: &'static str,
}

impl std::fmt::Debug for JsonClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonClient").field("base", &self.base).finish_non_exhaustive()
    }
}

impl JsonClient {
    /// A client for `base` (`https://host:port` or `http://host:port`), trusting the PEM CA
    /// certificates in `ca` (else the system bundle) for `https`.
    pub(crate) fn new(
        what: &'static str,
        base: &str,
        ca: Option<&Path>,
        content_type: &'static str,
    ) -> Result<Self, KeylimeError> {
        let bad = |reason: String| KeylimeError::Config(format!("{what} URL {base:?}: {reason}"));
        let base: http::Uri =
            base.trim_end_matches('/').parse().map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
        if base.host().is_none() {
            return Err(bad("no host".into()));
        }
        let tls = match base.scheme_str() {
            Some("https") => Some(connector(ca)?),
            Some("http") => None,
            _ => return Err(bad("expected http:// or https://".into())),
        };
        Ok(Self { base, tls, timeout: REQUEST_TIMEOUT, content_type })
    }

    /// Sends `body` (JSON, if any) to `path` with `method`, with a bearer token if given.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        bearer: Option<&str>,
    ) -> Result<JsonResponse, KeylimeError> {
        let what = format!("{method} {}{path}", self.base);
        match tokio::time::timeout(self.timeout, self.exchange(method, path, body, bearer)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(reason)) => Err(KeylimeError::Unreachable { request: what, reason }),
            Err(_) => Err(KeylimeError::Unreachable {
                request: what,
                reason: format!("no answer within {} s", self.timeout.as_secs()),
            }),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        bearer: Option<&str>,
    ) -> Result<JsonResponse, String> {
        let host = self.base.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
        let default_port = if self.tls.is_some() { 443 } else { 80 };
        let port = self.base.port_u16().unwrap_or(default_port);
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect: {}", tpm_vault_client::io_reason(&e)))?;
        let authority = self.base.authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
        let prefix = self.base.path().trim_end_matches('/');
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{prefix}{path}"))
            .header(http::header::HOST, authority)
            .header(http::header::ACCEPT, "application/json");
        if let Some(token) = bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let bytes = match body {
            Some(v) => {
                req = req.header(http::header::CONTENT_TYPE, self.content_type);
                Bytes::from(serde_json::to_vec(v).map_err(|e| e.to_string())?)
            }
            None => Bytes::new(),
        };
        let req = req.body(Full::new(bytes)).map_err(|e| e.to_string())?;
        match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(host.clone()).map_err(|e| format!("bad host name {host}: {e}"))?;
                let stream =
                    tls.connect(name, tcp).await.map_err(|e| format!("TLS: {}", tpm_vault_client::io_reason(&e)))?;
                round_trip(stream, req).await
            }
            None => round_trip(tcp, req).await,
        }
    }
}

async fn round_trip<S>(stream: S, req: Request<Full<Bytes>>) -> Result<JsonResponse, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    let driver = tokio::spawn(connection);
    let response = sender.send_request(req).await.map_err(|e| format!("the connection dropped: {e}"))?;
    let (parts, body) = response.into_parts();
    let body = http_body_util::Limited::new(body, MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| format!("the connection dropped while reading the answer: {e}"))?
        .to_bytes();
    driver.abort();
    let retry_after = parts
        .headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|s| s.max(0.0).ceil() as u64);
    let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    Ok(JsonResponse { status: parts.status, retry_after, body })
}

/// A TLS connector trusting `ca` (PEM) or the system bundle.
fn connector(ca: Option<&Path>) -> Result<TlsConnector, KeylimeError> {
    let path = match ca {
        Some(p) => p.to_path_buf(),
        None => std::env::var_os("SSL_CERT_FILE").map_or_else(|| SYSTEM_BUNDLE.into(), Into::into),
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| KeylimeError::Config(format!("cannot read CA certificates {}: {e}", path.display())))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(KeylimeError::Config(format!("{} holds no usable CA certificate", path.display())));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(tpm_vault_client::tls::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| KeylimeError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}
