//! The cost of one access-policy decision, in this process: `Policy::decide` on the shipped
//! `policies/default.toml` plus the three examples in `policies/examples/`, for a `www-data`
//! client signing with `web-frontend-1` (allowed by the TLS-server example's rule, after the
//! rules before it were checked), as the daemon decides every request before any TPM work.
//!
//! A decision takes tens of nanoseconds in a release build, about what reading the clock costs,
//! so one timed operation is a batch of [`BATCH`] decisions and the report divides its latency
//! by the batch. Every decision of the first batch must allow the request.

use std::path::Path;

use anyhow::{ensure, Context as _, Result};
use tpm_vault_daemon::daemon::{Decision, GroupsSource, Identity, Operation, Policy, UnixIdentity};
use tpm_vault_daemon::model::{KeyName, Owner};

use crate::sign::{timed_loop, Pids, Timing};
use crate::stats::Measurement;

/// The example policies loaded after the default, in this order (the `www-data` request is
/// allowed by the first one's rule).
const EXAMPLES: [&str; 3] = ["tls-server.toml", "attestation-agent.toml", "self-service.toml"];

/// Decisions per timed operation.
pub const BATCH: u64 = 1000;

/// The loaded policy and the request it decides.
#[derive(Debug)]
pub struct PolicySetup {
    policy: Policy,
    who: Identity,
    key: KeyName,
}

/// One round's measurement.
#[derive(Debug, Clone)]
pub struct PolicyRound {
    /// Batches of [`PolicyRound::batch`] decisions.
    pub m: Measurement,
    /// Decisions per batch.
    pub batch: u64,
    /// Rules in the loaded policy.
    pub rules: usize,
}

impl PolicySetup {
    /// Loads `policies/` of the workspace and its examples.
    ///
    /// # Errors
    /// A policy that does not load.
    pub fn new(workspace: &Path) -> Result<Self> {
        let root = workspace.join("policies");
        let mut policy = Policy::load_dir(&root).with_context(|| format!("loading {}", root.display()))?;
        for file in EXAMPLES {
            let path = root.join("examples").join(file);
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            policy.add_file(&path, &text).with_context(|| format!("loading {}", path.display()))?;
        }
        let who = Identity::Unix(UnixIdentity {
            uid: 33,
            gid: 33,
            pid: Some(1),
            user: Some("www-data".into()),
            groups: vec![(33, "www-data".into())],
            groups_source: GroupsSource::Nss,
        });
        let key = KeyName::try_from("web-frontend-1").context("key name")?;
        Ok(Self { policy, who, key })
    }

    fn allowed(&self) -> bool {
        matches!(
            self.policy.decide(&self.who, Operation::Sign, Some(&self.key), Some(&Owner::Uid(0))),
            Decision::Allow(_)
        )
    }

    /// Times batches of decisions; checks that the first batch allows every request.
    ///
    /// # Errors
    /// A decision that denies; a vanished process of `pids`.
    pub fn run(&self, timing: Timing, pids: Pids) -> Result<PolicyRound> {
        let allowed = (0..BATCH).filter(|_| self.allowed()).count() as u64;
        ensure!(allowed == BATCH, "the policy denied {} of {BATCH} requests", BATCH - allowed);
        let m = timed_loop(timing, pids, || {
            for _ in 0..BATCH {
                std::hint::black_box(self.allowed());
            }
            Ok(())
        })?;
        Ok(PolicyRound { m, batch: BATCH, rules: self.policy.len() })
    }
}
