//! The HTTPS client ACME requests travel on: one TLS connection (rustls, the project's
//! aws-lc-rs provider) and one HTTP/1.1 exchange (hyper) per request, with a deadline.
//!
//! ACME needs a few dozen requests per certificate, so connections are not pooled. The CA is
//! trusted through `--ca-bundle` or the system bundle (`SSL_CERT_FILE`, else
//! [`SYSTEM_BUNDLE`]). instant-acme's own client is not used: it would add hyper-rustls and
//! rustls-platform-verifier for what this file does.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Where Debian (and derivatives) keep the system's trusted CAs.
pub(crate) const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Longest time one request (connect, TLS, request, whole response) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest response body accepted (a certificate chain is a few KiB).
const MAX_RESPONSE: usize = 1024 * 1024;

/// An HTTPS-only [`HttpClient`].
#[derive(Clone)]
pub(crate) struct HttpsClient {
    tls: TlsConnector,
}

impl std::fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsClient").finish_non_exhaustive()
    }
}

impl HttpsClient {
    /// A client trusting the PEM certificates in `bundle` (or the system bundle).
    pub(crate) fn new(bundle: Option<&Path>) -> Result<HttpsClient, String> {
        let path = match bundle {
            Some(p) => p.to_path_buf(),
            None => std::env::var_os("SSL_CERT_FILE").map_or_else(|| SYSTEM_BUNDLE.into(), Into::into),
        };
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&path)
            .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("cannot read CA bundle {}: {e}", path.display()))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!("CA bundle {} holds no usable certificate", path.display()));
        }
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(tpm_vault_client::tls::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(HttpsClient { tls: TlsConnector::from(Arc::new(config)) })
    }
}

impl HttpClient for HttpsClient {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let tls = self.tls.clone();
        Box::pin(async move {
            let what = format!("{} {}", req.method(), req.uri());
            match tokio::time::timeout(REQUEST_TIMEOUT, exchange(tls, req)).await {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(reason)) => Err(instant_acme::Error::Other(format!("{what}: {reason}").into())),
                Err(_) => {
                    Err(instant_acme::Error::Other(format!("{what}: no answer within {REQUEST_TIMEOUT:?}").into()))
                }
            }
        })
    }
}

/// One request over a fresh connection.
async fn exchange(tls: TlsConnector, req: Request<BodyWrapper<Bytes>>) -> Result<BytesResponse, String> {
    let uri = req.uri().clone();
    if uri.scheme_str() != Some("https") {
        return Err("ACME needs an https:// URL".into());
    }
    let host = uri.host().ok_or("the URL has no host")?.trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot connect: {}", tpm_vault_client::io_reason(&e)))?;
    let name = ServerName::try_from(host.clone()).map_err(|e| format!("bad host name {host}: {e}"))?;
    let stream = tls.connect(name, tcp).await.map_err(|e| format!("TLS: {}", tpm_vault_client::io_reason(&e)))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    let driver = tokio::spawn(connection);
    // HTTP/1.1 wants the path in the request line and the authority in Host.
    let (mut parts, body) = req.into_parts();
    let authority = uri.authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
    parts.uri =
        uri.path_and_query().map_or("/", |p| p.as_str()).parse().map_err(|e: http::uri::InvalidUri| e.to_string())?;
    parts
        .headers
        .insert(http::header::HOST, authority.parse().map_err(|e: http::header::InvalidHeaderValue| e.to_string())?);
    let response = sender.send_request(Request::from_parts(parts, body)).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = http_body_util::Limited::new(body, MAX_RESPONSE).collect().await.map_err(|e| e.to_string())?.to_bytes();
    driver.abort();
    Ok(BytesResponse { parts, body: Box::new(body) })
}
