//! The dictionary-attack guard against a real swtpm: guessing a key's password never drives the
//! TPM into lockout, other password keys keep working, each client and each key has its budget
//! of wrong passwords, the right password resets a client's count, the TPM's last tries stay in
//! reserve, and the metrics show it. The control: with the guard off, the same guesses lock the
//! TPM (and then only keys without a password still sign).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{DaemonEnv, TpmEnv};
use tonic::Code;
use tpm_vault_daemon::daemon::Metrics;
use tpm_vault_daemon::daemon::MetricsSource;
use tpm_vault_daemon::daemon::ServeLimits;
use tpm_vault_daemon::harness::CloseInheritedFds as _;
use tpm_vault_daemon::model::{KeyAlg, SignInput};
use tpm_vault_daemon::{daemon::DaState, TpmError};
use tpm_vault_daemon::{
    daemon::{Client, LockoutConfig, Password},
    SignRequest,
};
use tpm_vault_daemon::{Error, Vault, VaultConfig};
use tpm_vault_proto::v1 as pb;
use zeroize::Zeroizing;

/// Sets the swtpm's dictionary-attack parameters (before the vault connects: swtpm serves one
/// connection at a time). swtpm's own defaults are 3 tries, one forgiven every 1,000 s.
fn set_da_parameters(env: &TpmEnv, max_tries: u32, recovery_secs: u32) {
    let out = std::process::Command::new("tpm2_dictionarylockout")
        .close_inherited_fds()
        .arg("--setup-parameters")
        .arg(format!("--max-tries={max_tries}"))
        .arg(format!("--recovery-time={recovery_secs}"))
        .arg("--lockout-recovery-time=0")
        .args(["-T", &env.swtpm.tcti()])
        .output()
        .expect("tpm2_dictionarylockout (tpm2-tools)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A vault over its own swtpm allowing `max_tries` wrong passwords (one forgiven every 1,000 s;
/// `None`: swtpm's defaults), with the password keys `names`, whose password is "right".
async fn password_vault(max_tries: Option<u32>, names: &[&str]) -> (TpmEnv, Vault) {
    password_vault_with(max_tries, names, LockoutConfig::default()).await
}

/// [`password_vault`] with the guard's settings `lockout`.
async fn password_vault_with(max_tries: Option<u32>, names: &[&str], lockout: LockoutConfig) -> (TpmEnv, Vault) {
    let env = TpmEnv::start();
    if let Some(n) = max_tries {
        set_da_parameters(&env, n, 1000);
    }
    let vault = Vault::open(VaultConfig { lockout, ..env.vault_config() }).await.expect("open vault");
    for name in names {
        let auth = Some(Zeroizing::new(b"right".to_vec()));
        vault.create_key(support::key(name), KeyAlg::EccP256, 0, auth, None).await.expect("create");
    }
    (env, vault)
}

/// The TPM's counter and maximum, read through the daemon's own TPM connection.
async fn da_state(vault: &Vault) -> DaState {
    vault.tpm().call(tpm_vault_daemon::ClientKey::DAEMON, "da", |tpm| tpm.da_state()).await.expect("TPM2_GetCapability")
}

fn create(name: &str, auth: &[u8]) -> pb::CreateKeyRequest {
    pb::CreateKeyRequest { name: name.into(), algorithm: 0, pcr_binding: None, auth: auth.to_vec(), usages: vec![] }
}

/// A daemon over its own swtpm allowing 10 wrong passwords, one forgiven every `recovery_secs`,
/// with the keys "guarded" (password "right"), "other" ("other-password") and "plain" (none),
/// and the guard's settings `lockout`.
async fn daemon_with_keys(
    recovery_secs: u32,
    lockout: LockoutConfig,
) -> (DaemonEnv, pb::key_service_client::KeyServiceClient<tonic::transport::Channel>) {
    let tpm = TpmEnv::start();
    set_da_parameters(&tpm, 10, recovery_secs);
    let vault = Vault::open(VaultConfig { lockout, ..tpm.vault_config() }).await.expect("open vault");
    let env = DaemonEnv::serve(tpm, vault, Arc::new(support::allow_self_access()), ServeLimits::default());
    let mut keys = env.keys().await;
    keys.create_key(create("guarded", b"right")).await.expect("create");
    keys.create_key(create("other", b"other-password")).await.expect("create");
    keys.create_key(create("plain", b"")).await.expect("create");
    (env, keys)
}

fn sign_rpc(name: &str, auth: &[u8]) -> pb::SignRequest {
    pb::SignRequest {
        name: name.into(),
        input: Some(pb::sign_request::Input::Message(b"m".to_vec())),
        hash: 0,
        scheme: 0,
        auth: auth.to_vec(),
        purpose: 0,
    }
}

fn req() -> SignRequest {
    SignRequest { input: SignInput::Message(b"m".to_vec()), hash: None, scheme: None }
}

fn password(client: &Client, p: &[u8]) -> Option<Password> {
    Some(Password::new(client.clone(), Zeroizing::new(p.to_vec())))
}

/// What became of one password attempt at the vault.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Signed,
    WrongPassword,
    Throttled,
    Reserve,
}

async fn try_sign(vault: &Vault, key: &str, client: &Client, p: &[u8]) -> Seen {
    match vault.sign(&support::key(key), req(), password(client, p)).await {
        Ok(_) => Seen::Signed,
        Err(Error::Tpm(TpmError::AuthFailed)) => Seen::WrongPassword,
        Err(Error::Throttled { .. }) => Seen::Throttled,
        Err(Error::Tpm(TpmError::DaReserve { .. })) => Seen::Reserve,
        Err(e) => panic!("unexpected {e:?}"),
    }
}

/// 50 wrong passwords from one client over gRPC: a few reach the TPM, the rest are refused
/// before it; the TPM's counter stays below its maximum and another password key still signs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_wrong_passwords_leave_the_tpm_below_its_limit_and_other_password_keys_working() {
    let (env, mut keys) = daemon_with_keys(1000, LockoutConfig::default()).await;
    let before = da_state(&env.vault).await;
    assert_eq!((before.failures, before.max_tries), (0, 10));
    let (mut reached, mut refused) = (0u32, 0u32);
    let mut message = String::new();
    for i in 0..50 {
        let err = keys.sign(sign_rpc("guarded", format!("guess-{i}").as_bytes())).await.expect_err("wrong password");
        match err.code() {
            Code::Unauthenticated => reached += 1,
            Code::ResourceExhausted => {
                refused += 1;
                message = err.message().to_owned();
            }
            other => panic!("unexpected {other:?}: {}", err.message()),
        }
    }
    let after = da_state(&env.vault).await;
    eprintln!(
        "50 wrong passwords: {reached} reached the TPM, {refused} refused before it; TPM counter {} of {}",
        after.failures, after.max_tries
    );
    // The client's 3 free failures, then refusals; one more attempt gets through after each
    // wait (1 s, then 2 s, ...), which only a slow machine reaches within 50 requests.
    assert!((3..=5).contains(&reached), "{reached} reached the TPM");
    assert_eq!(reached + refused, 50);
    assert!(
        message.starts_with(
            "too many wrong passwords for key guarded (dictionary-attack guard): further attempts are refused for"
        ),
        "{message}"
    );
    assert_eq!(after.failures, reached);
    assert!(after.failures < after.max_tries, "the TPM is not in lockout");
    keys.sign(sign_rpc("other", b"other-password")).await.expect("another password key still signs");
    keys.sign(sign_rpc("plain", b"")).await.expect("a key without a password signs");
    let text = MetricsSource {
        rpc: Arc::new(Metrics::default()),
        vault: env.vault.clone(),
        access: Arc::new(support::allow_self_access()),
    }
    .render()
    .await;
    for want in [
        format!("tpm_vault_da_failures_total {reached}\n"),
        format!("tpm_vault_da_refused_total {refused}\n"),
        format!("tpm_vault_tpm_lockout_counter {reached}\n"),
        "tpm_vault_tpm_lockout_max 10\n".to_owned(),
    ] {
        assert!(text.contains(want.as_str()), "missing {want:?} in\n{text}");
    }
    env.stop().await;
}

/// The control for the test above, and what the guard is for: with it off, the same 50 guesses
/// drive the TPM into lockout. Then every password key is refused (the error says when that
/// ends), while keys without a password (created noDA) still sign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_guard_the_same_guesses_lock_the_tpm() {
    let (env, mut keys) = daemon_with_keys(30, LockoutConfig::disabled()).await;
    let (mut reached, mut locked) = (0, 0);
    for i in 0..50 {
        let err = keys.sign(sign_rpc("guarded", format!("guess-{i}").as_bytes())).await.expect_err("wrong password");
        match err.code() {
            Code::Unauthenticated => reached += 1,
            Code::ResourceExhausted if err.message().contains("dictionary-attack lockout") => locked += 1,
            other => panic!("unexpected {other:?}: {}", err.message()),
        }
    }
    let after = da_state(&env.vault).await;
    eprintln!(
        "guard off, 50 wrong passwords: {reached} reached the TPM, then {locked} refused by its lockout; \
         TPM counter {} of {}",
        after.failures, after.max_tries
    );
    assert_eq!(reached, 10, "every guess reaches the TPM until it locks out");
    assert!(after.failures >= after.max_tries, "the TPM is in lockout: {after:?}");
    // Locked: another key's right password is refused too, with when that ends.
    let err = keys.sign(sign_rpc("other", b"other-password")).await.expect_err("locked out");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("10 failed authorizations, limit 10") && err.message().contains("at most 30 s"),
        "{}",
        err.message()
    );
    keys.sign(sign_rpc("plain", b"")).await.expect("a key without a password is not locked out");
    env.stop().await;
}

/// A fresh swtpm allows 3 tries: the reserve of 2 lets two wrong passwords through, then
/// refuses every password attempt (any client, any key, the right password too) with how many
/// tries are left and when that ends, so the TPM never reaches lockout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tpm_reserve_keeps_a_three_try_tpm_out_of_lockout() {
    let (_env, vault) = password_vault(None, &["guarded"]).await;
    vault.create_key(support::key("plain"), KeyAlg::EccP256, 0, None, None).await.expect("create");
    let a = Client::uid(1000);
    let mut seen = Vec::new();
    for i in 0..50 {
        seen.push(try_sign(&vault, "guarded", &a, format!("guess-{i}").as_bytes()).await);
    }
    assert_eq!(seen.iter().filter(|s| **s == Seen::WrongPassword).count(), 2, "{seen:?}");
    assert_eq!(seen.iter().filter(|s| **s == Seen::Reserve).count(), 48, "{seen:?}");
    let da = da_state(&vault).await;
    assert_eq!((da.failures, da.max_tries), (2, 3), "one try left: not in lockout");
    let err = vault.sign(&support::key("guarded"), req(), password(&Client::uid(1001), b"right")).await;
    let err = err.expect_err("the reserve holds for everyone, the right password included");
    assert!(matches!(err, Error::Tpm(TpmError::DaReserve { failures: 2, max_tries: 3, reserve: 2, .. })), "{err:?}");
    let status = tonic::Status::from(&err);
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("1 of its 3 password tries left"), "{}", status.message());
    assert!(status.message().contains("work again in at most 1000 s"), "{}", status.message());
    vault.sign(&support::key("plain"), req(), None).await.expect("a key without a password signs");
    vault.shutdown(Duration::from_secs(5)).await;
}

/// The right password resets the client's count: after it, three more wrong ones reach the
/// TPM before the client must wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_resets_the_clients_count() {
    let (_env, vault) = password_vault(Some(32), &["k"]).await;
    let a = Client::uid(1000);
    assert_eq!(try_sign(&vault, "k", &a, b"typo").await, Seen::WrongPassword);
    assert_eq!(try_sign(&vault, "k", &a, b"typo").await, Seen::WrongPassword);
    assert_eq!(try_sign(&vault, "k", &a, b"right").await, Seen::Signed);
    for _ in 0..3 {
        assert_eq!(try_sign(&vault, "k", &a, b"guess").await, Seen::WrongPassword, "a whole budget again");
    }
    assert_eq!(try_sign(&vault, "k", &a, b"guess").await, Seen::Throttled);
    assert_eq!(try_sign(&vault, "k", &a, b"right").await, Seen::Throttled, "waiting holds for the right one too");
    assert_eq!(da_state(&vault).await.failures, 5);
    vault.shutdown(Duration::from_secs(5)).await;
}

/// Each client has its own budget on a key, up to the key's budget for all clients together;
/// other keys are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_is_not_throttled_by_the_first_up_to_the_per_key_limit() {
    let (_env, vault) = password_vault(Some(32), &["k", "k2"]).await;
    for uid in [1001, 1002, 1003] {
        let c = Client::uid(uid);
        for _ in 0..3 {
            assert_eq!(try_sign(&vault, "k", &c, b"guess").await, Seen::WrongPassword, "uid {uid}");
        }
        assert_eq!(try_sign(&vault, "k", &c, b"guess").await, Seen::Throttled, "uid {uid}");
    }
    // Nine failures on k: the tenth is the key's last free one, then every client waits.
    let d = Client::uid(1004);
    assert_eq!(try_sign(&vault, "k", &d, b"guess").await, Seen::WrongPassword);
    assert_eq!(try_sign(&vault, "k", &d, b"guess").await, Seen::Throttled, "the key's budget is spent");
    assert_eq!(try_sign(&vault, "k", &Client::uid(1005), b"right").await, Seen::Throttled);
    // Another key: the first client's budget there is whole.
    assert_eq!(try_sign(&vault, "k2", &Client::uid(1001), b"guess").await, Seen::WrongPassword);
    assert_eq!(try_sign(&vault, "k2", &Client::uid(1001), b"right").await, Seen::Signed);
    assert_eq!(da_state(&vault).await.failures, 11);
    vault.shutdown(Duration::from_secs(5)).await;
}

/// Past the budget, one attempt goes through once the wait is over, and its failure doubles
/// the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_starts_at_the_delay_and_doubles() {
    let lockout = LockoutConfig {
        delay: Duration::from_millis(300),
        max_delay: Duration::from_secs(10),
        ..LockoutConfig::default()
    };
    let (_env, vault) = password_vault_with(Some(32), &["k"], lockout).await;
    let a = Client::uid(1000);
    let wait = |r: Result<_, Error>| match r {
        Err(Error::Throttled { wait, .. }) => wait,
        other => panic!("expected a wait, got {other:?}"),
    };
    for _ in 0..3 {
        assert_eq!(try_sign(&vault, "k", &a, b"guess").await, Seen::WrongPassword);
    }
    let first = wait(vault.sign(&support::key("k"), req(), password(&a, b"guess")).await);
    assert!(first <= Duration::from_millis(300), "{first:?}");
    tokio::time::sleep(first).await;
    assert_eq!(try_sign(&vault, "k", &a, b"guess").await, Seen::WrongPassword, "one attempt after the wait");
    let failed_at = Instant::now();
    let second = wait(vault.sign(&support::key("k"), req(), password(&a, b"guess")).await);
    assert!(second <= Duration::from_millis(600) && second > Duration::from_millis(300), "doubled: {second:?}");
    tokio::time::sleep(Duration::from_millis(600).saturating_sub(failed_at.elapsed())).await;
    assert_eq!(try_sign(&vault, "k", &a, b"right").await, Seen::Signed);
    assert_eq!(try_sign(&vault, "k", &a, b"guess").await, Seen::WrongPassword, "the budget is whole again");
    vault.shutdown(Duration::from_secs(5)).await;
}

/// 50 concurrent guesses from one client: attempts in flight count against the budget, so no
/// more than the budget reach the TPM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_guesses_do_not_slip_past_the_budget() {
    let (_env, vault) = password_vault(Some(32), &["k"]).await;
    let a = Client::uid(1000);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let (vault, a) = (vault.clone(), a.clone());
        tasks.spawn(async move { try_sign(&vault, "k", &a, format!("guess-{i}").as_bytes()).await });
    }
    let seen = tasks.join_all().await;
    let reached = seen.iter().filter(|s| **s == Seen::WrongPassword).count();
    assert_eq!(reached, 3, "{seen:?}");
    assert_eq!(seen.iter().filter(|s| **s == Seen::Throttled).count(), 47, "{seen:?}");
    assert_eq!(da_state(&vault).await.failures, 3);
    vault.shutdown(Duration::from_secs(5)).await;
}
