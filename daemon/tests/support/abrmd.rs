//! tpm2-abrmd, the user-space resource manager, as a stand-in for the kernel's `/dev/tpmrm0`:
//! swtpm ← counting proxy ← tpm2-abrmd (per-client limits, e.g. 3 transient objects) ← the
//! vault (TCTI `tabrmd:bus_name=NAME,bus_type=session`).
//!
//! The tabrmd TCTI reaches the daemon through GLib's shared session-bus connection, which is
//! made once per process from `DBUS_SESSION_BUS_ADDRESS`: so one private `dbus-daemon` serves
//! the whole test binary (started on first use), and each [`Abrmd`] owns its own bus name.
//! Both children run under a shell that kills them when the test process's pipe to it closes
//! (on drop, or when the test process dies), so none outlives the tests.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tpm_vault_daemon::harness::CloseInheritedFds as _;

use super::proxy::TpmProxy;
use super::TpmEnv;

/// The test binary's private session bus (address), started once.
static BUS: OnceLock<Tied> = OnceLock::new();
/// Bus names handed out in this process.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A child process that dies with its pipe from this process.
struct Tied {
    child: Child,
    stdin: ChildStdin,
    first_line: String,
}

/// Runs `program args` under `sh`, which kills it when its stdin (held by [`Tied`]) closes.
fn tied(program: &str, args: &[String], envs: &[(&str, &str)], stdout: Stdio) -> Tied {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    let script = format!("{program} {} & pid=$!; read _ ; kill $pid 2>/dev/null; wait $pid", quoted.join(" "));
    let mut cmd = Command::new("sh");
    cmd.close_inherited_fds().args(["-c", &script]).stdin(Stdio::piped()).stdout(stdout).stderr(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {program}: {e}"));
    let stdin = child.stdin.take().expect("stdin");
    Tied { child, stdin, first_line: String::new() }
}

/// The private session bus's address, starting `dbus-daemon` on first use, and pointing this
/// process's `DBUS_SESSION_BUS_ADDRESS` at it.
fn bus() -> &'static str {
    &BUS.get_or_init(|| {
        let mut bus = tied(
            "dbus-daemon",
            &["--session".into(), "--nofork".into(), "--print-address=1".into()],
            &[],
            Stdio::piped(),
        );
        let stdout = bus.child.stdout.take().expect("dbus-daemon stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("dbus-daemon address");
        let address = line.trim().to_owned();
        assert!(!address.is_empty(), "dbus-daemon printed no address");
        // Set before any tabrmd TCTI is opened in this process (GLib reads it once).
        std::env::set_var("DBUS_SESSION_BUS_ADDRESS", &address);
        bus.first_line = address;
        bus
    })
    .first_line
}

/// tpm2-abrmd in front of a test's swtpm, behind a counting proxy.
pub struct Abrmd {
    /// Counts the commands abrmd sends to the TPM (its own ContextLoad/Save/Flush included).
    pub proxy: TpmProxy,
    bus_name: String,
    daemon: Tied,
}

impl Abrmd {
    /// Starts the proxy in front of `tpm`'s swtpm and tpm2-abrmd with at most `transients` transient objects and
    /// `sessions` sessions per client, and waits until a client can connect.
    pub fn start(tpm: &TpmEnv, transients: u32, sessions: u32) -> Self {
        let address = bus().to_owned();
        let proxy = TpmProxy::start(tpm.swtpm.port());
        let bus_name = format!("com.intel.tss2.Tabrmd.t{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let args = vec![
            "--allow-root".to_owned(),
            "--session".to_owned(),
            format!("--dbus-name={bus_name}"),
            format!("--max-transients={transients}"),
            format!("--max-sessions={sessions}"),
            "--flush-all".to_owned(),
            format!("--tcti={}", proxy.tcti()),
        ];
        let daemon = tied("/usr/sbin/tpm2-abrmd", &args, &[("DBUS_SESSION_BUS_ADDRESS", &address)], Stdio::null());
        let abrmd = Self { proxy, bus_name, daemon };
        abrmd.wait_ready(Duration::from_secs(20));
        abrmd
    }

    /// The vault's TCTI string.
    pub fn tcti(&self) -> String {
        format!("tabrmd:bus_name={},bus_type=session", self.bus_name)
    }

    fn wait_ready(&self, timeout: Duration) {
        use std::str::FromStr;
        let deadline = Instant::now() + timeout;
        loop {
            let tcti = tss_esapi::tcti_ldr::TctiNameConf::from_str(&self.tcti()).expect("tcti");
            if tss_esapi::Context::new(tcti).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "tpm2-abrmd did not come up on {}", self.bus_name);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Abrmd {
    fn drop(&mut self) {
        // Closing the pipe makes the shell kill tpm2-abrmd; say so explicitly too.
        let _ = self.daemon.stdin.write_all(b"\n");
        let _ = self.daemon.child.wait();
    }
}
