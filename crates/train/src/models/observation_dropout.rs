//! Observation dropout (Zhang et al. 2023, "Towards Disentangling Relevance and Bias in Unbiased
//! Learning to Rank", §3.3 Eq. 10): the observation tower g(k, z) of `observation_tower.rs`, whose
//! output is dropped with probability τ during training, so the relevance tower must explain the
//! clicks on its own part of the time. logit = r(x) + g(k, z); serving ranks by r(x).

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::inputs::{BatchTensors, Dimensions, TowerKind};
use super::interface::Model;
use super::observation_tower::{ObservationModel, ObservationTowerConfig, Objective};
use super::tower::Mlp;

/// `[train.observation_dropout]` (model = "observation_dropout").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ObservationDropoutConfig {
    /// τ: the probability that an impression's observation logit is dropped in training (Zhang
    /// Fig. 7: best between 0.2 and 0.5).
    pub rate: f64,
}

impl Default for ObservationDropoutConfig {
    fn default() -> Self {
        ObservationDropoutConfig { rate: 0.3 }
    }
}

/// The model: the observation tower trained with dropout on its output.
#[derive(Module, Debug)]
pub struct ObservationDropout {
    pub observation: ObservationModel,
}

impl Model for ObservationDropout {
    const NAME: &'static str = "observation_dropout";
    const SUMMARY: &'static str = "Zhang 2023 §3.3: dropout on the observation tower's output.";
    type Shape = ObservationTowerConfig;
    type Settings = ObservationDropoutConfig;

    fn validate_settings(settings: &ObservationDropoutConfig) -> Result<(), String> {
        if !(0.0..1.0).contains(&settings.rate) {
            return Err(format!("key `train.observation_dropout.rate` = {} must lie in [0, 1)", settings.rate));
        }
        Ok(())
    }

    fn new(dims: &Dimensions, shape: &ObservationTowerConfig, device: &Device) -> Self {
        ObservationDropout { observation: ObservationModel::new(dims, shape, device) }
    }

    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        self.observation.click_logits(b)
    }

    fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        self.observation.relevance.forward(b)
    }

    /// g(k, 0) − g(1, 0).
    fn position_bias(&self, _max_positions: usize) -> Vec<f64> {
        self.observation.position_bias()
    }

    fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
        (self.observation.relevance.embedding.clone(), self.observation.relevance.mlp.clone())
    }

    fn grow_embedding(mut self, vocabulary: usize, device: &Device) -> Self {
        self.observation.relevance = self.observation.relevance.grow(vocabulary, device);
        self
    }

    fn validate(_tower: TowerKind, _max_positions: usize, shape: &ObservationTowerConfig) -> Result<(), String> {
        shape.validate()
    }

    /// The observation tower's own record (this wrapper adds no parameters).
    fn write_record(&self, path: &Path) -> Result<(), String> {
        self.observation.clone().save_file(path).map_err(|e| e.to_string())
    }

    fn read_record(self, path: &Path) -> Result<Self, String> {
        Ok(ObservationDropout { observation: self.observation.try_load_file(path).map_err(|e| e.to_string())? })
    }

    fn objective_sum(&self, b: &BatchTensors, settings: &ObservationDropoutConfig) -> Tensor<1> {
        // The adversary is off (η = 0), so its label is never read.
        self.observation.objective_sum(b, &Objective { eta: 0.0, label: super::observation_tower::AdversarialLabel::Clicks, dropout: settings.rate })
    }
}
