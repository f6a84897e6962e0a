//! The training loop: AdamW over batches of whole sessions, validation on a hash-chosen slice,
//! early stopping with the best epoch kept, and a refusal to return a model that went NaN.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::config::{AggregatedEpoch, Architecture, TowerKind, TrainConfig};
use super::data::{split_of, Examples, Split};
use super::models::{BatchTensors, AnyModel, Lists};
use super::chunks::ExampleChunks;
use super::weights::{weights_of, WeightReport, WeightTotals};

/// Standardisation of the tower's input features, fitted on the first training run and kept by warm
/// starts (so a checkpoint's weights always mean the same thing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Normalizer {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl Normalizer {
    /// From impression-weighted sums of each feature and its square over `n` impressions.
    fn from_sums(sum: &[f64], sq: &[f64], n: u64) -> Normalizer {
        let n = n.max(1) as f64;
        let mean: Vec<f32> = sum.iter().map(|s| (s / n) as f32).collect();
        let std = sq
            .iter()
            .zip(sum)
            .map(|(q, s)| {
                let var = (q / n - (s / n) * (s / n)).max(0.0);
                if var.sqrt() > 1e-6 {
                    var.sqrt() as f32
                } else {
                    1.0
                }
            })
            .collect();
        Normalizer { mean, std }
    }

    pub fn apply(&self, x: &[f32], out: &mut Vec<f32>) {
        out.extend(x.iter().zip(self.mean.iter().zip(&self.std)).map(|(v, (m, s))| (v - m) / s));
    }
}

/// Everything besides the parameters that a model needs to score (saved next to them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelMeta {
    pub architecture: Architecture,
    /// Features the tower reads (after `feature_limit`).
    pub n_features: usize,
    pub n_bias_features: usize,
    pub normalizer: Option<Normalizer>,
    /// The stream's `[decode.feature_schema]` when the model was trained (the tower reads its
    /// first `n_features` features).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_schema: Option<ultr_core::session::decode::FeatureSchema>,
}

/// A model with its meta and (for the embedding tower) vocabulary; index 0 is "unseen pair" (γ = 0).
#[derive(Debug, Clone)]
pub struct Trained {
    pub model: AnyModel,
    pub meta: ModelMeta,
    pub vocabulary: Vec<(String, String)>,
}

impl Trained {
    fn vocabulary_index(&self) -> HashMap<(&str, &str), u32> {
        self.vocabulary.iter().enumerate().skip(1).map(|(i, (q, d))| ((q.as_str(), d.as_str()), i as u32)).collect()
    }

    /// For each of `ex`'s query-document pairs, its vocabulary index (0 when unseen).
    pub fn qd_map(&self, ex: &Examples) -> Vec<u32> {
        let index = self.vocabulary_index();
        ex.qd_keys.iter().map(|(q, d)| index.get(&(q.as_str(), d.as_str())).copied().unwrap_or(0)).collect()
    }

    /// Checks that this model can read `ex` (feature counts), naming what differs.
    pub fn check_compatible(&self, ex: &Examples) -> anyhow::Result<()> {
        self.check_compatible_with(ex.n_features, ex.n_bias_features)
    }

    /// `check_compatible` for data with these feature counts.
    /// Refuses a stream whose `[decode.feature_schema]` differs from the one the model was trained on.
    pub fn check_feature_schema(&self, stream: Option<&ultr_core::session::decode::FeatureSchema>) -> anyhow::Result<()> {
        ultr_core::session::decode::FeatureSchema::check_compatible(self.meta.feature_schema.as_ref(), stream).map_err(anyhow::Error::msg)
    }

    pub fn check_compatible_with(&self, n_features: usize, n_bias_features: usize) -> anyhow::Result<()> {
        let a = &self.meta.architecture;
        if a.tower != TowerKind::Embedding && n_features < self.meta.n_features {
            anyhow::bail!("the model reads {} features but the data has {}", self.meta.n_features, n_features);
        }
        if a.bias_feature_tower && n_bias_features != self.meta.n_bias_features {
            anyhow::bail!("the model reads {} bias features but the data has {}", self.meta.n_bias_features, n_bias_features);
        }
        Ok(())
    }

    /// Applies `output` to every row of `ex` in chunks of sessions (inference device), in row order.
    /// A model whose logits need the session (XPA) sees each span as one list.
    fn per_row(&self, ex: &Examples, device: &Device, output: impl Fn(&AnyModel, &BatchTensors) -> Tensor<1>) -> Vec<f32> {
        let qd_map = self.qd_map(ex);
        let ones = vec![1f32; ex.rows.len()];
        let sessions: Vec<usize> = (0..ex.sessions.len()).collect();
        let as_lists = self.meta.architecture.model.session_logits();
        let mut out = vec![0f32; ex.rows.len()];
        let mut slot_rows: Vec<usize> = Vec::new();
        for chunk in sessions.chunks(EVAL_SESSIONS) {
            let (b, _) = build_batch(ex, chunk, &ones, &qd_map, &self.meta, None, device, true, as_lists);
            let values = output(&self.model, &b).into_data().try_to_vec::<f32>().expect("f32 outputs");
            // The row behind each output slot: spans in order, by position within a list, then padding.
            slot_rows.clear();
            let width = b.lists.as_ref().map_or(0, |l| l.width);
            for &s in chunk {
                let span = ex.sessions[s];
                let first = slot_rows.len();
                slot_rows.extend(span.start..span.start + span.len);
                if as_lists {
                    slot_rows[first..].sort_by_key(|&i| ex.rows[i].position);
                    slot_rows.extend(std::iter::repeat_n(usize::MAX, width - span.len));
                }
            }
            for (slot, &row) in slot_rows.iter().enumerate() {
                if row != usize::MAX {
                    out[row] = values[slot];
                }
            }
        }
        out
    }

    /// Click logits of every row of `ex`, in row order.
    pub fn logits(&self, ex: &Examples, device: &Device) -> Vec<f32> {
        self.per_row(ex, device, |m, b| m.click_logits(b))
    }

    /// Relevance logits r(x) (or γ for embeddings) of every row of `ex`, in row order.
    pub fn relevance_of_rows(&self, ex: &Examples, device: &Device) -> Vec<f32> {
        self.per_row(ex, device, |m, b| m.relevance(b))
    }

    /// θ_k − θ₁ (or the model's equivalent, see `AnyModel::position_bias`) for k = 1..=K.
    pub fn position_bias(&self) -> Vec<f64> {
        self.model.position_bias(self.meta.architecture.max_positions)
    }

    /// Weighted BCE (`sum w·ℓ / N`, or `/ Σw` when self-normalised) of `ex` under this model.
    pub fn loss(&self, ex: &Examples, weights: &[f32], self_normalize: bool, device: &Device) -> f64 {
        self.loss_sums(ex, weights, device).loss(self_normalize)
    }

    /// The sums behind `loss`, which add up over chunks of the data.
    pub fn loss_sums(&self, ex: &Examples, weights: &[f32], device: &Device) -> LossSums {
        let sessions: Vec<usize> = (0..ex.sessions.len()).collect();
        LossSums {
            weighted_loss: weighted_loss_sum(&self.model, ex, &sessions, weights, &self.qd_map(ex), &self.meta, device, false),
            impressions: ex.impressions() as f64,
            weight: ex.rows.iter().zip(weights).map(|(r, w)| r.impressions as f64 * *w as f64).sum::<f64>(),
        }
    }
}

/// Σ w·ℓ, impressions and Σ n·w of some rows: `loss` of their union is that of the summed parts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossSums {
    pub weighted_loss: f64,
    pub impressions: f64,
    pub weight: f64,
}

impl LossSums {
    pub fn add(&mut self, o: LossSums) {
        self.weighted_loss += o.weighted_loss;
        self.impressions += o.impressions;
        self.weight += o.weight;
    }

    /// Σ w·ℓ ÷ N, or ÷ Σw when self-normalised.
    pub fn loss(&self, self_normalize: bool) -> f64 {
        self.weighted_loss / if self_normalize { self.weight } else { self.impressions }.max(f64::MIN_POSITIVE)
    }
}

/// Sessions per chunk when scoring without gradients.
const EVAL_SESSIONS: usize = 4096;

/// Σ w·ℓ over the rows of sessions `chosen` (no gradients): the click BCE, or with `fit_loss` the loss
/// the model's early stopping watches (`AnyModel::fit_loss_sum`).
#[allow(clippy::too_many_arguments)]
fn weighted_loss_sum(model: &AnyModel, ex: &Examples, chosen: &[usize], weights: &[f32], qd_map: &[u32], meta: &ModelMeta, device: &Device, fit_loss: bool) -> f64 {
    let mut total = 0f64;
    let model_kind = meta.architecture.model;
    let listwise = (fit_loss && model_kind.listwise()) || model_kind.session_logits();
    for chunk in chosen.chunks(EVAL_SESSIONS) {
        let (b, _) = build_batch(ex, chunk, weights, qd_map, meta, None, device, true, listwise);
        let sum = if fit_loss { model.fit_loss_sum(&b) } else { model.click_loss_sum(&b) };
        total += sum.into_scalar::<f32>() as f64;
    }
    total
}

/// Cuts `order` into consecutive batches holding at least `target` impressions each (the last may
/// hold fewer); a span is never split.
pub fn batches<'a>(order: &'a [usize], span_impressions: &[u64], target: u64) -> Vec<&'a [usize]> {
    let mut out = Vec::new();
    let (mut start, mut held) = (0, 0u64);
    for (i, &s) in order.iter().enumerate() {
        held += span_impressions[s];
        if held >= target {
            out.push(&order[start..=i]);
            (start, held) = (i + 1, 0);
        }
    }
    if start < order.len() {
        out.push(&order[start..]);
    }
    out
}


/// Builds the device tensors for sessions `chosen` of `ex` (rows of each session kept together).
/// A row of `n` impressions and `c` clicks enters the count-weighted BCE as target c/n with weight
/// w·n: n·BCE(z, c/n) = −c·log σ(z) − (n−c)·log(1−σ(z)), exactly the raw impressions' summed loss.
/// Returns the tensors and the impressions they stand for.
pub fn make_batch(ex: &Examples, chosen: &[usize], weights: &[f32], qd_map: &[u32], meta: &ModelMeta, device: &Device) -> (BatchTensors, usize) {
    build_batch(ex, chosen, weights, qd_map, meta, None, device, true, meta.architecture.model.listwise())
}

/// Every distinct feature row of `ex` as the tower reads it (first `n_features`, standardised),
/// computed once per fit instead of once per row and step.
fn tower_inputs(ex: &Examples, meta: &ModelMeta) -> Vec<f32> {
    let mut out = Vec::with_capacity(ex.n_docs() * meta.n_features);
    for doc in 0..ex.n_docs() as u32 {
        push_tower_input(ex, meta, doc, &mut out);
    }
    out
}

/// Appends feature row `doc` as the tower reads it (first `n_features`, standardised).
fn push_tower_input(ex: &Examples, meta: &ModelMeta, doc: u32, out: &mut Vec<f32>) {
    let x = &ex.doc_features(doc)[..meta.n_features];
    match &meta.normalizer {
        Some(norm) => norm.apply(x, out),
        None => out.extend_from_slice(x),
    }
}

/// Draws `rows` aggregated spans with probability ∝ their impressions (with replacement), the
/// same distribution as drawing impressions uniformly from the raw log. The draws are sorted and
/// located by one forward galloping search over the cumulative impressions, so a step reads the
/// table (and then the rows) in memory order instead of `rows` cold binary searches; a batch's loss
/// does not depend on its row order.
fn draw_spans(cumulative: &[u64], spans: &[usize], rows: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let total = *cumulative.last().unwrap_or(&0);
    let mut draws: Vec<u64> = (0..rows).map(|_| rng.random_range(0..total.max(1))).collect();
    draws.sort_unstable();
    let mut at = 0usize;
    draws
        .into_iter()
        .map(|u| {
            // The first index with cumulative > u, searched from the previous draw's index.
            let mut step = 1;
            while at + step < cumulative.len() && cumulative[at + step] <= u {
                step *= 2;
            }
            let hi = (at + step).min(cumulative.len());
            at += cumulative[at..hi].partition_point(|&c| c <= u);
            spans[at.min(spans.len() - 1)]
        })
        .collect()
}

/// Every span is one aggregated row (rows stored with their split), not a raw session.
fn aggregated_rows(ex: &Examples) -> bool {
    ex.sessions.iter().all(|s| s.split.is_some() && s.len == 1)
}

/// An epoch walks each aggregated row of a pointwise model once (`aggregated_epoch = "rows"`)
/// instead of drawing rows ∝ impressions.
fn walks_rows_once(cfg: &TrainConfig, listwise: bool, aggregated: bool) -> bool {
    aggregated && !listwise && cfg.aggregated_epoch == AggregatedEpoch::Rows
}

/// Optimizer steps in an epoch over `spans` training spans holding `impressions`.
fn epoch_steps(cfg: &TrainConfig, one_pass: bool, spans: usize, impressions: usize) -> u64 {
    if one_pass {
        spans.div_ceil(cfg.batch_rows) as u64
    } else {
        (impressions as u64).div_ceil(cfg.batch_impressions as u64)
    }
}

/// `aggregated_epoch = "rows"`: visit `round` of `visits` in an epoch's one pass over a chunk's
/// training rows, `per_step` rows per batch. The permutation depends on (seed, epoch, chunk) alone:
/// a spilled chunk is read afresh for every visit, and its visits must split one permutation for the
/// epoch to take every row exactly once.
fn one_pass_batches(train: &[usize], seed: u64, epoch: usize, chunk: usize, round: u64, visits: u64, per_step: usize) -> Vec<Vec<usize>> {
    let mut order = train.to_vec();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(((epoch as u64) << 32) | chunk as u64);
    order.shuffle(&mut rng);
    let len = order.len() as u64;
    order[(len * round / visits) as usize..(len * (round + 1) / visits) as usize].chunks(per_step.max(1)).map(<[usize]>::to_vec).collect()
}

/// `count_weighted`: a row's weight is w·n (its impressions' summed loss); otherwise w (its
/// impressions' mean loss, for rows drawn ∝ n). `inputs`: `tower_inputs`, when computed. `listwise`:
/// every span becomes a list of `width` slots (its rows by position, then padding with weight 0).
#[allow(clippy::too_many_arguments)]
fn build_batch(
    ex: &Examples,
    chosen: &[usize],
    weights: &[f32],
    qd_map: &[u32],
    meta: &ModelMeta,
    inputs: Option<&[f32]>,
    device: &Device,
    count_weighted: bool,
    listwise: bool,
) -> (BatchTensors, usize) {
    let width = if listwise { chosen.iter().map(|&s| ex.sessions[s].len).max().unwrap_or(1).max(1) } else { 0 };
    let n: usize = if listwise { chosen.len() * width } else { chosen.iter().map(|&s| ex.sessions[s].len).sum() };
    let mut impressions = 0usize;
    let mut positions = Vec::with_capacity(n);
    let mut clicks = Vec::with_capacity(n);
    let mut w = Vec::with_capacity(n);
    let mut mask = Vec::with_capacity(if listwise { n } else { 0 });
    let embedding = meta.architecture.tower == TowerKind::Embedding;
    let with_labels = !ex.doc_labels.is_empty();
    let f = meta.n_features;
    let z = ex.n_bias_features;
    let bias_tower = meta.architecture.bias_feature_tower;
    let mut qd = Vec::with_capacity(if embedding { n } else { 0 });
    let mut features = Vec::with_capacity(if embedding { 0 } else { n * f });
    let mut bias = Vec::with_capacity(if bias_tower { n * z } else { 0 });
    let mut labels = Vec::with_capacity(if with_labels { n } else { 0 });
    let mut order: Vec<usize> = Vec::new();
    for &s in chosen {
        let span = ex.sessions[s];
        order.clear();
        order.extend(span.start..span.start + span.len);
        if listwise {
            order.sort_by_key(|&i| ex.rows[i].position);
        }
        for &i in &order {
            let r = &ex.rows[i];
            positions.push((r.position - 1) as i64);
            let count = r.impressions.max(1);
            impressions += count as usize;
            clicks.push(r.clicks as f32 / count as f32);
            w.push(if count_weighted { weights[i] * count as f32 } else { weights[i] });
            if embedding {
                qd.push(qd_map[r.qd as usize] as i64);
            } else if let Some(inputs) = inputs {
                features.extend_from_slice(&inputs[r.doc as usize * f..(r.doc as usize + 1) * f]);
            } else {
                push_tower_input(ex, meta, r.doc, &mut features);
            }
            if bias_tower {
                bias.extend_from_slice(&ex.bias[i * z..(i + 1) * z]);
            }
            if with_labels {
                labels.push(ex.doc_labels[r.doc as usize]);
            }
        }
        if listwise {
            mask.extend(std::iter::repeat_n(1f32, span.len));
            for _ in span.len..width {
                positions.push(0);
                clicks.push(0.0);
                w.push(0.0);
                mask.push(0.0);
                if embedding {
                    qd.push(0);
                } else {
                    features.extend(std::iter::repeat_n(0f32, f));
                }
                if bias_tower {
                    bias.extend(std::iter::repeat_n(0f32, z));
                }
                if with_labels {
                    labels.push(0.0);
                }
            }
        }
    }
    let batch = BatchTensors {
        positions: Tensor::<1, Int>::from_data(TensorData::new(positions, [n]), device),
        qd: embedding.then(|| Tensor::<1, Int>::from_data(TensorData::new(qd, [n]), device)),
        features: (!embedding).then(|| Tensor::<2>::from_data(TensorData::new(features, [n, f]), device)),
        bias_features: bias_tower.then(|| Tensor::<2>::from_data(TensorData::new(bias, [n, z]), device)),
        clicks: Tensor::<1>::from_data(TensorData::new(clicks, [n]), device),
        weights: Tensor::<1>::from_data(TensorData::new(w, [n]), device),
        labels: with_labels.then(|| Tensor::<1>::from_data(TensorData::new(labels, [n]), device)),
        lists: listwise.then(|| Lists { count: chosen.len(), width, mask: Tensor::<2>::from_data(TensorData::new(mask, [chosen.len(), width]), device) }),
    };
    (batch, impressions)
}

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
    /// The examples were aggregated rows (`[train] aggregate`), so the unit counts are rows.
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
        let (w, totals) = weights_of(&ex.rows, &cfg.ips);
        self.weights.merge(&totals);
        self.train_sessions += split.train.len();
        self.validation_sessions += split.validation.len();
        let train = split.impressions(ex, &split.train);
        self.train_impressions += train;
        self.validation_impressions += split.impressions(ex, &split.validation);
        self.validation_weight += split.weight(ex, &split.validation, &w);
        self.steps += epoch_steps(cfg, walks_rows_once(cfg, cfg.model.listwise(), aggregated_rows(ex)), split.train.len(), train);
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
        if cfg.tower != TowerKind::Embedding && n_features == 0 {
            anyhow::bail!(
                "key `train.tower` = {:?} needs item features, but the stream carries none (ids and clicks only): set `[train] tower = \"embedding\"`, a relevance per (query, document) learned from the clicks",
                cfg.tower
            );
        }
        if let Some(limit) = cfg.feature_limit {
            if limit > n_features && cfg.tower != TowerKind::Embedding {
                anyhow::bail!("key `train.feature_limit` = {limit} but the data has only {n_features} features");
            }
        }
        if cfg.bias_feature_tower && self.n_bias_features.unwrap_or(0) == 0 {
            anyhow::bail!("key `train.bias_feature_tower` is set but the stream carries no bias features");
        }
        if cfg.model.listwise() && self.rows_only {
            anyhow::bail!(
                "train.model = \"{}\" is trained on whole sessions, but these examples are rows aggregated per (query, document, position): \
                 a session's items are no longer together",
                cfg.model.name()
            );
        }
        if cfg.model.needs_labels(&cfg.model_sections()) && !self.labels {
            anyhow::bail!("key `train.gradient_reversal.adversarial_label` = \"true_label\" needs relevance labels, which only a simulation's examples carry");
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
        let listwise = trained.meta.architecture.model.listwise();
        let weights = if listwise { vec![1f32; ex.rows.len()] } else { weights_of(&ex.rows, &cfg.ips).0 };
        let qd_map = trained.qd_map(&ex);
        let inputs = (for_training && trained.meta.architecture.tower != TowerKind::Embedding).then(|| tower_inputs(&ex, &trained.meta));
        let split = Slices::of(&ex, cfg);
        let span_impressions: Vec<u64> =
            ex.sessions.iter().map(|s| ex.rows[s.start..s.start + s.len].iter().map(|r| r.impressions as u64).sum()).collect();
        // A span's multiplicity: its rows' count (aggregated rows, counted lists) or 1 (raw sessions).
        let multiplicity = |s: usize| ex.rows.get(ex.sessions[s].start).map_or(0, |r| r.impressions as u64);
        let cumulative: Vec<u64> = split.train.iter().scan(0u64, |acc, &s| { *acc += multiplicity(s); Some(*acc) }).collect();
        let train_impressions = split.impressions(&ex, &split.train);
        let aggregated = listwise || aggregated_rows(&ex);
        let train_rows: usize = split.train.iter().map(|&s| ex.sessions[s].len).sum();
        let mean_list = (train_rows as f64 / split.train.len().max(1) as f64).max(1.0);
        let one_pass = walks_rows_once(cfg, listwise, aggregated);
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
    fit_cancellable(ex, cfg, init, progress, None)
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

/// `fit`, checking `cancel` before every batch and returning `Cancelled` once it is set.
pub fn fit_cancellable(
    ex: &Examples,
    cfg: &TrainConfig,
    init: Option<&Trained>,
    progress: bool,
    cancel: Option<&std::sync::atomic::AtomicBool>,
) -> anyhow::Result<(Trained, FitReport)> {
    fit_chunks(ex, cfg, init, progress, cancel)
}

/// Σ w·ℓ over every validation row, and the model's validation loss (÷ impressions, or ÷ Σw when
/// self-normalised).
fn validation_loss(model: &AnyModel, resident: Option<&Chunk>, data: &dyn ExampleChunks, trained: &Trained, cfg: &TrainConfig, denominator: f64, device: &Device) -> anyhow::Result<f64> {
    let mut total = 0f64;
    match resident {
        Some(c) => total += weighted_loss_sum(model, &c.ex, &c.split.validation, &c.weights, &c.qd_map, &trained.meta, device, true),
        None => {
            for i in 0..data.chunk_count(Split::Validation) {
                let c = Chunk::new(Cow::Owned(data.load_chunk(Split::Validation, i)?), cfg, trained, false);
                total += weighted_loss_sum(model, &c.ex, &c.split.validation, &c.weights, &c.qd_map, &trained.meta, device, true);
            }
        }
    }
    Ok(total / denominator.max(f64::MIN_POSITIVE))
}

/// Trains on examples in memory or in chunks on disk (see `chunks`): every epoch visits the
/// training chunks in a shuffled order, each with its share of the steps (∝ its impressions), and
/// scores every validation chunk. In memory the examples are one chunk, read once.
pub fn fit_chunks(
    data: &dyn ExampleChunks,
    cfg: &TrainConfig,
    init: Option<&Trained>,
    progress: bool,
    cancel: Option<&std::sync::atomic::AtomicBool>,
) -> anyhow::Result<(Trained, FitReport)> {
    let started = Instant::now();
    // One pass over every chunk: checks, the normaliser's sums, the vocabulary, the weights.
    let mut survey = Survey::new();
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut survey_chunk = |ex: &Examples| -> anyhow::Result<()> {
        survey.add(ex, cfg)?;
        if cfg.tower == TowerKind::Embedding {
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
    survey.weights.check(&cfg.ips)?;
    let weight_report = survey.weights.report(&cfg.ips);
    if survey.train_sessions == 0 || survey.validation_sessions == 0 {
        anyhow::bail!(
            "{} sessions cannot be split into training and validation (train.validation_fraction = {})",
            survey.train_sessions + survey.validation_sessions,
            cfg.validation_fraction
        );
    }
    let (data_features, n_bias_features) = (survey.n_features.unwrap_or(0), survey.n_bias_features.unwrap_or(0));

    let arch = cfg.architecture();
    let device = cfg.backend.autodiff_device()?;
    let infer_device = cfg.backend.device()?;
    device.seed(cfg.seed);

    let n_features = if arch.tower == TowerKind::Embedding { 0 } else { cfg.feature_limit.unwrap_or(data_features) };
    let (mut trained, warm) = match init {
        Some(t) => {
            if t.meta.architecture.model != arch.model {
                anyhow::bail!(
                    "cannot warm-start: the current model is a `{}` model but the config trains `{}` (key `train.model`); train cold (without --warm-start)",
                    t.meta.architecture.model.name(),
                    arch.model.name()
                );
            }
            if t.meta.architecture != arch {
                anyhow::bail!(
                    "cannot warm-start: the current model has architecture {:?} but the config says {:?}; train cold (without --warm-start)",
                    t.meta.architecture,
                    arch
                );
            }
            t.check_compatible_with(data_features, n_bias_features)?;
            (t.clone(), true)
        }
        None => {
            let meta = ModelMeta {
                architecture: arch.clone(),
                n_features,
                n_bias_features,
                normalizer: (arch.tower != TowerKind::Embedding)
                    .then(|| Normalizer::from_sums(&survey.feature_sum[..n_features], &survey.feature_sq[..n_features], survey.train_impressions as u64)),
                feature_schema: None, // the caller knows the stream's (train_from_state sets it)
            };
            let vocabulary = vec![(String::new(), String::new())]; // index 0: unseen pair
            (Trained { model: AnyModel::new(&arch, n_features, n_bias_features, 1, &infer_device), meta, vocabulary }, false)
        }
    };
    if arch.tower == TowerKind::Embedding {
        let mut known: std::collections::HashSet<(String, String)> = trained.vocabulary.iter().cloned().collect();
        for key in pairs {
            if known.insert(key.clone()) {
                trained.vocabulary.push(key);
            }
        }
        let size = trained.vocabulary.len();
        trained.model = trained.model.grow_embedding(size, &infer_device);
    }

    let train_rows = survey.train_impressions;
    let listwise = arch.model.listwise();
    let objective = cfg.model_sections();
    let val_denominator = if cfg.ips.self_normalize { survey.validation_weight } else { survey.validation_impressions as f64 };
    let mut resident = data.in_memory().map(|ex| Chunk::new(Cow::Borrowed(ex), cfg, &trained, true));

    let mut model = trained.model.clone().train();
    let mut optim = AdamWConfig::new().with_weight_decay(cfg.weight_decay as f32).with_epsilon(1e-8).init();
    let mut best = (validation_loss(&model.valid(), resident.as_ref(), data, &trained, cfg, val_denominator, &infer_device)?, 0usize, model.valid());
    let mut epochs = Vec::new();
    let mut stop = StopReason::MaxEpochs;
    // Its ETA assumes every epoch runs; early stopping ends sooner.
    let bar = progress.then(|| ultr_core::progress::bar(Some(survey.steps * cfg.max_epochs as u64), "steps"));
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    'epochs: for epoch in 1..=cfg.max_epochs {
        let t0 = Instant::now();
        let mut train_total = 0f64;
        // Chunks on disk: `chunk_visits` rounds over every chunk, each in a shuffled order and with
        // its share of the chunk's steps, so the model never trains long on one chunk.
        let chunks = data.chunk_count(Split::Training);
        let visits = if chunks > 1 { cfg.chunk_visits.max(1) as u64 } else { 1 };
        let mut chunk_order: Vec<(usize, u64)> = Vec::new();
        for round in 0..visits {
            let mut order: Vec<usize> = (0..chunks).collect();
            if chunks > 1 {
                order.shuffle(&mut rng);
            }
            chunk_order.extend(order.into_iter().map(|c| (c, round)));
        }
        for &(c, round) in &chunk_order {
            let mut loaded;
            let chunk = match resident.as_mut() {
                Some(r) => r,
                None => {
                    loaded = Chunk::new(Cow::Owned(data.load_chunk(Split::Training, c)?), cfg, &trained, true);
                    &mut loaded
                }
            };
            let steps = chunk.steps * (round + 1) / visits - chunk.steps * round / visits;
            // A one-pass visit takes its share of the rows whatever the step count rounds to.
            if steps == 0 && !chunk.one_pass {
                continue;
            }
            let ex: &Examples = &chunk.ex;
            if round == 0 && !chunk.one_pass {
                chunk.order.shuffle(&mut rng);
            }
            // Raw sessions: shuffled whole sessions until a batch holds `batch_impressions`. Aggregated
            // rows: `steps` draws of `batch_rows` rows ∝ impressions, each entering with its mean loss —
            // as many steps and as many distinct keys per step as the raw path, on fewer rows.
            let per_step = if listwise { chunk.lists_per_step } else { cfg.batch_rows };
            let drawn: Vec<Vec<usize>> = if chunk.one_pass {
                one_pass_batches(&chunk.split.train, cfg.seed, epoch, c, round, visits, per_step)
            } else if chunk.aggregated {
                (0..steps).map(|_| draw_spans(&chunk.cumulative, &chunk.split.train, per_step, &mut rng)).collect()
            } else if round > 0 {
                Vec::new() // raw sessions are never spilled; their one round takes every batch
            } else {
                batches(&chunk.order, &chunk.span_impressions, cfg.batch_impressions as u64).into_iter().map(<[usize]>::to_vec).collect()
            };
            for batch in &drawn {
                if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
                    return Err(Cancelled.into());
                }
                let (b, n) = build_batch(ex, batch, &chunk.weights, &chunk.qd_map, &trained.meta, chunk.inputs.as_deref(), &device, !chunk.aggregated || chunk.one_pass, listwise);
                // Count-weighted rows (raw, or aggregated in one pass) are normalised like impressions.
                let drawn_rows = chunk.aggregated && !chunk.one_pass;
                let denominator = match (drawn_rows, cfg.ips.self_normalize) {
                    (false, true) => chunk.split.weight(ex, batch, &chunk.weights),
                    (false, false) => n as f64,
                    (true, true) => batch.iter().map(|&s| chunk.weights[ex.sessions[s].start] as f64).sum(),
                    (true, false) => batch.len() as f64,
                };
                let loss = model.objective(&b, denominator, &objective);
                let value = loss.clone().into_scalar::<f32>() as f64;
                if !value.is_finite() {
                    stop = StopReason::Diverged;
                    break 'epochs;
                }
                train_total += value * if drawn_rows { chunk.train_impressions as f64 / chunk.steps as f64 } else { n as f64 };
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                model = optim.step(cfg.learning_rate, model, grads);
                if let Some(bar) = &bar {
                    bar.inc(1);
                }
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        let current = model.valid();
        let val = validation_loss(&current, resident.as_ref(), data, &trained, cfg, val_denominator, &infer_device)?;
        epochs.push(EpochStats {
            epoch,
            train_loss: train_total / train_rows as f64,
            validation_loss: val,
            seconds,
            impressions_per_second: train_rows as f64 / seconds,
        });
        if let Some(bar) = &bar {
            bar.set_message(format!("epoch {epoch}: train {:.5} val {val:.5}", train_total / train_rows as f64));
        }
        if !val.is_finite() || current.position_bias(arch.max_positions).iter().any(|t| !t.is_finite()) {
            stop = StopReason::Diverged;
            break;
        }
        if !cfg.early_stopping {
            best = (val, epoch, current); // the last epoch, whatever its validation loss
        } else if val < best.0 {
            best = (val, epoch, current);
        } else if epoch - best.1 >= cfg.patience {
            stop = StopReason::EarlyStopping;
            break;
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    trained.model = best.2;
    let converged = converged(stop, &epochs, cfg.patience);
    if !converged && stop == StopReason::MaxEpochs {
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
        train_impressions: train_rows,
        validation_impressions: survey.validation_impressions,
        max_position: survey.positions.last().copied().unwrap_or(0),
        train_chunks: data.chunk_count(Split::Training),
        validation_chunks: data.chunk_count(Split::Validation),
        weights: weight_report,
        warm_started: warm,
        seconds: started.elapsed().as_secs_f64(),
        converged,
    };
    Ok((trained, report))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn epochs_with(losses: &[f64]) -> Vec<EpochStats> {
        losses.iter().enumerate().map(|(i, l)| EpochStats { epoch: i + 1, train_loss: *l, validation_loss: *l, seconds: 1.0, impressions_per_second: 1.0 }).collect()
    }

    #[test]
    fn a_fit_out_of_epochs_with_its_loss_still_falling_has_not_converged() {
        let falling = epochs_with(&[0.9, 0.8, 0.7, 0.65, 0.6]);
        assert!(!converged(StopReason::MaxEpochs, &falling, 3));
        // Its lowest loss three epochs before the end: it had stopped improving.
        let flat = epochs_with(&[0.9, 0.6, 0.61, 0.62, 0.63]);
        assert!(converged(StopReason::MaxEpochs, &flat, 3));
        assert!(converged(StopReason::EarlyStopping, &falling, 3));
        assert!(!converged(StopReason::Diverged, &flat, 3));
    }

    /// Regression: the visits of a spilled chunk each reshuffled its rows, so an epoch of
    /// `aggregated_epoch = "rows"` took some rows twice and others never. Now every visit splits
    /// one permutation per (epoch, chunk): each row exactly once, in `per_step` batches, and the next
    /// epoch in another order.
    #[test]
    fn the_visits_of_a_one_pass_epoch_take_every_row_exactly_once() {
        let train: Vec<usize> = (0..1_003).map(|i| i * 3 + 1).collect();
        for visits in [1u64, 2, 3, 7] {
            let mut seen: Vec<usize> = Vec::new();
            for round in 0..visits {
                let batches = one_pass_batches(&train, 9, 4, 2, round, visits, 64);
                assert!(batches.iter().all(|b| !b.is_empty() && b.len() <= 64));
                seen.extend(batches.into_iter().flatten());
            }
            assert_ne!(seen, train, "shuffled");
            let mut sorted = seen.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, train, "{visits} visits: every row once");
            let next: Vec<usize> = (0..visits).flat_map(|r| one_pass_batches(&train, 9, 5, 2, r, visits, 64)).flatten().collect();
            assert_ne!(next, seen, "another order next epoch");
        }
    }

    /// The galloping search returns, draw for draw, what a binary search over the whole cumulative
    /// table returns (including zero-impression spans, which are never drawn).
    #[test]
    fn sorted_galloping_draws_equal_binary_search() {
        let impressions: Vec<u64> = (0..5_000u64).map(|i| (i * 7919) % 13 + if i % 17 == 0 { 0 } else { 1 }).collect();
        let spans: Vec<usize> = (0..impressions.len()).map(|i| i * 3).collect();
        let cumulative: Vec<u64> = impressions.iter().scan(0, |acc, &n| { *acc += n; Some(*acc) }).collect();
        for seed in 0..20 {
            let drawn = draw_spans(&cumulative, &spans, 512, &mut ChaCha8Rng::seed_from_u64(seed));
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let total = *cumulative.last().unwrap();
            let mut expected: Vec<usize> = (0..512)
                .map(|_| {
                    let u = rng.random_range(0..total);
                    spans[cumulative.partition_point(|&c| c <= u).min(spans.len() - 1)]
                })
                .collect();
            expected.sort_unstable();
            assert_eq!(drawn, expected, "seed {seed}");
            assert!(drawn.iter().all(|&s| impressions[s / 3] > 0));
        }
    }
}
