//! Printing results: text for people, one JSON object per command for programs.
//!
//! Owns the [`Report`] trait that every command's result implements, and the shared formatting
//! (times, durations, tables, keys). It does not write files or decide what a command prints.

use std::io::{self, Write};
use std::time::Duration;

use serde_json::{json, Value};

use tpm_vault_client::{KeyInfo, Named, PcrBinding};

use super::OutputFormat;

/// A command's result, printable in both formats.
pub(crate) trait Report {
    /// Writes the human-readable form.
    fn text(&self, out: &mut dyn Write) -> io::Result<()>;
    /// The JSON form: one object.
    fn json(&self) -> Value;
}

/// Renders `report` in `format` into `out`.
pub(crate) fn render(format: OutputFormat, report: &dyn Report, out: &mut dyn Write) -> io::Result<()> {
    match format {
        OutputFormat::Text => report.text(out),
        OutputFormat::Json => {
            let json = serde_json::to_string(&report.json())?;
            writeln!(out, "{}", json_for_terminal(&json))
        }
    }
}

/// serde_json escapes C0 controls but writes DEL, C1 controls (U+0080-U+009F, `\u{9b}` is a CSI
/// on some terminals) and bidirectional overrides raw: they become `\uXXXX` escapes too, so JSON
/// of hostile data (an event log's names) is safe to show on a terminal. Such characters occur
/// only inside JSON strings, where the escape means the same character.
fn json_for_terminal(json: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !json.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(json);
    }
    let mut escaped = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if unsafe_char(c) {
            escaped.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            escaped.push(c);
        }
    }
    std::borrow::Cow::Owned(escaped)
}

/// A key's metadata as JSON.
pub(crate) fn key_json(key: &KeyInfo) -> Value {
    json!({
        "name": key.name,
        "algorithm": key.algorithm.name(),
        "tpm_name": key.tpm_name,
        "created_unix": key.created_unix,
        "created": rfc3339(key.created_unix),
        "pcr_binding": key.pcr_binding.as_ref().map(pcr_json),
        "owner_uid": key.owner_uid,
        "has_auth": key.has_auth,
        "usages": key.usages.iter().map(|u| u.name()).collect::<Vec<_>>(),
    })
}

/// A key's usages as `sign,ssh`; `-` from a daemon that reports none (older than usages).
pub(crate) fn usages_text(key: &KeyInfo) -> String {
    if key.usages.is_empty() {
        return "-".to_owned();
    }
    key.usages.iter().map(|u| u.name()).collect::<Vec<_>>().join(",")
}

/// A PCR binding as JSON; values in hex.
fn pcr_json(binding: &PcrBinding) -> Value {
    let values: Vec<String> = binding.values().iter().map(hex::encode).collect();
    json!({ "bank": binding.bank(), "pcrs": binding.pcrs(), "values": values })
}

/// A key's metadata as `label: value` lines.
pub(crate) fn key_text(key: &KeyInfo, out: &mut dyn Write) -> io::Result<()> {
    let binding = match &key.pcr_binding {
        Some(binding) if binding.values().is_empty() => {
            format!("{binding} (values at creation)")
        }
        Some(binding) => binding.to_string(),
        None => "none".to_owned(),
    };
    let rows = [
        ("name", key.name.clone()),
        ("algorithm", key.algorithm.name().to_owned()),
        ("tpm name", key.tpm_name.clone()),
        ("created", rfc3339(key.created_unix)),
        ("pcr binding", binding),
        ("owner uid", key.owner_uid.to_string()),
        ("password", yes_no(key.has_auth).to_owned()),
        ("usages", usages_text(key)),
    ];
    fields(out, &rows)
}

/// The PCR indices of a binding, without the values: `sha256:9,10`.
pub(crate) fn pcr_selection(binding: &PcrBinding) -> String {
    let pcrs: Vec<String> = binding.pcrs().iter().map(u32::to_string).collect();
    format!("{}:{}", binding.bank(), pcrs.join(","))
}

/// Writes aligned `label: value` lines.
pub(crate) fn fields(out: &mut dyn Write, rows: &[(&str, String)]) -> io::Result<()> {
    let width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0) + 1;
    for (label, value) in rows {
        writeln!(out, "{:<width$} {value}", format!("{label}:"))?;
    }
    Ok(())
}

/// Writes a table with a header row, columns separated by two spaces.
pub(crate) fn table(out: &mut dyn Write, header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (at, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if at + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  "));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// `yes` or `no`.
pub(crate) fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

/// Seconds since the epoch as RFC 3339 UTC, e.g. `2025-11-30T05:49:00Z`.
pub(crate) fn rfc3339(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// A coarse duration for people: `3d 4h 5m 6s`, `42s`.
pub(crate) fn uptime(duration: Duration) -> String {
    let secs = duration.as_secs();
    let parts = [(secs / 86_400, "d"), (secs % 86_400 / 3600, "h"), (secs % 3600 / 60, "m"), (secs % 60, "s")];
    let text: Vec<String> = parts.iter().skip_while(|(n, _)| *n == 0).map(|(n, unit)| format!("{n}{unit}")).collect();
    if text.is_empty() {
        "0s".to_owned()
    } else {
        text.join(" ")
    }
}

/// A latency for people: `750us`, `1.2ms`, `2.50s`.
pub(crate) fn latency(duration: Duration) -> String {
    let micros = duration.as_micros();
    if micros < 1000 {
        format!("{micros}us")
    } else if micros < 1_000_000 {
        format!("{:.1}ms", duration.as_secs_f64() * 1e3)
    } else {
        format!("{:.2}s", duration.as_secs_f64())
    }
}

/// Year, month, day of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Both are small positive numbers by construction (1..=31, 1..=12).
    (year, day_or_month(month), day_or_month(day))
}

fn day_or_month(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_output_escapes_every_control_and_means_the_same() {
        let hostile = "a\u{1b}[2J\u{7f}\u{9b}31m\u{202e}é\n\\";
        let json = serde_json::to_string(&json!({ "name": hostile })).unwrap();
        let safe = json_for_terminal(&json);
        assert!(!safe.chars().any(|c| c.is_control() || c == '\u{202e}'), "{safe}");
        assert!(safe.contains("\\u007f\\u009b31m\\u202eé"), "{safe}");
        assert_eq!(serde_json::from_str::<Value>(&safe).unwrap()["name"], hostile);
        assert!(matches!(json_for_terminal(r#"{"a":"é"}"#), std::borrow::Cow::Borrowed(_)));
    }
}
