//! EInter, the embedding interaction model (Yan et al. 2022, "Revisiting Two-tower Models for
//! Unbiased Learning to Rank", §3.2 Eq. 5): logit P(click) = r⃗ᵀ B e⃗ + b⃗_r·r⃗ + b⃗_e·e⃗ + b, with
//! r⃗(x) and e⃗(k) D-wide embeddings of the relevance and position towers (`[train.embedding_model]`).
//! At B = 0 it is an additive model. Serving scores every item at the canonical position c:
//! r(x) = r⃗·(B e⃗(c) + b⃗_r) + b⃗_e·e⃗(c) + b, exported as the tower with its last layer folded.

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor, TensorData};

use super::edot::{mean_item, position_embeddings, relevance_vectors, EmbeddingModelConfig};
use super::inputs::{BatchTensors, Dimensions, TowerKind};
use super::interface::Model;
use super::tower::{normal_init, vector_tower, Mlp};

#[derive(Module, Debug)]
pub struct EInter {
    /// x ↦ r⃗(x).
    pub relevance: Mlp,
    /// e⃗(k), [K, D].
    pub position: Param<Tensor<2>>,
    /// B, [D, D].
    pub interaction: Param<Tensor<2>>,
    /// b⃗_r, [D].
    pub relevance_weight: Param<Tensor<1>>,
    /// b⃗_e, [D].
    pub position_weight: Param<Tensor<1>>,
    /// b, [1].
    pub offset: Param<Tensor<1>>,
    /// c − 1 (0-based), from the architecture.
    pub canonical: usize,
}

impl Model for EInter {
    const NAME: &'static str = "einter";
    const SUMMARY: &'static str = "Yan 2022 Eq. 5: r⃗ᵀB e⃗ + b⃗_r·r⃗ + b⃗_e·e⃗ + b.";
    const EMBEDDING_INTERACTION: bool = true;
    type Shape = EmbeddingModelConfig;
    type Settings = ();

    fn new(dims: &Dimensions, shape: &EmbeddingModelConfig, device: &Device) -> Self {
        let d = shape.dimension;
        let vector = |len: usize, sd: f32, seed: u64| -> Tensor<1> { Tensor::from_data(TensorData::new(normal_init(len, sd, seed), [len]), device) };
        EInter {
            relevance: vector_tower(dims, d, device),
            position: position_embeddings(dims.max_positions, d, 0x2022_0005, device),
            interaction: Param::from_tensor(vector(d * d, 0.05, 0x2022_0006).reshape([d, d])),
            relevance_weight: Param::from_tensor(vector(d, 0.3, 0x2022_0007)),
            position_weight: Param::from_tensor(vector(d, 0.3, 0x2022_0008)),
            offset: Param::from_tensor(Tensor::zeros([1], device)),
            canonical: shape.canonical_position.saturating_sub(1),
        }
    }

    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        self.logits(relevance_vectors(&self.relevance, b), self.position.val().select(0, b.positions.clone()))
    }

    /// The logit at the canonical position.
    fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        let (v, c) = self.canonical_form();
        let d = v.dims()[0];
        relevance_vectors(&self.relevance, b).matmul(v.reshape([d, 1])).squeeze_dim::<1>(1) + c
    }

    /// The mean item's logit at k minus at 1.
    fn position_bias(&self, _max_positions: usize) -> Vec<f64> {
        let k = self.position.val().dims()[0];
        let r = mean_item(&self.relevance).repeat_dim(0, k);
        let logits: Vec<f32> = self.logits(r, self.position.val()).into_data().try_to_vec::<f32>().expect("f32");
        logits.iter().map(|v| (*v - logits[0]) as f64).collect()
    }

    /// The serving tower: the canonical-position logit as one scalar MLP.
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

impl EInter {
    /// Logits of relevance embeddings r [n, D] against position embeddings e [n, D].
    fn logits(&self, r: Tensor<2>, e: Tensor<2>) -> Tensor<1> {
        let d = self.relevance_weight.val().dims()[0];
        let quadratic = (r.clone().matmul(self.interaction.val()) * e.clone()).sum_dim(1);
        let linear = r.matmul(self.relevance_weight.val().reshape([d, 1])) + e.matmul(self.position_weight.val().reshape([d, 1]));
        (quadratic + linear).squeeze_dim::<1>(1) + self.offset.val()
    }

    /// (v, c) with the canonical-position logit = r⃗·v + c: v = B e⃗(c) + b⃗_r, c = b⃗_e·e⃗(c) + b.
    fn canonical_form(&self) -> (Tensor<1>, Tensor<1>) {
        let [_, d] = self.position.val().dims();
        let e = self.position.val().slice([self.canonical..self.canonical + 1, 0..d]).reshape([d, 1]);
        let v = self.interaction.val().matmul(e.clone()).reshape([d]) + self.relevance_weight.val();
        let c = self.position_weight.val().reshape([1, d]).matmul(e).reshape([1]) + self.offset.val();
        (v, c)
    }

    /// The serving tower: the canonical-position logit as one scalar MLP.
    pub fn serving_tower(&self) -> Mlp {
        let (v, c) = self.canonical_form();
        let c = c.into_data().try_to_vec::<f32>().expect("f32")[0];
        self.relevance.folded(v, c)
    }
}
