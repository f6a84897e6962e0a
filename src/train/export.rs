//! The framework-neutral export of the relevance tower (`relevance.json`, documented in
//! `docs/model-export.md`) so a serving system can score items without `ultr` or burn.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::config::TowerKind;
use super::fit::{Normalizer, Trained};

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
    pub model: crate::train::config::ModelKind,
    /// Models whose logit does not factorise (edot, einter): the layers score an item as if shown at
    /// this position (1-based); absent for factorising models, whose r(x) needs no position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canonical_position: Option<usize>,
}

fn tensor_values<const D: usize>(t: burn::tensor::Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32 parameters")
}

pub fn to_export(trained: &Trained) -> RelevanceExport {
    let mut layers = Vec::new();
    let (embedding, mlp) = trained.model.relevance_parts();
    if let Some(mlp) = &mlp {
        for layer in &mlp.layers {
            let w = layer.weight.val();
            let [rows, cols] = w.dims();
            let flat = tensor_values(w);
            let weight = (0..rows).map(|i| flat[i * cols..(i + 1) * cols].to_vec()).collect();
            let bias = layer.bias.as_ref().map(|b| tensor_values(b.val())).unwrap_or_else(|| vec![0.0; cols]);
            layers.push(DenseLayer { weight, bias });
        }
    }
    let embedding = match &embedding {
        Some(e) => {
            let values = tensor_values(e.val());
            trained.vocabulary.iter().zip(values).skip(1).map(|((q, d), v)| (q.clone(), d.clone(), v)).collect()
        }
        None => Vec::new(),
    };
    RelevanceExport {
        format: FORMAT.into(),
        version: 1,
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
    }
}

pub fn write_export(dir: &Path, trained: &Trained) -> anyhow::Result<()> {
    let mut f = std::fs::File::create(dir.join(EXPORT))?;
    serde_json::to_writer(&mut f, &to_export(trained))?;
    f.sync_all()?;
    Ok(())
}

impl RelevanceExport {
    /// Scores one item's features exactly as the spec in `docs/model-export.md` says (a reference
    /// implementation, independent of burn; tests compare it with the burn model).
    pub fn score_features(&self, x: &[f32]) -> f64 {
        let mut h: Vec<f64> = x[..self.n_features]
            .iter()
            .enumerate()
            .map(|(j, v)| match &self.standardization {
                Some(n) => ((*v - n.mean[j]) / n.std[j]) as f64,
                None => *v as f64,
            })
            .collect();
        let last = self.layers.len().saturating_sub(1);
        for (l, layer) in self.layers.iter().enumerate() {
            let mut next: Vec<f64> = layer.bias.iter().map(|b| *b as f64).collect();
            for (i, hi) in h.iter().enumerate() {
                for (j, w) in layer.weight[i].iter().enumerate() {
                    next[j] += hi * *w as f64;
                }
            }
            if l < last {
                for v in &mut next {
                    if *v < 0.0 {
                        *v = self.elu_alpha * (v.exp() - 1.0);
                    }
                }
            }
            h = next;
        }
        h.first().copied().unwrap_or(0.0)
    }
}
