//! `tpm-vault access check`: the access-policy decision for a local user, and the rule behind it.

use std::io::{self, Write};

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use tpm_vault_client::{AccessCheck, AccessDecision, Named, Operation};

use super::error::CliError;
use super::key::named_parser;
use super::output::Report;
use super::Context;

/// `tpm-vault access ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum AccessCommand {
    /// Show whether a local user may do an operation, and which rule allows it
    Check(AccessCheckArgs),
}

impl AccessCommand {
    pub(crate) async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        match self {
            AccessCommand::Check(args) => args.run(ctx).await,
        }
    }
}

/// `tpm-vault access check`.
#[derive(Debug, Args)]
#[command(after_help = "Prints the decision; exits 0 when allowed and 5 when denied. Needs the `admin` \
operation. Example: tpm-vault access check --uid 33 --op sign --key web-1")]
pub(crate) struct AccessCheckArgs {
    /// The Unix user id to check (its groups are resolved by the daemon)
    #[arg(long, value_name = "N")]
    pub(crate) uid: u32,
    /// The operation
    #[arg(long, value_name = "OP", value_parser = named_parser::<Operation>())]
    pub(crate) op: Operation,
    /// The key (or secret) name, for operations on keys
    #[arg(long, value_name = "NAME")]
    pub(crate) key: Option<String>,
}

impl AccessCheckArgs {
    async fn run(self, ctx: &mut Context) -> Result<(), CliError> {
        let check = ctx.client().await?.check_access(self.uid, self.op, self.key.as_deref()).await?;
        let allowed = check.is_allowed();
        ctx.emit(&AccessReport { check, uid: self.uid, op: self.op, key: self.key })?;
        if allowed {
            Ok(())
        } else {
            Err(CliError::AccessDenied)
        }
    }
}

/// An access decision, from `access check`.
pub(crate) struct AccessReport {
    /// The daemon's answer.
    pub(crate) check: AccessCheck,
    /// The uid asked about.
    pub(crate) uid: u32,
    /// The operation asked about.
    pub(crate) op: Operation,
    /// The key asked about.
    pub(crate) key: Option<String>,
}

impl Report for AccessReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let target = self.key.as_ref().map_or_else(String::new, |key| format!(" on key {key:?}"));
        match &self.check.decision {
            AccessDecision::Allow { rule } => {
                writeln!(out, "allow: {} may {}{target} (rule {rule:?})", self.check.identity, self.op.name())
            }
            AccessDecision::Deny => {
                writeln!(out, "deny: {} may not {}{target} (no rule allows it)", self.check.identity, self.op.name())
            }
        }
    }

    fn json(&self) -> Value {
        let (allowed, rule) = match &self.check.decision {
            AccessDecision::Allow { rule } => (true, Some(rule.as_str())),
            AccessDecision::Deny => (false, None),
        };
        json!({
            "uid": self.uid,
            "identity": self.check.identity,
            "operation": self.op.name(),
            "key": self.key,
            "allowed": allowed,
            "rule": rule,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("tpm-vault").chain(args.iter().copied())).map(|cli| cli.command)
    }

    #[test]
    fn check_args() {
        let Ok(Command::Access(AccessCommand::Check(args))) =
            parse(&["access", "check", "--uid", "33", "--op", "sign", "--key", "web-1"])
        else {
            panic!("not access check")
        };
        assert_eq!((args.uid, args.op, args.key.as_deref()), (33, Operation::Sign, Some("web-1")));
        assert_eq!(
            parse(&["access", "check", "--uid", "33", "--op", "fly"]).unwrap_err().kind(),
            ErrorKind::InvalidValue
        );
        assert_eq!(parse(&["access", "check", "--op", "sign"]).unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn reports() {
        let allow = AccessReport {
            check: AccessCheck {
                identity: "uid 33 (www-data)".into(),
                decision: AccessDecision::Allow { rule: "web".into() },
            },
            uid: 33,
            op: Operation::Sign,
            key: Some("web-1".into()),
        };
        let mut out = Vec::new();
        allow.text(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "allow: uid 33 (www-data) may sign on key \"web-1\" (rule \"web\")\n"
        );
        assert_eq!(allow.json()["rule"], "web");
        let deny = AccessReport {
            check: AccessCheck { identity: "uid 7".into(), decision: AccessDecision::Deny },
            uid: 7,
            op: Operation::Random,
            key: None,
        };
        let mut out = Vec::new();
        deny.text(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "deny: uid 7 may not random (no rule allows it)\n");
        assert_eq!(deny.json()["allowed"], false);
        assert_eq!(CliError::AccessDenied.exit_code(), 5);
    }
}
