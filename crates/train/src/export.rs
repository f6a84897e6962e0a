//! The framework-neutral export of a checkpoint (`relevance.json`, documented in
//! `docs/model-export.md`): the relevance tower, and for the additive model every part of the click
//! logit θ_k + b(z) + r(x), so a serving system can score items without `ultr` or burn.

use serde::{Deserialize, Serialize};

use super::artefact::{Normalizer, Trained};
use super::config::TowerKind;
use super::models::Mlp;

pub const EXPORT: &str = "relevance.json";
pub const FORMAT: &str = "ultr.relevance-tower";

/// One dense layer: `y = x · weight + bias`, `weight[i][j]` from input i to output j.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DenseLayer {
    pub weight: Vec<Vec<f32>>,
    pub bias: Vec<f32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RelevanceExport {
    pub format: String,
    pub version: u32,
    pub tower: TowerKind,
    /// Applied between layers (not after the last).
    pub activation: String,
    pub elu_alpha: f64,
    /// The tower reads features 1..=n_features of each item.
    pub n_features: usize,
    /// x ← (x − mean) / std before the first layer.
    pub standardization: Option<Normalizer>,
    pub layers: Vec<DenseLayer>,
    /// Embedding tower: γ per (query_id, doc_id); unseen pairs score 0.
    pub embedding: Vec<(String, String, f32)>,
    /// θ_k − θ_1 per position k = 1.. (the bias tower, for completeness; not used to rank).
    pub position_bias: Vec<f64>,
    /// The model (`[train] model`) the tower comes from.
    #[serde(default)]
    pub model: crate::config::ModelKind,
    /// Models whose logit does not factorise (edot, einter): the layers score an item as if shown at
    /// this position (1-based); absent for factorising models, whose r(x) needs no position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canonical_position: Option<usize>,
    /// The stream's `[decode.feature_schema]` the model was trained on: `features[..n_features]` name
    /// the tower's inputs in order (version 2; absent when none was configured: positional features).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_schema: Option<ultr_core::session::decode::FeatureSchema>,
    /// The additive model's whole click logit (version 2): θ_k and b(z) beside r(x) above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub click: Option<ClickExport>,
}

/// P(click | x, k, z) = σ(θ_k + b(z) + r(x)) for the additive model.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClickExport {
    /// θ_k for k = 1..=K, absolute (not relative to θ_1): the logit's position term.
    pub theta: Vec<f64>,
    /// b(z) over the item's bias features (raw, not standardised), when the model has one.
    pub bias_tower: Option<BiasTowerExport>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BiasTowerExport {
    pub n_bias_features: usize,
    /// Dense layers as for r(x), ELU between them; the single output is b(z).
    pub layers: Vec<DenseLayer>,
}

fn tensor_values<const D: usize>(t: burn::tensor::Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32 parameters")
}

fn dense_layers(mlp: &Mlp) -> Vec<DenseLayer> {
    mlp.layers
        .iter()
        .map(|layer| {
            let w = layer.weight.val();
            let [rows, cols] = w.dims();
            let flat = tensor_values(w);
            let weight = (0..rows).map(|i| flat[i * cols..(i + 1) * cols].to_vec()).collect();
            let bias = layer.bias.as_ref().map(|b| tensor_values(b.val())).unwrap_or_else(|| vec![0.0; cols]);
            DenseLayer { weight, bias }
        })
        .collect()
}

pub fn to_export(trained: &Trained) -> RelevanceExport {
    let (embedding, mlp) = trained.model.relevance_parts();
    let layers = mlp.as_ref().map(dense_layers).unwrap_or_default();
    let click = trained.model.click_graph().map(|(theta, bias)| ClickExport {
        theta: tensor_values(theta).into_iter().map(f64::from).collect(),
        bias_tower: bias.as_ref().map(|b| BiasTowerExport { n_bias_features: trained.meta.n_bias_features, layers: dense_layers(b) }),
    });
    let embedding = match &embedding {
        Some(e) => {
            let values = tensor_values(e.val());
            trained.vocabulary.iter().zip(values).skip(1).map(|((q, d), v)| (q.clone(), d.clone(), v)).collect()
        }
        None => Vec::new(),
    };
    RelevanceExport {
        format: FORMAT.into(),
        version: 2,
        tower: trained.meta.architecture.tower,
        activation: "elu".into(),
        elu_alpha: 1.0,
        n_features: trained.meta.n_features,
        standardization: trained.meta.normalizer.clone(),
        layers,
        embedding,
        position_bias: trained.position_bias(),
        model: trained.meta.architecture.model,
        canonical_position: trained.model.canonical_position(),
        feature_schema: trained.meta.feature_schema.clone(),
        click,
    }
}

/// Dense layers on `h`, ELU (α) between them; the first output.
fn apply_layers(mut h: Vec<f64>, layers: &[DenseLayer], elu_alpha: f64) -> f64 {
    let last = layers.len().saturating_sub(1);
    for (l, layer) in layers.iter().enumerate() {
        let mut next: Vec<f64> = layer.bias.iter().map(|b| *b as f64).collect();
        for (i, hi) in h.iter().enumerate() {
            for (j, w) in layer.weight[i].iter().enumerate() {
                next[j] += hi * *w as f64;
            }
        }
        if l < last {
            for v in &mut next {
                if *v < 0.0 {
                    *v = elu_alpha * (v.exp() - 1.0);
                }
            }
        }
        h = next;
    }
    h.first().copied().unwrap_or(0.0)
}

impl RelevanceExport {
    /// Scores one item's features exactly as the spec in `docs/model-export.md` says (a reference
    /// implementation, independent of burn; tests compare it with the burn model).
    pub fn score_features(&self, x: &[f32]) -> f64 {
        let h: Vec<f64> = x[..self.n_features]
            .iter()
            .enumerate()
            .map(|(j, v)| match &self.standardization {
                Some(n) => ((*v - n.mean[j]) / n.std[j]) as f64,
                None => *v as f64,
            })
            .collect();
        apply_layers(h, &self.layers, self.elu_alpha)
    }

    /// The additive model's click logit θ_k + b(z) + r(x) of an item at 1-based `position` (past
    /// the last θ: the last), by the spec; `None` for models without a `click` section.
    pub fn click_logit(&self, x: &[f32], position: usize, z: &[f32]) -> Option<f64> {
        let click = self.click.as_ref()?;
        let theta = click.theta[position.clamp(1, click.theta.len()) - 1];
        let b = click.bias_tower.as_ref().map_or(0.0, |t| apply_layers(z[..t.n_bias_features].iter().map(|v| *v as f64).collect(), &t.layers, self.elu_alpha));
        Some(theta + b + self.score_features(x))
    }
}
