//! The RSS-over-time plot of a soak run, as a self-contained SVG: the samples as a line,
//! the least-squares fit over the measured window (after warm-up) as a dashed line, and
//! the end of warm-up as a vertical rule.

use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// SVG of RSS (MB) against time (minutes): `points` are (minutes, MB); `warmup_min` is
/// where the measured window starts; `fit` is (slope MB/min, intercept MB) of the line
/// over that window; `title` goes on top.
pub fn rss_svg(points: &[(f64, f64)], warmup_min: f64, fit: (f64, f64), title: &str) -> String {
    let x_max = points.iter().map(|p| p.0).fold(0.0_f64, f64::max).max(1e-9);
    let y_lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_hi = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let (y_lo, y_hi) = if y_lo.is_finite() {
        let pad = ((y_hi - y_lo) * 0.1).max(1.0);
        ((y_lo - pad).floor(), (y_hi + pad).ceil())
    } else {
        (0.0, 1.0)
    };
    let px = |x: f64| LEFT + x / x_max * (W - LEFT - RIGHT);
    let py = |y: f64| TOP + (y_hi - y) / (y_hi - y_lo) * (H - TOP - BOTTOM);
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>
"##,
        W / 2.0,
        escape(title)
    );
    // Axes and ticks: 5 on each.
    let (x0, x1, y0, y1) = (px(0.0), px(x_max), py(y_lo), py(y_hi));
    let _ = writeln!(
        s,
        r##"<path d="M{x0},{y1} L{x0},{y0} L{x1},{y0}" stroke="black" fill="none"/>"##
    );
    for i in 0..=5 {
        let xv = x_max * f64::from(i) / 5.0;
        let yv = y_lo + (y_hi - y_lo) * f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{xv:.1}</text><text x="{:.1}" y="{:.1}" text-anchor="end">{yv:.1}</text><line x1="{x0}" x2="{x1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            px(xv),
            y0 + 18.0,
            x0 - 6.0,
            py(yv) + 4.0,
            py(yv),
            py(yv)
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">minutes</text><text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">RSS (MB)</text>"##,
        (x0 + x1) / 2.0,
        H - 10.0,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0
    );
    let _ = writeln!(
        s,
        r##"<line x1="{0:.1}" x2="{0:.1}" y1="{y1}" y2="{y0}" stroke="#999" stroke-dasharray="4 4"/><text x="{1:.1}" y="{2:.1}" fill="#666">warm-up</text>"##,
        px(warmup_min),
        px(warmup_min) - 50.0,
        y1 + 14.0
    );
    let line: Vec<String> = points
        .iter()
        .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline points="{}" stroke="#1f77b4" stroke-width="1.5" fill="none"/>"##,
        line.join(" ")
    );
    let (m, b) = fit;
    let _ = writeln!(
        s,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#d62728" stroke-dasharray="6 3"/><text x="{:.1}" y="{:.1}" fill="#d62728" text-anchor="end">fit: {m:+.3} MB/min</text>"##,
        px(warmup_min),
        py(m * warmup_min + b),
        px(x_max),
        py(m * x_max + b),
        x1,
        y1 + 14.0
    );
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_one_point_per_sample_and_the_fit() {
        let pts = [(0.0, 400.0), (0.5, 420.0), (1.0, 421.0), (1.5, 421.5)];
        let svg = rss_svg(&pts, 0.3, (1.5, 419.0), "a <soak>");
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("a &lt;soak&gt;"));
        let poly = svg
            .split("<polyline points=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("polyline");
        assert_eq!(poly.split(' ').count(), 4);
        assert!(svg.contains("fit: +1.500 MB/min"));
    }
}
