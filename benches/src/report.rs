//! Renders a [`Summary`] as the markdown report (`docs/BENCHMARKS.md`) and as the table
//! printed on the terminal.

use std::fmt::Write as _;
use std::time::Duration;

use crate::machine::Machine;
use crate::sign::tools::{Variant, SRK_COMMAND};
use crate::sign::Timing;
use crate::stats::Spread;
use crate::summary::{Figure, OpRow, Ratio, ScaleRow, SignRow, Summary};

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

/// `1234.5` → `1,235` (with `decimals` = 0), `0.981` → `0.98` (2).
pub fn num(v: f64, decimals: usize) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let text = format!("{:.decimals$}", v.abs());
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if v < 0.0 && text.chars().any(|c| c.is_ascii_digit() && c != '0') { "−" } else { "" };
    if frac.is_empty() {
        format!("{sign}{grouped}")
    } else {
        format!("{sign}{grouped}.{frac}")
    }
}

/// `median (min..max)`, or just the median when the rounds agree or there was one round.
pub fn spread(s: &Spread, decimals: usize, suffix: &str) -> String {
    let median = format!("{}{suffix}", num(s.median, decimals));
    let (lo, hi) = (num(s.min, decimals), num(s.max, decimals));
    if lo == hi {
        median
    } else {
        format!("{median} ({lo}..{hi})")
    }
}

fn ratio_cell(r: &Ratio) -> String {
    spread(&r.value, 2, "×")
}

fn verdict(r: &Ratio) -> String {
    match r.goal {
        Some(goal) => {
            let v = if goal.met(r.value.median) { "PASS" } else { "MISS" };
            format!("{}: **{v}**", goal.describe(2))
        }
        None => String::new(),
    }
}

fn figure_goal(f: &Figure) -> String {
    match f.goal {
        Some(goal) => {
            let v = if goal.met(f.value.median) { "PASS" } else { "MISS" };
            format!("{} {}: **{v}**", goal.describe(0), f.unit)
        }
        None => String::new(),
    }
}

fn figure_decimals(f: &Figure) -> usize {
    match f.unit {
        "MiB" | "KiB/s" => 1,
        "s CPU" => 2,
        _ => 0,
    }
}

/// The target cell of a figure: its own goal, or its ratio's.
fn target_cell(f: &Figure) -> String {
    match (&f.goal, &f.ratio) {
        (Some(_), _) => figure_goal(f),
        (None, Some(r)) => verdict(r),
        (None, None) => String::new(),
    }
}

/// A table of figures: value with its unit, ratio against a peer, target.
fn figure_table(w: &mut String, figures: &[Figure]) {
    let _ = writeln!(w, "| figure | value | ratio | peer | target |\n|---|---:|---:|---|---|");
    for f in figures {
        let (ratio, peer) = match &f.ratio {
            Some(r) => (ratio_cell(r), r.peer.clone()),
            None => ("1.00×".into(), "(reference)".into()),
        };
        let value = spread(&f.value, figure_decimals(f), &format!(" {}", f.unit));
        let _ = writeln!(w, "| {} | {value} | {ratio} | {peer} | {} |", f.label, target_cell(f));
    }
    let _ = writeln!(w);
}

/// A table of operations: rate, latency, p50 ratio against a peer, target.
fn op_table(w: &mut String, rows: &[OpRow]) {
    let _ = writeln!(
        w,
        "| operation | ops/s | p50 µs | p99 µs | p50 ratio | peer | target |\n|---|---:|---:|---:|---:|---|---|"
    );
    for row in rows {
        let (ratio, peer, target) = match &row.ratio {
            Some(r) => (ratio_cell(r), r.peer.clone(), verdict(r)),
            None => ("1.00×".into(), "(reference)".into(), String::new()),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {ratio} | {peer} | {target} |",
            row.label,
            spread(&row.rate, 0, ""),
            spread(&row.p50_us, 0, ""),
            spread(&row.p99_us, 0, "")
        );
    }
    let _ = writeln!(w);
}

fn scale_table(w: &mut String, rows: &[ScaleRow]) {
    let _ = writeln!(
        w,
        "| keys | start to ready, ms | ÷ smallest set | RSS after start, MiB | RSS after signing, MiB | ÷ smallest set |\n\
         |---:|---:|---:|---:|---:|---:|"
    );
    let ratio_or_ref = |r: &Option<Ratio>| r.as_ref().map_or("1.00× (reference)".into(), ratio_cell);
    for row in rows {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} |",
            num(row.count as f64, 0),
            spread(&row.ready_ms, 0, ""),
            ratio_or_ref(&row.ready_ratio),
            spread(&row.rss_idle, 1, ""),
            spread(&row.rss_after, 1, ""),
            ratio_or_ref(&row.rss_ratio)
        );
    }
    let _ = writeln!(w);
    let signs: Vec<OpRow> = rows.iter().flat_map(|r| [r.cached.clone(), r.cold.clone()]).collect();
    op_table(w, &signs);
}

/// Attestation, sealing, random bytes, bulk crypto and key counts.
fn more_sections(w: &mut String, run: &RunInfo, s: &Summary) {
    let window = format!(
        "{} s window after a {} s warm-up",
        num(run.short.window.as_secs_f64(), 1),
        num(run.short.warmup.as_secs_f64(), 1)
    );
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
    op_table(w, &s.ops);

    let _ = writeln!(w, "## Random bytes\n");
    let _ = writeln!(
        w,
        "One caller, {window}. The daemon's `GetRandom` serves its DRBG (AES-256-CTR, seeded from \
         the OS and the TPM), so no request is a TPM round trip; the TPM's own RNG gives at most \
         a digest's worth per `TPM2_GetRandom`.\n"
    );
    figure_table(w, &s.random);

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
    figure_table(w, &s.bulk);

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
    figure_table(w, &s.agent);

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
    scale_table(w, &s.scale);
    if !s.cold_peer.is_empty() {
        let _ = writeln!(w, "The cold path against the same three TPM commands from raw ESAPI, same rounds:\n");
        op_table(w, &s.cold_peer);
    }

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
    op_table(w, &s.algs);
}

/// The markdown report.
pub fn markdown(run: &RunInfo, machine: &Machine, s: &Summary) -> String {
    let mut out = String::new();
    let w = &mut out;
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
    let _ = writeln!(w, "| | |\n|---|---|");
    let _ = writeln!(w, "| command | `{}` |", run.command);
    let _ = writeln!(w, "| date | {} |", machine.date);
    let _ = writeln!(
        w,
        "| CPU | {} ({} logical CPUs in /proc/cpuinfo, {} usable) |",
        machine.cpu_model, machine.cores, machine.usable_cores
    );
    let _ = writeln!(w, "| kernel | Linux {} |", machine.kernel);
    let _ = writeln!(w, "| TPM | {}, TCP, no resource manager, same machine |", machine.swtpm);
    let _ = writeln!(w, "| tpm2-tools | {} |", machine.tpm2_tools.as_deref().unwrap_or("not installed"));
    let _ = writeln!(w, "| source | `{}`, {} build |", machine.revision, machine.profile);
    let _ = writeln!(
        w,
        "| rounds | {} × (raw ESAPI and the library: {} alternating slice{} each, {} s warm-up + {} s window \
         per slice; every other phase: {} s warm-up, then a {} s window) |",
        s.rounds,
        run.slices,
        if run.slices == 1 { "" } else { "s" },
        num(run.slice.warmup.as_secs_f64(), 2),
        num(run.slice.window.as_secs_f64(), 1),
        num(run.timing.warmup.as_secs_f64(), 1),
        num(run.timing.window.as_secs_f64(), 1)
    );
    let _ = writeln!(
        w,
        "| other phases | quote, seal, random, bulk crypto, key counts: {} s warm-up + {} s window each, every round |",
        num(run.short.warmup.as_secs_f64(), 1),
        num(run.short.window.as_secs_f64(), 1)
    );
    let _ = writeln!(
        w,
        "| run time | {} s of rounds; {} s in all, cargo builds and set-up included |",
        num(run.measuring.as_secs_f64(), 0),
        num(run.elapsed.as_secs_f64(), 0)
    );
    let _ = writeln!(w, "| load average (1/5/15 min) | {} at start, {} at end |\n", machine.load_start, run.load_end);

    let _ = writeln!(w, "## Targets\n");
    let _ = writeln!(w, "| target | median | goal | |\n|---|---:|---|---|");
    for c in &s.checks {
        let _ = writeln!(
            w,
            "| {} | {}{} | {}{} | **{}**{} |",
            c.what,
            num(c.value, c.decimals),
            c.unit,
            c.goal.describe(c.decimals),
            c.unit,
            c.verdict(),
            if c.suspect { " (suspect ¹)" } else { "" }
        );
    }
    if s.checks.iter().any(|c| c.suspect) {
        let _ = writeln!(
            w,
            "\n¹ Beyond the raw reference by more than {:.0} %: a path through the TPM cannot be \
             faster than raw ESAPI doing the same on the same TPM, so in this run the raw reference \
             itself was slowed \
             (by load on the shared machine, see the load average above). This PASS is not \
             evidence; rerun on a quieter machine.",
            (crate::summary::CEILING_SLACK - 1.0) * 100.0
        );
    }
    let _ = writeln!(w);

    let _ = writeln!(w, "## ECDSA P-256 signing of a 32-byte digest\n");
    let _ = writeln!(w, "![signatures per second, median with min..max whiskers]({})\n", run.chart);
    let _ = writeln!(
        w,
        "| path | signs/s | ratio | peer | p50 µs | p99 µs | target |\n\
         |---|---:|---:|---|---:|---:|---|"
    );
    let mut above_ceiling = false;
    for row in &s.sign {
        let (ratio, peer, target) = match &row.ratio {
            Some(r) if r.peer == "raw" && r.value.median > crate::summary::CEILING_SLACK => {
                above_ceiling = true;
                (format!("{} ²", ratio_cell(r)), r.peer.clone(), verdict(r))
            }
            Some(r) => (ratio_cell(r), r.peer.clone(), verdict(r)),
            None => ("1.00×".into(), "(reference)".into(), String::new()),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.label,
            spread(&row.rate, 0, ""),
            ratio,
            peer,
            spread(&row.p50_us, 0, ""),
            spread(&row.p99_us, 0, ""),
            target
        );
    }
    if above_ceiling {
        let _ = writeln!(
            w,
            "\n² Above the raw ESAPI ceiling by more than {:.0} %, which a path through the same TPM \
             cannot really be: read it as noise from the shared machine (the reference was slowed \
             more than this path), not as a gain.",
            (crate::summary::CEILING_SLACK - 1.0) * 100.0
        );
    }
    let _ = writeln!(w);

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
    let _ = writeln!(w, "| figure | µs | ratio | peer | target |\n|---|---:|---:|---|---|");
    for f in &s.latency {
        let (ratio, peer) = match &f.ratio {
            Some(r) => (ratio_cell(r), r.peer.clone()),
            None => ("—".into(), "(a difference already)".into()),
        };
        let _ =
            writeln!(w, "| {} | {} | {} | {} | {} |", f.label, spread(&f.value, 0, ""), ratio, peer, figure_goal(f));
    }
    let _ = writeln!(w);

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
    let _ = writeln!(w, "| figure | value | ratio | peer |\n|---|---:|---:|---|");
    for f in &s.daemon {
        let (ratio, peer) = match &f.ratio {
            Some(r) => (ratio_cell(r), r.peer.clone()),
            None => ("—".into(), "no peer".into()),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} |",
            f.label,
            spread(&f.value, figure_decimals(f), &format!(" {}", f.unit)),
            ratio,
            peer
        );
    }
    let _ = writeln!(w);

    let _ = writeln!(w, "## CPU time per 1,000 signatures\n");
    let _ = writeln!(
        w,
        "`utime + stime` from `/proc/PID/stat` over each window (tpm2-tools: `cutime + cstime` \
         of the finished tool processes), divided by the signatures completed in it. The clock \
         tick is 10 ms, so short windows are coarse.\n"
    );
    let _ = writeln!(w, "| where | ms CPU | ratio | peer |\n|---|---:|---:|---|");
    for f in &s.cpu {
        let (ratio, peer) = match &f.ratio {
            Some(r) => (ratio_cell(r), r.peer.clone()),
            None => ("—".into(), "(reference)".into()),
        };
        let _ = writeln!(w, "| {} | {} | {} | {} |", f.label, spread(&f.value, 0, ""), ratio, peer);
    }
    let _ = writeln!(w);

    if !s.daemon_threads.is_empty() {
        let _ = writeln!(w, "### The daemon's CPU by thread, {} clients\n", crate::summary::DAEMON_GOAL_CLIENTS);
        let _ =
            writeln!(w, "The daemon row above split by thread (`/proc/PID/task/*/stat`), ms CPU per 1,000 requests.\n");
        let _ = writeln!(w, "| thread | ms CPU |\n|---|---:|");
        for f in &s.daemon_threads {
            let _ = writeln!(w, "| {} | {} |", f.label, spread(&f.value, 0, ""));
        }
        let _ = writeln!(w);
    }

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
         password session), awaited with a deadline, and the signature DER-encoded."
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
        ("a hardware or firmware TPM (`/dev/tpmrm0`)", "raw ESAPI on the same TPM"),
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
        Some(r) => (ratio_cell(r), r.peer.clone(), verdict(r).replace("**", "")),
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
    for f in s.latency.iter().chain(&s.daemon).chain(&s.cpu) {
        let ratio = f.ratio.as_ref().map(|r| format!("  {} {}", ratio_cell(r), r.peer)).unwrap_or_default();
        let unit = if s.cpu.contains(f) { "ms CPU / 1,000 signs" } else { f.unit };
        let _ = writeln!(out, "{:<58} {:>22} {}{}", f.label, spread(&f.value, figure_decimals(f), ""), unit, ratio);
    }
    let _ = writeln!(out);
    let scale: Vec<&OpRow> = s.scale.iter().flat_map(|r| [&r.cached, &r.cold]).collect();
    for row in s.ops.iter().chain(scale) {
        let ratio = row.ratio.as_ref().map(|r| format!("  {} {}", ratio_cell(r), r.peer)).unwrap_or_default();
        let _ = writeln!(out, "{:<58} {:>22} µs p50{}", strip_ticks(&row.label), spread(&row.p50_us, 0, ""), ratio);
    }
    for f in s.random.iter().chain(&s.bulk).chain(&s.agent) {
        let ratio = f.ratio.as_ref().map(|r| format!("  {} {}", ratio_cell(r), r.peer)).unwrap_or_default();
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
    fn numbers() {
        assert_eq!(num(1234.4, 0), "1,234");
        assert_eq!(num(999.0, 0), "999");
        assert_eq!(num(1_234_567.891, 2), "1,234,567.89");
        assert_eq!(num(0.981, 2), "0.98");
        assert_eq!(num(-12.0, 0), "−12");
        assert_eq!(num(-0.001, 0), "0");
        assert_eq!(num(f64::NAN, 0), "n/a");
        let s = Spread { median: 2.0, min: 1.0, max: 3.0 };
        assert_eq!(spread(&s, 0, "×"), "2× (1..3)");
        let flat = Spread { median: 2.0, min: 2.0, max: 2.0 };
        assert_eq!(spread(&flat, 0, ""), "2");
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
