//! Bar and line charts as hand-written SVG: the labs need two chart kinds, and
//! a plotting crate (plotters and its font stack) would cost more build time
//! on a 2-core machine than these hundred lines.
use std::fmt::Write as _;

const W: f64 = 640.0;
const H: f64 = 360.0;
/// Plot area margins: left (axis labels), right, top (title), bottom (x labels).
const ML: f64 = 70.0;
const MR: f64 = 150.0;
const MT: f64 = 40.0;
const MB: f64 = 60.0;
const COLORS: &[&str] = &["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"];

/// Text made safe for an SVG text node or attribute.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The frame: title, axes, y label and 5 y ticks from 0 to `ymax`.
fn frame(title: &str, x_label: &str, y_label: &str, ymax: f64) -> String {
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        esc(title)
    );
    let (x0, y0, x1) = (ML, H - MB, W - MR);
    let _ = writeln!(s, "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>");
    let _ = writeln!(s, "<line x1=\"{x0}\" y1=\"{MT}\" x2=\"{x0}\" y2=\"{y0}\" stroke=\"black\"/>");
    for i in 0..=4 {
        let v = ymax * f64::from(i) / 4.0;
        let y = y_of(v, ymax);
        let _ = writeln!(s, "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>");
        let _ = writeln!(s, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", x0 - 6.0, y + 4.0, num(v));
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        (x0 + x1) / 2.0,
        H - 12.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        "<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        (MT + y0) / 2.0,
        esc(y_label)
    );
    s
}

fn y_of(v: f64, ymax: f64) -> f64 {
    let h = H - MB - MT;
    H - MB - (v / ymax).clamp(0.0, 1.0) * h
}

/// A round-looking axis maximum at or above `v`.
fn nice_max(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|m| *m >= v).unwrap_or(10.0 * mag)
}

fn num(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}").trim_end_matches('0').to_string()
    }
}

/// One bar per (label, value), values written above the bars.
pub fn bars(title: &str, y_label: &str, bars: &[(String, f64)]) -> String {
    let ymax = nice_max(bars.iter().map(|b| b.1).fold(0.0, f64::max));
    let mut s = frame(title, "", y_label, ymax);
    let slot = (W - MR - ML) / bars.len().max(1) as f64;
    for (i, (label, v)) in bars.iter().enumerate() {
        let x = ML + slot * i as f64 + slot * 0.15;
        let y = y_of(*v, ymax);
        let c = COLORS[i % COLORS.len()];
        let _ = writeln!(
            s,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{c}\"/>",
            slot * 0.7,
            H - MB - y
        );
        let cx = x + slot * 0.35;
        let _ = writeln!(s, "<text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>", y - 4.0, num(*v));
        let _ = writeln!(s, "<text x=\"{cx:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>", H - MB + 16.0, esc(label));
    }
    s.push_str("</svg>\n");
    s
}

/// One polyline per named series of (x, y) points, with a legend on the right.
pub fn lines(title: &str, x_label: &str, y_label: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (xmax, ymax) = pts.fold((0.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let (xmax, ymax) = (nice_max(xmax), nice_max(ymax));
    let mut s = frame(title, x_label, y_label, ymax);
    let x_of = |x: f64| ML + (x / xmax).clamp(0.0, 1.0) * (W - MR - ML);
    for i in 0..=4 {
        let v = xmax * f64::from(i) / 4.0;
        let _ =
            writeln!(s, "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>", x_of(v), H - MB + 16.0, num(v));
    }
    for (i, (name, points)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = points.iter().map(|(x, y)| format!("{:.1},{:.1}", x_of(*x), y_of(*y, ymax))).collect();
        let _ =
            writeln!(s, "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>", path.join(" "));
        for p in &path {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{c}\"/>");
        }
        let ly = MT + 18.0 * i as f64;
        let lx = W - MR + 12.0;
        let _ = writeln!(s, "<rect x=\"{lx}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{c}\"/>", ly);
        let _ = writeln!(s, "<text x=\"{}\" y=\"{}\">{}</text>", lx + 18.0, ly + 10.0, esc(name));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_maxima_are_round_and_cover_the_data() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(3.2), 5.0);
        assert_eq!(nice_max(870.0), 1000.0);
        assert_eq!(nice_max(0.18), 0.2);
        assert_eq!((num(12.5), num(0.25), num(40.0)), ("12.5".to_string(), "0.25".to_string(), "40".to_string()));
    }

    #[test]
    fn labels_are_escaped() {
        let s = bars("a<b", "ms", &[("x&y".into(), 1.0)]);
        assert!(s.contains("a&lt;b") && s.contains("x&amp;y") && !s.contains("a<b"));
        assert_eq!(s.matches("<rect").count(), 2, "background and one bar");
    }
}
