//! The signals catalog: every alert the service ships, one typed entry each (its expression over
//! the metrics' names from `metrics::name`, its thresholds, `for:`, severity, summary and runbook).
//! `pipelines/alerts.yml` is generated from it (`ultr alert-rules`; a test fails when the file is
//! stale), each rule's condition on the exported values is its `holds` judge (the status page's
//! verdicts), and the monitor judges with the same `threshold` constants, so a threshold is
//! written once.

use std::sync::OnceLock;

use super::board::BoardState;
use super::exposition::{Sample, Series};
use super::metrics::name;

/// The numbers the alert rules compare against; the monitor and the status page use these too.
pub mod threshold {
    /// `ultr_identified` at this value: the horizon no longer identifies θ.
    pub const NOT_IDENTIFIED: f64 = 0.0;
    /// `ultr_weakly_identified` at this value: some θ_k's interval is wider than allowed.
    pub const WEAKLY_IDENTIFIED: f64 = 1.0;
    /// The overlap bottleneck below which feature identification is at risk.
    pub const OVERLAP_BOTTLENECK: f64 = 0.25;
    /// The misspecification score z above which residuals depend on the logging policy.
    pub const MISSPECIFICATION_Z: f64 = 4.0;
    /// `ultr_misspecification_assessable` at this value: the policy does not vary within positions.
    pub const NOT_ASSESSABLE: f64 = 0.0;
    /// Policies whose logged propensities disagree, above which the rule fires.
    pub const LOGGED_PROPENSITY_DISAGREES: f64 = 0.0;
    /// Population stability index of the residuals above which they drifted.
    pub const RESIDUAL_PSI: f64 = 0.2;
    /// Page-Hinkley statistic of the residuals above which they drifted.
    pub const RESIDUAL_PAGE_HINKLEY: f64 = 0.5;
    /// The upper 95 % bound of nDCG@10 (model − baseline) below which the model ranks worse.
    pub const JUDGED_NDCG10_UPPER: f64 = 0.0;
    /// Hours after start with no current model before ModelMissing.
    pub const MODEL_MISSING_HOURS: u32 = 26;
    /// Hours since the current model was created before TrainingStale.
    pub const TRAINING_STALE_HOURS: u32 = 26;
    /// Share of records dead-lettered above which IngestErrorsHigh fires.
    pub const INGEST_ERROR_RATE: f64 = 0.01;
    /// Minutes of the rates IngestErrorsHigh compares.
    pub const INGEST_ERROR_RATE_SPAN_MINUTES: u32 = 5;
    /// Messages behind on a partition above which ConsumerLagHigh fires.
    pub const CONSUMER_LAG_MESSAGES: f64 = 100_000.0;
    /// `ultr_source_up` at this value: the brokers are unreachable.
    pub const SOURCE_DOWN: f64 = 0.0;
    /// Minutes without a successful monitor pass, with an error among them, before MonitorFailing.
    pub const MONITOR_FAILING_MINUTES: u32 = 30;
}

/// An alert's `severity` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// One alerting rule as Prometheus loads it.
#[derive(Debug, Clone)]
pub struct AlertRule {
    pub name: &'static str,
    /// PromQL; a line break continues it on the next line.
    pub expr: String,
    /// A Prometheus duration.
    pub for_: &'static str,
    pub severity: Severity,
    /// The summary annotation (a Prometheus template).
    pub summary: &'static str,
    /// The runbook annotation: what the alert means and what to do.
    pub runbook: String,
    /// The rule's condition on exported values, as its `expr` reads (the status page's verdicts):
    /// one line per series for which it holds now (its `for:` is Prometheus's to wait out).
    pub holds: Judge,
}

/// What a rule's condition reads: the exported series, the board's counter samples (rates), and the
/// time now (Unix seconds).
pub type Judge = fn(&Series, &BoardState, f64) -> Vec<String>;

fn model(s: &Sample) -> String {
    s.labels.get("model").cloned().unwrap_or_default()
}

fn identifiability_lost(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let lost = series.all(name::IDENTIFIED).filter(|s| s.value == threshold::NOT_IDENTIFIED);
    let weak = series.all(name::WEAKLY_IDENTIFIED).filter(|s| s.value == threshold::WEAKLY_IDENTIFIED);
    lost.map(|s| format!("{}{{model=\"{}\"}} = {}", name::IDENTIFIED, model(s), s.value))
        .chain(weak.map(|s| format!("{}{{model=\"{}\"}} = {}: a θ_k interval wider than max_theta_interval", name::WEAKLY_IDENTIFIED, model(s), s.value)))
        .collect()
}

fn feature_overlap_low(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let low = series.get(name::OVERLAP_BOTTLENECK, &[]).filter(|b| *b < threshold::OVERLAP_BOTTLENECK);
    low.map(|b| format!("overlap bottleneck {b:.3} < {}", threshold::OVERLAP_BOTTLENECK)).into_iter().collect()
}

fn misspecification_suspected(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let high = series.all(name::MISSPECIFICATION_Z).filter(|s| s.value > threshold::MISSPECIFICATION_Z);
    high.map(|s| format!("z = {:.2} > {} ({})", s.value, threshold::MISSPECIFICATION_Z, model(s))).collect()
}

fn misspecification_unassessable(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let blind = series.all(name::MISSPECIFICATION_ASSESSABLE).filter(|s| s.value == threshold::NOT_ASSESSABLE);
    blind.map(|s| format!("{}{{model=\"{}\"}} = {}", name::MISSPECIFICATION_ASSESSABLE, model(s), s.value)).collect()
}

fn logged_propensity_mismatch(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let n = series.get(name::LOGGED_PROPENSITY_DISAGREES, &[]).filter(|n| *n > threshold::LOGGED_PROPENSITY_DISAGREES);
    n.map(|n| format!("{n} policy(ies) disagree")).into_iter().collect()
}

fn residual_drift(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let psi = series.get(name::RESIDUAL_PSI, &[]).unwrap_or(0.0);
    let ph = series.get(name::RESIDUAL_PAGE_HINKLEY, &[]).unwrap_or(0.0);
    if psi > threshold::RESIDUAL_PSI || ph > threshold::RESIDUAL_PAGE_HINKLEY {
        vec![format!("PSI {psi:.3}, Page-Hinkley {ph:.3}")]
    } else {
        Vec::new()
    }
}

fn judged_ranking_below_baseline(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let label = |s: &Sample, l: &str| s.labels.get(l).cloned().unwrap_or_default();
    series
        .all(name::JUDGED_NDCG_DIFFERENCE)
        .filter(|s| s.value < threshold::JUDGED_NDCG10_UPPER && label(s, "k") == "10" && label(s, "bound") == "upper")
        .map(|s| format!("{} model below the {} order in nDCG@10 (95% upper bound {:.3})", label(s, "model"), label(s, "baseline"), s.value))
        .collect()
}

fn model_missing(series: &Series, _: &BoardState, now_unix_s: f64) -> Vec<String> {
    if series.get(name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS, &[]).is_some() {
        return Vec::new();
    }
    let missing_s = f64::from(threshold::MODEL_MISSING_HOURS) * 3600.0;
    let started = series.get(name::START_TIMESTAMP_SECONDS, &[]).filter(|s| now_unix_s - s > missing_s);
    started.map(|s| format!("no current model {:.1} h after start", (now_unix_s - s) / 3600.0)).into_iter().collect()
}

fn training_stale(series: &Series, _: &BoardState, now_unix_s: f64) -> Vec<String> {
    let stale_s = f64::from(threshold::TRAINING_STALE_HOURS) * 3600.0;
    let created = series.get(name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS, &[]).filter(|c| now_unix_s - c > stale_s);
    created.map(|c| format!("model {:.1} h old > {} h", (now_unix_s - c) / 3600.0, threshold::TRAINING_STALE_HOURS)).into_iter().collect()
}

/// The rate comes from the board's counter samples over the rule's span.
fn ingest_errors_high(_: &Series, board: &BoardState, _: f64) -> Vec<String> {
    let span = f64::from(threshold::INGEST_ERROR_RATE_SPAN_MINUTES) * 60.0;
    match (board.rate(span, |c| c.bad_records), board.rate(span, |c| c.records)) {
        (Some(bad), Some(records)) if bad / records.max(1e-9) > threshold::INGEST_ERROR_RATE => {
            vec![format!("{:.1}% of records dead-lettered over {:.0} min", 100.0 * bad / records.max(1e-9), span / 60.0)]
        }
        _ => Vec::new(),
    }
}

fn consumer_lag_high(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let behind = series.all(name::KAFKA_CONSUMER_LAG_MESSAGES).filter(|s| s.value > threshold::CONSUMER_LAG_MESSAGES);
    behind.map(|s| format!("{} messages behind on {}", s.value, s.labels.get("topic").cloned().unwrap_or_default())).collect()
}

fn kafka_source_down(series: &Series, _: &BoardState, _: f64) -> Vec<String> {
    let down = series.get(name::SOURCE_UP, &[]).filter(|up| *up == threshold::SOURCE_DOWN);
    down.map(|up| format!("{} = {up}", name::SOURCE_UP)).into_iter().collect()
}

/// `increase(ultr_monitor_errors_total[span]) > 0` is: an error within the span, which the last
/// error's time says without the counter's history.
fn monitor_failing(series: &Series, _: &BoardState, now_unix_s: f64) -> Vec<String> {
    let failing_s = f64::from(threshold::MONITOR_FAILING_MINUTES) * 60.0;
    let last_ok = series.get(name::MONITOR_LAST_SUCCESS_TIMESTAMP_SECONDS, &[]).unwrap_or(0.0);
    let last_error = series.get(name::MONITOR_LAST_ERROR_TIMESTAMP_SECONDS, &[]).unwrap_or(f64::NEG_INFINITY);
    if now_unix_s - last_ok > failing_s && now_unix_s - last_error <= failing_s {
        vec![format!("no monitor pass for {:.0} min, the last error {:.0} min ago", (now_unix_s - last_ok) / 60.0, (now_unix_s - last_error) / 60.0)]
    } else {
        Vec::new()
    }
}

/// Every shipped alert, in the order of `pipelines/alerts.yml`.
pub fn alert_rules() -> &'static [AlertRule] {
    static RULES: OnceLock<Vec<AlertRule>> = OnceLock::new();
    RULES.get_or_init(|| {
        vec![
        AlertRule {
            name: "IdentifiabilityLost",
            expr: format!("min by (instance, model) ({}) == {} or max by (instance, model) ({}) == {}", name::IDENTIFIED, threshold::NOT_IDENTIFIED, name::WEAKLY_IDENTIFIED, threshold::WEAKLY_IDENTIFIED),
            for_: "15m",
            severity: Severity::Warning,
            summary: r#"the lookback horizon {{ if eq $value 1.0 }}identifies θ_k of the {{ $labels.model }} tower only weakly (a 95% interval wider than max_theta_interval){{ else }}no longer identifies θ_k of the {{ $labels.model }} tower{{ end }}"#,
            runbook: r#"`ultr identifiability --state DIR --config PIPELINE` says which graph the tower needs (swaps for a per-document embedding tower; swaps or adjacent-position feature overlap for a feature tower), how precisely the swap pairs determine each θ_k (`ultr_theta_interval_width`), which links rest on few pairs, and which position pairs to randomise (swap them for a small share of traffic, or add ε-greedy τ > 0). Until it is identified again, do not promote models whose θ_k matter."#.into(),
            holds: identifiability_lost,
        },
        AlertRule {
            name: "FeatureOverlapLow",
            expr: format!("min by (instance) ({}) < {}", name::OVERLAP_BOTTLENECK, threshold::OVERLAP_BOTTLENECK),
            for_: "30m",
            severity: Severity::Info,
            summary: r#"the weakest link between positions is thin (overlap bottleneck {{ $value }}): feature identification is at risk"#,
            runbook: format!(r#"A feature tower is identified through swaps and overlapping feature distributions of adjacent positions (Hager Thm 4.1); the weakest needed link scores below {} (1 = the classifier cannot tell the positions apart, 0 = it always can; below 0.1 the link is cut). Check for a new business rule or a more deterministic policy; randomise the weakest adjacent pair (`ultr identifiability` lists the scores)."#, threshold::OVERLAP_BOTTLENECK),
            holds: feature_overlap_low,
        },
        AlertRule {
            name: "MisspecificationSuspected",
            expr: format!("{} > {}", name::MISSPECIFICATION_Z, threshold::MISSPECIFICATION_Z),
            for_: "1m",
            severity: Severity::Warning,
            summary: r#"held-out residuals of the {{ $labels.model }} tower depend on the logging policy (z = {{ $value | printf "%.1f" }}): the additive model is misspecified"#,
            runbook: format!(r#"z is a score test of each window's held-out residuals against π(d,k|q), beyond the model's own logit, cluster-robust by (query, document); it is N(0,1) for a well-specified model at any traffic (z > {}: 3·10⁻⁵ per window by chance). Look for features the production ranker uses that the model lacks, a tower too simple for the relevance (linear on non-linear), non-additive click behaviour (a click-model mixture), a model that stopped training before it fit (flattened θ; see the training's epochs and stop reason), or a changed UI; enable IPS (`[train.ips] enabled = true`) to dampen the policy's amplification meanwhile."#, threshold::MISSPECIFICATION_Z),
            holds: misspecification_suspected,
        },
        AlertRule {
            name: "MisspecificationUnassessable",
            expr: format!("min by (instance, model) ({}) == {}", name::MISSPECIFICATION_ASSESSABLE, threshold::NOT_ASSESSABLE),
            for_: "1h",
            severity: Severity::Info,
            summary: r#"misspecification of the {{ $labels.model }} tower cannot be assessed: the logging policy does not vary within positions"#,
            runbook: r#"A deterministic policy puts each document at one position for its query (π ≡ 1), so residuals cannot be tested against it: a silent MisspecificationSuspected means nothing here. `ultr identifiability` prints the policy's variation; randomise a small share of traffic (ε-greedy or pairwise swaps) to make the model testable."#.into(),
            holds: misspecification_unassessable,
        },
        AlertRule {
            name: "LoggedPropensityMismatch",
            expr: format!("max by (instance) ({}) > {}", name::LOGGED_PROPENSITY_DISAGREES, threshold::LOGGED_PROPENSITY_DISAGREES),
            for_: "30m",
            severity: Severity::Warning,
            summary: r#"a logging policy's logged propensities disagree with what it was seen to do"#,
            runbook: r#"For a policy that logs its own propensity per item, the counted display frequencies of its (query, document, position) cells should be binomial around the logged π (dispersion ≈ 1). Far above means the logs or the policy changed: a stale exploration rate, another policy's propensities under this policy_id, a logging bug, or a new ranker. `ultr identifiability` names the policy. Until fixed, train with `[train.ips] source = "empirical"` for it (`policies = { "<policy_id>" = "empirical" }`)."#.into(),
            holds: logged_propensity_mismatch,
        },
        AlertRule {
            name: "ResidualDrift",
            expr: format!("{} > {} or {} > {}", name::RESIDUAL_PSI, threshold::RESIDUAL_PSI, name::RESIDUAL_PAGE_HINKLEY, threshold::RESIDUAL_PAGE_HINKLEY),
            for_: "30m",
            severity: Severity::Warning,
            summary: r#"residual distribution drifted from the reference window (PSI/Page-Hinkley {{ $value }})"#,
            runbook: r#"User behaviour or the item mix changed since the current model was promoted. Check the dashboard's residual-by-position panel, then retrain (`ultr train --state DIR --config PIPELINE`) and let the promotion gate decide."#.into(),
            holds: residual_drift,
        },
        AlertRule {
            name: "JudgedRankingBelowBaseline",
            expr: format!("max by (instance, model, baseline) ({}{{k=\"10\", bound=\"upper\"}}) < {}", name::JUDGED_NDCG_DIFFERENCE, threshold::JUDGED_NDCG10_UPPER),
            for_: "1h",
            severity: Severity::Warning,
            summary: r#"the current {{ $labels.model }} model ranks below the {{ $labels.baseline }} order on the editors' labels (nDCG@10 difference, 95% upper bound {{ $value | printf "%.3f" }})"#,
            runbook: r#"With `[eval] qrels`, the monitor scores the current model, the logged order (each document's mean shown position) and naive click-through against the labels over the lookback horizon; the whole 95% bootstrap interval of (model − baseline) lies below 0. `ultr eval --qrels FILE --state DIR --config PIPELINE` prints every ranker and metric. Below the logged order, removing position also removed what the production ranker knew (Hager et al.'s confounding): do not ship the model's ranking as is. Below naive click-through, check `ultr_training_converged`, `ultr_identified` and the θ intervals before trusting the model's debiasing."#.into(),
            holds: judged_ranking_below_baseline,
        },
        AlertRule {
            name: "ModelMissing",
            expr: format!("(time() - {} > {} * 3600) unless on (instance) {}", name::START_TIMESTAMP_SECONDS, threshold::MODEL_MISSING_HOURS, name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS),
            for_: "10m",
            severity: Severity::Warning,
            summary: r#"no model has been promoted in the {{ $value | humanizeDuration }} this instance has run"#,
            runbook: r#"The models directory has no current model (`ultr models --dir DIR` lists its checkpoints), a day after start. Either no training ran (no `[train] schedule` and no external CronJob) or every one failed or was rejected: see `ultr_trainings_total` by result and the log's training lines. A first model needs clicks and, with IPS, propensities; `ultr train` by hand prints the reason."#.into(),
            holds: model_missing,
        },
        AlertRule {
            name: "TrainingStale",
            expr: format!("time() - {} > {} * 3600", name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS, threshold::TRAINING_STALE_HOURS),
            for_: "10m",
            severity: Severity::Warning,
            summary: r#"the current model was trained {{ $value | humanizeDuration }} ago"#,
            runbook: r#"No model was promoted for over a day (read from the models directory, so restarts and external schedulers count; with no model at all, ModelMissing speaks instead). See `ultr_trainings_total` by result and the service or CronJob log; run `ultr train` by hand to see the error (no clicks, missing propensities, no new windows) or whether the gate keeps rejecting candidates."#.into(),
            holds: training_stale,
        },
        AlertRule {
            name: "IngestErrorsHigh",
            expr: format!("sum by (instance) (rate({bad}[{m}m]))\n  / clamp_min(sum by (instance) (rate({all}[{m}m])), 1e-9) > {}", threshold::INGEST_ERROR_RATE, bad = name::BAD_RECORDS_TOTAL, all = name::RECORDS_TOTAL, m = threshold::INGEST_ERROR_RATE_SPAN_MINUTES),
            for_: "10m",
            severity: Severity::Warning,
            summary: r#"{{ $value | humanizePercentage }} of records are dead-lettered"#,
            runbook: r#"Read the dead-letter output (reason and original bytes per record); `ultr_bad_records_total` by reason says which producer contract is broken. Fix the producer; the pipeline keeps valid records."#.into(),
            holds: ingest_errors_high,
        },
        AlertRule {
            name: "ConsumerLagHigh",
            expr: format!("max by (instance, topic) ({}) > {}", name::KAFKA_CONSUMER_LAG_MESSAGES, threshold::CONSUMER_LAG_MESSAGES),
            for_: "15m",
            severity: Severity::Warning,
            summary: r#"consumer is {{ $value }} messages behind on {{ $labels.topic }}"#,
            runbook: r#"Check `ultr_window_close_seconds` and CPU; a long training on the same host can starve ingest. Add instances with `[state.object_store]` (docs/scale-out.md: one consumer group, the topic keyed by query_id, at most one instance per partition does work), add partitions, or move scheduled training to an external CronJob."#.into(),
            holds: consumer_lag_high,
        },
        AlertRule {
            name: "KafkaSourceDown",
            expr: format!("min by (instance) ({}) == {}", name::SOURCE_UP, threshold::SOURCE_DOWN),
            for_: "5m",
            severity: Severity::Critical,
            summary: r#"ultr cannot reach its Kafka brokers"#,
            runbook: r#"The service stays up and retries; nothing is lost (reading resumes at the state's offsets). `ultr_kafka_errors_total` by kind says why (all_brokers_down, transport, authentication, tls); `/healthz` lists the problem. Check the brokers, the network and the credentials."#.into(),
            holds: kafka_source_down,
        },
        AlertRule {
            name: "MonitorFailing",
            expr: format!("(time() - {}) > {m} * 60 and on (instance) increase({}[{m}m]) > 0", name::MONITOR_LAST_SUCCESS_TIMESTAMP_SECONDS, name::MONITOR_ERRORS_TOTAL, m = threshold::MONITOR_FAILING_MINUTES),
            for_: "5m",
            severity: Severity::Warning,
            summary: r#"the monitor has not completed a pass for {{ $value | humanizeDuration }}"#,
            runbook: r#"Identifiability and residual metrics are stale. Read the service log ("monitor: ..."): an unreadable state file or an incompatible current model are the usual causes."#.into(),
            holds: monitor_failing,
        },
        ]
    })
}

/// The severity of the shipped alert `alert` (`info` when there is none of that name).
pub fn severity(alert: &str) -> Severity {
    alert_rules().iter().find(|r| r.name == alert).map_or(Severity::Info, |r| r.severity)
}

const HEADER: &str = "\
# Prometheus alerting rules for ultr, generated by `ultr alert-rules > pipelines/alerts.yml` from the
# signals catalog (src/monitor/signals.rs): edit the catalog, not this file. Unit-tested by `promtool
# test rules pipelines/alerts.test.yml` and run by a real Prometheus against real deployments
# (tests/deployment/alerting.rs), both in the README's test command. Thresholds are starting points;
# the README's \"The service\" section says what each metric measures.
# A series whose value is not known yet is absent, never a number that means something else: no model
# has no creation time, a file or the simulator has no `ultr_source_up`, no closed window has no overlap
# bottleneck. Every rule below is silent on an absent series, and ModelMissing reads that absence.
# Durations are written as `N * 3600` / `N * 60` seconds or Prometheus durations, so that
# `ultr rules-time-scale` finds every one of them.
";

/// Text folded onto lines of at most `width` characters after `indent` (a YAML `>-` block).
fn fold(text: &str, indent: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(indent);
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(indent);
    out.push_str(&line);
    out.push('\n');
    out
}

/// `pipelines/alerts.yml`: the catalog in Prometheus's rule-file format.
pub fn alerts_yaml() -> String {
    let mut out = String::from(HEADER);
    out.push_str("groups:\n  - name: ultr\n    rules:\n");
    for (i, r) in alert_rules().iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("      - alert: {}\n", r.name));
        if r.expr.contains('\n') {
            out.push_str("        expr: >-\n");
            for line in r.expr.lines() {
                out.push_str(&format!("          {line}\n"));
            }
        } else {
            out.push_str(&format!("        expr: {}\n", r.expr));
        }
        out.push_str(&format!("        for: {}\n        labels:\n          severity: {}\n", r.for_, r.severity.as_str()));
        let summary = r.summary.replace('\\', "\\\\").replace('"', "\\\"");
        out.push_str(&format!("        annotations:\n          summary: \"{summary}\"\n          runbook: >-\n"));
        out.push_str(&fold(&r.runbook, "            ", 100));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule has a unique name, and the expressions carry the catalog's thresholds as
    /// Prometheus reads them (a threshold written as the constant's shortest decimal).
    #[test]
    fn each_rule_is_named_once_and_compares_against_the_catalogs_thresholds() {
        let names: std::collections::BTreeSet<_> = alert_rules().iter().map(|r| r.name).collect();
        assert_eq!(names.len(), alert_rules().len());
        let expr = |n: &str| alert_rules().iter().find(|r| r.name == n).unwrap().expr.clone();
        assert_eq!(expr("MisspecificationSuspected"), "ultr_misspecification_z > 4");
        assert_eq!(expr("ResidualDrift"), "ultr_residual_psi > 0.2 or ultr_residual_page_hinkley > 0.5");
        assert_eq!(expr("ConsumerLagHigh"), "max by (instance, topic) (ultr_kafka_consumer_lag_messages) > 100000");
        assert_eq!(severity("KafkaSourceDown"), Severity::Critical);
    }
}
