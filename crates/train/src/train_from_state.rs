//! One training run on a state: the horizon (the lookback, or the windows after the current model
//! for a warm start), the fit, the gate, θ's intervals, and the checkpoint. `ultr train` and
//! `ultr run`'s schedule both call [`train_from_state`].

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::artefact::Trained;
use crate::checkpoint::{CheckpointInfo, Decision, ModelStore};
use crate::chunks::load_training_data;
use crate::config::TrainConfig;
use crate::data::{self, Horizon};
use crate::fit::{fit_chunks, FitReport};
use crate::gate::{compare_cold, gate, ColdComparison};
use crate::uncertainty;
use ultr_core::config::CoreConfig;

/// What `ultr train` was asked to do.
pub struct TrainRequest<'a> {
    pub state_dir: &'a Path,
    /// The streaming core's settings (the state's horizon, the decoder's feature schema).
    pub core: &'a CoreConfig,
    pub config: &'a TrainConfig,
    /// Continue from the current model on the windows it has not seen.
    pub warm_start: bool,
    /// With `warm_start`: also retrain cold on the whole horizon and report both.
    pub compare_cold: bool,
    /// Promote even when the gate would refuse (never a diverged model).
    pub force: bool,
    pub progress: bool,
    /// Set by a shutting-down service: training stops before its next batch with `fit::Cancelled`.
    pub cancel: Option<&'a std::sync::atomic::AtomicBool>,
    /// `[eval] qrels`: the gate also refuses a ranking below the logged order on editors' labels.
    pub judged: Option<crate::gate::TeamRanking<'a>>,
    /// The simulator's true θ_k − θ_1 when the stream is simulated: drawn beside the θ intervals in
    /// the checkpoint's `theta_intervals.svg`.
    pub truth_theta: Option<&'a [f64]>,
    /// What the training data's queries run on (their runtime and memory pool).
    pub context: &'a ultr_core::context::PipelineContext,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrainOutcome {
    pub id: String,
    pub decision: Decision,
    pub fit: FitReport,
    /// θ_k − θ_1 for the positions seen in training.
    pub theta: Vec<f64>,
    pub data_range_ms: Option<(i64, i64)>,
    pub models_dir: PathBuf,
    pub note: Option<String>,
    pub cold_comparison: Option<ColdComparison>,
    /// Checkpoints deleted by `train.keep_checkpoints` after this one was written.
    pub pruned: Vec<String>,
    /// With `train.uncertainty.enabled`: θ's converged estimate and bootstrap intervals.
    pub theta_intervals: Option<uncertainty::ThetaIntervals>,
}

pub fn models_dir(config: &TrainConfig, state_dir: &Path) -> PathBuf {
    config.models_dir.clone().unwrap_or_else(|| state_dir.join("models"))
}

/// Where a training run spills examples beyond `[train] memory_budget` (removed after the run).
pub fn spill_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("training-spill")
}

/// Trains on the state, writes a checkpoint, and lets the gate decide whether it becomes current.
pub fn train_from_state(req: &TrainRequest) -> anyhow::Result<TrainOutcome> {
    let cfg = req.config;
    let manifest = ultr_core::state::read_manifest(req.state_dir)?;
    let store = ModelStore::open(&models_dir(req.config, req.state_dir))?;
    let _writing = store.lock_for_writing()?;
    let device = cfg.backend.device()?;
    let current: Option<(String, anyhow::Result<Trained>)> = store.current_id()?.map(|id| {
        // A current model of another feature schema can neither warm-start nor be compared at the gate.
        let loaded = store.load(&id, &device).and_then(|t| t.check_feature_schema(req.core.decode.feature_schema.as_ref()).map(|_| t));
        (id, loaded)
    });
    let rt = req.context.runner("ultr-train")?;
    let lookback = req.core.state.lookback_ms();
    let (horizon, parent, note) = training_horizon(req, &store, &manifest, current.as_ref())?;
    let budget = cfg.memory_budget_bytes().map_err(|e| anyhow::anyhow!(e))?;
    let mut data = rt
        .run(load_training_data(req.context, req.state_dir, &manifest, lookback, horizon, cfg.max_positions, &cfg.ips, budget, &spill_dir(req.state_dir)))
        .with_context(|| format!("loading training data from {}", req.state_dir.display()))?;
    if cfg.validates_on_queries() {
        data.validate_on_queries(cfg.holdout());
    }
    let init = match (&current, &parent) {
        (Some((_, Ok(t))), Some(_)) => Some(t),
        _ => None,
    };
    let (mut trained, report) = if cfg.model.input_shape().lists() {
        // Listwise models read whole sessions (the windows' session stores); the gate still scores
        // every model on the same aggregated evaluation rows.
        let lists = rt
            .run(data::load_session_lists(req.context, req.state_dir, &manifest, lookback, horizon, cfg.max_positions, cfg.holdout()))
            .with_context(|| format!("loading the session stores from {}", req.state_dir.display()))?;
        fit_chunks(&lists, cfg, init, req.progress, req.cancel)?
    } else {
        fit_chunks(data.chunks(), cfg, init, req.progress, req.cancel)?
    };
    trained.meta.feature_schema = req.core.decode.feature_schema.clone();
    let (mut decision, candidate_loss) = gate(cfg, req.force, &trained, &report, current.as_ref(), &data)?;
    crate::gate::team_ranking_checks(&mut decision, &trained, &report, &data, cfg, req.judged.as_ref(), req.force)?;
    let cold_comparison = if req.compare_cold && parent.is_some() {
        let mut full = rt.run(load_training_data(
            req.context,
            req.state_dir,
            &manifest,
            lookback,
            Horizon::Lookback(lookback),
            cfg.max_positions,
            &cfg.ips,
            budget,
            &spill_dir(req.state_dir),
        ))?;
        if cfg.validates_on_queries() {
            full.validate_on_queries(cfg.holdout());
        }
        Some(compare_cold(cfg, req.progress, req.cancel, full, &data, (&trained, &report, candidate_loss))?)
    } else {
        None
    };

    let seen = report.max_position as usize;
    let theta: Vec<f64> = trained.position_bias().into_iter().take(seen).collect();
    let theta_intervals = if cfg.uncertainty.enabled {
        let ex = data.chunks().in_memory().context("θ intervals resample the training rows in memory: raise `train.memory_budget` above the horizon's")?;
        // θ from the swap pairs was fixed before training: no early-stopped θ differs from it.
        let before_refit = report.position_refit.as_ref().filter(|r| r.method != crate::refit::RefitMethod::SwapPairs).map(|r| r.before.as_slice());
        Some(uncertainty::theta_intervals(ex, cfg, &cfg.uncertainty, &trained, before_refit, seen)?)
    } else {
        None
    };
    let info = CheckpointInfo {
        id: String::new(),
        created_at: chrono::Utc::now().to_rfc3339(),
        config: cfg.clone(),
        data_range_ms: data.data_range_ms(),
        parent,
        theta: theta.clone(),
        fit: serde_json::to_value(&report)?,
        decision: decision.clone(),
        theta_intervals: theta_intervals.clone(),
    };
    let id = store.write(&trained, info)?;
    // Written here, so `ultr train` and scheduled training leave the same files in a checkpoint.
    if let Some(t) = &theta_intervals {
        let path = store.dir().join(&id).join("theta_intervals.svg");
        std::fs::write(&path, t.svg(&format!("checkpoint {id}"), req.truth_theta)).with_context(|| format!("writing {}", path.display()))?;
    }
    let pruned = match cfg.keep_checkpoints {
        Some(keep) => store.prune(keep)?,
        None => Vec::new(),
    };
    let note = match (note, &report.weights.note) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b.clone()),
    };
    let data_range_ms = data.data_range_ms();
    Ok(TrainOutcome { id, decision, fit: report, theta, data_range_ms, models_dir: store.dir().to_path_buf(), note, cold_comparison, pruned, theta_intervals })
}

/// Which windows the run trains on: the lookback, or with `--warm-start` the windows after the
/// current model's data (checked against the config). Also the parent's id and a note for the user.
fn training_horizon(
    req: &TrainRequest,
    store: &ModelStore,
    manifest: &ultr_core::state::Manifest,
    current: Option<&(String, anyhow::Result<Trained>)>,
) -> anyhow::Result<(Horizon, Option<String>, Option<String>)> {
    let lookback = req.core.state.lookback_ms();
    match (current, req.warm_start) {
        (Some((id, Ok(t))), true) => {
            t.check_warm_start(&req.config.architecture(), id)?;
            let after = store.info(id)?.data_range_ms.map(|(_, end)| end).unwrap_or(i64::MIN);
            if !manifest.windows.iter().any(|w| w.end_ms > after) {
                anyhow::bail!("nothing to warm-start on: no closed window ends after the current model {id}'s data (up to {after} ms)");
            }
            Ok((Horizon::After(after), Some(id.clone()), None))
        }
        (Some((id, Err(e))), true) => anyhow::bail!("cannot warm-start from the current model {id}: {e:#}"),
        (None, true) => Ok((Horizon::Lookback(lookback), None, Some("--warm-start: no current model yet, trained cold on the whole horizon".to_string()))),
        (_, false) => Ok((Horizon::Lookback(lookback), None, None)),
    }
}
