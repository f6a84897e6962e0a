//! From examples to device tensors: batches of whole sessions, aggregated rows or lists, and the
//! samplers that choose them (rows ∝ impressions, one pass over the rows).

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::artefact::ModelMeta;
use super::config::{AggregatedEpoch, TrainConfig};
use super::data::Examples;
use super::models::{BatchTensors, InputShape, Lists};

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
    let spec = BatchSpec { shape: meta.architecture.model.input_shape(), count_weighted: true, inputs: None };
    build_batch(ex, chosen, weights, qd_map, meta, device, spec)
}

/// Every distinct feature row of `ex` as the tower reads it (first `n_features`, standardised),
/// computed once per fit instead of once per row and step.
pub(crate) fn tower_inputs(ex: &Examples, meta: &ModelMeta) -> Vec<f32> {
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
pub(crate) fn draw_spans(cumulative: &[u64], spans: &[usize], rows: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
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
pub(crate) fn aggregated_rows(ex: &Examples) -> bool {
    ex.sessions.iter().all(|s| s.split.is_some() && s.len == 1)
}

/// An epoch walks each aggregated row of a pointwise model once (`aggregated_epoch = "rows"`)
/// instead of drawing rows ∝ impressions.
pub(crate) fn walks_rows_once(cfg: &TrainConfig, shape: InputShape, aggregated: bool) -> bool {
    aggregated && !shape.lists() && cfg.aggregated_epoch == AggregatedEpoch::Rows
}

/// Optimizer steps in an epoch over `spans` training spans holding `impressions`.
pub(crate) fn epoch_steps(cfg: &TrainConfig, one_pass: bool, spans: usize, impressions: usize) -> u64 {
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
pub(crate) fn one_pass_batches(train: &[usize], seed: u64, epoch: usize, chunk: usize, round: u64, visits: u64, per_step: usize) -> Vec<Vec<usize>> {
    let mut order = train.to_vec();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(((epoch as u64) << 32) | chunk as u64);
    order.shuffle(&mut rng);
    let len = order.len() as u64;
    order[(len * round / visits) as usize..(len * (round + 1) / visits) as usize].chunks(per_step.max(1)).map(<[usize]>::to_vec).collect()
}

/// How `build_batch` lays out and weighs a batch.
#[derive(Clone, Copy)]
pub(crate) struct BatchSpec<'a> {
    /// `Lists`: every span becomes a list of `width` slots (its rows by position, then padding with
    /// weight 0); `Rows`: the spans' rows in order.
    pub shape: InputShape,
    /// A row's weight is w·n (its impressions' summed loss); otherwise w (its impressions' mean
    /// loss, for rows drawn ∝ n).
    pub count_weighted: bool,
    /// `tower_inputs`, when computed.
    pub inputs: Option<&'a [f32]>,
}

/// The device tensors of sessions `chosen` of `ex`, laid out and weighed as `spec` says, and the
/// impressions they stand for.
pub(crate) fn build_batch(
    ex: &Examples,
    chosen: &[usize],
    weights: &[f32],
    qd_map: &[u32],
    meta: &ModelMeta,
    device: &Device,
    spec: BatchSpec,
) -> (BatchTensors, usize) {
    let BatchSpec { shape, count_weighted, inputs } = spec;
    let listwise = shape.lists();
    let width = if listwise { chosen.iter().map(|&s| ex.sessions[s].len).max().unwrap_or(1).max(1) } else { 0 };
    let n: usize = if listwise { chosen.len() * width } else { chosen.iter().map(|&s| ex.sessions[s].len).sum() };
    let mut rows = BatchRows::with_capacity(ex, meta, n, listwise);
    let mut order: Vec<usize> = Vec::new();
    for &s in chosen {
        let span = ex.sessions[s];
        order.clear();
        order.extend(span.start..span.start + span.len);
        if listwise {
            order.sort_by_key(|&i| ex.rows[i].position);
        }
        for &i in &order {
            rows.push(ex, meta, i, weights[i], qd_map, inputs, count_weighted);
        }
        if listwise {
            rows.mask.extend(std::iter::repeat_n(1f32, span.len));
            for _ in span.len..width {
                rows.pad(meta.n_features, ex.n_bias_features);
            }
        }
    }
    let lists = listwise.then_some((chosen.len(), width));
    (rows.tensors(meta.n_features, ex.n_bias_features, lists, device), rows.impressions)
}

/// A batch's columns on the host, filled row by row.
struct BatchRows {
    embedding: bool,
    bias_tower: bool,
    with_labels: bool,
    impressions: usize,
    positions: Vec<i64>,
    clicks: Vec<f32>,
    weights: Vec<f32>,
    mask: Vec<f32>,
    qd: Vec<i64>,
    features: Vec<f32>,
    bias: Vec<f32>,
    labels: Vec<f32>,
}

impl BatchRows {
    fn with_capacity(ex: &Examples, meta: &ModelMeta, n: usize, listwise: bool) -> BatchRows {
        let embedding = meta.architecture.tower.pair_embedding();
        let bias_tower = meta.architecture.bias_feature_tower;
        let with_labels = !ex.doc_labels.is_empty();
        BatchRows {
            embedding,
            bias_tower,
            with_labels,
            impressions: 0,
            positions: Vec::with_capacity(n),
            clicks: Vec::with_capacity(n),
            weights: Vec::with_capacity(n),
            mask: Vec::with_capacity(if listwise { n } else { 0 }),
            qd: Vec::with_capacity(if embedding { n } else { 0 }),
            features: Vec::with_capacity(if embedding { 0 } else { n * meta.n_features }),
            bias: Vec::with_capacity(if bias_tower { n * ex.n_bias_features } else { 0 }),
            labels: Vec::with_capacity(if with_labels { n } else { 0 }),
        }
    }

    /// Row `i` of `ex`: a row of n impressions and c clicks enters with target c/n.
    #[allow(clippy::too_many_arguments, reason = "the hot loop's row copy: a struct of borrowed inputs would be built per row")]
    fn push(&mut self, ex: &Examples, meta: &ModelMeta, i: usize, weight: f32, qd_map: &[u32], inputs: Option<&[f32]>, count_weighted: bool) {
        let (f, z) = (meta.n_features, ex.n_bias_features);
        let r = &ex.rows[i];
        self.positions.push((r.position - 1) as i64);
        let count = r.impressions.max(1);
        self.impressions += count as usize;
        self.clicks.push(r.clicks as f32 / count as f32);
        self.weights.push(if count_weighted { weight * count as f32 } else { weight });
        if self.embedding {
            self.qd.push(qd_map[r.qd as usize] as i64);
        } else if let Some(inputs) = inputs {
            self.features.extend_from_slice(&inputs[r.doc as usize * f..(r.doc as usize + 1) * f]);
        } else {
            push_tower_input(ex, meta, r.doc, &mut self.features);
        }
        if self.bias_tower {
            self.bias.extend_from_slice(&ex.bias[i * z..(i + 1) * z]);
        }
        if self.with_labels {
            self.labels.push(ex.doc_labels[r.doc as usize]);
        }
    }

    /// A padding slot of a list: position 1, no click, weight 0, masked out.
    fn pad(&mut self, f: usize, z: usize) {
        self.positions.push(0);
        self.clicks.push(0.0);
        self.weights.push(0.0);
        self.mask.push(0.0);
        if self.embedding {
            self.qd.push(0);
        } else {
            self.features.extend(std::iter::repeat_n(0f32, f));
        }
        if self.bias_tower {
            self.bias.extend(std::iter::repeat_n(0f32, z));
        }
        if self.with_labels {
            self.labels.push(0.0);
        }
    }

    /// The device tensors; `lists` = (count, width) lays the rows out as lists.
    fn tensors(&mut self, f: usize, z: usize, lists: Option<(usize, usize)>, device: &Device) -> BatchTensors {
        let n = self.positions.len();
        BatchTensors {
            positions: Tensor::<1, Int>::from_data(TensorData::new(std::mem::take(&mut self.positions), [n]), device),
            qd: self.embedding.then(|| Tensor::<1, Int>::from_data(TensorData::new(std::mem::take(&mut self.qd), [n]), device)),
            features: (!self.embedding).then(|| Tensor::<2>::from_data(TensorData::new(std::mem::take(&mut self.features), [n, f]), device)),
            bias_features: self.bias_tower.then(|| Tensor::<2>::from_data(TensorData::new(std::mem::take(&mut self.bias), [n, z]), device)),
            clicks: Tensor::<1>::from_data(TensorData::new(std::mem::take(&mut self.clicks), [n]), device),
            weights: Tensor::<1>::from_data(TensorData::new(std::mem::take(&mut self.weights), [n]), device),
            labels: self.with_labels.then(|| Tensor::<1>::from_data(TensorData::new(std::mem::take(&mut self.labels), [n]), device)),
            lists: lists.map(|(count, width)| Lists {
                count,
                width,
                mask: Tensor::<2>::from_data(TensorData::new(std::mem::take(&mut self.mask), [count, width]), device),
            }),
        }
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    /// Regression: the visits of a spilled chunk each reshuffled its rows, so an epoch of
    /// `aggregated_epoch = "rows"` took some rows twice and others never. Now every visit splits
    /// one permutation per (epoch, chunk): each row exactly once, in `per_step` batches, and the next
    /// epoch in another order.
    pub fn the_visits_of_a_one_pass_epoch_take_every_row_exactly_once() {
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
    pub fn sorted_galloping_draws_equal_binary_search() {
        let impressions: Vec<u64> = (0..5_000u64).map(|i| (i * 7919) % 13 + if i % 17 == 0 { 0 } else { 1 }).collect();
        let spans: Vec<usize> = (0..impressions.len()).map(|i| i * 3).collect();
        let cumulative: Vec<u64> = impressions
            .iter()
            .scan(0, |acc, &n| {
                *acc += n;
                Some(*acc)
            })
            .collect();
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
