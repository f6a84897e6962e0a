//! `ultr::monitor::rules_time`: Alert rules' durations as Prometheus reads them, and their time scaling.

use ultr::monitor::rules_time::*;

const SHIPPED: &str = include_str!("../../../pipelines/alerts.yml");

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
