//! ListKeys pages over what the caller may see (issue #19): the page token is opaque, so a
//! caller under owner-only rules cannot binary-search other users' key names with chosen
//! tokens, and the pages it gets look the same whether hidden keys exist or not; one call reads
//! a bounded number of records, however many the caller cannot see; a record that does not
//! parse is skipped and counted, not fatal.

mod support;

use std::path::Path;
use std::sync::Arc;

use support::{DaemonEnv, TpmEnv};
use tonic::transport::Channel;
use tonic::Code;
use tpm_vault_daemon::daemon::AuditLog;
use tpm_vault_daemon::daemon::{Access, Policy};
use tpm_vault_proto::v1 as pb;
use tpm_vault_proto::v1::key_service_client::KeyServiceClient;

/// Another user's uid, for the records planted in the state directory.
const OTHER_UID: u32 = 4242;

/// A daemon whose only rule lets this process create, see and sign its OWN keys.
async fn owner_only_daemon() -> DaemonEnv {
    let tpm = TpmEnv::start();
    let text = format!(
        "[[rule]]\nname = \"own\"\nclients = [\"uid:{}\"]\nkeys = [\"*\"]\n\
         operations = [\"create\", \"public\", \"sign\"]\nowner_only = true\n",
        nix::unistd::getuid().as_raw()
    );
    let mut policy = Policy::default();
    policy.add_file(Path::new("own.toml"), &text).expect("policy");
    DaemonEnv::start_with(tpm, Arc::new(Access::with_policy(policy, AuditLog::tracing_only()))).await
}

fn create(name: &str) -> pb::CreateKeyRequest {
    pb::CreateKeyRequest { name: name.into(), algorithm: 0, pcr_binding: None, auth: vec![], usages: vec![] }
}

fn key_file(env: &DaemonEnv, name: &str) -> std::path::PathBuf {
    env.tpm.state_dir().join("keys").join(format!("{name}.key"))
}

/// Plants copies of `template`'s record as keys `names` of another user (a valid record each:
/// the same TPM blobs, another name and owner).
fn plant(env: &DaemonEnv, template: &str, names: impl IntoIterator<Item = String>) {
    let text = std::fs::read_to_string(key_file(env, template)).expect("template record");
    let record: serde_json::Value = serde_json::from_str(&text).expect("json");
    for name in names {
        let mut copy = record.clone();
        copy["name"] = name.clone().into();
        copy["owner_uid"] = OTHER_UID.into();
        std::fs::write(key_file(env, &name), serde_json::to_vec_pretty(&copy).expect("json")).expect("plant");
    }
}

/// Every page of a listing with `page_size`: each page's key names, and whether it had a next
/// page token.
async fn pages(c: &mut KeyServiceClient<Channel>, page_size: u32) -> Vec<(Vec<String>, bool)> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .list_keys(pb::ListKeysRequest { page_size, page_token: page_token.clone() })
            .await
            .expect("list")
            .into_inner();
        let more = !page.next_page_token.is_empty();
        out.push((page.keys.into_iter().map(|k| k.name).collect(), more));
        assert!(out.len() < 100, "the listing does not end: {out:?}");
        if !more {
            return out;
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_token_attack_learns_nothing() {
    let env = owner_only_daemon().await;
    let mut c = env.keys().await;
    for name in ["m-mine", "q-mine"] {
        c.create_key(create(name)).await.expect("create own key");
    }
    // What this client sees of a store holding only its own keys, page by page.
    let sizes = [1, 2, 0];
    let mut baseline = Vec::new();
    for size in sizes {
        baseline.push(pages(&mut c, size).await);
    }
    // Another user's keys around, between and after them.
    plant(&env, "m-mine", ["a-hidden", "m-hidden", "m-mine0", "n", "q-mine-hidden", "z-hidden"].map(String::from));
    for (size, alone) in sizes.into_iter().zip(&baseline) {
        let seen = pages(&mut c, size).await;
        assert_eq!(&seen, alone, "page size {size}: the pages differ once hidden keys exist");
    }
    assert_eq!(baseline[2], vec![(vec!["m-mine".to_owned(), "q-mine".to_owned()], false)]);
    // The attack: start a page at a chosen name (before and after a guess) and see whether the
    // own key comes next. Every chosen token is refused, whatever it names.
    for chosen in ["a", "m", "m-h", "m-hidden", "m-mine", "m-min", "n", "q-mine", "z", "00", "not hex"] {
        let r = c.list_keys(pb::ListKeysRequest { page_size: 1, page_token: chosen.into() }).await;
        let e = r.expect_err(&format!("a chosen page token {chosen:?} was accepted"));
        assert_eq!(e.code(), Code::InvalidArgument, "{chosen:?}: {e:?}");
    }
    // A real token, altered, is refused too.
    let page = c.list_keys(pb::ListKeysRequest { page_size: 1, page_token: String::new() }).await.expect("list");
    let mut token = page.into_inner().next_page_token.into_bytes();
    assert!(!token.is_empty());
    let last = token.len() - 1;
    token[last] = if token[last] == b'0' { b'1' } else { b'0' };
    let altered = String::from_utf8(token).expect("hex");
    let e = c.list_keys(pb::ListKeysRequest { page_size: 1, page_token: altered }).await.expect_err("altered");
    assert_eq!(e.code(), Code::InvalidArgument);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_reads_a_bounded_number_of_records_per_call() {
    let env = owner_only_daemon().await;
    let mut c = env.keys().await;
    c.create_key(create("zz-mine")).await.expect("create own key");
    // 1,500 keys of another user before this client's only key.
    plant(&env, "zz-mine", (0..1500).map(|i| format!("a-{i:04}")));
    let seen = pages(&mut c, 0).await;
    // The first call read its bound of records, none of them this client's: an empty page
    // with a next-page token; the second finds the key.
    assert_eq!(seen, vec![(vec![], true), (vec!["zz-mine".to_owned()], false)]);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_skipped_and_counted_not_fatal() {
    let env = DaemonEnv::start().await;
    let mut c = env.keys().await;
    for name in ["a", "b", "c"] {
        c.create_key(create(name)).await.expect("create");
    }
    std::fs::write(key_file(&env, "b"), b"{ not a record").expect("corrupt b");
    assert_eq!(env.vault.corrupt_records(), 0);
    let seen = pages(&mut c, 0).await;
    assert_eq!(seen, vec![(vec!["a".to_owned(), "c".to_owned()], false)]);
    assert_eq!(env.vault.corrupt_records(), 1);
    // The key itself still reports its state-directory error.
    let e = c.get_key(pb::GetKeyRequest { name: "b".into() }).await.expect_err("corrupt b");
    assert_eq!(e.code(), Code::Internal);
    env.stop().await;
}
