//! A hand-written SVG bar chart of the signing figures (`docs/bench-sign.svg`): one horizontal
//! bar per path at its median rate, a whisker for the min..max over the rounds, the ratio to
//! its peer with PASS/MISS where a target applies, and a dashed line at the raw ESAPI rate.

use std::fmt::Write as _;

use crate::summary::{Path, SignRow, Summary, CEILING_SLACK};
use crate::table::num;

const WIDTH: f64 = 1000.0;
const LABEL_X: f64 = 290.0;
const BAR_X: f64 = 300.0;
const BAR_MAX: f64 = 360.0;
const TOP: f64 = 96.0;
const ROW: f64 = 30.0;
const BAR_H: f64 = 18.0;
const FONT: &str = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif";

/// Escapes text for XML content and attributes.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A round axis maximum and tick step covering `max`.
fn axis(max: f64) -> (f64, f64) {
    if !max.is_finite() || max <= 0.0 {
        return (1.0, 0.25);
    }
    let rough = max / 5.0;
    let mag = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= rough).unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

fn colour(path: Path) -> &'static str {
    match path {
        Path::Raw => "#6b7280",
        Path::Actor(_) | Path::Daemon(_) => "#2563eb",
        Path::Tools(_) => "#d97706",
    }
}

/// The x coordinate of `v` on an axis that ends at `axis_max`.
fn at(v: f64, axis_max: f64) -> f64 {
    BAR_X + BAR_MAX * (v / axis_max).clamp(0.0, 1.0)
}

/// The chart; `subtitle` names the machine and date.
pub fn sign_chart(s: &Summary, subtitle: &str) -> String {
    let rows = &s.sign;
    let top = rows.iter().map(|r| r.rate.max).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let (axis_max, step) = axis(top);
    let x = |v: f64| at(v, axis_max);
    let plot_bottom = TOP + ROW * rows.len() as f64;
    let mut o = String::new();
    title(&mut o, s, subtitle, plot_bottom + 78.0);
    grid(&mut o, axis_max, step, plot_bottom);
    for (i, row) in rows.iter().enumerate() {
        bar(&mut o, row, TOP + ROW * i as f64, &x);
    }
    if let Some(raw) = rows.iter().find(|r| r.path == Path::Raw) {
        let rx = x(raw.rate.median);
        let _ = writeln!(
            o,
            r##"<line x1="{rx:.1}" y1="{:.1}" x2="{rx:.1}" y2="{plot_bottom:.1}" stroke="#6b7280" stroke-dasharray="4 3"/>"##,
            TOP - 8.0
        );
    }

    legend(&mut o, plot_bottom);
    let _ = writeln!(o, "</svg>");
    o
}

/// The opening tag, background, title and subtitles.
fn title(o: &mut String, s: &Summary, subtitle: &str, height: f64) {
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="{FONT}" font-size="13">"#
    );
    let _ = writeln!(
        o,
        r#"<title>ECDSA P-256 signatures per second: raw ESAPI, tpm-vault library and daemon, tpm2-tools</title>"#
    );
    let _ = writeln!(o, r##"<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>"##);
    let _ = writeln!(
        o,
        r##"<text x="20" y="28" font-size="17" font-weight="600" fill="#111827">ECDSA P-256 signatures per second, one swtpm (higher is better)</text>"##
    );
    let rounds =
        if s.rounds == 1 { "1 round".to_owned() } else { format!("median of {} rounds, whiskers min..max", s.rounds) };
    let _ = writeln!(
        o,
        r##"<text x="20" y="50" fill="#4b5563">{}</text>"##,
        esc(&format!("{rounds}; ratio = this path ÷ its peer, measured in the same round."))
    );
    let _ = writeln!(o, r##"<text x="20" y="68" fill="#4b5563">{}</text>"##, esc(subtitle));
}

/// The vertical grid lines, their values and the axis title.
fn grid(o: &mut String, axis_max: f64, step: f64, plot_bottom: f64) {
    let x = |v: f64| at(v, axis_max);
    let mut tick = 0.0;
    while tick <= axis_max + step / 2.0 {
        let tx = x(tick);
        let _ = writeln!(
            o,
            r##"<line x1="{tx:.1}" y1="{:.1}" x2="{tx:.1}" y2="{plot_bottom:.1}" stroke="#e5e7eb"/>"##,
            TOP - 8.0
        );
        let _ = writeln!(
            o,
            r##"<text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#6b7280" font-size="11">{}</text>"##,
            plot_bottom + 16.0,
            num(tick, 0)
        );
        tick += step;
    }
    let _ = writeln!(
        o,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#4b5563" font-size="12">signatures per second</text>"##,
        BAR_X + BAR_MAX / 2.0,
        plot_bottom + 34.0
    );
}

/// One path's bar at `y`: label, bar, whisker, rate with its ratio and verdict.
fn bar(o: &mut String, row: &SignRow, y: f64, x: &dyn Fn(f64) -> f64) {
    let mid = y + BAR_H / 2.0;
    let end = x(row.rate.median);
    let _ = writeln!(
        o,
        r##"<text x="{LABEL_X}" y="{:.1}" text-anchor="end" fill="#111827">{}</text>"##,
        mid + 4.5,
        esc(&row.label)
    );
    let _ = writeln!(
        o,
        r#"<rect x="{BAR_X}" y="{y:.1}" width="{:.1}" height="{BAR_H}" fill="{}" rx="2"/>"#,
        (end - BAR_X).max(1.0),
        colour(row.path)
    );
    let (lo, hi) = (x(row.rate.min), x(row.rate.max));
    if row.rate.varies() {
        let _ = writeln!(
            o,
            r##"<path d="M{lo:.1} {mid:.1}H{hi:.1}M{lo:.1} {:.1}V{:.1}M{hi:.1} {:.1}V{:.1}" stroke="#111827" stroke-width="1.3" fill="none"/>"##,
            mid - 5.0,
            mid + 5.0,
            mid - 5.0,
            mid + 5.0
        );
    }
    let mut text = format!("{}/s", num(row.rate.median, 0));
    let mut verdict = None;
    match &row.ratio {
        Some(r) => {
            let _ = write!(text, " · {}× {}", num(r.value.median, 2), r.peer);
            if let Some(goal) = r.goal {
                let suspect = r.value.median > CEILING_SLACK;
                verdict = Some((goal.met(r.value.median), suspect, goal.describe(2)));
            }
        }
        None => text.push_str(" · reference"),
    }
    let tx = hi.max(end) + 8.0;
    let _ = write!(o, r##"<text x="{tx:.1}" y="{:.1}" fill="#111827" xml:space="preserve">{}"##, mid + 4.5, esc(&text));
    if let Some((met, suspect, goal)) = verdict {
        let (word, fill) = match (met, suspect) {
            // Above the ceiling: the reference was slowed by load, not evidence.
            (true, true) => ("PASS?", "#b45309"),
            (true, false) => ("PASS", "#15803d"),
            (false, _) => ("MISS", "#b91c1c"),
        };
        let _ = write!(
            o,
            r#"<tspan fill="{fill}" font-weight="600"> {word}</tspan><tspan fill="{fill}"> (target {})</tspan>"#,
            esc(&goal)
        );
    }
    let _ = writeln!(o, "</text>");
}

/// The colour key under the plot.
fn legend(o: &mut String, plot_bottom: f64) {
    let ly = plot_bottom + 56.0;
    let mut lx = 20.0;
    for (fill, label) in [
        ("#6b7280", "raw ESAPI (ceiling; dashed line)"),
        ("#2563eb", "tpm-vault (library, daemon)"),
        ("#d97706", "tpm2-tools per call (peer of a shell script)"),
    ] {
        let _ = writeln!(o, r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{fill}" rx="2"/>"#, ly - 10.0);
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{ly:.1}" fill="#374151" font-size="12">{}</text>"##,
            lx + 18.0,
            esc(label)
        );
        lx += 18.0 + 7.0 * label.len() as f64 + 24.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::tests::round;

    #[test]
    fn axis_is_round() {
        assert_eq!(axis(1830.0), (2000.0, 500.0));
        assert_eq!(axis(940.0), (1000.0, 200.0));
        assert_eq!(axis(0.0), (1.0, 0.25));
        let (max, step) = axis(123.0);
        assert!(max >= 123.0 && step > 0.0);
    }

    #[test]
    fn chart_is_well_formed_enough() {
        let s = Summary::new(&[round(1000, 990, 960), round(1200, 1150, 1100)]);
        let svg = sign_chart(&s, "AMD EPYC <2 cores> & co");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("&lt;2 cores&gt; &amp; co"));
        assert!(svg.contains("PASS"));
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        assert_eq!(svg.matches("<tspan").count(), svg.matches("</tspan>").count());
        // One bar per row.
        assert!(svg.matches("rx=\"2\"/>").count() >= s.sign.len());
    }
}
