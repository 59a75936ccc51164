//! `tpmvault.v1.CryptoService`: data keys, streaming AES-256-GCM and random bytes.
//!
//! Streams run as a task per call that reads the request stream, encrypts or decrypts one
//! 64 KiB chunk at a time, and sends results through a small bounded channel: memory stays
//! bounded for any stream length, and a slow reader slows the writer instead of buffering.

use std::pin::Pin;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::crypto_service_server::CryptoService;

use super::{observe, pcr_binding, Ctx};
use crate::auth::{identity, Grant, Operation, Peer};
use crate::crypto::drbg::MAX_REQUEST;
use crate::crypto::stream::{Header, CHUNK};
use crate::error::Error;
use crate::model::KeyName;

/// Responses are flushed once this much output is buffered.
const FLUSH_AT: usize = CHUNK;
/// Responses in flight per stream.
const CHANNEL: usize = 4;

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

/// Ends a stream call: metrics, audit, and the error (if any) to the client.
async fn end_stream<T>(
    ctx: &Ctx,
    rpc: &'static str,
    start: Instant,
    grant: &Grant,
    tx: &mpsc::Sender<Result<T, Status>>,
    result: Result<(), Error>,
) {
    ctx.metrics.observe(rpc, start.elapsed(), result.is_ok());
    match result {
        Ok(()) => ctx.access.finish(grant, "ok"),
        Err(e) => {
            let status = Status::from(&e);
            ctx.access.finish(grant, &format!("{:?}", status.code()));
            let _ = tx.send(Err(status)).await;
        }
    }
}

#[tonic::async_trait]
impl CryptoService for CryptoRpc {
    type EncryptStream = ResponseStream<pb::EncryptResponse>;
    type DecryptStream = ResponseStream<pb::DecryptResponse>;

    async fn create_data_key(&self, req: Request<pb::CreateDataKeyRequest>) -> Result<Response<pb::DataKey>, Status> {
        let start = Instant::now();
        let uid = Peer::of(&req).map_or(0, |p| p.uid);
        let who = identity(&req);
        let r = req.into_inner();
        let mut grant = None;
        let result = async {
            let name = KeyName::try_from(r.name.as_str())?;
            grant = Some(self.ctx.authorize(who, Operation::Create, Some(&name)).await?);
            let pcr = r.pcr_binding.map(pcr_binding).transpose()?;
            let key_id = self.ctx.vault.create_data_key(name.clone(), uid, pcr).await?;
            Ok(pb::DataKey { name: name.to_string(), key_id })
        }
        .await;
        observe(&self.ctx, "CreateDataKey", start, grant, result)
    }

    async fn delete_data_key(
        &self,
        req: Request<pb::DeleteDataKeyRequest>,
    ) -> Result<Response<pb::DeleteDataKeyResponse>, Status> {
        let start = Instant::now();
        let who = identity(&req);
        let r = req.into_inner();
        let mut grant = None;
        let result = async {
            let name = KeyName::try_from(r.name.as_str())?;
            grant = Some(self.ctx.authorize(who, Operation::Delete, Some(&name)).await?);
            self.ctx.vault.delete_data_key(&name).await
        }
        .await;
        observe(&self.ctx, "DeleteDataKey", start, grant, result.map(|()| pb::DeleteDataKeyResponse {}))
    }

    async fn encrypt(
        &self,
        req: Request<Streaming<pb::EncryptRequest>>,
    ) -> Result<Response<Self::EncryptStream>, Status> {
        let start = Instant::now();
        let who = identity(&req);
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty stream: the first message must name the data key"))?;
        let name = KeyName::try_from(first.key_name.as_str()).map_err(Status::from)?;
        let grant = self.ctx.authorize(who, Operation::Encrypt, Some(&name)).await.map_err(Status::from)?;
        let key = match self.ctx.vault.data_key(&name).await {
            Ok(k) => k,
            Err(e) => {
                self.ctx.access.finish(&grant, "failed");
                return Err(Status::from(&e));
            }
        };
        let mut encryptor = key.encryptor(&first.context).map_err(Status::from)?;
        let (tx, rx) = mpsc::channel(CHANNEL);
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let result = async {
                let mut out = Vec::with_capacity(FLUSH_AT + CHUNK);
                let mut pending = Some(first.data);
                loop {
                    let data = match pending.take() {
                        Some(d) => d,
                        None => match inbound.message().await {
                            Ok(Some(m)) => m.data,
                            Ok(None) => break,
                            Err(s) => {
                                return Err(Error::InvalidArgument(format!("request stream failed: {}", s.message())))
                            }
                        },
                    };
                    encryptor.update(&data, &mut out)?;
                    if out.len() >= FLUSH_AT {
                        let data = std::mem::replace(&mut out, Vec::with_capacity(FLUSH_AT + CHUNK));
                        if tx.send(Ok(pb::EncryptResponse { data })).await.is_err() {
                            return Err(Error::InvalidArgument("client went away".into()));
                        }
                    }
                }
                encryptor.finish(&mut out)?;
                let _ = tx.send(Ok(pb::EncryptResponse { data: out })).await;
                Ok(())
            }
            .await;
            end_stream(&ctx, "Encrypt", start, &grant, &tx, result).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn decrypt(
        &self,
        req: Request<Streaming<pb::DecryptRequest>>,
    ) -> Result<Response<Self::DecryptStream>, Status> {
        let start = Instant::now();
        let who = identity(&req);
        let mut inbound = req.into_inner();
        // Read until the header parses; it names the data key.
        let mut context = None;
        let mut buf = Vec::new();
        let (header, used) = loop {
            let m = inbound.message().await?.ok_or_else(|| {
                Status::invalid_argument("stream truncated: it ended before the tpm-vault stream header")
            })?;
            if context.is_none() {
                context = Some(m.context);
            }
            buf.extend_from_slice(&m.data);
            if let Some(h) = Header::parse(&buf).map_err(Status::from)? {
                break h;
            }
            if buf.len() > 1024 {
                return Err(Status::invalid_argument("not a tpm-vault encrypted stream: header too long"));
            }
        };
        let name = KeyName::try_from(header.key_name.as_str()).map_err(Status::from)?;
        let grant = self.ctx.authorize(who, Operation::Decrypt, Some(&name)).await.map_err(Status::from)?;
        let context = context.unwrap_or_default();
        let decryptor = match self.ctx.vault.data_key(&name).await.and_then(|k| k.decryptor(&header, &context)) {
            Ok(d) => d,
            Err(e) => {
                self.ctx.access.finish(&grant, "failed");
                return Err(Status::from(&e));
            }
        };
        let (tx, rx) = mpsc::channel(CHANNEL);
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let mut decryptor = decryptor;
            let result = async {
                let mut out = Vec::with_capacity(FLUSH_AT + CHUNK);
                let mut pending = Some(buf.split_off(used));
                loop {
                    let data = match pending.take() {
                        Some(d) => d,
                        None => match inbound.message().await {
                            Ok(Some(m)) => m.data,
                            Ok(None) => break,
                            Err(s) => {
                                return Err(Error::InvalidArgument(format!("request stream failed: {}", s.message())))
                            }
                        },
                    };
                    let res = decryptor.update(&data, &mut out);
                    // Authenticated chunks before a failure are still delivered, nothing after.
                    if !out.is_empty() && (out.len() >= FLUSH_AT || res.is_err()) {
                        let data = std::mem::replace(&mut out, Vec::with_capacity(FLUSH_AT + CHUNK));
                        if tx.send(Ok(pb::DecryptResponse { data })).await.is_err() {
                            return Err(Error::InvalidArgument("client went away".into()));
                        }
                    }
                    res?;
                }
                decryptor.finish(&mut out)?;
                let _ = tx.send(Ok(pb::DecryptResponse { data: out })).await;
                Ok(())
            }
            .await;
            end_stream(&ctx, "Decrypt", start, &grant, &tx, result).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_random(&self, req: Request<pb::GetRandomRequest>) -> Result<Response<pb::GetRandomResponse>, Status> {
        let start = Instant::now();
        let who = identity(&req);
        let r = req.into_inner();
        let mut grant = None;
        let result = async {
            grant = Some(self.ctx.authorize(who, Operation::Random, None).await?);
            let n = r.length as usize;
            if n == 0 || n > MAX_REQUEST {
                return Err(Error::InvalidArgument(format!("length must be 1 to {MAX_REQUEST}")));
            }
            let mut data = vec![0u8; n];
            self.ctx.vault.random(&mut data)?;
            Ok(pb::GetRandomResponse { data })
        }
        .await;
        observe(&self.ctx, "GetRandom", start, grant, result)
    }
}
