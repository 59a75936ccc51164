//! The report's one table model and its markdown renderer.
//!
//! Every table of `docs/BENCHMARKS.md` is a [`Table`]: named, aligned columns and rows of
//! [`Cell`]s. A cell is plain text, a figure over the rounds (median with its min..max spread),
//! a ratio against a peer, or a target verdict. The measurement side ([`crate::summary`],
//! [`crate::device`], …) fills tables; [`Table::markdown`] is the one place that writes them.
//! This module sits below every other module of the report: it knows numbers, spreads and
//! goals, nothing of what was measured.

use std::fmt::Write as _;

use crate::stats::Spread;

/// A target a figure must meet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// The figure must be at least this.
    AtLeast(f64),
    /// The figure must be below this.
    Below(f64),
    /// The figure must be at most this.
    AtMost(f64),
}

impl Goal {
    /// Whether `value` meets the goal.
    pub fn met(self, value: f64) -> bool {
        match self {
            Self::AtLeast(t) => value >= t,
            Self::Below(t) => value < t,
            Self::AtMost(t) => value <= t,
        }
    }

    /// `≥ 0.97`, `< 150`.
    pub fn describe(self, decimals: usize) -> String {
        match self {
            Self::AtLeast(t) => format!("≥ {t:.decimals$}"),
            Self::Below(t) => format!("< {t:.decimals$}"),
            Self::AtMost(t) => format!("≤ {t:.decimals$}"),
        }
    }

    /// `PASS` or `MISS` for `value`.
    pub fn verdict(self, value: f64) -> &'static str {
        if self.met(value) {
            "PASS"
        } else {
            "MISS"
        }
    }
}

/// A figure divided by its peer's, per round.
#[derive(Debug, Clone, PartialEq)]
pub struct Ratio {
    /// What it is divided by.
    pub peer: String,
    /// The per-round ratios.
    pub value: Spread,
    /// The goal, if this ratio has one.
    pub goal: Option<Goal>,
}

impl Ratio {
    /// The ratio's cell.
    pub fn cell(&self) -> Cell {
        Cell::Ratio { value: self.value, mark: "" }
    }

    /// Its goal's verdict, or an empty cell.
    pub fn target(&self) -> Cell {
        self.goal.map_or(Cell::empty(), |goal| Cell::verdict(goal, self.value.median, 2, ""))
    }
}

/// How a column is aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// One cell of a [`Table`].
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Text as it is (may hold markdown).
    Text(String),
    /// A figure over the rounds: `median suffix (min..max)`.
    Figure {
        /// The figure.
        value: Spread,
        /// Decimals to print.
        decimals: usize,
        /// Written after the median (a unit, `×`, `/s`).
        suffix: String,
    },
    /// A ratio against a peer: `0.98× (0.95..0.99)`, then `mark` (a footnote sign) if any.
    Ratio {
        /// The per-round ratios.
        value: Spread,
        /// Footnote mark, or empty.
        mark: &'static str,
    },
    /// A target and whether `value` meets it: `≥ 0.97: **PASS**`.
    Verdict {
        /// The target.
        goal: Goal,
        /// The median it is judged on.
        value: f64,
        /// Decimals of the goal's threshold.
        decimals: usize,
        /// Written after the threshold (` MiB/s`, or nothing for ratios).
        unit: String,
    },
}

impl Cell {
    /// A text cell.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text(text.into())
    }

    /// An empty cell.
    pub fn empty() -> Self {
        Self::Text(String::new())
    }

    /// A number with thousands separators.
    pub fn num(value: f64, decimals: usize) -> Self {
        Self::Text(num(value, decimals))
    }

    /// A figure over the rounds.
    pub fn figure(value: &Spread, decimals: usize, suffix: &str) -> Self {
        Self::Figure { value: *value, decimals, suffix: suffix.to_owned() }
    }

    /// A target verdict.
    pub fn verdict(goal: Goal, value: f64, decimals: usize, unit: &str) -> Self {
        Self::Verdict { goal, value, decimals, unit: unit.to_owned() }
    }

    /// A figure over the rounds, or `—` where nothing was measured.
    pub fn maybe(value: Option<Spread>, decimals: usize, suffix: &str) -> Self {
        value.map_or_else(|| Self::text("—"), |v| Self::figure(&v, decimals, suffix))
    }

    /// A ratio's verdict (goal with 2 decimals) on its median, or `≥ 0.85: not measured`.
    pub fn maybe_verdict(goal: Goal, value: Option<Spread>) -> Self {
        match value {
            Some(v) => Self::verdict(goal, v.median, 2, ""),
            None => Self::Text(format!("{}: not measured", goal.describe(2))),
        }
    }

    /// The cell as markdown.
    pub fn render(&self) -> String {
        match self {
            Self::Text(t) => t.clone(),
            Self::Figure { value, decimals, suffix } => spread(value, *decimals, suffix),
            Self::Ratio { value, mark: "" } => spread(value, 2, "×"),
            Self::Ratio { value, mark } => format!("{} {mark}", spread(value, 2, "×")),
            Self::Verdict { goal, value, decimals, unit } => {
                format!("{}{unit}: **{}**", goal.describe(*decimals), goal.verdict(*value))
            }
        }
    }
}

/// A table: columns and rows of cells (every row as long as the columns).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    /// Column titles and alignment.
    pub columns: Vec<(String, Align)>,
    /// The rows.
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// A table with these columns and no rows yet.
    pub fn new<S: Into<String>>(columns: impl IntoIterator<Item = (S, Align)>) -> Self {
        Self { columns: columns.into_iter().map(|(t, a)| (t.into(), a)).collect(), rows: Vec::new() }
    }

    /// Adds a row.
    pub fn push(&mut self, row: Vec<Cell>) {
        self.rows.push(row);
    }

    /// The table as markdown: header, alignment line, rows, each line ending in a newline.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let line = |out: &mut String, cells: &mut dyn Iterator<Item = String>| {
            out.push('|');
            for c in cells {
                if c.is_empty() {
                    out.push_str(" |");
                } else {
                    let _ = write!(out, " {c} |");
                }
            }
            out.push('\n');
        };
        line(&mut out, &mut self.columns.iter().map(|(t, _)| t.clone()));
        out.push('|');
        for (_, align) in &self.columns {
            out.push_str(if *align == Align::Right { "---:|" } else { "---|" });
        }
        out.push('\n');
        for row in &self.rows {
            line(&mut out, &mut row.iter().map(Cell::render));
        }
        out
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn renders_cells_and_tables() {
        let s = Spread { median: 0.98, min: 0.95, max: 0.99 };
        let mut t = Table::new([("path", Align::Left), ("ratio", Align::Right), ("target", Align::Left)]);
        t.push(vec![Cell::text("library"), Cell::Ratio { value: s, mark: "²" }, Cell::empty()]);
        t.push(vec![
            Cell::text("daemon"),
            Cell::figure(&s, 2, " MiB"),
            Cell::verdict(Goal::AtLeast(0.97), s.median, 2, ""),
        ]);
        assert_eq!(
            t.markdown(),
            "| path | ratio | target |\n|---|---:|---|\n| library | 0.98× (0.95..0.99) ² | |\n\
             | daemon | 0.98 MiB (0.95..0.99) | ≥ 0.97: **PASS** |\n"
        );
        assert_eq!(Cell::verdict(Goal::Below(150.0), 150.0, 0, " µs").render(), "< 150 µs: **MISS**");
        assert_eq!(Cell::maybe(None, 0, "").render(), "—");
        assert_eq!(Cell::maybe(Some(s), 1, "×").render(), "1.0× (0.9..1.0)");
        assert_eq!(Cell::maybe_verdict(Goal::AtLeast(0.85), None).render(), "≥ 0.85: not measured");
        assert_eq!(Cell::maybe_verdict(Goal::AtLeast(0.85), Some(s)).render(), "≥ 0.85: **PASS**");
        assert_eq!(Goal::AtLeast(0.97).describe(2), "≥ 0.97");
        assert!(Goal::AtMost(1.1).met(1.1) && !Goal::AtMost(1.1).met(1.11));
        assert!(Goal::Below(150.0).met(149.0) && !Goal::Below(150.0).met(150.0));
    }
}
