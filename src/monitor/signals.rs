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
    /// promtool unit tests of the rule (`pipelines/alerts.test.yml` is generated from them): input
    /// series, and when the rule must be silent or firing with which labels and summary. Where it
    /// fires, the rule's `holds` must hold on the same values (a unit test here), so the PromQL and
    /// the status page's judge are checked against each other.
    pub scenarios: Vec<Scenario>,
    /// What the rule does 27 h into the shared fresh-start scenario (`fresh_start_inputs`: a healthy
    /// instance without a model beside one that trains every minute); `None`: silent, as every rule
    /// must be 26 h in.
    pub fresh_start: Option<Fired>,
    /// The rule's condition on exported values, as its `expr` reads (the status page's verdicts):
    /// one line per series for which it holds now (its `for:` is Prometheus's to wait out).
    pub holds: Judge,
}

/// One promtool test case of a rule: the input series (one value per minute) and the checks.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub series: Vec<Input>,
    /// (evaluation time as promtool reads it, e.g. `40m` or `26h5m`; the alert then: none, or firing).
    pub checks: Vec<(&'static str, Option<Fired>)>,
}

/// One input series of a scenario.
#[derive(Debug, Clone)]
pub struct Input {
    /// Why this series (a comment line in the generated file); may be empty.
    pub comment: &'static str,
    /// `name{labels}`.
    pub series: String,
    /// promtool's expanding notation: `1x20 0x40`, `0+1000x60`, `NaN`.
    pub values: String,
}

fn input(comment: &'static str, name: &str, labels: &str, values: &str) -> Input {
    Input { comment, series: format!("{name}{{{labels}}}"), values: values.to_string() }
}

/// A firing alert as a scenario expects it: its labels beside `severity`, and its summary as
/// Prometheus expands the template (the runbook is the rule's own).
#[derive(Debug, Clone)]
pub struct Fired {
    pub labels: &'static [(&'static str, &'static str)],
    pub summary: &'static str,
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
            scenarios: vec![
                Scenario {
                    series: vec![
                        input("The swap graph is split all along (a deterministic policy); only `identified` counts.", name::GRAPH_COMPONENTS, r#"instance="u", graph="swap""#, "3x60"),
                        input("", name::IDENTIFIED, r#"instance="u", model="linear""#, "1x20 0x40"),
                    ],
                    checks: vec![
                        ("20m", None),
                        ("30m", None),
                        ("40m", Some(Fired { labels: &[("instance", "u"), ("model", "linear")], summary: "the lookback horizon no longer identifies θ_k of the linear tower" })),
                    ],
                },
                Scenario {
                    series: vec![
                        input("Connected all along; the swap pairs' information thins out after 20 minutes.", name::IDENTIFIED, r#"instance="w", model="embedding""#, "1x60"),
                        input("", name::WEAKLY_IDENTIFIED, r#"instance="w", model="embedding""#, "0x20 1x40"),
                    ],
                    checks: vec![
                        ("30m", None),
                        (
                            "40m",
                            Some(Fired {
                                labels: &[("instance", "w"), ("model", "embedding")],
                                summary: "the lookback horizon identifies θ_k of the embedding tower only weakly (a 95% interval wider than max_theta_interval)",
                            }),
                        ),
                    ],
                },
            ],
            fresh_start: None,
            holds: identifiability_lost,
        },
        AlertRule {
            name: "FeatureOverlapLow",
            expr: format!("min by (instance) ({}) < {}", name::OVERLAP_BOTTLENECK, threshold::OVERLAP_BOTTLENECK),
            for_: "30m",
            severity: Severity::Info,
            summary: r#"the weakest link between positions is thin (overlap bottleneck {{ $value }}): feature identification is at risk"#,
            runbook: format!(r#"A feature tower is identified through swaps and overlapping feature distributions of adjacent positions (Hager Thm 4.1); the weakest needed link scores below {} (1 = the classifier cannot tell the positions apart, 0 = it always can; below 0.1 the link is cut). Check for a new business rule or a more deterministic policy; randomise the weakest adjacent pair (`ultr identifiability` lists the scores)."#, threshold::OVERLAP_BOTTLENECK),
            scenarios: vec![Scenario {
                series: vec![input("", name::OVERLAP_BOTTLENECK, r#"instance="u""#, "0.4x30 0.02x60")],
                checks: vec![
                    ("45m", None),
                    ("75m", Some(Fired { labels: &[("instance", "u")], summary: "the weakest link between positions is thin (overlap bottleneck 0.02): feature identification is at risk" })),
                ],
            }],
            fresh_start: None,
            holds: feature_overlap_low,
        },
        AlertRule {
            name: "MisspecificationSuspected",
            expr: format!("{} > {}", name::MISSPECIFICATION_Z, threshold::MISSPECIFICATION_Z),
            for_: "1m",
            severity: Severity::Warning,
            summary: r#"held-out residuals of the {{ $labels.model }} tower depend on the logging policy (z = {{ $value | printf "%.1f" }}): the additive model is misspecified"#,
            runbook: format!(r#"z is a score test of each window's held-out residuals against π(d,k|q), beyond the model's own logit, cluster-robust by (query, document); it is N(0,1) for a well-specified model at any traffic (z > {}: 3·10⁻⁵ per window by chance). Look for features the production ranker uses that the model lacks, a tower too simple for the relevance (linear on non-linear), non-additive click behaviour (a click-model mixture), a model that stopped training before it fit (flattened θ; see the training's epochs and stop reason), or a changed UI; enable IPS (`[train.ips] enabled = true`) to dampen the policy's amplification meanwhile."#, threshold::MISSPECIFICATION_Z),
            scenarios: vec![Scenario {
                series: vec![
                    input(
                        "A window every 10 minutes: z of a well-specified model (N(0,1) draws), then a misspecified one.",
                        name::MISSPECIFICATION_Z,
                        r#"instance="u", model="linear""#,
                        "0.4x9 -1.3x9 2.1x9 0.2x9 9.5x40",
                    ),
                    input("Blind (deterministic policy): NaN is never above the threshold.", name::MISSPECIFICATION_Z, r#"instance="b", model="linear""#, &["NaN"; 90].join(" ")),
                ],
                checks: vec![
                    ("39m", None),
                    (
                        "42m",
                        Some(Fired {
                            labels: &[("instance", "u"), ("model", "linear")],
                            summary: "held-out residuals of the linear tower depend on the logging policy (z = 9.5): the additive model is misspecified",
                        }),
                    ),
                ],
            }],
            fresh_start: None,
            holds: misspecification_suspected,
        },
        AlertRule {
            name: "MisspecificationUnassessable",
            expr: format!("min by (instance, model) ({}) == {}", name::MISSPECIFICATION_ASSESSABLE, threshold::NOT_ASSESSABLE),
            for_: "1h",
            severity: Severity::Info,
            summary: r#"misspecification of the {{ $labels.model }} tower cannot be assessed: the logging policy does not vary within positions"#,
            runbook: r#"A deterministic policy puts each document at one position for its query (π ≡ 1), so residuals cannot be tested against it: a silent MisspecificationSuspected means nothing here. `ultr identifiability` prints the policy's variation; randomise a small share of traffic (ε-greedy or pairwise swaps) to make the model testable."#.into(),
            scenarios: vec![Scenario {
                series: vec![input("", name::MISSPECIFICATION_ASSESSABLE, r#"instance="u", model="linear""#, "1x30 0x90")],
                checks: vec![
                    ("80m", None),
                    (
                        "100m",
                        Some(Fired {
                            labels: &[("instance", "u"), ("model", "linear")],
                            summary: "misspecification of the linear tower cannot be assessed: the logging policy does not vary within positions",
                        }),
                    ),
                ],
            }],
            fresh_start: None,
            holds: misspecification_unassessable,
        },
        AlertRule {
            name: "LoggedPropensityMismatch",
            expr: format!("max by (instance) ({}) > {}", name::LOGGED_PROPENSITY_DISAGREES, threshold::LOGGED_PROPENSITY_DISAGREES),
            for_: "30m",
            severity: Severity::Warning,
            summary: r#"a logging policy's logged propensities disagree with what it was seen to do"#,
            runbook: r#"For a policy that logs its own propensity per item, the counted display frequencies of its (query, document, position) cells should be binomial around the logged π (dispersion ≈ 1). Far above means the logs or the policy changed: a stale exploration rate, another policy's propensities under this policy_id, a logging bug, or a new ranker. `ultr identifiability` names the policy. Until fixed, train with `[train.ips] source = "empirical"` for it (`policies = { "<policy_id>" = "empirical" }`)."#.into(),
            scenarios: vec![Scenario {
                series: vec![
                    input("A right log (dispersion ≈ 1), then a stale logger from minute 20.", name::LOGGED_PROPENSITY_DISAGREES, r#"instance="u""#, "0x20 1x60"),
                    input("", name::LOGGED_PROPENSITY_DISPERSION, r#"instance="u""#, "1.02x20 37x60"),
                ],
                checks: vec![
                    ("45m", None),
                    ("55m", Some(Fired { labels: &[("instance", "u")], summary: "a logging policy's logged propensities disagree with what it was seen to do" })),
                ],
            }],
            fresh_start: None,
            holds: logged_propensity_mismatch,
        },
        AlertRule {
            name: "ResidualDrift",
            expr: format!("{} > {} or {} > {}", name::RESIDUAL_PSI, threshold::RESIDUAL_PSI, name::RESIDUAL_PAGE_HINKLEY, threshold::RESIDUAL_PAGE_HINKLEY),
            for_: "30m",
            severity: Severity::Warning,
            summary: r#"residual distribution drifted from the reference window (PSI/Page-Hinkley {{ $value }})"#,
            runbook: r#"User behaviour or the item mix changed since the current model was promoted. Check the dashboard's residual-by-position panel, then retrain (`ultr train --state DIR --config PIPELINE`) and let the promotion gate decide."#.into(),
            scenarios: vec![Scenario {
                series: vec![input("", name::RESIDUAL_PSI, r#"instance="u""#, "0.02x30 0.5x60"), input("", name::RESIDUAL_PAGE_HINKLEY, r#"instance="u""#, "0x90")],
                checks: vec![
                    ("40m", None),
                    ("75m", Some(Fired { labels: &[("instance", "u")], summary: "residual distribution drifted from the reference window (PSI/Page-Hinkley 0.5)" })),
                ],
            }],
            fresh_start: None,
            holds: residual_drift,
        },
        AlertRule {
            name: "JudgedRankingBelowBaseline",
            expr: format!("max by (instance, model, baseline) ({}{{k=\"10\", bound=\"upper\"}}) < {}", name::JUDGED_NDCG_DIFFERENCE, threshold::JUDGED_NDCG10_UPPER),
            for_: "1h",
            severity: Severity::Warning,
            summary: r#"the current {{ $labels.model }} model ranks below the {{ $labels.baseline }} order on the editors' labels (nDCG@10 difference, 95% upper bound {{ $value | printf "%.3f" }})"#,
            runbook: r#"With `[eval] qrels`, the monitor scores the current model, the logged order (each document's mean shown position) and naive click-through against the labels over the lookback horizon; the whole 95% bootstrap interval of (model − baseline) lies below 0. `ultr eval --qrels FILE --state DIR --config PIPELINE` prints every ranker and metric. Below the logged order, removing position also removed what the production ranker knew (Hager et al.'s confounding): do not ship the model's ranking as is. Below naive click-through, check `ultr_training_converged`, `ultr_identified` and the θ intervals before trusting the model's debiasing."#.into(),
            scenarios: vec![Scenario {
                series: vec![
                    input(
                        "Judged evaluations: the model's interval against the logged order straddles 0, then lies below it; against naive click-through it stays above. Another k is not the rule's.",
                        name::JUDGED_NDCG_DIFFERENCE,
                        r#"instance="u", model="mlp", baseline="logged", k="10", bound="upper""#,
                        "0.01x30 -0.02x90",
                    ),
                    input("", name::JUDGED_NDCG_DIFFERENCE, r#"instance="u", model="mlp", baseline="naive_ctr", k="10", bound="upper""#, "0.05x120"),
                    input("", name::JUDGED_NDCG_DIFFERENCE, r#"instance="u", model="mlp", baseline="naive_ctr", k="1", bound="upper""#, "-0.1x120"),
                ],
                checks: vec![
                    ("30m", None),
                    ("85m", None),
                    (
                        "95m",
                        Some(Fired {
                            labels: &[("instance", "u"), ("model", "mlp"), ("baseline", "logged")],
                            summary: "the current mlp model ranks below the logged order on the editors' labels (nDCG@10 difference, 95% upper bound -0.020)",
                        }),
                    ),
                ],
            }],
            fresh_start: None,
            holds: judged_ranking_below_baseline,
        },
        AlertRule {
            name: "ModelMissing",
            expr: format!("(time() - {} > {} * 3600) unless on (instance) {}", name::START_TIMESTAMP_SECONDS, threshold::MODEL_MISSING_HOURS, name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS),
            for_: "10m",
            severity: Severity::Warning,
            summary: r#"no model has been promoted in the {{ $value | humanizeDuration }} this instance has run"#,
            runbook: r#"The models directory has no current model (`ultr models --dir DIR` lists its checkpoints), a day after start. Either no training ran (no `[train] schedule` and no external CronJob) or every one failed or was rejected: see `ultr_trainings_total` by result and the log's training lines. A first model needs clicks and, with IPS, propensities; `ultr train` by hand prints the reason."#.into(),
            scenarios: Vec::new(),
            fresh_start: Some(Fired { labels: &[("instance", "fresh")], summary: "no model has been promoted in the 1d 3h 0m 0s this instance has run" }),
            holds: model_missing,
        },
        AlertRule {
            name: "TrainingStale",
            expr: format!("time() - {} > {} * 3600", name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS, threshold::TRAINING_STALE_HOURS),
            for_: "10m",
            severity: Severity::Warning,
            summary: r#"the current model was trained {{ $value | humanizeDuration }} ago"#,
            runbook: r#"No model was promoted for over a day (read from the models directory, so restarts and external schedulers count; with no model at all, ModelMissing speaks instead). See `ultr_trainings_total` by result and the service or CronJob log; run `ultr train` by hand to see the error (no clicks, missing propensities, no new windows) or whether the gate keeps rejecting candidates."#.into(),
            scenarios: vec![Scenario {
                series: vec![input(
                    "The current model was trained at t = 0 (timestamp 0 s), then none was promoted.",
                    name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS,
                    r#"instance="u""#,
                    "0x1800",
                )],
                checks: vec![("25h", None), ("28h", Some(Fired { labels: &[("instance", "u")], summary: "the current model was trained 1d 4h 0m 0s ago" }))],
            }],
            fresh_start: None,
            holds: training_stale,
        },
        AlertRule {
            name: "IngestErrorsHigh",
            expr: format!("sum by (instance) (rate({bad}[{m}m]))\n  / clamp_min(sum by (instance) (rate({all}[{m}m])), 1e-9) > {}", threshold::INGEST_ERROR_RATE, bad = name::BAD_RECORDS_TOTAL, all = name::RECORDS_TOTAL, m = threshold::INGEST_ERROR_RATE_SPAN_MINUTES),
            for_: "10m",
            severity: Severity::Warning,
            summary: r#"{{ $value | humanizePercentage }} of records are dead-lettered"#,
            runbook: r#"Read the dead-letter output (reason and original bytes per record); `ultr_bad_records_total` by reason says which producer contract is broken. Fix the producer; the pipeline keeps valid records."#.into(),
            scenarios: vec![Scenario {
                series: vec![input("", name::RECORDS_TOTAL, r#"instance="u""#, "0+1000x60"), input("", name::BAD_RECORDS_TOTAL, r#"instance="u", reason="bad_json""#, "0+1x30 30+100x30")],
                checks: vec![("30m", None), ("55m", Some(Fired { labels: &[("instance", "u")], summary: "10% of records are dead-lettered" }))],
            }],
            fresh_start: None,
            holds: ingest_errors_high,
        },
        AlertRule {
            name: "ConsumerLagHigh",
            expr: format!("max by (instance, topic) ({}) > {}", name::KAFKA_CONSUMER_LAG_MESSAGES, threshold::CONSUMER_LAG_MESSAGES),
            for_: "15m",
            severity: Severity::Warning,
            summary: r#"consumer is {{ $value }} messages behind on {{ $labels.topic }}"#,
            runbook: r#"Check `ultr_window_close_seconds` and CPU; a long training on the same host can starve ingest. Add instances with `[state.object_store]` (docs/scale-out.md: one consumer group, the topic keyed by query_id, at most one instance per partition does work), add partitions, or move scheduled training to an external CronJob."#.into(),
            scenarios: vec![Scenario {
                series: vec![
                    input("", name::KAFKA_CONSUMER_LAG_MESSAGES, r#"instance="u", topic="sessions", partition="0""#, "10x20 500000x40"),
                    input("", name::KAFKA_CONSUMER_LAG_MESSAGES, r#"instance="u", topic="sessions", partition="1""#, "10x60"),
                ],
                checks: vec![
                    ("25m", None),
                    ("50m", Some(Fired { labels: &[("instance", "u"), ("topic", "sessions")], summary: "consumer is 500000 messages behind on sessions" })),
                ],
            }],
            fresh_start: None,
            holds: consumer_lag_high,
        },
        AlertRule {
            name: "KafkaSourceDown",
            expr: format!("min by (instance) ({}) == {}", name::SOURCE_UP, threshold::SOURCE_DOWN),
            for_: "5m",
            severity: Severity::Critical,
            summary: r#"ultr cannot reach its Kafka brokers"#,
            runbook: r#"The service stays up and retries; nothing is lost (reading resumes at the state's offsets). `ultr_kafka_errors_total` by kind says why (all_brokers_down, transport, authentication, tls); `/healthz` lists the problem. Check the brokers, the network and the credentials."#.into(),
            scenarios: vec![Scenario {
                series: vec![input("", name::SOURCE_UP, r#"instance="u""#, "1x10 0x20 1x10")],
                checks: vec![
                    ("13m", None),
                    ("20m", Some(Fired { labels: &[("instance", "u")], summary: "ultr cannot reach its Kafka brokers" })),
                    ("38m", None),
                ],
            }],
            fresh_start: None,
            holds: kafka_source_down,
        },
        AlertRule {
            name: "MonitorFailing",
            expr: format!("(time() - {}) > {m} * 60 and on (instance) increase({}[{m}m]) > 0", name::MONITOR_LAST_SUCCESS_TIMESTAMP_SECONDS, name::MONITOR_ERRORS_TOTAL, m = threshold::MONITOR_FAILING_MINUTES),
            for_: "5m",
            severity: Severity::Warning,
            summary: r#"the monitor has not completed a pass for {{ $value | humanizeDuration }}"#,
            runbook: r#"Identifiability and residual metrics are stale. Read the service log ("monitor: ..."): an unreadable state file or an incompatible current model are the usual causes."#.into(),
            scenarios: vec![Scenario {
                series: vec![
                    input("The last successful pass at t = 600 s, failures from then on.", name::MONITOR_LAST_SUCCESS_TIMESTAMP_SECONDS, r#"instance="u""#, "0x10 600x50"),
                    input("", name::MONITOR_ERRORS_TOTAL, r#"instance="u""#, "0x10 0+1x50"),
                    input("", name::MONITOR_LAST_ERROR_TIMESTAMP_SECONDS, r#"instance="u""#, "0x10 600+60x50"),
                ],
                checks: vec![("35m", None), ("50m", Some(Fired { labels: &[("instance", "u")], summary: "the monitor has not completed a pass for 40m 0s" }))],
            }],
            fresh_start: None,
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

/// The shared fresh-start scenario's series: an instance with no model, no closed window and a
/// simulator source (no `ultr_source_up`), records flowing, nothing dead-lettered (only what a running
/// process knows is exported), beside an instance that trains every minute.
pub fn fresh_start_inputs() -> Vec<Input> {
    vec![
        input("A fresh start: only what a running process knows is exported.", name::START_TIMESTAMP_SECONDS, r#"instance="fresh""#, "0x1700"),
        input("", name::RECORDS_TOTAL, r#"instance="fresh""#, "0+100x1700"),
        input("", name::BAD_RECORDS_TOTAL, r#"instance="fresh", reason="invalid_json""#, "0x1700"),
        input("", name::MONITOR_LAST_SUCCESS_TIMESTAMP_SECONDS, r#"instance="fresh""#, "0x1700"),
        input("", name::MONITOR_ERRORS_TOTAL, r#"instance="fresh""#, "0x1700"),
        input("", name::LOGGED_PROPENSITY_DISAGREES, r#"instance="fresh""#, "0x1700"),
        input(
            "Another instance that trains every minute: never ModelMissing, never TrainingStale.",
            name::START_TIMESTAMP_SECONDS,
            r#"instance="trained""#,
            "0x1700",
        ),
        input("", name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS, r#"instance="trained""#, "0+60x1700"),
    ]
}

/// When the fresh-start scenario is checked: every rule silent at the first, `fresh_start` at the second.
pub const FRESH_START_CHECKS: [&str; 2] = ["26h", "27h"];

const TEST_HEADER: &str = "\
# promtool unit tests of pipelines/alerts.yml, generated by `ultr alert-rules --tests >
# pipelines/alerts.test.yml` from the signals catalog's scenarios (src/monitor/signals.rs): edit the
# catalog, not this file. Each alert fires on its condition and not before; on a fresh start nothing
# fires but ModelMissing, a day in. Run: `promtool test rules pipelines/alerts.test.yml`.
";

/// A string in YAML's double quotes.
fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// One `tests:` entry: the inputs, then each (time, rule, expectation).
fn test_case(series: &[Input], checks: &[(&str, &AlertRule, Option<&Fired>)]) -> String {
    let mut out = String::from("  - interval: 1m\n    input_series:\n");
    for i in series {
        if !i.comment.is_empty() {
            out.push_str(&format!("      # {}\n", i.comment));
        }
        out.push_str(&format!("      - series: '{}'\n        values: '{}'\n", i.series, i.values));
    }
    out.push_str("    alert_rule_test:\n");
    for (at, rule, fired) in checks {
        out.push_str(&format!("      - eval_time: {at}\n        alertname: {}\n", rule.name));
        match fired {
            None => out.push_str("        exp_alerts: []\n"),
            Some(f) => {
                let labels: Vec<String> =
                    std::iter::once(format!("severity: {}", rule.severity.as_str())).chain(f.labels.iter().map(|(k, v)| format!("{k}: {v}"))).collect();
                out.push_str(&format!("        exp_alerts:\n          - exp_labels: {{ {} }}\n", labels.join(", ")));
                out.push_str(&format!(
                    "            exp_annotations:\n              summary: {}\n              runbook: {}\n",
                    quoted(f.summary),
                    quoted(&rule.runbook)
                ));
            }
        }
    }
    out
}

/// `pipelines/alerts.test.yml`: every rule's scenarios, then the fresh start checked against every
/// rule, as promtool's unit-test file.
pub fn alerts_test_yaml() -> String {
    let mut cases = Vec::new();
    for rule in alert_rules() {
        for s in &rule.scenarios {
            let checks: Vec<_> = s.checks.iter().map(|(at, f)| (*at, rule, f.as_ref())).collect();
            cases.push(test_case(&s.series, &checks));
        }
    }
    let [quiet, later] = FRESH_START_CHECKS;
    let checks: Vec<_> = alert_rules().iter().map(|r| (quiet, r, None)).chain(alert_rules().iter().map(|r| (later, r, r.fresh_start.as_ref()))).collect();
    cases.push(test_case(&fresh_start_inputs(), &checks));
    format!("{TEST_HEADER}rule_files:\n  - alerts.yml\nevaluation_interval: 1m\ntests:\n{}", cases.join("\n"))
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
