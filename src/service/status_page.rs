//! The status page at `/`: one server-rendered HTML page (no script, refreshes itself) built from
//! the text `/metrics` serves at the same moment plus the monitor's board of text facts, so every
//! number on it is an exported value. Every string from the log or the state is escaped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::monitor::board::{BoardState, GraphCard};
use crate::monitor::metrics::name;
use crate::monitor::signals::{self, threshold};

/// How often the page reloads itself.
pub const REFRESH_SECONDS: u32 = 10;

/// Dead letters listed (the newest), and how much of the file's end is read to find them.
const DEAD_LETTERS_SHOWN: usize = 8;
const DEAD_LETTER_TAIL_BYTES: u64 = 256 << 10;

pub use crate::monitor::exposition::{parse_exposition, Sample, Series};

/// HTML-escapes text for element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// An alert rule of `pipelines/alerts.yml` whose condition holds on the exported values now (the
/// rule's `for:` may not have elapsed yet; Prometheus decides when it fires).
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub alert: &'static str,
    pub severity: String,
    pub detail: String,
}

/// The shipped alert rules whose conditions hold on the series `/metrics` exports now: each
/// rule's own judge in the signals catalog (`monitor::signals`, from which `pipelines/alerts.yml` is
/// generated), with its severity.
pub fn conditions(series: &Series, board: &BoardState, now_unix_s: f64) -> Vec<Condition> {
    signals::alert_rules()
        .iter()
        .flat_map(|rule| {
            (rule.holds)(series, board, now_unix_s).into_iter().map(|detail| Condition {
                alert: rule.name,
                severity: rule.severity.as_str().to_string(),
                detail,
            })
        })
        .collect()
}

/// A dead letter as the page lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct LetterRow {
    pub reason: String,
    pub detail: String,
    pub query_id: Option<String>,
    pub at: String,
    pub excerpt: String,
}

/// The newest dead letters of a file sink (its last 256 KiB), newest first.
pub fn newest_dead_letters(path: &Path, n: usize) -> Vec<LetterRow> {
    let Ok(mut file) = std::fs::File::open(path) else { return Vec::new() };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(DEAD_LETTER_TAIL_BYTES);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if file.take(DEAD_LETTER_TAIL_BYTES).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    // A tail cut mid-line starts with a partial line: skip it.
    let lines: Vec<&str> = text.lines().skip(usize::from(start > 0)).collect();
    lines
        .iter()
        .rev()
        .filter_map(|l| serde_json::from_str::<ultr_core::sinks::dead_letter::DeadLetterLine>(l).ok())
        .take(n)
        .map(|d| {
            let payload = d.payload.clone().unwrap_or_else(|| "(binary payload)".into());
            let query_id = serde_json::from_str::<serde_json::Value>(&payload)
                .ok()
                .and_then(|v| v.get("query_id").map(|q| q.as_str().map_or_else(|| q.to_string(), str::to_string)));
            LetterRow {
                reason: d.reason,
                detail: d.detail,
                query_id,
                at: format!("{}:{}@{}", d.source, d.partition, d.offset),
                excerpt: payload.chars().take(160).collect(),
            }
        })
        .collect()
}

fn number(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(v) if v.is_nan() => "NaN".into(),
        Some(v) => format!("{v:.digits$}"),
        None => "—".into(),
    }
}

fn unix_time(s: f64) -> String {
    if s <= 0.0 {
        return "never".into();
    }
    chrono::DateTime::from_timestamp_millis((s * 1000.0) as i64).map_or_else(|| s.to_string(), |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;padding:1rem;background:#fafafa;color:#222;max-width:1200px}\
h1{font-size:1.3rem;margin:.2rem 0}h2{font-size:1.05rem;margin:.2rem 0 .5rem}\
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:1rem}\
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8rem;overflow-x:auto}\
table{border-collapse:collapse;width:100%;font-size:.85rem}td,th{border-bottom:1px solid #eee;padding:.2rem .4rem;text-align:left;vertical-align:top}\
.ok{color:#1a7f37;font-weight:600}.bad{color:#cf222e;font-weight:600}.warn{color:#9a6700;font-weight:600}\
svg{width:100%;height:auto;max-width:640px}code{font-size:.85em;word-break:break-all}.muted{color:#666;font-size:.85rem}";

/// Renders the page from the exported series (`Metrics::series`: the registry's typed values) and
/// the board.
pub fn render(series: &Series, board: &BoardState, now_unix_s: f64) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\"><title>ultr status</title><style>{STYLE}</style></head><body>\
         <h1>ultr status</h1><p class=\"muted\">Source: {}. Rendered {} from the values <a href=\"/metrics\">/metrics</a> exports; reloads every {REFRESH_SECONDS} s. \
         <a href=\"/healthz\">/healthz</a></p><div class=\"grid\">",
        escape(&board.source),
        unix_time(now_unix_s),
    );
    verdicts(&mut h, series, board, now_unix_s);
    model(&mut h, series, board);
    swap_graph(&mut h, series, board.graph.as_ref());
    randomization_plan(&mut h, series, board.plan.as_ref());
    trainings(&mut h, board);
    stream(&mut h, series, board);
    dead_letters(&mut h, series, board);
    h.push_str("</div></body></html>\n");
    h
}

fn verdicts(h: &mut String, series: &Series, board: &BoardState, now: f64) {
    h.push_str("<section id=\"verdicts\"><h2>Verdicts</h2><table>");
    let identified: Vec<&Sample> = series.all(name::IDENTIFIED).collect();
    if identified.is_empty() {
        h.push_str("<tr><th>Identifiability</th><td id=\"verdict-identified\" data-value=\"\">not judged yet (no closed window)</td></tr>");
    }
    for s in identified {
        let model = s.labels.get("model").cloned().unwrap_or_default();
        let weak = series.get(name::WEAKLY_IDENTIFIED, &[("model", model.as_str())]) == Some(1.0);
        let (class, text) = match (s.value == 1.0, weak) {
            (true, false) => ("ok", "IDENTIFIED"),
            (true, true) => ("warn", "WEAKLY IDENTIFIED (a θ_k interval wider than max_theta_interval)"),
            (false, _) => ("bad", "NOT IDENTIFIED"),
        };
        let needs = board.graph.as_ref().map(|g| g.decides.clone()).unwrap_or_default();
        let _ = write!(
            h,
            "<tr><th>Identifiability ({})</th><td id=\"verdict-identified\" data-value=\"{}\"><span class=\"{class}\">{text}</span><br><span class=\"muted\">{}</span></td></tr>",
            escape(&model),
            s.value,
            escape(&needs)
        );
    }
    let z: Vec<&Sample> = series.all(name::MISSPECIFICATION_Z).collect();
    let blind = board.graph.as_ref().and_then(|g| g.misspecification_blind.clone());
    if z.is_empty() {
        let why = blind.clone().unwrap_or_else(|| "no window scored under a model yet".into());
        let _ = write!(h, "<tr><th>Misspecification</th><td id=\"verdict-misspecification\">cannot be assessed: {}</td></tr>", escape(&why));
    }
    for s in z {
        let model = s.labels.get("model").cloned().unwrap_or_default();
        let cell = if s.value.is_nan() {
            format!("<span class=\"warn\">cannot be assessed</span>: {}", escape(blind.as_deref().unwrap_or("the policy does not vary within positions")))
        } else {
            let (class, word) = if s.value > threshold::MISSPECIFICATION_Z { ("bad", "residuals depend on the logging policy") } else { ("ok", "no sign") };
            format!("<span class=\"{class}\">z = {:.2}</span> ({word}; alert above 4)", s.value)
        };
        let _ = write!(h, "<tr><th>Misspecification ({})</th><td id=\"verdict-misspecification\">{cell}</td></tr>", escape(&model));
    }
    let bottleneck = series.get(name::OVERLAP_BOTTLENECK, &[]);
    let _ = write!(h, "<tr><th>Overlap bottleneck</th><td>{}</td></tr>", number(bottleneck, 3));
    let disagree = series.get(name::LOGGED_PROPENSITY_DISAGREES, &[]);
    let dispersion = series.get(name::LOGGED_PROPENSITY_DISPERSION, &[]);
    let logged = match disagree {
        Some(d) if d > 0.0 => format!("<span class=\"bad\">{d} policy(ies) disagree</span> (dispersion {})", number(dispersion, 2)),
        _ if dispersion.is_some_and(|d| d > 0.0) => format!("<span class=\"ok\">agree</span> (dispersion {})", number(dispersion, 2)),
        _ => "no logged propensities judged".into(),
    };
    let _ = write!(h, "<tr><th>Logged propensities</th><td>{logged}</td></tr>");
    let conds = conditions(series, board, now);
    h.push_str("<tr><th>Alert conditions holding now</th><td id=\"alert-conditions\">");
    if conds.is_empty() {
        h.push_str("<span class=\"ok\">none</span>");
    }
    for c in &conds {
        let class = if c.severity == "critical" { "bad" } else { "warn" };
        let _ = write!(h, "<div><span class=\"{class}\">{}</span> ({}): {}</div>", c.alert, c.severity, escape(&c.detail));
    }
    h.push_str("<div class=\"muted\">the rules' conditions on these values; Prometheus fires once a rule's <code>for:</code> has passed</div></td></tr></table></section>");
}

/// θ_k − θ_1 with its interval as an SVG plot, and the same values as a table.
fn model(h: &mut String, series: &Series, board: &BoardState) {
    h.push_str("<section id=\"model\"><h2>Current model</h2>");
    let theta = series.by_position(name::THETA, &[]);
    let lower = series.by_position(name::THETA_INTERVAL, &[("bound", "lower")]);
    let upper = series.by_position(name::THETA_INTERVAL, &[("bound", "upper")]);
    match &board.current_model {
        Some(m) => {
            let range = m.data_range_ms.map_or("unknown".to_string(), |(s, e)| crate::monitor::span_in_short(s, e));
            let _ = write!(
                h,
                "<p>Model <code id=\"model-id\">{}</code>, trained {} on {} closed window(s) ({range} UTC){}. Promoted: {}</p>",
                escape(&m.id),
                escape(&m.created_at),
                m.windows,
                m.parent.as_ref().map(|p| format!(", warm-started from <code>{}</code>", escape(p))).unwrap_or_default(),
                escape(&m.promoted_reason),
            );
        }
        None => h.push_str("<p id=\"model-id\">No model promoted yet.</p>"),
    }
    // Positions the horizon never showed have no data behind their θ (the model exports its
    // initial value there): the page draws the positions of the graph, and says so.
    let seen: Vec<u32> = board.graph.as_ref().map(|g| g.components.iter().flatten().copied().collect()).unwrap_or_default();
    let mut theta = theta;
    let exported = theta.len();
    if let Some(&deepest) = seen.iter().max() {
        theta.retain(|k, _| *k <= deepest);
    }
    if theta.is_empty() {
        h.push_str("<p>No θ yet.</p></section>");
        return;
    }
    theta_plot(h, &theta, &lower, &upper);
    if theta.len() < exported {
        let _ = write!(
            h,
            "<p class=\"muted\">Positions {}–{exported} were not shown in the lookback horizon; their exported θ is untrained and not drawn.</p>",
            theta.len() + 1
        );
    }
    let note = match board.current_model.as_ref().and_then(|m| m.intervals.clone()) {
        Some(method) => format!("Points: the model's θ (as trained and shipped). Bars: the bootstrap interval of the converged estimate ({method})."),
        None => "Points: the model's θ. No intervals: enable [train.uncertainty] for bootstrap intervals.".into(),
    };
    let estimable = series.by_position(name::THETA_ESTIMABLE, &[]);
    let _ = write!(
        h,
        "<p class=\"muted\">{}</p><table id=\"theta-table\"><tr><th>k</th><th>θ<sub>k</sub> − θ<sub>1</sub></th><th>interval</th></tr>",
        escape(&note)
    );
    for (k, t) in &theta {
        let interval = match (lower.get(k), upper.get(k)) {
            (Some(lo), Some(hi)) => format!("[{lo:.4}, {hi:.4}]"),
            _ if estimable.get(k) == Some(&0.0) => "not estimable: no clicks in its swap pairs (early-stopped θ kept)".into(),
            _ => "—".into(),
        };
        let _ = write!(h, "<tr><td>{k}</td><td class=\"theta\" data-position=\"{k}\" data-value=\"{t}\">{t:.4}</td><td>{interval}</td></tr>");
    }
    h.push_str("</table></section>");
}

fn theta_plot(h: &mut String, theta: &BTreeMap<u32, f64>, lower: &BTreeMap<u32, f64>, upper: &BTreeMap<u32, f64>) {
    let (w, ht, left, right, top, bottom) = (480.0, 300.0, 56.0, 12.0, 15.0, 42.0);
    let values = theta.values().chain(lower.values()).chain(upper.values()).copied().filter(|v| v.is_finite());
    let (mut lo, mut hi) = values.fold((0.0f64, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    if hi - lo < 1e-9 {
        hi += 0.5;
        lo -= 0.5;
    }
    let pad = (hi - lo) * 0.08;
    let (lo, hi) = (lo - pad, hi + pad);
    let kmax = *theta.keys().max().unwrap_or(&1) as f64;
    let x = |k: u32| left + (k as f64 - 0.5) / kmax * (w - left - right);
    let y = |v: f64| top + (hi - v) / (hi - lo) * (ht - top - bottom);
    let _ =
        write!(h, "<svg id=\"theta-plot\" viewBox=\"0 0 {w} {ht}\" role=\"img\" aria-label=\"θ_k − θ_1 by position\" xmlns=\"http://www.w3.org/2000/svg\">");
    let _ = write!(h, "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>", y(0.0), w - right, y(0.0));
    let _ = write!(h, "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"#333\"/>", ht - bottom);
    for i in 0..=4 {
        let v = lo + (hi - lo) * i as f64 / 4.0;
        let _ = write!(h, "<text x=\"{}\" y=\"{}\" font-size=\"15\" text-anchor=\"end\">{v:.2}</text>", left - 5.0, y(v) + 5.0);
    }
    let step = ((kmax / 12.0).ceil() as u32).max(1);
    for (&k, &t) in theta {
        if (k - 1) % step == 0 {
            let _ = write!(h, "<text x=\"{}\" y=\"{}\" font-size=\"15\" text-anchor=\"middle\">{k}</text>", x(k), ht - bottom + 18.0);
        }
        if let (Some(&a), Some(&b)) = (lower.get(&k), upper.get(&k)) {
            let _ = write!(h, "<line class=\"interval\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#6e7781\" stroke-width=\"3\"><title>interval of θ{k} − θ1: [{a:.4}, {b:.4}]</title></line>", x(k), y(a), y(b));
        }
        if t.is_finite() {
            let _ =
                write!(h, "<circle class=\"theta-point\" cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"#0969da\"><title>θ{k} − θ1 = {t:.4}</title></circle>", x(k), y(t));
        }
    }
    let _ = write!(h, "<text x=\"{}\" y=\"{}\" font-size=\"15\" text-anchor=\"middle\">position k</text></svg>", (w + left) / 2.0, ht - 4.0);
}

/// The swap graph: positions on a circle, edges as wide as log(swap pairs), position 1's component green.
fn swap_graph(h: &mut String, series: &Series, graph: Option<&GraphCard>) {
    h.push_str("<section id=\"graph\"><h2>Swap graph</h2>");
    let edges: Vec<(u32, u32, f64)> = series
        .all(name::SWAP_PAIRS)
        .filter_map(|s| Some((s.labels.get("position_a")?.parse().ok()?, s.labels.get("position_b")?.parse().ok()?, s.value)))
        .collect();
    let mut nodes: Vec<u32> = graph.map(|g| g.components.iter().flatten().copied().collect()).unwrap_or_default();
    nodes.extend(edges.iter().flat_map(|(a, b, _)| [*a, *b]));
    nodes.sort_unstable();
    nodes.dedup();
    nodes.retain(|n| *n as usize <= crate::monitor::metrics::MAX_POSITION_LABELS);
    if nodes.is_empty() {
        h.push_str("<p>No closed window yet.</p></section>");
        return;
    }
    let first: Vec<u32> = graph.and_then(|g| g.components.iter().find(|c| c.contains(&1)).cloned()).unwrap_or_default();
    let (size, radius) = (320.0, 125.0);
    let at = |n: u32| {
        let i = nodes.iter().position(|m| *m == n).unwrap_or(0) as f64;
        let angle = -std::f64::consts::FRAC_PI_2 + i / nodes.len() as f64 * std::f64::consts::TAU;
        (size / 2.0 + radius * angle.cos(), size / 2.0 + radius * angle.sin())
    };
    let heaviest = edges.iter().map(|e| e.2).fold(1.0f64, f64::max);
    let _ = write!(h, "<svg id=\"swap-graph\" viewBox=\"0 0 {size} {size}\" role=\"img\" aria-label=\"swap graph: positions linked by swapped (query, document) pairs\" xmlns=\"http://www.w3.org/2000/svg\">");
    for (a, b, n) in &edges {
        let ((x1, y1), (x2, y2)) = (at(*a), at(*b));
        // Width and ink grow with log(pairs), so a dense graph still shows where the swaps are.
        let weight = (1.0 + n).ln() / (1.0 + heaviest).ln();
        let (width, opacity) = (0.3 + 4.7 * weight, 0.08 + 0.72 * weight);
        let _ = write!(h, "<line class=\"swap-edge\" x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"#57606a\" stroke-opacity=\"{opacity:.2}\" stroke-width=\"{width:.2}\"><title>{a}–{b}: {n} swap pairs</title></line>");
    }
    for n in &nodes {
        let (cx, cy) = at(*n);
        let fill = if first.contains(n) { "#1a7f37" } else { "#cf222e" };
        let _ = write!(h, "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"11\" fill=\"{fill}\"/><text x=\"{cx:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#fff\" text-anchor=\"middle\">{n}</text>", cy + 4.0);
    }
    h.push_str("</svg>");
    let _ = write!(
        h,
        "<p class=\"muted\">{} edge(s); width and ink grow with log(swap pairs), the heaviest {heaviest} pairs. Green: connected to position 1.</p>",
        edges.len()
    );
    swap_heatmap(h, series, &nodes, &edges, heaviest);
    if let Some(g) = graph {
        if g.components.len() > 1 {
            let comps: Vec<String> = g.components.iter().map(|c| format!("{{{}}}", c.iter().map(u32::to_string).collect::<Vec<_>>().join(" "))).collect();
            let advice: Vec<String> = g.advice.iter().map(|(a, b)| format!("{a}↔{b}")).collect();
            let _ = write!(
                h,
                "<p id=\"randomization-advice\" class=\"bad\">Not connected: components {}. Randomise (swap for a small share of traffic) {} to connect it.</p>",
                escape(&comps.join(", ")),
                escape(&advice.join(", "))
            );
        }
    }
    h.push_str("</section>");
}

/// The swap graph as a position × position heat map of log(1 + swap pairs), with each θ's interval
/// width from the swap pairs beside its row: at 20 or 50 positions, where the circle is a grey disc,
/// a weak link is a pale cell and a wide interval a long bar.
fn swap_heatmap(h: &mut String, series: &Series, nodes: &[u32], edges: &[(u32, u32, f64)], heaviest: f64) {
    let widths = series.by_position(name::THETA_INTERVAL_WIDTH, &[]);
    let pairs: BTreeMap<(u32, u32), f64> = edges.iter().flat_map(|&(a, b, n)| [((a, b), n), ((b, a), n)]).collect();
    let k = nodes.len() as f64;
    let (margin, bar) = (22.0, 90.0);
    let cell = (300.0 / k).clamp(5.0, 24.0);
    let (grid, width) = (cell * k, margin + cell * k + 8.0 + bar);
    let widest = widths.values().copied().filter(|w| w.is_finite()).fold(0.0f64, f64::max).max(1e-9);
    let _ = write!(
        h,
        "<svg id=\"swap-heatmap\" viewBox=\"0 0 {width:.0} {:.0}\" role=\"img\" aria-label=\"swap pairs per position pair, log scale, and each θ's interval width\" xmlns=\"http://www.w3.org/2000/svg\">",
        margin + grid + 4.0
    );
    let label_every = (k / 10.0).ceil().max(1.0) as usize;
    for (i, a) in nodes.iter().enumerate() {
        let y = margin + i as f64 * cell;
        if i % label_every == 0 {
            let _ = write!(h, "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" text-anchor=\"end\">{a}</text>", margin - 3.0, y + cell * 0.75);
            let _ =
                write!(h, "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" text-anchor=\"middle\">{a}</text>", margin + (i as f64 + 0.5) * cell, margin - 4.0);
        }
        for (j, b) in nodes.iter().enumerate() {
            let n = pairs.get(&(*a, *b)).copied().unwrap_or(0.0);
            let shade = if a == b { 0.0 } else { (1.0 + n).ln() / (1.0 + heaviest).ln() };
            let fill = if a == b { "#d0d7de".to_string() } else { format!("rgba(9,105,218,{:.2})", 0.04 + 0.96 * shade) };
            let _ = write!(
                h,
                "<rect class=\"swap-cell\" x=\"{:.1}\" y=\"{y:.1}\" width=\"{cell:.1}\" height=\"{cell:.1}\" fill=\"{fill}\"><title>{a}–{b}: {n} swap pairs</title></rect>",
                margin + j as f64 * cell
            );
        }
        if let Some(w) = widths.get(a) {
            let length = if w.is_finite() { bar * (w / widest).min(1.0) } else { bar };
            let color = if w.is_finite() { "#57606a" } else { "#cf222e" };
            let _ = write!(
                h,
                "<rect class=\"interval-width\" x=\"{:.1}\" y=\"{:.1}\" width=\"{length:.1}\" height=\"{:.1}\" fill=\"{color}\"><title>θ{a}: 95% interval width {w:.2}</title></rect>",
                margin + grid + 8.0,
                y + cell * 0.2,
                cell * 0.6
            );
        }
    }
    h.push_str("</svg>");
    let _ = write!(
        h,
        "<p class=\"muted\">Cell (a, b): log(1 + swap pairs) between positions a and b, darkest at {heaviest} pairs; a pale cell is a weak link. Bars: θ_k − θ_1's 95% interval width from the swap pairs (widest {widest:.2}; red: no informative path to position 1).</p>"
    );
}

/// The randomization plan: per position the sessions still needed and the time at the stream's rate
/// (the series), the design, its share and targets, and the swaps to run first (the board).
fn randomization_plan(h: &mut String, series: &Series, plan: Option<&ultr_core::identify::plan::Plan>) {
    h.push_str("<section id=\"randomization-plan\"><h2>Randomization plan</h2>");
    let Some(plan) = plan else {
        h.push_str("<p>No plan yet: it is made at each verdict once windows have closed.</p></section>");
        return;
    };
    let r = &plan.request;
    let _ = write!(
        h,
        "<p class=\"muted\">{} on {:.1}% of sessions (<code>[identifiability.randomization]</code>): sessions until θ<sub>k</sub> − θ<sub>1</sub>'s 95% interval is expected within its target, from the {:.0} sessions of the horizon.</p>",
        escape(&r.design.to_string()),
        100.0 * r.fraction,
        plan.sessions_in_horizon
    );
    let needed = series.by_position(name::RANDOMIZATION_SESSIONS_NEEDED, &[]);
    let eta = series.by_position(name::RANDOMIZATION_ETA_SECONDS, &[]);
    h.push_str("<table><tr><th>position</th><th>±target</th><th>sessions needed</th><th>time</th></tr>");
    for p in &plan.positions {
        let Some(&n) = needed.get(&p.position) else { continue };
        let shown = if n.is_infinite() { "out of reach".to_string() } else { format!("{n:.0}") };
        let time = match eta.get(&p.position) {
            Some(t) if t.is_finite() => format!("{:.1} h", t / 3600.0),
            Some(_) => "never".into(),
            None => "—".into(),
        };
        let class = if n == 0.0 {
            "ok"
        } else if n.is_infinite() {
            "bad"
        } else {
            "warn"
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{:.3}</td><td class=\"plan-needed {class}\" data-position=\"{}\" data-value=\"{n}\">{shown}</td><td>{time}</td></tr>",
            p.position, p.epsilon, p.position
        );
    }
    h.push_str("</table>");
    if !plan.swaps.is_empty() {
        let swaps: Vec<String> = plan
            .swaps
            .iter()
            .map(|s| match s.reason {
                ultr_core::identify::plan::SwapReason::Connects => format!("{}↔{} (connects)", s.a, s.b),
                ultr_core::identify::plan::SwapReason::Precision { .. } => format!("{}↔{}", s.a, s.b),
            })
            .collect();
        let _ = write!(h, "<p id=\"plan-swaps\">Swap first: {}</p>", escape(&swaps.join(", ")));
    }
    h.push_str("</section>");
}

fn trainings(h: &mut String, board: &BoardState) {
    h.push_str("<section id=\"trainings\"><h2>Last trainings</h2>");
    if board.trainings.is_empty() {
        h.push_str("<p>None yet.</p></section>");
        return;
    }
    h.push_str("<table><tr><th>finished</th><th>decision</th><th>θ<sub>2</sub>…</th><th>reason</th></tr>");
    for t in board.trainings.iter().rev() {
        let class = match t.result.as_str() {
            "promoted" => "ok",
            "rejected" => "warn",
            _ => "bad",
        };
        let theta: Vec<String> = t.theta.iter().skip(1).take(5).map(|v| format!("{v:+.2}")).collect();
        let _ = write!(
            h,
            "<tr><td>{}<br><code>{}</code></td><td class=\"{class}\">{}{}</td><td>{}</td><td>{} ({:.1} s)</td></tr>",
            unix_time(t.finished_unix_s),
            escape(t.id.as_deref().unwrap_or("")),
            escape(&t.result),
            if t.warm_start { " (warm)" } else { "" },
            theta.join(" "),
            escape(&t.reason),
            t.seconds
        );
    }
    h.push_str("</table>");
    if let Some(c) = board.trainings.iter().rev().find_map(|t| t.combination.as_ref()) {
        combination(h, c);
    }
    h.push_str("</section>");
}

/// Where the last training's clicks move the ranking away from the logged order, by click volume.
fn combination(h: &mut String, c: &ultr_train::logged_order_combination::Combination) {
    let _ = write!(
        h,
        "<h3 id=\"combination\">Logged order × clicks</h3><p>Ranking by the logged order (prior) and the clicks (evidence): {} chosen by held-out clicks (most likely: {}), {} pairs.</p>",
        escape(&c.chosen.label()),
        escape(&c.most_likely.label()),
        c.pairs
    );
    h.push_str("<table><tr><th>clicks per query</th><th>queries</th><th>order moved</th><th>pairs reordered</th><th>held-out Δ log-likelihood / impression vs the logged order</th></tr>");
    for b in c.by_click_volume.iter().filter(|b| b.queries > 0 || b.heldout_impressions > 0.0) {
        let range = match b.clicks_high {
            Some(hi) => format!("{}–{}", b.clicks_low, hi - 1),
            None => format!("≥ {}", b.clicks_low),
        };
        let (class, gain) = if b.heldout_impressions > 0.0 {
            let class = if b.heldout_gain + 2.0 * b.heldout_gain_se < 0.0 { "warn" } else { "ok" };
            (class, format!("{:+.5} ± {:.5}", b.heldout_gain, b.heldout_gain_se))
        } else {
            ("", "no held-out rows".to_string())
        };
        let _ = write!(
            h,
            "<tr><td>{range}</td><td>{}</td><td>{:.1}%</td><td>{:.1}%</td><td class=\"{class}\">{gain}</td></tr>",
            b.queries,
            100.0 * b.moved_share,
            100.0 * b.discordant_share
        );
    }
    h.push_str("</table>");
}

fn stream(h: &mut String, series: &Series, board: &BoardState) {
    let rate = board.rate(60.0, |c| c.sessions);
    let lag = series.sum(name::KAFKA_CONSUMER_LAG_MESSAGES);
    let rows = [
        ("Sessions/s (last minute)", number(rate, 1)),
        ("Sessions", number(series.get(name::SESSIONS_TOTAL, &[]), 0)),
        ("Records read", number(series.get(name::RECORDS_TOTAL, &[]), 0)),
        ("Windows open", number(series.get(name::WINDOWS_OPEN, &[]), 0)),
        ("Windows closed", number(series.get(name::WINDOWS_CLOSED_TOTAL, &[]), 0)),
        ("Late sessions", number(series.get(name::LATE_SESSIONS_TOTAL, &[]), 0)),
        ("Duplicate sessions", number(series.get(name::DUPLICATE_SESSIONS_TOTAL, &[]), 0)),
        ("Consumer lag (messages)", number(lag, 0)),
        ("Watermark", series.get(name::WATERMARK_TIMESTAMP_SECONDS, &[]).map_or("—".into(), unix_time)),
    ];
    h.push_str("<section id=\"stream\"><h2>Stream</h2><table>");
    for (k, v) in rows {
        let _ = write!(h, "<tr><th>{k}</th><td>{}</td></tr>", escape(&v));
    }
    h.push_str("</table></section>");
}

fn dead_letters(h: &mut String, series: &Series, board: &BoardState) {
    h.push_str("<section id=\"dead-letters\"><h2>Dead letters</h2><table><tr><th>reason</th><th>count</th></tr>");
    let mut any = false;
    for s in series.all(name::BAD_RECORDS_TOTAL) {
        any = true;
        let _ = write!(h, "<tr><td>{}</td><td>{}</td></tr>", escape(s.labels.get("reason").map_or("", String::as_str)), s.value);
    }
    if !any {
        h.push_str("<tr><td colspan=\"2\">none</td></tr>");
    }
    h.push_str("</table>");
    let _ = write!(h, "<p class=\"muted\">Written to {}.</p>", escape(&board.dead_letter_target));
    if let Some(path) = &board.dead_letter_file {
        let letters = newest_dead_letters(path, DEAD_LETTERS_SHOWN);
        if !letters.is_empty() {
            h.push_str("<table id=\"newest-dead-letters\"><tr><th>newest letters</th><th>query_id</th></tr>");
            for l in letters {
                let _ = write!(
                    h,
                    "<tr><td>{}: <span class=\"muted\">{}</span><br><code>{}</code></td><td class=\"query-id\">{}</td></tr><tr><td colspan=\"2\"><code>{}</code></td></tr>",
                    escape(&l.reason),
                    escape(&l.detail),
                    escape(&l.at),
                    escape(l.query_id.as_deref().unwrap_or("—")),
                    escape(&l.excerpt)
                );
            }
            h.push_str("</table>");
        }
    }
    h.push_str("</section>");
}
