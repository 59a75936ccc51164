//! The PKCS#11 section of `docs/BENCHMARKS.md` and its lines of the Targets table: every ratio
//! is computed within a round ([`crate::p11::P11Round`]), then summarised as median (min..max)
//! over the rounds.

use crate::p11::{P11Round, THREADS, WORKERS};
use crate::p11_sign::SignRate;
use crate::stats::Spread;
use crate::summary::Check;
use crate::table::{num, Align, Cell, Goal, Table};
use crate::tls::{Rate, CLIENTS};

/// `C_Sign` through the module ÷ the daemon's `Sign` RPC, same concurrency.
pub const DAEMON_GOAL: Goal = Goal::AtLeast(0.9);
/// `C_Sign` through the module ÷ tpm2-pkcs11, one thread and 16 threads.
pub const TPM2_GOALS: [Goal; 2] = [Goal::AtLeast(7.0), Goal::AtLeast(4.0)];
/// nginx with the module ÷ nginx with tpm2-pkcs11, 1 and [`CLIENTS`] clients.
pub const NGINX_PEER_GOAL: Goal = Goal::AtLeast(3.0);
/// nginx with the module ÷ the model limit, 1 and [`CLIENTS`] clients.
pub const NGINX_MODEL_GOAL: Goal = Goal::AtLeast(0.7);

/// The median over the rounds of what `f` gives (rounds where it gives nothing are left out).
fn col(rounds: &[P11Round], f: impl Fn(&P11Round) -> Option<f64>) -> Option<Spread> {
    Spread::of(&rounds.iter().filter_map(f).collect::<Vec<_>>())
}

fn vault_at(r: &P11Round, t: usize) -> Option<f64> {
    P11Round::at(&r.vault, t)
}

fn tpm2_at(r: &P11Round, t: usize) -> Option<f64> {
    r.tpm2.as_deref().and_then(|p| P11Round::at(p, t))
}

/// Which of a [`Rate`]'s two columns.
fn pick(r: Rate, many: bool) -> f64 {
    if many {
        r.many
    } else {
        r.one
    }
}

/// The ratios with targets, per round then median: (what, goal, value).
fn targets(rounds: &[P11Round]) -> Vec<(String, Goal, Option<Spread>)> {
    let mut out = Vec::new();
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    for (i, &t) in THREADS.iter().enumerate() {
        let (threads, clients) = (plural(t, "thread"), plural(t, "client"));
        out.push((
            format!("PKCS#11 `C_Sign` ECDSA P-256, {threads}: vault module ÷ daemon gRPC `Sign`, {clients}"),
            DAEMON_GOAL,
            col(rounds, |r| Some(vault_at(r, t)? / r.daemon_at(t)?)),
        ));
        out.push((
            format!("PKCS#11 `C_Sign` ECDSA P-256, {threads}: vault module ÷ tpm2-pkcs11"),
            TPM2_GOALS[i],
            col(rounds, |r| Some(vault_at(r, t)? / tpm2_at(r, t)?)),
        ));
    }
    for (many, n) in [(false, 1), (true, CLIENTS)] {
        out.push((
            format!("nginx TLS 1.3 handshakes/s, {}: vault module ÷ tpm2-pkcs11", plural(n, "client")),
            NGINX_PEER_GOAL,
            col(rounds, |r| Some(pick(r.nginx_vault?, many) / pick(r.nginx_tpm2?, many))),
        ));
        out.push((
            format!("nginx TLS 1.3 handshakes/s, {}: vault module ÷ model limit", plural(n, "client")),
            NGINX_MODEL_GOAL,
            col(rounds, |r| Some(pick(r.nginx_vault?, many) / pick(r.model()?, many))),
        ));
    }
    out
}

/// The Targets lines of the ratios that were measured.
pub fn checks(rounds: &[P11Round]) -> Vec<Check> {
    targets(rounds)
        .into_iter()
        .filter_map(|(what, goal, value)| {
            Some(Check { what, value: value?.median, unit: "×", decimals: 2, goal, suspect: false })
        })
        .collect()
}

/// Two verdicts of one goal (or of two): `≥ 0.90: **PASS** at 1; ≥ 0.90: **MISS** at 16`.
fn two_verdicts(goals: [Goal; 2], values: [Option<Spread>; 2], at: [String; 2]) -> Cell {
    let [g1, g2] = goals;
    let [v1, v2] = values;
    let [a, b] = at;
    let (v1, v2) = (Cell::maybe_verdict(g1, v1).render(), Cell::maybe_verdict(g2, v2).render());
    Cell::Text(format!("{v1} at {a}; {v2} at {b}"))
}

/// The `C_Sign` tables.
fn sign_tables(out: &mut String, rounds: &[P11Round]) {
    let [a, b] = THREADS;
    let (l, r) = (Align::Left, Align::Right);
    let (ta, tb) = (format!("signs/s, {a} thread"), format!("signs/s, {b} threads"));
    let mut t = Table::new([("path", l), (ta.as_str(), r), ("p50 µs", r), (tb.as_str(), r), ("p50 µs", r)]);
    let row = |label: &str, f: &dyn Fn(&P11Round) -> Option<&[SignRate]>| {
        let get = |t: usize, p50: bool| {
            let v = col(rounds, |r| f(r)?.iter().find(|x| x.threads == t).map(|x| if p50 { x.p50_us } else { x.rate }));
            Cell::maybe(v, 0, "")
        };
        vec![Cell::text(label), get(a, false), get(a, true), get(b, false), get(b, true)]
    };
    t.push(row("**vault module** `C_Sign` → `tpm-vaultd` → swtpm", &|r| Some(&r.vault[..])));
    t.push(vec![
        Cell::text("`tpm-vaultd` gRPC `Sign`, the daemon phase of the same round (clients = threads)"),
        Cell::maybe(col(rounds, |r| r.daemon_at(a)), 0, ""),
        Cell::text("—"),
        Cell::maybe(col(rounds, |r| r.daemon_at(b)), 0, ""),
        Cell::text("—"),
    ]);
    t.push(row("tpm2-pkcs11 `C_Sign` (user PIN login) → tpm2-abrmd → swtpm", &|r| r.tpm2.as_deref()));
    out.push_str(&t.markdown());
    out.push('\n');
    let (ta, tb) = (format!("{a} thread"), format!("{b} threads"));
    let mut t = Table::new([("vault module `C_Sign` ÷", l), (ta.as_str(), r), (tb.as_str(), r), ("target", l)]);
    let ratio =
        |t: usize, f: &dyn Fn(&P11Round, usize) -> Option<f64>| col(rounds, |r| Some(vault_at(r, t)? / f(r, t)?));
    let daemon = |r: &P11Round, t: usize| r.daemon_at(t);
    let at = || [a.to_string(), b.to_string()];
    let (d1, d16) = (ratio(a, &daemon), ratio(b, &daemon));
    let target = two_verdicts([DAEMON_GOAL; 2], [d1, d16], at());
    t.push(vec![Cell::text("daemon gRPC `Sign`"), Cell::maybe(d1, 2, "×"), Cell::maybe(d16, 2, "×"), target]);
    let (t1, t16) = (ratio(a, &tpm2_at), ratio(b, &tpm2_at));
    let target = two_verdicts(TPM2_GOALS, [t1, t16], at());
    t.push(vec![Cell::text("tpm2-pkcs11"), Cell::maybe(t1, 2, "×"), Cell::maybe(t16, 2, "×"), target]);
    out.push_str(&t.markdown());
    out.push('\n');
}

/// The nginx tables.
fn nginx_tables(out: &mut String, rounds: &[P11Round], skipped: &[String]) {
    let (l, r) = (Align::Left, Align::Right);
    let many = format!("handshakes/s, {CLIENTS} clients");
    let mut t = Table::new([("nginx 1.22, TLS 1.3", l), ("handshakes/s, 1 client", r), (many.as_str(), r)]);
    let row = |label: &str, f: fn(&P11Round) -> Option<Rate>| {
        let one = Cell::maybe(col(rounds, |r| f(r).map(|x| x.one)), 0, "");
        let many = Cell::maybe(col(rounds, |r| f(r).map(|x| x.many)), 0, "");
        vec![Cell::text(label), one, many]
    };
    t.push(row(&format!("software P-256 key file, master + {WORKERS} workers"), |r| r.nginx_soft));
    t.push(row(&format!("**vault module** via libp11's engine, master + {WORKERS} workers"), |r| r.nginx_vault));
    t.push(row("tpm2-pkcs11 via libp11's engine, **`master_process off`** (one process)", |r| r.nginx_tpm2));
    t.push(vec![
        Cell::Text(format!("daemon gRPC `Sign` of the same round (signs/s at 1 and {CLIENTS} clients)")),
        Cell::maybe(col(rounds, |r| r.daemon_at(1)), 0, ""),
        Cell::maybe(col(rounds, |r| r.daemon_at(CLIENTS)), 0, ""),
    ]);
    t.push(row("model limit `1 / (1/nginx software + 1/daemon Sign)`", P11Round::model));
    out.push_str(&t.markdown());
    out.push('\n');
    let many = format!("{CLIENTS} clients");
    let mut t = Table::new([("nginx with the vault module ÷", l), ("1 client", r), (many.as_str(), r), ("target", l)]);
    let ratio = |many: bool, f: fn(&P11Round) -> Option<Rate>| {
        col(rounds, |r| Some(pick(r.nginx_vault?, many) / pick(f(r)?, many)))
    };
    for (label, goal, f) in [
        ("model limit", Some(NGINX_MODEL_GOAL), P11Round::model as fn(&P11Round) -> Option<Rate>),
        ("nginx with tpm2-pkcs11", Some(NGINX_PEER_GOAL), |r: &P11Round| r.nginx_tpm2),
        ("nginx with a software key", None, |r: &P11Round| r.nginx_soft),
    ] {
        let (one, many) = (ratio(false, f), ratio(true, f));
        let target =
            goal.map_or_else(Cell::empty, |g| two_verdicts([g; 2], [one, many], ["1".into(), CLIENTS.to_string()]));
        t.push(vec![Cell::text(label), Cell::maybe(one, 2, "×"), Cell::maybe(many, 2, "×"), target]);
    }
    out.push_str(&t.markdown());
    out.push('\n');
    for s in skipped {
        out.push_str(&format!("- {s}\n"));
    }
    if !skipped.is_empty() {
        out.push('\n');
    }
}

/// The PKCS#11 section; `skipped` are the parts that could not run. Empty when nothing ran.
pub fn markdown(
    rounds: &[P11Round],
    sign: crate::sign::Timing,
    tls: crate::sign::Timing,
    skipped: &[String],
) -> String {
    if rounds.is_empty() {
        return String::new();
    }
    let mut out = String::from("## PKCS#11: `C_Sign` and nginx through the vault module\n\n");
    out.push_str(&format!(
        "`tpm-vault-pkcs11` (`libtpm_vault_pkcs11.so`, built with this benchmark's profile) is a client of \
         `tpm-vaultd`: a fresh daemon per round, the module loaded once per measuring process with the \
         [`cryptoki`](https://crates.io/crates/cryptoki) crate (one `C_Initialize`, OS locking), `C_Sign` with \
         `CKM_ECDSA` over a 32-byte digest with the benchmark's P-256 key (r||s), from 1 thread and from 16 threads \
         with a session each, {} s warm-up + {} s window. The daemon's figures are its `Sign` RPC in the daemon \
         phase of the same round, with as many gRPC clients as threads. The peer is tpm2-pkcs11 on the same swtpm \
         through tpm2-abrmd (it needs a resource manager), measured the same way while the daemon is stopped \
         (swtpm serves one client at a time), its token made once per run with `tpm2_ptool` and a forgiving \
         dictionary-attack policy.\n\n",
        num(sign.warmup.as_secs_f64(), 1),
        num(sign.window.as_secs_f64(), 1)
    ));
    sign_tables(&mut out, rounds);
    out.push_str(&format!(
        "nginx serves `return 200` over TLS 1.3 on loopback, measured with `openssl s_time -new -time {}` {} at 1 \
         client and {CLIENTS} at once, connections per elapsed second (as in the TLS section). The vault module \
         runs under `master_process on; worker_processes {WORKERS};` with `ssl_engine pkcs11;` and the key \
         `engine:pkcs11:pkcs11:object=bench;type=private` (libp11's engine, `MODULE_PATH` from an `OPENSSL_CONF` \
         file); the software server is the same configuration with a P-256 key file. tpm2-pkcs11 fails with \
         `ssl_engine pkcs11;` and with forked workers (the second worker's handshakes fail), so its nginx runs with \
         **`master_process off`** (one process, no fork) and without `ssl_engine`, the same key URI with its token \
         and PIN. The model limit is what a server with a TPM key can do at best: one software handshake plus one \
         daemon signature per connection, with the software nginx and the daemon's `Sign` rate of the same round at \
         the same number of clients.\n\n",
        tls.window.as_secs().max(1),
        crate::tls::warmup_secs(tls)
            .map_or_else(|| "without warm-up".to_owned(), |s| format!("after a {s}-second warm-up")),
    ));
    nginx_tables(&mut out, rounds, skipped);
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sign::Timing;

    fn rates(one: f64, sixteen: f64) -> Vec<SignRate> {
        [(1, one), (16, sixteen)].map(|(threads, rate)| SignRate { threads, rate, p50_us: 1.0, p99_us: 2.0 }).into()
    }

    #[test]
    fn ratios_and_targets() {
        let r = P11Round {
            vault: rates(900.0, 1800.0),
            tpm2: Some(rates(100.0, 400.0)),
            daemon: vec![(1, 1000.0), (4, 1500.0), (16, 2000.0)],
            nginx_vault: Some(Rate { one: 300.0, many: 500.0 }),
            nginx_soft: Some(Rate { one: 1000.0, many: 3000.0 }),
            nginx_tpm2: Some(Rate { one: 100.0, many: 100.0 }),
        };
        let m = r.model().unwrap_or_else(|| panic!("model"));
        assert!((m.one - 500.0).abs() < 1e-9 && (m.many - 1000.0).abs() < 1e-9);
        let checks = checks(std::slice::from_ref(&r));
        assert_eq!(checks.len(), 8);
        let verdicts: Vec<&str> = checks.iter().map(Check::verdict).collect();
        assert_eq!(verdicts, ["PASS", "PASS", "PASS", "PASS", "PASS", "MISS", "PASS", "MISS"]);
        let t = Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(5) };
        let md = markdown(&[r], t, t, &[]);
        assert!(md.contains("| daemon gRPC `Sign` | 0.90× | 0.90× |"), "{md}");
        assert!(md.contains("| model limit | 0.60× | 0.50× |"), "{md}");
    }

    #[test]
    fn missing_peers_have_no_target_line() {
        let r = P11Round {
            vault: rates(900.0, 1800.0),
            tpm2: None,
            daemon: vec![(1, 1000.0), (16, 2000.0)],
            nginx_vault: None,
            nginx_soft: None,
            nginx_tpm2: None,
        };
        assert_eq!(checks(std::slice::from_ref(&r)).len(), 2);
        let t = Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(5) };
        let md = markdown(&[r], t, t, &["tpm2-pkcs11 rows skipped, not installed".into()]);
        assert!(md.contains("≥ 7.00: not measured") && md.contains("- tpm2-pkcs11 rows skipped"), "{md}");
    }
}
