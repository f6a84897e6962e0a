//! DLA, the dual learning algorithm (Ai et al. 2018, "Unbiased Learning to Rank with Unbiased
//! Propensity Estimation", Eq. 5–9; the DLA baseline of Zhang et al. 2023 Table 1): a ranking model
//! r(x) and a propensity model φ_k, each trained by a listwise softmax cross-entropy on the clicked
//! items of a session, weighted by the other's ratio to the top item: the ranking loss by inverse
//! propensity P(e₁)/P(e_k) = exp(φ₁ − φ_k), the propensity loss by inverse relevance
//! P(r₁)/P(r_i) = exp(r₁ − r_i), both without gradient and clipped at `[train.dla] max_weight`.
//! DLA estimates its own propensities, so `[train.ips]` does not apply. It needs whole sessions.
//! For the monitor and the gate its click logits are r(x) + φ_k − φ₁: the listwise losses fix
//! neither tower's level, so these are uncalibrated.

use burn::module::{Module, Param};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::inputs::{BatchTensors, Dimensions};
use super::interface::Model;
use super::tower::{Mlp, RelevanceTower};

/// `[train.dla]` (model = "dla").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DlaConfig {
    /// Both inverse weights are clipped to this (Ai et al. clip propensity weights too).
    pub max_weight: f64,
}

impl Default for DlaConfig {
    fn default() -> Self {
        DlaConfig { max_weight: 20.0 }
    }
}

#[derive(Module, Debug)]
pub struct Dla {
    pub relevance: RelevanceTower,
    /// φ_k, the examination logits of positions 1..=K.
    pub propensity: Param<Tensor<1>>,
}

/// A masked entry's logit: exp underflows to 0 in the softmax.
const MASKED: f32 = -1.0e4;

impl Model for Dla {
    const NAME: &'static str = "dla";
    const SUMMARY: &'static str = "Ai et al. 2018: ranking and propensity models trained by each other's listwise losses.";
    const LISTWISE: bool = true;
    const CALIBRATED_CLICKS: bool = false;
    type Shape = ();
    type Settings = DlaConfig;

    fn validate_settings(settings: &DlaConfig) -> Result<(), String> {
        if !(settings.max_weight >= 1.0 && settings.max_weight.is_finite()) {
            return Err(format!("key `train.dla.max_weight` = {} must be >= 1", settings.max_weight));
        }
        Ok(())
    }

    fn new(dims: &Dimensions, _shape: &(), device: &Device) -> Self {
        Dla { relevance: RelevanceTower::new(dims, device), propensity: Param::from_tensor(Tensor::zeros([dims.max_positions], device)) }
    }

    fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        self.relevance.forward(b)
    }

    fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
        (self.relevance.embedding.clone(), self.relevance.mlp.clone())
    }

    fn grow_embedding(mut self, vocabulary: usize, device: &Device) -> Self {
        self.relevance = self.relevance.grow(vocabulary, device);
        self
    }

    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        let phi = self.propensity.val();
        let top = phi.clone().slice([0..1]);
        self.relevance.forward(b) + (phi.select(0, b.positions.clone()) - top)
    }

    /// Σ over the batch's lists of both listwise losses, each list weighted by its rows' weight.
    fn objective_sum(&self, b: &BatchTensors, settings: &DlaConfig) -> Tensor<1> {
        let max_weight = settings.max_weight;
        let lists = b.lists.as_ref().expect("DLA batches are laid out as lists");
        let shape = [lists.count, lists.width];
        let masked = lists.mask.clone().sub_scalar(1.0).mul_scalar(-MASKED);
        let r = self.relevance.forward(b).reshape(shape) + masked.clone();
        let phi = self.propensity.val().select(0, b.positions.clone()).reshape(shape) + masked;
        let clicks = b.clicks.clone().reshape(shape) * b.weights.clone().reshape(shape) * lists.mask.clone();
        // Slot 0 of every list is its top position (rows are laid out by position).
        let ratio = |x: Tensor<2>| -> Tensor<2> {
            let top = x.clone().slice([0..lists.count, 0..1]);
            (top - x).clamp_max(max_weight.ln()).exp().detach()
        };
        let ipw = ratio(phi.clone());
        let irw = ratio(r.clone());
        let ranking = (clicks.clone() * ipw * log_softmax(r, 1)).sum();
        let propensity = (clicks * irw * log_softmax(phi, 1)).sum();
        (ranking + propensity).neg()
    }

    /// What early stopping watches: −Σ c_i log softmax(r + φ)_i over each list, the likelihood of
    /// which items were clicked under both towers together. The objective itself is no criterion:
    /// each loss's weights move with the other tower.
    fn fit_loss_sum(&self, b: &BatchTensors) -> Tensor<1> {
        let lists = b.lists.as_ref().expect("DLA batches are laid out as lists");
        let shape = [lists.count, lists.width];
        let masked = lists.mask.clone().sub_scalar(1.0).mul_scalar(-MASKED);
        let scores = (self.relevance.forward(b) + self.propensity.val().select(0, b.positions.clone())).reshape(shape) + masked;
        let clicks = b.clicks.clone().reshape(shape) * b.weights.clone().reshape(shape) * lists.mask.clone();
        (clicks * log_softmax(scores, 1)).sum().neg()
    }

    /// φ_k − φ₁ for k = 1..=K: log P(e_k)/P(e₁).
    fn position_bias(&self, _max_positions: usize) -> Vec<f64> {
        let phi: Vec<f32> = self.propensity.val().into_data().try_to_vec::<f32>().expect("φ is f32");
        phi.iter().map(|t| (*t - phi[0]) as f64).collect()
    }
}
