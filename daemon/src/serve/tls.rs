//! TLS with TPM-resident keys inside the daemon: the in-process rustls signing key, and the
//! `--listen` gRPC-over-TLS listener built on it.
//!
//! - [`TpmSigningKey`]: signs handshakes with a vault key through the TPM actor
//!   ([`Vault::sign_blocking`]), for the rustls signing key shared with the client library
//!   (`tpm_vault_proto::tls_key`). rustls' `Signer::sign` is synchronous and runs on the worker
//!   polling the handshake, so the wait is wrapped in `block_in_place` on a multi-thread
//!   runtime and is a plain wait elsewhere; the actor is its own thread, so neither flavour can
//!   deadlock.
//! - [`TpmCertResolver`]: serves the key's stored chain and picks up a replaced chain (or a
//!   re-created key) before the next handshake, without a restart.
//! - [`TlsListener`]: TLS 1.3 only, client certificates required ([`WebPkiClientVerifier`]),
//!   ALPN `h2`. It terminates TLS itself (tonic's own TLS takes only PEM private keys) and
//!   hands [`TlsConn`]s to tonic's `serve_with_incoming`; each carries the client's
//!   [`Identity`], which tonic inserts into every request's extensions, where
//!   [`crate::auth::identity`] finds it, so `cert:SUBJECT` access rules apply.
//! - CA pins ([`TlsListener::with_pins`], issue #31 item 7): every CA in the client CA file may
//!   issue a certificate for any identity, so an identity that only one CA should vouch for is
//!   pinned to that CA's file: a client certificate whose identity matches one of the file's
//!   patterns must chain to a CA of that file, or the connection is closed after the handshake.
//!
//! It does not own certificates (see [`crate::vault::cert`]) or the server lifecycle
//! ([`crate::serve::server`]).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::UnixTime;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use x509_cert::der::Decode as _;

use tpm_vault_proto::tls_key::{wait_blocking, SignMessage, TlsKey};
use tpm_vault_proto::v1::{HashAlgorithm, SignatureScheme};

use crate::auth::policy::Glob;
use crate::auth::Identity;
use crate::error::Error;
use crate::model::{HashAlg, KeyName, Scheme, SignInput};
use crate::serve::bounds::{Held, Tally};
use crate::vault::{SignRequest, Vault};

/// Time a client gets to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the gRPC server to take them.
const ACCEPT_QUEUE: usize = 64;
/// Handshakes in progress at once; past it a new TCP connection is closed at once, so peers that
/// never finish a handshake hold at most this many descriptors, each for the 10 s handshake timeout.
pub const MAX_HANDSHAKES: usize = 64;

/// Why the TLS listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The listen key has no usable certificate chain, or the vault failed reading it.
    #[error("TLS listener key {key}: {source}")]
    Key {
        /// The configured key.
        key: KeyName,
        /// What the vault said.
        #[source]
        source: Error,
    },
    /// The stored chain does not parse or does not match the key.
    #[error("TLS listener key {key}: {reason}")]
    Chain {
        /// The configured key.
        key: KeyName,
        reason: String,
    },
    /// The client CA file cannot be read or holds no usable certificate.
    #[error("client CA file {path}: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// The address cannot be bound.
    #[error("TLS listener {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: SocketAddr,
        /// Bind error.
        #[source]
        source: io::Error,
    },
}

/// The daemon's TLS defaults, explicit rather than inherited from feature flags: aws-lc-rs,
/// key exchange X25519MLKEM768 first, then X25519, then P-256.
pub fn provider() -> CryptoProvider {
    use rustls::crypto::aws_lc_rs::{self, kx_group};
    CryptoProvider {
        kx_groups: vec![kx_group::X25519MLKEM768, kx_group::X25519, kx_group::SECP256R1],
        ..aws_lc_rs::default_provider()
    }
}

/// Handshake signatures that may wait for the TPM at once, per server key. A TLS 1.3 server
/// signs its CertificateVerify before it sees the client's certificate, so any peer that
/// reaches the port can make the TPM sign; past this many in flight, a handshake fails at once
/// instead of queueing, which bounds the TPM time unauthenticated peers can take from local
/// clients (whose jobs share the TPM's queue).
pub const MAX_HANDSHAKE_SIGNATURES: usize = 8;

/// Signs TLS handshakes with a vault key in the TPM: the signer of the rustls signing key
/// [`TlsKey`]`<TpmSigningKey>` ([`TpmSigningKey::tls_key`]).
pub struct TpmSigningKey {
    vault: Vault,
    key: KeyName,
    /// Handshake signatures in flight (at most [`MAX_HANDSHAKE_SIGNATURES`]).
    in_flight: Tally<()>,
}

impl std::fmt::Debug for TpmSigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmSigningKey").field("key", &self.key).finish_non_exhaustive()
    }
}

impl TpmSigningKey {
    /// The rustls signing key for vault key `key` (its record is loaded and cached here, so
    /// that [`Vault::sign_blocking`] finds it).
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], store errors, [`Error::InvalidArgument`] for a key that cannot
    /// sign TLS handshakes.
    pub async fn tls_key(vault: &Vault, key: &KeyName) -> Result<TlsKey<TpmSigningKey>, Error> {
        let (alg, spki) = vault.public_key(key).await?;
        let signer = Self { vault: vault.clone(), key: key.clone(), in_flight: Tally::up_to(MAX_HANDSHAKE_SIGNATURES) };
        TlsKey::new(signer, alg.api(), spki)
            .ok_or_else(|| Error::invalid(format!("key {key} is a {alg} key; TLS needs an ECC or RSA key")))
    }
}

impl SignMessage for TpmSigningKey {
    fn sign_message(
        &self,
        message: &[u8],
        hash: HashAlgorithm,
        scheme: SignatureScheme,
    ) -> Result<Vec<u8>, rustls::Error> {
        let Ok(_held) = self.in_flight.try_take(()) else {
            // Debug, not warn: a flood of handshakes must not become a flood of log lines.
            tracing::debug!(key = %self.key, "TLS handshake refused: {MAX_HANDSHAKE_SIGNATURES} signatures already wait for the TPM");
            return Err(rustls::Error::General("server busy: too many handshakes waiting for the TPM".into()));
        };
        let request = SignRequest {
            input: SignInput::Message(message.to_vec()),
            hash: HashAlg::from_api(hash),
            scheme: Scheme::from_api(scheme),
        };
        // The TPM actor is its own thread, so the wait cannot deadlock on either runtime flavour.
        let result = wait_blocking(|| self.vault.sign_blocking(&self.key, request));
        result.map(|out| out.signature).map_err(|e| {
            tracing::warn!(key = %self.key, error = %e, "TLS handshake signature failed");
            rustls::Error::General(format!("TPM signature failed: {e}"))
        })
    }
}

/// Serves a vault key's stored chain with a [`TpmSigningKey`]; [`TpmCertResolver::refresh`]
/// swaps in a new chain or key version.
#[derive(Debug)]
pub struct TpmCertResolver {
    vault: Vault,
    key: KeyName,
    current: RwLock<Served>,
}

/// What the resolver serves, and which stored version it came from.
#[derive(Debug, Clone)]
struct Served {
    version: u64,
    tpm_name: Vec<u8>,
    certified: Arc<CertifiedKey>,
}

impl TpmCertResolver {
    /// A resolver for `key`, which must have a certificate chain whose leaf is the key's.
    ///
    /// # Errors
    /// [`TlsError::Key`] (no such key, no certificate), [`TlsError::Chain`].
    pub async fn new(vault: &Vault, key: &KeyName) -> Result<Self, TlsError> {
        let served = load(vault, key).await?;
        Ok(Self { vault: vault.clone(), key: key.clone(), current: RwLock::new(served) })
    }

    /// Reloads the chain and key if the stored version changed; returns whether it did. Cheap
    /// when nothing changed (the record is cached in memory).
    ///
    /// # Errors
    /// As [`TpmCertResolver::new`]; the served chain stays as it was.
    pub async fn refresh(&self) -> Result<bool, TlsError> {
        let stored = self
            .vault
            .certificate(&self.key)
            .await
            .map_err(|source| TlsError::Key { key: self.key.clone(), source })?;
        let unchanged =
            self.current.read().map(|c| c.version == stored.version && c.tpm_name == stored.tpm_name).unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let served = load(&self.vault, &self.key).await?;
        tracing::info!(key = %self.key, version = served.version, "TLS listener certificate reloaded");
        if let Ok(mut current) = self.current.write() {
            *current = served;
        }
        Ok(true)
    }

    /// The certified key served now.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.certified.clone())
    }
}

impl ResolvesServerCert for TpmCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

async fn load(vault: &Vault, key: &KeyName) -> Result<Served, TlsError> {
    let key_err = |source| TlsError::Key { key: key.clone(), source };
    let stored = vault.certificate(key).await.map_err(key_err)?;
    let signing = TpmSigningKey::tls_key(vault, key).await.map_err(key_err)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(stored.chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Chain { key: key.clone(), reason: format!("stored chain: {e}") })?;
    let certified = CertifiedKey::new(chain, Arc::new(signing));
    certified.keys_match().map_err(|e| TlsError::Chain { key: key.clone(), reason: e.to_string() })?;
    Ok(Served { version: stored.version, tpm_name: stored.tpm_name, certified: Arc::new(certified) })
}

/// The daemon's TLS listener: a bound TCP socket, the rustls configuration and the resolver.
pub struct TlsListener {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    resolver: Arc<TpmCertResolver>,
    pins: Arc<Vec<CaPin>>,
}

/// Identities only the CAs of one file may vouch for ([`TlsListener::with_pins`]).
struct CaPin {
    /// The CA file (for logs).
    path: PathBuf,
    /// Verifies a client chain against that file's CAs only.
    verifier: Arc<dyn ClientCertVerifier>,
    /// The identities pinned to them.
    patterns: Vec<Glob>,
}

/// Whether a client certificate chain (end entity first) may stand for `identity`: when
/// `identity` matches a pin's patterns, the chain must verify against one of the matching pins'
/// CAs; an identity no pin names is accepted from any CA of the client CA file. `Err` names the
/// pinned CA files.
fn check_pins(pins: &[CaPin], identity: &str, chain: &[CertificateDer<'_>]) -> Result<(), String> {
    let pinned: Vec<&CaPin> = pins.iter().filter(|p| p.patterns.iter().any(|g| g.matches(identity))).collect();
    if pinned.is_empty() {
        return Ok(());
    }
    let Some((end_entity, intermediates)) = chain.split_first() else {
        return Err("no client certificate".into());
    };
    if pinned.iter().any(|p| p.verifier.verify_client_cert(end_entity, intermediates, UnixTime::now()).is_ok()) {
        return Ok(());
    }
    Err(pinned.iter().map(|p| p.path.display().to_string()).collect::<Vec<_>>().join(", "))
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("addr", &self.listener.local_addr().ok())
            .field("resolver", &self.resolver)
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// Builds the TLS configuration (key `key`'s stored chain, client CAs from `client_ca`) and
    /// binds `addr`. Everything is checked before anything is bound.
    ///
    /// # Errors
    /// [`TlsError`] naming the key, file or address at fault.
    pub async fn bind(vault: &Vault, addr: SocketAddr, key: &KeyName, client_ca: &Path) -> Result<Self, TlsError> {
        let pem = tokio::fs::read(client_ca)
            .await
            .map_err(|e| TlsError::ClientCa { path: client_ca.to_owned(), reason: e.to_string() })?;
        let (acceptor, resolver) = server_config(vault, key, &pem).await.map_err(|e| match e {
            TlsError::ClientCa { reason, .. } => TlsError::ClientCa { path: client_ca.to_owned(), reason },
            other => other,
        })?;
        let listener = TcpListener::bind(addr).await.map_err(|source| TlsError::Bind { addr, source })?;
        Ok(Self { listener, acceptor, resolver, pins: Arc::new(Vec::new()) })
    }

    /// This listener with CA pins: each entry is a PEM file of CAs and the identity globs
    /// (`CN=agent-*`, `spiffe://example.org/*`) only those CAs may vouch for. A client
    /// certificate whose identity matches an entry's globs must chain to one of that entry's
    /// CAs (the CAs must also be in the client CA file, which the handshake checks first).
    ///
    /// # Errors
    /// [`TlsError::ClientCa`] naming a file that cannot be read or holds no usable CA.
    pub async fn with_pins(mut self, pins: &[(PathBuf, Vec<String>)]) -> Result<Self, TlsError> {
        let mut out = Vec::new();
        for (path, patterns) in pins {
            let ca_err = |reason: String| TlsError::ClientCa { path: path.clone(), reason };
            let pem = tokio::fs::read(path).await.map_err(|e| ca_err(e.to_string()))?;
            let verifier = client_verifier(&pem).map_err(|e| match e {
                TlsError::ClientCa { reason, .. } => ca_err(reason),
                other => other,
            })?;
            out.push(CaPin { path: path.clone(), verifier, patterns: patterns.iter().map(|p| Glob::new(p)).collect() });
        }
        self.pins = Arc::new(out);
        Ok(self)
    }

    /// The bound address (the port, when bound to port 0).
    ///
    /// # Errors
    /// The socket's error.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The resolver serving the certificate.
    pub fn resolver(&self) -> &Arc<TpmCertResolver> {
        &self.resolver
    }

    /// Starts accepting: each connection's handshake runs in its own task (bounded by a
    /// timeout); finished ones come out of the stream, ready for `serve_with_incoming`.
    /// At most `max_connections` connections are open at once (handshakes included) and
    /// [`MAX_HANDSHAKES`] handshakes; a connection past either bound is closed at once.
    /// Accepting stops when the stream is dropped.
    pub fn incoming(self, max_connections: usize) -> ReceiverStream<io::Result<TlsConn>> {
        let (tx, rx) = tokio::sync::mpsc::channel(ACCEPT_QUEUE);
        let bounds = (Tally::up_to(max_connections), Tally::up_to(MAX_HANDSHAKES));
        tokio::spawn(accept_loop(self, tx, bounds));
        ReceiverStream::new(rx)
    }
}

/// Builds the TLS 1.3 server configuration: TPM key, required client certificates, ALPN h2.
///
/// # Errors
/// [`TlsError`].
pub async fn server_config(
    vault: &Vault,
    key: &KeyName,
    client_ca_pem: &[u8],
) -> Result<(TlsAcceptor, Arc<TpmCertResolver>), TlsError> {
    let verifier = client_verifier(client_ca_pem)?;
    let provider = Arc::new(provider());
    let resolver = Arc::new(TpmCertResolver::new(vault, key).await?);
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), resolver))
}

/// A verifier of client certificates issued by the CAs in `client_ca_pem`.
///
/// # Errors
/// [`TlsError::ClientCa`] (without its path) when the PEM holds no usable CA.
fn client_verifier(client_ca_pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let ca_err = |reason: String| TlsError::ClientCa { path: PathBuf::new(), reason };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(client_ca_pem) {
        let cert = cert.map_err(|e| ca_err(format!("not valid PEM: {e}")))?;
        roots.add(cert).map_err(|e| ca_err(format!("unusable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(ca_err("no CERTIFICATE in the file".into()));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::new(provider()))
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))
}

async fn accept_loop(
    listener: TlsListener,
    tx: tokio::sync::mpsc::Sender<io::Result<TlsConn>>,
    (connections, handshakes): (Tally<()>, Tally<()>),
) {
    loop {
        let (tcp, peer) = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    crate::serve::fdlimit::accept_failed("TLS listener", &e).await;
                    continue;
                }
            },
        };
        let (Ok(slot), Ok(handshake)) = (connections.try_take(()), handshakes.try_take(())) else {
            tracing::debug!(%peer, "TLS connection refused: too many connections or handshakes in progress");
            continue;
        };
        let acceptor = listener.acceptor.clone();
        let resolver = listener.resolver.clone();
        let pins = listener.pins.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _handshake = handshake;
            if let Err(e) = resolver.refresh().await {
                tracing::warn!(error = %e, "TLS certificate refresh failed; serving the previous one");
            }
            let _ = tcp.set_nodelay(true);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let chain = stream.get_ref().1.peer_certificates().unwrap_or_default();
                    let identity = chain
                        .first()
                        .and_then(|c| client_identity(c.as_ref()))
                        .map_or(Identity::Unknown, |subject| Identity::Cert { subject });
                    if let Identity::Cert { subject } = &identity {
                        if let Err(cas) = check_pins(&pins, subject, chain) {
                            tracing::warn!(
                                %peer, client = %identity,
                                "TLS client refused: its certificate is not issued by the CA pinned for this identity ({cas})"
                            );
                            return;
                        }
                    }
                    tracing::debug!(%peer, client = %identity, "TLS client connected");
                    drop(_handshake);
                    let _ = tx.send(Ok(TlsConn { stream, identity, _slot: slot })).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// The identity a client certificate stands for: its SPIFFE ID (a `spiffe://` URI SAN) if it
/// has one, otherwise its subject DN in certificate order with RFC 4514 escaping
/// (`CN=agent-1,O=Example`). `None` if the certificate does not parse, or has neither a SPIFFE
/// ID nor a subject (the empty string every such certificate would share names no one).
pub fn client_identity(cert_der: &[u8]) -> Option<String> {
    let cert = x509_cert::Certificate::from_der(cert_der).ok()?;
    let tbs = &cert.tbs_certificate;
    if let Ok(Some((_, san))) = tbs.get::<x509_cert::ext::pkix::SubjectAltName>() {
        for name in &san.0 {
            if let x509_cert::ext::pkix::name::GeneralName::UniformResourceIdentifier(uri) = name {
                if uri.as_str().starts_with("spiffe://") {
                    return Some(uri.as_str().to_owned());
                }
            }
        }
    }
    let rdns: Vec<String> =
        tbs.subject.0.iter().map(|rdn| rdn.0.iter().map(ToString::to_string).collect::<Vec<_>>().join("+")).collect();
    Some(rdns.join(",")).filter(|id| !id.is_empty())
}

/// A TLS connection handed to tonic, with the client identity tonic puts into each request's
/// extensions.
pub struct TlsConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    identity: Identity,
    /// This connection's place under the listener's connection bound, until it is dropped.
    _slot: Held<()>,
}

impl std::fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConn").field("identity", &self.identity).finish_non_exhaustive()
    }
}

impl Connected for TlsConn {
    type ConnectInfo = Identity;

    fn connect_info(&self) -> Identity {
        self.identity.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(subject: &[(rcgen::DnType, &str)], uris: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.subject_alt_names =
            uris.iter().map(|u| rcgen::SanType::URI(rcgen::string::Ia5String::try_from(*u).unwrap())).collect();
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    /// A certificate with an empty subject and no SPIFFE ID has no identity (found by the
    /// `tls_identity` fuzz target: all such certificates were one client, "").
    #[test]
    fn client_identity_of_subjects_and_spiffe_ids() {
        use rcgen::DnType::{CommonName, OrganizationName};
        assert_eq!(client_identity(&self_signed(&[], &[])), None);
        assert_eq!(client_identity(&self_signed(&[], &["https://example.org/a"])), None);
        assert_eq!(
            client_identity(&self_signed(&[], &["https://x/", "spiffe://example.org/agent"])).as_deref(),
            Some("spiffe://example.org/agent")
        );
        assert_eq!(
            client_identity(&self_signed(&[(CommonName, "agent-1"), (OrganizationName, "Example, Inc.")], &[]))
                .as_deref(),
            Some("CN=agent-1,O=Example\\, Inc.")
        );
        assert_eq!(client_identity(b"not a certificate"), None);
    }

    #[test]
    fn handshake_slots_cap_signatures_in_flight_and_free_on_drop() {
        let slots = Tally::up_to(3);
        let held: Vec<_> = (0..3).filter_map(|_| slots.try_take(()).ok()).collect();
        assert_eq!(held.len(), 3);
        assert!(slots.try_take(()).is_err(), "a fourth signature is refused");
        drop(held);
        assert!(slots.try_take(()).is_ok(), "slots come back when handshakes finish");
    }
}
