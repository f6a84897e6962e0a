//! Training: the models of the registry (`models/`) in burn, fitted on the state's windows with IPS weights,
//! checkpointed, and promoted only through the gate. `ultr train` and `ultr run`'s schedule both call
//! [`train_from_state`].

pub mod artefact;
pub mod baselines;
pub mod batches;
pub mod checkpoint;
pub mod chunks;
pub mod config;
pub mod data;
pub mod device;
pub mod eval;
pub mod export;
pub mod fit;
pub mod ips_propensity;
pub mod logged_order_prior;
pub mod misspecification;
pub mod models;
pub mod onnx;
pub mod refit;
pub mod scoring;
pub mod uncertainty;
pub mod weights;

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::config::TrainConfig;
use artefact::Trained;
use checkpoint::{decide, CheckpointInfo, Decision, ModelStore};
use chunks::{load_training_data, TrainingData};
use data::{split_of, Examples, Horizon, Split};
use fit::{fit_chunks, FitReport};
use scoring::LossSums;
use ultr_core::config::CoreConfig;
use weights::ips_weights;

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
}

/// A warm start next to a cold retrain of the whole horizon, scored on the same evaluation rows.
#[derive(Debug, Clone, Serialize)]
pub struct ColdComparison {
    pub warm_evaluation_loss: f64,
    pub cold_evaluation_loss: f64,
    pub warm_seconds: f64,
    pub cold_seconds: f64,
    /// max_k |θ_k(warm) − θ_k(cold)| over positions present in the data.
    pub max_theta_difference: f64,
    pub cold_train_impressions: usize,
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

/// Identifiability of the model this config trains (its tower, its positions): the one verdict the
/// CLI, the monitor's metrics and the alerts share.
pub fn identifiability(
    cumulative: &ultr_core::state::cumulative::Cumulative,
    thresholds: &ultr_core::identify::config::IdentifiabilityConfig,
    train: &TrainConfig,
) -> anyhow::Result<ultr_core::identify::IdentifiabilityReport> {
    ultr_core::identify::analyse(cumulative, thresholds, &train.model_label(), train.model.identification(train.tower), train.max_positions as u32)
}

pub fn models_dir(config: &TrainConfig, state_dir: &Path) -> PathBuf {
    config.models_dir.clone().unwrap_or_else(|| state_dir.join("models"))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(ultr_core::runtime::multi_thread("ultr-train")?)
}

/// The evaluation slice of `ex` with its weights (what the gate compares models on: sessions neither
/// the optimizer nor early stopping saw, so the candidate is not favoured).
pub fn evaluation_slice(ex: &Examples, config: &TrainConfig) -> anyhow::Result<(Examples, Vec<f32>)> {
    let val = ex.filter_sessions(|s| split_of(s, config.holdout()) == Split::Evaluation);
    let (w, _) = ips_weights(&val.rows, &config.applied_ips())?;
    Ok((val, w))
}

/// The gate's losses: each model's weighted loss on the evaluation rows of `data`, read once (chunk
/// by chunk when spilled); an incompatible model gets its error.
pub fn evaluation_losses(models: &[&Trained], data: &TrainingData, config: &TrainConfig) -> anyhow::Result<Vec<anyhow::Result<f64>>> {
    let cfg = config;
    let device = cfg.backend.device()?;
    let mut sums: Vec<anyhow::Result<LossSums>> = models.iter().map(|_| Ok(LossSums::default())).collect();
    let mut score = |val: &Examples, w: &[f32]| {
        for (m, s) in models.iter().zip(sums.iter_mut()) {
            if let Ok(total) = s {
                match m.check_compatible(val) {
                    Ok(()) => total.add(m.loss_sums(val, w, &device)),
                    Err(e) => *s = Err(e),
                }
            }
        }
    };
    match data {
        TrainingData::InMemory(ex) => {
            let (val, w) = evaluation_slice(ex, config)?;
            score(&val, &w);
        }
        TrainingData::Spilled(spilled) => {
            use chunks::ExampleChunks;
            for i in 0..spilled.chunk_count(Split::Evaluation) {
                let (val, w) = evaluation_slice(&spilled.load_chunk(Split::Evaluation, i)?, config)?;
                score(&val, &w);
            }
        }
    }
    if sums.iter().flatten().any(|t| t.impressions == 0.0) {
        anyhow::bail!(
            "no impressions in the evaluation slice (key `train.evaluation_fraction` = {}): the promotion gate has nothing to compare models on",
            cfg.evaluation_fraction
        );
    }
    Ok(sums.into_iter().map(|s| s.map(|t| t.loss(cfg.ips.self_normalize))).collect())
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
    let rt = runtime()?;
    let lookback = req.core.state.lookback_ms();
    let (horizon, parent, note) = training_horizon(req, &store, &manifest, current.as_ref())?;
    let budget = cfg.memory_budget_bytes().map_err(|e| anyhow::anyhow!(e))?;
    let data = rt
        .block_on(load_training_data(req.state_dir, &manifest, lookback, horizon, cfg.max_positions, &cfg.ips, budget, &spill_dir(req.state_dir)))
        .with_context(|| format!("loading training data from {}", req.state_dir.display()))?;
    let init = match (&current, &parent) {
        (Some((_, Ok(t))), Some(_)) => Some(t),
        _ => None,
    };
    let (mut trained, report) = if cfg.model.input_shape().lists() {
        // Listwise models read whole sessions (the windows' session stores); the gate still scores
        // every model on the same aggregated evaluation rows.
        let lists = rt
            .block_on(data::load_session_lists(req.state_dir, &manifest, lookback, horizon, cfg.max_positions, cfg.holdout()))
            .with_context(|| format!("loading the session stores from {}", req.state_dir.display()))?;
        fit_chunks(&lists, cfg, init, req.progress, req.cancel)?
    } else {
        fit_chunks(data.chunks(), cfg, init, req.progress, req.cancel)?
    };
    trained.meta.feature_schema = req.core.decode.feature_schema.clone();
    let (decision, candidate_loss) = gate(req, &trained, &report, current.as_ref(), &data)?;
    let cold_comparison = if req.compare_cold && parent.is_some() {
        let full = rt.block_on(load_training_data(
            req.state_dir,
            &manifest,
            lookback,
            Horizon::Lookback(lookback),
            cfg.max_positions,
            &cfg.ips,
            budget,
            &spill_dir(req.state_dir),
        ))?;
        Some(compare_cold(req, full, &data, (&trained, &report, candidate_loss))?)
    } else {
        None
    };

    let seen = report.max_position as usize;
    let theta: Vec<f64> = trained.position_bias().into_iter().take(seen).collect();
    let theta_intervals = if cfg.uncertainty.enabled {
        let ex = data.chunks().in_memory().context("θ intervals resample the training rows in memory: raise `train.memory_budget` above the horizon's")?;
        let before_refit = report.position_refit.as_ref().map(|r| r.before.as_slice());
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

/// The promotion gate: the candidate's and the current model's losses on the evaluation rows, and
/// the decision. Returns the decision and the candidate's loss.
fn gate(
    req: &TrainRequest,
    trained: &Trained,
    report: &FitReport,
    current: Option<&(String, anyhow::Result<Trained>)>,
    data: &TrainingData,
) -> anyhow::Result<(Decision, f64)> {
    let current_model = current.and_then(|(_, t)| t.as_ref().ok());
    let models: Vec<&Trained> = std::iter::once(trained).chain(current_model).collect();
    let mut losses = evaluation_losses(&models, data, req.config)?.into_iter();
    let candidate_loss = losses.next().expect("the candidate's loss")?;
    let held_out = baselines::held_out_clicks(data.chunks(), trained, current_model, req.config)?;
    let current_loss = current.map(|(id, t)| {
        let loss = match t {
            Ok(_) => losses.next().expect("the current model's loss"),
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        };
        (id.as_str(), loss)
    });
    Ok((decide(report.stop, candidate_loss, held_out.as_ref(), current_loss, req.config.promotion_tolerance, req.force), candidate_loss))
}

/// `--compare-cold`: retrains cold on the whole horizon `full` and compares it with the warm
/// candidate on the same evaluation rows of `data`.
fn compare_cold(req: &TrainRequest, full: TrainingData, data: &TrainingData, warm: (&Trained, &FitReport, f64)) -> anyhow::Result<ColdComparison> {
    let (trained, report, candidate_loss) = warm;
    let (cold, cold_report) = fit_chunks(full.chunks(), req.config, None, req.progress, req.cancel)?;
    drop(full);
    let cold_loss = evaluation_losses(&[&cold], data, req.config)?.remove(0)?;
    let k = report.max_position.min(cold_report.max_position) as usize;
    let (tw, tc) = (trained.position_bias(), cold.position_bias());
    Ok(ColdComparison {
        warm_evaluation_loss: candidate_loss,
        cold_evaluation_loss: cold_loss,
        warm_seconds: report.seconds,
        cold_seconds: cold_report.seconds,
        max_theta_difference: (0..k).map(|i| (tw[i] - tc[i]).abs()).fold(0.0, f64::max),
        cold_train_impressions: cold_report.train_impressions,
    })
}

impl TrainOutcome {
    pub fn render(&self) -> String {
        let f = &self.fit;
        let mut s = String::new();
        s.push_str(&format!("checkpoint {} in {}\n", self.id, self.models_dir.display()));
        s.push_str(&f.trained_line());
        if !f.converged && f.stop == crate::fit::StopReason::MaxEpochs {
            s.push_str(&format!(
                "  NOT CONVERGED: max_epochs ({}) ran out with the validation loss still falling; θ is flattened toward 0 (raise [train] max_epochs)\n",
                f.epochs.len()
            ));
        }
        if let Some(last) = f.epochs.last() {
            s.push_str(&format!(
                "  last epoch: train loss {:.5}, validation loss {:.5}, {:.0} impressions/s\n",
                last.train_loss, last.validation_loss, last.impressions_per_second
            ));
        }
        let w = &f.weights;
        s.push_str(&format!(
            "  IPS {}: min π {:.4}, max weight {:.2}, clipped {:.2}%, effective sample size {:.0} ({:.1}%)\n",
            if w.enabled { "on" } else { "off" },
            w.min_propensity,
            w.max_weight,
            100.0 * w.clipped_fraction,
            w.effective_sample_size,
            100.0 * w.effective_sample_fraction
        ));
        if let Some(r) = &f.position_refit {
            let moved = r.before.iter().zip(&r.after).map(|(b, a)| (a - b).abs()).fold(0.0, f64::max);
            s.push_str(&format!(
                "  θ refit after early stopping ([train] refit_position_bias): {} positions, θ_k − θ_1 moved by up to {moved:.3}\n",
                r.positions
            ));
            if !r.not_estimable.is_empty() {
                let list = r.not_estimable.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", ");
                s.push_str(&format!(
                    "  NOT ESTIMABLE: θ at position(s) {list}: their swap pairs carry no click (or only clicks), so they keep the early-stopped θ\n"
                ));
            }
        }
        if let Some(p) = &f.logged_order_prior {
            let tried = p.candidates.iter().map(|(l, ll)| format!("{l} → {ll:.5}")).collect::<Vec<_>>().join(", ");
            let prior = p.prior.iter().map(|(k, r)| format!("{k}: {r:+.2}")).collect::<Vec<_>>().join(" ");
            s.push_str(&format!(
                "  γ of {} pairs around the logged-order prior ([train] logged_order_prior): λ = {} chosen by validation clicks per impression ({tried})\n",
                p.pairs, p.strength
            ));
            s.push_str(&format!("    ρ by mean logged position: {prior}\n"));
        }
        s.push_str("  θ_k − θ_1: ");
        s.push_str(&self.theta.iter().take(10).map(|t| format!("{t:+.3}")).collect::<Vec<_>>().join(" "));
        s.push('\n');
        if let Some(t) = &self.theta_intervals {
            s.push_str(&format!("  θ_k − θ_1 with {:.0}% intervals ({} bootstrap replicates of the converged estimator):\n", 100.0 * t.level, t.replicates));
            s.push_str("      k   early-stopped   shipped   converged   interval\n");
            for k in 1..t.converged.len() {
                let shipped = t.shipped.get(k).copied().unwrap_or(f64::NAN);
                let within = if t.lower[k] <= shipped && shipped <= t.upper[k] { "" } else { "   shipped θ outside the interval" };
                s.push_str(&format!(
                    "    {:3}   {:+13.3}   {:+7.3}   {:+9.3}   [{:+.3}, {:+.3}]{within}\n",
                    k + 1,
                    t.early_stopped[k],
                    shipped,
                    t.converged[k],
                    t.lower[k],
                    t.upper[k]
                ));
            }
        }
        if let Some(h) = &self.decision.held_out_clicks {
            s.push_str(&format!("  {}\n", h.line()));
        }
        s.push_str(&format!("  {}: {}\n", if self.decision.promoted { "PROMOTED" } else { "REJECTED" }, self.decision.reason));
        if let Some(c) = &self.cold_comparison {
            s.push_str(&format!(
                "  warm vs cold retrain on the whole horizon ({} impressions): evaluation loss {:.6} vs {:.6}, {:.1}s vs {:.1}s, max |Δθ| {:.4}\n",
                c.cold_train_impressions, c.warm_evaluation_loss, c.cold_evaluation_loss, c.warm_seconds, c.cold_seconds, c.max_theta_difference
            ));
        }
        if let Some(n) = &self.note {
            s.push_str(&format!("  note: {n}\n"));
        }
        if !self.pruned.is_empty() {
            s.push_str(&format!("  deleted {} old checkpoint(s) (train.keep_checkpoints): {}\n", self.pruned.len(), self.pruned.join(", ")));
        }
        s
    }
}
