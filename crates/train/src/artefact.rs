//! What a fit produces: the model with its meta (architecture, feature counts, the input
//! normaliser) and vocabulary, and the checks that decide whether it can read data or be
//! warm-started by a config.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::config::Architecture;
use super::data::Examples;
use super::models::AnyModel;

/// Standardisation of the tower's input features, fitted on the first training run and kept by warm
/// starts (so a checkpoint's weights always mean the same thing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Normalizer {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl Normalizer {
    /// From impression-weighted sums of each feature and its square over `n` impressions.
    pub(crate) fn from_sums(sum: &[f64], sq: &[f64], n: u64) -> Normalizer {
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
    /// The weight of the logged order against the clicks that training chose
    /// (`logged_order_combination.rs`); None before it ran or with it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logged_order_combination: Option<super::logged_order_weight::Weight>,
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

    /// Whether a config whose architecture is `arch` may warm-start from this model: the same model
    /// and the same shape. `this` names the model in the error ("the current model", its id).
    pub fn check_warm_start(&self, arch: &Architecture, this: &str) -> anyhow::Result<()> {
        let ours = &self.meta.architecture;
        if ours.model != arch.model {
            anyhow::bail!(
                "cannot warm-start from {this}: it is a `{}` model but the config trains `{}` (key `train.model`); train cold (without --warm-start)",
                ours.model.name(),
                arch.model.name()
            );
        }
        if *ours != *arch {
            anyhow::bail!("cannot warm-start from {this}: its architecture is {ours:?} but the config says {arch:?}; train cold (without --warm-start)");
        }
        Ok(())
    }

    pub fn check_compatible_with(&self, n_features: usize, n_bias_features: usize) -> anyhow::Result<()> {
        let a = &self.meta.architecture;
        if a.tower.reads_features() && n_features < self.meta.n_features {
            anyhow::bail!("the model reads {} features but the data has {}", self.meta.n_features, n_features);
        }
        if a.bias_feature_tower && n_bias_features != self.meta.n_bias_features {
            anyhow::bail!("the model reads {} bias features but the data has {}", self.meta.n_bias_features, n_bias_features);
        }
        Ok(())
    }

    /// θ_k − θ₁ (or the model's equivalent, see `AnyModel::position_bias`) for k = 1..=K.
    pub fn position_bias(&self) -> Vec<f64> {
        self.model.position_bias(self.meta.architecture.max_positions)
    }
}
