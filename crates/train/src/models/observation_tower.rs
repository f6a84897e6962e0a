//! The observation tower g(k, z) of Zhang et al. 2023 ("Towards Disentangling Relevance and Bias
//! in Unbiased Learning to Rank", §3.1): an additive two-tower model, logit = r(x) + g(k, z), whose
//! observation tower is a position embedding and the bias features through an ELU layer, with an
//! adversarial head on that layer. Two models train it (`gradient_reversal.rs`, §3.2 Eq. 8–9, and
//! `observation_dropout.rs`, §3.3 Eq. 10); this file holds what they share.

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::sigmoid;
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use super::inputs::{BatchTensors, Dimensions};
use super::tower::{bce_with_logits, elu, RelevanceTower};

/// `[train.observation_tower]`: the shape of g(k, z) for `gradient_reversal` and `observation_dropout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ObservationTowerConfig {
    /// Width of the learned position embedding.
    pub position_embedding: usize,
    /// Width of the ELU layer over [embedding, bias features] (the adversarial head reads it).
    pub hidden_units: usize,
}

impl Default for ObservationTowerConfig {
    fn default() -> Self {
        ObservationTowerConfig { position_embedding: 8, hidden_units: 16 }
    }
}

impl ObservationTowerConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (key, v) in [("position_embedding", self.position_embedding), ("hidden_units", self.hidden_units)] {
            if v == 0 {
                return Err(format!("key `train.observation_tower.{key}` must be >= 1"));
            }
        }
        Ok(())
    }
}

/// What the adversarial head is trained to predict (Zhang Table 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdversarialLabel {
    /// The logged click (the default; needs nothing beyond the log).
    Clicks,
    /// σ(r(x)) of the relevance tower being trained, without gradient.
    RelevancePrediction,
    /// The simulator's relevance label ÷ its maximum: only where the examples carry labels
    /// (`ultr experiment zhang2023`); training from a stream refuses it.
    TrueLabel,
}

/// The training objective's settings (not part of the architecture: a warm start may change them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Objective {
    pub eta: f64,
    pub label: AdversarialLabel,
    pub dropout: f64,
}

#[derive(Module, Debug)]
pub struct ObservationModel {
    pub relevance: RelevanceTower,
    /// [K, position_embedding].
    pub position_embedding: Param<Tensor<2>>,
    /// [position_embedding + bias features] → hidden_units, then ELU: the layer the head reads.
    pub hidden: Linear,
    /// hidden_units → 1: g(k, z).
    pub output: Linear,
    /// hidden_units → 1: the adversarial prediction, behind the gradient reversal.
    pub adversary: Linear,
}

impl ObservationModel {
    pub fn new(dims: &Dimensions, shape: &ObservationTowerConfig, device: &Device) -> Self {
        let (k, e) = (dims.max_positions, shape.position_embedding);
        // A fixed draw (the layers take the device's seeded generator): positions start apart.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x2023);
        let normal = Normal::new(0.0f32, 0.1).expect("valid normal");
        let values: Vec<f32> = (0..k * e).map(|_| normal.sample(&mut rng)).collect();
        let input = e + if dims.bias_feature_tower { dims.n_bias_features } else { 0 };
        ObservationModel {
            relevance: RelevanceTower::new(dims, device),
            position_embedding: Param::from_tensor(Tensor::from_data(TensorData::new(values, [k, e]), device)),
            hidden: LinearConfig::new(input, shape.hidden_units).init(device),
            output: LinearConfig::new(shape.hidden_units, 1).init(device),
            adversary: LinearConfig::new(shape.hidden_units, 1).init(device),
        }
    }

    /// The ELU layer's output h(k, z), [rows, hidden_units].
    pub fn hidden_of(&self, positions: Tensor<1, Int>, bias_features: Option<&Tensor<2>>) -> Tensor<2> {
        let embedded = self.position_embedding.val().select(0, positions);
        let input = match bias_features {
            Some(z) if self.hidden.weight.val().dims()[0] > embedded.dims()[1] => Tensor::cat(vec![embedded, z.clone()], 1),
            _ => embedded,
        };
        elu(self.hidden.forward(input))
    }

    pub fn observation(&self, b: &BatchTensors) -> Tensor<1> {
        self.output.forward(self.hidden_of(b.positions.clone(), b.bias_features.as_ref())).squeeze_dim::<1>(1)
    }

    /// r(x) + g(k, z), no dropout (inference).
    pub fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        self.relevance.forward(b) + self.observation(b)
    }

    /// Σ over rows of the training loss: the click BCE (with dropout, in expectation over the
    /// mask: τ·ℓ(r) + (1−τ)·ℓ(r + g/(1−τ)), exact for a row of many impressions and the same
    /// fixed point as sampling a mask per impression) plus, with η > 0, the adversarial squared
    /// error Σ w·n·(a − y)² (Eq. 9; for clicks, y = c/n: the raw impressions' gradient).
    pub fn objective_sum(&self, b: &BatchTensors, objective: &Objective) -> Tensor<1> {
        let r = self.relevance.forward(b);
        let h = self.hidden_of(b.positions.clone(), b.bias_features.as_ref());
        let g = self.output.forward(h.clone()).squeeze_dim::<1>(1);
        let tau = objective.dropout;
        let per_row = if tau > 0.0 {
            bce_with_logits(r.clone(), b.clicks.clone()).mul_scalar(tau)
                + bce_with_logits(r.clone() + g.div_scalar(1.0 - tau), b.clicks.clone()).mul_scalar(1.0 - tau)
        } else {
            bce_with_logits(r.clone() + g, b.clicks.clone())
        };
        let mut total = (per_row * b.weights.clone()).sum();
        if objective.eta > 0.0 {
            // Identity forward; backward multiplies the head's gradient by −η (the GradRev layer).
            let eta = objective.eta;
            let reversed = h.clone().detach().mul_scalar(1.0 + eta) - h.mul_scalar(eta);
            let a = self.adversary.forward(reversed).squeeze_dim::<1>(1);
            let target = match objective.label {
                AdversarialLabel::Clicks => b.clicks.clone(),
                AdversarialLabel::RelevancePrediction => sigmoid(r).detach(),
                AdversarialLabel::TrueLabel => b.labels.clone().expect("labels (checked before training)"),
            };
            let error = a - target;
            total = total + (error.clone() * error * b.weights.clone()).sum();
        }
        total
    }

    /// g(k, 0) − g(1, 0) for k = 1..=K.
    pub fn position_bias(&self) -> Vec<f64> {
        let k = self.position_embedding.val().dims()[0];
        let device = self.position_embedding.val().device();
        let positions = Tensor::<1, Int>::from_data(TensorData::new((0..k as i64).collect::<Vec<_>>(), [k]), &device);
        let width = self.hidden.weight.val().dims()[0];
        let e = self.position_embedding.val().dims()[1];
        let zeros = (width > e).then(|| Tensor::<2>::zeros([k, width - e], &device));
        let g: Vec<f32> = self.output.forward(self.hidden_of(positions, zeros.as_ref())).squeeze_dim::<1>(1).into_data().try_to_vec::<f32>().expect("f32");
        g.iter().map(|v| (*v - g[0]) as f64).collect()
    }
}
