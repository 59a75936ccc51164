//! Why a request was refused permission: one typed reason per way the daemon says no, whose
//! text is what the peer reads (PERMISSION_DENIED, built in `rpc/error_status.rs`).

use super::peer::Identity;
use super::policy::Operation;
use crate::model::{KeyName, Usage, Usages};

/// A refused permission ([`crate::Error::PermissionDenied`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The client has no identity (no peer credentials, no certificate), so no rule can grant
    /// it anything; `op` is the operation it asked for, when known.
    #[error("{}", identity_unknown(*.op))]
    IdentityUnknown {
        /// The operation asked for.
        op: Option<Operation>,
    },
    /// No rule of the access policy grants `who` the operation `op` (on `key`);
    /// `no_rules` when the policy has no rule at all.
    #[error("{} denied for {who} by the access policy{}", on_key(*.op, .key.as_ref()), if *.no_rules { NO_RULES } else { "" })]
    ByPolicy {
        /// The operation asked for.
        op: Operation,
        /// The key, sealed secret or data key it was asked on.
        key: Option<KeyName>,
        /// The client.
        who: Identity,
        /// True when no access rule is in force.
        no_rules: bool,
    },
    /// A password key asked to sign without its password.
    #[error("key {0} needs its password")]
    NeedsPassword(KeyName),
    /// A signed PCR policy that the secret's policy authority did not sign.
    #[error("signed policy is not signed by this secret's policy authority")]
    ForeignAuthority,
    /// A signed PCR policy past its expiry (Unix seconds).
    #[error("signed policy expired at {0}")]
    Expired(i64),
    /// A signed PCR policy older than the secret's minimum policy version.
    #[error("signed policy version {version} was revoked (minimum is {minimum})")]
    Revoked {
        /// The policy's version.
        version: u64,
        /// The lowest version the secret still takes.
        minimum: u64,
    },
    /// The key's usages do not allow what was asked: `needs` is the usage the request needs
    /// (a raw signature `sign`, an SSH signature `ssh`, a policy approval `policy`).
    #[error("key {key} has usages {has}: {} needs usage {needs}", purpose(*.needs))]
    Usage {
        /// The key.
        key: KeyName,
        /// What the key may do.
        has: Usages,
        /// The usage the request needs.
        needs: Usage,
    },
    /// A write re-checked under the store's lock found the record's owner or the policy
    /// changed while the request ran (the store's `StoreError::Refused`).
    #[error("{0}: the record's owner or the access policy changed while the request ran")]
    ChangedUnderWriteLock(KeyName),
}

const NO_RULES: &str = ": no access rules are in force, so every request is denied";

fn purpose(needs: Usage) -> &'static str {
    match needs {
        Usage::Sign => "a raw signature",
        Usage::Ssh => "an SSH signature",
        Usage::Policy => "a policy approval (SignPolicy)",
    }
}

fn identity_unknown(op: Option<Operation>) -> String {
    match op {
        Some(op) => format!("{} denied: client identity unknown", op.as_str()),
        None => "client identity unknown".to_owned(),
    }
}

fn on_key(op: Operation, key: Option<&KeyName>) -> String {
    match key {
        Some(k) => format!("{} on key {k}", op.as_str()),
        None => op.as_str().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::UnixIdentity;

    /// The texts clients and tests match on, exactly as they were written before the type.
    #[test]
    fn each_reason_reads_as_before() {
        let key = KeyName::try_from("k1").unwrap();
        let who = Identity::Unix(UnixIdentity::resolve(4_000_000, 4_000_000, None, None));
        let cases = [
            (Denied::IdentityUnknown { op: None }, "client identity unknown"),
            (Denied::IdentityUnknown { op: Some(Operation::Sign) }, "sign denied: client identity unknown"),
            (
                Denied::ByPolicy { op: Operation::Sign, key: Some(key.clone()), who: who.clone(), no_rules: false },
                "sign on key k1 denied for uid 4000000 by the access policy",
            ),
            (
                Denied::ByPolicy { op: Operation::Admin, key: None, who, no_rules: true },
                "admin denied for uid 4000000 by the access policy: no access rules are in force, so every request is denied",
            ),
            (Denied::NeedsPassword(key.clone()), "key k1 needs its password"),
            (Denied::ForeignAuthority, "signed policy is not signed by this secret's policy authority"),
            (Denied::Expired(1_700_000_000), "signed policy expired at 1700000000"),
            (Denied::Revoked { version: 1, minimum: 2 }, "signed policy version 1 was revoked (minimum is 2)"),
            (
                Denied::ChangedUnderWriteLock(key),
                "k1: the record's owner or the access policy changed while the request ran",
            ),
        ];
        for (denied, text) in cases {
            assert_eq!(denied.to_string(), text);
        }
    }
}
