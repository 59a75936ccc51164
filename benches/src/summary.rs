//! Turns the rounds into the published figures: medians with min..max over the rounds, and
//! for every figure a ratio against its peer *computed within each round* (so a slow moment of
//! the shared machine hits both sides of a ratio), then checked against the targets.

use std::time::Duration;

use crate::algs::AlgsRound;
use crate::bulk::BulkRound;
use crate::ops::OpsRound;
use crate::policy::PolicyRound;
use crate::scale::ScaleRound;
use crate::sign::actor::CALLERS as ACTOR_CALLERS;
use crate::sign::daemon::DaemonRound;
use crate::sign::tools::Variant;
use crate::stats::{Measurement, Spread};
use crate::table::{num, Goal, Ratio};

/// Everything one round measured.
#[derive(Debug, Clone)]
pub struct Round {
    /// In-process ESAPI.
    pub raw: Measurement,
    /// The vault library through its TPM actor, one caller.
    pub actor: Measurement,
    /// The same with [`ACTOR_CALLERS`] concurrent callers (the next job waits in the actor's
    /// queue while the TPM works on one).
    pub actor_callers: Measurement,
    /// Empty jobs through the TPM actor (hand-off cost without a TPM command).
    pub handoff: Measurement,
    /// Round trips between two OS threads over std channels, no work: the hand-off's floor.
    pub threads: Measurement,
    /// Health checks against a bare tonic server in its own process: the gRPC round trip alone.
    pub floor: Measurement,
    /// The daemon over its socket.
    pub daemon: DaemonRound,
    /// tpm2-tools variants (empty when tpm2-tools is not installed).
    pub tools: Vec<(Variant, Measurement)>,
    /// Quote, seal, unseal and random bytes: raw ESAPI and the daemon.
    pub ops: OpsRound,
    /// In-core AES-GCM and SHA-256, OpenSSL, the daemon's encrypt stream.
    pub bulk: BulkRound,
    /// Signatures through `tpm-vault ssh-agent` and through gRPC `Sign`.
    pub agent: crate::agent::AgentRound,
    /// Key-count scaling.
    pub scale: ScaleRound,
    /// The other key algorithms.
    pub algs: AlgsRound,
    /// Access-policy decisions in this process.
    pub policy: PolicyRound,
}

/// What a signing row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// In-process ESAPI.
    Raw,
    /// Vault library with this many concurrent callers.
    Actor(usize),
    /// Daemon at this many clients.
    Daemon(usize),
    /// tpm2-tools.
    Tools(Variant),
}

/// One line of the signing table.
#[derive(Debug, Clone, PartialEq)]
pub struct SignRow {
    /// What was measured.
    pub path: Path,
    /// Human label.
    pub label: String,
    /// Signatures per second.
    pub rate: Spread,
    /// Median latency, µs.
    pub p50_us: Spread,
    /// 99th percentile latency, µs.
    pub p99_us: Spread,
    /// Rate divided by the peer's rate.
    pub ratio: Option<Ratio>,
}

/// A single figure with its ratio (resource and latency tables).
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Human label.
    pub label: String,
    /// Unit of `value`.
    pub unit: &'static str,
    /// The figure over the rounds.
    pub value: Spread,
    /// Goal on the value itself (e.g. added latency).
    pub goal: Option<Goal>,
    /// Ratio against a peer, if it has one.
    pub ratio: Option<Ratio>,
}

/// A target line of the report's headline.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What is checked.
    pub what: String,
    /// Median value.
    pub value: f64,
    /// Unit suffix (`×` for ratios).
    pub unit: &'static str,
    /// Decimals to print.
    pub decimals: usize,
    /// The goal.
    pub goal: Goal,
    /// The path beat its ceiling by more than [`CEILING_SLACK`]: impossible for a TPM path, so
    /// the reference was depressed (machine load) and a PASS here is not evidence.
    pub suspect: bool,
}

/// How far above the raw ESAPI ceiling a ratio may be before it is flagged as noise.
pub const CEILING_SLACK: f64 = 1.05;

impl Check {
    /// PASS or MISS.
    pub fn verdict(&self) -> &'static str {
        self.goal.verdict(self.value)
    }
}

/// All published figures.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Rounds summarised.
    pub rounds: usize,
    /// Signing throughput and latency.
    pub sign: Vec<SignRow>,
    /// Latency the vault adds.
    pub latency: Vec<Figure>,
    /// One access-policy decision.
    pub policy: Vec<Figure>,
    /// Daemon start, memory.
    pub daemon: Vec<Figure>,
    /// CPU per 1,000 signatures.
    pub cpu: Vec<Figure>,
    /// The daemon's CPU per 1,000 requests by thread, at [`DAEMON_GOAL_CLIENTS`] clients.
    pub daemon_threads: Vec<Figure>,
    /// Quote, seal, unseal latency against raw ESAPI.
    pub ops: Vec<OpRow>,
    /// Random bytes: the daemon, the TPM, `/dev/urandom`.
    pub random: Vec<Figure>,
    /// Bulk crypto in-core, OpenSSL and through the daemon.
    pub bulk: Vec<Figure>,
    /// The SSH agent against gRPC `Sign`.
    pub agent: Vec<Figure>,
    /// Key-count scaling, one row per key count.
    pub scale: Vec<ScaleRow>,
    /// Signing with ECC P-384, RSA-2048, RSA-3072 and ML-DSA-65 against their peers.
    pub algs: Vec<OpRow>,
    /// The other post-quantum parameter sets and operations against aws-lc-rs in-process.
    pub pq: Vec<OpRow>,
    /// Raw ESAPI load + sign + flush, and the smallest key set's cold signature against it.
    pub cold_peer: Vec<OpRow>,
    /// Targets.
    pub checks: Vec<Check>,
}

/// One line of a latency table: an operation against a peer's latency.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRow {
    /// Human label.
    pub label: String,
    /// Operations per second (one caller).
    pub rate: Spread,
    /// Median latency, µs.
    pub p50_us: Spread,
    /// 99th percentile latency, µs.
    pub p99_us: Spread,
    /// p50 latency divided by the peer's p50 latency.
    pub ratio: Option<Ratio>,
}

/// One key count of the scaling table.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleRow {
    /// Keys stored.
    pub count: usize,
    /// Start to ready, ms.
    pub ready_ms: Spread,
    /// Start to ready ÷ the smallest key set's.
    pub ready_ratio: Option<Ratio>,
    /// RSS after start, MiB.
    pub rss_idle: Spread,
    /// RSS after signing, MiB.
    pub rss_after: Spread,
    /// RSS after signing ÷ the smallest key set's.
    pub rss_ratio: Option<Ratio>,
    /// Signing with the key loaded.
    pub cached: OpRow,
    /// Signing with a key not loaded.
    pub cold: OpRow,
}

/// Daemon quote p50 ÷ raw `TPM2_Quote` p50.
pub const QUOTE_GOAL: Goal = Goal::AtMost(1.1);
/// In-core AES-256-GCM (stream format) ÷ OpenSSL, one core.
pub const AES_GOAL: Goal = Goal::AtLeast(0.9);
/// Daemon encrypt stream ÷ OpenSSL AES-256-GCM, one core.
pub const STREAM_GOAL: Goal = Goal::AtLeast(0.4);
/// Signatures through `tpm-vault ssh-agent` ÷ gRPC `Sign` at the same concurrency (#23).
pub const AGENT_GOAL: Goal = Goal::AtLeast(0.9);
/// `tpm-vault encrypt`/`decrypt` pinned to one CPU ÷ OpenSSL AES-256-GCM, one core (#18).
pub const CLI_ONE_GOAL: Goal = Goal::AtLeast(0.8);
/// `tpm-vault encrypt`/`decrypt` on two CPUs ÷ OpenSSL AES-256-GCM, one core (#18).
pub const CLI_ALL_GOAL: Goal = Goal::AtLeast(1.4);
/// `tpm-vault encrypt` of a file into a file ÷ `cat` of it into a file (#36 item 7).
pub const CLI_FILE_GOAL: Goal = Goal::AtLeast(0.8);
/// The client library from memory on one thread ÷ OpenSSL AES-256-GCM, one core (#18).
pub const LIBRARY_GOAL: Goal = Goal::AtLeast(0.95);
/// Daemon GetRandom with 1 MiB requests, MiB/s.
pub const RANDOM_GOAL: Goal = Goal::AtLeast(200.0);
/// One access-policy decision, ns (the issue target: under 2 µs per request).
pub const POLICY_GOAL: Goal = Goal::Below(2000.0);

const MIB: f64 = 1024.0 * 1024.0;

fn op_row(label: impl Into<String>, ms: &[&Measurement], ratio: Option<Ratio>) -> OpRow {
    OpRow {
        label: label.into(),
        rate: spread(ms.iter().map(|m| m.rate())),
        p50_us: spread(ms.iter().map(|m| us(m.p50()))),
        p99_us: spread(ms.iter().map(|m| us(m.p99()))),
        ratio,
    }
}

fn p50s(ms: &[&Measurement]) -> Vec<f64> {
    ms.iter().map(|m| us(m.p50())).collect()
}

/// Quote, seal and unseal rows.
fn ops_rows(rounds: &[Round]) -> Vec<OpRow> {
    let col = |f: fn(&OpsRound) -> &Measurement| -> Vec<&Measurement> { rounds.iter().map(|r| f(&r.ops)).collect() };
    let quote_raw = col(|o| &o.quote_raw);
    let quote_pcr = col(|o| &o.quote_raw_pcr);
    let quote = col(|o| &o.quote_daemon);
    let (seal_raw, seal) = (col(|o| &o.seal_raw), col(|o| &o.seal_daemon));
    let (unseal_raw, unseal) = (col(|o| &o.unseal_raw), col(|o| &o.unseal_daemon));
    let (unseal_auth_raw, unseal_auth) = (col(|o| &o.unseal_auth_raw), col(|o| &o.unseal_auth_daemon));
    let vs = |a: &[&Measurement], b: &[&Measurement], peer: &str, goal| Some(ratio_of(&p50s(a), &p50s(b), peer, goal));
    vec![
        op_row("raw ESAPI `TPM2_Quote`, AK loaded", &quote_raw, None),
        op_row("raw ESAPI `TPM2_PCR_Read` + `TPM2_Quote`", &quote_pcr, vs(&quote_pcr, &quote_raw, "raw quote", None)),
        op_row("daemon `Quote` RPC", &quote, vs(&quote, &quote_raw, "raw quote", Some(QUOTE_GOAL))),
        op_row(
            "same, against a quote with fresh PCR values",
            &quote,
            vs(&quote, &quote_pcr, "raw PCR_Read + quote", None),
        ),
        op_row("raw ESAPI `TPM2_PCR_Read` + `TPM2_Create` (sealed object, HMAC session)", &seal_raw, None),
        op_row("daemon `Seal` RPC (32 B, record written with fsync)", &seal, vs(&seal, &seal_raw, "raw seal", None)),
        op_row(
            "raw ESAPI policy session + `TPM2_PolicyPCR` + `TPM2_Load` + `TPM2_Unseal` + flushes",
            &unseal_raw,
            None,
        ),
        op_row("daemon `Unseal` RPC", &unseal, vs(&unseal, &unseal_raw, "raw unseal", None)),
        op_row(
            "raw ESAPI the same + `TPM2_LoadExternal` + `TPM2_ReadPublic` + `TPM2_VerifySignature` + \
             `TPM2_PolicyAuthorize` (signed policy)",
            &unseal_auth_raw,
            vs(&unseal_auth_raw, &unseal_raw, "raw unseal", None),
        ),
        op_row(
            "daemon `Unseal` RPC with a signed policy",
            &unseal_auth,
            vs(&unseal_auth, &unseal_auth_raw, "raw signed-policy unseal", None),
        ),
    ]
}

/// Signing with the other key algorithms: raw ESAPI and the daemon per TPM algorithm, then
/// ML-DSA-65 in-process and through the daemon.
fn algs_rows(rounds: &[Round]) -> Vec<OpRow> {
    let algs: Vec<tpm_vault_daemon::model::KeyAlg> =
        rounds.first().map(|r| r.algs.tpm.iter().map(|(alg, _, _)| *alg).collect()).unwrap_or_default();
    let mut rows = Vec::new();
    for (i, alg) in algs.iter().enumerate() {
        let raw: Vec<&Measurement> = rounds.iter().filter_map(|r| r.algs.tpm.get(i).map(|t| &t.1)).collect();
        let daemon: Vec<&Measurement> = rounds.iter().filter_map(|r| r.algs.tpm.get(i).map(|t| &t.2)).collect();
        let scheme = format!("{}, {}", alg.default_scheme().as_str(), alg.default_hash().as_str());
        rows.push(op_row(format!("raw ESAPI `TPM2_Sign`, {alg} ({scheme})"), &raw, None));
        rows.push(op_row(
            format!("daemon `Sign` RPC, {alg}"),
            &daemon,
            Some(ratio_of(&p50s(&daemon), &p50s(&raw), &format!("raw {alg}"), None)),
        ));
    }
    let local: Vec<&Measurement> = rounds.iter().map(|r| &r.algs.ml_dsa_local).collect();
    let daemon: Vec<&Measurement> = rounds.iter().map(|r| &r.algs.ml_dsa_daemon).collect();
    if !rounds.is_empty() {
        rows.push(op_row("aws-lc-rs ML-DSA-65 sign, in this process", &local, None));
        rows.push(op_row(
            "daemon `Sign` RPC, ml-dsa-65 (seed unsealed once, signed in-core)",
            &daemon,
            Some(ratio_of(&p50s(&daemon), &p50s(&local), "aws-lc-rs in-process", None)),
        ));
        let raw_p256: Vec<&Measurement> = rounds.iter().map(|r| &r.raw).collect();
        let hybrid: Vec<&Measurement> = rounds.iter().map(|r| &r.algs.hybrid_daemon).collect();
        rows.push(op_row(
            "daemon `Sign` RPC, hybrid-p256-mldsa65 (one `TPM2_Sign` + ML-DSA-65 in-core)",
            &hybrid,
            Some(ratio_of(&p50s(&hybrid), &p50s(&raw_p256), "raw ESAPI P-256 `TPM2_Sign`", None)),
        ));
        let kem_local: Vec<&Measurement> = rounds.iter().map(|r| &r.algs.ml_kem_local).collect();
        let kem: Vec<&Measurement> = rounds.iter().map(|r| &r.algs.ml_kem_daemon).collect();
        rows.push(op_row("aws-lc-rs ML-KEM-768 decapsulate, in this process", &kem_local, None));
        rows.push(op_row(
            "daemon `Decapsulate` RPC, ml-kem-768 (key unsealed once, in-core)",
            &kem,
            Some(ratio_of(&p50s(&kem), &p50s(&kem_local), "aws-lc-rs in-process", None)),
        ));
    }
    rows
}

/// The other post-quantum parameter sets and operations: aws-lc-rs in this process, then the
/// vault's path, paired per round.
fn pq_rows(rounds: &[Round]) -> Vec<OpRow> {
    let ops: Vec<crate::algs::PqWhat> =
        rounds.first().map(|r| r.algs.pq.iter().map(|p| p.what).collect()).unwrap_or_default();
    let mut rows = Vec::with_capacity(2 * ops.len());
    for (i, what) in ops.into_iter().enumerate() {
        let local: Vec<&Measurement> = rounds.iter().filter_map(|r| r.algs.pq.get(i).map(|p| &p.local)).collect();
        let vault: Vec<&Measurement> = rounds.iter().filter_map(|r| r.algs.pq.get(i).map(|p| &p.vault)).collect();
        rows.push(op_row(what.local_label(), &local, None));
        let ratio = ratio_of(&p50s(&vault), &p50s(&local), "aws-lc-rs in-process", None);
        rows.push(op_row(what.vault_label(), &vault, Some(ratio)));
    }
    rows
}

/// Random-bytes figures.
fn random_figures(rounds: &[Round]) -> Vec<Figure> {
    let urandom: Vec<f64> = rounds.iter().map(|r| r.ops.random_urandom.bytes_per_sec()).collect();
    let tpm: Vec<f64> = rounds.iter().map(|r| r.ops.random_tpm.bytes_per_sec()).collect();
    let daemon: Vec<f64> = rounds.iter().map(|r| r.ops.random_daemon.bytes_per_sec()).collect();
    let per_call = spread(rounds.iter().map(|r| r.ops.random_tpm.bytes_per_op));
    vec![
        Figure {
            label: "`/dev/urandom`, 1 MiB reads".into(),
            unit: "MiB/s",
            value: spread(urandom.iter().map(|b| b / MIB)),
            goal: None,
            ratio: None,
        },
        Figure {
            label: format!("raw ESAPI `TPM2_GetRandom`, looped ({} B a call)", num(per_call.median, 0)),
            unit: "KiB/s",
            value: spread(tpm.iter().map(|b| b / 1024.0)),
            goal: None,
            ratio: None,
        },
        Figure {
            label: "daemon `GetRandom` RPC, 1 MiB requests".into(),
            unit: "MiB/s",
            value: spread(daemon.iter().map(|b| b / MIB)),
            goal: Some(RANDOM_GOAL),
            ratio: Some(ratio_of(&daemon, &urandom, "/dev/urandom", None)),
        },
        Figure {
            label: "same, against the TPM".into(),
            unit: "MiB/s",
            value: spread(daemon.iter().map(|b| b / MIB)),
            goal: None,
            ratio: Some(ratio_of(&daemon, &tpm, "raw TPM2_GetRandom", None)),
        },
    ]
}

/// Bulk-crypto figures.
fn bulk_figures(rounds: &[Round]) -> Vec<Figure> {
    let col = |f: &dyn Fn(&crate::bulk::BulkRound) -> f64| -> Vec<f64> { rounds.iter().map(|r| f(&r.bulk)).collect() };
    let ossl_aes = col(&|b| b.openssl.as_ref().map_or(f64::NAN, |o| o.aes_gcm));
    let ossl_sha = col(&|b| b.openssl.as_ref().map_or(f64::NAN, |o| o.sha256));
    let (aes, sha) = (col(&|b| b.aes), col(&|b| b.sha));
    let mib = |v: &[f64]| spread(v.iter().map(|b| b / MIB));
    let vs_openssl = |v: &[f64], goal| Some(ratio_of(v, &ossl_aes, "OpenSSL AES-256-GCM", goal));
    let rate = |label: String, v: &[f64], ratio| Figure { label, unit: "MiB/s", value: mib(v), goal: None, ratio };
    let mut figures = vec![
        rate("OpenSSL AES-256-GCM, 16 KiB blocks".into(), &ossl_aes, None),
        rate(
            "vault AES-256-GCM in-core: stream format, 1 MiB writes, 1 thread".into(),
            &aes,
            vs_openssl(&aes, Some(AES_GOAL)),
        ),
        rate("OpenSSL SHA-256, 16 KiB blocks".into(), &ossl_sha, None),
        rate(
            "vault SHA-256 in-core (aws-lc-rs), 16 KiB blocks".into(),
            &sha,
            Some(ratio_of(&sha, &ossl_sha, "OpenSSL SHA-256", None)),
        ),
    ];
    figures.extend(cli_figures(rounds, &ossl_aes));
    figures.extend(library_figures(rounds, &ossl_aes));
    figures.extend(daemon_stream_figures(rounds, &ossl_aes, &aes));
    figures.extend(stream_key_figures(rounds));
    figures
}

/// A byte count as MiB or GiB.
fn size(bytes: u64) -> String {
    let mib = bytes as f64 / MIB;
    if mib >= 1024.0 {
        format!("{} GiB", mib / 1024.0)
    } else {
        format!("{mib} MiB")
    }
}

/// `tpm-vault encrypt`/`decrypt` of a file, pinned to one CPU and on all (NaN when skipped).
fn cli_figures(rounds: &[Round], ossl_aes: &[f64]) -> Vec<Figure> {
    let Some(first) = rounds.iter().find_map(|r| r.bulk.streams.cli.as_ref()) else { return Vec::new() };
    let (file, cpus) = (size(first.bytes), first.cpus);
    let col = |f: fn(&crate::bulk::CliRound) -> f64| -> Vec<f64> {
        rounds.iter().map(|r| r.bulk.streams.cli.as_ref().map_or(f64::NAN, f)).collect()
    };
    let rows: [(&str, &str, Vec<f64>, Goal); 4] = [
        ("encrypt", "1 CPU (`taskset -c 0`)", col(|c| c.encrypt_one), CLI_ONE_GOAL),
        ("decrypt", "1 CPU (`taskset -c 0`)", col(|c| c.decrypt_one), CLI_ONE_GOAL),
        ("encrypt", "every CPU", col(|c| c.encrypt_all), CLI_ALL_GOAL),
        ("decrypt", "every CPU", col(|c| c.decrypt_all), CLI_ALL_GOAL),
    ];
    rows.into_iter()
        .map(|(what, cpus_label, v, goal)| Figure {
            label: format!(
                "`tpm-vault {what}` of a {file} file (page cache warm) to /dev/null, {cpus_label} of {cpus}"
            ),
            unit: "MiB/s",
            value: spread(v.iter().map(|b| b / MIB)),
            goal: None,
            ratio: Some(ratio_of(&v, ossl_aes, "OpenSSL AES-256-GCM", Some(goal))),
        })
        .chain(std::iter::once({
            let (v, cat) = (col(|c| c.encrypt_file), col(|c| c.cat_file));
            Figure {
                label: format!("`tpm-vault encrypt` file → file ({file}, page cache), every CPU of {cpus}"),
                unit: "MiB/s",
                value: spread(v.iter().map(|b| b / MIB)),
                goal: None,
                ratio: Some(ratio_of(&v, &cat, "`cat` file → file", Some(CLI_FILE_GOAL))),
            }
        }))
        .collect()
}

/// The client library from memory, one thread (the target) and every CPU (the floor of the
/// CLI's figure on every CPU).
fn library_figures(rounds: &[Round], ossl_aes: &[f64]) -> Vec<Figure> {
    let Some(first) = rounds.first() else { return Vec::new() };
    let (bytes, all) = (size(first.bulk.streams.library_one.bytes), first.bulk.streams.library_all.threads);
    type Pick = fn(&crate::bulk::Streams) -> f64;
    let rows: [(String, Pick, Option<Goal>); 4] = [
        (
            format!("client library `copy_encrypt` of {bytes} from memory, 1 thread"),
            |s| s.library_one.encrypt,
            Some(LIBRARY_GOAL),
        ),
        (
            format!("client library `copy_decrypt` of {bytes} from memory, 1 thread"),
            |s| s.library_one.decrypt,
            Some(LIBRARY_GOAL),
        ),
        (format!("client library `copy_encrypt` from memory, {all} threads"), |s| s.library_all.encrypt, None),
        (format!("client library `copy_decrypt` from memory, {all} threads"), |s| s.library_all.decrypt, None),
    ];
    rows.into_iter()
        .map(|(label, pick, goal)| {
            let v: Vec<f64> = rounds.iter().map(|r| pick(&r.bulk.streams)).collect();
            Figure {
                label,
                unit: "MiB/s",
                value: spread(v.iter().map(|b| b / MIB)),
                goal: None,
                ratio: Some(ratio_of(&v, ossl_aes, "OpenSSL AES-256-GCM", goal)),
            }
        })
        .collect()
}

/// The daemon's `Encrypt`/`Decrypt` streams (`--in-daemon`): speed, memory and CPU.
fn daemon_stream_figures(rounds: &[Round], ossl_aes: &[f64], aes: &[f64]) -> Vec<Figure> {
    let streams: Vec<&crate::bulk::Streams> = rounds.iter().map(|r| &r.bulk.streams).collect();
    let daemon: Vec<f64> = streams.iter().map(|s| s.daemon.bytes_per_sec()).collect();
    let tuned: Vec<f64> = streams.iter().map(|s| s.tuned.bytes_per_sec()).collect();
    let decrypt: Vec<f64> = streams.iter().map(|s| s.daemon.decrypt_bytes_per_sec()).collect();
    let first = streams.first().map(|s| (s.daemon.bytes, s.daemon.decrypt_bytes, s.tuned.bytes)).unwrap_or_default();
    let (stream_size, decrypt_size, tuned_size) = (size(first.0), size(first.1), size(first.2));
    let rss_before: Vec<f64> = streams.iter().map(|s| s.daemon.rss_before_kib as f64 / 1024.0).collect();
    let growth: Vec<f64> =
        streams.iter().map(|s| s.daemon.rss_peak_kib.saturating_sub(s.daemon.rss_before_kib) as f64 / 1024.0).collect();
    let per_gib = |cpu: std::time::Duration, bytes: u64| cpu.as_secs_f64() * (1u64 << 30) as f64 / bytes.max(1) as f64;
    let daemon_cpu: Vec<f64> =
        streams.iter().map(|s| per_gib(s.daemon.cpu.daemon.unwrap_or_default(), s.daemon.bytes)).collect();
    let client_cpu: Vec<f64> = streams.iter().map(|s| per_gib(s.daemon.cpu.bench, s.daemon.bytes)).collect();
    let aes_cpu: Vec<f64> = aes.iter().map(|b| (1u64 << 30) as f64 / b).collect();
    let mib = |v: &[f64]| spread(v.iter().map(|b| b / MIB));
    let vs_openssl = |v: &[f64], goal| Some(ratio_of(v, ossl_aes, "OpenSSL AES-256-GCM", goal));
    let cpu_vs_aes = |v: &[f64]| Some(ratio_of(v, &aes_cpu, "in-core AES-GCM per GiB", None));
    vec![
        Figure {
            label: format!(
                "daemon `Encrypt` stream of {stream_size} over the Unix socket (`--in-daemon`: client library on a \
                 current-thread runtime)"
            ),
            unit: "MiB/s",
            value: mib(&daemon),
            goal: None,
            ratio: vs_openssl(&daemon, Some(STREAM_GOAL)),
        },
        Figure {
            label: format!("daemon `Decrypt` stream of {decrypt_size} from memory (`--in-daemon`)"),
            unit: "MiB/s",
            value: mib(&decrypt),
            goal: None,
            ratio: vs_openssl(&decrypt, None),
        },
        Figure {
            label: format!(
                "a {tuned_size} daemon stream with tonic directly: 1 MiB messages, 16 MiB HTTP/2 windows on the \
                 client (diagnostic)"
            ),
            unit: "MiB/s",
            value: mib(&tuned),
            goal: None,
            ratio: vs_openssl(&tuned, None),
        },
        Figure {
            label: "daemon RSS growth during the `Encrypt` stream (peak − before)".into(),
            unit: "MiB",
            value: spread(growth.iter().copied()),
            goal: None,
            ratio: Some(ratio_of(&growth, &rss_before, "RSS before the stream", None)),
        },
        Figure {
            label: "daemon CPU per GiB streamed".into(),
            unit: "s CPU",
            value: spread(daemon_cpu.iter().copied()),
            goal: None,
            ratio: cpu_vs_aes(&daemon_cpu),
        },
        Figure {
            label: "client library (current-thread, this process) CPU per GiB streamed through the daemon".into(),
            unit: "s CPU",
            value: spread(client_cpu.iter().copied()),
            goal: None,
            ratio: cpu_vs_aes(&client_cpu),
        },
    ]
}

/// The cost of opening a stream: one `CreateStreamKey` round trip against one raw TPM command
/// (raw ESAPI `TPM2_Sign`, P-256) and against a bare gRPC round trip.
fn stream_key_figures(rounds: &[Round]) -> Vec<Figure> {
    let p50 = |m: &Measurement| us(m.p50());
    let key: Vec<f64> = rounds.iter().map(|r| p50(&r.bulk.streams.stream_key)).collect();
    let raw: Vec<f64> = rounds.iter().map(|r| p50(&r.raw)).collect();
    let grpc: Vec<f64> = rounds.iter().map(|r| p50(&r.floor)).collect();
    let row = |label: &str, peer: &[f64], name: &str| Figure {
        label: label.into(),
        unit: "µs p50",
        value: spread(key.iter().copied()),
        goal: None,
        ratio: Some(ratio_of(&key, peer, name, None)),
    };
    vec![
        row(
            "opening a stream: `CreateStreamKey` RPC (data key cached: no TPM command) + an empty final chunk",
            &raw,
            "one raw ESAPI `TPM2_Sign`",
        ),
        row("same, against a bare gRPC round trip", &grpc, "bare gRPC health check"),
    ]
}

/// The SSH agent: signatures/s through its socket against gRPC `Sign` at each concurrency.
fn agent_figures(rounds: &[Round]) -> Vec<Figure> {
    let levels: Vec<usize> =
        rounds.first().map(|r| r.agent.levels.iter().map(|l| l.clients).collect()).unwrap_or_default();
    let mut figures = Vec::new();
    for (i, clients) in levels.into_iter().enumerate() {
        let col = |f: fn(&crate::agent::AgentLevel) -> f64| -> Vec<f64> {
            rounds.iter().map(|r| r.agent.levels.get(i).map_or(f64::NAN, f)).collect()
        };
        let (agent, grpc) = (col(|l| l.agent), col(|l| l.grpc));
        let callers = if clients == 1 { "1 client".to_owned() } else { format!("{clients} concurrent clients") };
        figures.push(Figure {
            label: format!("daemon gRPC `Sign` of a 32-byte message, ECDSA P-256, {callers}"),
            unit: "signs/s",
            value: spread(grpc.iter().copied()),
            goal: None,
            ratio: None,
        });
        figures.push(Figure {
            label: format!("`tpm-vault ssh-agent` `SSH_AGENTC_SIGN_REQUEST`, ECDSA P-256, {callers}"),
            unit: "signs/s",
            value: spread(agent.iter().copied()),
            goal: None,
            ratio: Some(ratio_of(&agent, &grpc, &format!("gRPC `Sign`, {callers}"), Some(AGENT_GOAL))),
        });
    }
    figures
}

/// The raw cold-signature peer and the smallest key set's cold signature against it.
fn cold_peer_rows(rounds: &[Round]) -> Vec<OpRow> {
    let raw: Vec<&Measurement> = rounds.iter().map(|r| &r.ops.sign_cold_raw).collect();
    let cold: Vec<&Measurement> = rounds.iter().filter_map(|r| r.scale.counts.first().map(|c| &c.cold)).collect();
    let Some(n) = rounds.first().and_then(|r| r.scale.counts.first()).map(|c| c.count) else { return Vec::new() };
    vec![
        op_row("raw ESAPI `TPM2_Load` + `TPM2_Sign` + `TPM2_FlushContext`", &raw, None),
        op_row(
            format!("sign, key not loaded, {} keys, against it", num(n as f64, 0)),
            &cold,
            Some(ratio_of(&p50s(&cold), &p50s(&raw), "raw load + sign + flush", None)),
        ),
    ]
}

/// Key-count rows, smallest key set first.
fn scale_rows(rounds: &[Round]) -> Vec<ScaleRow> {
    let counts: Vec<usize> =
        rounds.first().map(|r| r.scale.counts.iter().map(|c| c.count).collect()).unwrap_or_default();
    let Some(&smallest) = counts.first() else { return Vec::new() };
    let at = |n: usize| -> Vec<&crate::scale::CountRound> {
        rounds.iter().filter_map(|r| r.scale.counts.iter().find(|c| c.count == n)).collect()
    };
    let base = at(smallest);
    let base_ready: Vec<f64> = base.iter().map(|c| c.ready.as_secs_f64() * 1e3).collect();
    let base_rss: Vec<f64> = base.iter().map(|c| c.rss_after_kib as f64 / 1024.0).collect();
    let base_cached: Vec<&Measurement> = base.iter().map(|c| &c.cached).collect();
    let keys = |n: usize| format!("{} keys", num(n as f64, 0));
    counts
        .iter()
        .map(|&n| {
            let cs = at(n);
            let ready: Vec<f64> = cs.iter().map(|c| c.ready.as_secs_f64() * 1e3).collect();
            let rss_after: Vec<f64> = cs.iter().map(|c| c.rss_after_kib as f64 / 1024.0).collect();
            let cached: Vec<&Measurement> = cs.iter().map(|c| &c.cached).collect();
            let cold: Vec<&Measurement> = cs.iter().map(|c| &c.cold).collect();
            let vs_base = n != smallest;
            ScaleRow {
                count: n,
                ready_ms: spread(ready.iter().copied()),
                ready_ratio: vs_base.then(|| ratio_of(&ready, &base_ready, &keys(smallest), None)),
                rss_idle: spread(cs.iter().map(|c| c.rss_idle_kib as f64 / 1024.0)),
                rss_after: spread(rss_after.iter().copied()),
                rss_ratio: vs_base.then(|| ratio_of(&rss_after, &base_rss, &keys(smallest), None)),
                cached: op_row(
                    format!("sign, key loaded, {}", keys(n)),
                    &cached,
                    vs_base.then(|| ratio_of(&p50s(&cached), &p50s(&base_cached), &keys(smallest), None)),
                ),
                cold: op_row(
                    format!("sign, key not loaded, {}", keys(n)),
                    &cold,
                    Some(ratio_of(&p50s(&cold), &p50s(&cached), "key loaded", None)),
                ),
            }
        })
        .collect()
}

/// Library/raw throughput target.
pub const ACTOR_GOAL: Goal = Goal::AtLeast(0.97);
/// Daemon/raw throughput target at [`DAEMON_GOAL_CLIENTS`].
pub const DAEMON_GOAL: Goal = Goal::AtLeast(0.95);
/// Concurrency at which [`DAEMON_GOAL`] applies.
pub const DAEMON_GOAL_CLIENTS: usize = 16;
/// Added p50 latency target at one client, µs.
pub const ADDED_LATENCY_GOAL: Goal = Goal::Below(150.0);

/// What the daemon's threads do, by the names `tpm-vaultd` gives them.
fn thread_label(name: &str) -> String {
    match name {
        "tpm-vaultd" => "`tpm-vaultd` (tokio workers: gRPC/HTTP2, access check, audit, logging)".into(),
        "tpm" => "`tpm` (TPM actor: ESAPI, TCTI socket I/O)".into(),
        other => format!("`{other}`"),
    }
}

fn us(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn spread(values: impl Iterator<Item = f64>) -> Spread {
    let v: Vec<f64> = values.collect();
    Spread::of(&v).unwrap_or(Spread { median: f64::NAN, min: f64::NAN, max: f64::NAN })
}

fn ratio_of(num: &[f64], den: &[f64], peer: &str, goal: Option<Goal>) -> Ratio {
    let values = num.iter().zip(den).map(|(n, d)| if *d > 0.0 { n / d } else { f64::NAN });
    Ratio { peer: peer.into(), value: spread(values), goal }
}

/// The daemon's measurement at `clients` in round `r`.
fn level(r: &Round, clients: usize) -> Option<&Measurement> {
    r.daemon.levels.iter().find(|l| l.clients == clients).map(|l| &l.m)
}

/// The tpm2-tools measurement of variant `v` in round `r`.
fn tool(r: &Round, v: Variant) -> Option<&Measurement> {
    r.tools.iter().find(|(x, _)| *x == v).map(|(_, m)| m)
}

/// The daemon's concurrency levels (the first round's; every round has the same).
fn levels(rounds: &[Round]) -> Vec<usize> {
    rounds.first().map(|r| r.daemon.levels.iter().map(|l| l.clients).collect()).unwrap_or_default()
}

/// The tpm2-tools variants that ran.
fn variants(rounds: &[Round]) -> Vec<Variant> {
    rounds.first().map(|r| r.tools.iter().map(|(v, _)| *v).collect()).unwrap_or_default()
}

/// `1 client`, `16 clients`.
fn clients(c: usize) -> String {
    format!("{c} client{}", if c == 1 { "" } else { "s" })
}

/// CPU ms per 1,000 operations of `m`.
fn per_1000(m: &Measurement, cpu: Duration) -> f64 {
    m.cpu_per_1000(cpu)
}

impl Figure {
    /// A figure without a goal or a peer.
    fn plain(label: impl Into<String>, unit: &'static str, value: Spread) -> Self {
        Self { label: label.into(), unit, value, goal: None, ratio: None }
    }

    /// A figure of per-round `values` with its ratio to `peer`'s values of the same rounds.
    fn against(label: impl Into<String>, unit: &'static str, values: &[f64], peer: &[f64], name: &str) -> Self {
        Self {
            label: label.into(),
            unit,
            value: spread(values.iter().copied()),
            goal: None,
            ratio: Some(ratio_of(values, peer, name, None)),
        }
    }
}

/// The signing table: raw ESAPI, the library at 1 and 2 callers, the daemon per level,
/// tpm2-tools per variant, each with its rate ratio against its peer.
fn sign_rows(rounds: &[Round]) -> Vec<SignRow> {
    let raw_rate: Vec<f64> = rounds.iter().map(|r| r.raw.rate()).collect();
    let daemon1_rate: Vec<f64> = rounds.iter().filter_map(|r| level(r, 1)).map(Measurement::rate).collect();
    // (path, label, per-round measurements)
    let mut paths: Vec<(Path, String, Vec<&Measurement>)> = vec![
        (Path::Raw, "raw ESAPI, in-process".into(), rounds.iter().map(|r| &r.raw).collect()),
        (Path::Actor(1), "vault library (TPM actor), 1 caller".into(), rounds.iter().map(|r| &r.actor).collect()),
        (
            Path::Actor(ACTOR_CALLERS),
            format!("vault library (TPM actor), {ACTOR_CALLERS} callers"),
            rounds.iter().map(|r| &r.actor_callers).collect(),
        ),
    ];
    for c in levels(rounds) {
        let ms = rounds.iter().filter_map(|r| level(r, c)).collect();
        paths.push((Path::Daemon(c), format!("daemon over gRPC/UDS, {}", clients(c)), ms));
    }
    for v in variants(rounds) {
        let ms = rounds.iter().filter_map(|r| tool(r, v)).collect();
        paths.push((Path::Tools(v), v.label().into(), ms));
    }
    let ratio = |path: Path, rate: &[f64]| match path {
        Path::Raw => None,
        Path::Actor(c) => Some(ratio_of(rate, &raw_rate, "raw", (c == 1).then_some(ACTOR_GOAL))),
        Path::Daemon(c) => Some(ratio_of(rate, &raw_rate, "raw", (c == DAEMON_GOAL_CLIENTS).then_some(DAEMON_GOAL))),
        Path::Tools(_) if !daemon1_rate.is_empty() => Some(ratio_of(rate, &daemon1_rate, "daemon, 1 client", None)),
        Path::Tools(_) => None,
    };
    paths
        .into_iter()
        .map(|(path, label, ms)| {
            let rate: Vec<f64> = ms.iter().map(|m| m.rate()).collect();
            SignRow {
                path,
                label,
                rate: spread(rate.iter().copied()),
                p50_us: spread(ms.iter().map(|m| us(m.p50()))),
                p99_us: spread(ms.iter().map(|m| us(m.p99()))),
                ratio: ratio(path, &rate),
            }
        })
        .collect()
}

/// What the vault adds to one signature, and the floors under it.
fn latency_figures(rounds: &[Round]) -> Vec<Figure> {
    let raw_p50: Vec<f64> = rounds.iter().map(|r| us(r.raw.p50())).collect();
    let added = |p50s: Vec<f64>| spread(p50s.iter().zip(&raw_p50).map(|(a, b)| a - b));
    let mut latency = vec![Figure::plain(
        "vault library, 1 caller: p50 − raw p50",
        "µs",
        added(rounds.iter().map(|r| us(r.actor.p50())).collect()),
    )];
    if levels(rounds).contains(&1) {
        latency.push(Figure {
            goal: Some(ADDED_LATENCY_GOAL),
            ..Figure::plain(
                "daemon, 1 client: p50 − raw p50",
                "µs",
                added(rounds.iter().filter_map(|r| level(r, 1)).map(|m| us(m.p50())).collect()),
            )
        });
    }
    let p50 = |f: fn(&Round) -> &Measurement| -> Vec<f64> { rounds.iter().map(|r| us(f(r).p50())).collect() };
    let floor = p50(|r| &r.floor);
    let one_sign = "raw ESAPI p50 (one TPM2_Sign)";
    latency.extend([
        Figure::against(
            "TPM actor hand-off alone (empty job, no TPM command): p50",
            "µs",
            &p50(|r| &r.handoff),
            &raw_p50,
            one_sign,
        ),
        Figure::against(
            "thread round trip alone: two OS threads, std channels, no work: p50",
            "µs",
            &p50(|r| &r.threads),
            &raw_p50,
            one_sign,
        ),
        Figure::against(
            "gRPC round trip alone: bare tonic server (health check only, own process), 1 client: p50",
            "µs",
            &floor,
            &raw_p50,
            one_sign,
        ),
        Figure::against(
            "daemon health check (its gRPC stack, no TPM job), 1 client: p50",
            "µs",
            &p50(|r| &r.daemon.health),
            &floor,
            "bare tonic round trip",
        ),
    ]);
    latency
}

/// One access-policy decision with the shipped and example policies.
fn policy_figures(rounds: &[Round]) -> Vec<Figure> {
    let Some(first) = rounds.first() else { return Vec::new() };
    let per_decision = rounds.iter().map(|r| r.policy.m.p50().as_secs_f64() * 1e9 / r.policy.batch.max(1) as f64);
    let label = format!(
        "one access-policy decision (`Policy::decide`, {} rules: the shipped default and the examples), \
         p50 of batches of {}",
        first.policy.rules,
        num(first.policy.batch as f64, 0)
    );
    vec![Figure { goal: Some(POLICY_GOAL), ..Figure::plain(label, "ns", spread(per_decision)) }]
}

/// Start, memory and logging of the daemon.
fn daemon_figures(rounds: &[Round]) -> Vec<Figure> {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let idle: Vec<f64> = rounds.iter().map(|r| mib(r.daemon.rss_idle_kib)).collect();
    let loaded: Vec<f64> = rounds.iter().map(|r| mib(r.daemon.rss_loaded_kib)).collect();
    let max_clients = levels(rounds).iter().max().copied().unwrap_or(0);
    let lines = rounds.iter().map(|r| r.daemon.log_lines as f64 * 1000.0 / r.daemon.requests.max(1) as f64);
    vec![
        Figure::plain(
            "start to ready (spawn until the socket accepts)",
            "ms",
            spread(rounds.iter().map(|r| r.daemon.ready.as_secs_f64() * 1e3)),
        ),
        Figure::plain("RSS after start, idle", "MiB", spread(idle.iter().copied())),
        Figure::against(format!("RSS after the load (up to {max_clients} clients)"), "MiB", &loaded, &idle, "idle RSS"),
        Figure::plain("log lines written per 1,000 requests", "lines", spread(lines)),
    ]
}

/// CPU per 1,000 signatures: raw ESAPI, the library and the TPM under them.
fn cpu_figures(rounds: &[Round]) -> Vec<Figure> {
    let col = |f: &dyn Fn(&Round) -> Option<f64>| -> Vec<f64> { rounds.iter().filter_map(f).collect() };
    let raw_cpu = col(&|r| Some(per_1000(&r.raw, r.raw.cpu.bench)));
    let raw_swtpm = col(&|r| Some(per_1000(&r.raw, r.raw.cpu.swtpm)));
    let actor_swtpm = col(&|r| Some(per_1000(&r.actor, r.actor.cpu.swtpm)));
    let mut cpu = vec![
        Figure::plain("raw ESAPI: this process", "ms", spread(raw_cpu.iter().copied())),
        Figure::plain("raw ESAPI: swtpm", "ms", spread(raw_swtpm.iter().copied())),
        Figure::against("vault library: swtpm", "ms", &actor_swtpm, &raw_swtpm, "raw ESAPI: swtpm"),
    ];
    if levels(rounds).contains(&DAEMON_GOAL_CLIENTS) {
        let d_swtpm = col(&|r| level(r, DAEMON_GOAL_CLIENTS).map(|m| per_1000(m, m.cpu.swtpm)));
        let label = format!("daemon, {DAEMON_GOAL_CLIENTS} clients: swtpm");
        cpu.push(Figure::against(label, "ms", &d_swtpm, &raw_swtpm, "raw ESAPI: swtpm"));
    }
    let actor_cpu = col(&|r| Some(per_1000(&r.actor, r.actor.cpu.bench)));
    cpu.push(Figure::against("vault library: this process", "ms", &actor_cpu, &raw_cpu, "raw ESAPI process"));
    cpu.extend(process_cpu_figures(rounds, &raw_cpu));
    cpu
}

/// CPU per 1,000 signatures of the daemon and its clients per level, and of tpm2-tools.
fn process_cpu_figures(rounds: &[Round], raw_cpu: &[f64]) -> Vec<Figure> {
    let per_level = |c: usize, cpu: fn(&Measurement) -> Duration| -> Vec<f64> {
        rounds.iter().filter_map(|r| level(r, c)).map(|m| per_1000(m, cpu(m))).collect()
    };
    let levels = levels(rounds);
    let daemon = levels.iter().map(|&c| {
        let v = per_level(c, |m| m.cpu.daemon.unwrap_or_default());
        Figure::against(format!("daemon process, {}", clients(c)), "ms", &v, raw_cpu, "raw ESAPI process")
    });
    let client_side = levels.iter().map(|&c| {
        let v = per_level(c, |m| m.cpu.bench);
        Figure::against(format!("gRPC clients (this process), {}", clients(c)), "ms", &v, raw_cpu, "raw ESAPI process")
    });
    let tools = variants(rounds).into_iter().map(|v| {
        let t: Vec<f64> = rounds.iter().filter_map(|r| tool(r, v)).map(|m| per_1000(m, m.cpu.children)).collect();
        Figure::against(format!("{}: the tpm2 processes", v.label()), "ms", &t, raw_cpu, "raw ESAPI process")
    });
    daemon.chain(client_side).chain(tools).collect()
}

/// The daemon's CPU per 1,000 requests by thread at [`DAEMON_GOAL_CLIENTS`] clients.
fn thread_figures(rounds: &[Round]) -> Vec<Figure> {
    let at_goal = || rounds.iter().filter_map(|r| r.daemon.levels.iter().find(|l| l.clients == DAEMON_GOAL_CLIENTS));
    let mut names: Vec<String> = at_goal().flat_map(|l| l.threads.iter().map(|(n, _)| n.clone())).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let per_round = at_goal().map(|l| {
                let cpu = l.threads.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).unwrap_or_default();
                per_1000(&l.m, cpu)
            });
            Figure::plain(thread_label(&name), "ms", spread(per_round))
        })
        .collect()
}

/// The targets of the signing, latency and operation figures.
fn checks(s: &Summary) -> Vec<Check> {
    let ratio_check = |what: String, value: &Spread, goal: Goal, suspect: bool| Check {
        what,
        value: value.median,
        unit: "×",
        decimals: 2,
        goal,
        suspect,
    };
    let mut checks = Vec::new();
    for row in &s.sign {
        if let Some(Ratio { value, goal: Some(goal), .. }) = &row.ratio {
            let what = format!("{} ÷ raw, signs/s", row.label);
            checks.push(ratio_check(what, value, *goal, value.median > CEILING_SLACK));
        }
    }
    let value_check = |f: &Figure, what: String, unit: &'static str| {
        f.goal.map(|goal| Check { what, value: f.value.median, unit, decimals: 0, goal, suspect: false })
    };
    checks.extend(s.latency.iter().filter_map(|f| value_check(f, format!("added latency, {}", f.label), " µs")));
    for row in &s.ops {
        if let Some(Ratio { value, goal: Some(goal), peer }) = &row.ratio {
            let what = format!("{} p50 ÷ {peer} p50", row.label);
            checks.push(ratio_check(what, value, *goal, value.median < 1.0 / CEILING_SLACK));
        }
    }
    for f in s.bulk.iter().chain(&s.random).chain(&s.agent) {
        if let Some(Ratio { value, goal: Some(goal), peer }) = &f.ratio {
            if value.median.is_finite() {
                checks.push(ratio_check(format!("{} ÷ {peer}", f.label), value, *goal, false));
            }
        }
        checks.extend(value_check(f, f.label.clone(), " MiB/s"));
    }
    checks.extend(s.policy.iter().filter_map(|f| value_check(f, f.label.clone(), " ns")));
    checks
}

impl Summary {
    /// Summarises `rounds` (which must all have the same daemon levels and tool variants).
    pub fn new(rounds: &[Round]) -> Self {
        let mut s = Self {
            rounds: rounds.len(),
            sign: sign_rows(rounds),
            latency: latency_figures(rounds),
            policy: policy_figures(rounds),
            daemon: daemon_figures(rounds),
            cpu: cpu_figures(rounds),
            daemon_threads: thread_figures(rounds),
            ops: ops_rows(rounds),
            random: random_figures(rounds),
            bulk: bulk_figures(rounds),
            agent: agent_figures(rounds),
            scale: scale_rows(rounds),
            algs: algs_rows(rounds),
            pq: pq_rows(rounds),
            cold_peer: cold_peer_rows(rounds),
            checks: Vec::new(),
        };
        s.checks = checks(&s);
        s
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::agent::{AgentLevel, AgentRound};
    use crate::algs::{PqOp, PqWhat};
    use crate::bulk::{CliRound, LocalRates, Openssl, StreamRound, Streams};
    use crate::ops::ByteRate;
    use crate::scale::CountRound;
    use crate::sign::daemon::Level;
    use crate::stats::CpuUse;
    use tpm_vault_daemon::model::KeyAlg;

    /// A measurement of `ops` operations of `lat_us` each over one second.
    pub fn m(ops: usize, lat_us: u64) -> Measurement {
        Measurement::finish(
            vec![Duration::from_micros(lat_us); ops],
            Duration::from_secs(1),
            CpuUse {
                bench: Duration::from_millis(ops as u64 / 10),
                children: Duration::from_millis(ops as u64),
                daemon: Some(Duration::from_millis(ops as u64 / 5)),
                swtpm: Duration::from_millis(ops as u64 / 2),
            },
        )
    }

    fn daemon_round(raw: usize, d16: usize) -> DaemonRound {
        DaemonRound {
            ready: Duration::from_millis(40),
            rss_idle_kib: 10 * 1024,
            rss_loaded_kib: 12 * 1024,
            levels: vec![
                Level { clients: 1, m: m(raw * 9 / 10, 800), threads: vec![] },
                Level {
                    clients: 16,
                    m: m(d16, 10_000),
                    threads: vec![
                        ("tpm".into(), Duration::from_millis(d16 as u64 / 20)),
                        ("tpm-vaultd".into(), Duration::from_millis(d16 as u64 / 5)),
                    ],
                },
            ],
            requests: 5000,
            log_lines: 10,
            health: m(4000, 200),
        }
    }

    fn ops_round(raw: usize) -> OpsRound {
        OpsRound {
            quote_raw: m(raw, 1000),
            quote_raw_pcr: m(raw, 1100),
            quote_daemon: m(raw, 1050),
            seal_raw: m(raw, 2000),
            seal_daemon: m(raw, 3000),
            unseal_raw: m(raw, 2500),
            unseal_daemon: m(raw, 2600),
            unseal_auth_raw: m(raw, 4000),
            unseal_auth_daemon: m(raw, 4400),
            sign_cold_raw: m(raw, 1500),
            random_tpm: ByteRate { m: m(1000, 100), bytes_per_op: 64.0 },
            random_urandom: ByteRate { m: m(300, 3000), bytes_per_op: MIB },
            random_daemon: ByteRate { m: m(400, 2500), bytes_per_op: MIB },
        }
    }

    fn bulk_round() -> BulkRound {
        BulkRound {
            aes: 3000.0 * MIB,
            sha: 1500.0 * MIB,
            openssl: Some(Openssl { aes_gcm: 3200.0 * MIB, sha256: 1600.0 * MIB, ecdsa_sign: 40_000.0 }),
            streams: Streams {
                daemon: StreamRound {
                    bytes: 1 << 30,
                    elapsed: Duration::from_millis(500),
                    rss_before_kib: 20 * 1024,
                    rss_peak_kib: 22 * 1024,
                    cpu: CpuUse::default(),
                    decrypt_bytes: 256 << 20,
                    decrypt_elapsed: Duration::from_millis(160),
                },
                tuned: StreamRound { bytes: 1 << 30, elapsed: Duration::from_millis(400), ..Default::default() },
                library_one: LocalRates { threads: 1, bytes: 256 << 20, encrypt: 3100.0 * MIB, decrypt: 3050.0 * MIB },
                library_all: LocalRates { threads: 2, bytes: 256 << 20, encrypt: 6000.0 * MIB, decrypt: 5900.0 * MIB },
                stream_key: m(5000, 140),
                cli: Some(CliRound {
                    bytes: 1 << 30,
                    cpus: 2,
                    encrypt_one: 2800.0 * MIB,
                    decrypt_one: 2700.0 * MIB,
                    encrypt_all: 4800.0 * MIB,
                    decrypt_all: 4600.0 * MIB,
                    encrypt_file: 2600.0 * MIB,
                    cat_file: 3100.0 * MIB,
                }),
            },
        }
    }

    fn algs_round(raw: usize) -> AlgsRound {
        AlgsRound {
            tpm: vec![(KeyAlg::EccP384, m(raw / 2, 1400), m(raw / 3, 1800))],
            ml_dsa_local: m(5000, 200),
            ml_dsa_daemon: m(2500, 400),
            hybrid_daemon: m(900, 1050),
            ml_kem_local: m(20000, 50),
            ml_kem_daemon: m(4000, 250),
            pq: vec![
                PqOp { what: PqWhat::Sign(KeyAlg::MlDsa44), local: m(8000, 125), vault: m(3000, 330) },
                PqOp { what: PqWhat::Decapsulate(KeyAlg::MlKem1024), local: m(15000, 60), vault: m(4000, 240) },
            ],
        }
    }

    pub fn round(raw: usize, actor: usize, d16: usize) -> Round {
        Round {
            raw: m(raw, 700),
            actor: m(actor, 710),
            actor_callers: m(actor, 1400),
            policy: PolicyRound { m: m(1000, 40), batch: 1000, rules: 4 },
            handoff: m(1000, 20),
            threads: m(1000, 20),
            floor: m(5000, 150),
            daemon: daemon_round(raw, d16),
            tools: vec![(Variant::SignFlush, m(50, 20_000))],
            ops: ops_round(raw),
            bulk: bulk_round(),
            scale: ScaleRound {
                counts: [10, 1000]
                    .into_iter()
                    .map(|count| CountRound {
                        count,
                        ready: Duration::from_millis(40 + count as u64 / 100),
                        rss_idle_kib: 20 * 1024,
                        rss_after_kib: 21 * 1024,
                        cached: m(raw, 700),
                        cold: m(raw / 3, 2100),
                    })
                    .collect(),
            },
            agent: AgentRound {
                levels: vec![
                    AgentLevel { clients: 1, agent: 950.0, grpc: 1000.0 },
                    AgentLevel { clients: 8, agent: 1900.0, grpc: 2000.0 },
                ],
            },
            algs: algs_round(raw),
        }
    }

    #[test]
    fn algorithm_rows_pair_each_path_with_its_peer() {
        let s = Summary::new(&[round(1000, 990, 960)]);
        let labels: Vec<&str> = s.algs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels.len(), 7, "{labels:?}");
        assert!(labels[0].contains("ecc-p384") && labels[0].contains("ecdsa, sha384"), "{labels:?}");
        let p384 = s.algs[1].ratio.as_ref().unwrap_or_else(|| panic!("P-384 ratio"));
        assert!((p384.value.median - 1800.0 / 1400.0).abs() < 1e-9);
        let ml_dsa = s.algs[3].ratio.as_ref().unwrap_or_else(|| panic!("ML-DSA ratio"));
        assert_eq!(ml_dsa.peer, "aws-lc-rs in-process");
        assert!((ml_dsa.value.median - 2.0).abs() < 1e-9);
        let hybrid = s.algs[4].ratio.as_ref().unwrap_or_else(|| panic!("hybrid ratio"));
        assert!((hybrid.value.median - 1050.0 / 700.0).abs() < 1e-9, "against the round's raw P-256");
        let kem = s.algs[6].ratio.as_ref().unwrap_or_else(|| panic!("ML-KEM ratio"));
        assert!((kem.value.median - 5.0).abs() < 1e-9);
    }

    #[test]
    fn ratios_are_paired_per_round_and_checked() {
        let s = Summary::new(&[round(1000, 990, 960), round(2000, 1900, 1800), round(1500, 1470, 1440)]);
        assert_eq!(s.rounds, 3);
        let actor = s.sign.iter().find(|r| r.path == Path::Actor(1)).unwrap_or_else(|| panic!("actor"));
        let ratio = actor.ratio.as_ref().unwrap_or_else(|| panic!("ratio"));
        assert!((ratio.value.median - 0.98).abs() < 1e-9);
        assert!((ratio.value.min - 0.95).abs() < 1e-9);
        assert!((ratio.value.max - 0.99).abs() < 1e-9);
        assert_eq!(s.checks.len(), 17);
        let verdicts: Vec<&str> = s.checks.iter().map(Check::verdict).collect();
        // actor 0.98 ≥ 0.97; daemon@16 0.96 ≥ 0.95; added latency 100 µs < 150; quote 1.05 ≤ 1.1;
        // AES 0.94 ≥ 0.9; CLI on 1 CPU 0.88 and 0.84 ≥ 0.8, on 2 CPUs 1.5 and 1.44 ≥ 1.4; file → file 0.84 of `cat` ≥ 0.8;
        // library 0.97 and 0.95 ≥ 0.95; stream 0.64 ≥ 0.4; GetRandom 400 MiB/s ≥ 200; the SSH
        // agent 0.95 ≥ 0.9 at 1 and 8 clients; a policy decision 40 ns < 2,000.
        assert_eq!(verdicts, ["PASS"; 17]);
        let two = s.sign.iter().find(|r| r.path == Path::Actor(2)).unwrap_or_else(|| panic!("2 callers"));
        let two = two.ratio.as_ref().unwrap_or_else(|| panic!("2-caller ratio"));
        assert!((two.value.median - 0.98).abs() < 1e-9 && two.goal.is_none(), "{two:?}");
        let tools = s.sign.iter().find(|r| matches!(r.path, Path::Tools(_))).unwrap_or_else(|| panic!("tools"));
        assert_eq!(tools.ratio.as_ref().map(|r| r.peer.as_str()), Some("daemon, 1 client"));
        let added = &s.latency[1];
        assert!((added.value.median - 100.0).abs() < 1e-6);
        assert_eq!(s.daemon_threads.len(), 2);
        assert!((s.daemon_threads[0].value.median - 50.0).abs() < 1e-6, "{:?}", s.daemon_threads[0]);
    }

    #[test]
    fn phases_beyond_signing() {
        let s = Summary::new(&[round(1000, 990, 960), round(2000, 1900, 1800)]);
        let quote = s.ops.iter().find(|r| r.label == "daemon `Quote` RPC").unwrap_or_else(|| panic!("quote"));
        let ratio = quote.ratio.as_ref().unwrap_or_else(|| panic!("ratio"));
        assert!((ratio.value.median - 1.05).abs() < 1e-9, "{ratio:?}");
        assert_eq!(ratio.goal, Some(QUOTE_GOAL));
        assert_eq!(s.scale.len(), 2);
        assert!(s.scale[0].ready_ratio.is_none() && s.scale[1].ready_ratio.is_some());
        let cold = s.scale[1].cold.ratio.as_ref().unwrap_or_else(|| panic!("cold ratio"));
        assert!((cold.value.median - 3.0).abs() < 1e-9, "{cold:?}");
        let random = &s.random[2];
        assert!((random.value.median - 400.0).abs() < 1e-9, "{random:?}");
        let stream = s.bulk.iter().find(|f| f.label.contains("stream of 1 GiB")).unwrap_or_else(|| panic!("stream"));
        assert!((stream.value.median - 2048.0).abs() < 1e-6, "{stream:?}");
        let growth = s.bulk.iter().find(|f| f.label.contains("RSS growth")).unwrap_or_else(|| panic!("growth"));
        assert!((growth.value.median - 2.0).abs() < 1e-9);
        let key = s.bulk.iter().find(|f| f.label.starts_with("opening a stream")).unwrap_or_else(|| panic!("key"));
        let vs_raw = key.ratio.as_ref().unwrap_or_else(|| panic!("stream key ratio"));
        assert!((key.value.median - 140.0).abs() < 1e-9 && (vs_raw.value.median - 0.2).abs() < 1e-9, "{key:?}");
        let cli = s.bulk.iter().find(|f| f.label.starts_with("`tpm-vault encrypt`")).unwrap_or_else(|| panic!("cli"));
        assert!((cli.ratio.as_ref().map_or(0.0, |r| r.value.median) - 2800.0 / 3200.0).abs() < 1e-9, "{cli:?}");
        let policy = s.policy.first().unwrap_or_else(|| panic!("policy"));
        assert!((policy.value.median - 40.0).abs() < 1e-9, "{policy:?}");
        assert!(policy.label.contains("4 rules") && policy.goal == Some(POLICY_GOAL), "{policy:?}");
        let labels: Vec<&str> = s.pq.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels.len(), 4, "{labels:?}");
        assert!(labels[0].contains("ML-DSA-44") && labels[3].contains("ml-kem-1024"), "{labels:?}");
        let decap = s.pq[3].ratio.as_ref().unwrap_or_else(|| panic!("ML-KEM-1024 ratio"));
        assert!((decap.value.median - 4.0).abs() < 1e-9, "{decap:?}");
    }

    #[test]
    fn misses_are_reported() {
        let s = Summary::new(&[round(1000, 900, 500)]);
        let verdicts: Vec<&str> = s.checks.iter().map(Check::verdict).collect();
        assert_eq!(verdicts[..2], ["MISS", "MISS"]);
        assert!(verdicts[2..].iter().all(|v| *v == "PASS"), "{verdicts:?}");
        assert_eq!(verdicts.len(), 17);
        assert!(s.checks.iter().all(|c| !c.suspect));
        let above = Summary::new(&[round(1000, 1200, 1100)]);
        assert!(above.checks[0].suspect && above.checks[1].suspect && !above.checks[2].suspect);
    }
}
