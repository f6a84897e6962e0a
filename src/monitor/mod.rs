//! Monitoring: after each checkpoint, bring the Prometheus metrics up to date — ingest counters,
//! identifiability of the lookback horizon, π and IPS diagnostics, and residuals of the current model
//! on each newly closed window (with drift against a reference window).

pub mod board;
pub mod drift;
pub mod exposition;
pub mod metrics;
pub mod residuals;
pub mod rules_time;
pub mod signals;

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::PipelineConfig;
use crate::pipeline::RunReport;
use drift::{psi, PageHinkley};
use metrics::Metrics;
use residuals::{summarize, ResidualSummary, BINS};
use ultr_core::state::Manifest;
use ultr_train::artefact::Trained;
use ultr_train::checkpoint::ModelStore;
use ultr_train::data::examples_for_windows;
use ultr_train::data::{split_of, Split};
use ultr_train::misspecification::{score_test, MisspecificationTest, Nuisance};

/// At most this many windows are scored in one checkpoint (the newest).
const MAX_WINDOWS_SCORED_AT_ONCE: usize = 8;

/// Scored windows kept for inspection.
const HISTORY: usize = 64;

/// One window scored under the current model.
#[derive(Debug, Clone)]
pub struct ScoredWindow {
    pub end_ms: i64,
    pub residuals: ResidualSummary,
    pub misspecification: MisspecificationTest,
    /// Whether the whole window was held out (it ended after the model's training data), or only its
    /// evaluation slice was tested.
    pub whole_window: bool,
}

/// What the monitor remembers between checkpoints.
pub struct Monitor {
    /// What its queries run on.
    context: ultr_core::context::PipelineContext,
    pub metrics: Arc<Metrics>,
    config: PipelineConfig,
    models_dir: PathBuf,
    seen: RunReport,
    /// End of the newest window already scored.
    scored_until: i64,
    windows_seen: usize,
    model: Option<(String, Trained)>,
    /// End of the current model's training data (event time): later windows are held out whole.
    model_data_end_ms: i64,
    /// The residual histogram of the first window scored under the current model.
    reference: Option<[f64; BINS]>,
    page_hinkley: PageHinkley,
    /// The most recently scored windows, newest last.
    pub history: std::collections::VecDeque<ScoredWindow>,
    pub last_identified: Option<bool>,
    /// The verdicts last told in the log (a line is logged when one changes).
    told: Told,
    /// `[eval] qrels`, read by [`Monitor::judging`]: labels to score the current model against.
    qrels: Option<ultr_train::eval::judged::Qrels>,
    /// The lookback horizon's cumulative views, kept between looks: a look reads the windows that
    /// changed, not the whole horizon (`state::cumulative::Incremental`).
    cumulative: ultr_core::state::cumulative::Incremental,
}

/// What a randomization plan's log line says: the positions that need sessions, and the swaps that
/// connect the graph.
type PlanSummary = (Vec<u32>, Vec<(u32, u32)>);

/// What the log last said, so it speaks only when something changed.
#[derive(Default)]
struct Told {
    windows_until_ms: Option<i64>,
    misspecification_blind: Option<bool>,
    misspecification_high: Option<bool>,
    logged_propensity_disagrees: Option<i64>,
    weakly_identified: Option<bool>,
    plan: Option<PlanSummary>,
    /// The model judged and the baselines it ranked below.
    judged: Option<(String, String)>,
}

/// A short form of θ_k − θ_1 for a log line: "θk−θ1 = +0.00 -0.69 -1.10 …" (at most 10 positions).
pub fn theta_in_short(theta: &[f64]) -> String {
    let shown: Vec<String> = theta.iter().take(10).map(|t| format!("{t:+.2}")).collect();
    let more = if theta.len() > 10 { format!(" … ({} positions)", theta.len()) } else { String::new() };
    format!("θk−θ1 = {}{more}", shown.join(" "))
}

/// A window's event-time span for a log line, in UTC.
pub fn span_in_short(start_ms: i64, end_ms: i64) -> String {
    let at = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).map_or_else(|| ms.to_string(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string());
    format!("{} – {}", at(start_ms), at(end_ms))
}

impl Monitor {
    /// A monitor of the state in `state_dir`, whose queries run on `context` (the pipeline's).
    pub fn new(context: &ultr_core::context::PipelineContext, metrics: Arc<Metrics>, config: &PipelineConfig, state_dir: &Path) -> Monitor {
        metrics.up_since.set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
        let models_dir = ultr_train::models_dir(&config.train, state_dir);
        // TrainingStale reads this: restored from the models directory at start, not from this process.
        // (Only when the folder exists: opening the store would create it inside a state not made yet.)
        if models_dir.is_dir() {
            match ModelStore::open(&models_dir).and_then(|s| s.current_created_at()) {
                Ok(Some(at)) => metrics.current_model_created.set(at),
                Ok(None) => {}
                Err(e) => tracing::warn!("monitor: reading the current model's time: {e:#}"),
            }
        }
        Monitor {
            context: context.clone(),
            metrics,
            config: config.clone(),
            models_dir,
            seen: RunReport::default(),
            scored_until: i64::MIN,
            windows_seen: usize::MAX,
            model: None,
            model_data_end_ms: i64::MAX,
            reference: None,
            page_hinkley: PageHinkley::new(0.005),
            history: Default::default(),
            last_identified: None,
            told: Told::default(),
            qrels: None,
            cumulative: Default::default(),
        }
    }

    /// Scores the current model against `qrels` after each promotion and each closed window.
    pub fn judging(mut self, qrels: Option<ultr_train::eval::judged::Qrels>) -> Monitor {
        self.qrels = qrels;
        self
    }

    /// Counters: add what the run report gained since the last call. Cheap; the ingest thread
    /// calls it at every checkpoint.
    /// Records read and refused so far, on every turn of the loop (the rest waits for a
    /// checkpoint): `IngestErrorsHigh`'s two rates move with the stream, not in checkpoint steps.
    pub fn ingest_live(&mut self, report: &RunReport) {
        let m = &self.metrics;
        m.records.inc_by(report.records.saturating_sub(self.seen.records));
        self.seen.records = self.seen.records.max(report.records);
        for (reason, n) in &report.dead_letters {
            let before = self.seen.dead_letters.entry(reason.clone()).or_insert(0);
            m.bad_records.with_label_values(&[reason]).inc_by(n.saturating_sub(*before));
            *before = (*before).max(*n);
        }
    }

    pub fn ingest(&mut self, report: &RunReport) {
        let m = &self.metrics;
        let d = |now: u64, before: u64| now.saturating_sub(before);
        m.records.inc_by(d(report.records, self.seen.records));
        let (c, s) = (&report.counters, &self.seen.counters);
        m.sessions.inc_by(d(c.sessions, s.sessions));
        m.impressions.inc_by(d(c.impressions, s.impressions));
        m.late_sessions.inc_by(d(c.late_sessions, s.late_sessions));
        m.duplicate_sessions.inc_by(d(c.duplicate_sessions, s.duplicate_sessions));
        m.dropped_items.with_label_values(&["duplicate_doc_id"]).inc_by(d(c.repeated_items, s.repeated_items));
        m.windows_closed.inc_by(d(c.windows_closed, s.windows_closed));
        for (reason, n) in &report.dead_letters {
            let before = self.seen.dead_letters.get(reason).copied().unwrap_or(0);
            m.bad_records.with_label_values(&[reason]).inc_by(d(*n, before));
        }
        for seconds in &report.window_close_seconds {
            m.window_close_seconds.observe(*seconds);
        }
        for (topic, partition, lag) in &report.lag {
            m.consumer_lag.with_label_values(&[topic, &partition.to_string()]).set(*lag);
        }
        if report.watermark_ms > i64::MIN {
            m.watermark.set(report.watermark_ms as f64 / 1000.0);
        }
        m.dead_letter_failures.inc_by(d(report.dead_letter_failures, self.seen.dead_letter_failures));
        m.last_checkpoint.set(report.last_checkpoint_unix_ms as f64 / 1000.0);
        let bad_records = report.dead_letters.values().sum();
        m.board.push_sample(board::CounterSample {
            unix_s: chrono::Utc::now().timestamp_millis() as f64 / 1000.0,
            records: report.records,
            sessions: report.counters.sessions,
            bad_records,
        });
        self.seen = report.clone();
    }

    /// Reloads the current model when CURRENT moved; true when it did.
    fn refresh_model(&mut self) -> anyhow::Result<bool> {
        let store = ModelStore::open(&self.models_dir)?;
        let Some(id) = store.current_id()? else { return Ok(false) };
        if self.model.as_ref().is_some_and(|(m, _)| *m == id) {
            return Ok(false);
        }
        let trained = store.load(&id, &self.config.train.backend.device()?)?;
        trained.check_feature_schema(self.config.decode.feature_schema.as_ref()).with_context(|| format!("the current model {id} cannot score this stream"))?;
        self.metrics.set_theta(&trained.position_bias());
        if let Some(at) = store.current_created_at()? {
            self.metrics.current_model_created.set(at);
        }
        let info = store.info(&id)?;
        let not_estimable: Vec<usize> = serde_json::from_value(info.fit["position_refit"]["not_estimable"].clone()).unwrap_or_default();
        self.metrics.set_theta_estimable(trained.position_bias().len(), &not_estimable);
        let intervals = info.theta_intervals.as_ref();
        self.metrics.set_theta_intervals(intervals.map(|i| (i.lower.as_slice(), i.upper.as_slice())));
        self.metrics.board.update(|b| {
            b.current_model = Some(board::ModelCard {
                id: id.clone(),
                created_at: info.created_at.clone(),
                parent: info.parent.clone(),
                data_range_ms: info.data_range_ms,
                windows: 0,
                promoted_reason: info.decision.reason.clone(),
                intervals: intervals.map(|i| format!("{:.0}% {} ({} replicates)", i.level * 100.0, i.method, i.replicates)),
            })
        });
        tracing::info!(target: "ultr::story", "monitor: scoring new windows with model {id}");
        // Unknown range (a foreign checkpoint): treat every window as trained on.
        self.model_data_end_ms = info.data_range_ms.map_or(i64::MAX, |r| r.1);
        self.model = Some((id, trained));
        self.reference = None; // a new model gets a new reference window
        self.page_hinkley.reset();
        Ok(true)
    }

    /// The slow part (identifiability, residual scoring): runs on the monitor thread with the state
    /// directory and a copy of the manifest a checkpoint wrote. Outcomes go to
    /// `ultr_monitor_last_success_timestamp_seconds` / `ultr_monitor_errors_total` and
    /// `ultr_monitor_last_error_timestamp_seconds`.
    pub fn observe_recorded(&mut self, dir: &Path, manifest: &Manifest) -> anyhow::Result<()> {
        let result = self.analyse(dir, manifest);
        match &result {
            Ok(()) => self.metrics.monitor_last_success.set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0),
            Err(e) => {
                self.metrics.monitor_errors.inc();
                self.metrics.monitor_last_error.set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
                tracing::warn!("monitor: {e:#}");
            }
        }
        result
    }

    /// Counters plus analysis in one call (tests and single-threaded callers).
    pub fn observe(&mut self, dir: &Path, manifest: &Manifest, report: &RunReport) -> anyhow::Result<()> {
        self.ingest(report);
        self.observe_recorded(dir, manifest)
    }

    /// One log line per window closed since the last look.
    fn tell_closed_windows(&mut self, manifest: &Manifest) {
        let first_look = self.told.windows_until_ms.is_none();
        let until = self.told.windows_until_ms.unwrap_or(i64::MIN);
        let mut new: Vec<_> = manifest.windows.iter().filter(|w| w.end_ms > until).collect();
        new.sort_by_key(|w| w.end_ms);
        if first_look && new.len() > 3 {
            // A restart over a long state: one line for the state, not one per window.
            tracing::info!(target: "ultr::story", "state holds {} closed windows ({} sessions)", new.len(), new.iter().map(|w| w.sessions).sum::<u64>());
        } else {
            for w in &new {
                tracing::info!(target: "ultr::story", "window {} closed: {} sessions, {} impressions", span_in_short(w.start_ms, w.end_ms), w.sessions, w.impressions);
            }
        }
        if let Some(last) = new.last() {
            self.told.windows_until_ms = Some(last.end_ms);
        }
    }

    fn analyse(&mut self, dir: &Path, manifest: &Manifest) -> anyhow::Result<()> {
        self.metrics.windows_open.set(manifest.open_window_starts().len() as i64);
        self.tell_closed_windows(manifest);
        let latest = manifest.windows.iter().map(|w| w.end_ms).max().unwrap_or(i64::MIN);
        let model_changed = self.refresh_model()?;
        self.count_model_windows(manifest);
        if model_changed {
            self.scored_until = self.scored_until.min(latest.saturating_sub(1));
            // score the newest window under the new model
        }
        if !model_changed && manifest.windows.len() == self.windows_seen && latest <= self.scored_until {
            return Ok(());
        }
        self.windows_seen = manifest.windows.len();
        if manifest.windows.is_empty() {
            return Ok(());
        }
        let rt = self.context.runner_here()?;
        // Each step's time, in a debug line per look (`ULTR_LOG=ultr::monitor=debug`).
        let mut clock = std::time::Instant::now();
        let mut lap = || {
            let ms = clock.elapsed().as_secs_f64() * 1000.0;
            clock = std::time::Instant::now();
            ms
        };
        let cumulative = rt.run(self.cumulative.update(&self.context, dir, manifest, self.config.state.lookback_ms()))?;
        let views_ms = lap();
        let id = ultr_train::identifiability(&cumulative, &self.config.identifiability, &self.config.train)?;
        self.report_identifiability(&id, &cumulative);
        let identifiability_ms = lap();
        let ips_pi = rt.run(ultr_train::ips_propensity::ips_propensity(&self.context, cumulative.policy_propensity.clone(), &self.config.train.ips))?;
        if let Some(p) = propensity_min(&ips_pi) {
            self.metrics.propensity_min.set(p);
        }
        let ips_ms = lap();
        if self.model.is_none() {
            self.scored_until = latest;
            tracing::debug!(
                "look over {} windows: views {views_ms:.0} ms, identifiability {identifiability_ms:.0} ms, IPS π {ips_ms:.0} ms",
                cumulative.windows.len()
            );
            return Ok(());
        }
        self.score_new_windows(dir, manifest, &rt, &ips_pi)?;
        let scoring_ms = lap();
        let windows = cumulative.windows.len();
        let horizon = ultr_train::data::non_overlapping(cumulative.windows, manifest.window.size_ms);
        let judged = self.evaluate_judged(dir, &horizon, ips_pi, &rt);
        tracing::debug!(
            "look over {windows} windows: views {views_ms:.0} ms, identifiability {identifiability_ms:.0} ms, IPS π {ips_ms:.0} ms, scoring {scoring_ms:.0} ms, judged {:.0} ms",
            lap()
        );
        judged
    }

    /// The current model's card: how many closed windows its training data spans.
    fn count_model_windows(&self, manifest: &Manifest) {
        if let Some((start, end)) = self.metrics.board.snapshot().current_model.and_then(|c| c.data_range_ms) {
            let n = manifest.windows.iter().filter(|w| w.start_ms >= start && w.end_ms <= end).count();
            self.metrics.board.update(|b| {
                if let Some(c) = b.current_model.as_mut() {
                    c.windows = n;
                }
            });
        }
    }

    /// The randomization plan at this verdict (`identify::plan`, `[identifiability.randomization]`):
    /// per position the sessions and the time still needed as series, the plan on the board, and a
    /// log line when the positions that need randomizing or the connecting swaps change.
    fn report_plan(&mut self, cumulative: &ultr_core::state::cumulative::Cumulative) {
        let request = self.config.identifiability.plan_request(self.config.train.max_positions);
        let plan = match ultr_core::identify::plan::plan_cumulative(cumulative, &request) {
            Ok(plan) => plan,
            Err(why) => {
                tracing::debug!("no randomization plan: {why}");
                return;
            }
        };
        let m = &self.metrics;
        m.randomization_sessions_needed.reset();
        m.randomization_eta_seconds.reset();
        for p in plan.positions.iter().filter(|p| (p.position as usize) <= metrics::MAX_POSITION_LABELS) {
            let label = p.position.to_string();
            m.randomization_sessions_needed.with_label_values(&[&label]).set(p.sessions_needed.unwrap_or(f64::INFINITY));
            if plan.sessions_per_second.is_some() {
                m.randomization_eta_seconds.with_label_values(&[&label]).set(p.eta_seconds.unwrap_or(f64::INFINITY));
            }
        }
        let needing: Vec<u32> = plan.positions.iter().filter(|p| p.sessions_needed != Some(0.0)).map(|p| p.position).collect();
        let connecting: Vec<(u32, u32)> =
            plan.swaps.iter().filter(|s| s.reason == ultr_core::identify::plan::SwapReason::Connects).map(|s| (s.a, s.b)).collect();
        let summary = (needing, connecting);
        if self.told.plan.as_ref() != Some(&summary) {
            let r = &plan.request;
            let what = if summary.0.is_empty() {
                "every θ_k − θ_1 is within its target already: nothing to randomize".to_string()
            } else {
                let most = plan
                    .sessions_needed()
                    .map_or("some position is out of its reach".to_string(), |n| format!("{n:.0} sessions until every θ_k is within target"));
                let first: Vec<String> = plan.swaps.iter().take(4).map(|s| format!("{}<->{}", s.a, s.b)).collect();
                format!("{most}; swap first {}", first.join(", "))
            };
            tracing::info!(target: "ultr::story", "randomization plan: {} on {:.1}% of sessions: {what}", r.design, 100.0 * r.fraction);
            self.told.plan = Some(summary);
        }
        m.board.update(|b| b.plan = Some(plan));
    }

    /// The lookback horizon's verdicts as series, the status page's graph card, and a log line for
    /// each verdict that changed: identifiability, whether misspecification is assessable, and
    /// logged propensities that disagree with the counted π.
    fn report_identifiability(&mut self, id: &ultr_core::identify::IdentifiabilityReport, cumulative: &ultr_core::state::cumulative::Cumulative) {
        let m = &self.metrics;
        let graphs = [("swap", Some(&id.swap_graph)), ("overlap", id.overlap_graph.as_ref()), ("union", Some(&id.union_graph))];
        for (name, graph) in graphs {
            if let Some(g) = graph {
                m.graph_components.with_label_values(&[name]).set(g.components.len() as i64);
                m.positions_disconnected.with_label_values(&[name]).set(g.cut_off_from_position_1.len() as i64);
            }
        }
        m.overlap_bottleneck.set_known(id.overlap_bottleneck);
        m.identified.with_label_values(&[&id.model]).set(id.identified as i64);
        m.weakly_identified.with_label_values(&[&id.model]).set(id.weakly_identified as i64);
        m.theta_interval_width.reset();
        for k in 1..id.theta_precision.standard_error.len().min(metrics::MAX_POSITION_LABELS) {
            m.theta_interval_width.with_label_values(&[&(k + 1).to_string()]).set(id.theta_precision.interval_width(k));
        }
        self.report_plan(cumulative);
        let m = &self.metrics;
        m.set_swap_pairs(&ultr_core::identify::swap_pair_counts(&cumulative.swap_edges, self.config.train.max_positions as u32));
        let deciding = match id.identification {
            ultr_core::identify::Identification::SwapsOrFeatureOverlap => {
                ("union", &id.union_graph, "swaps or feature overlap between positions (feature tower)")
            }
            _ => ("swap", &id.swap_graph, "swaps of the same (query, document) between positions (per-document relevance)"),
        };
        m.board.update(|b| {
            b.graph = Some(board::GraphCard {
                model: id.model.clone(),
                decides: format!("{} graph: {}", deciding.0, deciding.2),
                components: deciding.1.components.iter().map(|c| c.iter().map(|n| n.position).collect()).collect(),
                advice: deciding.1.randomization_advice.iter().map(|(a, b)| (a.position, b.position)).collect(),
                misspecification_blind: id.misspecification_blind.clone(),
            })
        });
        if self.told.weakly_identified != Some(id.weakly_identified) && id.identified {
            if let Some((k, width)) = id.theta_precision.widest().filter(|_| id.weakly_identified) {
                tracing::info!(target: "ultr::story", "identifiability: WEAKLY IDENTIFIED for the {} model: θ{k}'s 95% interval from the swap pairs is {width:.2} wide (> max_theta_interval {})", id.model, self.config.identifiability.max_theta_interval);
            }
            self.told.weakly_identified = Some(id.weakly_identified);
        }
        if self.last_identified != Some(id.identified) {
            let advice: Vec<String> = deciding.1.randomization_advice.iter().map(|(a, b)| format!("{a}<->{b}")).collect();
            let detail = if id.identified {
                format!("the {} graph connects all {} positions", deciding.0, deciding.1.nodes)
            } else {
                format!("the {} graph has {} components; randomise {} to connect it", deciding.0, deciding.1.components.len(), advice.join(", "))
            };
            tracing::info!(target: "ultr::story", "identifiability: {} for the {} model over {} windows ({detail})", if id.identified { "IDENTIFIED" } else { "NOT IDENTIFIED" }, id.model, id.windows);
        }
        self.last_identified = Some(id.identified);
        if self.told.misspecification_blind != Some(id.misspecification_blind.is_some()) {
            match &id.misspecification_blind {
                Some(why) => tracing::info!(target: "ultr::story", "misspecification: cannot be assessed ({why})"),
                None => tracing::info!(target: "ultr::story", "misspecification: assessable (π varies within positions, sd {:.3})", id.policy_variation),
            }
            self.told.misspecification_blind = Some(id.misspecification_blind.is_some());
        }
        m.policy_variation.set(id.policy_variation);
        if id.misspecification_blind.is_some() {
            // Blind is not healthy: no z to compare with a threshold, and a series that says why.
            m.misspecification_assessable.with_label_values(&[&id.model]).set(0);
            m.misspecification_z.with_label_values(&[&id.model]).set(f64::NAN);
        }
        let judged: Vec<_> = id.logged_propensity.iter().filter(|c| !c.inconclusive).collect();
        if let Some(worst) = judged.iter().map(|c| c.dispersion).reduce(f64::max) {
            m.logged_propensity_dispersion.set(worst);
        }
        let disagrees = judged.iter().filter(|c| c.disagrees).count() as i64;
        m.logged_propensity_disagrees.set(disagrees);
        if self.told.logged_propensity_disagrees.is_some_and(|d| d != disagrees) || (self.told.logged_propensity_disagrees.is_none() && disagrees > 0) {
            tracing::info!(target: "ultr::story", "logged propensities: {disagrees} policy(ies) disagree with the counted π");
        }
        self.told.logged_propensity_disagrees = Some(disagrees);
    }

    /// Residuals and the misspecification test of the current model on each window closed since the
    /// last look (the newest few after a restart or a model change).
    fn score_new_windows(
        &mut self,
        dir: &Path,
        manifest: &Manifest,
        rt: &ultr_core::context::Runner,
        ips_pi: &[datafusion::arrow::array::RecordBatch],
    ) -> anyhow::Result<()> {
        let mut new: Vec<_> = manifest.windows.iter().filter(|w| w.end_ms > self.scored_until).cloned().collect();
        let skip = new.len().saturating_sub(MAX_WINDOWS_SCORED_AT_ONCE);
        new.drain(..skip);
        for w in new {
            let Some((_, model)) = &self.model else { return Ok(()) };
            let ex = rt.run(examples_for_windows(&self.context, dir, std::slice::from_ref(&w), ips_pi.to_vec(), model.meta.architecture.max_positions))?;
            self.scored_until = self.scored_until.max(w.end_ms);
            if ex.rows.is_empty() || model.check_compatible(&ex).is_err() {
                continue;
            }
            let logits = model.logits(&ex, &self.config.train.backend.device()?);
            let summary = summarize(&ex.rows, &logits, self.config.train.ips.max_weight);
            // Held-out rows only: the whole window when it ended after the model's training data,
            // else its evaluation slice (sessions no fit or early stopping saw).
            let whole_window = w.start_ms >= self.model_data_end_ms;
            let mut held_out = vec![whole_window; ex.rows.len()];
            if !whole_window {
                for span in &ex.sessions {
                    if split_of(span, self.config.train.holdout()) == Split::Evaluation {
                        held_out[span.start..span.start + span.len].fill(true);
                    }
                }
            }
            // A per-document tower's own estimation noise correlates with π; the test takes its
            // per-document levels out (see `ultr_train::misspecification`).
            let nuisance = Nuisance::of_tower(model.meta.architecture.tower);
            let test = score_test(&ex.rows, &logits, |i| held_out[i], self.config.identifiability.min_policy_variation, nuisance);
            self.report_window(&w, summary, test, whole_window);
        }
        Ok(())
    }

    /// One scored window's residual and misspecification series, and its place in the history.
    fn report_window(&mut self, w: &ultr_core::state::WindowEntry, summary: ResidualSummary, test: MisspecificationTest, whole_window: bool) {
        let m = &self.metrics;
        let label = self.config.train.model_label();
        let tower = label.as_str();
        m.misspecification_assessable.with_label_values(&[tower]).set(test.assessable as i64);
        m.misspecification_z.with_label_values(&[tower]).set(test.z);
        let limit = signals::threshold::MISSPECIFICATION_Z;
        let high = test.z > limit;
        if test.assessable && self.told.misspecification_high != Some(high) {
            let verdict = if high { format!("residuals depend on the logging policy (z > {limit})") } else { format!("no sign (z ≤ {limit})") };
            tracing::info!(target: "ultr::story", "misspecification: z = {:+.2} on window {}: {verdict}", test.z, span_in_short(w.start_ms, w.end_ms));
            self.told.misspecification_high = Some(high);
        }
        for (k, mean, _) in summary.per_position.iter().filter(|(k, _, _)| (*k as usize) <= metrics::MAX_POSITION_LABELS) {
            m.residual_mean.with_label_values(&[&k.to_string()]).set(*mean);
        }
        m.residual_propensity_correlation.set(summary.propensity_correlation);
        let reference = *self.reference.get_or_insert(summary.histogram);
        m.residual_psi.set(psi(&reference, &summary.histogram));
        m.residual_page_hinkley.set(self.page_hinkley.update(summary.mean_abs));
        m.residual_windows.inc();
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(ScoredWindow { end_ms: w.end_ms, residuals: summary, misspecification: test, whole_window });
    }

    /// `[eval] qrels`: the current model, the logged order and naive click-through over the lookback
    /// horizon's rows, scored against the editors' labels (`ultr_judged_ndcg`,
    /// `ultr_judged_ndcg_difference`), with a log line when the model's standing changes.
    fn evaluate_judged(
        &mut self,
        dir: &Path,
        horizon: &[ultr_core::state::WindowEntry],
        ips_pi: Vec<datafusion::arrow::array::RecordBatch>,
        rt: &ultr_core::context::Runner,
    ) -> anyhow::Result<()> {
        use ultr_train::eval::judged::{evaluate, seen_by_query, Ranking};
        let (Some(qrels), Some((id, model))) = (&self.qrels, &self.model) else { return Ok(()) };
        let ex = rt.run(examples_for_windows(&self.context, dir, horizon, ips_pi, model.meta.architecture.max_positions))?;
        if ex.rows.is_empty() || model.check_compatible(&ex).is_err() {
            return Ok(());
        }
        let seen = seen_by_query(&ex);
        let relevance = model.relevance_of_rows(&ex, &self.config.train.backend.device()?);
        let rankings = vec![Ranking::logged(&seen), Ranking::naive_ctr(&seen), Ranking::from_rows("model", &ex, &relevance)];
        let e = &self.config.eval;
        let report = evaluate(qrels, &rankings, e.unjudged, e.bootstrap, e.seed)?;
        let label = self.config.train.model_label();
        self.metrics.set_judged(&label, &report);
        let Some(figures) = report.rankers.iter().find(|r| r.ranker == "model") else { return Ok(()) };
        // nDCG@10 (index 3): below a baseline when the difference's whole interval is below 0.
        let below: Vec<&str> = [("logged", &figures.minus_logged[3]), ("naive_ctr", &figures.minus_naive_ctr[3])]
            .into_iter()
            .filter(|(_, d)| d.high < 0.0)
            .map(|(b, _)| b)
            .collect();
        let standing = (id.clone(), below.join(","));
        if self.told.judged.as_ref() != Some(&standing) {
            let ndcg = |r: &str| report.rankers.iter().find(|f| f.ranker == r).map_or(f64::NAN, |f| f.mean[3].estimate);
            let verdict =
                if below.is_empty() { "not below either baseline".to_string() } else { format!("BELOW {} beyond its 95% interval", below.join(" and ")) };
            tracing::info!(
                target: "ultr::story",
                "judged: model {id} nDCG@10 {:.3} (logged order {:.3}, naive click-through {:.3}) over {} judged queries: {verdict}",
                ndcg("model"),
                ndcg("logged"),
                ndcg("naive_ctr"),
                report.queries
            );
            self.told.judged = Some(standing);
        }
        Ok(())
    }
}

fn propensity_min(batches: &[datafusion::arrow::array::RecordBatch]) -> Option<f64> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Float64Type;
    batches
        .iter()
        .filter_map(|b| b.column_by_name("propensity"))
        .flat_map(|c| c.as_primitive::<Float64Type>().iter().flatten().collect::<Vec<_>>())
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))))
}
