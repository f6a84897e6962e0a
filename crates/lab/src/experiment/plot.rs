//! A small SVG writer for estimated-vs-true θ_k panels (no plotting dependency needed for lines and dots).

use std::fmt::Write;

/// One panel: the truth as a line, each estimate as a coloured polyline with dots.
pub struct Panel {
    pub title: String,
    pub truth: Vec<f64>,
    pub estimates: Vec<Vec<f64>>,
}

const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

/// Panels in a grid, `columns` wide; y range shared so panels compare.
pub fn theta_panels_svg(panels: &[Panel], columns: usize) -> String {
    let (w, h, pad) = (260.0, 190.0, 34.0);
    let rows = panels.len().div_ceil(columns.max(1));
    let all = panels.iter().flat_map(|p| p.truth.iter().chain(p.estimates.iter().flatten())).copied().filter(|v| v.is_finite());
    let (lo, hi) = all.fold((0f64, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = (lo - 0.1, hi + 0.1);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
        w * columns as f64,
        h * rows as f64 + 24.0
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(s, r##"<text x="8" y="16" font-size="13">θ_k − θ_1 by position: true (black), estimated per seed (colour)</text>"##);
    for (i, p) in panels.iter().enumerate() {
        let (ox, oy) = ((i % columns) as f64 * w, (i / columns) as f64 * h + 24.0);
        let k = p.truth.len().max(2);
        let x = |j: usize| ox + pad + (j as f64) * (w - pad - 10.0) / (k - 1) as f64;
        let y = |v: f64| oy + 20.0 + (hi - v) / (hi - lo) * (h - pad - 24.0);
        let _ = write!(s, r#"<text x="{}" y="{}">{}</text>"#, ox + pad, oy + 13.0, escape(&p.title));
        let _ = write!(s, r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#bbb"/>"##, ox + pad, oy + 20.0, w - pad - 10.0, h - pad - 24.0);
        for tick in [0.0, -1.0, -2.0, -3.0] {
            if tick >= lo && tick <= hi {
                let _ = write!(s, r##"<text x="{}" y="{}" text-anchor="end" fill="#666">{tick}</text>"##, ox + pad - 3.0, y(tick) + 4.0);
            }
        }
        let _ = write!(s, r##"<text x="{}" y="{}" fill="#666">k = 1..{k}</text>"##, ox + pad, oy + h - 8.0);
        let line = |values: &[f64]| values.iter().enumerate().map(|(j, v)| format!("{:.1},{:.1}", x(j), y(*v))).collect::<Vec<_>>().join(" ");
        let _ = write!(s, r##"<polyline points="{}" fill="none" stroke="#000" stroke-width="2"/>"##, line(&p.truth));
        for (e, est) in p.estimates.iter().enumerate() {
            let c = COLOURS[e % COLOURS.len()];
            let est: Vec<f64> = est.iter().take(k).copied().collect();
            let _ = write!(s, r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="1" stroke-dasharray="3,2"/>"#, line(&est));
            for (j, v) in est.iter().enumerate() {
                let _ = write!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="2.2" fill="{c}"/>"#, x(j), y(*v));
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// One panel of lines over a shared x: (name, y per x) each.
pub struct Series {
    pub title: String,
    pub x: Vec<f64>,
    pub lines: Vec<(String, Vec<f64>)>,
}

/// Panels side by side, each with its own y range, a legend under the first.
pub fn lines_svg(panels: &[Series]) -> String {
    let (w, h, pad) = (360.0, 260.0, 44.0);
    let legend = panels.iter().map(|p| p.lines.len()).max().unwrap_or(0) as f64 * 14.0 + 10.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
        w * panels.len().max(1) as f64,
        h + legend
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, p) in panels.iter().enumerate() {
        let ox = i as f64 * w;
        let values = p.lines.iter().flat_map(|l| l.1.iter()).copied().filter(|v| v.is_finite());
        let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let (lo, hi) = if lo.is_finite() { (lo - 0.01, hi + 0.01) } else { (0.0, 1.0) };
        let (xlo, xhi) = p.x.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
        let span = if xhi > xlo { xhi - xlo } else { 1.0 };
        let x = |v: f64| ox + pad + (v - xlo) / span * (w - pad - 16.0);
        let y = |v: f64| 24.0 + (hi - v) / (hi - lo) * (h - pad - 24.0);
        let _ = write!(s, r#"<text x="{}" y="14">{}</text>"#, ox + pad, escape(&p.title));
        let _ = write!(s, r##"<rect x="{}" y="24" width="{}" height="{}" fill="none" stroke="#bbb"/>"##, ox + pad, w - pad - 16.0, h - pad - 24.0);
        for t in 0..=4 {
            let v = lo + (hi - lo) * t as f64 / 4.0;
            let _ = write!(s, r##"<text x="{}" y="{}" text-anchor="end" fill="#666">{v:.3}</text>"##, ox + pad - 3.0, y(v) + 4.0);
        }
        for v in &p.x {
            let _ = write!(s, r##"<text x="{}" y="{}" text-anchor="middle" fill="#666">{v}</text>"##, x(*v), h - pad + 14.0);
        }
        let _ = write!(s, r##"<text x="{}" y="{}" fill="#666">w (weight of the label in the logging score)</text>"##, ox + pad, h - pad + 28.0);
        for (j, (name, ys)) in p.lines.iter().enumerate() {
            let c = COLOURS[j % COLOURS.len()];
            let points: Vec<String> = p.x.iter().zip(ys).filter(|(_, v)| v.is_finite()).map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b))).collect();
            let _ = write!(s, r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="1.5"/>"#, points.join(" "));
            for pt in &points {
                let (px, py) = pt.split_once(',').expect("x,y");
                let _ = write!(s, r#"<circle cx="{px}" cy="{py}" r="2.5" fill="{c}"/>"#);
            }
            if i == 0 {
                let ly = h + 4.0 + j as f64 * 14.0;
                let _ = write!(
                    s,
                    r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
                    pad,
                    pad + 20.0,
                    pad + 26.0,
                    ly + 4.0,
                    escape(name)
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// One heatmap per panel (rows j, columns k, value in [0, max]), darker = larger, cells labelled by
/// 1-based index: the attention matrices of Zhuang Fig. 5.
pub fn heatmaps_svg(panels: &[(String, Vec<Vec<f64>>)]) -> String {
    let (cell, pad, title) = (22.0, 28.0, 18.0);
    let side = |m: &Vec<Vec<f64>>| m.len() as f64 * cell + pad + 8.0;
    let width: f64 = panels.iter().map(|p| side(&p.1)).sum::<f64>().max(1.0);
    let height = panels.iter().map(|p| side(&p.1)).fold(0.0, f64::max) + title;
    let mut s = String::new();
    let _ = write!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="9">"#);
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut ox = 0.0;
    for (name, m) in panels {
        let max = m.iter().flatten().copied().filter(|v| v.is_finite()).fold(0.0, f64::max).max(1e-12);
        let _ = write!(s, r#"<text x="{}" y="12" font-size="11">{}</text>"#, ox + pad, escape(name));
        for (j, row) in m.iter().enumerate() {
            let y = title + pad + j as f64 * cell;
            let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#, ox + pad - 4.0, y + cell * 0.65, j + 1);
            for (k, v) in row.iter().enumerate() {
                let x = ox + pad + k as f64 * cell;
                let shade = (255.0 * (1.0 - (v / max).clamp(0.0, 1.0))).round() as u8;
                let _ = write!(
                    s,
                    r#"<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="rgb({shade},{shade},255)"><title>a[{}][{}] = {v:.3}</title></rect>"#,
                    j + 1,
                    k + 1
                );
            }
        }
        for k in 0..m.len() {
            let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, ox + pad + (k as f64 + 0.5) * cell, title + pad - 4.0, k + 1);
        }
        ox += side(m);
    }
    s.push_str("</svg>");
    s
}
