//! Access-policy checks: the operations the daemon's policies name, and the answer of
//! `CheckAccess` (which rule, if any, lets a local user do something).
//!
//! Owns [`Operation`] and its names, and [`AccessCheck`]. It does not evaluate policies: only
//! the daemon knows them.

use tpm_vault_proto::v1 as proto;

use crate::Named;

pub use tpm_vault_proto::operation::Operation;

impl Named for Operation {
    const KIND: &'static str = "operation";
    const VALUES: &'static [(&'static str, Self)] = &Operation::NAMED;

    fn name(self) -> &'static str {
        self.as_str()
    }
}

/// The daemon's access decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessDecision {
    /// Allowed by the named rule.
    Allow {
        /// The rule's name (or `file:index` for an unnamed rule).
        rule: String,
    },
    /// No rule allows it (the policies deny by default).
    Deny,
}

/// The answer of [`Client::check_access`](crate::Client::check_access).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessCheck {
    /// The identity as the daemon resolved it, e.g. `uid 33 (www-data)`.
    pub identity: String,
    /// Allowed, and by which rule, or denied.
    pub decision: AccessDecision,
}

impl AccessCheck {
    /// True if allowed.
    pub fn is_allowed(&self) -> bool {
        matches!(self.decision, AccessDecision::Allow { .. })
    }
}

impl From<proto::CheckAccessResponse> for AccessCheck {
    fn from(r: proto::CheckAccessResponse) -> AccessCheck {
        let decision = if r.allowed { AccessDecision::Allow { rule: r.rule } } else { AccessDecision::Deny };
        AccessCheck { identity: r.identity, decision }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (name, op) in Operation::VALUES {
            assert_eq!(op.name(), *name);
            assert_eq!(Operation::from_name(name).unwrap(), *op);
        }
        assert!(Operation::from_name("fly").unwrap_err().to_string().contains("unknown operation \"fly\""));
    }

    #[test]
    fn decision_from_proto() {
        let allow = proto::CheckAccessResponse { allowed: true, rule: "web".into(), identity: "uid 33".into() };
        assert_eq!(AccessCheck::from(allow).decision, AccessDecision::Allow { rule: "web".into() });
        let deny = proto::CheckAccessResponse { allowed: false, rule: String::new(), identity: "uid 1".into() };
        assert!(!AccessCheck::from(deny).is_allowed());
    }
}
