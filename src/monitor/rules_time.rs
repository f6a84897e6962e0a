//! Compresses time in a Prometheus rules file: every duration (`for:`, range vectors, subqueries,
//! `N * 3600` / `N * 60` second constants) divided by one factor, nothing else touched — so a test
//! can run the shipped rules against a service whose windows and schedules run that much faster.

/// One duration the scaler found and what it wrote instead.
#[derive(Debug, Clone, PartialEq)]
pub struct Scaled {
    /// 1-based line in the input.
    pub line: usize,
    /// `for`, `range` or `seconds`.
    pub kind: &'static str,
    pub original: String,
    pub seconds: f64,
    pub replacement: String,
}

/// The rules text with every duration divided by `factor`, and the list of what was scaled.
/// Range vectors and constants are scaled only inside `expr:` values (one line or a `>-` block),
/// `for:` values wherever they stand.
pub fn scale_rules(text: &str, factor: f64) -> Result<(String, Vec<Scaled>), String> {
    if !(factor.is_finite() && factor > 0.0) {
        return Err(format!("the time factor must be a positive number, not {factor}"));
    }
    let mut out = String::with_capacity(text.len());
    let mut found = Vec::new();
    // Indentation of the `expr:` key whose block we are in, when in one.
    let mut expr_indent: Option<usize> = None;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let number = i + 1;
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if expr_indent.is_some_and(|k| !trimmed.trim().is_empty() && indent <= k) {
            expr_indent = None;
        }
        if let Some(rest) = trimmed.strip_prefix("for:") {
            let value = rest.trim();
            let seconds = parse_prometheus_duration(value).ok_or_else(|| format!("line {number}: `for: {value}` is not a Prometheus duration"))?;
            let replacement = format_duration(seconds / factor);
            found.push(Scaled { line: number, kind: "for", original: value.to_string(), seconds, replacement: replacement.clone() });
            let at = line.find(value).expect("the value is in its line");
            out.push_str(&line[..at]);
            out.push_str(&replacement);
            out.push_str(&line[at + value.len()..]);
            continue;
        }
        let in_expr = if trimmed.starts_with("expr:") {
            expr_indent = Some(indent);
            true
        } else {
            expr_indent.is_some()
        };
        if in_expr {
            out.push_str(&scale_expression(line, number, factor, &mut found));
        } else {
            out.push_str(line);
        }
    }
    Ok((out, found))
}

/// Scales `[d]`, `[d:s]` and `N * 3600` / `N * 60` / `N * 86400` in one line of an expression.
fn scale_expression(line: &str, number: usize, factor: f64, found: &mut Vec<Scaled>) -> String {
    let mut out = String::with_capacity(line.len());
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < line.len() {
        if bytes[i] == b'[' {
            if let Some(close) = line[i..].find(']') {
                let inside = &line[i + 1..i + close];
                let parts: Vec<&str> = inside.split(':').collect();
                let durations: Option<Vec<f64>> =
                    parts.iter().map(|p| if p.is_empty() { Some(f64::NAN) } else { parse_prometheus_duration(p.trim()) }).collect();
                if let Some(durations) = durations.filter(|d| parts.len() <= 2 && !d[0].is_nan()) {
                    let scaled: Vec<String> = durations.iter().map(|s| if s.is_nan() { String::new() } else { format_duration(s / factor) }).collect();
                    for (p, s) in parts.iter().zip(&durations) {
                        if !s.is_nan() {
                            found.push(Scaled {
                                line: number,
                                kind: "range",
                                original: p.trim().to_string(),
                                seconds: *s,
                                replacement: format_duration(s / factor),
                            });
                        }
                    }
                    out.push('[');
                    out.push_str(&scaled.join(":"));
                    out.push(']');
                    i += close + 1;
                    continue;
                }
            }
        }
        if bytes[i].is_ascii_digit() && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b'.')) {
            let end = i + line[i..].find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(line.len() - i);
            let rest = &line[end..];
            let unit = ["3600", "86400", "60"].into_iter().find_map(|u| {
                let after = rest.trim_start().strip_prefix('*')?.trim_start().strip_prefix(u)?;
                (!after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '.')).then(|| (u, line.len() - after.len()))
            });
            if let (Some((unit, stop)), Ok(n)) = (unit, line[i..end].parse::<f64>()) {
                let seconds = n * unit.parse::<f64>().expect("a number");
                let replacement = format_seconds(seconds / factor);
                found.push(Scaled { line: number, kind: "seconds", original: line[i..stop].to_string(), seconds, replacement: replacement.clone() });
                out.push_str(&replacement);
                i = stop;
                continue;
            }
            out.push_str(&line[i..end]);
            i = end;
            continue;
        }
        let c = line[i..].chars().next().expect("in bounds");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Seconds of a Prometheus duration (`90s`, `1h30m`, `500ms`; units ms s m h d w y).
pub fn parse_prometheus_duration(text: &str) -> Option<f64> {
    if text.is_empty() {
        return None;
    }
    let mut total = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = [("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86400.0), ("w", 604800.0), ("y", 31536000.0)]
            .into_iter()
            .find(|(u, _)| rest.starts_with(u) && !(*u == "m" && rest.starts_with("ms")))
            .map(|(u, s)| (s, u.len()))?;
        total += n * unit;
        rest = &rest[len..];
    }
    Some(total)
}

/// A duration Prometheus parses, in whole milliseconds (at least 1 ms).
fn format_duration(seconds: f64) -> String {
    format!("{}ms", ((seconds * 1000.0).round() as u64).max(1))
}

/// Seconds as a plain number, to the millisecond.
fn format_seconds(seconds: f64) -> String {
    let text = format!("{seconds:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../pipelines/alerts.yml");

    #[test]
    fn durations_parse_as_prometheus_reads_them() {
        assert_eq!(parse_prometheus_duration("5m"), Some(300.0));
        assert_eq!(parse_prometheus_duration("1h30m"), Some(5400.0));
        assert_eq!(parse_prometheus_duration("500ms"), Some(0.5));
        assert_eq!(parse_prometheus_duration("train.ips"), None);
        assert_eq!(parse_prometheus_duration(""), None);
    }

    /// Against the real rules file: every `for:`, every range and every second constant is found
    /// and divided by the factor, and the file is otherwise unchanged — read independently, through
    /// the YAML, rule by rule.
    #[test]
    fn the_shipped_rules_scale_every_duration_and_nothing_else_and_promtool_accepts_them() {
        let factor = 120.0;
        let (scaled, found) = scale_rules(SHIPPED, factor).unwrap();
        let before: serde_yaml::Value = serde_yaml::from_str(SHIPPED).unwrap();
        let after: serde_yaml::Value = serde_yaml::from_str(&scaled).unwrap();
        let rules = |v: &serde_yaml::Value| v["groups"][0]["rules"].as_sequence().unwrap().clone();
        let (b, a) = (rules(&before), rules(&after));
        assert_eq!(b.len(), a.len());
        let mut ranges = 0;
        let mut constants = 0;
        for (rb, ra) in b.iter().zip(&a) {
            let name = rb["alert"].as_str().unwrap();
            // Everything but `for` and `expr` is the same.
            for key in ["alert", "labels", "annotations"] {
                assert_eq!(rb[key], ra[key], "{name}: {key} changed");
            }
            let f_before = parse_prometheus_duration(rb["for"].as_str().unwrap()).unwrap();
            let f_after = parse_prometheus_duration(ra["for"].as_str().unwrap()).unwrap();
            assert!((f_after - f_before / factor).abs() < 1e-3, "{name}: for {f_before} s became {f_after} s");
            // The expression: every `[...]` and every `N * 3600|60` is scaled, the rest equal.
            let (eb, ea) = (rb["expr"].as_str().unwrap(), ra["expr"].as_str().unwrap());
            let mask = |e: &str, scale: f64| -> (String, Vec<f64>) {
                let mut text = String::new();
                let mut values = Vec::new();
                let mut rest = e;
                while let Some(open) = rest.find('[') {
                    let close = rest[open..].find(']').unwrap() + open;
                    text.push_str(&rest[..open]);
                    text.push_str("[D]");
                    values.push(parse_prometheus_duration(&rest[open + 1..close]).unwrap() * scale);
                    rest = &rest[close + 1..];
                }
                text.push_str(rest);
                (text, values)
            };
            let (tb, vb) = mask(eb, 1.0 / factor);
            let (ta, va) = mask(ea, 1.0);
            ranges += vb.len();
            for (x, y) in vb.iter().zip(&va) {
                assert!((x - y).abs() < 1e-3, "{name}: range {x} s expected, {y} s written");
            }
            // `N * 3600` / `N * 60` as whitespace-separated tokens (parentheses stripped).
            let number = |t: &str| t.trim_matches(|c: char| !c.is_ascii_digit()).to_string();
            let tokens: Vec<&str> = tb.split_whitespace().collect();
            let products: Vec<(String, String)> =
                tokens.windows(3).filter(|w| w[1] == "*" && ["3600", "60"].contains(&number(w[2]).as_str())).map(|w| (number(w[0]), number(w[2]))).collect();
            constants += products.len();
            let mut tb_masked = tb.clone();
            for (n, unit) in &products {
                let scaled = n.parse::<f64>().unwrap() * unit.parse::<f64>().unwrap() / factor;
                tb_masked = tb_masked.replacen(&format!("{n} * {unit}"), &format_seconds(scaled), 1);
            }
            assert_eq!(tb_masked, ta, "{name}: the expression changed beyond its durations");
        }
        let fors = found.iter().filter(|f| f.kind == "for").count();
        assert_eq!(fors, a.len(), "one `for:` per rule");
        assert_eq!(found.iter().filter(|f| f.kind == "range").count(), ranges);
        assert_eq!(found.iter().filter(|f| f.kind == "seconds").count(), constants);
        assert!(ranges >= 2 && constants >= 3, "the shipped rules have ranges (5m, 30m) and constants (26 * 3600 twice, 30 * 60): {found:?}");
        // Prometheus's own checker accepts the result (the test command installs promtool; without
        // it the test fails rather than passing unchecked).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scaled.yml");
        std::fs::write(&path, &scaled).unwrap();
        let mut promtool = std::process::Command::new("promtool");
        promtool.arg("check").arg("rules").arg(&path);
        // A deadline: `output()` on its own thread, the answer awaited for at most a minute.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(promtool.output()));
        let out = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("promtool answers within 60 s")
            .expect("promtool on PATH (Debian package `prometheus`; the README's test command installs it)");
        assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn subqueries_days_and_block_expressions_scale() {
        let text = "      - alert: A\n        expr: >-\n          max_over_time(x[1h:5m]) > 2 * 86400\n            and y\n        for: 1h\n        labels:\n          note: '[5m] stays'\n";
        let (out, found) = scale_rules(text, 60.0).unwrap();
        assert!(out.contains("x[60000ms:5000ms]) > 2880"), "{out}");
        assert!(out.contains("for: 60000ms"), "{out}");
        assert!(out.contains("note: '[5m] stays'"), "{out}");
        assert_eq!(found.len(), 4);
        assert!(scale_rules(text, 0.0).is_err());
    }
}
