//! The async [`Client`]: connecting to the daemon's Unix socket and one method per RPC.
//!
//! Owns the transport (a tonic `Channel` over a Unix-socket connector), per-request timeouts
//! and the conversion between API messages and the crate's types. It does not retry: an
//! `UNAVAILABLE` error is returned to the caller, who knows whether retrying is safe.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::Request;
use tpm_vault_proto::v1 as proto;
use tpm_vault_proto::v1::attestation_service_client::AttestationServiceClient;
use tpm_vault_proto::v1::crypto_service_client::CryptoServiceClient;
use tpm_vault_proto::v1::key_service_client::KeyServiceClient;
use tpm_vault_proto::v1::seal_service_client::SealServiceClient;
use tpm_vault_proto::v1::status_service_client::StatusServiceClient;

use crate::access::{AccessCheck, Operation};
use crate::names::{natural_hash, signs_whole_messages, Named};
use crate::sign::{Hasher, INLINE_MESSAGE_LIMIT};
use crate::{
    BlockingClient, DaemonStatus, Error, HashAlgorithm, KeyAlgorithm, KeyAuth, KeyInfo, KeyUsage, PcrBinding,
    PublicKey, SignInput, SignOptions, SignPurpose, Signature, SignatureScheme,
};

/// Where `tpm-vaultd` listens by default.
pub const DEFAULT_SOCKET: &str = "/run/tpm-vault/vault.sock";

/// Time allowed to open the socket.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time allowed for a call, queueing for the TPM included.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Time allowed for key creation: RSA key generation on a hardware TPM can take tens of seconds.
const DEFAULT_CREATE_TIMEOUT: Duration = Duration::from_secs(120);

/// Keys per `ListKeys` page (the API's maximum).
const LIST_PAGE_SIZE: u32 = 1000;

/// The most `ListKeys` pages [`Client::list_keys`] reads (a million keys): a daemon, or a
/// process posing as one on a planted socket, that pages forever gets an error, not the
/// caller's memory.
pub const MAX_LIST_PAGES: usize = 1024;

/// The most bytes of `ListKeys` pages (as encoded) [`Client::list_keys`] reads.
pub const MAX_LIST_BYTES: usize = 64 << 20;

/// The authority sent to the daemon; a Unix socket has no host name, so any valid one will do.
const SOCKET_AUTHORITY: &str = "http://tpm-vaultd";

/// Largest HTTP/2 DATA frame the client accepts (advertised in its SETTINGS; the daemon
/// advertises the same). HTTP/2's default of 16 KiB cost the daemon a `writev`, and this side a
/// `recv` and a wake-up, per 16 KiB of a bulk `Encrypt`/`Decrypt` stream. Flow-control windows
/// stay hyper's defaults, so the response data a connection may hold is unchanged.
const HTTP2_MAX_FRAME: u32 = 1024 * 1024;

/// An async client for `tpm-vaultd`.
///
/// Cloning is cheap: clones share one connection, which carries concurrent calls. If the daemon
/// restarts, the next call reconnects.
#[derive(Clone, Debug)]
pub struct Client {
    /// `tpmvault.v1.KeyService` (certificates too: `crate::cert`).
    pub(crate) keys: KeyServiceClient<Channel>,
    /// `tpmvault.v1.StatusService`.
    status: StatusServiceClient<Channel>,
    /// `tpmvault.v1.CryptoService` (data keys, streams, random bytes: `crate::crypto`).
    pub(crate) crypto: CryptoServiceClient<Channel>,
    /// `tpmvault.v1.AttestationService` (quotes, PCRs, AK: `crate::attest`).
    pub(crate) attestation: AttestationServiceClient<Channel>,
    /// `tpmvault.v1.SealService` (sealed secrets, signed policies: `crate::seal`), allowed
    /// messages as large as the biggest secret.
    pub(crate) sealing: SealServiceClient<Channel>,
    /// Deadline of each call, so a stuck daemon cannot hang the caller forever.
    request_timeout: Duration,
    /// Longer deadline for `CreateKey`, which waits for TPM key generation.
    create_timeout: Duration,
    /// Opens a connection of its own for each encryption or decryption stream (see
    /// `crate::crypto`); `None` for a client made [`from_channel`](Client::from_channel).
    pub(crate) dialer: Option<Dialer>,
    /// Threads that seal and open the chunks of an in-process stream (`crate::bulk`).
    pub(crate) bulk_threads: crate::bulk::Threads,
}

impl Client {
    /// Connects to the daemon's Unix socket with the default timeouts (5 s to connect, 30 s
    /// per call, 120 s for key creation). Use [`Client::builder`] to change them.
    ///
    /// # Errors
    /// [`Error::Transport`] when the socket cannot be opened; its message names the path and,
    /// when nobody listens there, asks whether `tpm-vaultd` is running.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::Client;
    ///
    /// # async fn demo() -> Result<(), tpm_vault_client::Error> {
    /// let client = Client::connect("/run/tpm-vault/vault.sock").await?;
    /// println!("daemon {}", client.status().await?.version);
    /// # Ok(()) }
    /// ```
    pub async fn connect(socket_path: impl AsRef<Path>) -> Result<Client, Error> {
        ClientBuilder::new(socket_path).connect().await
    }

    /// A builder, to set timeouts before connecting.
    pub fn builder(socket_path: impl AsRef<Path>) -> ClientBuilder {
        ClientBuilder::new(socket_path)
    }

    /// Wraps an existing channel (TCP+TLS, an in-process transport in tests, ...).
    ///
    /// The default per-call timeouts apply on top of whatever the channel sets.
    pub fn from_channel(channel: Channel) -> Client {
        Client {
            keys: KeyServiceClient::new(channel.clone()),
            crypto: CryptoServiceClient::new(channel.clone()).max_decoding_message_size(crate::crypto::MAX_RESPONSE),
            attestation: AttestationServiceClient::new(channel.clone()),
            sealing: SealServiceClient::new(channel.clone())
                .max_decoding_message_size(crate::seal::MAX_SEAL_MESSAGE)
                .max_encoding_message_size(crate::seal::MAX_SEAL_MESSAGE),
            status: StatusServiceClient::new(channel),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            create_timeout: DEFAULT_CREATE_TIMEOUT,
            dialer: None,
            bulk_threads: crate::bulk::Threads::new(crate::bulk::threads()),
        }
    }

    /// The same client with `threads` threads sealing and opening the chunks of
    /// [`copy_encrypt`](Client::copy_encrypt) and [`copy_decrypt`](Client::copy_decrypt)
    /// streams (at least 1). The default is one per CPU this process may run on (its
    /// affinity), at most 8; with 1 the calling thread does the AES work itself.
    pub fn with_bulk_threads(mut self, threads: usize) -> Client {
        self.bulk_threads = crate::bulk::Threads::new(threads);
        self
    }

    /// The same client leaving one of its bulk threads' CPUs to the thread that reads and
    /// writes the stream (for an output that costs a copy, like a file, as `tpm-vault encrypt` writes).
    pub fn with_bulk_io_core(mut self) -> Client {
        self.bulk_threads.io_core = true;
        self
    }

    /// Creates a key inside the TPM. `KeyAlgorithm::Unspecified` means `ecc-p256`.
    ///
    /// # Errors
    /// `AlreadyExists` if the name is taken, `InvalidArgument` for a bad name or binding,
    /// `PermissionDenied` if the access policy forbids it, and [`Error::Transport`]-class
    /// failures (`Unavailable`).
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{Client, KeyAlgorithm, PcrBinding};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let binding: PcrBinding = "sha256:9".parse()?;
    /// let key = client.create_key("disk", KeyAlgorithm::EccP384, Some(binding)).await?;
    /// println!("created {} ({})", key.name, key.tpm_name);
    /// # Ok(()) }
    /// ```
    pub async fn create_key(
        &self,
        name: &str,
        algorithm: KeyAlgorithm,
        pcr_binding: Option<PcrBinding>,
    ) -> Result<KeyInfo, Error> {
        self.create_key_request(name, algorithm, pcr_binding, Vec::new(), &[]).await
    }

    /// Creates a key that may be used only for `usages` (`sign`: raw signatures, the default
    /// when empty; `ssh`: SSH user authentication and SSHSIG only; `policy`: PCR-policy
    /// approvals only), optionally PCR-bound or password-protected (not both). Usages can be
    /// narrowed later ([`Client::set_key_usage`]), never widened.
    ///
    /// # Errors
    /// As [`Client::create_key`]; `InvalidArgument` for a usage the algorithm cannot serve
    /// (`ssh`: ECC and RSA keys; `policy`: ecc-p256).
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{Client, KeyAlgorithm, KeyUsage};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let key = client.create_key_with_usages("me", KeyAlgorithm::EccP256, None, None, &[KeyUsage::Ssh]).await?;
    /// assert_eq!(key.usages, [KeyUsage::Ssh]);
    /// # Ok(()) }
    /// ```
    pub async fn create_key_with_usages(
        &self,
        name: &str,
        algorithm: KeyAlgorithm,
        pcr_binding: Option<PcrBinding>,
        auth: Option<&KeyAuth>,
        usages: &[KeyUsage],
    ) -> Result<KeyInfo, Error> {
        let auth = auth.map(|a| a.bytes().to_vec()).unwrap_or_default();
        self.create_key_request(name, algorithm, pcr_binding, auth, usages).await
    }

    /// Narrows a key's usages to `usages` (each one the key has; widening is refused).
    ///
    /// # Errors
    /// `NotFound`; `InvalidArgument` for an empty list or a usage the key does not have;
    /// `PermissionDenied` (needs the `create` operation on the key), `Unavailable`.
    pub async fn set_key_usage(&self, name: &str, usages: &[KeyUsage]) -> Result<KeyInfo, Error> {
        let request = self.request(proto::SetKeyUsageRequest {
            name: name.to_owned(),
            usages: usages.iter().map(|&u| u as i32).collect(),
        });
        Ok(self.keys.clone().set_key_usage(request).await?.into_inner().into())
    }

    /// Creates a key that needs a password to be used (pass it with
    /// [`SignOptions::with_auth`]). A key is either password-protected or PCR-bound, not both.
    ///
    /// # Errors
    /// As [`Client::create_key`].
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{Client, KeyAlgorithm, KeyAuth, SignInput, SignOptions};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let auth = KeyAuth::new(b"s3cret".to_vec())?;
    /// client.create_key_with_auth("guarded", KeyAlgorithm::EccP256, &auth).await?;
    /// let options = SignOptions::new().with_auth(auth);
    /// client.sign("guarded", SignInput::Message(b"hello".to_vec()), &options).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_key_with_auth(
        &self,
        name: &str,
        algorithm: KeyAlgorithm,
        auth: &KeyAuth,
    ) -> Result<KeyInfo, Error> {
        self.create_key_request(name, algorithm, None, auth.bytes().to_vec(), &[]).await
    }

    async fn create_key_request(
        &self,
        name: &str,
        algorithm: KeyAlgorithm,
        pcr_binding: Option<PcrBinding>,
        auth: Vec<u8>,
        usages: &[KeyUsage],
    ) -> Result<KeyInfo, Error> {
        let mut request = Request::new(proto::CreateKeyRequest {
            name: name.to_owned(),
            algorithm: algorithm.into(),
            pcr_binding: pcr_binding.as_ref().map(PcrBinding::to_proto),
            auth,
            usages: usages.iter().map(|&u| u as i32).collect(),
        });
        request.set_timeout(self.create_timeout);
        let key = self.keys.clone().create_key(request).await?;
        Ok(key.into_inner().into())
    }

    /// A key's metadata.
    ///
    /// # Errors
    /// `NotFound` if there is no such key; `PermissionDenied`, `Unavailable` as for every call.
    pub async fn key(&self, name: &str) -> Result<KeyInfo, Error> {
        let request = self.request(proto::GetKeyRequest { name: name.to_owned() });
        let key = self.keys.clone().get_key(request).await?;
        Ok(key.into_inner().into())
    }

    /// All keys the caller may see, in name order (every page is fetched).
    ///
    /// # Errors
    /// `PermissionDenied`, `Unavailable`; `Internal` if the daemon keeps returning the same page;
    /// `OutOfRange` past [`MAX_LIST_PAGES`] pages or [`MAX_LIST_BYTES`] bytes (a daemon, or an
    /// impostor on a planted socket, that pages forever).
    pub async fn list_keys(&self) -> Result<Vec<KeyInfo>, Error> {
        let mut keys = Vec::new();
        let mut page_token = String::new();
        let mut bytes = 0usize;
        for _ in 0..MAX_LIST_PAGES {
            let request =
                self.request(proto::ListKeysRequest { page_size: LIST_PAGE_SIZE, page_token: page_token.clone() });
            let page = self.keys.clone().list_keys(request).await?.into_inner();
            bytes = bytes.saturating_add(prost::Message::encoded_len(&page));
            if bytes > MAX_LIST_BYTES {
                return Err(Error::Status(tonic::Status::out_of_range(format!(
                    "the daemon's key list is larger than {MAX_LIST_BYTES} bytes"
                ))));
            }
            keys.extend(page.keys.into_iter().map(KeyInfo::from));
            if page.next_page_token.is_empty() {
                return Ok(keys);
            }
            if page.next_page_token == page_token {
                return Err(Error::Status(tonic::Status::internal("the daemon returned the same key list page twice")));
            }
            page_token = page.next_page_token;
        }
        Err(Error::Status(tonic::Status::out_of_range(format!(
            "the daemon's key list has more than {MAX_LIST_PAGES} pages"
        ))))
    }

    /// Deletes a key. The TPM holds no copy, so it is gone for good.
    ///
    /// # Errors
    /// `NotFound` if there is no such key; `PermissionDenied`, `Unavailable`.
    pub async fn delete_key(&self, name: &str) -> Result<(), Error> {
        let request = self.request(proto::DeleteKeyRequest { name: name.to_owned() });
        self.keys.clone().delete_key(request).await?;
        Ok(())
    }

    /// A key's public part, as DER and PEM SubjectPublicKeyInfo.
    ///
    /// # Errors
    /// `NotFound` if there is no such key; `PermissionDenied`, `Unavailable`.
    pub async fn public_key(&self, name: &str) -> Result<PublicKey, Error> {
        let request = self.request(proto::GetPublicKeyRequest { name: name.to_owned() });
        let key = self.keys.clone().get_public_key(request).await?;
        Ok(key.into_inner().into())
    }

    /// Signs a message or a digest with a key.
    ///
    /// Messages above 1 MiB are hashed here and sent as a digest (the signature is the same);
    /// the key's algorithm is looked up first to pick the hash if it is unspecified. ML-DSA and
    /// hybrid keys sign whole messages (at most 4 MiB), so theirs are always sent whole.
    ///
    /// # Errors
    /// `NotFound` (no such key), `InvalidArgument` (wrong digest length, a scheme that does not
    /// suit the key), `FailedPrecondition` (PCR values differ from the key's binding),
    /// `PermissionDenied`, `ResourceExhausted` (TPM busy or locked out), `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{Client, HashAlgorithm, SignInput, SignOptions};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let options = SignOptions::new().with_hash(HashAlgorithm::Sha256);
    /// let signature = client
    ///     .sign("web", SignInput::Message(b"to be signed".to_vec()), &options)
    ///     .await?;
    /// assert!(client
    ///     .verify("web", SignInput::Message(b"to be signed".to_vec()), signature.bytes(), &options)
    ///     .await?);
    /// # Ok(()) }
    /// ```
    pub async fn sign(&self, name: &str, input: SignInput, options: &SignOptions) -> Result<Signature, Error> {
        // The daemon parses and hashes an SSH signature's data itself: never shrink it.
        let (input, hash) = match options.purpose() {
            SignPurpose::Ssh => (input, options.hash()),
            SignPurpose::Unspecified => self.shrink(name, input, options.hash(), options.scheme()).await?,
        };
        let request = self.request(proto::SignRequest {
            name: name.to_owned(),
            input: Some(input.into_sign_proto()),
            hash: hash.into(),
            scheme: options.scheme().into(),
            auth: options.auth().map(|auth| auth.bytes().to_vec()).unwrap_or_default(),
            purpose: options.purpose().into(),
        });
        let response = self.keys.clone().sign(request).await?;
        Ok(response.into_inner().into())
    }

    /// Checks a signature with a key's public part. `Ok(false)` means the signature is wrong.
    ///
    /// # Errors
    /// As [`Client::sign`], except that PCR values and the TPM play no part.
    pub async fn verify(
        &self,
        name: &str,
        input: SignInput,
        signature: &[u8],
        options: &SignOptions,
    ) -> Result<bool, Error> {
        let (input, hash) = self.shrink(name, input, options.hash(), options.scheme()).await?;
        let request = self.request(proto::VerifyRequest {
            name: name.to_owned(),
            input: Some(input.into_verify_proto()),
            signature: signature.to_vec(),
            hash: hash.into(),
            scheme: options.scheme().into(),
        });
        let response = self.keys.clone().verify(request).await?;
        Ok(response.into_inner().valid)
    }

    /// Decapsulates an ML-KEM ciphertext with a vault ML-KEM key and returns the 32-byte shared
    /// secret (zeroed on drop). The key's private part never leaves the daemon.
    ///
    /// # Errors
    /// `NotFound`, `InvalidArgument` (not an ML-KEM key, wrong ciphertext length),
    /// `FailedPrecondition` (PCR values differ from the key's binding), `PermissionDenied`
    /// (needs the `decrypt` operation), `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: tpm_vault_client::Client) -> Result<(), tpm_vault_client::Error> {
    /// let sent = client.encapsulate("kem").await?; // anyone with the public key can do this
    /// let secret = client.decapsulate("kem", &sent.ciphertext).await?;
    /// assert_eq!(secret.as_slice(), sent.shared_secret());
    /// # Ok(()) }
    /// ```
    pub async fn decapsulate(&self, name: &str, ciphertext: &[u8]) -> Result<zeroize::Zeroizing<Vec<u8>>, Error> {
        let request =
            self.request(proto::DecapsulateRequest { name: name.to_owned(), ciphertext: ciphertext.to_vec() });
        let response = self.keys.clone().decapsulate(request).await?.into_inner();
        Ok(response.shared_secret)
    }

    /// Encapsulates a fresh shared secret to ML-KEM key `name`, in-core with its public key (the
    /// daemon only serves the public key).
    ///
    /// # Errors
    /// As [`Client::public_key`]; [`Error::InvalidInput`] if the key is not an ML-KEM key.
    pub async fn encapsulate(&self, name: &str) -> Result<crate::pq::Encapsulated, Error> {
        let public = self.public_key(name).await?;
        crate::pq::KemPublicKey::from_spki(&public.der)?.encapsulate()
    }

    /// The daemon's and the TPM's state.
    ///
    /// # Errors
    /// `PermissionDenied`, `Unavailable`.
    pub async fn status(&self) -> Result<DaemonStatus, Error> {
        let request = self.request(proto::GetStatusRequest {});
        let status = self.status.clone().get_status(request).await?;
        Ok(status.into_inner().into())
    }

    /// The access-policy decision for a local user: whether `uid` may do `operation` (on key
    /// `key`, for operations on keys), and which rule allows it. The caller needs the `admin`
    /// operation.
    ///
    /// # Errors
    /// `InvalidArgument` (a bad key name), `PermissionDenied` (no `admin`), `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{AccessDecision, Client, Operation};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let check = client.check_access(33, Operation::Sign, Some("web-1")).await?;
    /// match check.decision {
    ///     AccessDecision::Allow { rule } => println!("{} may sign with web-1 (rule {rule})", check.identity),
    ///     AccessDecision::Deny => println!("{} may not sign with web-1", check.identity),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check_access(&self, uid: u32, operation: Operation, key: Option<&str>) -> Result<AccessCheck, Error> {
        let request = self.request(proto::CheckAccessRequest {
            uid,
            operation: operation.name().to_owned(),
            key: key.unwrap_or_default().to_owned(),
        });
        let check = self.status.clone().check_access(request).await?;
        Ok(check.into_inner().into())
    }

    /// Replaces a message too large to send by its digest, unless the key signs whole messages
    /// (ML-DSA, hybrid), whose messages go whole (the daemon takes up to 4 MiB).
    async fn shrink(
        &self,
        name: &str,
        input: SignInput,
        hash: HashAlgorithm,
        scheme: SignatureScheme,
    ) -> Result<(SignInput, HashAlgorithm), Error> {
        let message = match input {
            SignInput::Message(message) if message.len() > INLINE_MESSAGE_LIMIT => message,
            small => return Ok((small, hash)),
        };
        if signs_whole_messages(KeyAlgorithm::Unspecified, scheme) {
            return Ok((SignInput::Message(message), hash));
        }
        let algorithm = self.key(name).await?.algorithm;
        if signs_whole_messages(algorithm, scheme) {
            return Ok((SignInput::Message(message), hash));
        }
        let hash = if hash == HashAlgorithm::Unspecified { natural_hash(algorithm) } else { hash };
        let mut hasher = Hasher::new(hash)?;
        // Hashing megabytes takes milliseconds: keep it off the runtime's worker.
        let digest = tokio::task::spawn_blocking(move || {
            hasher.update(&message);
            hasher.finish()
        })
        .await
        .map_err(|e| Error::Runtime(io::Error::other(e)))?;
        Ok((SignInput::Digest(digest), hash))
    }

    /// A request with the per-call deadline.
    pub(crate) fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.request_timeout);
        request
    }
}

/// Connection settings for a [`Client`].
///
/// ```no_run
/// use std::time::Duration;
/// use tpm_vault_client::Client;
///
/// # async fn demo() -> Result<(), tpm_vault_client::Error> {
/// let client = Client::builder("/run/tpm-vault/vault.sock")
///     .with_request_timeout(Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    /// The daemon's socket.
    socket: PathBuf,
    /// Time allowed to open the socket.
    connect_timeout: Duration,
    /// Deadline of each call.
    request_timeout: Duration,
    /// Deadline of key creation, which can be slow on hardware TPMs.
    create_timeout: Duration,
}

impl ClientBuilder {
    /// Settings for the daemon at `socket_path`, with the default timeouts.
    pub fn new(socket_path: impl AsRef<Path>) -> ClientBuilder {
        ClientBuilder {
            socket: socket_path.as_ref().to_path_buf(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            create_timeout: DEFAULT_CREATE_TIMEOUT,
        }
    }

    /// Time allowed to open the socket (default 5 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// Deadline of each call (default 30 s).
    pub fn with_request_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.request_timeout = timeout;
        self
    }

    /// Deadline of key creation (default 120 s).
    pub fn with_create_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.create_timeout = timeout;
        self
    }

    /// Connects now, so that a missing daemon is reported here rather than on the first call.
    ///
    /// # Errors
    /// [`Error::Transport`] when the socket cannot be opened.
    pub async fn connect(self) -> Result<Client, Error> {
        let connector = UdsConnector { path: Arc::from(self.socket.as_path()) };
        let endpoint = Endpoint::from_static(SOCKET_AUTHORITY)
            .connect_timeout(self.connect_timeout)
            .max_frame_size(HTTP2_MAX_FRAME);
        let channel = endpoint
            .connect_with_connector(connector.clone())
            .await
            .map_err(|e| Error::transport(self.socket.clone(), e))?;
        Ok(Client {
            request_timeout: self.request_timeout,
            create_timeout: self.create_timeout,
            dialer: Some(Dialer { endpoint, connector }),
            ..Client::from_channel(channel)
        })
    }

    /// Connects a [`BlockingClient`] with these settings.
    ///
    /// # Errors
    /// [`Error::Runtime`] if its runtime cannot start, [`Error::Transport`] as for
    /// [`connect`](ClientBuilder::connect).
    pub fn connect_blocking(self) -> Result<BlockingClient, Error> {
        BlockingClient::connect_with(self)
    }
}

/// Makes new connections to the daemon's socket, each a channel of its own.
#[derive(Clone, Debug)]
pub(crate) struct Dialer {
    /// The settings of the client's own connection (authority, connect timeout).
    endpoint: Endpoint,
    /// Opens the socket.
    connector: UdsConnector,
}

impl Dialer {
    /// A new channel, connected on first use (so this does not wait or fail).
    pub(crate) fn channel(&self) -> Channel {
        self.endpoint.connect_with_connector_lazy(self.connector.clone())
    }
}

/// Opens the daemon's Unix socket for each (re)connection of the channel.
///
/// Used instead of a `unix:` URI so that any path works (relative, non-UTF-8) and the
/// `io::Error` reaches [`Error::transport`] intact.
#[derive(Clone, Debug)]
struct UdsConnector {
    /// The socket path.
    path: Arc<Path>,
}

impl tower::Service<Uri> for UdsConnector {
    type Response = TokioIo<UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<UnixStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let path = Arc::clone(&self.path);
        Box::pin(async move { UnixStream::connect(&*path).await.map(TokioIo::new) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn missing_socket_says_daemon_is_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vault.sock");
        let err = Client::connect(&path).await.unwrap_err();
        assert!(err.is_daemon_down());
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert_eq!(
            err.to_string(),
            format!("cannot connect to {}: No such file or directory (is tpm-vaultd running?)", path.display())
        );
    }

    #[tokio::test]
    async fn refused_socket_says_daemon_is_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vault.sock");
        // A socket file nobody listens on: what a crashed daemon leaves behind.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let err = Client::connect(&path).await.unwrap_err();
        assert!(err.is_daemon_down(), "{err}");
        assert!(err.to_string().ends_with("Connection refused (is tpm-vaultd running?)"));
    }

    #[tokio::test]
    async fn listening_socket_connects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vault.sock");
        let _listener = tokio::net::UnixListener::bind(&path).unwrap();
        // The connection is accepted by the kernel's backlog; no HTTP/2 is spoken yet.
        let client = Client::builder(&path).with_request_timeout(Duration::from_millis(200)).connect().await.unwrap();
        let err = client.status().await.unwrap_err();
        assert!(matches!(err, Error::Status(_)), "{err:?}");
    }
}
