//! The shipped alert rules (`pipelines/alerts.yml`) as the status page reads them: each rule's
//! severity, the numbers its `expr` compares against and the spans of its range vectors. The file
//! is the one source of the thresholds; the page judges with what it finds here.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use anyhow::Context;

use crate::monitor::rules_time::parse_prometheus_duration;

/// The alerts file compiled into the binary: the rules a deployment loads into Prometheus.
pub const SHIPPED: &str = include_str!("../../pipelines/alerts.yml");

/// One rule: what the page needs of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub severity: String,
    /// The numbers right of each comparison (`>`, `<`, `==`, …) in the expr, in order; a product of
    /// literals (`26 * 3600`) is multiplied out.
    pub thresholds: Vec<f64>,
    /// The spans of the expr's range vectors (`[5m]`), in seconds, in order.
    pub ranges_s: Vec<f64>,
}

/// The rules by alert name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlertRules(pub BTreeMap<String, Rule>);

impl AlertRules {
    /// The rules of an alerts file in Prometheus's rule-file format; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> anyhow::Result<AlertRules> {
        let doc: serde_yaml::Value = serde_yaml::from_str(text).with_context(|| format!("{origin}: not YAML"))?;
        let mut out = BTreeMap::new();
        let groups = doc["groups"].as_sequence().with_context(|| format!("{origin}: no `groups` list"))?;
        for rule in groups.iter().filter_map(|g| g["rules"].as_sequence()).flatten() {
            let Some(name) = rule["alert"].as_str() else { continue };
            let expr = rule["expr"].as_str().with_context(|| format!("{origin}: alert {name} has no `expr`"))?;
            let severity = rule["labels"]["severity"].as_str().with_context(|| format!("{origin}: alert {name} has no `labels.severity`"))?;
            let ranges_s = ranges(expr).with_context(|| format!("{origin}: alert {name}'s expr"))?;
            out.insert(name.to_string(), Rule { severity: severity.to_string(), thresholds: thresholds(expr), ranges_s });
        }
        Ok(AlertRules(out))
    }

    /// The rules of [`SHIPPED`].
    pub fn shipped() -> &'static AlertRules {
        static RULES: OnceLock<AlertRules> = OnceLock::new();
        // The file is compiled in and a test parses it, so a failure here is a build defect.
        RULES.get_or_init(|| AlertRules::parse(SHIPPED, "pipelines/alerts.yml").expect("the shipped alerts file parses"))
    }

    /// Threshold `i` of `alert`; NaN when the rule or the number is missing, so no comparison holds.
    pub fn threshold(&self, alert: &str, i: usize) -> f64 {
        self.0.get(alert).and_then(|r| r.thresholds.get(i)).copied().unwrap_or(f64::NAN)
    }

    /// Range `i` of `alert`, in seconds (NaN when missing).
    pub fn range_s(&self, alert: &str, i: usize) -> f64 {
        self.0.get(alert).and_then(|r| r.ranges_s.get(i)).copied().unwrap_or(f64::NAN)
    }

    /// The severity label of `alert` ("" when missing).
    pub fn severity(&self, alert: &str) -> &str {
        self.0.get(alert).map_or("", |r| r.severity.as_str())
    }
}

/// The numbers right of each comparison operator, products of literals multiplied out.
fn thresholds(expr: &str) -> Vec<f64> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let op_len = match (b[i], b.get(i + 1)) {
            (b'=' | b'!' | b'>' | b'<', Some(b'=')) => 2,
            (b'>' | b'<', _) => 1,
            _ => 0,
        };
        if op_len == 0 {
            i += 1;
            continue;
        }
        i += op_len;
        // `bool` may follow a comparison; anything else that is not a number (a vector) is no threshold.
        let rest = expr[i..].trim_start();
        let rest = rest.strip_prefix("bool").map_or(rest, str::trim_start);
        let mut value: Option<f64> = None;
        let mut tail = rest;
        loop {
            let end = tail.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+')).unwrap_or(tail.len());
            let Ok(n) = tail[..end].parse::<f64>() else { break };
            value = Some(value.unwrap_or(1.0) * n);
            match tail[end..].trim_start().strip_prefix('*') {
                Some(more) => tail = more.trim_start(),
                None => break,
            }
        }
        if let Some(v) = value {
            out.push(v);
        }
    }
    out
}

/// The spans of `[…]` range vectors (a subquery's range, before its `:`), in seconds.
fn ranges(expr: &str) -> anyhow::Result<Vec<f64>> {
    expr.split('[')
        .skip(1)
        .map(|part| {
            let inside = part.split(']').next().unwrap_or("");
            let span = inside.split(':').next().unwrap_or("").trim();
            parse_prometheus_duration(span).with_context(|| format!("range [{inside}] is not a Prometheus duration"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped file parses, and its numbers are read as Prometheus reads them: comparisons'
    /// right sides in order (a product multiplied out, `clamp_min`'s argument not a threshold),
    /// range vectors in seconds.
    #[test]
    fn the_shipped_rules_are_read_with_their_numbers() {
        let rules = AlertRules::parse(SHIPPED, "alerts.yml").unwrap();
        assert_eq!(rules.0["IdentifiabilityLost"].thresholds, vec![0.0, 1.0]);
        assert_eq!(rules.0["FeatureOverlapLow"].thresholds, vec![0.25]);
        assert_eq!(rules.0["ResidualDrift"].thresholds, vec![0.2, 0.5]);
        assert_eq!(rules.0["TrainingStale"].thresholds, vec![26.0 * 3600.0]);
        assert_eq!(rules.0["IngestErrorsHigh"].thresholds, vec![0.01]);
        assert_eq!(rules.0["IngestErrorsHigh"].ranges_s, vec![300.0, 300.0]);
        assert_eq!(rules.0["MonitorFailing"].thresholds, vec![1800.0, 0.0]);
        assert_eq!(rules.0["MonitorFailing"].ranges_s, vec![1800.0]);
        assert_eq!(rules.severity("KafkaSourceDown"), "critical");
        assert!(rules.threshold("NoSuchAlert", 0).is_nan());
    }

    /// A file that is not a rule file, or a range with an unknown unit, is an error naming the file
    /// and the alert.
    #[test]
    fn a_bad_rules_file_is_an_error_that_names_it() {
        let e = AlertRules::parse("groups: 3", "my.yml").unwrap_err();
        assert!(format!("{e:#}").contains("my.yml"), "{e:#}");
        let bad = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(x[5q]) > 1\n        labels:\n          severity: info\n";
        let e = AlertRules::parse(bad, "my.yml").unwrap_err();
        assert!(format!("{e:#}").contains("alert A") && format!("{e:#}").contains("5q"), "{e:#}");
    }
}
