//! Every Prometheus metric `ultr` exports, in one registry with the `ultr_` prefix. Convention:
//! counters end in `_total`, durations are `_seconds`, timestamps `_timestamp_seconds`; labels are
//! bounded (reason, graph, position ≤ `MAX_POSITION_LABELS`, topic/partition, result) — never query or
//! document ids.

use std::collections::BTreeMap;

use prometheus::{Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use super::exposition::{Sample, Series};

/// Every metric's name: the one place a name is written. The alert rules (`super::signals`), the
/// status page and the tests read them from here.
pub mod name {
    pub const RECORDS_TOTAL: &str = "ultr_records_total";
    pub const SESSIONS_TOTAL: &str = "ultr_sessions_total";
    pub const IMPRESSIONS_TOTAL: &str = "ultr_impressions_total";
    pub const BAD_RECORDS_TOTAL: &str = "ultr_bad_records_total";
    pub const LATE_SESSIONS_TOTAL: &str = "ultr_late_sessions_total";
    pub const DUPLICATE_SESSIONS_TOTAL: &str = "ultr_duplicate_sessions_total";
    pub const DROPPED_ITEMS_TOTAL: &str = "ultr_dropped_items_total";
    pub const KAFKA_CONSUMER_LAG_MESSAGES: &str = "ultr_kafka_consumer_lag_messages";
    pub const WINDOWS_CLOSED_TOTAL: &str = "ultr_windows_closed_total";
    pub const WINDOW_CLOSE_SECONDS: &str = "ultr_window_close_seconds";
    pub const WATERMARK_TIMESTAMP_SECONDS: &str = "ultr_watermark_timestamp_seconds";
    pub const START_TIMESTAMP_SECONDS: &str = "ultr_start_timestamp_seconds";
    pub const KAFKA_ERRORS_TOTAL: &str = "ultr_kafka_errors_total";
    pub const SOURCE_UP: &str = "ultr_source_up";
    pub const LAST_CHECKPOINT_TIMESTAMP_SECONDS: &str = "ultr_last_checkpoint_timestamp_seconds";
    pub const DEAD_LETTER_FAILURES_TOTAL: &str = "ultr_dead_letter_failures_total";
    pub const MONITOR_LAST_SUCCESS_TIMESTAMP_SECONDS: &str = "ultr_monitor_last_success_timestamp_seconds";
    pub const MONITOR_ERRORS_TOTAL: &str = "ultr_monitor_errors_total";
    pub const MONITOR_LAST_ERROR_TIMESTAMP_SECONDS: &str = "ultr_monitor_last_error_timestamp_seconds";
    pub const GRAPH_COMPONENTS: &str = "ultr_graph_components";
    pub const POSITIONS_DISCONNECTED: &str = "ultr_positions_disconnected";
    pub const OVERLAP_BOTTLENECK: &str = "ultr_overlap_bottleneck";
    pub const IDENTIFIED: &str = "ultr_identified";
    pub const PROPENSITY_MIN: &str = "ultr_propensity_min";
    pub const LOGGED_PROPENSITY_DISPERSION: &str = "ultr_logged_propensity_dispersion";
    pub const LOGGED_PROPENSITY_DISAGREES: &str = "ultr_logged_propensity_disagrees";
    pub const IPS_WEIGHT_MAX: &str = "ultr_ips_weight_max";
    pub const IPS_CLIPPED_FRACTION: &str = "ultr_ips_clipped_fraction";
    pub const IPS_EFFECTIVE_SAMPLE_FRACTION: &str = "ultr_ips_effective_sample_fraction";
    pub const WEAKLY_IDENTIFIED: &str = "ultr_weakly_identified";
    pub const RANDOMIZATION_SESSIONS_NEEDED: &str = "ultr_randomization_sessions_needed";
    pub const RANDOMIZATION_ETA_SECONDS: &str = "ultr_randomization_eta_seconds";
    pub const THETA_INTERVAL_WIDTH: &str = "ultr_theta_interval_width";
    pub const THETA: &str = "ultr_theta";
    pub const THETA_ESTIMABLE: &str = "ultr_theta_estimable";
    pub const TRAINING_DURATION_SECONDS: &str = "ultr_training_duration_seconds";
    pub const TRAINING_IN_PROGRESS: &str = "ultr_training_in_progress";
    pub const TRAINING_LOSS: &str = "ultr_training_loss";
    pub const LAST_TRAINING_SUCCESS_TIMESTAMP_SECONDS: &str = "ultr_last_training_success_timestamp_seconds";
    pub const TRAINING_CONVERGED: &str = "ultr_training_converged";
    pub const CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS: &str = "ultr_current_model_created_timestamp_seconds";
    pub const LAST_PROMOTION_TIMESTAMP_SECONDS: &str = "ultr_last_promotion_timestamp_seconds";
    pub const GATE_JUDGED_MINUS_LOGGED_NDCG10: &str = "ultr_gate_judged_minus_logged_ndcg10";
    pub const GATE_REFUSED_BELOW_LOGGED_ORDER_TOTAL: &str = "ultr_gate_refused_below_logged_order_total";
    pub const TRAININGS_TOTAL: &str = "ultr_trainings_total";
    pub const RESIDUAL_MEAN: &str = "ultr_residual_mean";
    pub const RESIDUAL_PROPENSITY_CORRELATION: &str = "ultr_residual_propensity_correlation";
    pub const RESIDUAL_PSI: &str = "ultr_residual_psi";
    pub const RESIDUAL_PAGE_HINKLEY: &str = "ultr_residual_page_hinkley";
    pub const RESIDUAL_WINDOWS_TOTAL: &str = "ultr_residual_windows_total";
    pub const MISSPECIFICATION_Z: &str = "ultr_misspecification_z";
    pub const MISSPECIFICATION_ASSESSABLE: &str = "ultr_misspecification_assessable";
    pub const POLICY_VARIATION: &str = "ultr_policy_variation";
    pub const WINDOWS_OPEN: &str = "ultr_windows_open";
    pub const THETA_INTERVAL: &str = "ultr_theta_interval";
    pub const SWAP_PAIRS: &str = "ultr_swap_pairs";
    pub const JUDGED_NDCG: &str = "ultr_judged_ndcg";
    pub const JUDGED_NDCG_DIFFERENCE: &str = "ultr_judged_ndcg_difference";
    pub const JUDGED_QUERIES: &str = "ultr_judged_queries";
}

/// Positions beyond this get no per-position series.
pub const MAX_POSITION_LABELS: usize = 50;

/// A gauge that is absent until its value is known, and absent again when it stops being known:
/// a rule must never read "not known yet" as a number that means something else (a model created
/// at 0 is 56 years old; a bottleneck of 0 is a cut graph). An unlabelled `GaugeVec` underneath.
#[derive(Clone)]
pub struct OptionalGauge(GaugeVec);

impl OptionalGauge {
    fn new(name: &str, help: &str) -> OptionalGauge {
        OptionalGauge(GaugeVec::new(Opts::new(name, help), &[]).expect("valid metric"))
    }

    pub fn set(&self, value: f64) {
        self.0.with_label_values::<&str>(&[]).set(value);
    }

    /// Sets the value when known, removes the series when not.
    pub fn set_known(&self, value: Option<f64>) {
        match value {
            Some(v) => self.set(v),
            None => self.clear(),
        }
    }

    pub fn clear(&self) {
        self.0.reset();
    }

    /// The value, when one is set.
    pub fn get(&self) -> Option<f64> {
        use prometheus::core::Collector;
        self.0.collect().first().and_then(|family| family.get_metric().first().map(|m| m.get_gauge().get_value()))
    }
}

pub struct Metrics {
    pub registry: Registry,
    // ingest
    pub records: IntCounter,
    pub sessions: IntCounter,
    pub impressions: IntCounter,
    pub bad_records: IntCounterVec,
    pub late_sessions: IntCounter,
    pub duplicate_sessions: IntCounter,
    pub dropped_items: IntCounterVec,
    pub consumer_lag: IntGaugeVec,
    pub windows_closed: IntCounter,
    pub window_close_seconds: Histogram,
    pub watermark: Gauge,
    pub up_since: Gauge,
    pub kafka_errors: IntCounterVec,
    /// Absent for sources without a connection (a file, the simulator) and until the source was opened.
    pub source_up: OptionalGauge,
    pub last_checkpoint: Gauge,
    pub dead_letter_failures: IntCounter,
    pub monitor_last_success: Gauge,
    pub monitor_errors: IntCounter,
    pub monitor_last_error: Gauge,
    // identifiability
    pub graph_components: IntGaugeVec,
    pub positions_disconnected: IntGaugeVec,
    /// Absent until a window closed, and while the bottleneck is undefined (no overlap graph).
    pub overlap_bottleneck: OptionalGauge,
    pub identified: IntGaugeVec,
    pub weakly_identified: IntGaugeVec,
    pub theta_interval_width: GaugeVec,
    pub randomization_sessions_needed: GaugeVec,
    /// Absent while the horizon spans no event time (no rate to divide by).
    pub randomization_eta_seconds: GaugeVec,
    // propensities / IPS
    pub propensity_min: Gauge,
    pub logged_propensity_dispersion: Gauge,
    pub logged_propensity_disagrees: IntGauge,
    pub ips_weight_max: Gauge,
    pub ips_clipped_fraction: Gauge,
    pub ips_effective_sample_fraction: Gauge,
    // model
    pub theta: GaugeVec,
    pub theta_estimable: GaugeVec,
    pub training_seconds: Gauge,
    pub training_in_progress: IntGauge,
    pub training_loss: GaugeVec,
    pub last_training_success: Gauge,
    /// 1 when the last training converged, 0 when it ran out of epochs with its validation loss
    /// still falling (or diverged); absent before the first training.
    pub training_converged: OptionalGauge,
    /// Absent while there is no current model (the `ModelMissing` rule reads that absence).
    pub current_model_created: OptionalGauge,
    pub last_promotion: Gauge,
    pub trainings: IntCounterVec,
    /// With `[eval] qrels`: the last candidate's shipped nDCG@10 less the logged order's.
    pub judged_minus_logged: OptionalGauge,
    /// Candidates the gate refused for ranking below the team's own order, by how it was seen.
    pub refused_below_logged_order: IntCounterVec,
    // residuals
    pub residual_mean: GaugeVec,
    pub residual_propensity_correlation: Gauge,
    pub residual_psi: Gauge,
    pub residual_page_hinkley: Gauge,
    pub residual_windows: IntCounter,
    pub misspecification_z: GaugeVec,
    pub misspecification_assessable: IntGaugeVec,
    pub policy_variation: Gauge,
    // status page
    pub windows_open: IntGauge,
    pub theta_interval: GaugeVec,
    pub swap_pairs: IntGaugeVec,
    // judged evaluation (`[eval] qrels`); absent without labels
    pub judged_ndcg: GaugeVec,
    pub judged_ndcg_difference: GaugeVec,
    pub judged_queries: GaugeVec,
    /// The facts the status page shows beside these series (text: reasons, ids, graph components).
    pub board: super::board::Board,
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone())).expect("metric names are unique");
    c
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let counter = |name: &str, help: &str| reg(&r, IntCounter::with_opts(Opts::new(name, help)).expect("valid metric"));
        let gauge = |name: &str, help: &str| reg(&r, Gauge::with_opts(Opts::new(name, help)).expect("valid metric"));
        let optional = |name: &str, help: &str| {
            let g = OptionalGauge::new(name, help);
            reg(&r, g.0.clone());
            g
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| reg(&r, GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"));
        Metrics {
            records: counter(name::RECORDS_TOTAL, "Source records read (valid or not)."),
            sessions: counter(name::SESSIONS_TOTAL, "Sessions accepted into windows."),
            impressions: counter(name::IMPRESSIONS_TOTAL, "Impressions accepted into windows."),
            bad_records: reg(&r, IntCounterVec::new(Opts::new(name::BAD_RECORDS_TOTAL, "Records refused and dead-lettered, by reason."), &["reason"]).expect("valid")),
            late_sessions: counter(name::LATE_SESSIONS_TOTAL, "Sessions behind the watermark (side output)."),
            duplicate_sessions: counter(name::DUPLICATE_SESSIONS_TOTAL, "Sessions whose id was already counted."),
            dropped_items: reg(&r, IntCounterVec::new(Opts::new(name::DROPPED_ITEMS_TOTAL, "Items dropped from accepted sessions, by reason (duplicate_doc_id: a repeat of an earlier item's doc_id)."), &["reason"]).expect("valid")),
            consumer_lag: reg(&r, IntGaugeVec::new(Opts::new(name::KAFKA_CONSUMER_LAG_MESSAGES, "High watermark minus next offset, per partition."), &["topic", "partition"]).expect("valid")),
            windows_closed: counter(name::WINDOWS_CLOSED_TOTAL, "Event-time windows closed and persisted."),
            window_close_seconds: reg(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(name::WINDOW_CLOSE_SECONDS, "Time to compute and persist a closed window's statistics.")
                        .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
                )
                .expect("valid"),
            ),
            watermark: gauge(name::WATERMARK_TIMESTAMP_SECONDS, "Event-time watermark."),
            up_since: gauge(name::START_TIMESTAMP_SECONDS, "When this process started."),
            kafka_errors: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(name::KAFKA_ERRORS_TOTAL, "Transient Kafka errors, retried: all_brokers_down, transport, resolve, authentication, tls, rebalance, timeout, other."),
                    &["kind"],
                )
                .expect("valid"),
            ),
            source_up: optional(name::SOURCE_UP, "1 while the Kafka source is reachable, 0 while it is not (absent for a file or the simulator, which have no connection)."),
            last_checkpoint: gauge(name::LAST_CHECKPOINT_TIMESTAMP_SECONDS, "When the state was last made durable."),
            dead_letter_failures: counter(name::DEAD_LETTER_FAILURES_TOTAL, "Dead letters the dead-letter sink could not deliver."),
            monitor_last_success: gauge(name::MONITOR_LAST_SUCCESS_TIMESTAMP_SECONDS, "When the monitor (identifiability, residuals) last finished without error."),
            monitor_errors: counter(name::MONITOR_ERRORS_TOTAL, "Monitor passes that failed."),
            monitor_last_error: gauge(name::MONITOR_LAST_ERROR_TIMESTAMP_SECONDS, "When a monitor pass last failed (0: never)."),
            graph_components: reg(
                &r,
                IntGaugeVec::new(Opts::new(name::GRAPH_COMPONENTS, "Connected components of the position graph (swap, overlap, or their union); a diagnostic, alerts use `identified`."), &["graph"]).expect("valid"),
            ),
            positions_disconnected: reg(
                &r,
                IntGaugeVec::new(Opts::new(name::POSITIONS_DISCONNECTED, "Positions (nodes) with no path to position 1."), &["graph"]).expect("valid"),
            ),
            overlap_bottleneck: optional(
                name::OVERLAP_BOTTLENECK,
                "Weakest link of the best spanning tree of positions, swaps scoring 1 and adjacent positions their cross-fitted feature overlap 1 − |2·AUC − 1| (absent until a window closed, and when undefined).",
            ),
            identified: reg(
                &r,
                IntGaugeVec::new(Opts::new(name::IDENTIFIED, "1 when the lookback horizon identifies θ of the configured model (its tower), 0 when not."), &["model"]).expect("valid"),
            ),
            propensity_min: gauge(name::PROPENSITY_MIN, "Smallest IPS π(d,k|q) over the lookback horizon (as `train.ips` chooses it)."),
            logged_propensity_dispersion: gauge(
                name::LOGGED_PROPENSITY_DISPERSION,
                "Largest, over policies that log propensities, Pearson dispersion of (q, d, k) display counts around the logged π over the lookback horizon (≈ 1 when the log is right).",
            ),
            logged_propensity_disagrees: reg(
                &r,
                IntGauge::with_opts(Opts::new(
                    name::LOGGED_PROPENSITY_DISAGREES,
                    "Policies whose logged propensities disagree with their counted π (dispersion above identifiability.max_logged_propensity_dispersion).",
                ))
                .expect("valid"),
            ),
            ips_weight_max: gauge(name::IPS_WEIGHT_MAX, "Largest IPS weight used by the last training (after clipping)."),
            ips_clipped_fraction: gauge(name::IPS_CLIPPED_FRACTION, "Share of training rows whose IPS weight was clipped."),
            ips_effective_sample_fraction: gauge(name::IPS_EFFECTIVE_SAMPLE_FRACTION, "Kish effective sample size of the IPS weights over the rows."),
            weakly_identified: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(name::WEAKLY_IDENTIFIED, "1 when the swap graph connects every position yet some θ_k − θ_1's 95% interval from the swap pairs' information is wider than identifiability.max_theta_interval (per-document towers), else 0."),
                    &["model"],
                )
                .expect("valid"),
            ),
            randomization_sessions_needed: gauge_vec(
                name::RANDOMIZATION_SESSIONS_NEEDED,
                "Sessions (all traffic, [identifiability.randomization] fraction of them randomized with its design) until θ_k − θ_1's 95% interval is expected within ±epsilon (identify::plan); 0 when it already is, +Inf when the design cannot reach the position.",
                &["position"],
            ),
            randomization_eta_seconds: gauge_vec(
                name::RANDOMIZATION_ETA_SECONDS,
                "ultr_randomization_sessions_needed at the stream's session rate over the lookback horizon (event time), in seconds.",
                &["position"],
            ),
            theta_interval_width: gauge_vec(
                name::THETA_INTERVAL_WIDTH,
                "Width of θ_k − θ_1's 95% interval from the information of the (query, document) pairs shown at several positions over the lookback horizon (per-document model; +Inf where no informative swap path reaches position 1).",
                &["position"],
            ),
            theta: gauge_vec(name::THETA, "Current model's θ_k − θ_1 per position.", &["position"]),
            theta_estimable: gauge_vec(
                name::THETA_ESTIMABLE,
                "1 where the current model's θ_k was estimated from its data, 0 where it was not estimable (its swap pairs carry no click, or only clicks) and keeps the early-stopped value.",
                &["position"],
            ),
            training_seconds: gauge(name::TRAINING_DURATION_SECONDS, "Wall time of the last training."),
            training_in_progress: reg(&r, IntGauge::with_opts(Opts::new(name::TRAINING_IN_PROGRESS, "1 while a scheduled training runs.")).expect("valid")),
            training_loss: gauge_vec(name::TRAINING_LOSS, "Last training's loss of its best epoch.", &["split"]),
            last_training_success: gauge(name::LAST_TRAINING_SUCCESS_TIMESTAMP_SECONDS, "When a training run by this process's scheduler last finished without error."),
            training_converged: optional(
                name::TRAINING_CONVERGED,
                "1 when this process's last training converged; 0 when it stopped at max_epochs with its validation loss still falling (its θ is flattened toward 0), or diverged. Absent before the first training.",
            ),
            current_model_created: optional(
                name::CURRENT_MODEL_CREATED_TIMESTAMP_SECONDS,
                "When the current (promoted) model was trained, from the models directory: right after restarts and whoever trains (absent while there is no current model).",
            ),
            last_promotion: gauge(name::LAST_PROMOTION_TIMESTAMP_SECONDS, "When a checkpoint was last promoted."),
            judged_minus_logged: optional(
                name::GATE_JUDGED_MINUS_LOGGED_NDCG10,
                "With [eval] qrels: nDCG@10 on the editors' labels of the ranking the last candidate would ship, less the logged order's (paired over queries; the gate refuses a candidate whose 95% interval lies below 0).",
            ),
            refused_below_logged_order: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(name::GATE_REFUSED_BELOW_LOGGED_ORDER_TOTAL, "Candidates the gate refused for ranking below the logged (production) order: evidence=\"judged\" (editors' labels, [eval] qrels) or \"clicks\" (held-out clicks, the combination below the logged order alone)."),
                    &["evidence"],
                )
                .expect("valid"),
            ),
            trainings: reg(&r, IntCounterVec::new(Opts::new(name::TRAININGS_TOTAL, "Scheduled or triggered trainings by result: promoted, rejected, failed, skipped (nothing new to learn from), cancelled (by shutdown)."), &["result"]).expect("valid")),
            residual_mean: gauge_vec(name::RESIDUAL_MEAN, "Policy-weighted mean residual c − σ(θ_k + r(x)) of the last window, per position.", &["position"]),
            residual_propensity_correlation: gauge(
                name::RESIDUAL_PROPENSITY_CORRELATION,
                "RMS over positions of the within-position correlation of the last window's residuals with π(d,k|q) (≈ 1/√rows per position for a well-specified model).",
            ),
            residual_psi: gauge(name::RESIDUAL_PSI, "Population stability index of the residual distribution against the reference window."),
            residual_page_hinkley: gauge(name::RESIDUAL_PAGE_HINKLEY, "Page-Hinkley statistic of the per-window mean absolute residual."),
            residual_windows: counter(name::RESIDUAL_WINDOWS_TOTAL, "Windows scored against the current model."),
            misspecification_z: gauge_vec(
                name::MISSPECIFICATION_Z,
                "Score test of the last window's held-out residuals against π(d,k|q), per position beyond the model's own logit, cluster-robust by (query, document): the χ²_K statistic as a standard normal deviate (N(0,1) for a well-specified model at any traffic; NaN when not assessable).",
                &["model"],
            ),
            misspecification_assessable: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(name::MISSPECIFICATION_ASSESSABLE, "1 when the data can show misspecification through the policy (π varies within positions), 0 when it cannot (deterministic policy, no randomised traffic)."),
                    &["model"],
                )
                .expect("valid"),
            ),
            policy_variation: gauge(name::POLICY_VARIATION, "Impression-weighted within-position standard deviation of π(d,k|q) over the lookback horizon (0 for a deterministic policy)."),
            windows_open: reg(&r, IntGauge::with_opts(Opts::new(name::WINDOWS_OPEN, "Event-time windows open (not yet closed) at the last checkpoint.")).expect("valid")),
            theta_interval: gauge_vec(
                name::THETA_INTERVAL,
                "Current model's bootstrap interval of θ_k − θ_1 (bound = lower or upper), when it was trained with `[train.uncertainty] enabled`.",
                &["position", "bound"],
            ),
            swap_pairs: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(name::SWAP_PAIRS, "(query, document) pairs shown at both positions over the lookback horizon: the swap graph's edge weights (positions ≤ 50)."),
                    &["position_a", "position_b"],
                )
                .expect("valid"),
            ),
            judged_ndcg: gauge_vec(
                name::JUDGED_NDCG,
                "Mean nDCG@k against the editors' labels (`[eval] qrels`) over the judged queries of the lookback horizon, per ranker: the current model, the logged order (each document's mean shown position) and naive click-through.",
                &["model", "ranker", "k"],
            ),
            judged_ndcg_difference: gauge_vec(
                name::JUDGED_NDCG_DIFFERENCE,
                "Paired difference in nDCG@k, current model − baseline (logged or naive_ctr), over the judged queries: its estimate and the bounds of its 95% bootstrap interval over queries (bound = estimate, lower, upper).",
                &["model", "baseline", "k", "bound"],
            ),
            judged_queries: gauge_vec(name::JUDGED_QUERIES, "Queries the judged evaluation scored: judged with at least two grades, and seen in the lookback horizon.", &["model"]),
            board: Default::default(),
            registry: r,
        }
    }

    /// Every exported series as typed values, read from the registry's metric families: what
    /// `render` writes as text (a histogram as its `_bucket`, `_sum` and `_count` series), for the
    /// status page and the alert conditions to judge without parsing text back.
    pub fn series(&self) -> Series {
        use prometheus::proto::MetricType;
        let mut out = Vec::new();
        for family in self.registry.gather() {
            let name = family.name();
            for m in family.get_metric() {
                let labels: BTreeMap<String, String> = m.get_label().iter().map(|l| (l.name().to_string(), l.value().to_string())).collect();
                let mut push = |suffix: &str, extra: Option<(&str, String)>, value: f64| {
                    let mut labels = labels.clone();
                    if let Some((k, v)) = extra {
                        labels.insert(k.to_string(), v);
                    }
                    out.push(Sample { name: format!("{name}{suffix}"), labels, value });
                };
                match family.get_field_type() {
                    MetricType::COUNTER => push("", None, m.get_counter().get_value()),
                    MetricType::GAUGE => push("", None, m.get_gauge().get_value()),
                    MetricType::HISTOGRAM => {
                        let h = m.get_histogram();
                        let mut infinite = false;
                        for b in h.get_bucket() {
                            let bound = b.upper_bound();
                            infinite |= bound == f64::INFINITY;
                            push(
                                "_bucket",
                                Some(("le", if bound == f64::INFINITY { "+Inf".to_string() } else { bound.to_string() })),
                                b.cumulative_count() as f64,
                            );
                        }
                        if !infinite {
                            push("_bucket", Some(("le", "+Inf".to_string())), h.get_sample_count() as f64);
                        }
                        push("_sum", None, h.get_sample_sum());
                        push("_count", None, h.get_sample_count() as f64);
                    }
                    // Not registered here (no summaries or untyped metrics): nothing to judge.
                    _ => {}
                }
            }
        }
        Series::new(out)
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out).expect("text encoding cannot fail");
        out
    }

    pub fn content_type() -> &'static str {
        prometheus::TEXT_FORMAT
    }

    /// Sets θ gauges for positions 1..=min(len, MAX_POSITION_LABELS).
    pub fn set_theta(&self, theta: &[f64]) {
        for (k, t) in theta.iter().enumerate().take(MAX_POSITION_LABELS) {
            self.theta.with_label_values(&[&(k + 1).to_string()]).set(*t);
        }
    }

    /// Sets `theta_estimable` for positions 1..=min(`positions`, MAX_POSITION_LABELS): 0 at the
    /// 1-based positions in `not_estimable`, 1 elsewhere.
    pub fn set_theta_estimable(&self, positions: usize, not_estimable: &[usize]) {
        self.theta_estimable.reset();
        for k in 1..=positions.min(MAX_POSITION_LABELS) {
            self.theta_estimable.with_label_values(&[&k.to_string()]).set(if not_estimable.contains(&k) { 0.0 } else { 1.0 });
        }
    }

    /// Sets the θ interval gauges from the current model, or removes them when it has none (a
    /// model without intervals must not show its predecessor's).
    pub fn set_theta_intervals(&self, bounds: Option<(&[f64], &[f64])>) {
        self.theta_interval.reset();
        if let Some((lower, upper)) = bounds {
            for (k, (lo, hi)) in lower.iter().zip(upper).enumerate().take(MAX_POSITION_LABELS) {
                let position = (k + 1).to_string();
                self.theta_interval.with_label_values(&[&position, "lower"]).set(*lo);
                self.theta_interval.with_label_values(&[&position, "upper"]).set(*hi);
            }
        }
    }

    /// Replaces the judged figures with `report`'s for the model labelled `model` (a model change
    /// must not leave its predecessor's series behind).
    pub fn set_judged(&self, model: &str, report: &ultr_train::eval::judged::JudgedReport) {
        use ultr_train::eval::judged::CUTOFFS;
        self.judged_ndcg.reset();
        self.judged_ndcg_difference.reset();
        self.judged_queries.reset();
        self.judged_queries.with_label_values(&[model]).set(report.queries as f64);
        if report.queries == 0 {
            return;
        }
        for r in &report.rankers {
            for (m, k) in CUTOFFS.iter().enumerate() {
                let k = k.to_string();
                self.judged_ndcg.with_label_values(&[model, &r.ranker, &k]).set(r.mean[m].estimate);
                if r.ranker != "model" {
                    continue;
                }
                for (baseline, d) in [("logged", &r.minus_logged[m]), ("naive_ctr", &r.minus_naive_ctr[m])] {
                    for (bound, v) in [("estimate", d.estimate), ("lower", d.low), ("upper", d.high)] {
                        self.judged_ndcg_difference.with_label_values(&[model, baseline, &k, bound]).set(v);
                    }
                }
            }
        }
    }

    /// Replaces the swap-graph edge weights (edges that vanished from the horizon vanish here).
    pub fn set_swap_pairs(&self, pairs: &std::collections::BTreeMap<(u32, u32), i64>) {
        self.swap_pairs.reset();
        for (&(a, b), &n) in pairs.iter().filter(|((a, b), _)| (*a.max(b) as usize) <= MAX_POSITION_LABELS) {
            self.swap_pairs.with_label_values(&[&a.to_string(), &b.to_string()]).set(n);
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
