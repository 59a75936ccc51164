//! TLS with keys that live in the vault's TPM: a rustls signing key that signs through the
//! daemon, certificate resolvers that follow certificate and key rotation, and the TLS
//! defaults (TLS 1.3 only; key exchange X25519MLKEM768, then X25519, then P-256).
//!
//! rustls' `Signer::sign` is synchronous and runs on whichever thread polls the handshake. So
//! the gRPC client used for signing lives on its own thread with its own runtime
//! ([`SigningClient`]), built outside any runtime; `sign` hands it the job and waits on a std
//! channel with a timeout. On a multi-thread tokio runtime the wait is wrapped in
//! `block_in_place`, so the worker's other tasks move elsewhere; on a current-thread runtime (or
//! none) it is a plain wait: `block_in_place` and `Handle::block_on` would panic there, and
//! driving a client that lives on the calling runtime would deadlock. Either way the runtime
//! that polls the handshake never has to make progress for the signature to arrive.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tpm_vault_client::ClientBuilder;
//! use tpm_vault_client::tls::{self, SigningClient, VaultCertResolver};
//!
//! # async fn demo() -> Result<(), tls::TlsError> {
//! let signer = SigningClient::connect(ClientBuilder::new("/run/tpm-vault/vault.sock")).await?;
//! let resolver = VaultCertResolver::new(&signer, "web", Duration::from_secs(30)).await?;
//! let config = tls::server_config(Arc::new(resolver))?;
//! let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
//! # let _ = acceptor; Ok(()) }
//! ```
//!
//! This module does not talk to the TPM directly (see the daemon's `tls` module for that) and
//! does not issue certificates (see [`Client::create_csr`], [`Client::self_sign`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, SubjectPublicKeyInfoDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::{CertifiedKey, Signer, SigningKey};
use rustls::{ClientConfig, ServerConfig, SignatureAlgorithm, SignatureScheme};
use tpm_vault_proto::tls_key::{wait_blocking, SignMessage, TlsKey};

use crate::{Client, ClientBuilder, Error, HashAlgorithm, KeyAlgorithm, SignInput, SignOptions};

/// How long a handshake signature may take before the handshake fails.
pub const DEFAULT_SIGN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why TLS setup or a TLS signature failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The daemon refused or could not be reached.
    #[error(transparent)]
    Client(#[from] Error),
    /// The key's stored chain does not parse, or does not match the key.
    #[error("certificate chain of key {key}: {reason}")]
    Chain {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The key's algorithm cannot sign TLS 1.3 handshakes.
    #[error("key {0}: unsupported algorithm for TLS")]
    Algorithm(String),
    /// The signing thread or its runtime could not start, or has stopped.
    #[error("TLS signing thread: {0}")]
    Thread(String),
    /// The daemon did not answer in time.
    #[error("no answer from tpm-vaultd within {0:?}")]
    Timeout(Duration),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The TLS defaults: aws-lc-rs with key exchange X25519MLKEM768 (post-quantum hybrid) first,
/// then X25519, then P-256. Explicit, so they do not depend on rustls' feature flags.
pub fn default_provider() -> CryptoProvider {
    use rustls::crypto::aws_lc_rs::{self, kx_group};
    CryptoProvider {
        kx_groups: vec![kx_group::X25519MLKEM768, kx_group::X25519, kx_group::SECP256R1],
        ..aws_lc_rs::default_provider()
    }
}

/// A TLS 1.3 server configuration with [`default_provider`], no client authentication, the
/// certificate from `resolver`.
///
/// # Errors
/// [`TlsError::Config`] if rustls refuses the provider (it does not for the defaults).
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig, TlsError> {
    Ok(ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_cert_resolver(resolver))
}

/// A TLS 1.3 client configuration with [`default_provider`] trusting `roots`, presenting the
/// certificate from `client_cert` when given (mutual TLS).
///
/// # Errors
/// [`TlsError::Config`].
pub fn client_config(
    roots: rustls::RootCertStore,
    client_cert: Option<Arc<dyn ResolvesClientCert>>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots);
    Ok(match client_cert {
        Some(resolver) => builder.with_client_cert_resolver(resolver),
        None => builder.with_no_client_auth(),
    })
}

/// Work for the signing thread: given the client, a future to run there.
type Job = Box<dyn FnOnce(Client) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A vault [`Client`] living on its own thread and current-thread runtime, for callers that
/// must not (or cannot) drive async I/O themselves: rustls callbacks. Cheap to clone; the
/// thread stops when the last clone (and every key and resolver made from it) is dropped.
#[derive(Clone)]
pub struct SigningClient {
    tx: tokio::sync::mpsc::UnboundedSender<Job>,
    /// Longest wait for one signature.
    timeout: Duration,
}

impl std::fmt::Debug for SigningClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningClient").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl SigningClient {
    /// Starts the signing thread and connects it to the daemon. Works from any context: the
    /// thread builds its own runtime.
    ///
    /// # Errors
    /// [`TlsError::Client`] when the daemon cannot be reached, [`TlsError::Thread`].
    pub async fn connect(builder: ClientBuilder) -> Result<SigningClient, TlsError> {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        spawn(builder, move |r| {
            let _ = ready_tx.send(r);
        })?;
        ready_rx.await.map_err(|_| TlsError::Thread("signing thread exited while connecting".into()))?
    }

    /// [`SigningClient::connect`] for synchronous callers (not on an async runtime's thread).
    ///
    /// # Errors
    /// As [`SigningClient::connect`].
    pub fn connect_blocking(builder: ClientBuilder) -> Result<SigningClient, TlsError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        spawn(builder, move |r| {
            let _ = ready_tx.send(r);
        })?;
        ready_rx.recv().map_err(|_| TlsError::Thread("signing thread exited while connecting".into()))?
    }

    /// Sets the longest wait for one signature (default [`DEFAULT_SIGN_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> SigningClient {
        self.timeout = timeout;
        self
    }

    /// Runs `f` with the client on the signing thread and awaits its result (from any runtime).
    ///
    /// # Errors
    /// [`TlsError::Thread`] if the thread has stopped; whatever `f` returns.
    pub async fn run<T, F, Fut>(&self, f: F) -> Result<T, TlsError>
    where
        T: Send + 'static,
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, TlsError>> + Send + 'static,
    {
        let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
        self.submit(Box::new(move |client| {
            Box::pin(async move {
                let _ = reply_tx.send(f(client).await);
            })
        }))?;
        reply_rx.await.map_err(|_| TlsError::Thread("signing thread stopped".into()))?
    }

    /// Signs `message` with key `name` and blocks the calling thread until the signature
    /// arrives (at most the timeout), in the way that is safe on the current runtime flavour.
    ///
    /// # Errors
    /// [`TlsError::Client`] from the daemon, [`TlsError::Timeout`], [`TlsError::Thread`].
    pub fn sign_blocking(&self, name: &str, message: &[u8], options: SignOptions) -> Result<Vec<u8>, TlsError> {
        let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
        let (name, message) = (name.to_owned(), message.to_vec());
        self.submit(Box::new(move |client| {
            Box::pin(async move {
                let result = client.sign(&name, SignInput::Message(message), &options).await;
                let _ = reply_tx.send(result.map(|s| s.bytes().to_vec()));
            })
        }))?;
        let timeout = self.timeout;
        let received = wait_blocking(move || reply_rx.recv_timeout(timeout));
        match received {
            Ok(result) => Ok(result?),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(TlsError::Timeout(timeout)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(TlsError::Thread("signing thread dropped the request".into()))
            }
        }
    }

    fn submit(&self, job: Job) -> Result<(), TlsError> {
        self.tx.send(job).map_err(|_| TlsError::Thread("signing thread stopped".into()))
    }
}

/// Starts the signing thread; `ready` gets the connected handle or the error.
fn spawn(
    builder: ClientBuilder,
    ready: impl FnOnce(Result<SigningClient, TlsError>) + Send + 'static,
) -> Result<(), TlsError> {
    std::thread::Builder::new()
        .name("tpm-vault-tls".into())
        .spawn(move || {
            // Built and dropped on this thread, outside any other runtime.
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return ready(Err(TlsError::Thread(format!("cannot start its runtime: {e}")))),
            };
            runtime.block_on(async move {
                let client = match builder.connect().await {
                    Ok(c) => c,
                    Err(e) => return ready(Err(e.into())),
                };
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
                ready(Ok(SigningClient { tx, timeout: DEFAULT_SIGN_TIMEOUT }));
                // Ends when every handle is gone. Jobs run concurrently over one connection.
                while let Some(job) = rx.recv().await {
                    tokio::spawn(job(client.clone()));
                }
            });
        })
        .map(drop)
        .map_err(|e| TlsError::Thread(format!("cannot start: {e}")))
}

/// A rustls signing key whose private half is a vault key: every handshake signature is a
/// `Sign` call to the daemon, made by a [`SigningClient`].
///
/// ECDSA P-256 and P-384 keys sign `ecdsa_secp256r1_sha256` / `ecdsa_secp384r1_sha384`; RSA keys
/// offer only RSA-PSS (`rsa_pss_rsae_sha256`, `_sha384`, salt = hash length), as TLS 1.3
/// requires. The rustls side is the one shared with the daemon's own TLS key
/// (`tpm_vault_proto::tls_key`).
#[derive(Clone, Debug)]
pub struct VaultSigningKey(TlsKey<VaultKeySigner>);

/// Signs handshake messages with one vault key through a [`SigningClient`].
#[derive(Debug)]
struct VaultKeySigner {
    client: SigningClient,
    name: String,
}

impl VaultSigningKey {
    /// The signing key for vault key `name` (its public key is fetched now).
    ///
    /// # Errors
    /// [`TlsError::Client`] (`NotFound`, `PermissionDenied`, ...), [`TlsError::Algorithm`].
    pub async fn new(client: &SigningClient, name: &str) -> Result<VaultSigningKey, TlsError> {
        let key = name.to_owned();
        let public = client.run(move |c| async move { Ok(c.public_key(&key).await?) }).await?;
        VaultSigningKey::from_public(client, name, public.algorithm, public.der)
    }

    fn from_public(
        client: &SigningClient,
        name: &str,
        algorithm: KeyAlgorithm,
        spki: Vec<u8>,
    ) -> Result<VaultSigningKey, TlsError> {
        // TLS keys are ECC or RSA; ML-DSA, ML-KEM and hybrid keys have no TLS signature scheme here.
        let signer = VaultKeySigner { client: client.clone(), name: name.to_owned() };
        TlsKey::new(signer, algorithm, spki).map(VaultSigningKey).ok_or_else(|| TlsError::Algorithm(name.to_owned()))
    }

    /// The vault key's name.
    pub fn name(&self) -> &str {
        &self.0.signer().name
    }
}

impl SigningKey for VaultSigningKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        self.0.choose_scheme(offered)
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        self.0.public_key()
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        self.0.algorithm()
    }
}

impl SignMessage for VaultKeySigner {
    fn sign_message(
        &self,
        message: &[u8],
        hash: HashAlgorithm,
        scheme: crate::SignatureScheme,
    ) -> Result<Vec<u8>, rustls::Error> {
        let options = SignOptions::new().with_hash(hash).with_scheme(scheme);
        self.client
            .sign_blocking(&self.name, message, options)
            .map_err(|e| rustls::Error::General(format!("vault key {}: {e}", self.name)))
    }
}

/// Loads the chain stored with `name` and pairs it with a [`VaultSigningKey`], checking that
/// the certificate's public key is the key's.
///
/// # Errors
/// [`TlsError::Client`] (`NotFound` when the key has no certificate), [`TlsError::Chain`].
pub async fn certified_key(client: &SigningClient, name: &str) -> Result<CertifiedKey, TlsError> {
    Ok(Arc::unwrap_or_clone(load(client, name).await?.certified))
}

/// A served certificate and the stored version it came from.
#[derive(Debug)]
struct Served {
    version: u64,
    tpm_name: String,
    certified: Arc<CertifiedKey>,
}

async fn load(client: &SigningClient, name: &str) -> Result<Served, TlsError> {
    let key = name.to_owned();
    let (chain, public) = client
        .run(move |c| async move {
            let chain = c.certificate(&key).await?;
            let public = c.public_key(&key).await?;
            Ok((chain, public))
        })
        .await?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain.chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Chain { key: name.to_owned(), reason: e.to_string() })?;
    let signing = VaultSigningKey::from_public(client, name, public.algorithm, public.der)?;
    let certified = CertifiedKey::new(certs, Arc::new(signing));
    certified.keys_match().map_err(|e| TlsError::Chain { key: name.to_owned(), reason: e.to_string() })?;
    Ok(Served { version: chain.version, tpm_name: chain.tpm_name, certified: Arc::new(certified) })
}

/// Serves a vault key's stored certificate chain, as server certificate
/// ([`ResolvesServerCert`]) or client certificate ([`ResolvesClientCert`]), and follows
/// rotation: every `refresh` interval it asks the daemon for the chain's version and, when
/// the chain was replaced or the key re-created, loads the new pair. Handshakes never wait for
/// that: they get the pair loaded last.
#[derive(Debug, Clone)]
pub struct VaultCertResolver {
    state: Arc<ResolverState>,
}

#[derive(Debug)]
struct ResolverState {
    client: SigningClient,
    name: String,
    current: RwLock<Arc<Served>>,
}

impl VaultCertResolver {
    /// Loads key `name`'s chain and, unless `refresh` is zero, checks for a new version every
    /// `refresh` on the signing thread (for as long as the resolver exists).
    ///
    /// # Errors
    /// As [`certified_key`].
    pub async fn new(client: &SigningClient, name: &str, refresh: Duration) -> Result<VaultCertResolver, TlsError> {
        let served = load(client, name).await?;
        let state = Arc::new(ResolverState {
            client: client.clone(),
            name: name.to_owned(),
            current: RwLock::new(Arc::new(served)),
        });
        if !refresh.is_zero() {
            let weak = Arc::downgrade(&state);
            client.submit(Box::new(move |_| Box::pin(poll(weak, refresh))))?;
        }
        Ok(VaultCertResolver { state })
    }

    /// Checks for a new chain or key version now and loads it; returns whether it changed.
    ///
    /// # Errors
    /// As [`certified_key`]; the previous pair stays in use.
    pub async fn refresh(&self) -> Result<bool, TlsError> {
        self.state.refresh().await
    }

    /// The pair served now.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.state.current.read().ok().map(|s| s.certified.clone())
    }

    /// The stored version served now.
    pub fn version(&self) -> Option<u64> {
        self.state.current.read().ok().map(|s| s.version)
    }
}

impl ResolverState {
    async fn refresh(&self) -> Result<bool, TlsError> {
        let key = self.name.clone();
        let stored = self.client.run(move |c| async move { Ok(c.certificate(&key).await?) }).await?;
        let unchanged =
            self.current.read().map(|s| s.version == stored.version && s.tpm_name == stored.tpm_name).unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let served = load(&self.client, &self.name).await?;
        if let Ok(mut current) = self.current.write() {
            *current = Arc::new(served);
        }
        Ok(true)
    }
}

/// The refresh loop, on the signing thread; ends with the resolver.
async fn poll(state: Weak<ResolverState>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(state) = state.upgrade() else { return };
        // Errors (daemon restarting, key briefly missing) keep the previous pair.
        let _ = state.refresh().await;
    }
}

impl ResolvesServerCert for VaultCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl ResolvesClientCert for VaultCertResolver {
    fn resolve(&self, _root_hint_subjects: &[&[u8]], sigschemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        let current = self.current()?;
        current.key.choose_scheme(sigschemes).map(|_| current)
    }

    fn has_certs(&self) -> bool {
        true
    }
}
