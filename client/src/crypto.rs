//! Bulk cryptography with data keys: stream encryption, and random bytes.
//!
//! [`Client::copy_encrypt`] and [`Client::copy_decrypt`] pump an [`AsyncRead`] into an
//! [`AsyncWrite`], encrypting in this process (format v2, `crate::bulk`): the daemon makes the
//! stream key and wraps it with the data key (`CreateStreamKey`), or unwraps it from a stream's
//! header (`OpenStreamKey`); the data key never leaves the daemon. A stream of format v1 (0.1)
//! is decrypted in the daemon, which holds its key. [`Client::copy_encrypt_in_daemon`] and
//! [`Client::copy_decrypt_in_daemon`] do the AES work in the daemon instead, over the
//! bidirectional `Encrypt`/`Decrypt` gRPC streams, for comparison and for daemons that must see
//! the data; [`Client::encrypt_reader`] / [`Client::decrypt_reader`] give the result as an
//! [`AsyncRead`] ([`CryptoReader`]). Memory stays bounded for any stream length: through the
//! daemon, input goes out in [`MESSAGE_SIZE`] messages through a channel of [`IN_FLIGHT`]
//! messages; in-process, a batch of chunks at a time. Each daemon stream runs on a connection
//! of its own, so that streams feeding one another through the caller cannot stall in
//! HTTP/2's shared flow-control window.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use prost::bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Code;
use tpm_vault_proto::v1 as proto;
use tpm_vault_proto::v1::crypto_service_client::CryptoServiceClient;

use tpm_vault_proto::stream::{self, ChunkCipher, Header};
use zeroize::Zeroizing;

use crate::{bulk, Client, Error, PcrBinding};

/// Plaintext (or ciphertext) bytes per request message: a few chunks, so the per-message
/// overhead is small while the memory held stays small.
pub const MESSAGE_SIZE: usize = 256 * 1024;

/// Request messages queued per stream: together with [`MESSAGE_SIZE`], the most input held.
pub const IN_FLIGHT: usize = 4;

/// Most random bytes the daemon returns per `GetRandom` request (1 MiB; earlier daemons
/// returned up to 16 MiB); [`Client::random`] and [`Client::write_random`] ask several times
/// for more.
pub const MAX_RANDOM_REQUEST: usize = 1024 * 1024;

/// Longest possible stream header (format v2 with a 255-byte key name). [`stream_key_name`]
/// never needs more bytes than this.
pub const MAX_STREAM_HEADER: usize = stream::MAX_HEADER;

/// Room for gRPC framing around the largest `GetRandom` response.
const RANDOM_FRAMING: usize = 64 * 1024;

/// Size of the pipe between a [`CryptoReader`]'s task and its reader.
const PIPE_SIZE: usize = 2 * MESSAGE_SIZE;

/// The largest response message the client accepts from `CryptoService` (a full `GetRandom`).
pub(crate) const MAX_RESPONSE: usize = MAX_RANDOM_REQUEST + RANDOM_FRAMING;

/// Reads `reader` until a stream header is complete (never past it: at most
/// [`MAX_STREAM_HEADER`] bytes) and parses it; the bytes read are appended to `head`, to be sent
/// on. Returns the header and its encoded length.
///
/// # Errors
/// [`Error::InvalidInput`] for input that does not start a stream, or ends inside its header;
/// [`Error::Read`].
pub async fn read_header<R>(reader: &mut R, head: &mut Vec<u8>) -> Result<(Header, usize), Error>
where
    R: AsyncRead + Unpin + ?Sized,
{
    loop {
        let want = MAX_STREAM_HEADER.saturating_sub(head.len()) as u64;
        let n = (&mut *reader).take(want).read_buf(head).await.map_err(Error::Read)?;
        match Header::parse(head).map_err(|e| Error::InvalidInput(e.0))? {
            Some(parsed) => return Ok(parsed),
            None if n == 0 => {
                return Err(Error::InvalidInput("stream truncated: it ended before the tpm-vault stream header".into()))
            }
            None => {}
        }
    }
}

/// A data key's public facts. The key itself never leaves the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataKey {
    /// The key's name, `[a-z0-9][a-z0-9._-]{0,63}`.
    pub name: String,
    /// Generation id, hex, written into every stream header: a key deleted and created again
    /// under the same name has another id, so old streams cannot be decrypted by mistake.
    pub key_id: String,
}

impl From<proto::DataKey> for DataKey {
    fn from(key: proto::DataKey) -> DataKey {
        DataKey { name: key.name, key_id: key.key_id }
    }
}

/// The name of the data key an encrypted stream was made with, read from the stream's first
/// bytes (at most [`MAX_STREAM_HEADER`] are needed).
///
/// `Ok(None)` means `prefix` is a valid start of a header but too short to tell.
///
/// # Errors
/// [`Error::InvalidInput`] when `prefix` does not start a `tpm-vault encrypt` stream.
///
/// # Examples
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let head = std::fs::read("backup.tar.sealed")?;
/// let key = tpm_vault_client::stream_key_name(&head)?;
/// println!("encrypted with {key:?}");
/// # Ok(()) }
/// ```
pub fn stream_key_name(prefix: &[u8]) -> Result<Option<String>, Error> {
    let bad = |why: &str| Error::InvalidInput(format!("not a tpm-vault encrypted stream: {why}"));
    let magic_len = prefix.len().min(stream::MAGIC.len());
    if prefix[..magic_len] != stream::MAGIC[..magic_len] {
        return Err(bad("bad magic"));
    }
    let (Some(&version), Some(&name_len)) = (prefix.get(8), prefix.get(9)) else {
        return Ok(None);
    };
    if ![stream::VERSION, stream::VERSION_2, stream::VERSION_1].contains(&version) {
        return Err(bad(&format!("unsupported version {version}")));
    }
    match Header::parse(prefix) {
        Ok(Some((header, _))) => Ok(Some(header.key_name)),
        Ok(None) => Ok(None),
        Err(_) => {
            // The header is complete but wrong after the name (a chunk size out of range):
            // still name its key if the name is readable.
            let name = prefix.get(10..10 + usize::from(name_len)).ok_or_else(|| bad("header"))?;
            let name = std::str::from_utf8(name).map_err(|_| bad("the key name is not UTF-8"))?;
            Ok(Some(name.to_owned()))
        }
    }
}

/// A stream key from the daemon: the header to write (or that was read) and the key.
struct StreamKey {
    /// The parsed header.
    header: Header,
    /// Its encoding.
    encoded: Vec<u8>,
    /// The 256-bit stream key.
    key: Zeroizing<[u8; 32]>,
}

impl StreamKey {
    /// From a `StreamKey` response.
    fn from_proto(mut response: proto::StreamKey) -> Result<StreamKey, Error> {
        let bad = || Error::Status(tonic::Status::internal("the daemon returned a malformed stream key"));
        let key = Zeroizing::new(<[u8; 32]>::try_from(response.key.as_ref()).map_err(|_| bad())?);
        response.key.fill(0);
        let encoded = response.header.to_vec();
        let (header, used) = Header::parse(&encoded).ok().flatten().ok_or_else(bad)?;
        if used != encoded.len() {
            return Err(bad());
        }
        Ok(StreamKey { header, encoded, key })
    }

    /// The chunk cipher of the stream, binding `context`.
    fn cipher(&self, context: &[u8]) -> Result<ChunkCipher, Error> {
        ChunkCipher::new(&self.key, &self.header, context).map_err(|e| Error::InvalidInput(e.0))
    }
}

impl Client {
    /// Creates a data key: 256 random bits sealed by the TPM (optionally bound to PCR values),
    /// used by [`Client::copy_encrypt`] and friends.
    ///
    /// # Errors
    /// `AlreadyExists` if the name is taken, `InvalidArgument` for a bad name or binding,
    /// `PermissionDenied`, `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// use tpm_vault_client::{Client, PcrBinding};
    ///
    /// # async fn demo(client: Client) -> Result<(), tpm_vault_client::Error> {
    /// let key = client.create_data_key("backups", None).await?;
    /// let bound: PcrBinding = "sha256:9".parse()?;
    /// client.create_data_key("boot-secrets", Some(bound)).await?;
    /// println!("{} has generation {}", key.name, key.key_id);
    /// # Ok(()) }
    /// ```
    pub async fn create_data_key(&self, name: &str, pcr_binding: Option<PcrBinding>) -> Result<DataKey, Error> {
        let request = self.request(proto::CreateDataKeyRequest {
            name: name.to_owned(),
            pcr_binding: pcr_binding.as_ref().map(PcrBinding::to_proto),
        });
        let key = self.crypto.clone().create_data_key(request).await?;
        Ok(key.into_inner().into())
    }

    /// Deletes a data key. Streams encrypted under it can no longer be decrypted.
    ///
    /// # Errors
    /// `NotFound` if there is no such data key; `PermissionDenied`, `Unavailable`.
    pub async fn delete_data_key(&self, name: &str) -> Result<(), Error> {
        let request = self.request(proto::DeleteDataKeyRequest { name: name.to_owned() });
        self.crypto.clone().delete_data_key(request).await?;
        Ok(())
    }

    /// `len` random bytes from the daemon's DRBG (seeded from the OS and the TPM), asked for in
    /// requests of at most [`MAX_RANDOM_REQUEST`] bytes. For very large amounts, prefer
    /// [`Client::write_random`], which does not hold them all.
    ///
    /// # Errors
    /// `PermissionDenied`, `Unavailable`.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: tpm_vault_client::Client) -> Result<(), tpm_vault_client::Error> {
    /// let nonce = client.random(32).await?;
    /// assert_eq!(nonce.len(), 32);
    /// # Ok(()) }
    /// ```
    pub async fn random(&self, len: usize) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let piece = self.random_piece(len - out.len()).await?;
            out.extend_from_slice(&piece);
        }
        Ok(out)
    }

    /// Writes `len` random bytes to `writer`, holding at most one request's worth
    /// ([`MAX_RANDOM_REQUEST`]) at a time. Returns the bytes written (`len`).
    ///
    /// # Errors
    /// [`Error::Write`] if `writer` fails; `PermissionDenied`, `Unavailable`.
    pub async fn write_random<W>(&self, len: u64, writer: &mut W) -> Result<u64, Error>
    where
        W: AsyncWrite + Unpin + ?Sized,
    {
        let mut written = 0u64;
        while written < len {
            let want = usize::try_from(len - written).unwrap_or(usize::MAX);
            let piece = self.random_piece(want).await?;
            writer.write_all(&piece).await.map_err(Error::Write)?;
            written += piece.len() as u64;
        }
        writer.flush().await.map_err(Error::Write)?;
        Ok(written)
    }

    /// Encrypts everything `reader` yields with data key `key`, writing the encrypted stream
    /// (header, then authenticated 64 KiB chunks) to `writer` as it is produced. `context` is
    /// bound into every chunk: decryption needs the same bytes (it may be empty).
    ///
    /// Memory stays bounded for any length. The call has no deadline (a stream may take
    /// hours); it ends when `reader` reaches end of file. Returns the bytes written.
    ///
    /// Throughput: each [`MESSAGE_SIZE`] message passes between this task and the connection's
    /// tasks, so a runtime that keeps them on one thread streams fastest: on a 2-CPU machine a
    /// current-thread runtime (what `tpm-vault encrypt` uses) moved about 1.4× the bytes of a
    /// multi-thread one (`docs/BENCHMARKS.md`, "Bulk cryptography").
    ///
    /// # Errors
    /// `NotFound` (no such data key), `FailedPrecondition` (PCR values differ from the key's
    /// binding), `PermissionDenied`, `Unavailable`; [`Error::Read`] / [`Error::Write`] when
    /// `reader` or `writer` fail. After an error `writer` holds an incomplete stream, which
    /// decryption rejects.
    ///
    /// # Examples
    /// ```no_run
    /// use tokio::fs::File;
    ///
    /// # async fn demo(client: tpm_vault_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut plain = File::open("backup.tar").await?;
    /// let mut sealed = File::create("backup.tar.sealed").await?;
    /// client.copy_encrypt("backups", b"host-1", &mut plain, &mut sealed).await?;
    /// sealed.sync_all().await?;
    /// # Ok(()) }
    /// ```
    pub async fn copy_encrypt<R, W>(
        &self,
        key: &str,
        context: &[u8],
        reader: &mut R,
        writer: &mut W,
    ) -> Result<u64, Error>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        let request =
            self.request(proto::CreateStreamKeyRequest { key_name: key.to_owned(), context: context.to_vec() });
        let stream_key = StreamKey::from_proto(self.crypto.clone().create_stream_key(request).await?.into_inner())?;
        let cipher = stream_key.cipher(context)?;
        let (written, tags) = bulk::encrypt(cipher, &stream_key.encoded, self.bulk_threads, reader, writer).await?;
        if !stream_key.header.is_committed() {
            // A daemon that still makes v2 streams: no commitment.
            return Ok(written);
        }
        // v3: the daemon commits to the chunks (only a holder of `encrypt` may ask).
        let request = self.request(proto::CommitStreamRequest {
            key_name: key.to_owned(),
            header: stream_key.encoded.clone(),
            context: context.to_vec(),
            tags_digest: tags.to_vec(),
        });
        let commitment = self.crypto.clone().commit_stream(request).await?.into_inner().commitment;
        if commitment.len() != stream::COMMITMENT {
            return Err(Error::Status(tonic::Status::internal("the daemon returned a malformed stream commitment")));
        }
        writer.write_all(&commitment).await.map_err(Error::Write)?;
        writer.flush().await.map_err(Error::Write)?;
        Ok(written + commitment.len() as u64)
    }

    /// [`Client::copy_encrypt`] with the AES work done in the daemon (the `Encrypt` RPC), for
    /// callers that want the daemon to see the data, and to compare. The output is the same
    /// format (v2). Returns the bytes written.
    ///
    /// # Errors
    /// As [`Client::copy_encrypt`].
    pub async fn copy_encrypt_in_daemon<R, W>(
        &self,
        key: &str,
        context: &[u8],
        reader: &mut R,
        writer: &mut W,
    ) -> Result<u64, Error>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        let (tx, rx) = mpsc::channel(IN_FLIGHT);
        // The first message names the key; the daemon reads it before it answers.
        let first = proto::EncryptRequest { key_name: key.to_owned(), context: context.to_vec(), data: Bytes::new() };
        tx.try_send(first).map_err(|_| channel_closed())?;
        let mut crypto = self.stream_client();
        let call = async move {
            let responses = crypto.encrypt(ReceiverStream::new(rx)).await?.into_inner();
            write_responses(responses, |m: &proto::EncryptResponse| &m.data, writer).await
        };
        let pump = pump(reader, tx, |data| proto::EncryptRequest { data: data.into(), ..Default::default() });
        let ((), written) = tokio::try_join!(pump, call)?;
        Ok(written)
    }

    /// Decrypts a stream made by [`Client::copy_encrypt`] (or `tpm-vault encrypt`), writing
    /// the plaintext to `writer`. The stream's header names the data key; `context` must be
    /// the bytes given at encryption.
    ///
    /// The daemon releases plaintext one authenticated 64 KiB chunk at a time, so `writer`
    /// never receives a byte of a chunk that failed authentication. Memory stays bounded for
    /// any length; the call has no deadline. Returns the plaintext bytes written.
    ///
    /// # Errors
    /// `InvalidArgument` when the stream is not one, was tampered with, truncated, reordered,
    /// or the context is wrong (the message names the failing chunk); `NotFound` when its data
    /// key no longer exists; `FailedPrecondition` for a PCR mismatch; `PermissionDenied`,
    /// `Unavailable`; [`Error::Read`] / [`Error::Write`]. After an error, `writer` may hold the
    /// plaintext of the chunks *before* the failing one: discard it.
    ///
    /// # Examples
    /// ```no_run
    /// use tokio::fs::File;
    ///
    /// # async fn demo(client: tpm_vault_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut sealed = File::open("backup.tar.sealed").await?;
    /// let mut plain = File::create("backup.tar.partial").await?;
    /// match client.copy_decrypt(b"host-1", &mut sealed, &mut plain).await {
    ///     Ok(_bytes) => tokio::fs::rename("backup.tar.partial", "backup.tar").await?,
    ///     Err(e) => {
    ///         tokio::fs::remove_file("backup.tar.partial").await?;
    ///         return Err(e.into());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn copy_decrypt<R, W>(&self, context: &[u8], reader: &mut R, writer: &mut W) -> Result<u64, Error>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        let mut head = Vec::with_capacity(MAX_STREAM_HEADER);
        let (header, used) = read_header(reader, &mut head).await?;
        if header.version() == stream::VERSION_1 {
            // A 0.1 stream is keyed by the data key itself, which only the daemon holds.
            let mut rest = std::io::Cursor::new(head).chain(reader);
            return self.copy_decrypt_in_daemon(context, &mut rest, writer).await;
        }
        let request = self.request(proto::OpenStreamKeyRequest {
            key_name: header.key_name.clone(),
            header: head[..used].to_vec(),
            context: context.to_vec(),
        });
        let stream_key = StreamKey::from_proto(self.crypto.clone().open_stream_key(request).await?.into_inner())?;
        let cipher = stream_key.cipher(context)?;
        let mut rest = std::io::Cursor::new(head.split_off(used)).chain(reader);
        if !header.is_committed() {
            return Ok(bulk::run(cipher, bulk::Direction::Open, self.bulk_threads, &mut rest, writer).await?.0);
        }
        // v3: the chunks, then the commitment, which the daemon checks (the stream key alone
        // cannot make one: a stream forged with it fails here, after its chunks).
        let mut held = bulk::Holdback::new(&mut rest);
        let (written, tags) = bulk::run(cipher, bulk::Direction::Open, self.bulk_threads, &mut held, writer).await?;
        let commitment = held.trailer().to_vec();
        if commitment.len() != stream::COMMITMENT {
            return Err(Error::InvalidInput("stream truncated: no commitment after the final chunk".into()));
        }
        let request = self.request(proto::VerifyStreamRequest {
            key_name: header.key_name.clone(),
            header: stream_key.encoded.clone(),
            context: context.to_vec(),
            tags_digest: tags.to_vec(),
            commitment,
        });
        self.crypto.clone().verify_stream(request).await?;
        Ok(written)
    }

    /// [`Client::copy_decrypt`] with the AES work done in the daemon (the `Decrypt` RPC), for
    /// either format. Returns the plaintext bytes written.
    ///
    /// # Errors
    /// As [`Client::copy_decrypt`].
    pub async fn copy_decrypt_in_daemon<R, W>(
        &self,
        context: &[u8],
        reader: &mut R,
        writer: &mut W,
    ) -> Result<u64, Error>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        let (tx, rx) = mpsc::channel(IN_FLIGHT);
        tx.try_send(proto::DecryptRequest { context: context.to_vec(), data: Bytes::new() })
            .map_err(|_| channel_closed())?;
        let mut crypto = self.stream_client();
        let call = async move {
            let responses = crypto.decrypt(ReceiverStream::new(rx)).await?.into_inner();
            write_responses(responses, |m: &proto::DecryptResponse| &m.data, writer).await
        };
        let pump = pump(reader, tx, |data| proto::DecryptRequest { data: data.into(), ..Default::default() });
        let ((), written) = tokio::try_join!(pump, call)?;
        Ok(written)
    }

    /// The encrypted form of `reader`'s content, as an [`AsyncRead`]: [`Client::copy_encrypt`]
    /// running on a task of the current tokio runtime.
    ///
    /// Its output may feed another stream of the same client (decrypting with one data key
    /// while re-encrypting under another): each stream has a connection of its own. (Not so for
    /// a client made [`from_channel`](Client::from_channel), whose streams share that channel:
    /// chain such streams through separate channels.)
    ///
    /// # Errors
    /// [`Error::Runtime`] when called outside a tokio runtime. Errors of the stream itself
    /// come from the reader's `poll_read` as an [`io::Error`] wrapping the [`Error`] (see
    /// [`CryptoReader`]).
    ///
    /// # Examples
    /// ```no_run
    /// use tokio::fs::File;
    ///
    /// # async fn demo(client: tpm_vault_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let plain = File::open("report.pdf").await?;
    /// let mut sealed = client.encrypt_reader("backups", b"", plain)?;
    /// let mut out = File::create("report.pdf.sealed").await?;
    /// tokio::io::copy(&mut sealed, &mut out).await?;
    /// # Ok(()) }
    /// ```
    pub fn encrypt_reader<R>(&self, key: &str, context: &[u8], reader: R) -> Result<CryptoReader, Error>
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let client = self.clone();
        let (key, context) = (key.to_owned(), context.to_vec());
        CryptoReader::spawn(reader, move |mut reader, mut pipe| async move {
            client.copy_encrypt(&key, &context, &mut reader, &mut pipe).await
        })
    }

    /// The decrypted form of `reader`'s content (a stream made by encryption), as an
    /// [`AsyncRead`]: [`Client::copy_decrypt`] running on a task of the current tokio runtime.
    ///
    /// Only authenticated plaintext is ever returned; a failing chunk ends the reader with an
    /// error of kind [`io::ErrorKind::InvalidData`] before any of its bytes.
    ///
    /// # Errors
    /// [`Error::Runtime`] when called outside a tokio runtime.
    ///
    /// # Examples
    /// ```no_run
    /// use tokio::io::AsyncReadExt;
    ///
    /// # async fn demo(client: tpm_vault_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let sealed = tokio::fs::File::open("config.json.sealed").await?;
    /// let mut plain = client.decrypt_reader(b"", sealed)?;
    /// let mut config = String::new();
    /// plain.read_to_string(&mut config).await?;
    /// # Ok(()) }
    /// ```
    pub fn decrypt_reader<R>(&self, context: &[u8], reader: R) -> Result<CryptoReader, Error>
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let client = self.clone();
        let context = context.to_vec();
        CryptoReader::spawn(reader, move |mut reader, mut pipe| async move {
            client.copy_decrypt(&context, &mut reader, &mut pipe).await
        })
    }

    /// The `CryptoService` client for one stream: on a connection of its own when this client
    /// can open one (it was connected to a socket, not made [`from_channel`](Client::from_channel)).
    ///
    /// Streams chained through the caller (one's output feeding another's input, as when
    /// re-encrypting under a new key) would otherwise share HTTP/2's connection-wide flow-control
    /// window, where the unread output of one stream stalls the input of the other, and so both.
    fn stream_client(&self) -> CryptoServiceClient<Channel> {
        match &self.dialer {
            Some(dialer) => CryptoServiceClient::new(dialer.channel()).max_decoding_message_size(MAX_RESPONSE),
            None => self.crypto.clone(),
        }
    }

    /// One `GetRandom` request for up to `want` bytes.
    async fn random_piece(&self, want: usize) -> Result<Vec<u8>, Error> {
        let length = want.min(MAX_RANDOM_REQUEST);
        // invariant: MAX_RANDOM_REQUEST fits in a u32.
        let length = u32::try_from(length).unwrap_or(u32::MAX);
        let request = self.request(proto::GetRandomRequest { length });
        let data = self.crypto.clone().get_random(request).await?.into_inner().data;
        if data.is_empty() || data.len() > want {
            return Err(Error::Status(tonic::Status::internal(format!(
                "the daemon returned {} random bytes for a request of {length}",
                data.len()
            ))));
        }
        Ok(Vec::from(data))
    }
}

/// The output of [`Client::encrypt_reader`] or [`Client::decrypt_reader`]: an [`AsyncRead`]
/// fed by a task that runs the gRPC stream.
///
/// End of file means the stream completed (for decryption: every chunk authenticated and the
/// stream not truncated). A failure is returned by `poll_read` as an [`io::Error`] whose
/// [`get_ref`](io::Error::get_ref) is the crate's [`Error`] (kind `InvalidData` for a rejected
/// stream, `NotFound`, `PermissionDenied`...); every later read fails too. Dropping the reader
/// cancels the stream.
#[derive(Debug)]
pub struct CryptoReader {
    /// Read side of the pipe the task writes the output into.
    pipe: DuplexStream,
    /// Where the stream is, to tell a complete stream from a failed one at end of pipe.
    state: ReaderState,
}

/// A [`CryptoReader`]'s stream.
#[derive(Debug)]
enum ReaderState {
    /// The task runs (or has ended and not been looked at yet).
    Running(JoinHandle<Result<u64, Error>>),
    /// The stream completed: end of file.
    Complete,
    /// The stream failed with an error of this kind; already reported once.
    Failed(io::ErrorKind),
}

impl CryptoReader {
    /// Runs `copy(reader, pipe_writer)` on a new task.
    fn spawn<R, F, Fut>(reader: R, copy: F) -> Result<CryptoReader, Error>
    where
        R: Send + 'static,
        F: FnOnce(R, DuplexStream) -> Fut + Send + 'static,
        Fut: Future<Output = Result<u64, Error>> + Send + 'static,
    {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| Error::Runtime(io::Error::other(e)))?;
        let (pipe, writer) = tokio::io::duplex(PIPE_SIZE);
        // The writer is dropped when `copy` returns, which ends the pipe; the result is then
        // in the join handle.
        let task = runtime.spawn(copy(reader, writer));
        Ok(CryptoReader { pipe, state: ReaderState::Running(task) })
    }
}

impl AsyncRead for CryptoReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let ReaderState::Failed(kind) = this.state {
            return Poll::Ready(Err(io::Error::new(kind, "the encrypted stream failed earlier")));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.pipe).poll_read(cx, buf))?;
        if buf.filled().len() > before || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // End of the pipe: the task has ended (or is ending); its result decides.
        let ReaderState::Running(task) = &mut this.state else {
            return Poll::Ready(Ok(()));
        };
        let result = ready!(Pin::new(task).poll(cx));
        let error = match result {
            Ok(Ok(_)) => {
                this.state = ReaderState::Complete;
                return Poll::Ready(Ok(()));
            }
            Ok(Err(e)) => into_io(e),
            Err(join) => io::Error::other(join),
        };
        this.state = ReaderState::Failed(error.kind());
        Poll::Ready(Err(error))
    }
}

impl Drop for CryptoReader {
    fn drop(&mut self) {
        if let ReaderState::Running(task) = &self.state {
            task.abort();
        }
    }
}

/// Sends everything `reader` yields as request messages of up to [`MESSAGE_SIZE`] bytes.
///
/// Returns `Ok` when the call went away first: the call's own result says why.
async fn pump<R, T>(reader: &mut R, tx: mpsc::Sender<T>, wrap: impl Fn(Vec<u8>) -> T) -> Result<(), Error>
where
    R: AsyncRead + Unpin + ?Sized,
{
    loop {
        // Read into the spare capacity: no zeroing, and the buffer never grows (`read_buf`
        // only reserves when the Vec is full, and the loop stops before that).
        let mut buf = Vec::with_capacity(MESSAGE_SIZE);
        let mut eof = false;
        while buf.len() < MESSAGE_SIZE {
            let n = reader.read_buf(&mut buf).await.map_err(Error::Read)?;
            if n == 0 {
                eof = true;
                break;
            }
        }
        if !buf.is_empty() && tx.send(wrap(buf)).await.is_err() {
            return Ok(());
        }
        if eof {
            return Ok(());
        }
    }
}

/// Writes the data of every response of a stream to `writer`, then flushes it; returns the
/// bytes written.
async fn write_responses<T, W>(
    mut responses: tonic::Streaming<T>,
    data: impl Fn(&T) -> &[u8],
    writer: &mut W,
) -> Result<u64, Error>
where
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut written = 0u64;
    while let Some(message) = responses.message().await? {
        let bytes = data(&message);
        writer.write_all(bytes).await.map_err(Error::Write)?;
        written += bytes.len() as u64;
    }
    writer.flush().await.map_err(Error::Write)?;
    Ok(written)
}

/// The error for a request channel that closed before the call started (cannot happen: the
/// receiver is still in scope).
fn channel_closed() -> Error {
    Error::Status(tonic::Status::internal("the request stream closed before the call started"))
}

/// An [`Error`] as an [`io::Error`] of a fitting kind, keeping it as the payload (or the
/// caller's own I/O error, for [`Error::Read`] and [`Error::Write`]).
fn into_io(error: Error) -> io::Error {
    let kind = match &error {
        Error::Read(e) | Error::Write(e) => e.kind(),
        other => match other.code() {
            Code::InvalidArgument | Code::OutOfRange => io::ErrorKind::InvalidData,
            Code::NotFound => io::ErrorKind::NotFound,
            Code::PermissionDenied | Code::Unauthenticated => io::ErrorKind::PermissionDenied,
            Code::Unavailable => io::ErrorKind::ConnectionRefused,
            Code::DeadlineExceeded | Code::Cancelled => io::ErrorKind::TimedOut,
            _ => io::ErrorKind::Other,
        },
    };
    io::Error::new(kind, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str) -> Vec<u8> {
        let mut h = stream::MAGIC.to_vec();
        h.push(stream::VERSION);
        h.push(name.len() as u8);
        h.extend_from_slice(name.as_bytes());
        h.extend_from_slice(&[7u8; 16 + 4 + 12 + stream::WRAPPED]);
        h
    }

    #[test]
    fn key_name_from_a_header() {
        let h = header("backups");
        assert_eq!(stream_key_name(&h).unwrap().as_deref(), Some("backups"));
        let mut longer = h.clone();
        longer.extend_from_slice(b"chunk data");
        assert_eq!(stream_key_name(&longer).unwrap().as_deref(), Some("backups"));
        for cut in 0..h.len() {
            assert_eq!(stream_key_name(&h[..cut]).unwrap(), None, "prefix of {cut} bytes");
        }
        assert!(h.len() <= MAX_STREAM_HEADER);
    }

    #[test]
    fn not_a_stream() {
        let err = stream_key_name(b"hello world, plain text").unwrap_err();
        assert_eq!(err.to_string(), "not a tpm-vault encrypted stream: bad magic");
        assert!(stream_key_name(b"TPX").is_err());
        let mut h = header("k");
        h[8] = 9;
        assert!(stream_key_name(&h).unwrap_err().to_string().contains("unsupported version 9"));
    }

    #[test]
    fn io_errors_keep_the_client_error() {
        let e = into_io(Error::Status(tonic::Status::invalid_argument("chunk 2 failed authentication")));
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let inner = e.get_ref().and_then(|e| e.downcast_ref::<Error>()).unwrap();
        assert_eq!(inner.code(), Code::InvalidArgument);
        let e = into_io(Error::Write(io::Error::from(io::ErrorKind::BrokenPipe)));
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn pump_splits_into_messages() {
        let data: Vec<u8> = (0..(2 * MESSAGE_SIZE + 5)).map(|i| i as u8).collect();
        let (tx, mut rx) = mpsc::channel(16);
        pump(&mut &data[..], tx, |d| d).await.unwrap();
        let mut sizes = Vec::new();
        let mut joined = Vec::new();
        while let Some(m) = rx.recv().await {
            sizes.push(m.len());
            joined.extend_from_slice(&m);
        }
        assert_eq!(sizes, [MESSAGE_SIZE, MESSAGE_SIZE, 5]);
        assert_eq!(joined, data);
    }

    #[tokio::test]
    async fn pump_sends_nothing_for_empty_input() {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
        pump(&mut &b""[..], tx, |d| d).await.unwrap();
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn pump_stops_quietly_when_the_call_is_gone() {
        let (tx, rx) = mpsc::channel::<Vec<u8>>(1);
        drop(rx);
        let data = vec![0u8; 3 * MESSAGE_SIZE];
        pump(&mut &data[..], tx, |d| d).await.unwrap();
    }
}
