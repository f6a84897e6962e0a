//! Gradient reversal (Zhang et al. 2023, "Towards Disentangling Relevance and Bias in Unbiased
//! Learning to Rank", §3.2 Eq. 8–9): the observation tower g(k, z) of `observation_tower.rs` with an
//! adversarial head on its ELU layer, trained by squared error towards a relevance signal (clicks by
//! default), whose gradient reaches the observation tower multiplied by −η: the tower is pushed to
//! forget what predicts relevance. Observation dropout may be combined with it (§5.5).
//! logit = r(x) + g(k, z); serving ranks by r(x).

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::inputs::{BatchTensors, Dimensions, TowerKind};
use super::interface::Model;
use super::observation_tower::{AdversarialLabel, ObservationModel, ObservationTowerConfig, Objective};
use super::tower::Mlp;

/// `[train.gradient_reversal]` (model = "gradient_reversal").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GradientReversalConfig {
    /// η: the adversarial gradient reaches the observation tower multiplied by −η (Zhang Fig. 6:
    /// best between 0.6 and 0.8 under a confounded policy).
    pub eta: f64,
    pub adversarial_label: AdversarialLabel,
    /// Observation dropout combined with the reversal (Zhang §5.5); 0 is none.
    pub dropout: f64,
}

impl Default for GradientReversalConfig {
    fn default() -> Self {
        GradientReversalConfig { eta: 0.6, adversarial_label: AdversarialLabel::Clicks, dropout: 0.0 }
    }
}

/// The model: the observation tower trained with the reversed adversary.
#[derive(Module, Debug)]
pub struct GradientReversal {
    pub observation: ObservationModel,
}

impl Model for GradientReversal {
    const NAME: &'static str = "gradient_reversal";
    const SUMMARY: &'static str = "Zhang 2023 §3.2: an observation tower with an adversarial head behind gradient reversal.";
    type Shape = ObservationTowerConfig;
    type Settings = GradientReversalConfig;

    fn validate_settings(settings: &GradientReversalConfig) -> Result<(), String> {
        let eta = settings.eta;
        if !(eta >= 0.0 && eta.is_finite()) {
            return Err(format!("key `train.gradient_reversal.eta` = {eta} must be >= 0"));
        }
        if !(0.0..1.0).contains(&settings.dropout) {
            return Err(format!("key `train.gradient_reversal.dropout` = {} must lie in [0, 1)", settings.dropout));
        }
        Ok(())
    }

    fn new(dims: &Dimensions, shape: &ObservationTowerConfig, device: &Device) -> Self {
        GradientReversal { observation: ObservationModel::new(dims, shape, device) }
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
        Ok(GradientReversal { observation: self.observation.try_load_file(path).map_err(|e| e.to_string())? })
    }

    fn objective_sum(&self, b: &BatchTensors, settings: &GradientReversalConfig) -> Tensor<1> {
        self.observation.objective_sum(b, &Objective { eta: settings.eta, label: settings.adversarial_label, dropout: settings.dropout })
    }

    fn needs_labels(settings: &GradientReversalConfig) -> Option<String> {
        (settings.eta > 0.0 && settings.adversarial_label == AdversarialLabel::TrueLabel)
            .then(|| "key `train.gradient_reversal.adversarial_label` = \"true_label\"".to_string())
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::config::TrainConfig;
    use crate::models::ModelKind;

    /// The registry names the setting that needs relevance labels (fit's refusal quotes it): the
    /// `true_label` adversary with η > 0, and nothing for its default (clicks), for η = 0, or for a
    /// model without that section.
    pub fn the_setting_that_needs_labels_is_named_by_the_model_that_has_it() {
        let mut config = TrainConfig::default();
        let sections = |c: &TrainConfig| c.sections.clone();
        assert_eq!(ModelKind::GradientReversal.needs_labels(&sections(&config)), None);
        config.sections.gradient_reversal.adversarial_label = AdversarialLabel::TrueLabel;
        let named = ModelKind::GradientReversal.needs_labels(&sections(&config)).expect("true_label needs labels");
        assert!(named.contains("train.gradient_reversal.adversarial_label") && named.contains("true_label"), "{named}");
        assert_eq!(ModelKind::Additive.needs_labels(&sections(&config)), None);
        config.sections.gradient_reversal.eta = 0.0;
        assert_eq!(ModelKind::GradientReversal.needs_labels(&sections(&config)), None);
    }
}
