//! Access-policy files (`/etc/tpm-vault/policies/*.toml`): `Policy::add_file` on arbitrary
//! UTF-8, then decisions for a few clients, operations and keys with whatever it accepted.
//!
//! Properties: no panic; a rejected file leaves the policy empty and its error is one line
//! (it goes to stderr / the journal as one message); glob matching terminates.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tpm_vault_daemon::daemon::{Decision, GroupsSource, Identity, Operation, Policy, UnixIdentity};
use tpm_vault_daemon::model::{KeyName, Owner};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut policy = Policy::default();
    match policy.add_file(Path::new("fuzz.toml"), text) {
        Ok(()) => {
            assert_eq!(policy.files().len(), 1);
            let who = [
                Identity::Unix(UnixIdentity {
                    uid: 0,
                    gid: 0,
                    pid: None,
                    user: Some("root".into()),
                    groups: vec![(0, "root".into())],
                    groups_source: GroupsSource::Kernel,
                }),
                Identity::Unix(UnixIdentity {
                    uid: 1000,
                    gid: 990,
                    pid: Some(1),
                    user: None,
                    groups: vec![(990, "tpm-vault".into())],
                    groups_source: GroupsSource::Nss,
                }),
                Identity::Cert { subject: "CN=agent".into() },
            ];
            let keys: Vec<KeyName> =
                ["web-1", "a", "x.y_z-0"].iter().filter_map(|k| KeyName::try_from(*k).ok()).collect();
            for w in &who {
                for op in Operation::ALL {
                    let owners = [
                        None,
                        Some(Owner::Uid(0)),
                        Some(Owner::Uid(1000)),
                        Some(Owner::Certificate("CN=agent".into())),
                    ];
                    for owner in &owners {
                        for k in &keys {
                            if let Decision::Allow(rule) = policy.decide(w, op, Some(k), owner.as_ref()) {
                                assert!(!rule.is_empty());
                            }
                        }
                        let _ = policy.decide(w, op, None, owner.as_ref());
                    }
                }
            }
        }
        Err(e) => {
            assert!(policy.is_empty() && policy.files().is_empty(), "a rejected file left rules behind");
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "multi-line policy error: {msg:?}");
        }
    }
});
