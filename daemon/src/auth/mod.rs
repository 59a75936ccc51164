//! Who is calling and what they may do: client identity from the transport (SO_PEERCRED on the
//! Unix socket, the client certificate on the TLS listener), the access policy (deny by
//! default, reloaded atomically), and the audit trail (one event per decision on the `audit`
//! tracing target, optionally also as JSON lines in a file). Handlers call
//! [`Access::authorize`] before doing anything.

pub mod audit;
pub mod denied;
pub mod limits;
pub mod peer;
pub mod policy;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

pub use denied::Denied;
pub use peer::{identity, peer_groups, GroupsSource, Identity, Peer, UnixConnectInfo, UnixIdentity};
pub use policy::{Decision, Operation, Policy, PolicyError};

use crate::error::Error;
use crate::model::{KeyName, Owner};

/// The access-control state shared by every handler.
#[derive(Debug)]
pub struct Access {
    /// The policy directory, and whether it was configured (else the default, which may be
    /// missing: then the built-in policy is in force).
    dir: Option<(PathBuf, bool)>,
    policy: RwLock<Arc<Policy>>,
    audit: audit::AuditLog,
    limits: limits::ClientLimits,
    /// Requests the policy denied, by operation in the order of [`Operation::ALL`] (the
    /// `tpm_vault_access_denied_total` counter: a spike is an attack or a broken deployment).
    denied: [AtomicU64; Operation::ALL.len()],
}

/// A granted request, carried to the audit event once the operation finished.
#[derive(Debug, Clone)]
pub struct Grant {
    pub who: Identity,
    pub op: Operation,
    /// On which key, if any.
    pub key: Option<String>,
    /// The rule that allowed it.
    pub rule: String,
    /// The client's TPM slot while the request runs (see [`limits`]).
    pub slot: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
}

impl Access {
    /// Loads every policy file in `dir` ([`Policy::load`]: the built-in default policy when
    /// `dir` is the default directory, not `configured`, and does not exist).
    ///
    /// # Errors
    /// [`PolicyError`] naming the file, line and reason.
    pub fn load(dir: &Path, configured: bool, audit: audit::AuditLog) -> Result<Self, PolicyError> {
        let policy = Policy::load(dir, configured)?;
        if policy.is_builtin() {
            tracing::warn!(
                dir = %dir.display(),
                "no policy directory: the built-in default policy is in force (root and group tpm-vault-admin may do everything)"
            );
        } else if policy.is_empty() {
            tracing::warn!(dir = %dir.display(), "no access rules: every request will be denied");
        }
        Ok(Self {
            dir: Some((dir.to_owned(), configured)),
            policy: RwLock::new(Arc::new(policy)),
            audit,
            limits: Default::default(),
            denied: Default::default(),
        })
    }

    /// A fixed policy (tests, embedding).
    pub fn with_policy(policy: Policy, audit: audit::AuditLog) -> Self {
        Self {
            dir: None,
            policy: RwLock::new(Arc::new(policy)),
            audit,
            limits: Default::default(),
            denied: Default::default(),
        }
    }

    /// Sets the per-client limit of TPM requests in flight.
    pub fn with_client_limits(mut self, limits: limits::ClientLimits) -> Self {
        self.limits = limits;
        self
    }

    /// These limits with the per-client quota of key creations (see [`limits`]).
    pub fn with_keygen_limit(mut self, keygen: limits::KeygenLimit) -> Self {
        self.limits = std::mem::take(&mut self.limits).with_keygen(keygen);
        self
    }

    /// Takes `who`'s key-creation slot and one creation from its quota (see
    /// [`limits::ClientLimits::acquire_keygen`]): hold it until the creation ended.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED when the quota is spent or the client's previous creation still runs.
    pub async fn take_keygen_slot(&self, who: &Identity) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
        self.limits.acquire_keygen(who).await
    }

    /// Takes a TPM slot for the granted client (fairness between clients) and returns the
    /// client's key in the TPM queue ([`crate::tpm::queue`]).
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED after waiting too long for a slot.
    pub async fn take_slot(&self, grant: &mut Grant) -> Result<crate::tpm::ClientKey, Error> {
        let (permit, queue_key) = self.limits.acquire(&grant.who).await?;
        grant.slot = Some(Arc::new(permit));
        Ok(queue_key)
    }

    /// Takes one of the granted client's slots for a request that needs no TPM (see
    /// [`limits`]): held in the grant until the call ends. Returns the client's key in the TPM
    /// queue, for what such a request still queues there.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED after waiting too long for a slot.
    pub async fn take_call_slot(&self, grant: &mut Grant) -> Result<crate::tpm::ClientKey, Error> {
        let (permit, queue_key) = self.limits.acquire_call(&grant.who).await?;
        grant.slot = Some(Arc::new(permit));
        Ok(queue_key)
    }

    /// `who`'s budget of response bytes in flight (see [`limits`]).
    ///
    /// # Errors
    /// [`Error::Internal`] if the limits' lock is poisoned.
    pub fn response_budget(&self, who: &Identity) -> Result<limits::Budget, Error> {
        self.limits.budget(who)
    }

    /// Re-reads the policy directory. A bad new policy leaves the old one in force.
    ///
    /// # Errors
    /// [`PolicyError`] when the new files do not load (the old policy stays).
    pub fn reload(&self) -> Result<usize, PolicyError> {
        let Some((dir, configured)) = &self.dir else { return Ok(self.current().len()) };
        let fresh = Policy::load(dir, *configured)?;
        let n = fresh.len();
        if let Ok(mut p) = self.policy.write() {
            *p = Arc::new(fresh);
        }
        Ok(n)
    }

    /// Reopens the audit log file at its path (log rotation; see [`audit::AuditLog::reopen`]).
    pub fn reopen_audit_log(&self) {
        self.audit.reopen();
    }

    /// The policy in force.
    pub fn current(&self) -> Arc<Policy> {
        self.policy.read().map(|p| p.clone()).unwrap_or_default()
    }

    /// Where the policy in force came from, for status: the directory and its file count, the
    /// built-in default policy, or a fixed policy given by the embedding program.
    pub fn source(&self) -> String {
        let policy = self.current();
        match &self.dir {
            Some((dir, _)) if policy.is_builtin() => {
                format!("built-in default policy (no directory {})", dir.display())
            }
            Some((dir, _)) => format!("{} ({} file(s))", dir.display(), policy.files().len()),
            None => "fixed policy (embedded)".to_owned(),
        }
    }

    /// Requests denied by the policy so far, for every operation (zeros included), in the
    /// order of [`Operation::ALL`].
    pub fn denials(&self) -> impl Iterator<Item = (Operation, u64)> + '_ {
        Operation::ALL.into_iter().zip(&self.denied).map(|(op, n)| (op, n.load(Ordering::Relaxed)))
    }

    fn count_denial(&self, op: Operation) {
        if let Some(n) = Operation::ALL.iter().position(|o| *o == op).and_then(|i| self.denied.get(i)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Checks `op` on `key` (owned by `owner`) for `who`; denies (and audits the denial) with
    /// a message naming the operation.
    ///
    /// # Errors
    /// [`Error::PermissionDenied`].
    pub fn authorize(
        &self,
        who: Option<Identity>,
        op: Operation,
        key: Option<&KeyName>,
        owner: Option<&Owner>,
    ) -> Result<Grant, Error> {
        let Some(who) = who else {
            self.count_denial(op);
            self.audit.record(&Identity::Unknown, op, key.map(KeyName::as_str), "deny", None, "no client identity");
            return Err(Error::from(Denied::IdentityUnknown { op: Some(op) }));
        };
        let policy = self.current();
        match policy.decide(&who, op, key, owner) {
            Decision::Allow(rule) => Ok(Grant { who, op, key: key.map(|k| k.to_string()), rule, slot: None }),
            Decision::Deny => {
                self.count_denial(op);
                self.audit.record(&who, op, key.map(KeyName::as_str), "deny", None, "denied");
                // With no rule in force the caller (an administrator running `tpm-vault
                // status`, say) is told so plainly: nobody can do anything until rules are
                // added.
                Err(Error::from(Denied::ByPolicy { op, key: key.cloned(), who, no_rules: policy.is_empty() }))
            }
        }
    }

    /// Whether the policy in force now allows `who` to do `op` on `key` owned by `owner`
    /// (`None`: no such record). No audit record: for checks repeated inside a granted
    /// request (see `rpc/call.rs`), whose outcome its own record carries.
    pub fn allows(&self, who: &Identity, op: Operation, key: &KeyName, owner: Option<&Owner>) -> bool {
        matches!(self.current().decide(who, op, Some(key), owner), Decision::Allow(_))
    }

    /// Records the outcome of a granted request.
    pub fn finish(&self, grant: &Grant, outcome: &str) {
        self.audit.record(&grant.who, grant.op, grant.key.as_deref(), "allow", Some(&grant.rule), outcome);
    }

    /// Records a request for which no policy decision was made (ListKeys, which filters its
    /// answer by the policy, or a request refused as malformed before the check): decision
    /// `none`, and the outcome.
    pub fn undecided(&self, who: Option<&Identity>, op: Operation, key: Option<&str>, outcome: &str) {
        self.audit.record(who.unwrap_or(&Identity::Unknown), op, key, "none", None, outcome);
    }
}

/// The owner a record made by the client of `req` gets ([`Identity::owner`]), without
/// resolving names: the certificate identity the TLS listener attached, or the peer's uid.
///
/// # Errors
/// [`Error::PermissionDenied`] for a client without identity (which no rule grants anyway).
pub fn owner_of<T>(req: &tonic::Request<T>) -> Result<Owner, Error> {
    let owner = match req.extensions().get::<Identity>() {
        Some(id) => id.owner(),
        None => peer::Peer::of(req).map(|p| Owner::Uid(p.uid)),
    };
    owner.ok_or(Error::from(Denied::IdentityUnknown { op: None }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose uid no user has (so its identity does not depend on the machine).
    fn alice() -> Identity {
        Identity::Unix(UnixIdentity::resolve(4_000_000, 4_000_000, None, None))
    }

    fn access(text: &str) -> Access {
        let mut policy = Policy::default();
        policy.add_file(Path::new("t.toml"), text).unwrap_or_else(|e| panic!("{e}"));
        Access::with_policy(policy, audit::AuditLog::tracing_only())
    }

    #[test]
    fn denials_are_counted_by_operation() {
        let a =
            access("[[rule]]\nname = \"s\"\nclients = [\"uid:4000000\"]\nkeys = [\"*\"]\noperations = [\"sign\"]\n");
        assert!(a.denials().all(|(_, n)| n == 0));
        assert_eq!(a.denials().count(), Operation::ALL.len(), "every operation listed, from 0");
        assert!(a.authorize(Some(alice()), Operation::Sign, None, None).is_ok());
        for op in [Operation::Delete, Operation::Delete, Operation::Unseal] {
            assert!(a.authorize(Some(alice()), op, None, None).is_err());
        }
        assert!(a.authorize(None, Operation::Random, None, None).is_err(), "no identity");
        let denied: Vec<(&str, u64)> = a.denials().filter(|(_, n)| *n > 0).map(|(op, n)| (op.as_str(), n)).collect();
        assert_eq!(denied, [("delete", 2), ("unseal", 1), ("random", 1)]);
        assert_eq!(a.source(), "fixed policy (embedded)");
    }

    #[test]
    fn with_no_rules_a_denial_says_every_request_is_denied() {
        let a = access("# no rules\n");
        let Err(Error::PermissionDenied(denied)) = a.authorize(Some(alice()), Operation::Admin, None, None) else {
            panic!("denied expected");
        };
        let message = denied.to_string();
        assert!(message.contains("no access rules are in force, so every request is denied"), "{message}");
        let b = access("[[rule]]\nname = \"s\"\nclients = [\"uid:0\"]\nkeys = [\"*\"]\noperations = [\"sign\"]\n");
        let Err(Error::PermissionDenied(denied)) = b.authorize(Some(alice()), Operation::Admin, None, None) else {
            panic!("denied expected");
        };
        let message = denied.to_string();
        assert_eq!(message, "admin denied for uid 4000000 by the access policy");
    }
}
