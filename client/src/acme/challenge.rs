//! Answering the CA's challenges: `http-01` (an HTTP server of our own on `--http-listen`),
//! `tls-alpn-01` (RFC 8737: a TLS server on `--tls-listen` offering ALPN `acme-tls/1` and, per
//! identifier, a self-signed certificate carrying the `acmeIdentifier` extension) and `dns-01`
//! (a hook command that publishes and removes the TXT record).
//!
//! The servers run only while an order is validated. The certificates of `tls-alpn-01` use
//! throwaway software keys (rcgen): they prove control of the name, not of the vault key.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use base64::prelude::{Engine as _, BASE64_URL_SAFE_NO_PAD};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use instant_acme::{ChallengeType, Identifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest as _, Sha256};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::AcmeError;

/// The ALPN protocol of `tls-alpn-01`.
const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// How the CA's challenges are answered.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type")]
pub(crate) enum Method {
    /// `http-01`: serve `/.well-known/acme-challenge/TOKEN` on `listen` (the CA connects to
    /// port 80 of the name, so `listen` is that port or one forwarded to it).
    #[serde(rename = "http-01")]
    Http01 {
        /// Where to listen.
        listen: SocketAddr,
    },
    /// `tls-alpn-01`: answer TLS handshakes with ALPN `acme-tls/1` on `listen` (port 443).
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01 {
        /// Where to listen.
        listen: SocketAddr,
    },
    /// `dns-01`: `HOOK add NAME VALUE` publishes the TXT record, `HOOK del NAME VALUE`
    /// removes it (run by `sh -c`, also given `ACME_DNS_NAME` and `ACME_DNS_VALUE`).
    #[serde(rename = "dns-01")]
    Dns01 {
        /// The command.
        hook: String,
    },
}

impl Method {
    /// The challenge type the CA calls this method.
    pub(crate) fn challenge_type(&self) -> ChallengeType {
        match self {
            Method::Http01 { .. } => ChallengeType::Http01,
            Method::TlsAlpn01 { .. } => ChallengeType::TlsAlpn01,
            Method::Dns01 { .. } => ChallengeType::Dns01,
        }
    }

    /// The name, as the CLI and the CA write it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Method::Http01 { .. } => "http-01",
            Method::TlsAlpn01 { .. } => "tls-alpn-01",
            Method::Dns01 { .. } => "dns-01",
        }
    }
}

/// The answers being served while an order is validated; stopped by [`Responder::finish`]
/// (or on drop).
pub(crate) struct Responder {
    method: Method,
    /// http-01: token -> key authorization.
    tokens: Arc<Mutex<HashMap<String, String>>>,
    /// tls-alpn-01: SNI name -> certificate.
    certs: Arc<Mutex<HashMap<String, Arc<CertifiedKey>>>>,
    /// dns-01: the records published, to remove.
    records: Vec<(String, String)>,
    server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").field("method", &self.method).finish_non_exhaustive()
    }
}

impl Responder {
    /// Starts answering with `method` (binds its listener now, so a busy port fails early).
    pub(crate) async fn start(method: &Method) -> Result<Responder, AcmeError> {
        let mut responder = Responder {
            method: method.clone(),
            tokens: Arc::default(),
            certs: Arc::default(),
            records: Vec::new(),
            server: None,
        };
        match method {
            Method::Http01 { listen } => {
                let listener = bind(*listen).await?;
                responder.server = Some(tokio::spawn(serve_http(listener, responder.tokens.clone())));
            }
            Method::TlsAlpn01 { listen } => {
                let listener = bind(*listen).await?;
                let resolver = Arc::new(ByName(responder.certs.clone()));
                let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(crate::tls::default_provider()))
                    .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
                    .map_err(|e| AcmeError::Challenge(e.to_string()))?
                    .with_no_client_auth()
                    .with_cert_resolver(resolver);
                config.alpn_protocols = vec![ACME_TLS_ALPN.to_vec()];
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
                responder.server = Some(tokio::spawn(serve_tls(listener, acceptor)));
            }
            Method::Dns01 { .. } => {}
        }
        Ok(responder)
    }

    /// Publishes the answer to one challenge.
    pub(crate) async fn present(
        &mut self,
        identifier: &Identifier,
        token: &str,
        key_authorization: &str,
    ) -> Result<(), AcmeError> {
        match &self.method {
            Method::Http01 { .. } => {
                if let Ok(mut tokens) = self.tokens.lock() {
                    tokens.insert(token.to_owned(), key_authorization.to_owned());
                }
            }
            Method::TlsAlpn01 { .. } => {
                let (sni, cert) = alpn_certificate(identifier, key_authorization)?;
                if let Ok(mut certs) = self.certs.lock() {
                    certs.insert(sni, cert);
                }
            }
            Method::Dns01 { hook } => {
                let Identifier::Dns(domain) = identifier else {
                    return Err(AcmeError::Challenge("dns-01 proves DNS names only, not IP addresses".into()));
                };
                let name = format!("_acme-challenge.{}", domain.trim_start_matches("*."));
                let value = BASE64_URL_SAFE_NO_PAD.encode(Sha256::digest(key_authorization.as_bytes()));
                run_hook(hook, "add", &name, &value).await?;
                self.records.push((name, value));
            }
        }
        Ok(())
    }

    /// Stops serving and removes published DNS records (failures to remove are reported on
    /// stderr: the certificate is not at stake any more).
    pub(crate) async fn finish(mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        if let Method::Dns01 { hook } = &self.method {
            for (name, value) in std::mem::take(&mut self.records) {
                if let Err(e) = run_hook(hook, "del", &name, &value).await {
                    eprintln!("tpm-vault: warning: {e}");
                }
            }
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, AcmeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| AcmeError::Challenge(format!("cannot listen on {addr}: {}", crate::error::io_reason(&e))))
}

/// The http-01 server: the key authorization for a known token, 404 otherwise.
async fn serve_http(listener: TcpListener, tokens: Arc<Mutex<HashMap<String, String>>>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else { continue };
        let tokens = tokens.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let answer = req
                    .uri()
                    .path()
                    .strip_prefix("/.well-known/acme-challenge/")
                    .and_then(|token| tokens.lock().ok().and_then(|t| t.get(token).cloned()));
                async move {
                    let response = match answer {
                        Some(body) => hyper::Response::builder()
                            .header(http::header::CONTENT_TYPE, "application/octet-stream")
                            .body(Full::new(Bytes::from(body))),
                        None => {
                            hyper::Response::builder().status(404).body(Full::new(Bytes::from_static(b"not found\n")))
                        }
                    };
                    Ok::<_, Infallible>(response.unwrap_or_default())
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}

/// The tls-alpn-01 server: completes handshakes (the certificate is the answer) and closes.
async fn serve_tls(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else { continue };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            if let Ok(mut tls) = acceptor.accept(tcp).await {
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut tls).await;
            }
        });
    }
}

/// Serves the tls-alpn-01 certificate of the SNI name asked for.
#[derive(Debug)]
struct ByName(Arc<Mutex<HashMap<String, Arc<CertifiedKey>>>>);

impl ResolvesServerCert for ByName {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if !hello.alpn()?.any(|p| p == ACME_TLS_ALPN) {
            return None;
        }
        let name = hello.server_name()?.to_ascii_lowercase();
        self.0.lock().ok()?.get(&name).cloned()
    }
}

/// The RFC 8737 certificate for `identifier` and the SNI name it is served for (an IP
/// address's reverse-DNS name, RFC 8738).
fn alpn_certificate(
    identifier: &Identifier,
    key_authorization: &str,
) -> Result<(String, Arc<CertifiedKey>), AcmeError> {
    let fail = |e: rcgen::Error| AcmeError::Challenge(format!("tls-alpn-01 certificate: {e}"));
    let (sni, mut params) = match identifier {
        Identifier::Dns(name) => {
            (name.to_ascii_lowercase(), rcgen::CertificateParams::new(vec![name.clone()]).map_err(fail)?)
        }
        Identifier::Ip(ip) => {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
            params.subject_alt_names.push(rcgen::SanType::IpAddress(*ip));
            (reverse_name(*ip), params)
        }
        other => return Err(AcmeError::Challenge(format!("tls-alpn-01 cannot prove {other:?}"))),
    };
    let digest = Sha256::digest(key_authorization.as_bytes());
    params.custom_extensions.push(rcgen::CustomExtension::new_acme_identifier(&digest));
    let key = rcgen::KeyPair::generate().map_err(fail)?;
    let cert = params.self_signed(&key).map_err(fail)?;
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| AcmeError::Challenge(format!("tls-alpn-01 key: {e}")))?;
    let provider = crate::tls::default_provider();
    let signing = provider.key_provider.load_private_key(der).map_err(|e| AcmeError::Challenge(e.to_string()))?;
    Ok((sni, Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing))))
}

/// `4.3.2.1.in-addr.arpa` for 1.2.3.4; nibbles under `ip6.arpa` for IPv6.
fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut labels: Vec<String> = Vec::with_capacity(33);
            for byte in v6.octets().iter().rev() {
                labels.push(format!("{:x}", byte & 0xf));
                labels.push(format!("{:x}", byte >> 4));
            }
            labels.push("ip6.arpa".into());
            labels.join(".")
        }
    }
}

/// Runs the dns-01 hook; a non-zero exit is an error naming its stderr.
async fn run_hook(hook: &str, action: &str, name: &str, value: &str) -> Result<(), AcmeError> {
    let output = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{hook} \"$@\""))
        .arg("dns-hook")
        .args([action, name, value])
        .env("ACME_DNS_ACTION", action)
        .env("ACME_DNS_NAME", name)
        .env("ACME_DNS_VALUE", value)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| AcmeError::Challenge(format!("cannot run the dns-01 hook: {}", crate::error::io_reason(&e))))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(AcmeError::Challenge(format!(
        "dns-01 hook `{action} {name}` failed ({}): {}",
        output.status,
        stderr.lines().last().unwrap_or("no message")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_names() {
        assert_eq!(reverse_name("127.0.0.1".parse().unwrap()), "1.0.0.127.in-addr.arpa");
        let v6 = reverse_name("::1".parse().unwrap());
        assert!(v6.starts_with("1.0.0.0.") && v6.ends_with(".ip6.arpa"), "{v6}");
    }

    #[test]
    fn method_names_round_trip_through_json() {
        let m = Method::Http01 { listen: "127.0.0.1:80".parse().unwrap() };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"type":"http-01","listen":"127.0.0.1:80"}"#);
        assert_eq!(serde_json::from_str::<Method>(&json).unwrap(), m);
        assert_eq!(m.name(), "http-01");
    }
}
