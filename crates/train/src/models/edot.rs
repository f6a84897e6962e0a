//! EDot, the embedding dot-product model (Yan et al. 2022, "Revisiting Two-tower Models for
//! Unbiased Learning to Rank", §3.2 Eq. 4): the relevance
//! tower outputs an embedding r⃗(x) of `[train.embedding_model] dimension` D, the position tower an
//! embedding e⃗(k), and logit P(click) = r⃗(x)·e⃗(k). Position and relevance do not factorise, so
//! serving scores every item at one canonical position c (`canonical_position`, 1 by default):
//! r(x) = r⃗(x)·e⃗(c), exported as the tower with its last layer folded with e⃗(c).

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::inputs::{BatchTensors, Dimensions, TowerKind};
use super::interface::Model;
use super::tower::{normal_init, vector_tower, Mlp};

/// `[train.embedding_model]`: the shape of EDot and EInter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddingModelConfig {
    /// D_emb, the width of r⃗(x) and e⃗(k) (Yan §4.4 picks it by validation nDCG).
    pub dimension: usize,
    /// The position (1-based) every item is scored at for serving.
    pub canonical_position: usize,
}

impl Default for EmbeddingModelConfig {
    fn default() -> Self {
        EmbeddingModelConfig { dimension: 8, canonical_position: 1 }
    }
}

impl EmbeddingModelConfig {
    /// EDot's and EInter's checks: a feature tower, a width, a canonical position that exists.
    pub fn validate(&self, model: &str, tower: TowerKind, max_positions: usize) -> Result<(), String> {
        if tower == TowerKind::Embedding {
            return Err(format!("key `train.tower` = \"embedding\" cannot feed model `{model}`: its relevance tower outputs an embedding of features (use \"linear\" or \"mlp\")"));
        }
        if self.dimension == 0 {
            return Err("key `train.embedding_model.dimension` must be >= 1".into());
        }
        let c = self.canonical_position;
        if !(1..=max_positions).contains(&c) {
            return Err(format!("key `train.embedding_model.canonical_position` = {c} must lie in 1..={max_positions} (train.max_positions)"));
        }
        Ok(())
    }
}

/// r⃗(x) of the batch's rows, [rows, D] (EDot and EInter need a feature tower).
pub fn relevance_vectors(tower: &Mlp, b: &BatchTensors) -> Tensor<2> {
    tower.forward_matrix(b.features.clone().expect("EDot/EInter read features (an embedding tower is refused by validation)"))
}

/// The position embeddings e⃗(k), [K, D], started apart (at 0 a dot product has no gradient).
pub fn position_embeddings(max_positions: usize, dimension: usize, seed: u64, device: &Device) -> Param<Tensor<2>> {
    let k = max_positions;
    Param::from_tensor(Tensor::from_data(TensorData::new(normal_init(k * dimension, 0.3, seed), [k, dimension]), device))
}

/// The mean item's embedding r⃗(0) (standardised features are 0 at their mean), [1, D].
pub fn mean_item(tower: &Mlp) -> Tensor<2> {
    let input = tower.layers[0].weight.val().dims()[0];
    tower.forward_matrix(Tensor::zeros([1, input], &tower.layers[0].weight.val().device()))
}

#[derive(Module, Debug)]
pub struct EDot {
    /// x ↦ r⃗(x).
    pub relevance: Mlp,
    /// e⃗(k), [K, D].
    pub position: Param<Tensor<2>>,
    /// c − 1 (0-based), from the architecture.
    pub canonical: usize,
}

impl Model for EDot {
    const NAME: &'static str = "edot";
    const SUMMARY: &'static str = "Yan 2022 Eq. 4: r⃗(x)·e⃗(k).";
    const EMBEDDING_INTERACTION: bool = true;
    type Shape = EmbeddingModelConfig;
    type Settings = ();

    fn new(dims: &Dimensions, shape: &EmbeddingModelConfig, device: &Device) -> Self {
        EDot {
            relevance: vector_tower(dims, shape.dimension, device),
            position: position_embeddings(dims.max_positions, shape.dimension, 0x2022_0004, device),
            canonical: shape.canonical_position.saturating_sub(1),
        }
    }

    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        let r = relevance_vectors(&self.relevance, b);
        let e = self.position.val().select(0, b.positions.clone());
        (r * e).sum_dim(1).squeeze_dim::<1>(1)
    }

    /// r⃗(x)·e⃗(c).
    fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        let [_, d] = self.position.val().dims();
        relevance_vectors(&self.relevance, b).matmul(self.canonical_embedding().reshape([d, 1])).squeeze_dim::<1>(1)
    }

    /// r⃗(0)·(e⃗(k) − e⃗(1)): the position effect on the mean item's logit.
    fn position_bias(&self, _max_positions: usize) -> Vec<f64> {
        let [k, d] = self.position.val().dims();
        let logits: Vec<f32> = self.position.val().matmul(mean_item(&self.relevance).reshape([d, 1])).reshape([k]).into_data().try_to_vec::<f32>().expect("f32");
        logits.iter().map(|v| (*v - logits[0]) as f64).collect()
    }

    /// The serving tower x ↦ r⃗(x)·e⃗(c), one scalar MLP.
    fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
        (None, Some(self.serving_tower()))
    }

    fn canonical_position(&self) -> Option<usize> {
        Some(self.canonical + 1)
    }

    /// A feature tower only: no vocabulary.
    fn grow_embedding(self, _vocabulary: usize, _device: &Device) -> Self {
        self
    }

    fn validate(tower: TowerKind, max_positions: usize, shape: &EmbeddingModelConfig) -> Result<(), String> {
        shape.validate(Self::NAME, tower, max_positions)
    }
}

impl EDot {
    fn canonical_embedding(&self) -> Tensor<1> {
        let [_, d] = self.position.val().dims();
        self.position.val().slice([self.canonical..self.canonical + 1, 0..d]).reshape([d])
    }

    /// The serving tower: x ↦ r⃗(x)·e⃗(c) as one scalar MLP.
    pub fn serving_tower(&self) -> Mlp {
        self.relevance.folded(self.canonical_embedding(), 0.0)
    }
}
