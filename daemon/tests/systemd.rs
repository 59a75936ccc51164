//! The systemd integration, checked with systemd's own tools: every unit passes
//! `systemd-analyze verify`, the service's exposure score is at most 2.0, sysusers.d and
//! tmpfiles.d files apply to a scratch root, socket activation (`systemd-socket-activate`)
//! serves requests with the client's peer credentials, and watchdog keep-alives stop while the
//! TPM actor is stuck. Tests that need a systemd tool skip (with a note) when it is missing.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tpm_vault_daemon::harness::CloseInheritedFds as _;

use nix::sys::signal::Signal;
use support::{send_signal, wait_exit, KillOnDrop, ProcEnv};
use tpm_vault_proto::v1 as pb;

/// The installed location of the daemon that units reference.
const INSTALLED_BINARY: &str = "/usr/bin/tpm-vaultd";
/// Env var that turns [`peer_credentials_helper`] on.
const HELPER_SOCKET: &str = "TPM_VAULT_TEST_PEER_SOCKET";
/// The uid the helper client runs as when the tests run as root (`nobody`).
const OTHER_UID: u32 = 65534;

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd")
}

fn unit_files() -> Vec<PathBuf> {
    let mut units: Vec<PathBuf> = std::fs::read_dir(units_dir())
        .expect("systemd/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "service" || x == "socket" || x == "timer"))
        .collect();
    units.sort();
    units
}

fn have(tool: &str) -> bool {
    let found = Command::new(tool).close_inherited_fds().arg("--version").output().is_ok();
    if !found {
        eprintln!("SKIPPED: {tool} not installed (apt-get install systemd)");
    }
    found
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

#[test]
fn every_unit_passes_systemd_analyze_verify() {
    if !have("systemd-analyze") {
        return;
    }
    // verify checks that ExecStart= exists: point it at the binary under test, change nothing else.
    let dir = tempfile::tempdir().expect("tempdir");
    let units = unit_files();
    assert!(units.len() >= 2, "{units:?}");
    let mut names = Vec::new();
    for unit in &units {
        let text = std::fs::read_to_string(unit).expect("read unit");
        let name = unit.file_name().expect("name").to_owned();
        if name == "tpm-vaultd.service" {
            assert!(
                text.lines().any(|l| l == format!("ExecStart={INSTALLED_BINARY}")),
                "the unit runs {INSTALLED_BINARY}"
            );
        }
        // The CLI (the SSH agent's unit) is another crate's binary: any executable will do for
        // verify, which only checks that ExecStart= names one.
        let this_test = std::env::current_exe().expect("test binary");
        let text = text
            .replace(INSTALLED_BINARY, env!("CARGO_BIN_EXE_tpm-vaultd"))
            .replace("/usr/bin/tpm-vault ", &format!("{} ", this_test.display()));
        std::fs::write(dir.path().join(&name), text).expect("write unit");
        names.push(dir.path().join(&name));
    }
    let out = Command::new("systemd-analyze")
        .close_inherited_fds()
        .arg("verify")
        .arg("--man=no")
        .args(&names)
        .current_dir(dir.path())
        .output()
        .expect("systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("tpm-vault")).collect();
    assert!(out.status.success() && ours.is_empty(), "{stderr}");
}

#[test]
fn service_exposure_is_at_most_2() {
    if !have("systemd-analyze") {
        return;
    }
    let out = Command::new("systemd-analyze")
        .close_inherited_fds()
        .args(["security", "--offline=true", "--no-pager"])
        .arg(units_dir().join("tpm-vaultd.service"))
        .output()
        .expect("systemd-analyze security");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let score: f64 = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for tpm-vaultd.service:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no exposure score in:\n{text}"));
    eprintln!("tpm-vaultd.service exposure: {score}");
    assert!(score <= 2.0, "exposure {score} > 2.0:\n{text}");
}

#[test]
fn service_unit_has_the_contracted_settings() {
    let text = std::fs::read_to_string(units_dir().join("tpm-vaultd.service")).expect("unit");
    let settings: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.starts_with('#') && l.contains('=')).collect();
    for want in [
        "Type=notify",
        "User=tpm-vault",
        "SupplementaryGroups=tss",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/tpmrm0 rw",
        "StateDirectory=tpm-vault",
        "RuntimeDirectory=tpm-vault",
        "ConfigurationDirectory=tpm-vault",
        "Environment=TPM_VAULT_TCTI=device:/dev/tpmrm0",
        "Requires=tpm-vaultd.socket",
        "MemoryHigh=384M",
        "MemoryMax=512M",
    ] {
        assert!(settings.contains(&want), "missing {want}");
    }
    assert!(settings.iter().any(|l| l.starts_with("WatchdogSec=")));
    assert!(!settings.iter().any(|l| l.starts_with("PrivateDevices=")), "PrivateDevices hides /dev/tpmrm0");
    let socket = std::fs::read_to_string(units_dir().join("tpm-vaultd.socket")).expect("socket");
    for want in ["ListenStream=/run/tpm-vault/vault.sock", "SocketMode=0660", "SocketGroup=tpm-vault"] {
        assert!(socket.lines().any(|l| l.trim() == want), "missing {want}");
    }
}

#[test]
fn sysusers_and_tmpfiles_apply_to_a_scratch_root() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to create users and chown in a scratch root");
        return;
    }
    if !have("systemd-sysusers") || !have("systemd-tmpfiles") {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(root.path().join("etc")).expect("etc");
    let sysusers = units_dir().join("sysusers.d/tpm-vault.conf");
    let out = Command::new("systemd-sysusers")
        .close_inherited_fds()
        .arg(format!("--root={}", root.path().display()))
        .arg(&sysusers)
        .output()
        .expect("systemd-sysusers");
    assert!(out.status.success(), "{out:?}");
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).expect("passwd");
    let group = std::fs::read_to_string(root.path().join("etc/group")).expect("group");
    let user =
        passwd.lines().find(|l| l.starts_with("tpm-vault:")).unwrap_or_else(|| panic!("no tpm-vault user:\n{passwd}"));
    assert!(user.ends_with(":/var/lib/tpm-vault:/usr/sbin/nologin"), "{user}");
    assert!(group.lines().any(|l| l.starts_with("tpm-vault:")), "{group}");
    // The default policy's administrators (issue #31): a group of its own, created empty.
    assert!(group.lines().any(|l| l.starts_with("tpm-vault-admin:") && l.ends_with(':')), "{group}");
    assert!(
        group.lines().any(|l| l.starts_with("tss:") && l.ends_with(":tpm-vault")),
        "tpm-vault must be a member of tss:\n{group}"
    );
    let tmpfiles = units_dir().join("tmpfiles.d/tpm-vault.conf");
    let out = Command::new("systemd-tmpfiles")
        .close_inherited_fds()
        .arg(format!("--root={}", root.path().display()))
        .arg("--create")
        .arg(&tmpfiles)
        .output()
        .expect("systemd-tmpfiles");
    assert!(out.status.success(), "{out:?}");
    for (dir, mode) in [
        ("var/lib/tpm-vault", 0o700),
        ("run/tpm-vault", 0o750),
        ("var/log/tpm-vault", 0o750),
        ("etc/tpm-vault/policies", 0o755),
    ] {
        let meta = std::fs::metadata(root.path().join(dir)).expect(dir);
        assert_eq!(meta.permissions().mode() & 0o7777, mode, "{dir}");
    }
}

/// Runs the daemon the way tpm-vaultd.socket does (`systemd-socket-activate -l PATH`): it
/// starts on the first connection, takes the socket from `LISTEN_FDS`, serves it, and sees each
/// client's uid through SO_PEERCRED. As root, a second client runs as `nobody` and must own
/// what it creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activation_serves_with_peer_credentials() {
    if !have("systemd-socket-activate") {
        return;
    }
    let mut env = ProcEnv::new();
    let mut cmd = Command::new("systemd-socket-activate");
    cmd.close_inherited_fds();
    cmd.arg("-l").arg(&env.socket);
    for var in ["NOTIFY_SOCKET", "TSS2_LOG", "RUST_LOG"] {
        cmd.arg("-E").arg(var);
    }
    cmd.arg(env!("CARGO_BIN_EXE_tpm-vaultd")).args(env.args());
    env.child_env(&mut cmd);
    let mut child = KillOnDrop(cmd.spawn().expect("spawn systemd-socket-activate"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !env.socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(env.socket.exists(), "systemd-socket-activate did not bind");
    // Nothing runs before the first connection.
    env.read_notes(Duration::from_millis(200));
    assert!(env.notes.is_empty(), "{:?}", env.notes);

    let mut keys = env.keys().await;
    let mine = tokio::time::timeout(
        Duration::from_secs(60),
        keys.create_key(pb::CreateKeyRequest {
            name: "mine".into(),
            algorithm: 0,
            pcr_binding: None,
            auth: vec![],
            usages: vec![],
        }),
    )
    .await
    .expect("create in time")
    .unwrap_or_else(|e| panic!("create: {e:?}; stderr:\n{}", env.stderr()))
    .into_inner();
    let me = nix::unistd::getuid().as_raw();
    assert_eq!(mine.owner_uid, me);
    assert!(env.wait_note("READY=1", Duration::from_secs(5)), "{:?}", env.notes);
    // Log lines are written by a background thread: give it a moment to catch up.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !env.stderr().contains("socket activation") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stderr = env.stderr();
    assert!(stderr.contains("socket activation"), "{stderr}");

    if is_root() {
        // uid 0 is also what a missing credential would give: prove it with another uid.
        std::fs::set_permissions(env.tpm.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .close_inherited_fds()
            .args(["--exact", "peer_credentials_helper", "--ignored", "--nocapture", "--test-threads=1"])
            .env(HELPER_SOCKET, &env.socket)
            .uid(OTHER_UID)
            .gid(OTHER_UID)
            .output()
            .expect("run helper as nobody");
        assert!(
            out.status.success(),
            "helper failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = keys.get_key(pb::GetKeyRequest { name: "theirs".into() }).await.expect("get key").into_inner();
        assert_eq!(theirs.owner_uid, OTHER_UID);
    }
    let again = keys.get_key(pb::GetKeyRequest { name: "mine".into() }).await.expect("get key").into_inner();
    assert_eq!(again.owner_uid, me);

    drop(keys);
    send_signal(&child.0, Signal::SIGTERM);
    let status = wait_exit(&mut child.0, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", env.stderr());
    assert!(env.wait_note("STOPPING=1", Duration::from_secs(1)));
}

/// Client half of [`socket_activation_serves_with_peer_credentials`]: run by that test as
/// another uid; does nothing when run any other way.
#[test]
#[ignore = "helper process for socket_activation_serves_with_peer_credentials"]
fn peer_credentials_helper() {
    let Some(socket) = std::env::var_os(HELPER_SOCKET) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", Path::new(&socket).display()))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect as another uid");
        let mut keys = pb::key_service_client::KeyServiceClient::new(channel);
        let key = keys
            .create_key(pb::CreateKeyRequest {
                name: "theirs".into(),
                algorithm: 0,
                pcr_binding: None,
                auth: vec![],
                usages: vec![],
            })
            .await
            .expect("create as another uid")
            .into_inner();
        assert_eq!(key.owner_uid, nix::unistd::getuid().as_raw());
    });
}

/// `WATCHDOG=1` follows the TPM actor: sent while it answers, withheld while it is stuck inside
/// a TPM command (the swtpm is stopped with SIGSTOP mid-command), resumed when it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keepalives_follow_the_tpm_actor() {
    let mut env = ProcEnv::new();
    let mut cmd = env.command();
    cmd.env("WATCHDOG_USEC", "1000000").args(["--tpm-timeout-ms", "2000"]);
    let mut child = KillOnDrop(cmd.spawn().expect("spawn tpm-vaultd"));
    assert!(env.wait_note("READY=1", Duration::from_secs(60)), "stderr:\n{}", env.stderr());
    assert!(env.wait_note("WATCHDOG=1", Duration::from_secs(3)), "no keep-alive while healthy: {:?}", env.notes);
    let mut keys = env.keys().await;
    keys.create_key(pb::CreateKeyRequest {
        name: "wd".into(),
        algorithm: 0,
        pcr_binding: None,
        auth: vec![],
        usages: vec![],
    })
    .await
    .expect("create");

    let swtpm_pid: i32 = std::fs::read_to_string(env.tpm.path().join("swtpm/swtpm.pid"))
        .expect("swtpm pid file")
        .trim()
        .parse()
        .expect("pid");
    let swtpm = nix::unistd::Pid::from_raw(swtpm_pid);
    nix::sys::signal::kill(swtpm, Signal::SIGSTOP).expect("SIGSTOP swtpm");
    // A command now blocks the actor inside the TPM.
    let mut stuck = keys.clone();
    let sign = tokio::spawn(async move {
        stuck
            .sign(pb::SignRequest {
                name: "wd".into(),
                input: Some(pb::sign_request::Input::Message(b"stuck".to_vec())),
                hash: 0,
                scheme: 0,
                auth: vec![],
                purpose: 0,
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.read_notes(Duration::from_millis(10));
    let before = env.notes.len();
    // Three watchdog half-periods with the actor stuck: no keep-alive may arrive.
    let quiet_until = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < quiet_until {
        env.read_notes(Duration::from_millis(100));
    }
    let during: Vec<&String> = env.notes[before..].iter().collect();
    nix::sys::signal::kill(swtpm, Signal::SIGCONT).expect("SIGCONT swtpm");
    assert!(!during.iter().any(|l| *l == "WATCHDOG=1"), "keep-alive sent while the actor was stuck: {during:?}");
    assert!(
        env.wait_note("WATCHDOG=1", Duration::from_secs(5)),
        "keep-alives did not resume; stderr:\n{}",
        env.stderr()
    );
    let _ = sign.await.expect("sign task");
    assert!(env.stderr().contains("withholding WATCHDOG=1"), "{}", env.stderr());
    drop(keys);
    send_signal(&child.0, Signal::SIGTERM);
    let status = wait_exit(&mut child.0, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", env.stderr());
}

/// Every file `cargo deb -p tpm-vault-daemon` packages exists, and every unit, sysusers.d and
/// tmpfiles.d file and the example config are packaged where systemd looks for them: the system
/// units through `systemd-units` (cargo-deb finds them by `unit-name` and writes the steps that
/// enable and start them), the user units as assets. The changelog's version is the crate's, and
/// the postinst keeps the `#DEBHELPER#` token cargo-deb replaces. (`scripts/package-check`
/// builds the package itself, runs lintian and installs it into a scratch root.)
#[test]
fn deb_package_assets_exist_and_cover_the_units() {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest: toml::Table =
        std::fs::read_to_string(manifest_dir.join("Cargo.toml")).expect("Cargo.toml").parse().expect("toml");
    let deb = manifest
        .get("package")
        .and_then(|p| p.get("metadata"))
        .and_then(|m| m.get("deb"))
        .expect("[package.metadata.deb]");
    let text = |key: &str| deb.get(key).and_then(|v| v.as_str()).unwrap_or_else(|| panic!("{key}"));
    assert_eq!(text("name"), "tpm-vault");
    assert_eq!(text("profile"), "deb");
    let assets = deb.get("assets").and_then(|a| a.as_array()).expect("assets");
    let mut packaged = Vec::new();
    for asset in assets {
        let fields: Vec<&str> =
            asset.as_array().expect("[src, dest, mode]").iter().filter_map(|v| v.as_str()).collect();
        let [src, dest, mode] = fields[..] else { panic!("asset {asset:?}") };
        assert!(mode == "644" || mode == "755", "{asset:?}");
        match src.strip_prefix("target/release/") {
            Some(bin) => assert!(["tpm-vaultd", "tpm-vault", "libtpm_vault_pkcs11.so"].contains(&bin), "{src}"),
            // A glob (the man pages, `dir/*.ext`) must match at least one file.
            None => match src.rsplit_once("/*") {
                Some((dir, ext)) => {
                    let matched = std::fs::read_dir(manifest_dir.join(dir))
                        .unwrap_or_else(|e| panic!("asset {src}: {e}"))
                        .filter_map(Result::ok)
                        .any(|e| e.path().is_file() && e.file_name().to_string_lossy().ends_with(ext));
                    assert!(matched, "asset {src} matches no file");
                }
                None => assert!(manifest_dir.join(src).is_file(), "missing asset {src}"),
            },
        }
        packaged.push((src.trim_start_matches("../").to_owned(), dest.to_owned()));
    }
    for (src, dest) in [
        ("systemd/tpm-vault-acme-renew.service", "usr/lib/systemd/system/"),
        ("systemd/tpm-vault-acme-renew.timer", "usr/lib/systemd/system/"),
        ("systemd/sysusers.d/tpm-vault.conf", "usr/lib/sysusers.d/"),
        ("systemd/tmpfiles.d/tpm-vault.conf", "usr/lib/tmpfiles.d/"),
        ("systemd/config.toml", "etc/tpm-vault/config.toml"),
        ("policies/default.toml", "etc/tpm-vault/policies/default.toml"),
        ("target/release/tpm-vaultd", "usr/bin/"),
        ("target/release/tpm-vault", "usr/bin/"),
        ("target/release/libtpm_vault_pkcs11.so", "usr/lib/x86_64-linux-gnu/pkcs11/"),
        ("pkcs11/tpm-vault.module", "usr/share/p11-kit/modules/"),
        ("debian/lintian-overrides", "usr/share/lintian/overrides/tpm-vault"),
    ] {
        assert!(packaged.iter().any(|(s, d)| s == src && d == dest), "{src} -> {dest} not packaged");
    }

    // cargo-deb installs `<unit-name>.<type>` from `unit-scripts` into /usr/lib/systemd/system.
    let units = deb.get("systemd-units").and_then(|u| u.as_array()).expect("systemd-units = [...]");
    let mut by_cargo_deb = Vec::new();
    for entry in units {
        let name = entry.get("unit-name").and_then(|n| n.as_str()).expect("unit-name");
        let dir = entry.get("unit-scripts").and_then(|d| d.as_str()).expect("unit-scripts");
        for unit in unit_files() {
            let file = unit.file_name().expect("name").to_string_lossy().into_owned();
            if file.rsplit_once('.').is_some_and(|(stem, _)| stem == name) {
                assert_eq!(manifest_dir.join(dir).join(&file).canonicalize().ok(), unit.canonicalize().ok());
                by_cargo_deb.push(format!("systemd/{file}"));
            }
        }
    }
    assert!(by_cargo_deb.contains(&"systemd/tpm-vaultd.service".to_owned()), "{by_cargo_deb:?}");
    assert!(by_cargo_deb.contains(&"systemd/tpm-vaultd.socket".to_owned()), "{by_cargo_deb:?}");
    for unit in unit_files() {
        let name = format!("systemd/{}", unit.file_name().expect("name").to_string_lossy());
        let as_asset = packaged.iter().any(|(s, _)| *s == name);
        assert!(
            as_asset != by_cargo_deb.contains(&name),
            "{name}: packaged {} (once, either by systemd-units or as an asset)",
            if as_asset { "twice" } else { "not at all" }
        );
    }

    let scripts = manifest_dir.join(text("maintainer-scripts"));
    let postinst = std::fs::read_to_string(scripts.join("postinst")).expect("debian/postinst");
    assert!(postinst.contains("#DEBHELPER#"), "postinst lost the #DEBHELPER# token");
    let changelog = std::fs::read_to_string(manifest_dir.join(text("changelog"))).expect("debian/changelog");
    let top = changelog.lines().next().unwrap_or_default();
    let revision = text("revision");
    let version = format!("{}-{revision}", env!("CARGO_PKG_VERSION"));
    assert!(
        top.starts_with(&format!("tpm-vault ({version}) ")),
        "debian/changelog's newest entry {top:?} is not for version {version}"
    );
    // NEWS.Debian (shipped compressed) is debian/NEWS, and its newest entry is this version.
    let news = std::fs::read_to_string(scripts.join("NEWS")).expect("debian/NEWS");
    assert!(news.starts_with(&format!("tpm-vault ({version}) ")), "debian/NEWS's newest entry is not {version}");
    let out = Command::new("gzip")
        .arg("-dc")
        .arg(scripts.join("NEWS.Debian.gz"))
        .output()
        .expect("gzip -dc debian/NEWS.Debian.gz");
    assert!(
        out.status.success() && out.stdout == news.as_bytes(),
        "debian/NEWS.Debian.gz is not debian/NEWS: gzip -9n < debian/NEWS > debian/NEWS.Debian.gz"
    );
    assert!(packaged.iter().any(|(s, d)| s == "debian/NEWS.Debian.gz" && d.ends_with("/NEWS.Debian.gz")));
    for script in ["preinst", "postrm"] {
        let text = std::fs::read_to_string(scripts.join(script)).unwrap_or_else(|e| panic!("debian/{script}: {e}"));
        assert!(text.contains("#DEBHELPER#"), "{script} lost the #DEBHELPER# token");
    }
}

/// The kernel's event log file (securityfs, mode 0440 root on a real device).
const SYSFS_EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// GetEventLog works under the shipped unit although the service runs unprivileged and the
/// kernel's log is readable by root only: the unit's privileged `ExecStartPre=` copies it into
/// the runtime directory for the service's group, and its `Environment=` points the daemon at
/// the copy. Played here with a root-only file standing in for the securityfs one, the unit's
/// own command line (paths moved into a temp dir, `%g` the service's group), and the daemon run
/// as uid/gid 65534. Before, the unit had neither line and the daemon read the root-only file
/// itself: permission denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_log_reaches_the_unprivileged_service_under_the_unit() {
    use std::os::unix::fs::chown;
    if !is_root() {
        eprintln!("SKIPPED: needs root (a root-only file and a daemon run as another uid)");
        return;
    }
    let unit = std::fs::read_to_string(units_dir().join("tpm-vaultd.service")).expect("unit");
    let setting = |key: &str| -> String {
        unit.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("the unit has no {key}"))
            .to_owned()
    };
    let pre = setting("ExecStartPre=");
    let copy = pre.trim_start_matches(['-', '+']);
    assert!(pre.len() - copy.len() == 2 && pre.contains('+'), "the copy runs privileged and may fail: {pre}");
    let env_line = setting("Environment=TPM_VAULT_EVENT_LOG=");

    let mut env = ProcEnv::new();
    let root_dir = env.tpm.path().to_owned();
    let run = root_dir.join("run/tpm-vault");
    let standin = root_dir.join("securityfs/binary_bios_measurements");
    std::fs::create_dir_all(&run).expect("runtime dir");
    std::fs::create_dir_all(standin.parent().expect("parent")).expect("securityfs dir");
    let log: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(&standin, &log).expect("stand-in log");
    // The stand-in log stays root's, mode 0440.
    hand_to_service_user(&root_dir);
    chown(&standin, Some(0), Some(0)).expect("chown stand-in");
    std::fs::set_permissions(&standin, std::fs::Permissions::from_mode(0o440)).expect("chmod stand-in");
    let read_as_service = |path: &Path| {
        Command::new("cat").close_inherited_fds().arg(path).uid(OTHER_UID).gid(OTHER_UID).output().expect("cat")
    };
    assert!(!read_as_service(&standin).status.success(), "the stand-in must be unreadable for the service");

    let moved = |s: &str| {
        s.replace(SYSFS_EVENT_LOG, &standin.display().to_string())
            .replace("/run/tpm-vault", &run.display().to_string())
            .replace("%g", &OTHER_UID.to_string())
    };
    let out = Command::new("sh").close_inherited_fds().args(["-c", &moved(copy)]).output().expect("run the copy");
    assert!(out.status.success(), "the unit's copy failed: {}", String::from_utf8_lossy(&out.stderr));
    let served = moved(&env_line);
    assert_eq!(read_as_service(Path::new(&served)).stdout, log, "the copy is not readable by the service");

    let mut cmd = env.command();
    cmd.env("TPM_VAULT_EVENT_LOG", &served).uid(OTHER_UID).gid(OTHER_UID);
    let mut child = KillOnDrop(cmd.spawn().expect("spawn the daemon"));
    assert!(env.wait_note("READY=1", Duration::from_secs(60)), "no READY=1; stderr:\n{}", env.stderr());
    let mut attest = pb::attestation_service_client::AttestationServiceClient::new(env.channel().await);
    let got = attest
        .get_event_log(pb::GetEventLogRequest {})
        .await
        .unwrap_or_else(|e| panic!("GetEventLog: {e:?}; stderr:\n{}", env.stderr()))
        .into_inner();
    assert_eq!(got.log, log);
    drop(attest);
    send_signal(&child.0, Signal::SIGTERM);
    assert_eq!(wait_exit(&mut child.0, Duration::from_secs(30)).code(), Some(0), "stderr:\n{}", env.stderr());
}

/// Gives `dir` (a [`ProcEnv`]'s temp dir) to uid/gid [`OTHER_UID`], as systemd gives the state
/// and runtime directories to the service's user, so the daemon can run as that uid.
fn hand_to_service_user(dir: &Path) {
    let chown_tree = Command::new("chown").args(["-R", &format!("{OTHER_UID}:{OTHER_UID}")]).arg(dir).status();
    assert!(chown_tree.expect("chown").success());
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
}

/// A daemon that may not open the TPM device says why and what fixes it: the device's mode and
/// owner, its own uid and gid, and the `tss` group (the unit's SupplementaryGroups=tss, the
/// udev rule). Played with a root-only file standing in for /dev/tpmrm0 and the daemon as uid
/// 65534. Before, the message was tpm2-tss's bare "IO failure".
#[test]
fn a_tpm_device_the_service_may_not_open_is_explained() {
    use std::os::unix::fs::chown;
    if !is_root() {
        eprintln!("SKIPPED: needs root (a root-only device stand-in and a daemon run as another uid)");
        return;
    }
    let env = ProcEnv::new();
    let root_dir = env.tpm.path().to_owned();
    hand_to_service_user(&root_dir);
    let device = root_dir.join("tpmrm0");
    std::fs::write(&device, b"").expect("stand-in device");
    chown(&device, Some(0), Some(0)).expect("chown");
    std::fs::set_permissions(&device, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let tcti = format!("device:{}", device.display());
    let args: Vec<String> =
        env.args().into_iter().map(|a| if a == env.tpm.swtpm.tcti() { tcti.clone() } else { a }).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tpm-vaultd"));
    cmd.close_inherited_fds().args(&args);
    env.child_env(&mut cmd);
    cmd.uid(OTHER_UID).gid(OTHER_UID);
    let mut child = KillOnDrop(cmd.spawn().expect("spawn the daemon"));
    let status = wait_exit(&mut child.0, Duration::from_secs(60));
    let stderr = env.stderr();
    assert!(!status.success(), "the daemon started on a device it may not open: {stderr}");
    for want in ["may not read and write it", "mode 600", "uid 0 gid 0", "uid 65534, gid 65534", "tss"] {
        assert!(stderr.contains(want), "{want:?} missing in:\n{stderr}");
    }
}
