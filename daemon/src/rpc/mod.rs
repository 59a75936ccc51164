//! The gRPC front end: one file per service family, plus `error_status.rs`, the single place where
//! errors become `tonic::Status`. Handlers parse proto input into `model` types, call the
//! [`Vault`], and never block (no TPM or file I/O on the async workers).

pub mod attest;
mod call;
pub mod crypto;
pub mod error_status;
pub mod info;
pub mod key;
pub mod seal;
pub mod sizes;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tpm_vault_proto::v1::attestation_service_server::AttestationServiceServer;
use tpm_vault_proto::v1::crypto_service_server::CryptoServiceServer;
use tpm_vault_proto::v1::key_service_server::KeyServiceServer;
use tpm_vault_proto::v1::seal_service_server::SealServiceServer;
use tpm_vault_proto::v1::status_service_server::StatusServiceServer;

use crate::auth::{limits, Access, Operation};
use crate::error::{Error, Invalid, PcrArg};
use crate::model::{KeyName, PcrBank, PcrSelection, PcrTarget};
use crate::observe::metrics::Metrics;
use crate::store::OwnerCheck;
use crate::vault::{Resource, Vault};

use self::call::Call;

/// Largest request or response message (a message to sign is at most 4 MiB).
pub const MAX_MESSAGE_SIZE: usize = 8 * 1024 * 1024;

/// What every handler needs.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The vault.
    pub vault: Vault,
    /// Per-RPC metrics.
    pub metrics: Arc<Metrics>,
    /// Access policy and audit.
    pub access: Arc<Access>,
    /// The measured-boot event log GetEventLog serves (config `event_log`), if any.
    pub event_log: Option<Arc<Path>>,
}

impl Ctx {
    /// A context over `vault` with the given metrics registry and access policy.
    pub fn new(vault: Vault, metrics: Arc<Metrics>, access: Arc<Access>) -> Self {
        Self { vault, metrics, access, event_log: None }
    }

    /// This context, serving the event log at `path` (none: GetEventLog answers NOT_FOUND).
    pub fn with_event_log(mut self, path: Option<&Path>) -> Self {
        self.event_log = path.map(Arc::from);
        self
    }

    /// The frame of a unary RPC: the request's `target` is parsed, the caller checked for `op`
    /// on it, `work` run, and the outcome measured and audited once ([`Call`]).
    async fn unary<Req, K, T, Fut>(
        &self,
        rpc: &'static str,
        req: Request<Req>,
        (op, kind): (Operation, Resource),
        target: impl FnOnce(&Req) -> Result<K, Error>,
        work: impl FnOnce(Req, K, Vault) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        K: Target,
        T: prost::Message,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut call = Call::start(self, rpc, op, &req);
        let r = req.into_inner();
        let (result, reservation) = limits::response_scope(async {
            let target = target(&r)?;
            let vault = call.authorize(target.key().map(|k| (k, kind))).await?;
            let response = work(r, target, vault).await?;
            limits::reserve_exactly(response.encoded_len()).await?;
            Ok(response)
        })
        .await;
        call.end_reserved(result, reservation)
    }

    /// [`Ctx::unary`] for an operation on the signing key `key_of` names in the request.
    async fn on_key<Req, T, Fut>(
        &self,
        rpc: &'static str,
        req: Request<Req>,
        op: Operation,
        key_of: fn(&Req) -> &str,
        work: impl FnOnce(Req, KeyName, Vault) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        T: prost::Message,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.on_named(rpc, req, (op, Resource::Key), key_of, work).await
    }

    /// [`Ctx::unary`] for an operation on the record of kind `kind` that `name_of` names.
    async fn on_named<Req, T, Fut>(
        &self,
        rpc: &'static str,
        req: Request<Req>,
        (op, kind): (Operation, Resource),
        name_of: fn(&Req) -> &str,
        work: impl FnOnce(Req, KeyName, Vault) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        T: prost::Message,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.unary(rpc, req, (op, kind), |r| Ok(KeyName::try_from(name_of(r))?), work).await
    }

    /// [`Ctx::on_named`] for a write that replaces or removes the record (deletes): `work` also
    /// gets the check the store repeats under its write lock ([`Call::recheck`]), so a policy
    /// reload or another writer landing after authorization cannot be overtaken.
    async fn on_named_write<Req, T, Fut>(
        &self,
        rpc: &'static str,
        req: Request<Req>,
        (op, kind): (Operation, Resource),
        name_of: fn(&Req) -> &str,
        work: impl FnOnce(Req, KeyName, OwnerCheck, Vault) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        T: prost::Message,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut call = Call::start(self, rpc, op, &req);
        let r = req.into_inner();
        let (result, reservation) = limits::response_scope(async {
            let name = KeyName::try_from(name_of(&r))?;
            let vault = call.authorize(Some((&name, kind))).await?;
            let check = call.recheck(op, &name);
            let response = work(r, name, check, vault).await?;
            limits::reserve_exactly(response.encoded_len()).await?;
            Ok(response)
        })
        .await;
        call.end_reserved(result, reservation)
    }

    /// [`Ctx::unary`] for an operation on no key (quotes, PCRs, random bytes, status).
    async fn on_vault<Req, T, Fut>(
        &self,
        rpc: &'static str,
        req: Request<Req>,
        op: Operation,
        work: impl FnOnce(Req, Vault) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        T: prost::Message,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.unary(rpc, req, (op, Resource::Key), |_| Ok(()), |r, (), vault| work(r, vault)).await
    }
}

/// What a unary RPC acts on, for the policy check: a named key, or nothing (`()`).
trait Target {
    fn key(&self) -> Option<&KeyName>;
}

impl Target for KeyName {
    fn key(&self) -> Option<&KeyName> {
        Some(self)
    }
}

impl Target for () {
    fn key(&self) -> Option<&KeyName> {
        None
    }
}

/// Parses a PCR binding: bank (default sha256), indices (default 9, each at most once),
/// optional values (one per index, in the order given).
pub(crate) fn pcr_binding(b: tpm_vault_proto::v1::PcrBinding) -> Result<PcrTarget, Error> {
    let bank: PcrBank = b.bank.parse()?;
    let indices = if b.pcrs.is_empty() { vec![PcrSelection::DEFAULT_INDEX] } else { b.pcrs.clone() };
    let selection = PcrSelection::new(bank, &indices)?;
    // A repeated index would have two values, of which the selection could keep only one.
    let mut sorted = indices.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Invalid::from(PcrArg::ListedTwice(w[0])).into());
    }
    if b.values.is_empty() {
        return Ok(PcrTarget { selection, values: None });
    }
    if b.values.len() != indices.len() {
        return Err(Invalid::from(PcrArg::ValueCount { values: b.values.len(), pcrs: indices.len() }).into());
    }
    if b.values.iter().any(|v| v.len() != bank.digest_len()) {
        return Err(Invalid::from(PcrArg::ValueLength { bank: bank.as_str(), len: bank.digest_len() }).into());
    }
    // Reorder the values to the selection's ascending order.
    let mut pairs: Vec<(u32, Vec<u8>)> = indices.into_iter().zip(b.values).collect();
    pairs.sort_by_key(|(i, _)| *i);
    Ok(PcrTarget { selection, values: Some(pairs.into_iter().map(|(_, v)| v).collect()) })
}

/// Every service of the API, plus gRPC health and reflection.
///
/// # Errors
/// If the reflection descriptors do not parse (a build problem).
pub fn routes(ctx: Ctx) -> Result<Routes, Error> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tpm_vault_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| Error::Internal(format!("reflection: {e}")))?;
    // Each service's message bounds, from the one table of them (`sizes`).
    macro_rules! bounded {
        ($server:ident, $rpc:expr) => {{
            let server = $server::new($rpc);
            let limits = sizes::service(service_name(&server));
            server
                .max_decoding_message_size(limits.max_request())
                .max_encoding_message_size(limits.max_response.unwrap_or(usize::MAX))
        }};
    }
    let keys = bounded!(KeyServiceServer, key::KeyRpc::new(ctx.clone()));
    let status = bounded!(StatusServiceServer, info::StatusRpc::new(ctx.clone()));
    let attestation = bounded!(AttestationServiceServer, attest::AttestRpc::new(ctx.clone()));
    let crypto = bounded!(CryptoServiceServer, crypto::CryptoRpc::new(ctx.clone()));
    let sealing = bounded!(SealServiceServer, seal::SealRpc::new(ctx.clone()));
    health::spawn_reporter(health_reporter, ctx.vault.clone());
    Ok(Routes::new(health)
        .add_service(reflection)
        .add_service(keys)
        .add_service(status)
        .add_service(sealing)
        .add_service(attestation)
        .add_service(crypto))
}

/// The gRPC name of `server`'s service (`tpmvault.v1.KeyService`).
fn service_name<S: tonic::server::NamedService>(_server: &S) -> &'static str {
    S::NAME
}

mod health {
    //! Keeps `grpc.health.v1` in step with the TPM: SERVING while the TPM is reachable.

    use std::time::Duration;

    use tonic_health::server::HealthReporter;
    use tonic_health::ServingStatus;

    use crate::tpm::TpmState;
    use crate::vault::Vault;

    pub fn spawn_reporter(reporter: HealthReporter, vault: Vault) {
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let state = vault.tpm().shared().state();
                if last != Some(state) {
                    let status =
                        if state == TpmState::Ready { ServingStatus::Serving } else { ServingStatus::NotServing };
                    reporter.set_service_status("", status).await;
                    reporter.set_service_status("tpmvault.v1.KeyService", status).await;
                    last = Some(state);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use tpm_vault_proto::v1::PcrBinding;

    use super::*;

    fn binding(pcrs: &[u32], values: &[u8]) -> PcrBinding {
        PcrBinding { bank: "sha256".into(), pcrs: pcrs.to_vec(), values: values.iter().map(|&v| vec![v; 32]).collect() }
    }

    /// A PCR listed twice is refused, with or without values (found by the `pcr_binding` fuzz
    /// target: `[9, 9]` with values A and B bound the object to A and dropped B silently).
    #[test]
    fn a_pcr_listed_twice_is_refused() {
        for b in [binding(&[9, 9], &[0xaa, 0xbb]), binding(&[9, 9], &[]), binding(&[16, 9, 16], &[1, 2, 3])] {
            let err = pcr_binding(b.clone()).unwrap_err().to_string();
            assert!(err.contains("is listed twice"), "{b:?}: {err}");
        }
        let t = pcr_binding(binding(&[16, 9], &[0x16, 0x09])).unwrap();
        assert_eq!(t.selection.pcrs, [9, 16]);
        assert_eq!(t.values, Some(vec![vec![0x09; 32], vec![0x16; 32]]), "values follow the selection's order");
        let t = pcr_binding(PcrBinding::default()).unwrap();
        assert_eq!((t.selection, t.values), (PcrSelection::default_in(PcrBank::Sha256), None));
    }
}
