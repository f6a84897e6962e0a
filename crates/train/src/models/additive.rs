//! PAL / the additive two-tower model (Guo et al. 2019; Hager et al. 2025 Eq. 1 and Eq. 22):
//! logit = θ_k + b(z) + r(x), trained with the inverse-propensity-weighted binary cross-entropy.
//! The fields keep the names of the single model `ultr` trained before the model family, so
//! its checkpoints load unchanged.

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor};

use super::inputs::{BatchTensors, Dimensions};
use super::interface::Model;
use super::tower::{grow_embedding, new_parts, relevance_logits, Mlp};

#[derive(Module, Debug)]
pub struct Additive {
    /// θ_k for positions 1..=K (index k−1). Reported with θ_1 subtracted.
    pub theta: Param<Tensor<1>>,
    /// b(z) over bias features, when configured.
    pub bias_mlp: Option<Mlp>,
    /// γ_{q,d} for the embedding tower, indexed by the checkpoint's vocabulary.
    pub embedding: Option<Param<Tensor<1>>>,
    /// r(x) for the linear (no hidden layer) and MLP towers.
    pub relevance: Option<Mlp>,
}

impl Model for Additive {
    const NAME: &'static str = "additive";
    const ALIASES: &'static [&'static str] = &["pal"];
    const SUMMARY: &'static str = "θ_k + b(z) + r(x): PAL, Hager Eq. 22 (the default).";
    type Shape = ();
    type Settings = ();

    /// θ = 0, γ = 0, layers with burn's default initialisation.
    fn new(dims: &Dimensions, _shape: &(), device: &Device) -> Self {
        let theta = Param::from_tensor(Tensor::zeros([dims.max_positions], device));
        let bias_mlp = dims.bias_feature_tower.then(|| Mlp::new(dims.n_bias_features, 1, 16, device));
        let (embedding, relevance) = new_parts(dims, device);
        Additive { theta, bias_mlp, embedding, relevance }
    }

    fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        relevance_logits(&self.embedding, &self.relevance, b)
    }

    /// θ_k + r(x) + b(z), summed in the order `ultr` always summed them (bit-identical logits).
    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        let mut logits = self.theta.val().select(0, b.positions.clone()) + self.relevance(b);
        if let (Some(mlp), Some(z)) = (&self.bias_mlp, &b.bias_features) {
            logits = logits + mlp.forward(z.clone());
        }
        logits
    }

    /// θ_k − θ_1 for k = 1..=K.
    fn position_bias(&self, _max_positions: usize) -> Vec<f64> {
        let theta: Vec<f32> = self.theta.val().into_data().try_to_vec::<f32>().expect("θ is f32");
        theta.iter().map(|t| (*t - theta[0]) as f64).collect()
    }

    fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
        (self.embedding.clone(), self.relevance.clone())
    }

    fn grow_embedding(self, vocabulary: usize, device: &Device) -> Self {
        Additive { embedding: grow_embedding(self.embedding, vocabulary, device), ..self }
    }

    fn has_position_logits(&self) -> bool {
        true
    }

    fn click_graph(&self) -> Option<(Tensor<1>, Option<Mlp>)> {
        Some((self.theta.val(), self.bias_mlp.clone()))
    }

    /// The tower's name alone, as reports named the additive model before the model family.
    fn label(tower: super::inputs::TowerKind) -> String {
        tower.name().to_string()
    }

    /// θ_k += δ_k (positions beyond `delta` unchanged).
    fn shift_position_logits(&mut self, delta: &[f32]) -> bool {
        let theta = self.theta.val();
        let device = theta.device();
        let k = theta.dims()[0];
        let mut padded = delta.to_vec();
        padded.resize(k, 0.0);
        let shift = Tensor::<1>::from_data(burn::tensor::TensorData::new(padded, [k]), &device);
        self.theta = self.theta.clone().map(|t| t + shift);
        true
    }

    fn freeze_position_logits(&mut self) -> bool {
        self.theta = self.theta.clone().set_require_grad(false);
        true
    }

    fn pair_relevance(&self) -> Option<Vec<f32>> {
        let gamma = self.embedding.as_ref()?;
        Some(gamma.val().into_data().try_to_vec::<f32>().expect("γ is f32"))
    }

    fn set_pair_relevance(&mut self, gamma: &[f32]) -> bool {
        let Some(old) = &self.embedding else { return false };
        let device = old.val().device();
        let replaced = Tensor::<1>::from_data(burn::tensor::TensorData::new(gamma.to_vec(), [gamma.len()]), &device);
        self.embedding = Some(old.clone().map(|_| replaced));
        true
    }
}

impl Additive {
    /// The observation logit θ_k + b(z).
    pub fn observation(&self, b: &BatchTensors) -> Tensor<1> {
        let mut logits = self.theta.val().select(0, b.positions.clone());
        if let (Some(mlp), Some(z)) = (&self.bias_mlp, &b.bias_features) {
            logits = logits + mlp.forward(z.clone());
        }
        logits
    }
}
