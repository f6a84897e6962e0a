//! Scoring a trained model over examples without gradients: per-row logits and relevance, and the
//! weighted click loss in sums that add up over chunks of the data.

use burn::tensor::{Device, Tensor};

use super::artefact::{ModelMeta, Trained};
use super::batches::{build_batch, BatchSpec};
use super::data::Examples;
use super::models::{AnyModel, BatchTensors};

impl Trained {
    /// Applies `output` to every row of `ex` in chunks of sessions (inference device), in row order.
    /// A model whose logits need the session (XPA) sees each span as one list.
    fn per_row(&self, ex: &Examples, device: &Device, output: impl Fn(&AnyModel, &BatchTensors) -> Tensor<1>) -> Vec<f32> {
        let qd_map = self.qd_map(ex);
        let ones = vec![1f32; ex.rows.len()];
        let sessions: Vec<usize> = (0..ex.sessions.len()).collect();
        let spec = BatchSpec { shape: self.meta.architecture.model.scoring_shape(false), count_weighted: true, inputs: None };
        let mut out = vec![0f32; ex.rows.len()];
        let mut slot_rows: Vec<usize> = Vec::new();
        for chunk in sessions.chunks(EVAL_SESSIONS) {
            let (b, _) = build_batch(ex, chunk, &ones, &qd_map, &self.meta, device, spec);
            let values = output(&self.model, &b).into_data().try_to_vec::<f32>().expect("f32 outputs");
            // The row behind each output slot: spans in order, by position within a list, then padding.
            slot_rows.clear();
            let width = b.lists.as_ref().map_or(0, |l| l.width);
            for &s in chunk {
                let span = ex.sessions[s];
                let first = slot_rows.len();
                slot_rows.extend(span.start..span.start + span.len);
                if spec.shape.lists() {
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

    /// Weighted BCE (`sum w·ℓ / N`, or `/ Σw` when self-normalised) of `ex` under this model.
    pub fn loss(&self, ex: &Examples, weights: &[f32], self_normalize: bool, device: &Device) -> f64 {
        self.loss_sums(ex, weights, device).loss(self_normalize)
    }

    /// The sums behind `loss`, which add up over chunks of the data.
    pub fn loss_sums(&self, ex: &Examples, weights: &[f32], device: &Device) -> LossSums {
        let sessions: Vec<usize> = (0..ex.sessions.len()).collect();
        LossSums {
            weighted_loss: weighted_loss_sum(&self.model, ex, &sessions, (weights, &self.qd_map(ex), None), &self.meta, device, false),
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
    /// Weighted BCE (`sum w·ℓ / N`, or `/ Σw` when self-normalised) of `ex` under this model.
    pub fn loss(&self, self_normalize: bool) -> f64 {
        self.weighted_loss / if self_normalize { self.weight } else { self.impressions }.max(f64::MIN_POSITIVE)
    }
}

/// Sessions per chunk when scoring without gradients.
pub(crate) const EVAL_SESSIONS: usize = 4096;

/// Σ w·ℓ over the rows of sessions `chosen` (no gradients): the click BCE, or with `fit_loss` the loss
/// the model's early stopping watches (`AnyModel::fit_loss_sum`). `tables`: each row's weight, the
/// pair map, and the tower inputs when they were computed once for `ex` (`batches::tower_inputs`).
pub(crate) fn weighted_loss_sum(
    model: &AnyModel,
    ex: &Examples,
    chosen: &[usize],
    tables: (&[f32], &[u32], Option<&[f32]>),
    meta: &ModelMeta,
    device: &Device,
    fit_loss: bool,
) -> f64 {
    let (weights, qd_map, inputs) = tables;
    let mut total = 0f64;
    let spec = BatchSpec { shape: meta.architecture.model.scoring_shape(fit_loss), count_weighted: true, inputs };
    for chunk in chosen.chunks(EVAL_SESSIONS) {
        let (b, _) = build_batch(ex, chunk, weights, qd_map, meta, device, spec);
        let sum = if fit_loss { model.fit_loss_sum(&b) } else { model.click_loss_sum(&b) };
        total += sum.into_scalar::<f32>() as f64;
    }
    total
}
