//! Renders a [`Summary`] as the markdown report (`docs/BENCHMARKS.md`) and as the table
//! printed on the terminal.

use std::fmt::Write as _;
use std::time::Duration;

use crate::machine::Machine;
use crate::sign::actor::CALLERS as ACTOR_CALLERS;
use crate::sign::tools::{Variant, SRK_COMMAND};
use crate::sign::Timing;
use crate::stats::Spread;
use crate::summary::{Figure, OpRow, ScaleRow, SignRow, Summary, CEILING_SLACK, DAEMON_GOAL_CLIENTS};
use crate::table::{num, spread, Align, Cell, Ratio, Table};

/// How the run was made, for the report's header.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The exact command line.
    pub command: String,
    /// Quick (smoke test) mode.
    pub quick: bool,
    /// Warm-up and window of every phase.
    pub timing: Timing,
    /// Raw ESAPI and the library: alternating slices per round, and each slice's timing.
    pub slices: usize,
    /// See `slices`.
    pub slice: Timing,
    /// Daemon concurrency levels.
    pub levels: Vec<usize>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
    /// Wall time of the rounds alone (no builds, no set-up).
    pub measuring: Duration,
    /// File name of the chart, relative to the markdown.
    pub chart: String,
    /// Whether tpm2-tools ran.
    pub tools: bool,
    /// Warnings gathered during the run (leftover TPM objects, skipped phases).
    pub notes: Vec<String>,
    /// `RUST_LOG` the daemon ran with.
    pub daemon_rust_log: String,
    /// Load averages when the run ended.
    pub load_end: String,
    /// The TLS handshake section ([`crate::tls::markdown`]); empty when it did not run.
    pub tls_section: String,
    /// The PKCS#11 section ([`crate::p11_report::markdown`]); empty when it did not run.
    pub pkcs11_section: String,
    /// Warm-up and window of the phases beyond signing.
    pub short: Timing,
    /// Key sets: keys, how long writing them took, and one record through the atomic writer.
    pub key_sets: Vec<(usize, Duration, Duration)>,
    /// Mean time of creating one key in the TPM (`Vault::create_key`), if the run created any.
    pub key_creation: Option<Duration>,
    /// How long creating each key of the algorithm phase took (once per run, untimed there).
    pub algs_created: Vec<(String, Duration)>,
    /// The census and device-model sections ([`crate::device::markdown`]).
    pub device_section: String,
}

/// The line after which hand-written sections of the report live; regenerating keeps them.
pub const KEEP_MARKER: &str =
    "<!-- Hand-written sections below this line are not generated; tpm-vault-bench keeps them. -->";

/// The hand-written tail of an existing report (from [`KEEP_MARKER`] to the end), if any.
pub fn kept_tail(old: &str) -> Option<&str> {
    old.find(KEEP_MARKER).map(|i| &old[i..])
}

/// The ratio and peer cells of `ratio`, or `none` (ratio text, peer text) without one.
fn ratio_cells(ratio: Option<&Ratio>, none: (&str, &str)) -> [Cell; 2] {
    match ratio {
        Some(r) => [r.cell(), Cell::text(r.peer.clone())],
        None => [Cell::text(none.0), Cell::text(none.1)],
    }
}

/// The verdict cell of a figure's own goal (unit after the threshold), or an empty cell.
fn figure_goal(f: &Figure) -> Cell {
    f.goal.map_or(Cell::empty(), |goal| Cell::verdict(goal, f.value.median, 0, &format!(" {}", f.unit)))
}

fn figure_decimals(f: &Figure) -> usize {
    match f.unit {
        "MiB" | "KiB/s" => 1,
        "s CPU" => 2,
        _ => 0,
    }
}

/// The target cell of a figure: its own goal, or its ratio's.
fn target_cell(f: &Figure) -> Cell {
    match (&f.goal, &f.ratio) {
        (Some(_), _) => figure_goal(f),
        (None, Some(r)) => r.target(),
        (None, None) => Cell::empty(),
    }
}

/// `columns` as left-aligned text, but for the named ones, right-aligned numbers.
fn columns<'a>(titles: &[&'a str], numbers: &[&str]) -> Vec<(&'a str, Align)> {
    titles.iter().map(|t| (*t, if numbers.contains(t) { Align::Right } else { Align::Left })).collect()
}

/// A table of figures: value with its unit, ratio against a peer, target.
fn figure_table(figures: &[Figure]) -> Table {
    let mut t = Table::new(columns(&["figure", "value", "ratio", "peer", "target"], &["value", "ratio"]));
    for f in figures {
        let [ratio, peer] = ratio_cells(f.ratio.as_ref(), ("1.00×", "(reference)"));
        let value = Cell::figure(&f.value, figure_decimals(f), &format!(" {}", f.unit));
        t.push(vec![Cell::text(f.label.clone()), value, ratio, peer, target_cell(f)]);
    }
    t
}

/// A table of operations: rate, latency, p50 ratio against a peer, target.
fn op_table(rows: &[OpRow]) -> Table {
    let numbers = ["ops/s", "p50 µs", "p99 µs", "p50 ratio"];
    let titles = ["operation", "ops/s", "p50 µs", "p99 µs", "p50 ratio", "peer", "target"];
    let mut t = Table::new(columns(&titles, &numbers));
    for row in rows {
        let [ratio, peer] = ratio_cells(row.ratio.as_ref(), ("1.00×", "(reference)"));
        t.push(vec![
            Cell::text(row.label.clone()),
            Cell::figure(&row.rate, 0, ""),
            Cell::figure(&row.p50_us, 0, ""),
            Cell::figure(&row.p99_us, 0, ""),
            ratio,
            peer,
            row.ratio.as_ref().map_or(Cell::empty(), Ratio::target),
        ]);
    }
    t
}

/// The key-count table (start and memory per key set).
fn scale_table(rows: &[ScaleRow]) -> Table {
    let titles = [
        "keys",
        "start to ready, ms",
        "÷ smallest set",
        "RSS after start, MiB",
        "RSS after signing, MiB",
        "÷ smallest set",
    ];
    let mut t = Table::new(columns(&titles, &titles));
    let ratio_or_ref = |r: &Option<Ratio>| r.as_ref().map_or(Cell::text("1.00× (reference)"), Ratio::cell);
    for row in rows {
        t.push(vec![
            Cell::num(row.count as f64, 0),
            Cell::figure(&row.ready_ms, 0, ""),
            ratio_or_ref(&row.ready_ratio),
            Cell::figure(&row.rss_idle, 1, ""),
            Cell::figure(&row.rss_after, 1, ""),
            ratio_or_ref(&row.rss_ratio),
        ]);
    }
    t
}

/// Writes `table` and the blank line after it.
fn table(w: &mut String, table: &Table) {
    w.push_str(&table.markdown());
    w.push('\n');
}

/// `2.0 s window after a 0.3 s warm-up`: the timing of the phases beyond signing.
fn short_window(run: &RunInfo) -> String {
    format!(
        "{} s window after a {} s warm-up",
        num(run.short.window.as_secs_f64(), 1),
        num(run.short.warmup.as_secs_f64(), 1)
    )
}

/// Attestation, sealing, random bytes, bulk crypto, the SSH agent, key counts, key algorithms.
fn more_sections(w: &mut String, run: &RunInfo, s: &Summary) {
    attestation_section(w, run, s);
    random_section(w, run, s);
    bulk_section(w, run, s);
    agent_section(w, run, s);
    stored_keys_section(w, run, s);
    algs_section(w, run, s);
}

/// Quote, seal and unseal against raw ESAPI.
fn attestation_section(w: &mut String, run: &RunInfo, s: &Summary) {
    let window = short_window(run);
    let _ = writeln!(w, "## Attestation and sealing (one caller)\n");
    let _ = writeln!(
        w,
        "Each operation runs back to back from one caller for a {window}, every round: raw ESAPI \
         in this process first, then a fresh `tpm-vaultd` on the same swtpm through the client \
         library (`benches/src/ops.rs`). The ratio is the path's **p50 latency ÷ the peer's p50** \
         in the same round: lower is better, 1.00× is the raw TPM's speed. *Quote*: sha256:0,7,9, \
         20-byte nonce, the vault's AK template on both paths; the daemon returns the PCR \
         values with the quote, reusing the values it read for an earlier quote while they hash \
         to the new quote's digest (one TPM command; PCRs do not change here), so the second \
         ratio, against raw PCR_Read + quote, is what a quote after a PCR change compares to. \
         *Seal*: 32 bytes to the current sha256:9 through the long-lived salted HMAC session with \
         parameter encryption, as the daemon does; the daemon also encrypts the secret in-core \
         and writes its record durably (fsync), which is in its ratio. *Unseal*: a salted policy \
         session with response encryption, PolicyPCR, load, unseal, flushes: the daemon's \
         sequence. *Unseal with a signed policy*: a secret sealed to an offline P-256 authority's \
         approval (`TPM2_PolicyAuthorize`), opened with a signed approval of the current value; \
         the raw peer adds the daemon's `TPM2_LoadExternal`, `TPM2_ReadPublic`, \
         `TPM2_VerifySignature` and `TPM2_PolicyAuthorize` to the unseal sequence, and the \
         daemon also checks the approval's envelope signature in-core and reads the PCRs to name \
         a mismatch. The first result of each path is checked (quotes verify over the nonce, \
         unsealed secrets match).\n"
    );
    table(w, &op_table(&s.ops));
}

/// The daemon's random bytes against the TPM's and the OS's.
fn random_section(w: &mut String, run: &RunInfo, s: &Summary) {
    let window = short_window(run);
    let _ = writeln!(w, "## Random bytes\n");
    let _ = writeln!(
        w,
        "One caller, {window}. The daemon's `GetRandom` serves its DRBG (AES-256-CTR, seeded from \
         the OS and the TPM), so no request is a TPM round trip; the TPM's own RNG gives at most \
         a digest's worth per `TPM2_GetRandom`.\n"
    );
    table(w, &figure_table(&s.random));
}

/// In-core AES-GCM and SHA-256, the CLI, the client library and the daemon's streams.
fn bulk_section(w: &mut String, run: &RunInfo, s: &Summary) {
    let window = short_window(run);
    let _ = writeln!(w, "## Bulk cryptography\n");
    let message_kib = tpm_vault_client::MESSAGE_SIZE / 1024;
    let _ = writeln!(
        w,
        "In-core figures run on one thread of this process for a {window}; `openssl speed \
         -elapsed -mr -bytes 16384` is one process on one core, for the same length (whole \
         seconds), in the same round as every figure set against it. MiB = 2^20 bytes. The \
         vault's AES-256-GCM row is the daemon's stream encryptor (`Encryptor`, 64 KiB chunks, \
         copies in and out of its buffers). The `tpm-vault encrypt`/`decrypt` rows run the real \
         CLI binary on a file (read once before, so the page cache is warm) to `/dev/null`, timed \
         from process start to exit (the connection and the stream-key RPC included), pinned to \
         CPU 0 with `taskset -c 0` (one chunk thread) and on every CPU (a thread per CPU). The \
         client-library rows call `Client::copy_encrypt`/`copy_decrypt` on plaintext (and its \
         ciphertext) held in memory into a counting sink: with one thread the calling thread does \
         the AES work; on every CPU it is the ceiling of the CLI's figure there. The daemon rows \
         are the `--in-daemon` path: one `Encrypt` stream through the client library \
         (`Client::copy_encrypt_in_daemon`: {message_kib} KiB messages) from a generated source \
         into a counting sink, on a current-thread runtime of its own, after a checked round trip \
         (encrypted here, decrypted in the daemon) that also unseals the data key; then one \
         `Decrypt` stream of ciphertext read from memory. The daemon and the client share this \
         machine's cores, and their CPU per GiB is set against the in-core encryptor's. Opening \
         a stream is one `CreateStreamKey` call (the data key is cached in the daemon, so it is \
         no TPM command) plus sealing an empty final chunk here, set against one raw ESAPI \
         `TPM2_Sign` and a bare gRPC round trip of the same round.\n"
    );
    table(w, &figure_table(&s.bulk));
}

/// The SSH agent against gRPC `Sign`.
fn agent_section(w: &mut String, run: &RunInfo, s: &Summary) {
    let window = short_window(run);
    let _ = writeln!(w, "## SSH agent\n");
    let _ = writeln!(
        w,
        "`tpm-vault ssh-agent` (the real CLI binary) on the daemon of the bulk streams, serving the \
         benchmark's P-256 key: each client is a connection of its own to the agent's socket that \
         lists the identities once, then sends `SSH_AGENTC_SIGN_REQUEST`s for a 32-byte challenge \
         in a loop (`ssh-agent-lib` message types; the first signature is verified). The peer is \
         what the agent asks the daemon per request: `Client::sign` of the same message, a \
         connection per concurrent caller, on the same daemon in the same round. {window}.\n"
    );
    table(w, &figure_table(&s.agent));
}

/// Signing and start with more stored keys.
fn stored_keys_section(w: &mut String, run: &RunInfo, s: &Summary) {
    let window = short_window(run);
    let _ = writeln!(w, "## Stored keys: signing and start with more keys\n");
    let sets: Vec<String> = run
        .key_sets
        .iter()
        .map(|(n, t, _)| format!("{} keys {} s", num(*n as f64, 0), num(t.as_secs_f64(), 1)))
        .collect();
    let atomic: Vec<f64> = run.key_sets.iter().map(|(_, _, a)| a.as_secs_f64()).collect();
    let atomic = Spread::of(&atomic).map_or(f64::NAN, |s| s.median);
    let largest = run.key_sets.iter().map(|(n, _, _)| *n).max().unwrap_or(0);
    let _ = writeln!(
        w,
        "Creating a key in the TPM through the library took {} ms here ({} min for {} keys, most of \
         a run's time budget), so each key set is 4 real TPM keys (created by the library) plus \
         copies of their records under distinct names, written \
         into a state directory of its own before the daemon starts (`benches/src/scale.rs`): \
         the records are the library's own serialisation (`KeyRecord::to_bytes`), the 4 real \
         ones through the store's atomic writer and the copies with a plain write and one final \
         `sync`: the atomic writer took {} ms per record here (two fsyncs; {} min for {} records), \
         writing the whole key sets took {}. A copy signs \
         with its real key's TPM object. Per round and key set: a fresh daemon (start-to-ready, \
         RSS), one checked signature, then one caller for a {window} each: *key loaded* signs \
         with pseudo-random names that share one loaded TPM object (so the vault must find the \
         record among all the others; it caches 4,096 parsed records), *key not loaded* rotates \
         through the 4 real keys, so with the default `--max-loaded-objects 3` every signature \
         is a `TPM2_Load` (after flushing the least recently used key) and a `TPM2_Sign`.\n",
        run.key_creation.map_or("n/a".into(), |d| num(d.as_secs_f64() * 1e3, 0)),
        run.key_creation.map_or("n/a".into(), |d| num(d.as_secs_f64() * largest as f64 / 60.0, 0)),
        num(largest as f64, 0),
        num(atomic * 1e3, 1),
        num(atomic * largest as f64 / 60.0, 1),
        num(largest as f64, 0),
        sets.join(", ")
    );
    table(w, &scale_table(&s.scale));
    let signs: Vec<OpRow> = s.scale.iter().flat_map(|r| [r.cached.clone(), r.cold.clone()]).collect();
    table(w, &op_table(&signs));
    if !s.cold_peer.is_empty() {
        let _ = writeln!(w, "The cold path against the same three TPM commands from raw ESAPI, same rounds:\n");
        table(w, &op_table(&s.cold_peer));
    }
}

/// The other key algorithms and the post-quantum keys.
fn algs_section(w: &mut String, run: &RunInfo, s: &Summary) {
    let window = short_window(run);
    let _ = writeln!(w, "## Other key algorithms and post-quantum keys (one caller)\n");
    let created: Vec<String> =
        run.algs_created.iter().map(|(what, t)| format!("{what} {} ms", num(t.as_secs_f64() * 1e3, 0))).collect();
    let _ = writeln!(
        w,
        "Each TPM algorithm in its default scheme: the daemon's `Sign` RPC with a 45-byte message \
         (hashed in the daemon) against raw ESAPI's one `TPM2_Sign` of the same digest with the \
         key loaded (`benches/src/algs.rs`). ML-DSA-65 is not a TPM algorithm: the vault seals \
         the key's seed to the TPM, unseals it on first use and signs in-core with aws-lc-rs, so \
         its peer is aws-lc-rs signing in this process. A hybrid signature is one `TPM2_Sign` \
         (P-256) and one in-core ML-DSA-65 signature over the same message, set against this \
         round's raw P-256 `TPM2_Sign`. ML-KEM-768 decapsulation is in-core too (the key unsealed \
         once), against aws-lc-rs in this process. One caller, {window} per row; each \
         path's first signature is verified. The keys are made once per run, untimed: {}.\n",
        if created.is_empty() { "all existed already".to_owned() } else { created.join(", ") }
    );
    table(w, &op_table(&s.algs));
    if !s.pq.is_empty() {
        let _ = writeln!(
            w,
            "The other post-quantum parameter sets and operations, each against aws-lc-rs doing the \
             same in this process (one caller, a quarter of the window each): ML-DSA-44 and \
             ML-DSA-87 signing and ML-DSA-44/65/87 verification (the daemon's `Sign` and `Verify` \
             RPCs: the seed is unsealed once and the work is in-core), ML-KEM-1024 decapsulation \
             (the `Decapsulate` RPC), and ML-KEM-768/1024 encapsulation, which a client does \
             in-core with the vault key's public key (what `Client::encapsulate` does after fetching \
             it) against encapsulating to a key of this process.\n"
        );
        table(w, &op_table(&s.pq));
    }
}

/// The markdown report.
pub fn markdown(run: &RunInfo, machine: &Machine, s: &Summary) -> String {
    let mut out = String::new();
    let w = &mut out;
    header(w, run, machine, s);
    targets(w, s);
    sign_section(w, run, s);
    latency_section(w, s);
    policy_section(w, s);
    daemon_section(w, run, s);
    cpu_section(w, s);
    more_sections(w, run, s);
    what_each_path_does(w, run);
    how_to_read(w, run);
    w.push_str(&run.tls_section);
    w.push_str(&run.pkcs11_section);
    w.push_str(&run.device_section);
    not_measured(w, !run.tls_section.is_empty());
    if !run.notes.is_empty() {
        let _ = writeln!(w, "## Notes from this run\n");
        for n in &run.notes {
            let _ = writeln!(w, "- {n}");
        }
        let _ = writeln!(w);
    }
    out
}

/// Title, what the figures are, and the table of how and where the run was made.
fn header(w: &mut String, run: &RunInfo, machine: &Machine, s: &Summary) {
    let _ = writeln!(w, "# Benchmarks\n");
    let over = if s.rounds == 1 {
        "from **1 round** (no spread)".to_owned()
    } else {
        format!("the **median of {} rounds** with the spread **(min..max)** over the rounds", s.rounds)
    };
    let _ = writeln!(
        w,
        "Generated by `tpm-vault-bench`; do not edit by hand, run the command below instead. \
         Every figure is {over}, and every figure that has a peer is also given as a **ratio \
         against that peer measured in the same round**.\n"
    );
    if run.quick {
        let _ = writeln!(
            w,
            "> **Quick mode (smoke test).** Short windows and a single round: these figures only \
             show that every path works. Run the command without `--quick` for figures worth \
             reading.\n"
        );
    }
    let secs = |d: Duration, decimals| num(d.as_secs_f64(), decimals);
    let rounds = format!(
        "{} × (raw ESAPI and the library: {} alternating slice{} each, {} s warm-up + {} s window \
         per slice; every other phase: {} s warm-up, then a {} s window)",
        s.rounds,
        run.slices,
        if run.slices == 1 { "" } else { "s" },
        secs(run.slice.warmup, 2),
        secs(run.slice.window, 1),
        secs(run.timing.warmup, 1),
        secs(run.timing.window, 1)
    );
    let rows = [
        ("command", format!("`{}`", run.command)),
        ("date", machine.date.clone()),
        (
            "CPU",
            format!(
                "{} ({} logical CPUs in /proc/cpuinfo, {} usable)",
                machine.cpu_model, machine.cores, machine.usable_cores
            ),
        ),
        ("kernel", format!("Linux {}", machine.kernel)),
        ("TPM", format!("{}, TCP, no resource manager, same machine", machine.swtpm)),
        ("tpm2-tools", machine.tpm2_tools.clone().unwrap_or_else(|| "not installed".into())),
        ("source", format!("`{}`, {} build", machine.revision, machine.profile)),
        ("rounds", rounds),
        (
            "other phases",
            format!(
                "quote, seal, random, bulk crypto, key counts: {} s warm-up + {} s window each, every round",
                secs(run.short.warmup, 1),
                secs(run.short.window, 1)
            ),
        ),
        (
            "run time",
            format!(
                "{} s of rounds; {} s in all, cargo builds and set-up included",
                secs(run.measuring, 0),
                secs(run.elapsed, 0)
            ),
        ),
        ("load average (1/5/15 min)", format!("{} at start, {} at end", machine.load_start, run.load_end)),
    ];
    let mut t = Table::new([("", Align::Left), ("", Align::Left)]);
    for (what, value) in rows {
        t.push(vec![Cell::text(what), Cell::Text(value)]);
    }
    table(w, &t);
}

/// The targets, with a footnote when a PASS is suspect.
fn targets(w: &mut String, s: &Summary) {
    let _ = writeln!(w, "## Targets\n");
    let mut t = Table::new(columns(&["target", "median", "goal", ""], &["median"]));
    for c in &s.checks {
        t.push(vec![
            Cell::text(c.what.clone()),
            Cell::Text(format!("{}{}", num(c.value, c.decimals), c.unit)),
            Cell::Text(format!("{}{}", c.goal.describe(c.decimals), c.unit)),
            Cell::Text(format!("**{}**{}", c.verdict(), if c.suspect { " (suspect ¹)" } else { "" })),
        ]);
    }
    w.push_str(&t.markdown());
    if s.checks.iter().any(|c| c.suspect) {
        let _ = writeln!(
            w,
            "\n¹ Beyond the raw reference by more than {:.0} %: a path through the TPM cannot be \
             faster than raw ESAPI doing the same on the same TPM, so in this run the raw reference \
             itself was slowed \
             (by load on the shared machine, see the load average above). This PASS is not \
             evidence; rerun on a quieter machine.",
            (CEILING_SLACK - 1.0) * 100.0
        );
    }
    let _ = writeln!(w);
}

/// The signing table and its chart.
fn sign_section(w: &mut String, run: &RunInfo, s: &Summary) {
    let _ = writeln!(w, "## ECDSA P-256 signing of a 32-byte digest\n");
    let _ = writeln!(w, "![signatures per second, median with min..max whiskers]({})\n", run.chart);
    let titles = ["path", "signs/s", "ratio", "peer", "p50 µs", "p99 µs", "target"];
    let mut t = Table::new(columns(&titles, &["signs/s", "ratio", "p50 µs", "p99 µs"]));
    let mut above_ceiling = false;
    for row in &s.sign {
        let [mut ratio, peer] = ratio_cells(row.ratio.as_ref(), ("1.00×", "(reference)"));
        if let Some(r) = row.ratio.as_ref().filter(|r| r.peer == "raw" && r.value.median > CEILING_SLACK) {
            above_ceiling = true;
            ratio = Cell::Ratio { value: r.value, mark: "²" };
        }
        t.push(vec![
            Cell::text(row.label.clone()),
            Cell::figure(&row.rate, 0, ""),
            ratio,
            peer,
            Cell::figure(&row.p50_us, 0, ""),
            Cell::figure(&row.p99_us, 0, ""),
            row.ratio.as_ref().map_or(Cell::empty(), Ratio::target),
        ]);
    }
    w.push_str(&t.markdown());
    if above_ceiling {
        let _ = writeln!(
            w,
            "\n² Above the raw ESAPI ceiling by more than {:.0} %, which a path through the same TPM \
             cannot really be: read it as noise from the shared machine (the reference was slowed \
             more than this path), not as a gain.",
            (CEILING_SLACK - 1.0) * 100.0
        );
    }
    let _ = writeln!(w);
}

/// What the vault adds to one signature, and the floors under it.
fn latency_section(w: &mut String, s: &Summary) {
    let _ = writeln!(w, "## Latency the vault adds (one caller)\n");
    let _ = writeln!(
        w,
        "Per round: the path's median latency minus the raw ESAPI median latency of the same \
         round. The hand-off row times empty jobs through the TPM actor (queue, thread switch, \
         reply; no TPM command): the part of the library's added latency that is not the TPM, \
         given as a fraction of one raw `TPM2_Sign`. The thread row is the same hand-off \
         with nothing of the vault in it: one round trip between two OS threads over std \
         channels (`floor::thread_round_trip`), what the operating system charges for handing \
         work to a dedicated thread and back on this machine. The library pays one per signature, \
         because one dedicated thread owns the TPM; in the signing loop it often costs less than \
         either row, because the caller and the TPM thread then share a CPU while swtpm has the \
         other. The last two rows are the floor under the \
         daemon's figure: one client's health checks (`grpc.health.v1`, no work behind them) \
         against a bare tonic server in a process of its own, with the daemon's runtime and \
         HTTP/2 settings on a Unix socket (`benches/src/floor.rs`), i.e. what one unary gRPC \
         call costs on this machine before any server does anything; and the same check against \
         `tpm-vaultd`, its gRPC stack without a TPM job. A daemon request pays that round trip \
         plus the TPM actor hand-off, so their sum is the least it can add with a gRPC API here.\n"
    );
    let mut t = Table::new(columns(&["figure", "µs", "ratio", "peer", "target"], &["µs", "ratio"]));
    for f in &s.latency {
        let [ratio, peer] = ratio_cells(f.ratio.as_ref(), ("—", "(a difference already)"));
        t.push(vec![Cell::text(f.label.clone()), Cell::figure(&f.value, 0, ""), ratio, peer, figure_goal(f)]);
    }
    table(w, &t);
}

/// One access-policy decision in this process.
fn policy_section(w: &mut String, s: &Summary) {
    if s.policy.is_empty() {
        return;
    }
    let _ = writeln!(w, "## Access-policy decision\n");
    let _ = writeln!(
        w,
        "Every request the daemon serves is decided by its access policy before any TPM work. Here \
         `Policy::decide` runs in this process on the shipped `policies/default.toml` plus the \
         examples in `policies/examples/`, for a `www-data` client signing with `web-frontend-1` \
         (allowed by the third rule checked), in batches of decisions back to back \
         (`benches/src/policy.rs`); the figure is a batch's p50 divided by its decisions. It has \
         no peer: one raw `TPM2_Sign` takes thousands of times longer. The identity behind a \
         decision (SO_PEERCRED uid/gid, user and group names) is resolved once per 30 s per uid \
         and cached, so NSS lookups are not in it.\n"
    );
    let mut t = Table::new(columns(&["figure", "value", "target"], &["value"]));
    for f in &s.policy {
        let value = Cell::figure(&f.value, figure_decimals(f), &format!(" {}", f.unit));
        t.push(vec![Cell::text(f.label.clone()), value, figure_goal(f)]);
    }
    table(w, &t);
}

/// The daemon binary: start, memory, log lines.
fn daemon_section(w: &mut String, run: &RunInfo, s: &Summary) {
    let _ = writeln!(w, "## Daemon process\n");
    let _ = writeln!(
        w,
        "The release binary `tpm-vaultd`, started fresh in every round with `--tcti \
         swtpm:host=127.0.0.1,port=P --state-dir D --socket D/vault.sock --policies D/policies \
         --config <empty file>` and `RUST_LOG={}`; the policy directory holds one rule \
         allowing the benchmark's uid `sign` and `public` on the benchmark key (access is \
         denied by default).\n",
        run.daemon_rust_log
    );
    let mut t = Table::new(columns(&["figure", "value", "ratio", "peer"], &["value", "ratio"]));
    for f in &s.daemon {
        let [ratio, peer] = ratio_cells(f.ratio.as_ref(), ("—", "no peer"));
        let value = Cell::figure(&f.value, figure_decimals(f), &format!(" {}", f.unit));
        t.push(vec![Cell::text(f.label.clone()), value, ratio, peer]);
    }
    table(w, &t);
}

/// CPU per 1,000 signatures, and the daemon's split by thread.
fn cpu_section(w: &mut String, s: &Summary) {
    let _ = writeln!(w, "## CPU time per 1,000 signatures\n");
    let _ = writeln!(
        w,
        "`utime + stime` from `/proc/PID/stat` over each window (tpm2-tools: `cutime + cstime` \
         of the finished tool processes), divided by the signatures completed in it. The clock \
         tick is 10 ms, so short windows are coarse.\n"
    );
    let mut t = Table::new(columns(&["where", "ms CPU", "ratio", "peer"], &["ms CPU", "ratio"]));
    for f in &s.cpu {
        let [ratio, peer] = ratio_cells(f.ratio.as_ref(), ("—", "(reference)"));
        t.push(vec![Cell::text(f.label.clone()), Cell::figure(&f.value, 0, ""), ratio, peer]);
    }
    table(w, &t);
    if !s.daemon_threads.is_empty() {
        let _ = writeln!(w, "### The daemon's CPU by thread, {DAEMON_GOAL_CLIENTS} clients\n");
        let _ =
            writeln!(w, "The daemon row above split by thread (`/proc/PID/task/*/stat`), ms CPU per 1,000 requests.\n");
        let mut t = Table::new(columns(&["thread", "ms CPU"], &["ms CPU"]));
        for f in &s.daemon_threads {
            t.push(vec![Cell::text(f.label.clone()), Cell::figure(&f.value, 0, "")]);
        }
        table(w, &t);
    }
}

fn what_each_path_does(w: &mut String, run: &RunInfo) {
    let levels: Vec<String> = run.levels.iter().map(ToString::to_string).collect();
    let _ = writeln!(w, "## What each path does\n");
    let _ = writeln!(
        w,
        "All paths sign the same 32-byte digest (ECDSA, SHA-256) with an ECC P-256 key created \
         inside the TPM under the TCG ECC P-256 SRK, on one swtpm. swtpm serves one client \
         connection at a time, so the paths run one after another, in this order, in every \
         round. After every phase the harness checks that nothing was left loaded in the TPM \
         (the notes at the end list any phase that did).\n"
    );
    let _ = writeln!(
        w,
        "- **raw ESAPI**: tss-esapi `Context` on the swtpm TCTI in the benchmark process; SRK \
         and key loaded once; then each signature is one \
         `execute_with_session(Some(AuthSession::Password), |c| c.sign(..))` with a NULL \
         hashcheck ticket, i.e. exactly one `TPM2_Sign`. This is the ceiling."
    );
    let _ = writeln!(
        w,
        "- **vault library**: `Vault::open` + `Vault::sign` from one async caller: the request \
         is queued to the TPM actor thread (key kept loaded in its LRU, one `TPM2_Sign` in a \
         password session), awaited with a deadline, and the signature DER-encoded. The row with \
         {} callers runs that many such callers at once on the same vault, so the next job \
         waits in the actor's queue while the TPM works on one.",
        ACTOR_CALLERS
    );
    let _ = writeln!(
        w,
        "- **daemon**: `tpm-vaultd` over its Unix socket; `KeyService/Sign` with the digest, \
         from {} concurrent clients, each with its own HTTP/2 connection and one request in \
         flight. Latency is what the client sees.",
        levels.join(", ")
    );
    if run.tools {
        let _ = writeln!(
            w,
            "- **tpm2-tools**: one call = the processes below, started one after another as a \
             shell script would (`TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=P`). Raw swtpm has \
             no resource manager and 3 object slots, and each tpm2 process leaves what it \
             loaded in the TPM when it exits, so a bare `tpm2_sign` loop fails with 0x902 on \
             its fourth call: a working script flushes after every signature. The ratio is \
             against the daemon at 1 client (one caller, one request at a time). Set up once, \
             untimed (`key.pub`/`key.priv` are the raw phase's key blobs):"
        );
        let _ = writeln!(
            w,
            "  ```sh\n  {}\n  tpm2_load -C srk.ctx -u key.pub -r key.priv -c key.ctx\n  \
             tpm2_flushcontext -t\n  ```",
            SRK_COMMAND
                .iter()
                .map(|a| if a.contains('|') { format!("'{a}'") } else { (*a).to_owned() })
                .collect::<Vec<_>>()
                .join(" ")
        );
        let _ = writeln!(
            w,
            "  `unique.bin` holds the TCG template's `unique` (x = y = 32 zero bytes) as the \
             `TPMU_PUBLIC_ID` C union (little-endian u16 size + 128-byte buffer, twice): \
             without `-u`, tpm2-tools 5.4 leaves `unique` empty, derives a different SRK, and \
             `tpm2_load` of blobs made under the vault's SRK fails with 0x1df. One call is:"
        );
        for v in Variant::ALL {
            let _ = writeln!(w, "  - *{}*:\n    ```sh", v.label());
            for line in v.script() {
                let _ = writeln!(w, "    {line}");
            }
            let _ = writeln!(w, "    ```");
        }
    } else {
        let _ = writeln!(w, "- **tpm2-tools**: not installed on this machine; skipped.");
    }
    let _ = writeln!(w, "\nEvery path's first signature of each round is verified in-core before timing starts.\n");
}

fn how_to_read(w: &mut String, run: &RunInfo) {
    let _ = writeln!(w, "## How to read this\n");
    let _ = writeln!(
        w,
        "- **signs/s** counts signatures that *completed* inside a fixed {} s window after a {} \
         s warm-up. **p50/p99** are latencies of those signatures as the caller saw them. Raw \
         ESAPI and the library take turns in {} slice{} per round (each slice reconnects and \
         warms up for {} s before its window), so both see the same moments of the machine; \
         their figures add up the slices.",
        num(run.timing.window.as_secs_f64(), 1),
        num(run.timing.warmup.as_secs_f64(), 1),
        run.slices,
        if run.slices == 1 { "" } else { "s" },
        num(run.slice.warmup.as_secs_f64(), 2)
    );
    let _ = writeln!(
        w,
        "- **Ratios** are taken inside each round (path ÷ peer, both measured in the same round \
         on the same swtpm, at most a couple of minutes apart) and then summarised; so a ratio's median is not the quotient of the \
         two medians shown. The machine is shared and noisy: trust the ratios more than the \
         absolute rates, and read the (min..max) spread before reading a difference of a few \
         percent."
    );
    let _ = writeln!(
        w,
        "- **The TPM is the bottleneck by design.** A TPM executes one command at a time, so raw \
         ESAPI with the key loaded is the ceiling: a vault path can at best match it (ratio \
         1.00×; values above 1 are noise). Adding clients does not add throughput; it adds queueing, so p50 grows roughly \
         with the number of clients × the time of one `TPM2_Sign`. What the daemon must show \
         is that it keeps the TPM busy (ratio near 1 at 16 clients) without adding much per \
         request (added latency at 1 client)."
    );
    let _ = writeln!(
        w,
        "- **swtpm is a software TPM on the same CPUs.** It competes with the caller and the \
         daemon for the same cores, so CPU the vault spends shows up as lost TPM throughput \
         here. A hardware or firmware TPM takes far longer per signature, so there the vault's \
         fixed per-request cost should be a much smaller fraction; on this set-up the ratios are \
         close to the worst case for the vault."
    );
    let _ = writeln!(
        w,
        "- **tpm2-tools** pays process start, TCTI connect and library set-up on every call; \
         that is what a shell script gets, not a defect of the TPM. Its ratio is tpm2-tools ÷ \
         daemon at 1 client; the inverse is how many times more signatures one caller gets \
         through the daemon."
    );
    let _ = writeln!(w, "- **PASS/MISS** compares the median against the target stated next to it.\n");
}

fn not_measured(w: &mut String, tls_measured: bool) {
    let _ = writeln!(w, "## What is not measured yet\n");
    let _ = writeln!(w, "Placeholders: no figures exist for these yet, and none are implied.\n");
    let _ = writeln!(w, "| benchmark | peer to compare with | status |\n|---|---|---|");
    for (what, peer) in [
        (
            "TLS 1.3 handshakes/s with the server key in the TPM (rustls signer)",
            "OpenSSL `s_server` + tpm2 provider; software-key rustls",
        ),
        ("seal / unseal against `tpm2_create` / `tpm2_unseal`", "the raw ESAPI figures above"),
        ("RSASSA-PKCS1-v1_5 signing (RSA keys are measured in their default, PSS)", "raw ESAPI"),
        (
            "a hardware or firmware TPM (`/dev/tpmrm0`) itself; the device section measures through a model of one",
            "raw ESAPI on the same TPM",
        ),
    ] {
        if tls_measured && what.starts_with("TLS 1.3") {
            continue;
        }
        let _ = writeln!(w, "| {what} | {peer} | not measured yet |");
    }
    let _ = writeln!(w);
}

/// A label without markdown code ticks, for the terminal.
fn strip_ticks(label: &str) -> String {
    label.replace('`', "")
}

fn row_console(row: &SignRow) -> String {
    let (ratio, peer, target) = match &row.ratio {
        Some(r) => (r.cell().render(), r.peer.clone(), r.target().render().replace("**", "")),
        None => ("1.00×".into(), "reference".into(), String::new()),
    };
    format!(
        "{:<40} {:>24} {:>20} {:<16} {:>9} {:>9}  {}",
        row.label,
        spread(&row.rate, 0, "/s"),
        ratio,
        peer,
        num(row.p50_us.median, 0),
        num(row.p99_us.median, 0),
        target
    )
}

/// The table printed at the end of a run.
pub fn console(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:>24} {:>20} {:<16} {:>9} {:>9}",
        "ECDSA P-256 sign", "rate (min..max)", "ratio", "peer", "p50 µs", "p99 µs"
    );
    for row in &s.sign {
        let _ = writeln!(out, "{}", row_console(row));
    }
    let _ = writeln!(out);
    for f in s.latency.iter().chain(&s.policy).chain(&s.daemon).chain(&s.cpu) {
        let ratio = f.ratio.as_ref().map(|r| format!("  {} {}", r.cell().render(), r.peer)).unwrap_or_default();
        let unit = if s.cpu.contains(f) { "ms CPU / 1,000 signs" } else { f.unit };
        let _ = writeln!(out, "{:<58} {:>22} {}{}", f.label, spread(&f.value, figure_decimals(f), ""), unit, ratio);
    }
    let _ = writeln!(out);
    let scale: Vec<&OpRow> = s.scale.iter().flat_map(|r| [&r.cached, &r.cold]).collect();
    for row in s.ops.iter().chain(scale) {
        let ratio = row.ratio.as_ref().map(|r| format!("  {} {}", r.cell().render(), r.peer)).unwrap_or_default();
        let _ = writeln!(out, "{:<58} {:>22} µs p50{}", strip_ticks(&row.label), spread(&row.p50_us, 0, ""), ratio);
    }
    for f in s.random.iter().chain(&s.bulk).chain(&s.agent) {
        let ratio = f.ratio.as_ref().map(|r| format!("  {} {}", r.cell().render(), r.peer)).unwrap_or_default();
        let value = spread(&f.value, figure_decimals(f), "");
        let _ = writeln!(out, "{:<58} {:>22} {}{}", strip_ticks(&f.label), value, f.unit, ratio);
    }
    let _ = writeln!(out);
    for c in &s.checks {
        let _ = writeln!(
            out,
            "{}: {}{} (target {}{}) {}{}",
            c.what,
            num(c.value, c.decimals),
            c.unit,
            c.goal.describe(c.decimals),
            c.unit,
            c.verdict(),
            if c.suspect { " (suspect: beyond the raw reference, which was slowed by load)" } else { "" }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::tests::round;

    #[test]
    fn hand_written_tail_is_kept() {
        let old = format!("# Benchmarks\nold figures\n\n{KEEP_MARKER}\n\n## By hand\ntext\n");
        assert_eq!(kept_tail(&old), Some(&old[old.find("<!--").unwrap_or(0)..]));
        assert!(kept_tail(&old).is_some_and(|t| t.ends_with("## By hand\ntext\n")));
        assert_eq!(kept_tail("# Benchmarks\nnothing kept\n"), None);
    }

    #[test]
    fn report_has_every_section() {
        let s = Summary::new(&[round(1000, 990, 960), round(1100, 1080, 1000)]);
        let machine = Machine::detect(std::path::Path::new("."));
        let run = RunInfo {
            command: "cargo run --release -p tpm-vault-bench".into(),
            quick: false,
            timing: Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(10) },
            slices: 5,
            slice: Timing { warmup: Duration::from_millis(250), window: Duration::from_secs(2) },
            levels: vec![1, 16],
            elapsed: Duration::from_secs(200),
            measuring: Duration::from_secs(180),
            chart: "bench-sign.svg".into(),
            tools: true,
            notes: vec!["a note".into()],
            daemon_rust_log: "info".into(),
            load_end: "1.00 1.00 1.00".into(),
            tls_section: String::new(),
            pkcs11_section: String::new(),
            short: Timing { warmup: Duration::from_millis(500), window: Duration::from_secs(3) },
            key_creation: Some(Duration::from_millis(40)),
            algs_created: vec![("raw `TPM2_Create` rsa-3072".into(), Duration::from_millis(9000))],
            key_sets: vec![
                (10, Duration::from_millis(5), Duration::from_millis(4)),
                (1000, Duration::from_millis(80), Duration::from_millis(4)),
            ],
            device_section: "## Device model".into(),
        };
        let md = markdown(&run, &machine, &s);
        for needle in [
            "`cargo run --release -p tpm-vault-bench`",
            "## How to read this",
            "## What is not measured yet",
            "## Attestation and sealing",
            "## Bulk cryptography",
            "## SSH agent",
            "## Stored keys",
            "## Device model",
            "## Access-policy decision",
            "4 rules",
            "2 callers",
            "daemon `Sign` RPC, ml-dsa-44",
            "1,000 keys 0.1 s",
            "4.0 ms per record",
            "≤ 1.10: **PASS**",
            "not measured yet |",
            "(bench-sign.svg)",
            "**PASS**",
            "tpm2_flushcontext -t",
            "- a note",
            &machine.cpu_model,
        ] {
            assert!(md.contains(needle), "missing {needle:?}");
        }
        let table = console(&s);
        assert!(table.contains("PASS"));
    }
}
