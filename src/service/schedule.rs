//! Scheduled retraining: a cron expression from `[train] schedule` fires `train_from_state` (the same
//! code as `ultr train`, promotion gate included) on a background thread; the first run trains cold,
//! later runs warm-start from the current model when `[train] warm_start` is set. Stopping the
//! scheduler cancels a training in progress before its next batch, so nothing half-written is left.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;

use crate::config::PipelineConfig;
use crate::monitor::board::TrainingCard;
use crate::monitor::metrics::Metrics;
use ultr_train::fit::Cancelled;
use ultr_train::{train_from_state, TrainOutcome, TrainRequest};

/// The outcome of one scheduled run, kept for logs and tests.
#[derive(Debug, Clone)]
pub struct ScheduledRun {
    pub at: chrono::DateTime<Utc>,
    pub warm_start: bool,
    pub result: Result<(String, bool), String>,
}

/// What the state's closed windows hold, as far as a scheduled training needs to know.
#[derive(Debug, Clone, Copy)]
pub struct ClosedData {
    /// The end of the newest closed window (epoch ms), None before the first.
    pub newest_end_ms: Option<i64>,
    /// Sessions in every closed window.
    pub sessions: u64,
}

impl ClosedData {
    /// What a state's manifest holds in closed windows (nothing when there is no manifest yet).
    pub fn of(manifest: Option<&ultr_core::state::Manifest>) -> ClosedData {
        ClosedData {
            newest_end_ms: manifest.and_then(|m| m.windows.iter().map(|w| w.end_ms).max()),
            sessions: manifest.map_or(0, |m| m.windows.iter().map(|w| w.sessions).sum()),
        }
    }
}

/// Why a firing trains nothing, if it does not: nothing to learn from is a skip, not a failure. No
/// closed window yet; a first (cold) model while the windows hold fewer than `min_sessions` sessions;
/// or, for a warm start, no window newer than the current model's data (`current_end`).
pub fn skip_reason(closed: &ClosedData, current_end: Option<i64>, warm: bool, min_sessions: u64) -> Option<String> {
    match (closed.newest_end_ms, current_end) {
        (None, _) => Some("no closed windows yet".to_string()),
        (Some(_), None) if closed.sessions < min_sessions => {
            Some(format!("the closed windows hold {} sessions, fewer than `train.min_sessions` = {min_sessions}", closed.sessions))
        }
        (Some(n), Some(end)) if warm && n <= end => Some("no window newer than the current model's data".to_string()),
        _ => None,
    }
}

pub struct Scheduler {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
    pub runs: Arc<Mutex<Vec<ScheduledRun>>>,
}

/// Records a training outcome in the metrics.
pub fn record_outcome(metrics: &Metrics, outcome: &anyhow::Result<TrainOutcome>) {
    let now = Utc::now().timestamp_millis() as f64 / 1000.0;
    match outcome {
        Ok(o) => {
            metrics.trainings.with_label_values(&[if o.decision.promoted { "promoted" } else { "rejected" }]).inc();
            metrics.training_seconds.set(o.fit.seconds);
            metrics.training_converged.set(if o.fit.converged { 1.0 } else { 0.0 });
            if let Some(best) = o.fit.epochs.iter().find(|e| e.epoch == o.fit.best_epoch).or(o.fit.epochs.last()) {
                metrics.training_loss.with_label_values(&["train"]).set(best.train_loss);
                metrics.training_loss.with_label_values(&["validation"]).set(best.validation_loss);
            }
            metrics.last_training_success.set(now);
            let w = &o.fit.weights;
            metrics.ips_weight_max.set(w.max_weight);
            metrics.ips_clipped_fraction.set(w.clipped_fraction);
            metrics.ips_effective_sample_fraction.set(w.effective_sample_fraction);
            // θ, its estimability and intervals are the monitor's to set, from the checkpoint it
            // loads when CURRENT moves (`monitor::refresh_model`): one writer, so `ultr_theta` is
            // never half the new model's (the positions it saw) and half the old one's.
            if o.decision.promoted {
                metrics.last_promotion.set(now);
            }
            metrics.judged_minus_logged.set_known(o.decision.judged.as_ref().map(|j| j.minus_logged));
            if !o.decision.promoted {
                if o.decision.judged.as_ref().is_some_and(|j| j.refused) {
                    metrics.refused_below_logged_order.with_label_values(&["judged"]).inc();
                } else if o.decision.logged_order_clicks.is_some_and(|(combined, logged)| combined < logged) {
                    metrics.refused_below_logged_order.with_label_values(&["clicks"]).inc();
                }
            }
        }
        Err(_) => metrics.trainings.with_label_values(&["failed"]).inc(),
    }
}

impl Scheduler {
    /// Starts the schedule, or returns `None` when the config has none. With a `gate`, a firing is
    /// skipped while it is false (a scale-out instance trains only while it holds the compactor lease).
    pub fn start(
        context: &ultr_core::context::PipelineContext,
        config: &PipelineConfig,
        state_dir: PathBuf,
        metrics: Arc<Metrics>,
        gate: Option<Arc<AtomicBool>>,
    ) -> anyhow::Result<Option<Scheduler>> {
        let Some(expr) = config.train.schedule.clone() else { return Ok(None) };
        let schedule = cron::Schedule::from_str(&expr).map_err(|e| anyhow::anyhow!("key `train.schedule` = {expr:?}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(Mutex::new(Vec::new()));
        let (stop_flag, runs_log, config, context) = (stop.clone(), runs.clone(), config.clone(), context.clone());
        // Read (and checked) once: the service stopped at start on an unreadable file.
        let qrels = config.eval.qrels.as_deref().map(ultr_train::eval::judged::Qrels::read).transpose().context("key `eval.qrels`")?;
        let handle = std::thread::Builder::new().name("ultr-schedule".into()).spawn(move || {
            let mut next = schedule.upcoming(Utc).next();
            while !stop_flag.load(Ordering::Relaxed) {
                let Some(at) = next else { break };
                if Utc::now() < at {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                if gate.as_ref().is_some_and(|g| !g.load(Ordering::SeqCst)) {
                    tracing::info!("scheduled training skipped: another instance holds the compactor lease and trains");
                    metrics.trainings.with_label_values(&["skipped"]).inc();
                    next = schedule.after(&Utc::now()).next();
                    continue;
                }
                let store = ultr_train::checkpoint::ModelStore::open(&ultr_train::models_dir(&config.train, &state_dir)).ok();
                let current_end = store
                    .as_ref()
                    .and_then(|s| s.current_id().ok().flatten().and_then(|id| s.info(&id).ok()))
                    .map(|info| info.data_range_ms.map(|(_, end)| end).unwrap_or(i64::MIN));
                let warm = config.train.warm_start && current_end.is_some();
                let manifest = ultr_core::state::read_manifest(&state_dir).ok();
                let closed = ClosedData::of(manifest.as_ref());
                let skip = skip_reason(&closed, current_end, warm, config.train.min_sessions);
                if let Some(why) = skip {
                    tracing::info!("scheduled training skipped: {why}");
                    metrics.trainings.with_label_values(&["skipped"]).inc();
                    next = schedule.after(&Utc::now()).next();
                    continue;
                }
                metrics.training_in_progress.set(1);
                let truth = config.truth_theta();
                let outcome = train_from_state(&TrainRequest {
                    state_dir: &state_dir,
                    core: &config.core(),
                    config: &config.train,
                    warm_start: warm,
                    compare_cold: false,
                    force: false,
                    progress: false,
                    cancel: Some(&*stop_flag),
                    judged: qrels.as_ref().map(|qrels| ultr_train::gate::TeamRanking { qrels, eval: &config.eval }),
                    truth_theta: truth.as_deref(),
                    context: &context,
                });
                metrics.training_in_progress.set(0);
                let finished_unix_s = Utc::now().timestamp_millis() as f64 / 1000.0;
                match &outcome {
                    Ok(o) => {
                        tracing::debug!(target: "ultr::training", "{}", o.render().trim_end());
                        tracing::info!(
                            target: "ultr::story",
                            id = %o.id,
                            promoted = o.decision.promoted,
                            "training {}: {} in {:.2} s ({} epochs, {:?}); {}; {}",
                            if warm { "(warm start)" } else { "(cold)" },
                            if o.decision.promoted { "PROMOTED" } else { "REJECTED" },
                            o.fit.seconds,
                            o.fit.epochs.len(),
                            o.fit.stop,
                            crate::monitor::theta_in_short(&o.theta),
                            o.decision.reason,
                        );
                        metrics.board.push_training(TrainingCard {
                            finished_unix_s,
                            id: Some(o.id.clone()),
                            result: if o.decision.promoted { "promoted" } else { "rejected" }.into(),
                            reason: o.decision.reason.clone(),
                            theta: o.theta.clone(),
                            seconds: o.fit.seconds,
                            warm_start: warm,
                            combination: o.fit.logged_order_combination.clone(),
                        });
                    }
                    Err(e) if e.is::<Cancelled>() => {
                        eprintln!("ultr run: {e}");
                        metrics.trainings.with_label_values(&["cancelled"]).inc();
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("scheduled training failed: {e:#}");
                        metrics.board.push_training(TrainingCard {
                            finished_unix_s,
                            id: None,
                            result: "failed".into(),
                            reason: format!("{e:#}"),
                            theta: Vec::new(),
                            seconds: 0.0,
                            warm_start: warm,
                            combination: None,
                        });
                    }
                }
                record_outcome(&metrics, &outcome);
                runs_log.lock().push(ScheduledRun { at, warm_start: warm, result: outcome.map(|o| (o.id, o.decision.promoted)).map_err(|e| format!("{e:#}")) });
                next = schedule.after(&Utc::now()).next();
            }
        })?;
        Ok(Some(Scheduler { stop, handle: Some(handle), runs }))
    }
}

/// How long a stopping scheduler waits for its thread. A training in progress is cancelled before
/// its next batch; only loading a large horizon can take longer, and then the thread is left behind
/// (its checkpoint would be cut short, leaving a `.tmp-*` directory the model store ignores).
const STOP_GRACE: Duration = Duration::from_secs(30);

impl Drop for Scheduler {
    /// Stops scheduling and cancels a training in progress, waiting up to `STOP_GRACE` for it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let deadline = std::time::Instant::now() + STOP_GRACE;
            while !handle.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if handle.is_finished() {
                let _ = handle.join();
            } else {
                eprintln!("ultr run: a scheduled training did not stop within {}s; leaving it behind", STOP_GRACE.as_secs());
            }
        }
    }
}
