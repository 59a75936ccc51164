//! Answering the CA's challenges: `http-01` (an HTTP server of our own on `--http-listen`),
//! `tls-alpn-01` (RFC 8737: a TLS server on `--tls-listen` offering ALPN `acme-tls/1` and, per
//! identifier, a self-signed certificate carrying the `acmeIdentifier` extension) and `dns-01`
//! (a hook command that publishes and removes the TXT record).
//!
//! The servers run only while an order is validated. The certificates of `tls-alpn-01` use
//! throwaway software keys (rcgen): they prove control of the name, not of the vault key.
//!
//! The servers face the Internet: each connection has a deadline ([`Limits::deadline`],
//! covering the request headers or the TLS handshake), at most [`Limits::max_connections`]
//! are served at once (more are closed at accept), a failing accept (EMFILE) backs off
//! instead of spinning, and [`Responder::finish`] ends every connection task with the server.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::prelude::{Engine as _, BASE64_URL_SAFE_NO_PAD};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use instant_acme::{ChallengeType, Identifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest as _, Sha256};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use super::AcmeError;

/// The ALPN protocol of `tls-alpn-01`.
const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Bounds of the challenge servers, against a peer that holds connections open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// A connection is closed this long after it was accepted (an http-01 request or a
    /// tls-alpn-01 handshake takes milliseconds).
    pub(crate) deadline: Duration,
    /// Connections served at once; more are closed at accept.
    pub(crate) max_connections: usize,
    /// The pause after a failing accept (EMFILE, ENFILE...).
    pub(crate) accept_backoff: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { deadline: Duration::from_secs(10), max_connections: 64, accept_backoff: Duration::from_millis(100) }
    }
}

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
    /// The identifiers of the order: a dns-01 identifier from the CA must be one of them.
    ordered: Vec<Identifier>,
    server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").field("method", &self.method).finish_non_exhaustive()
    }
}

impl Responder {
    /// Starts answering with `method` for an order of `ordered` (binds its listener now, so a
    /// busy port fails early).
    pub(crate) async fn start(method: &Method, ordered: &[Identifier]) -> Result<Responder, AcmeError> {
        Responder::start_with(method, ordered, Limits::default()).await
    }

    /// [`Responder::start`] with the servers bounded by `limits`.
    pub(crate) async fn start_with(
        method: &Method,
        ordered: &[Identifier],
        limits: Limits,
    ) -> Result<Responder, AcmeError> {
        let mut responder = Responder {
            method: method.clone(),
            tokens: Arc::default(),
            certs: Arc::default(),
            records: Vec::new(),
            ordered: ordered.to_vec(),
            server: None,
        };
        match method {
            Method::Http01 { listen } => {
                let listener = bind(*listen).await?;
                responder.server = Some(tokio::spawn(serve_http(listener, responder.tokens.clone(), limits)));
            }
            Method::TlsAlpn01 { listen } => {
                let listener = bind(*listen).await?;
                let resolver = Arc::new(ByName(responder.certs.clone()));
                let mut config =
                    rustls::ServerConfig::builder_with_provider(Arc::new(tpm_vault_client::tls::default_provider()))
                        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
                        .map_err(|e| AcmeError::Challenge(e.to_string()))?
                        .with_no_client_auth()
                        .with_cert_resolver(resolver);
                config.alpn_protocols = vec![ACME_TLS_ALPN.to_vec()];
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
                responder.server = Some(tokio::spawn(serve_tls(listener, acceptor, limits)));
            }
            Method::Dns01 { .. } => {}
        }
        Ok(responder)
    }

    /// Publishes the answer to one challenge (`wildcard`: the CA's authorization is for the
    /// wildcard name of `identifier`).
    pub(crate) async fn present(
        &mut self,
        identifier: &Identifier,
        wildcard: bool,
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
                let name = dns01_record_name(domain, wildcard, &self.ordered)?;
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
        .map_err(|e| AcmeError::Challenge(format!("cannot listen on {addr}: {}", tpm_vault_client::io_reason(&e))))
}

/// Accepts connections for `serve` under `limits`: each runs at most `limits.deadline`, at most
/// `limits.max_connections` at once (more are closed at once), an accept error backs off. The
/// connection tasks live in a [`JoinSet`] owned by this loop, so aborting the loop's task
/// (`finish`, drop) aborts them and closes their sockets.
async fn accept_loop<F, Fut>(listener: TcpListener, limits: Limits, serve: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                tokio::time::sleep(limits.accept_backoff).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        if connections.len() >= limits.max_connections {
            drop(tcp);
            continue;
        }
        let connection = serve(tcp);
        connections.spawn(async move {
            let _ = tokio::time::timeout(limits.deadline, connection).await;
        });
    }
}

/// The http-01 server: the key authorization for a known token, 404 otherwise.
async fn serve_http(listener: TcpListener, tokens: Arc<Mutex<HashMap<String, String>>>, limits: Limits) {
    accept_loop(listener, limits, move |tcp| {
        let tokens = tokens.clone();
        async move {
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
        }
    })
    .await;
}

/// The tls-alpn-01 server: completes handshakes (the certificate is the answer) and closes.
async fn serve_tls(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor, limits: Limits) {
    accept_loop(listener, limits, move |tcp| {
        let acceptor = acceptor.clone();
        async move {
            if let Ok(mut tls) = acceptor.accept(tcp).await {
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut tls).await;
            }
        }
    })
    .await;
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
    let provider = tpm_vault_client::tls::default_provider();
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

/// The TXT record name of a dns-01 challenge for the CA's `domain`: the CA's answer reaches a
/// hook run as root, so `domain` must be a strict LDH name (labels of 1 to 63 `[a-z0-9-]`, not
/// starting or ending with `-`, 253 bytes at most; a leading `*.` only for a wildcard) and one of
/// the `ordered` names (a wildcard only if `*.domain` was ordered). Compared without case.
fn dns01_record_name(domain: &str, wildcard: bool, ordered: &[Identifier]) -> Result<String, AcmeError> {
    let shown: String = domain.chars().take(80).flat_map(char::escape_debug).collect();
    let lower = domain.to_ascii_lowercase();
    let (base, wildcard) = match lower.strip_prefix("*.") {
        Some(base) => (base, true),
        None => (lower.as_str(), wildcard),
    };
    let ldh_label = |label: &str| {
        (1..=63).contains(&label.len())
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if base.len() > 253 || !base.split('.').all(ldh_label) {
        return Err(AcmeError::Protocol(format!(
            "the CA asks dns-01 for \"{shown}\", which is no DNS name (letters, digits, '-' and '.'): the hook is not run"
        )));
    }
    let wanted = if wildcard { format!("*.{base}") } else { base.to_owned() };
    let was_ordered = ordered.iter().any(|o| matches!(o, Identifier::Dns(name) if name.eq_ignore_ascii_case(&wanted)));
    if !was_ordered {
        return Err(AcmeError::Protocol(format!(
            "the CA asks dns-01 for \"{wanted}\", which was not ordered: the hook is not run"
        )));
    }
    Ok(format!("_acme-challenge.{base}"))
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
        .map_err(|e| {
            AcmeError::Challenge(format!("cannot run the dns-01 hook: {}", tpm_vault_client::io_reason(&e)))
        })?;
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

    use std::time::Instant;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    /// The real http-01 responder on a loopback port.
    async fn http01(limits: Limits) -> (Responder, SocketAddr) {
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let responder = Responder::start_with(&Method::Http01 { listen: addr }, &[], limits).await.unwrap();
        (responder, addr)
    }

    /// Reads until the server closes (`Some(elapsed)`) or `wait` passes (`None`: still open).
    async fn closed_within(tcp: &mut TcpStream, wait: Duration) -> Option<Duration> {
        let started = Instant::now();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(wait.saturating_sub(started.elapsed()), tcp.read(&mut buf)).await {
                Err(_) => return None,
                Ok(Ok(0) | Err(_)) => return Some(started.elapsed()),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// A GET on a new connection: the status line.
    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), tcp.read_to_string(&mut answer)).await.unwrap().unwrap();
        answer
    }

    fn limits(deadline_ms: u64, max_connections: usize) -> Limits {
        Limits { deadline: Duration::from_millis(deadline_ms), max_connections, ..Limits::default() }
    }

    #[tokio::test]
    async fn silent_and_slow_clients_are_closed_at_the_deadline() {
        let (mut responder, addr) = http01(limits(500, 64)).await;
        let identifier = Identifier::Dns("a.test".into());
        responder.present(&identifier, false, "tok", "tok.thumb").await.unwrap();
        assert!(get(addr, "/.well-known/acme-challenge/tok").await.ends_with("\r\n\r\ntok.thumb"));
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /.well-known/acme-challenge/tok HTTP/1.1\r\nHost: a").await.unwrap();
        for tcp in [&mut silent, &mut slow] {
            let closed = closed_within(tcp, Duration::from_secs(5)).await;
            assert!(closed.is_some_and(|t| t < Duration::from_secs(2)), "still open after 5 s: {closed:?}");
        }
        responder.finish().await;
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_at_accept() {
        let (responder, addr) = http01(limits(10_000, 4)).await;
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut extra = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut extra, Duration::from_secs(2)).await.is_some(), "a 5th connection is served");
        for tcp in &mut held {
            assert_eq!(closed_within(tcp, Duration::from_millis(100)).await, None, "a held connection was closed");
        }
        // A slot freed is served again.
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(get(addr, "/x").await.starts_with("HTTP/1.1 404"));
        responder.finish().await;
    }

    #[tokio::test]
    async fn finish_ends_every_connection_task() {
        let (responder, addr) = http01(limits(60_000, 64)).await;
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(TcpStream::connect(addr).await.unwrap());
        }
        open[0].write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let metrics = tokio::runtime::Handle::current().metrics();
        assert!(metrics.num_alive_tasks() >= 4, "{} tasks", metrics.num_alive_tasks());
        responder.finish().await;
        for tcp in &mut open {
            let closed = closed_within(tcp, Duration::from_secs(2)).await;
            assert!(closed.is_some(), "a connection outlives finish()");
        }
        let started = Instant::now();
        while metrics.num_alive_tasks() > 0 && started.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(metrics.num_alive_tasks(), 0, "tasks left after finish()");
        assert!(TcpStream::connect(addr).await.is_err(), "still listening after finish()");
    }

    #[test]
    fn dns01_names_must_be_ordered_ldh_names() {
        let ordered = [
            Identifier::Dns("Example.COM".into()),
            Identifier::Dns("*.wild.test".into()),
            Identifier::Ip([127, 0, 0, 1].into()),
        ];
        let name = |domain: &str, wildcard: bool| dns01_record_name(domain, wildcard, &ordered);
        assert_eq!(name("example.com", false).unwrap(), "_acme-challenge.example.com");
        assert_eq!(name("EXAMPLE.com", false).unwrap(), "_acme-challenge.example.com");
        assert_eq!(name("wild.test", true).unwrap(), "_acme-challenge.wild.test");
        assert_eq!(name("*.wild.test", false).unwrap(), "_acme-challenge.wild.test");
        for (hostile, wildcard) in [
            ("other.test", false),
            ("wild.test", false),
            ("example.com", true),
            ("*.example.com", false),
            ("127.0.0.1", false),
        ] {
            let e = name(hostile, wildcard).unwrap_err().to_string();
            assert!(e.contains("which was not ordered: the hook is not run"), "{hostile}: {e}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        let long_name = format!("{}com", "abcdefghi.".repeat(26));
        for hostile in [
            "example.com; reboot",
            "$(id).example.com",
            "a\u{1b}[2J.example.com",
            "-a.example.com",
            "a-.example.com",
            "a..example.com",
            "example.com.",
            "",
            "a_b.example.com",
            "a.*.example.com",
            "**.example.com",
            "ex\u{e4}mple.com",
            &long_label,
            &long_name,
        ] {
            let e = name(hostile, false).unwrap_err().to_string();
            assert!(e.contains("which is no DNS name") && !e.contains('\u{1b}'), "{hostile:?}: {e}");
        }
    }

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
