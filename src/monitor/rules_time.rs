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
pub fn format_seconds(seconds: f64) -> String {
    let text = format!("{seconds:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}
