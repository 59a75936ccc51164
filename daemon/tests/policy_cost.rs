//! The cost of one access-policy decision (issue target: under 2 µs per request), measured with
//! the shipped default and example policies loaded together. A measurement, ignored by default:
//! `cargo test --release -p tpm-vault-daemon --test policy_cost -- --ignored --nocapture`.

use std::path::Path;
use std::time::Instant;

use tpm_vault_daemon::auth::{GroupsSource, Identity, Operation, Policy, UnixIdentity};
use tpm_vault_daemon::model::{KeyName, Owner};

#[test]
#[ignore = "measurement; run explicitly"]
fn policy_decision_cost() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let mut policy = Policy::load_dir(&root).expect("default policy");
    for f in ["tls-server.toml", "attestation-agent.toml", "self-service.toml"] {
        let path = root.join("examples").join(f);
        policy.add_file(&path, &std::fs::read_to_string(&path).expect("read")).expect("parse");
    }
    let www = Identity::Unix(UnixIdentity {
        uid: 33,
        gid: 33,
        pid: Some(1),
        user: Some("www-data".into()),
        groups: vec![(33, "www-data".into())],
        groups_source: GroupsSource::Nss,
    });
    let key = KeyName::try_from("web-frontend-1").expect("name");
    let n = 1_000_000u32;
    let start = Instant::now();
    let mut allowed = 0u32;
    for _ in 0..n {
        if matches!(
            policy.decide(&www, Operation::Sign, Some(&key), Some(&Owner::Uid(0))),
            tpm_vault_daemon::auth::Decision::Allow(_)
        ) {
            allowed += 1;
        }
    }
    let per = start.elapsed().as_nanos() as f64 / f64::from(n);
    println!("policy decision: {per:.0} ns each over {n} decisions ({} rules, {allowed} allowed)", policy.len());
    assert_eq!(allowed, n);
}
