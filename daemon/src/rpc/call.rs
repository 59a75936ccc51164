//! The call guard: every RPC's one accounting. A [`Call`] starts with the request, carries the
//! policy decisions made for it, and records the call's latency and outcome in the metrics and
//! its audit record in the audit log exactly once, with the gRPC code as the outcome: when a
//! unary handler returns, when a response stream ends, or, if neither happens because the
//! client went away, when the call is dropped (`Cancelled`).
//!
//! Audit records: a granted call writes the grant's record with the outcome (one record, also
//! for a call that needs two operations: a self-signed certificate's record names both rules);
//! a denied one the denial (written by [`Access::authorize`](crate::auth::Access::authorize));
//! a call with no policy decision (ListKeys, which filters its answer by the policy, or a
//! request refused as malformed before the check) writes a record with the decision `none` and
//! the outcome.
//!
//! TPM slots: a granted call that can reach the TPM (every operation but `public`, `random`
//! and `admin`) holds ONE of its client's slots ([`crate::auth::limits`]) from authorization
//! to its end, however many operations it needs; a streaming call gives it back once its
//! stream key is in hand ([`Call::release_slot`]), before the bulk data flows. With the slot
//! comes the client's key in the TPM queue: [`Call::authorize`] returns the vault bound to it
//! ([`Vault::for_client`]), the handler works through that vault, and every TPM job it queues
//! names the client, so the TPM queue serves the call's jobs in turn with other clients'
//! ([`crate::tpm::queue`]).

use std::time::Instant;

use tonic::{Code, Request, Response, Status};

use super::Ctx;
use crate::auth::limits::{InFlight, Reservation};
use crate::auth::{identity, Grant, Identity, Operation};
use crate::error::Error;
use crate::model::KeyName;
use crate::store::OwnerCheck;
use crate::tpm::ClientKey;
use crate::vault::{Resource, Vault};

/// One RPC in flight; see the module docs.
#[derive(Debug)]
pub(crate) struct Call {
    ctx: Ctx,
    rpc: &'static str,
    op: Operation,
    start: Instant,
    who: Option<Identity>,
    /// The record the call acts on, once known (for the audit record of a refused call).
    key: Option<String>,
    /// The call's grant, once authorized (a second operation the call needs is folded into
    /// it: one record, one TPM slot).
    grant: Option<Grant>,
    /// The client's key in the TPM queue, taken with its slot.
    client: Option<ClientKey>,
    /// A denial already wrote the call's record.
    denied: bool,
    /// The outcome is recorded.
    ended: bool,
}

impl Call {
    /// The call `rpc` of `req`, which needs `op`.
    pub(crate) fn start<R>(ctx: &Ctx, rpc: &'static str, op: Operation, req: &Request<R>) -> Self {
        Self {
            ctx: ctx.clone(),
            rpc,
            op,
            start: Instant::now(),
            who: identity(req),
            key: None,
            grant: None,
            client: None,
            denied: false,
            ended: false,
        }
    }

    /// Checks the access policy for the call's operation on the record `key` names (for
    /// owner-only rules, its owner is read from that kind's own records: a signing key, a
    /// sealed secret and a data key may share a name), and keeps the grant. Returns the vault
    /// the call works through: its TPM jobs queue as the caller's.
    ///
    /// # Errors
    /// [`Error::PermissionDenied`]; store errors reading the owner; the client's TPM slots
    /// being exhausted.
    pub(crate) async fn authorize(&mut self, key: Option<(&KeyName, Resource)>) -> Result<Vault, Error> {
        self.authorize_as(self.op, key).await
    }

    /// [`Call::authorize`] for another operation the call also needs.
    ///
    /// # Errors
    /// As [`Call::authorize`].
    pub(crate) async fn authorize_as(
        &mut self,
        op: Operation,
        key: Option<(&KeyName, Resource)>,
    ) -> Result<Vault, Error> {
        self.key = key.map(|(k, _)| k.to_string());
        let owner = match key {
            Some((k, kind)) if self.ctx.access.current().has_owner_rules() => self.ctx.vault.owner(k, kind).await?,
            _ => None,
        };
        let grant = match self.ctx.access.authorize(self.who.clone(), op, key.map(|(k, _)| k), owner.as_ref()) {
            Ok(grant) => grant,
            Err(e) => {
                // The denial's record is the call's one record, also after a first grant.
                self.grant = None;
                self.denied = true;
                return Err(e);
            }
        };
        let grant = match self.grant.take() {
            // A second operation of the same call: one record naming both rules, one slot.
            Some(mut first) => {
                if first.rule != grant.rule {
                    first.rule = format!("{} ({}), {} ({})", first.rule, first.op.as_str(), grant.rule, op.as_str());
                }
                first.op = self.op;
                first
            }
            None => grant,
        };
        let grant = self.grant.insert(grant);
        // The call's response bytes count against the client's budget.
        crate::auth::limits::set_budget(self.ctx.access.response_budget(&grant.who)?);
        // Every operation that can reach the TPM holds one of the client's TPM slots for the
        // call, the others one of its slots for calls that need no TPM; either way the call's
        // TPM jobs queue as that client's.
        let client = match (grant.slot.is_some(), self.client) {
            (true, Some(client)) => client,
            _ => {
                let client = if reaches_tpm(op) {
                    self.ctx.access.take_slot(grant).await?
                } else {
                    self.ctx.access.take_call_slot(grant).await?
                };
                *self.client.insert(client)
            }
        };
        Ok(self.ctx.vault.for_client(client))
    }

    /// Gives the call's TPM slot back before it ends (a stream, once its stream key is in hand:
    /// the bulk data needs no TPM).
    pub(crate) fn release_slot(&mut self) {
        if let Some(grant) = &mut self.grant {
            grant.slot = None;
        }
    }

    /// The check a write of the record `key` repeats under the store's write lock: the
    /// policy decision for `op`, with the policy in force then and the owner of the record on
    /// disk then (a policy reload or another writer may have landed since [`Call::authorize`]).
    pub(crate) fn recheck(&self, op: Operation, key: &KeyName) -> OwnerCheck {
        let access = self.ctx.access.clone();
        let who = self.who.clone();
        let key = key.clone();
        OwnerCheck::new(move |owner| match &who {
            Some(who) => access.allows(who, op, &key, owner),
            None => false,
        })
    }

    /// Ends a unary call: records its outcome and turns the result into the response.
    ///
    /// # Errors
    /// The call's error as a status ([`super::status`]).
    pub(crate) fn end<T>(mut self, result: Result<T, Error>) -> Result<Response<T>, Status> {
        match result {
            Ok(v) => {
                self.record(None);
                Ok(Response::new(v))
            }
            Err(e) => {
                let status = Status::from(&e);
                tracing::debug!(rpc = self.rpc, error = %e, "request failed");
                self.record(Some(status.code()));
                Err(status)
            }
        }
    }

    /// [`Call::end`] for a unary call whose response bytes were reserved (`reservation`): the
    /// response carries them ([`InFlight`]) until the transport sent it.
    ///
    /// # Errors
    /// As [`Call::end`].
    pub(crate) fn end_reserved<T>(
        self,
        result: Result<T, Error>,
        reservation: Reservation,
    ) -> Result<Response<T>, Status> {
        let mut response = self.end(result)?;
        if reservation.held() > 0 {
            response.extensions_mut().insert(InFlight::new(reservation));
        }
        Ok(response)
    }

    /// Records the outcome (`None` = OK) once; later calls do nothing. For streams, whose
    /// outcome is known when the response stream ends.
    pub(crate) fn record(&mut self, code: Option<Code>) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        // The gRPC code's name, as `tonic::Code` spells it: the audit outcome and the metrics'
        // `code` label are the same word.
        let outcome = code.map_or_else(|| "ok".to_owned(), |c| format!("{c:?}"));
        self.ctx.metrics.observe_outcome(self.rpc, self.start.elapsed(), code.is_some().then_some(outcome.as_str()));
        match &mut self.grant {
            Some(grant) => {
                self.ctx.access.finish(grant, &outcome);
                grant.slot = None;
            }
            None if !self.denied => {
                self.ctx.access.undecided(self.who.as_ref(), self.op, self.key.as_deref(), &outcome)
            }
            None => {}
        }
    }
}

/// Whether `op` can reach the TPM (and so takes a TPM slot): all but reading public keys and
/// metadata, random bytes (the in-core DRBG) and status.
fn reaches_tpm(op: Operation) -> bool {
    !matches!(op, Operation::Public | Operation::Random | Operation::Admin)
}

impl Drop for Call {
    fn drop(&mut self) {
        self.record(Some(Code::Cancelled));
    }
}
