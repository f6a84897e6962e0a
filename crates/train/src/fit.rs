//! The training loop: AdamW over batches of whole sessions, validation on a hash-chosen slice,
//! early stopping with the best epoch kept, and a refusal to return a model that went NaN.

use std::borrow::Cow;
use std::time::Instant;

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::Device;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::artefact::{ModelMeta, Normalizer, Trained};
pub use super::batches::make_batch;
use super::batches::{aggregated_rows, batches, build_batch, draw_spans, epoch_steps, one_pass_batches, tower_inputs, walks_rows_once, BatchSpec};
use super::chunks::ExampleChunks;
use super::config::{PositionBiasSource, TrainConfig};
use super::data::{split_of, Examples, Split};
use super::models::{AnyModel, BatchTensors, InputShape};
use super::refit::{PositionRefit, RefitMethod};
use super::scoring::weighted_loss_sum;
pub use super::scoring::LossSums;
use super::weights::{weights_of, WeightReport, WeightTotals};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EpochStats {
    pub epoch: usize,
    pub train_loss: f64,
    pub validation_loss: f64,
    pub seconds: f64,
    pub impressions_per_second: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EarlyStopping,
    MaxEpochs,
    /// A loss or parameter became NaN/inf; the model is not usable.
    Diverged,
}

#[derive(Debug, Clone, Serialize)]
pub struct FitReport {
    pub epochs: Vec<EpochStats>,
    pub best_epoch: usize,
    pub best_validation_loss: f64,
    pub stop: StopReason,
    /// Training units: sessions, or aggregated rows when `aggregated_rows` (then a unit is one
    /// distinct (query, document, position, …) row with its impression count, not a session).
    pub train_sessions: usize,
    pub validation_sessions: usize,
    /// The examples were aggregated rows (the state's `training_examples` without sessions), so the
    /// unit counts are rows.
    pub aggregated_rows: bool,
    pub train_impressions: usize,
    pub validation_impressions: usize,
    /// The deepest position among the examples.
    pub max_position: u32,
    /// Chunks the examples were read in (1 and 1: all in memory; see `[train] memory_budget`).
    pub train_chunks: usize,
    pub validation_chunks: usize,
    pub weights: WeightReport,
    pub warm_started: bool,
    pub seconds: f64,
    /// False when the fit ran out of epochs (`max_epochs`) while its validation loss was still
    /// falling (its lowest within the last `patience` epochs), or diverged: the model it keeps is
    /// not the one its data support, and θ from it is flattened toward 0.
    pub converged: bool,
    /// θ refit with the relevance tower frozen (`[train] refit_position_bias`), when it ran.
    pub position_refit: Option<super::refit::PositionRefit>,
    /// γ re-estimated around the logged-order prior (`[train] logged_order_prior`), when it ran.
    #[serde(default)]
    pub logged_order_prior: Option<super::logged_order_prior::LoggedOrderPrior>,
    /// The logged order (prior) combined with the clicks (evidence): the weight chosen and where
    /// the clicks move the ranking (`logged_order_combination.rs`), when it ran.
    pub logged_order_combination: Option<super::logged_order_combination::Combination>,
}

/// Whether a fit that stopped for `stop` after `epochs` had converged (see `FitReport::converged`).
pub fn converged(stop: StopReason, epochs: &[EpochStats], patience: usize) -> bool {
    match stop {
        StopReason::EarlyStopping => true,
        StopReason::Diverged => false,
        StopReason::MaxEpochs => {
            let lowest = epochs.iter().enumerate().min_by(|a, b| a.1.validation_loss.total_cmp(&b.1.validation_loss)).map(|(i, _)| i + 1);
            lowest.is_some_and(|i| epochs.len() - i >= patience.max(1))
        }
    }
}

/// What one pass over every chunk of the examples tells a fit before its first step.
struct Survey {
    rows: usize,
    impressions: u64,
    clicks: u64,
    positions: std::collections::BTreeSet<u32>,
    n_features: Option<usize>,
    n_bias_features: Option<usize>,
    /// Impression-weighted Σx and Σx² of every feature (for the normaliser).
    feature_sum: Vec<f64>,
    feature_sq: Vec<f64>,
    weights: WeightTotals,
    train_sessions: usize,
    validation_sessions: usize,
    train_impressions: usize,
    validation_impressions: usize,
    /// Σ n·w over validation rows (the self-normalised validation loss's denominator).
    validation_weight: f64,
    /// Optimizer steps per epoch, summed over training chunks.
    steps: u64,
    /// Every span is one aggregated row: no session's items are together.
    rows_only: bool,
    /// Every chunk carries relevance labels (a simulation).
    labels: bool,
}

impl Survey {
    fn new() -> Survey {
        Survey {
            rows: 0,
            impressions: 0,
            clicks: 0,
            positions: Default::default(),
            n_features: None,
            n_bias_features: None,
            feature_sum: Vec::new(),
            feature_sq: Vec::new(),
            weights: WeightTotals::empty(),
            train_sessions: 0,
            validation_sessions: 0,
            train_impressions: 0,
            validation_impressions: 0,
            validation_weight: 0.0,
            steps: 0,
            rows_only: true,
            labels: true,
        }
    }

    fn add(&mut self, ex: &Examples, cfg: &TrainConfig) -> anyhow::Result<()> {
        if ex.rows.is_empty() {
            return Ok(());
        }
        for (seen, now, what) in [(&mut self.n_features, ex.n_features, "features"), (&mut self.n_bias_features, ex.n_bias_features, "bias features")] {
            match seen {
                Some(n) if *n != now => anyhow::bail!("a chunk of the training data has {now} {what} where another had {n}"),
                _ => *seen = Some(now),
            }
        }
        self.rows += ex.rows.len();
        self.rows_only &= aggregated_rows(ex);
        self.labels &= !ex.doc_labels.is_empty();
        self.impressions += ex.impressions();
        self.clicks += ex.clicks();
        self.positions.extend(ex.rows.iter().map(|r| r.position));
        if self.feature_sum.is_empty() {
            (self.feature_sum, self.feature_sq) = (vec![0.0; ex.n_features], vec![0.0; ex.n_features]);
        }
        let split = Slices::of(ex, cfg);
        // The normaliser is part of the model: fitted on training rows only.
        for r in Slices::rows(ex, &split.train).map(|i| &ex.rows[i]) {
            let n = r.impressions as f64;
            for (j, v) in ex.doc_features(r.doc).iter().enumerate() {
                self.feature_sum[j] += n * *v as f64;
                self.feature_sq[j] += n * (*v as f64) * (*v as f64);
            }
        }
        let (w, totals) = weights_of(&ex.rows, &cfg.applied_ips());
        self.weights.merge(&totals);
        self.train_sessions += split.train.len();
        self.validation_sessions += split.validation.len();
        let train = split.impressions(ex, &split.train);
        self.train_impressions += train;
        self.validation_impressions += split.impressions(ex, &split.validation);
        self.validation_weight += split.weight(ex, &split.validation, &w);
        self.steps += epoch_steps(cfg, walks_rows_once(cfg, cfg.model.input_shape(), aggregated_rows(ex)), split.train.len(), train);
        Ok(())
    }

    /// Refuses data a model cannot be fitted on, with the reason.
    fn check(&self, cfg: &TrainConfig) -> anyhow::Result<()> {
        if self.rows == 0 {
            anyhow::bail!("no training impressions in the horizon");
        }
        if self.positions.len() < 2 {
            anyhow::bail!("every impression is at position {:?}: position bias cannot be estimated from a single position", self.positions.iter().next());
        }
        if self.clicks == 0 {
            anyhow::bail!("no clicks among {} impressions: a click model has nothing to fit (θ_k and r(x) would run to −∞)", self.impressions);
        }
        if self.clicks == self.impressions {
            anyhow::bail!("every one of {} impressions was clicked: a click model has nothing to fit", self.impressions);
        }
        let n_features = self.n_features.unwrap_or(0);
        if cfg.tower.reads_features() && n_features == 0 {
            anyhow::bail!(
                "key `train.tower` = {:?} needs item features, but the stream carries none (ids and clicks only): set `[train] tower = \"embedding\"`, a relevance per (query, document) learned from the clicks",
                cfg.tower
            );
        }
        if let Some(limit) = cfg.feature_limit {
            if limit > n_features && cfg.tower.reads_features() {
                anyhow::bail!("key `train.feature_limit` = {limit} but the data has only {n_features} features");
            }
        }
        if cfg.bias_feature_tower && self.n_bias_features.unwrap_or(0) == 0 {
            anyhow::bail!("key `train.bias_feature_tower` is set but the stream carries no bias features");
        }
        if cfg.model.input_shape().lists() && self.rows_only {
            anyhow::bail!(
                "train.model = \"{}\" is trained on whole sessions, but these examples are rows aggregated per (query, document, position): \
                 a session's items are no longer together",
                cfg.model.name()
            );
        }
        if let Some(setting) = cfg.model.needs_labels(&cfg.sections).filter(|_| !self.labels) {
            anyhow::bail!("{setting} needs relevance labels, which only a simulation's examples carry");
        }
        Ok(())
    }
}

/// The training and validation spans of a chunk (evaluation spans are in neither: a fit never sees them).
struct Slices {
    train: Vec<usize>,
    validation: Vec<usize>,
}

impl Slices {
    fn of(ex: &Examples, cfg: &TrainConfig) -> Slices {
        let (mut train, mut validation) = (Vec::new(), Vec::new());
        for (s, span) in ex.sessions.iter().enumerate() {
            match split_of(span, cfg.holdout()) {
                Split::Training => train.push(s),
                Split::Validation => validation.push(s),
                Split::Evaluation => {}
            }
        }
        Slices { train, validation }
    }

    fn rows<'a>(ex: &'a Examples, idx: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
        idx.iter().flat_map(|&s| ex.sessions[s].start..ex.sessions[s].start + ex.sessions[s].len)
    }

    /// Impressions of spans `idx`.
    fn impressions(&self, ex: &Examples, idx: &[usize]) -> usize {
        Self::rows(ex, idx).map(|i| ex.rows[i].impressions as usize).sum()
    }

    /// Σ n·w over the rows of spans `idx`.
    fn weight(&self, ex: &Examples, idx: &[usize], weights: &[f32]) -> f64 {
        Self::rows(ex, idx).map(|i| ex.rows[i].impressions as f64 * weights[i] as f64).sum()
    }
}

/// Refuses data a model cannot be fitted on, with the reason.
pub fn check_trainable(ex: &Examples, cfg: &TrainConfig) -> anyhow::Result<()> {
    let mut survey = Survey::new();
    survey.add(ex, cfg)?;
    survey.check(cfg)
}

/// A chunk of examples with what a fit derives from it.
struct Chunk<'a> {
    ex: Cow<'a, Examples>,
    weights: Vec<f32>,
    qd_map: Vec<u32>,
    /// `tower_inputs`, for training chunks of feature towers.
    inputs: Option<Vec<f32>>,
    split: Slices,
    /// The training spans in the order the raw path takes them (reshuffled every epoch).
    order: Vec<usize>,
    span_impressions: Vec<u64>,
    /// Cumulative impressions over `split.train` (aggregated rows are drawn ∝ impressions).
    cumulative: Vec<u64>,
    train_impressions: usize,
    steps: u64,
    /// Spans are drawn ∝ their multiplicity, each entering with its mean loss: aggregated rows (one
    /// row per span, see `AGGREGATED_SPAN_ROWS`), and every list of a listwise model.
    aggregated: bool,
    /// Lists drawn per step of a listwise model (about `batch_rows` rows).
    lists_per_step: usize,
    /// Aggregated rows of a pointwise model walked once per epoch, count-weighted
    /// (`aggregated_epoch = "rows"`) instead of drawn.
    one_pass: bool,
}

impl<'a> Chunk<'a> {
    fn new(ex: Cow<'a, Examples>, cfg: &TrainConfig, trained: &Trained, for_training: bool) -> Chunk<'a> {
        // Missing propensities were checked over all chunks. A session model (DLA, MixEM, XPA) takes
        // no IPS weights: its rows weigh 1.
        let shape = trained.meta.architecture.model.input_shape();
        let weights = if shape.ips_weighted() { weights_of(&ex.rows, &cfg.applied_ips()).0 } else { vec![1f32; ex.rows.len()] };
        let qd_map = trained.qd_map(&ex);
        let inputs = (for_training && trained.meta.architecture.tower.reads_features()).then(|| tower_inputs(&ex, &trained.meta));
        let split = Slices::of(&ex, cfg);
        let span_impressions: Vec<u64> = ex.sessions.iter().map(|s| ex.rows[s.start..s.start + s.len].iter().map(|r| r.impressions as u64).sum()).collect();
        // A span's multiplicity: its rows' count (aggregated rows, counted lists) or 1 (raw sessions).
        let multiplicity = |s: usize| ex.rows.get(ex.sessions[s].start).map_or(0, |r| r.impressions as u64);
        let cumulative: Vec<u64> = split
            .train
            .iter()
            .scan(0u64, |acc, &s| {
                *acc += multiplicity(s);
                Some(*acc)
            })
            .collect();
        let train_impressions = split.impressions(&ex, &split.train);
        let aggregated = shape.lists() || aggregated_rows(&ex);
        let train_rows: usize = split.train.iter().map(|&s| ex.sessions[s].len).sum();
        let mean_list = (train_rows as f64 / split.train.len().max(1) as f64).max(1.0);
        let one_pass = walks_rows_once(cfg, shape, aggregated);
        let steps = epoch_steps(cfg, one_pass, split.train.len(), train_impressions);
        Chunk {
            weights,
            qd_map,
            inputs,
            order: split.train.clone(),
            split,
            span_impressions,
            cumulative,
            train_impressions,
            steps,
            aggregated,
            lists_per_step: (cfg.batch_rows as f64 / mean_list).ceil().max(1.0) as usize,
            one_pass,
            ex,
        }
    }
}

/// Trains on `ex`. `init` warm-starts from a model with the same architecture.
pub fn fit(ex: &Examples, cfg: &TrainConfig, init: Option<&Trained>, progress: bool) -> anyhow::Result<(Trained, FitReport)> {
    fit_chunks(ex, cfg, init, progress, None)
}

/// A training stopped by `cancel` (a service shutting down); nothing was written.
#[derive(Debug)]
pub struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("training cancelled before it finished (shutdown); nothing was written")
    }
}

impl std::error::Error for Cancelled {}

/// Σ w·ℓ over every validation row, and the model's validation loss (÷ impressions, or ÷ Σw when
/// self-normalised).
fn validation_loss(
    model: &AnyModel,
    resident: Option<&Chunk>,
    data: &dyn ExampleChunks,
    trained: &Trained,
    cfg: &TrainConfig,
    denominator: f64,
    device: &Device,
) -> anyhow::Result<f64> {
    let mut total = 0f64;
    match resident {
        // The resident chunk's tower inputs were standardised once for the fit; spilled chunks are
        // read for validation only and standardise their rows as they are batched.
        Some(c) => total += weighted_loss_sum(model, &c.ex, &c.split.validation, (&c.weights, &c.qd_map, c.inputs.as_deref()), &trained.meta, device, true),
        None => {
            for i in 0..data.chunk_count(Split::Validation) {
                let c = Chunk::new(Cow::Owned(data.load_chunk(Split::Validation, i)?), cfg, trained, false);
                total += weighted_loss_sum(model, &c.ex, &c.split.validation, (&c.weights, &c.qd_map, None), &trained.meta, device, true);
            }
        }
    }
    Ok(total / denominator.max(f64::MIN_POSITIVE))
}

/// burn's CPU backends keep one random generator per process: a fit seeds it, and burn draws each
/// initial parameter from it at the parameter's first use (the first validation loss, the first
/// step). Fits on several threads (an experiment's `jobs`) hold this lock from the seed to the end of
/// their first optimizer step, so no fit draws after another's seed and each fit starts from its own
/// seed alone, with its parameters drawn in the order a fit alone draws them. (Training draws nothing
/// else from it: batches come from the fit's own generator, dropout is taken in expectation.)
static SEED_AND_INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Trains on examples in memory or in chunks on disk (see `chunks`): every epoch visits the
/// training chunks in a shuffled order, each with its share of the steps (∝ its impressions), and
/// scores every validation chunk. In memory the examples are one chunk, read once. Checks `cancel`
/// before every batch and returns `Cancelled` once it is set (nothing is written).
pub fn fit_chunks(
    data: &dyn ExampleChunks,
    cfg: &TrainConfig,
    init: Option<&Trained>,
    progress: bool,
    cancel: Option<&std::sync::atomic::AtomicBool>,
) -> anyhow::Result<(Trained, FitReport)> {
    let started = Instant::now();
    let (survey, pairs) = survey_data(data, cfg)?;
    let arch = cfg.architecture();
    let device = cfg.backend.autodiff_device()?;
    let infer_device = cfg.backend.device()?;
    let seeded = SEED_AND_INIT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    device.seed(cfg.seed);
    let (mut trained, warm) = initial_model(init, cfg, &survey, &infer_device)?;
    if arch.tower.pair_embedding() {
        trained = grow_vocabulary(trained, pairs, &infer_device);
    }
    // `[train] position_bias = "swap_pairs"`: a feature tower's θ from the swap pairs before the tower
    // trains, then held fixed; a warm start keeps its parent's θ fixed. Where the swap pairs leave a
    // position not estimable, θ trains with the tower as `joint` does.
    let swap_pairs =
        cfg.position_bias == PositionBiasSource::SwapPairs && cfg.refit_position_bias && arch.tower.reads_features() && trained.model.has_position_logits();
    let mut swap_refit = None;
    if swap_pairs && !warm {
        let mut estimated = trained.clone();
        if let Some(r) = super::refit::refit_position_bias(&mut estimated, data, cfg)?.filter(|r| r.method == RefitMethod::SwapPairs) {
            trained = estimated;
            swap_refit = Some(r);
        }
    }
    let theta_fixed = swap_pairs && (warm || swap_refit.is_some()) && trained.model.freeze_position_logits();
    let val_denominator = if cfg.ips.self_normalize { survey.validation_weight } else { survey.validation_impressions as f64 };
    let mut run = Run {
        data,
        cfg,
        resident: data.in_memory().map(|ex| Chunk::new(Cow::Borrowed(ex), cfg, &trained, true)),
        trained: &trained,
        device,
        infer_device: infer_device.clone(),
        shape: arch.model.input_shape(),
        objective: cfg.sections.clone(),
        rng: ChaCha8Rng::seed_from_u64(cfg.seed),
        // Its ETA assumes every epoch runs; early stopping ends sooner.
        bar: progress.then(|| ultr_core::progress::bar(Some(survey.steps * cfg.max_epochs as u64), "steps")),
        cancel,
        val_denominator,
        train_impressions: survey.train_impressions,
        whole_batch: None,
        seeded: Some(seeded),
    };
    let (best, epochs, stop) = run.epochs()?;
    if let Some(bar) = run.bar.take() {
        bar.finish_and_clear();
    }
    drop(run);
    trained.model = best.2;
    // A warm start trains on the windows its parent has not seen only: refit there, θ would rest on
    // that slice alone. It starts from its parent's refit θ instead, which its epochs move little.
    // θ from the swap pairs once more: the pairwise conditional estimate does not read r(x), so
    // θ_k − θ_1 stays as training held it and only the common level moves, to match the trained
    // tower's predicted clicks to the observed ones.
    let position_refit = if theta_fixed && !warm && stop != StopReason::Diverged {
        let mut again = trained.clone();
        match (swap_refit, super::refit::refit_position_bias(&mut again, data, cfg)?) {
            (Some(first), Some(second)) if second.method == RefitMethod::SwapPairs => {
                trained = again;
                // `before`: θ as training held it.
                Some(PositionRefit { before: first.after, ..second })
            }
            (first, _) => first,
        }
    } else if theta_fixed {
        swap_refit
    } else if cfg.refit_position_bias && stop != StopReason::Diverged && !warm {
        super::refit::refit_position_bias(&mut trained, data, cfg)?
    } else {
        None
    };
    let logged_order_prior =
        if stop != StopReason::Diverged && !warm { super::logged_order_prior::fit_logged_order_prior(&mut trained, data, cfg)? } else { None };
    let logged_order_combination = if stop != StopReason::Diverged { super::logged_order_combination::fit_combination(&mut trained, data, cfg)? } else { None };
    let converged = converged(stop, &epochs, cfg.patience);
    // Without early stopping the epochs are the caller's (the converged fit's blocks, bootstrap
    // replicates): no warning for running them all.
    if !converged && stop == StopReason::MaxEpochs && cfg.early_stopping {
        tracing::warn!(
            epochs = epochs.len(),
            "training stopped at max_epochs = {} with the validation loss still falling: not converged (raise [train] max_epochs)",
            cfg.max_epochs
        );
    }
    let report = FitReport {
        epochs,
        best_epoch: best.1,
        best_validation_loss: best.0,
        stop,
        train_sessions: survey.train_sessions,
        validation_sessions: survey.validation_sessions,
        aggregated_rows: survey.rows_only,
        train_impressions: survey.train_impressions,
        validation_impressions: survey.validation_impressions,
        max_position: survey.positions.last().copied().unwrap_or(0),
        train_chunks: data.chunk_count(Split::Training),
        validation_chunks: data.chunk_count(Split::Validation),
        weights: survey.weights.report(&cfg.applied_ips(), cfg.ips_not_applied()),
        warm_started: warm,
        seconds: started.elapsed().as_secs_f64(),
        converged,
        position_refit,
        logged_order_prior,
        logged_order_combination,
    };
    Ok((trained, report))
}

/// One pass over every chunk before training: the checks, the normaliser's sums, the weights, and
/// (for the embedding tower) the query-document pairs.
fn survey_data(data: &dyn ExampleChunks, cfg: &TrainConfig) -> anyhow::Result<(Survey, Vec<(String, String)>)> {
    let mut survey = Survey::new();
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut survey_chunk = |ex: &Examples| -> anyhow::Result<()> {
        survey.add(ex, cfg)?;
        if cfg.tower.pair_embedding() {
            pairs.extend(ex.qd_keys.iter().cloned());
        }
        Ok(())
    };
    match data.in_memory() {
        Some(ex) => survey_chunk(ex)?,
        None => {
            for split in [Split::Training, Split::Validation] {
                for i in 0..data.chunk_count(split) {
                    survey_chunk(&data.load_chunk(split, i)?)?;
                }
            }
        }
    }
    survey.check(cfg)?;
    survey.weights.check(&cfg.applied_ips())?;
    if survey.train_sessions == 0 || survey.validation_sessions == 0 {
        anyhow::bail!(
            "{} sessions cannot be split into training and validation (train.validation_fraction = {})",
            survey.train_sessions + survey.validation_sessions,
            cfg.validation_fraction
        );
    }
    Ok((survey, pairs))
}

/// The model training starts from: `init` (a warm start, checked against the config and the data)
/// or a fresh one whose normaliser is fitted on the surveyed training rows. True for a warm start.
fn initial_model(init: Option<&Trained>, cfg: &TrainConfig, survey: &Survey, infer_device: &Device) -> anyhow::Result<(Trained, bool)> {
    let arch = cfg.architecture();
    let (data_features, n_bias_features) = (survey.n_features.unwrap_or(0), survey.n_bias_features.unwrap_or(0));
    if let Some(t) = init {
        t.check_warm_start(&arch, "the current model")?;
        t.check_compatible_with(data_features, n_bias_features)?;
        return Ok((t.clone(), true));
    }
    let n_features = if arch.tower.pair_embedding() { 0 } else { cfg.feature_limit.unwrap_or(data_features) };
    let normalizer = arch
        .tower
        .reads_features()
        .then(|| Normalizer::from_sums(&survey.feature_sum[..n_features], &survey.feature_sq[..n_features], survey.train_impressions as u64));
    // The caller knows the stream's feature schema (train_from_state sets it).
    let meta = ModelMeta { architecture: arch.clone(), n_features, n_bias_features, normalizer, feature_schema: None, logged_order_combination: None };
    let vocabulary = vec![(String::new(), String::new())]; // index 0: unseen pair
    Ok((Trained { model: AnyModel::new(&arch, n_features, n_bias_features, 1, infer_device), meta, vocabulary }, false))
}

/// Adds the pairs the model has not seen to its vocabulary, and grows γ to match (new pairs at 0).
fn grow_vocabulary(mut trained: Trained, pairs: Vec<(String, String)>, infer_device: &Device) -> Trained {
    let mut known: std::collections::HashSet<(String, String)> = trained.vocabulary.iter().cloned().collect();
    for key in pairs {
        if known.insert(key.clone()) {
            trained.vocabulary.push(key);
        }
    }
    let size = trained.vocabulary.len();
    trained.model = trained.model.grow_embedding(size, infer_device);
    trained
}

/// The best epoch's validation loss, its number, and its model.
type Best = (f64, usize, AnyModel);

/// The training loop's state: what every epoch reads, the shared random stream, the progress bar.
struct Run<'a> {
    data: &'a dyn ExampleChunks,
    cfg: &'a TrainConfig,
    /// The examples when they fit in memory (one chunk, prepared once).
    resident: Option<Chunk<'a>>,
    trained: &'a Trained,
    device: Device,
    infer_device: Device,
    shape: InputShape,
    objective: crate::models::ModelSections,
    rng: ChaCha8Rng,
    bar: Option<indicatif::ProgressBar>,
    cancel: Option<&'a std::sync::atomic::AtomicBool>,
    val_denominator: f64,
    train_impressions: usize,
    /// The last batch of the resident chunk that held every training span, with its tensors and
    /// impressions: full-batch training (the converged estimator, its bootstrap replicates) takes
    /// the same spans in the same order every step, so they are laid out once, not once a step.
    whole_batch: Option<(Vec<usize>, BatchTensors, usize)>,
    /// `SEED_AND_INIT`, held until the first optimizer step has drawn every parameter the objective uses.
    seeded: Option<std::sync::MutexGuard<'static, ()>>,
}

impl Run<'_> {
    /// Epochs until early stopping, divergence or `max_epochs`: the best epoch, every epoch's
    /// statistics, and why training stopped.
    fn epochs(&mut self) -> anyhow::Result<(Best, Vec<EpochStats>, StopReason)> {
        let cfg = self.cfg;
        let max_positions = self.trained.meta.architecture.max_positions;
        let mut model = self.trained.model.clone().train();
        let mut optim = AdamWConfig::new().with_weight_decay(cfg.weight_decay as f32).with_epsilon(1e-8).init();
        let mut best: Best = (self.validation_loss(&model.valid())?, 0usize, model.valid());
        let mut epochs = Vec::new();
        for epoch in 1..=cfg.max_epochs {
            let t0 = Instant::now();
            let (trained_model, train_total) = self.train_epoch(model, &mut optim, epoch)?;
            model = trained_model;
            let Some(train_total) = train_total else { return Ok((best, epochs, StopReason::Diverged)) };
            let seconds = t0.elapsed().as_secs_f64();
            let current = model.valid();
            let val = self.validation_loss(&current)?;
            let train_loss = train_total / self.train_impressions as f64;
            epochs.push(EpochStats { epoch, train_loss, validation_loss: val, seconds, impressions_per_second: self.train_impressions as f64 / seconds });
            if let Some(bar) = &self.bar {
                bar.set_message(format!("epoch {epoch}: train {train_loss:.5} val {val:.5}"));
            }
            if !val.is_finite() || current.position_bias(max_positions).iter().any(|t| !t.is_finite()) {
                return Ok((best, epochs, StopReason::Diverged));
            }
            if !cfg.early_stopping {
                best = (val, epoch, current); // the last epoch, whatever its validation loss
            } else if val < best.0 {
                best = (val, epoch, current);
            } else if epoch - best.1 >= cfg.patience {
                return Ok((best, epochs, StopReason::EarlyStopping));
            }
        }
        Ok((best, epochs, StopReason::MaxEpochs))
    }

    /// One epoch's optimizer steps: the model after them and the summed training loss, or `None`
    /// for the loss when a step's loss was not finite (the model diverged).
    fn train_epoch(&mut self, mut model: AnyModel, optim: &mut burn::optim::ModuleOptimizer, epoch: usize) -> anyhow::Result<(AnyModel, Option<f64>)> {
        let mut train_total = 0f64;
        let (chunk_order, visits) = self.chunk_order();
        let mut resident = self.resident.take();
        let resident_chunk = resident.is_some();
        for &(c, round) in &chunk_order {
            let mut loaded;
            let chunk = match resident.as_mut() {
                Some(r) => r,
                None => {
                    loaded = Chunk::new(Cow::Owned(self.data.load_chunk(Split::Training, c)?), self.cfg, self.trained, true);
                    &mut loaded
                }
            };
            for batch in &self.visit_batches(chunk, c, round, visits, epoch) {
                if self.cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
                    self.resident = resident;
                    return Err(Cancelled.into());
                }
                let (loss, counted) = self.batch_loss(&model, chunk, batch, resident_chunk);
                let value = loss.clone().into_scalar::<f32>() as f64;
                if !value.is_finite() {
                    self.resident = resident;
                    return Ok((model, None));
                }
                train_total += value * counted;
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                model = optim.step(self.cfg.learning_rate, model, grads);
                self.seeded = None;
                if let Some(bar) = &self.bar {
                    bar.inc(1);
                }
            }
        }
        self.resident = resident;
        Ok((model, Some(train_total)))
    }

    /// The epoch's visits: `(chunk, round)` for `chunk_visits` rounds over every chunk on disk, each
    /// round in a shuffled order, so the model never trains long on one chunk.
    fn chunk_order(&mut self) -> (Vec<(usize, u64)>, u64) {
        let chunks = self.data.chunk_count(Split::Training);
        let visits = if chunks > 1 { self.cfg.chunk_visits.max(1) as u64 } else { 1 };
        let mut chunk_order: Vec<(usize, u64)> = Vec::new();
        for round in 0..visits {
            let mut order: Vec<usize> = (0..chunks).collect();
            if chunks > 1 {
                order.shuffle(&mut self.rng);
            }
            chunk_order.extend(order.into_iter().map(|c| (c, round)));
        }
        (chunk_order, visits)
    }

    /// The batches of one visit to a chunk. Raw sessions: shuffled whole sessions until a batch
    /// holds `batch_impressions`. Aggregated rows: the visit's share of the steps, each drawing
    /// `batch_rows` rows ∝ impressions, each entering with its mean loss — as many steps and as
    /// many distinct keys per step as the raw path, on fewer rows. One pass: its share of the rows.
    fn visit_batches(&mut self, chunk: &mut Chunk, c: usize, round: u64, visits: u64, epoch: usize) -> Vec<Vec<usize>> {
        let cfg = self.cfg;
        let steps = chunk.steps * (round + 1) / visits - chunk.steps * round / visits;
        // A one-pass visit takes its share of the rows whatever the step count rounds to.
        if steps == 0 && !chunk.one_pass {
            return Vec::new();
        }
        if round == 0 && !chunk.one_pass {
            chunk.order.shuffle(&mut self.rng);
        }
        let per_step = if self.shape.lists() { chunk.lists_per_step } else { cfg.batch_rows };
        if chunk.one_pass {
            one_pass_batches(&chunk.split.train, cfg.seed, epoch, c, round, visits, per_step)
        } else if chunk.aggregated {
            (0..steps).map(|_| draw_spans(&chunk.cumulative, &chunk.split.train, per_step, &mut self.rng)).collect()
        } else if round > 0 {
            Vec::new() // raw sessions are never spilled; their one round takes every batch
        } else {
            batches(&chunk.order, &chunk.span_impressions, cfg.batch_impressions as u64).into_iter().map(<[usize]>::to_vec).collect()
        }
    }

    /// A batch's training objective, and the impressions its loss value stands for in the epoch's
    /// training loss.
    /// `resident`: `chunk` is the examples held in memory for the whole fit, so a batch of all its
    /// training spans may be kept for the next step.
    fn batch_loss(&mut self, model: &AnyModel, chunk: &Chunk, batch: &[usize], resident: bool) -> (burn::tensor::Tensor<1>, f64) {
        let ex: &Examples = &chunk.ex;
        let reuse = resident && self.whole_batch.as_ref().is_some_and(|(spans, _, _)| spans.as_slice() == batch);
        if !reuse {
            let built = build_batch(
                ex,
                batch,
                &chunk.weights,
                &chunk.qd_map,
                &self.trained.meta,
                &self.device,
                BatchSpec { shape: self.shape, count_weighted: !chunk.aggregated || chunk.one_pass, inputs: chunk.inputs.as_deref() },
            );
            self.whole_batch = None;
            if resident && batch.len() == chunk.split.train.len() {
                self.whole_batch = Some((batch.to_vec(), built.0, built.1));
            } else {
                return self.batch_objective(model, chunk, batch, &built.0, built.1);
            }
        }
        let (_, b, n) = self.whole_batch.as_ref().expect("kept above");
        self.batch_objective(model, chunk, batch, b, *n)
    }

    /// The objective of batch `batch` of `chunk`, laid out as `b` (standing for `n` impressions).
    fn batch_objective(&self, model: &AnyModel, chunk: &Chunk, batch: &[usize], b: &BatchTensors, n: usize) -> (burn::tensor::Tensor<1>, f64) {
        let ex: &Examples = &chunk.ex;
        // Count-weighted rows (raw, or aggregated in one pass) are normalised like impressions.
        let drawn_rows = chunk.aggregated && !chunk.one_pass;
        let denominator = match (drawn_rows, self.cfg.ips.self_normalize) {
            (false, true) => chunk.split.weight(ex, batch, &chunk.weights),
            (false, false) => n as f64,
            (true, true) => batch.iter().map(|&s| chunk.weights[ex.sessions[s].start] as f64).sum(),
            (true, false) => batch.len() as f64,
        };
        let counted = if drawn_rows { chunk.train_impressions as f64 / chunk.steps as f64 } else { n as f64 };
        (model.objective(b, denominator, &self.objective), counted)
    }

    fn validation_loss(&self, model: &AnyModel) -> anyhow::Result<f64> {
        validation_loss(model, self.resident.as_ref(), self.data, self.trained, self.cfg, self.val_denominator, &self.infer_device)
    }
}

impl FitReport {
    /// The summary's line of what was trained: units (sessions, or aggregated rows), impressions,
    /// how it started and stopped.
    pub fn trained_line(&self) -> String {
        let unit = if self.aggregated_rows { "aggregated rows" } else { "sessions" };
        format!(
            "  {} {unit} / {} impressions trained, {} / {} validation; {}; {} epochs ({:?}, best {}), {:.1}s\n",
            self.train_sessions,
            self.train_impressions,
            self.validation_sessions,
            self.validation_impressions,
            if self.warm_started { "warm start" } else { "cold start" },
            self.epochs.len(),
            self.stop,
            self.best_epoch,
            self.seconds
        )
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    fn epochs_with(losses: &[f64]) -> Vec<EpochStats> {
        losses
            .iter()
            .enumerate()
            .map(|(i, l)| EpochStats { epoch: i + 1, train_loss: *l, validation_loss: *l, seconds: 1.0, impressions_per_second: 1.0 })
            .collect()
    }

    pub fn a_fit_out_of_epochs_with_its_loss_still_falling_has_not_converged() {
        let falling = epochs_with(&[0.9, 0.8, 0.7, 0.65, 0.6]);
        assert!(!converged(StopReason::MaxEpochs, &falling, 3));
        // Its lowest loss three epochs before the end: it had stopped improving.
        let flat = epochs_with(&[0.9, 0.6, 0.61, 0.62, 0.63]);
        assert!(converged(StopReason::MaxEpochs, &flat, 3));
        assert!(converged(StopReason::EarlyStopping, &falling, 3));
        assert!(!converged(StopReason::Diverged, &flat, 3));
    }
}
