//! Access policies end to end: a client running as another uid (re-executed under `setpriv`)
//! gets PERMISSION_DENIED naming the operation for what its rule does not allow, succeeds at
//! what it does, and the audit log records both; reloads under load never fail a request for
//! any reason but the policy; every shipped policy file loads; owner-only rules compare the
//! caller with the owner of the record the request acts on (signing key, sealed secret or
//! data key: three namespaces), so a signing key named like someone's secret opens nothing;
//! group rules match the supplementary groups the kernel says the peer has (SO_PEERGROUPS),
//! not the user's groups in the group database; a flood of denials is summed up in the audit
//! log and slows no other client.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use support::{nobody_channel, DaemonEnv, TpmEnv};
use tonic::Code;
use tpm_vault_daemon::daemon::AuditLog;
use tpm_vault_daemon::daemon::{Access, Policy};
use tpm_vault_proto::v1 as pb;

const NOBODY: u32 = 65534;

fn create(name: &str) -> pb::CreateKeyRequest {
    pb::CreateKeyRequest { name: name.into(), algorithm: 0, pcr_binding: None, auth: vec![], usages: vec![] }
}

fn sign(name: &str) -> pb::SignRequest {
    pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Message(b"m".to_vec())),
        hash: 0,
        scheme: 0,
        auth: vec![],
        purpose: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_gets_exactly_what_its_rule_allows_and_the_audit_log_has_both() {
    let tpm = TpmEnv::start();
    let audit_path = tpm.path().join("audit.jsonl");
    let mut policy = Policy::default();
    let text = format!(
        "{}\n[[rule]]\nname = \"nobody-web\"\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"web-*\"]\noperations = [\"sign\", \"public\"]\n",
        support::allow_self_policy()
    );
    policy.add_file(Path::new("test.toml"), &text).expect("policy");
    let access = Access::with_policy(policy, AuditLog::with_file(&audit_path).expect("audit file"));
    let env = DaemonEnv::start_with(tpm, Arc::new(access)).await;
    let mut c = env.keys().await;
    c.create_key(create("web-1")).await.expect("create web-1");
    c.create_key(create("db")).await.expect("create db");
    run_as_nobody(&env, "client_running_as_nobody");
    // The audit log has the allowed sign and the denied one, for uid 65534, without secrets.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = std::fs::read_to_string(&audit_path).expect("audit log");
    let entries: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
    let by_nobody = |op: &str, key: &str, decision: &str| {
        entries.iter().any(|e| e["uid"] == NOBODY && e["op"] == op && e["key"] == key && e["decision"] == decision)
    };
    assert!(by_nobody("sign", "web-1", "allow"), "{log}");
    assert!(by_nobody("sign", "db", "deny"), "{log}");
    assert!(by_nobody("delete", "web-1", "deny"), "{log}");
    assert!(entries.iter().any(|e| e["rule"] == "nobody-web" && e["outcome"] == "ok"), "{log}");
    env.stop().await;
}

/// Runs in the child process as uid 65534 (see above); ignored in normal runs.
#[tokio::test]
#[ignore = "helper: run by another_uid_gets_exactly_what_its_rule_allows_and_the_audit_log_has_both"]
async fn client_running_as_nobody() {
    let mut c = pb::key_service_client::KeyServiceClient::new(nobody_channel().await);
    c.sign(sign("web-1")).await.expect("allowed: sign web-1");
    c.get_public_key(pb::GetPublicKeyRequest { name: "web-1".into() }).await.expect("allowed: public web-1");
    let e = c.sign(sign("db")).await.expect_err("sign db");
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("sign"), "{}", e.message());
    let e = c.delete_key(pb::DeleteKeyRequest { name: "web-1".into() }).await.expect_err("delete");
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("delete"), "{}", e.message());
    let e = c.create_key(create("web-2")).await.expect_err("create");
    assert_eq!(e.code(), Code::PermissionDenied);
    // Listing shows only what this client may see.
    let list = c.list_keys(pb::ListKeysRequest::default()).await.expect("list").into_inner();
    assert_eq!(list.keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), vec!["web-1"]);
    // A name that tries to escape the glob never reaches the policy.
    let e = c.sign(sign("web-1/../db")).await.expect_err("bad name");
    assert_eq!(e.code(), Code::InvalidArgument);
}

/// Runs the ignored test `helper` of this binary as uid 65534 against `env`'s socket.
fn run_as_nobody(env: &DaemonEnv, helper: &str) {
    run_as_nobody_with(env, helper, &["--clear-groups"]);
}

/// [`run_as_nobody`] with `groups`, setpriv's options for the supplementary groups.
fn run_as_nobody_with(env: &DaemonEnv, helper: &str, groups: &[&str]) {
    passed(nobody_command(env, helper, groups).output().expect("setpriv"));
}

/// The command running the ignored test `helper` of this binary as uid 65534, with setpriv's
/// supplementary-group options `groups`, against `env`'s socket.
fn nobody_command(env: &DaemonEnv, helper: &str, groups: &[&str]) -> std::process::Command {
    // Let uid 65534 reach the socket in our temp dir.
    std::fs::set_permissions(env.tpm.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
    let exe = std::env::current_exe().expect("exe");
    let mut command = std::process::Command::new("setpriv");
    command
        .close_inherited_fds()
        .args(["--reuid", &NOBODY.to_string(), "--regid", &NOBODY.to_string()])
        .args(groups)
        .arg(exe)
        .args(["--ignored", "--exact", helper, "--nocapture"])
        .env("TPM_VAULT_TEST_SOCKET", &env.socket);
    command
}

/// Asserts that a helper child's one test passed.
fn passed(out: std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_only_rules_look_up_the_owner_of_the_record_the_request_acts_on() {
    let tpm = TpmEnv::start();
    let mut policy = Policy::default();
    let text = format!(
        "{}\n[[rule]]\nname = \"own-only\"\nclients = [\"uid:{NOBODY}\"]\nkeys = [\"*\"]\n\
         operations = [\"create\", \"sign\", \"public\", \"delete\", \"seal\", \"unseal\", \"encrypt\", \"decrypt\"]\n\
         owner_only = true\n",
        support::allow_self_policy()
    );
    policy.add_file(Path::new("test.toml"), &text).expect("policy");
    let env = DaemonEnv::start_with(tpm, Arc::new(Access::with_policy(policy, AuditLog::tracing_only()))).await;
    // This process (another uid) owns a signing key, a sealed secret and a data key.
    let channel = env.channel().await;
    env.keys().await.create_key(create("web")).await.expect("create web");
    let mut seal = pb::seal_service_client::SealServiceClient::new(channel.clone());
    seal.seal(seal_request("disk")).await.expect("seal disk");
    let mut crypto = pb::crypto_service_client::CryptoServiceClient::new(channel);
    crypto.create_data_key(pb::CreateDataKeyRequest { name: "dk".into(), pcr_binding: None }).await.expect("dk");

    run_as_nobody(&env, "owner_only_client_running_as_nobody");

    // What the other uid was refused is intact.
    assert!(seal.unseal(pb::UnsealRequest { name: "disk".into(), signed_policy: vec![] }).await.is_ok());
    let mut keys = env.keys().await;
    let chain = keys.get_certificate(pb::GetCertificateRequest { name: "web".into() }).await;
    assert_ne!(chain.map(|c| c.into_inner().chain_pem).ok().as_deref(), Some(FORGED_CHAIN));
    env.stop().await;
}

fn seal_request(name: &str) -> pb::SealRequest {
    pb::SealRequest {
        name: name.into(),
        secret: b"the disk key".to_vec(),
        pcr_binding: None,
        authorized_by: vec![],
        overwrite: false,
    }
}

/// Not a certificate at all: what matters is that the daemon never stores it for `web`.
const FORGED_CHAIN: &str = "forged";

/// Asserts that a request was refused by the access policy.
fn denied<T>(r: Result<tonic::Response<T>, tonic::Status>, what: &str) {
    match r {
        Err(e) if e.code() == Code::PermissionDenied => {}
        Err(e) => panic!("{what}: {:?} {}", e.code(), e.message()),
        Ok(_) => panic!("{what} was allowed"),
    }
}

/// Runs in the child process as uid 65534 (see above); ignored in normal runs.
#[tokio::test]
#[ignore = "helper: run by owner_only_rules_look_up_the_owner_of_the_record_the_request_acts_on"]
async fn owner_only_client_running_as_nobody() {
    let channel = nobody_channel().await;
    let mut keys = pb::key_service_client::KeyServiceClient::new(channel.clone());
    let mut seal = pb::seal_service_client::SealServiceClient::new(channel.clone());
    let mut crypto = pb::crypto_service_client::CryptoServiceClient::new(channel);
    // Signing keys named like the other uid's secret and data key are this client's own...
    keys.create_key(create("disk")).await.expect("own signing key disk");
    keys.create_key(create("dk")).await.expect("own signing key dk");
    // ...and open neither.
    denied(seal.unseal(pb::UnsealRequest { name: "disk".into(), signed_policy: vec![] }).await, "unseal disk");
    denied(seal.delete_sealed(pb::DeleteSealedRequest { name: "disk".into() }).await, "delete sealed disk");
    let mut overwrite = seal_request("disk");
    overwrite.overwrite = true;
    denied(seal.seal(overwrite).await, "seal over disk");
    denied(crypto.delete_data_key(pb::DeleteDataKeyRequest { name: "dk".into() }).await, "delete data key dk");
    let first = pb::EncryptRequest { key_name: "dk".into(), context: vec![], data: Default::default() };
    let encrypt = match crypto.encrypt(tokio_stream::iter(vec![first])).await {
        Ok(r) => r.into_inner().message().await.map(|_| tonic::Response::new(())),
        Err(e) => Err(e),
    };
    denied(encrypt, "encrypt with dk");
    // A certificate on someone else's key is not this client's to set.
    let forged = pb::SetCertificateRequest { name: "web".into(), chain_pem: FORGED_CHAIN.into() };
    denied(keys.set_certificate(forged).await, "set certificate on web");
    // Its own sealed secrets and data keys work.
    seal.seal(seal_request("mine")).await.expect("seal mine");
    let opened = seal.unseal(pb::UnsealRequest { name: "mine".into(), signed_policy: vec![] }).await.expect("unseal");
    assert_eq!(opened.into_inner().secret.as_slice(), b"the disk key");
    crypto.create_data_key(pb::CreateDataKeyRequest { name: "mydk".into(), pcr_binding: None }).await.expect("mydk");
    let first = pb::EncryptRequest { key_name: "mydk".into(), context: vec![], data: b"x".to_vec().into() };
    let mut out = crypto.encrypt(tokio_stream::iter(vec![first])).await.expect("encrypt").into_inner();
    assert!(out.message().await.expect("encrypt stream").is_some());
}

/// Denied requests the flooding client sends, half Sign and half Delete.
const FLOOD: usize = 20_000;

/// A client with no rights (uid 65534) sends 20,000 denied requests while another client
/// signs; the audit file is a pipe nobody reads until the flood is over (a journal that
/// stalled). The other client's signatures each take under 1 s, and the audit log holds, per
/// operation, five denials and one summary per 10 s window whose counts add up to every
/// denial. (Every denial used to be a line, and past 1 MiB of them the loggers, tokio workers,
/// waited for the pipe: the flood and the other client stalled with it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_denials_is_summed_up_and_does_not_slow_other_clients() {
    let tpm = TpmEnv::start();
    let fifo = tpm.path().join("audit.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).expect("mkfifo");
    let text = Arc::new(std::sync::Mutex::new(Vec::new()));
    let reading = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (fifo, text, reading) = (fifo.clone(), text.clone(), reading.clone());
        // A journal that stalls during the flood: nothing is read until the flood is over.
        std::thread::spawn(move || {
            use std::io::Read;
            let mut pipe = std::fs::File::open(fifo).expect("open fifo");
            while !reading.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut chunk = [0u8; 4096];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => text.lock().map(|mut t| t.extend_from_slice(&chunk[..n])).unwrap_or(()),
                }
            }
        })
    };
    let mut policy = Policy::default();
    policy.add_file(Path::new("test.toml"), &support::allow_self_policy()).expect("policy");
    let access = Arc::new(Access::with_policy(policy, AuditLog::with_file(&fifo).expect("audit fifo")));
    let env = DaemonEnv::start_with(tpm, access.clone()).await;
    env.keys().await.create_key(create("mine")).await.expect("create");

    // The journal moves again when the flood is over, or when a signature hangs (else the
    // stalled loggers of the old code kept the flood, and so this test, from ever ending).
    let start_reading = StartReading(reading);
    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // The signing client runs on a runtime of its own, so its timeout fires even if every
    // worker of the daemon's runtime (this test's) is stuck.
    let signer = {
        let (socket, flooding, unstick) = (env.socket.clone(), flooding.clone(), start_reading.0.clone());
        std::thread::spawn(move || sign_while(&socket, &flooding, &unstick))
    };
    let started = std::time::Instant::now();
    // Blocking this thread is fine: the daemon's tasks run on the runtime's worker threads.
    let flood = nobody_command(&env, "flood_of_denials_as_nobody", &["--clear-groups"]).output().expect("setpriv");
    let flood_time = started.elapsed();
    flooding.store(false, std::sync::atomic::Ordering::SeqCst);
    drop(start_reading);
    let (signs, slowest) = signer.join().expect("signer thread");
    passed(flood);
    eprintln!("{FLOOD} denials in {flood_time:?}; {signs} signatures meanwhile, the slowest {slowest:?}");
    assert!(signs >= 3, "the flood ended before the test could measure: {signs} signatures");
    assert!(slowest < Duration::from_secs(1), "a signature took {slowest:?} under the flood");

    // Every denial is accounted for once the windows' summaries are written (at their end).
    // Whole lines only: the reader may be in the middle of one.
    let of_nobody = |text: &[u8]| -> Vec<serde_json::Value> {
        let whole = text.iter().rposition(|&b| b == b'\n').map_or(&text[..0], |end| &text[..end]);
        String::from_utf8_lossy(whole)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("audit line is JSON"))
            .filter(|e| e["uid"] == NOBODY)
            .collect()
    };
    let accounted = |entries: &[serde_json::Value], op: &str| -> u64 {
        entries.iter().filter(|e| e["op"] == op).map(|e| e.get("repeated").and_then(|r| r.as_u64()).unwrap_or(1)).sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let entries = loop {
        let entries = of_nobody(&text.lock().expect("text")[..]);
        let counts = (accounted(&entries, "sign"), accounted(&entries, "delete"));
        if counts == (FLOOD as u64 / 2, FLOOD as u64 / 2) {
            break entries;
        }
        assert!(std::time::Instant::now() < deadline, "denials accounted for: {counts:?} of {FLOOD}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Five lines and one summary per operation and window.
    let windows = flood_time.as_secs() / 10 + 2;
    assert!(entries.len() as u64 <= 2 * 6 * windows, "{} lines for {FLOOD} denials", entries.len());
    assert!(entries.iter().all(|e| e["decision"] == "deny"), "{entries:#?}");
    let summaries: Vec<_> = entries.iter().filter(|e| e.get("repeated").is_some()).collect();
    assert!(summaries.len() >= 2 && summaries.iter().all(|e| e["key"].is_null()), "{summaries:#?}");
    eprintln!("audit lines of the flooding client: {} ({} summaries)", entries.len(), summaries.len());
    env.stop().await;
    // The reader ends when the last audit log handle closes the pipe; nothing waits for it.
    drop((access, reader));
}

/// Signs every 20 ms over `socket` while `flooding`; the number of signatures and the slowest.
/// A signature that takes 10 s lets the audit pipe be read (`unstick`) and counts as 10 s.
fn sign_while(
    socket: &Path,
    flooding: &std::sync::atomic::AtomicBool,
    unstick: &std::sync::atomic::AtomicBool,
) -> (usize, Duration) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display())).expect("uri");
        let mut c = pb::key_service_client::KeyServiceClient::new(endpoint.connect().await.expect("connect"));
        let (mut signs, mut slowest) = (0, Duration::ZERO);
        while flooding.load(std::sync::atomic::Ordering::SeqCst) {
            let t = std::time::Instant::now();
            match tokio::time::timeout(Duration::from_secs(10), c.sign(sign("mine"))).await {
                Ok(signed) => {
                    signed.expect("sign");
                }
                Err(_) => unstick.store(true, std::sync::atomic::Ordering::SeqCst),
            }
            slowest = slowest.max(t.elapsed());
            signs += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (signs, slowest)
    })
}

/// Lets the audit pipe's reader start when dropped.
struct StartReading(Arc<std::sync::atomic::AtomicBool>);

impl Drop for StartReading {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Runs in the child process as uid 65534; ignored in normal runs. Sends [`FLOOD`] requests
/// this uid has no right to, 50 at a time over one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by a_flood_of_denials_is_summed_up_and_does_not_slow_other_clients"]
async fn flood_of_denials_as_nobody() {
    let keys = pb::key_service_client::KeyServiceClient::new(nobody_channel().await);
    let tasks: Vec<_> = (0..50)
        .map(|t| {
            let mut keys = keys.clone();
            tokio::spawn(async move {
                for _ in 0..FLOOD / 50 {
                    let answer = match t % 2 {
                        0 => keys.sign(sign("mine")).await.map(|_| ()),
                        _ => keys.delete_key(pb::DeleteKeyRequest { name: "mine".into() }).await.map(|_| ()),
                    };
                    assert_eq!(answer.map_err(|e| e.code()), Err(Code::PermissionDenied));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("flooding task");
    }
}

/// A group no user lists in the group database: only the kernel knows a process has it.
const KERNEL_ONLY_GID: u32 = 4321;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_rules_match_the_groups_the_kernel_says_the_peer_has() {
    assert!(nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(KERNEL_ONLY_GID)).ok().flatten().is_none());
    let tpm = TpmEnv::start();
    let audit_path = tpm.path().join("audit.jsonl");
    let mut policy = Policy::default();
    let text = format!(
        "{}\n[[rule]]\nname = \"by-group\"\nclients = [\"gid:{KERNEL_ONLY_GID}\"]\nkeys = [\"grp-*\"]\n\
         operations = [\"sign\"]\n",
        support::allow_self_policy()
    );
    policy.add_file(Path::new("test.toml"), &text).expect("policy");
    let access = Access::with_policy(policy, AuditLog::with_file(&audit_path).expect("audit file"));
    let env = DaemonEnv::start_with(tpm, Arc::new(access)).await;
    env.keys().await.create_key(create("grp-1")).await.expect("create");
    // uid 65534 with the group as a supplementary group (setgroups), which NSS does not list
    // for nobody: allowed. The same uid without it: denied.
    let gid = KERNEL_ONLY_GID.to_string();
    run_as_nobody_with(&env, "group_member_running_as_nobody", &["--groups", &gid]);
    run_as_nobody_with(&env, "non_member_running_as_nobody", &["--clear-groups"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = std::fs::read_to_string(&audit_path).expect("audit log");
    let entries: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
    let signs = |decision: &str| {
        entries
            .iter()
            .filter(|e| e["uid"] == NOBODY && e["op"] == "sign" && e["decision"] == decision)
            .collect::<Vec<_>>()
    };
    let (allowed, denied) = (signs("allow"), signs("deny"));
    assert!(allowed.len() == 1 && allowed[0]["rule"] == "by-group", "{log}");
    assert_eq!(denied.len(), 1, "{log}");
    // Each record says where the groups came from.
    assert!(allowed.iter().chain(&denied).all(|e| e["groups"] == "SO_PEERGROUPS"), "{log}");
    env.stop().await;
}

/// Runs in the child process as uid 65534 with group 4321; ignored in normal runs.
#[tokio::test]
#[ignore = "helper: run by group_rules_match_the_groups_the_kernel_says_the_peer_has"]
async fn group_member_running_as_nobody() {
    assert!(nix::unistd::getgroups().expect("groups").contains(&nix::unistd::Gid::from_raw(KERNEL_ONLY_GID)));
    let mut c = pb::key_service_client::KeyServiceClient::new(nobody_channel().await);
    c.sign(sign("grp-1")).await.expect("a member of the group signs");
}

/// Runs in the child process as uid 65534 without supplementary groups; ignored in normal runs.
#[tokio::test]
#[ignore = "helper: run by group_rules_match_the_groups_the_kernel_says_the_peer_has"]
async fn non_member_running_as_nobody() {
    let mut c = pb::key_service_client::KeyServiceClient::new(nobody_channel().await);
    denied(c.sign(sign("grp-1")).await, "sign without the group");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_fails_no_request() {
    let tpm = TpmEnv::start();
    let dir = tpm.path().join("policies");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("self.toml"), support::allow_self_policy()).expect("write");
    let access = Arc::new(Access::load(&dir, true, AuditLog::tracing_only()).expect("load"));
    let env = DaemonEnv::start_with(tpm, access.clone()).await;
    let mut c = env.keys().await;
    c.create_key(create("k")).await.expect("create");
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move { c.sign(sign("k")).await.map(|_| ()) }));
    }
    // Two reloads while the requests are in flight: one adds a file, one breaks a file (the old
    // policy must stay in force).
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(
        dir.join("extra.toml"),
        "[[rule]]\nclients = [\"uid:4242\"]\nkeys = [\"x\"]\noperations = [\"sign\"]\n",
    )
    .expect("write");
    assert_eq!(access.reload().expect("reload"), 2);
    std::fs::write(dir.join("broken.toml"), "[[rule]]\nclients = [\"any\"]\noperations = [\"fly\"]\n").expect("write");
    let err = access.reload().expect_err("broken policy is refused");
    assert!(err.to_string().contains("broken.toml"), "{err}");
    assert_eq!(access.current().len(), 2, "the previous policy stays in force");
    let mut failures = Vec::new();
    for t in tasks {
        if let Err(e) = t.await.expect("join") {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{} requests failed, first: {:?}", failures.len(), failures.first());
    env.stop().await;
}

#[test]
fn every_shipped_policy_file_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    for dir in [root.clone(), root.join("examples")] {
        let p = Policy::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.is_empty(), "{} has rules", dir.display());
    }
}
