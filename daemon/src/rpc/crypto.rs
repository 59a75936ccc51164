//! `tpmvault.v1.CryptoService`: data keys, streaming AES-256-GCM and random bytes.
//!
//! A stream's response body (`CryptoStream`) does the work itself as the transport polls it:
//! it reads a request message, encrypts or decrypts it (64 KiB chunks, each copied once into
//! the response buffer and sealed or opened in place there) and yields the output. No task or
//! channel sits in between, so memory stays bounded for any stream length (one request and one
//! response message, plus the HTTP/2 windows), and a slow reader slows the writer instead of
//! buffering.

use std::pin::Pin;
use std::task::{Context, Poll};

use prost::bytes::Bytes;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::crypto_service_server::CryptoService;

use super::{pcr_binding, Call, Ctx};
use crate::auth::{owner_of, Operation};
use crate::crypto::stream::{self, Decryptor, Encryptor, Header, MAX_HEADER};
use crate::error::{Error, Invalid, StreamArg};
use crate::model::KeyName;
use crate::vault::Resource;

/// A response is sent once this much output is buffered. The client library's 256 KiB
/// request messages make one response each (four chunks and their tags).
const FLUSH_AT: usize = 64 * 1024;

/// Most random bytes one `GetRandom` call returns (1 MiB): a client wanting more asks several
/// times (the client library and `tpm-vault random N` do), so no single answer is large.
pub const MAX_RANDOM: usize = 1024 * 1024;

/// A stream of responses.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The CryptoService implementation.
#[derive(Debug, Clone)]
pub struct CryptoRpc {
    ctx: Ctx,
}

impl CryptoRpc {
    /// A service over `ctx`.
    pub fn new(ctx: Ctx) -> Self {
        Self { ctx }
    }
}

/// The stream transform of a call: [`Encryptor`] or [`Decryptor`].
trait Transform: Send + Unpin + 'static {
    /// Adds input, appends output.
    fn update(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), Error>;
    /// Ends the input, appends the last output.
    fn finish(self, out: &mut Vec<u8>) -> Result<(), Error>;
}

impl Transform for Encryptor {
    fn update(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        Ok(Encryptor::update(self, data, out)?)
    }

    fn finish(self, out: &mut Vec<u8>) -> Result<(), Error> {
        Ok(Encryptor::finish(self, out)?)
    }
}

impl Transform for Decryptor {
    fn update(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        Ok(Decryptor::update(self, data, out)?)
    }

    fn finish(self, out: &mut Vec<u8>) -> Result<(), Error> {
        Ok(Decryptor::finish(self, out)?)
    }
}

/// The response body of an `Encrypt` or `Decrypt` call (see the module docs).
struct CryptoStream<Req, Resp, X> {
    inbound: Streaming<Req>,
    /// The request message's data.
    data_of: fn(Req) -> Bytes,
    /// A response message.
    wrap: fn(Vec<u8>) -> Resp,
    /// `None` once the input ended or failed.
    transform: Option<X>,
    /// Output not sent yet.
    out: Vec<u8>,
    /// Whether output made before a failure is still sent (decryption: the authenticated
    /// chunks before a failing one).
    flush_on_error: bool,
    /// What ends the stream once `out` is sent: `Ok` (the last response, sent even if empty)
    /// or the error.
    last: Option<Result<(), Error>>,
    /// The call's accounting: recorded when the stream ends, or dropped (`Cancelled`) with it.
    call: Call,
}

impl<Req, Resp, X: Transform> CryptoStream<Req, Resp, X> {
    /// A stream that first processes `first` (data that came with the call's first messages).
    fn new(
        inbound: Streaming<Req>,
        data_of: fn(Req) -> Bytes,
        wrap: fn(Vec<u8>) -> Resp,
        mut transform: X,
        first: &[u8],
        flush_on_error: bool,
        call: Call,
    ) -> Self {
        let mut out = Vec::new();
        let (transform, last) = match transform.update(first, &mut out) {
            Ok(()) => (Some(transform), None),
            Err(e) => (None, Some(Err(e))),
        };
        Self { inbound, data_of, wrap, transform, out, flush_on_error, last, call }
    }

    /// Takes the pending output as a response.
    fn take_out(&mut self) -> Resp {
        (self.wrap)(std::mem::take(&mut self.out))
    }

    /// Records the outcome (once; the call ignores later ones).
    fn record(&mut self, status: Option<&Status>) {
        self.call.record(status.map(Status::code));
    }
}

impl<Req, Resp, X> Stream for CryptoStream<Req, Resp, X>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    X: Transform,
{
    type Item = Result<Resp, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(last) = this.last.take() {
                // The input ended or failed: `transform` is gone, so after this the stream ends.
                return Poll::Ready(Some(match last {
                    Ok(()) => {
                        this.record(None);
                        Ok(this.take_out())
                    }
                    Err(e) if this.flush_on_error && !this.out.is_empty() => {
                        this.last = Some(Err(e));
                        Ok(this.take_out())
                    }
                    Err(e) => {
                        let status = Status::from(&e);
                        this.record(Some(&status));
                        Err(status)
                    }
                }));
            }
            let Some(transform) = this.transform.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(&mut this.inbound).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(message))) => {
                    let data = (this.data_of)(message);
                    if let Err(e) = transform.update(&data, &mut this.out) {
                        this.transform = None;
                        this.last = Some(Err(e));
                        continue;
                    }
                    if this.out.len() >= FLUSH_AT {
                        return Poll::Ready(Some(Ok(this.take_out())));
                    }
                }
                Poll::Ready(Some(Err(s))) => {
                    this.transform = None;
                    this.last = Some(Err(Invalid::from(StreamArg::RequestStream(s.message().to_owned())).into()));
                }
                Poll::Ready(None) => {
                    let result = this.transform.take().map_or(Ok(()), |t| t.finish(&mut this.out));
                    this.last = Some(result);
                }
            }
        }
    }
}

#[tonic::async_trait]
impl CryptoService for CryptoRpc {
    type EncryptStream = ResponseStream<pb::EncryptResponse>;
    type DecryptStream = ResponseStream<pb::DecryptResponse>;

    async fn create_data_key(&self, req: Request<pb::CreateDataKeyRequest>) -> Result<Response<pb::DataKey>, Status> {
        let owner = owner_of(&req);
        self.ctx
            .on_named(
                "CreateDataKey",
                req,
                (Operation::Create, Resource::DataKey),
                |r| &r.name,
                |r, name, vault| async move {
                    let pcr = r.pcr_binding.map(pcr_binding).transpose()?;
                    let key_id = vault.create_data_key(name.clone(), owner?, pcr).await?;
                    Ok(pb::DataKey { name: name.to_string(), key_id })
                },
            )
            .await
    }

    async fn delete_data_key(
        &self,
        req: Request<pb::DeleteDataKeyRequest>,
    ) -> Result<Response<pb::DeleteDataKeyResponse>, Status> {
        let kind = (Operation::Delete, Resource::DataKey);
        self.ctx
            .on_named_write(
                "DeleteDataKey",
                req,
                kind,
                |r| &r.name,
                |_, name, check, vault| async move {
                    vault.delete_data_key(&name, check).await.map(|()| pb::DeleteDataKeyResponse {})
                },
            )
            .await
    }

    async fn encrypt(
        &self,
        req: Request<Streaming<pb::EncryptRequest>>,
    ) -> Result<Response<Self::EncryptStream>, Status> {
        let mut call = Call::start(&self.ctx, "Encrypt", Operation::Encrypt, &req);
        let mut inbound = req.into_inner();
        let set_up = async {
            let first =
                next_message(&mut inbound).await?.ok_or_else(|| Error::from(Invalid::from(StreamArg::Empty)))?;
            let name = KeyName::try_from(first.key_name.as_str())?;
            let vault = call.authorize(Some((&name, Resource::DataKey))).await?;
            let (header, key) = vault.new_stream(&name, &first.context).await?;
            let mac_key = vault.stream_mac_key(&header, &first.context).await?;
            let encryptor = Encryptor::new(&key, &header, &first.context)?.with_mac_key(mac_key);
            Ok::<_, Error>((first, encryptor))
        };
        let (first, encryptor) = match set_up.await {
            Ok(v) => v,
            Err(e) => return call.end(Err(e)),
        };
        // The stream key is in hand: the bulk data needs no TPM slot.
        call.release_slot();
        let stream = CryptoStream::new(
            inbound,
            |m: pb::EncryptRequest| m.data,
            |data| pb::EncryptResponse { data: data.into() },
            encryptor,
            &first.data,
            false,
            call,
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn decrypt(
        &self,
        req: Request<Streaming<pb::DecryptRequest>>,
    ) -> Result<Response<Self::DecryptStream>, Status> {
        let mut call = Call::start(&self.ctx, "Decrypt", Operation::Decrypt, &req);
        let mut inbound = req.into_inner();
        let set_up = async {
            // Read until the header parses; it names the data key.
            let mut context = None;
            let mut buf = Vec::new();
            let (header, used) = loop {
                let m = next_message(&mut inbound)
                    .await?
                    .ok_or_else(|| Error::from(Invalid::from(StreamArg::Truncated)))?;
                if context.is_none() {
                    context = Some(m.context);
                }
                buf.extend_from_slice(&m.data);
                if let Some(h) = Header::parse(&buf)? {
                    break h;
                }
                if buf.len() > MAX_HEADER + 1024 {
                    return Err(Invalid::from(StreamArg::HeaderTooLong).into());
                }
            };
            let name = KeyName::try_from(header.key_name.as_str())?;
            let vault = call.authorize(Some((&name, Resource::DataKey))).await?;
            let context = context.unwrap_or_default();
            let key = vault.open_stream(&header, &context).await?;
            let mut decryptor = Decryptor::new(&key, &header, &context)?;
            if header.is_committed() {
                decryptor = decryptor.with_mac_key(vault.stream_mac_key(&header, &context).await?);
            }
            buf.drain(..used);
            Ok::<_, Error>((decryptor, buf))
        };
        let (decryptor, rest) = match set_up.await {
            Ok(v) => v,
            Err(e) => return call.end(Err(e)),
        };
        // The stream key is in hand: the bulk data needs no TPM slot.
        call.release_slot();
        // Authenticated chunks before a failure are still delivered, nothing after.
        let stream = CryptoStream::new(
            inbound,
            |m: pb::DecryptRequest| m.data,
            |data| pb::DecryptResponse { data: data.into() },
            decryptor,
            &rest,
            true,
            call,
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn create_stream_key(
        &self,
        req: Request<pb::CreateStreamKeyRequest>,
    ) -> Result<Response<pb::StreamKey>, Status> {
        self.ctx
            .on_named(
                "CreateStreamKey",
                req,
                (Operation::Encrypt, Resource::DataKey),
                |r| &r.key_name,
                |r, name, vault| async move {
                    let (header, key) = vault.new_stream(&name, &r.context).await?;
                    Ok(pb::StreamKey { header: header.encode(), key: key.to_vec() })
                },
            )
            .await
    }

    async fn open_stream_key(&self, req: Request<pb::OpenStreamKeyRequest>) -> Result<Response<pb::StreamKey>, Status> {
        self.ctx
            .on_named(
                "OpenStreamKey",
                req,
                (Operation::Decrypt, Resource::DataKey),
                |r| &r.key_name,
                |r, name, vault| async move {
                    let header = match Header::parse(&r.header)? {
                        Some((h, used)) if used == r.header.len() => h,
                        _ => return Err(Invalid::from(StreamArg::NotOneHeader).into()),
                    };
                    if header.key_name != name.as_str() {
                        return Err(Invalid::from(StreamArg::OtherKey {
                            named: header.key_name.clone(),
                            name: name.clone(),
                        })
                        .into());
                    }
                    if header.version() == tpm_vault_proto::stream::VERSION_1 {
                        return Err(Invalid::from(StreamArg::NoStreamKey).into());
                    }
                    let key = vault.open_stream(&header, &r.context).await?;
                    Ok(pb::StreamKey { header: r.header, key: key.to_vec() })
                },
            )
            .await
    }

    async fn commit_stream(
        &self,
        req: Request<pb::CommitStreamRequest>,
    ) -> Result<Response<pb::StreamCommitment>, Status> {
        self.ctx
            .on_named(
                "CommitStream",
                req,
                (Operation::Encrypt, Resource::DataKey),
                |r| &r.key_name,
                |r, name, vault| async move {
                    let (header, tags) = committed_header(&r.header, &name, &r.tags_digest)?;
                    let mac_key = vault.stream_mac_key(&header, &r.context).await?;
                    Ok(pb::StreamCommitment { commitment: stream::commit(&mac_key, &tags).to_vec() })
                },
            )
            .await
    }

    async fn verify_stream(
        &self,
        req: Request<pb::VerifyStreamRequest>,
    ) -> Result<Response<pb::VerifyStreamResponse>, Status> {
        self.ctx
            .on_named(
                "VerifyStream",
                req,
                (Operation::Decrypt, Resource::DataKey),
                |r| &r.key_name,
                |r, name, vault| async move {
                    let (header, tags) = committed_header(&r.header, &name, &r.tags_digest)?;
                    let mac_key = vault.stream_mac_key(&header, &r.context).await?;
                    stream::verify(&mac_key, &tags, &r.commitment)?;
                    Ok(pb::VerifyStreamResponse {})
                },
            )
            .await
    }

    async fn get_random(&self, req: Request<pb::GetRandomRequest>) -> Result<Response<pb::GetRandomResponse>, Status> {
        self.ctx
            .on_vault("GetRandom", req, Operation::Random, |r, vault| async move {
                let n = r.length as usize;
                if n == 0 || n > MAX_RANDOM {
                    return Err(Error::invalid(format!(
                        "GetRandom returns 1 to {MAX_RANDOM} bytes per call ({n} asked for): ask several times for more"
                    )));
                }
                // The response's bytes count against the client's budget before they exist.
                crate::auth::limits::reserve(n + 64).await?;
                let mut data = vec![0u8; n];
                vault.random(&mut data)?;
                Ok(pb::GetRandomResponse { data: data.into() })
            })
            .await
    }
}

/// The v3 header of a CommitStream or VerifyStream request, which must be one whole header
/// naming data key `name`, and the tag digest (32 bytes).
fn committed_header(bytes: &[u8], name: &KeyName, digest: &[u8]) -> Result<(Header, [u8; 32]), Error> {
    let header = match Header::parse(bytes)? {
        Some((h, used)) if used == bytes.len() => h,
        _ => return Err(Invalid::from(StreamArg::NotOneHeader).into()),
    };
    if header.key_name != name.as_str() {
        return Err(Invalid::from(StreamArg::OtherKey { named: header.key_name.clone(), name: name.clone() }).into());
    }
    if !header.is_committed() {
        return Err(Invalid::from(StreamArg::NoCommitment(header.version())).into());
    }
    let tags = <[u8; 32]>::try_from(digest).map_err(|_| Invalid::from(StreamArg::TagDigest))?;
    Ok((header, tags))
}

/// The next message of a request stream; a broken stream is the caller's bad input.
async fn next_message<T>(inbound: &mut Streaming<T>) -> Result<Option<T>, Error> {
    inbound.message().await.map_err(|s| Invalid::from(StreamArg::RequestStream(s.message().to_owned())).into())
}
