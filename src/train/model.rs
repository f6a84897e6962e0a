//! The additive two-tower model in burn: logit = θ_k + b(z) + r(x), with r an embedding, linear or
//! MLP tower, and the weighted binary cross-entropy it is trained with (Hager Eq. 22).

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Int, Tensor, TensorData};

use super::config::{Architecture, TowerKind};

/// ELU with α = 1 (the Flax default Hager's code uses) as relu(x) + exp(min(x, 0)) − 1, with
/// min(x, 0) = x − relu(x): equal bit for bit to burn's `elu(x, 1.0)` and its gradient (1 at x = 0,
/// as burn's), but built from branch-free ops. burn's `elu` selects with `mask_where`, whose
/// data-dependent branch mispredicts on half the hidden units: a quarter of a training step in
/// issue 11's profile.
pub fn elu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let positive = relu(x.clone());
    let negative = x - positive.clone();
    positive + negative.exp().sub_scalar(1.0)
}

/// Layers applied in order with ELU between them; one layer is a linear model.
#[derive(Module, Debug)]
pub struct Mlp {
    pub layers: Vec<Linear>,
}

impl Mlp {
    pub fn new(input: usize, hidden_layers: usize, hidden_units: usize, device: &Device) -> Self {
        let mut layers = Vec::with_capacity(hidden_layers + 1);
        let mut width = input;
        for _ in 0..hidden_layers {
            layers.push(LinearConfig::new(width, hidden_units).init(device));
            width = hidden_units;
        }
        layers.push(LinearConfig::new(width, 1).init(device));
        Mlp { layers }
    }

    /// [n, input] → [n].
    pub fn forward(&self, x: Tensor<2>) -> Tensor<1> {
        let last = self.layers.len() - 1;
        let mut h = x;
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(h);
            if i < last {
                h = elu(h);
            }
        }
        h.squeeze_dim::<1>(1)
    }
}

/// The model. Unused parts are `None`, so one record type covers every tower.
#[derive(Module, Debug)]
pub struct TwoTower {
    /// θ_k for positions 1..=K (index k−1). Reported with θ_1 subtracted.
    pub theta: Param<Tensor<1>>,
    /// b(z) over bias features, when configured.
    pub bias_mlp: Option<Mlp>,
    /// γ_{q,d} for the embedding tower, indexed by the checkpoint's vocabulary.
    pub embedding: Option<Param<Tensor<1>>>,
    /// r(x) for the linear (no hidden layer) and MLP towers.
    pub relevance: Option<Mlp>,
}

/// One batch on the device: rows of whole sessions, packed (see `batch::SessionBatch`).
pub struct BatchTensors {
    /// 0-based position index.
    pub positions: Tensor<1, Int>,
    pub qd: Option<Tensor<1, Int>>,
    pub features: Option<Tensor<2>>,
    pub bias_features: Option<Tensor<2>>,
    pub clicks: Tensor<1>,
    pub weights: Tensor<1>,
}

impl TwoTower {
    /// A fresh model: θ = 0, γ = 0, layers with burn's default initialisation.
    pub fn new(arch: &Architecture, n_features: usize, n_bias_features: usize, vocabulary: usize, device: &Device) -> Self {
        let theta = Param::from_tensor(Tensor::zeros([arch.max_positions], device));
        let bias_mlp = arch.bias_feature_tower.then(|| Mlp::new(n_bias_features, 1, 16, device));
        let (embedding, relevance) = match arch.tower {
            TowerKind::Embedding => (Some(Param::from_tensor(Tensor::zeros([vocabulary.max(1)], device))), None),
            TowerKind::Linear => (None, Some(Mlp::new(n_features, 0, 0, device))),
            TowerKind::Mlp => (None, Some(Mlp::new(n_features, arch.hidden_layers, arch.hidden_units, device))),
        };
        TwoTower { theta, bias_mlp, embedding, relevance }
    }

    /// Relevance logits r(x) (or γ_{q,d}) of the batch's rows.
    pub fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        if let (Some(emb), Some(qd)) = (&self.embedding, &b.qd) {
            return emb.val().select(0, qd.clone());
        }
        let tower = self.relevance.as_ref().expect("a feature tower when there is no embedding");
        tower.forward(b.features.clone().expect("features for a feature tower"))
    }

    /// Click logits θ_k + b(z) + r(x).
    pub fn forward(&self, b: &BatchTensors) -> Tensor<1> {
        let mut logits = self.theta.val().select(0, b.positions.clone()) + self.relevance(b);
        if let (Some(mlp), Some(z)) = (&self.bias_mlp, &b.bias_features) {
            logits = logits + mlp.forward(z.clone());
        }
        logits
    }

    /// θ_k − θ_1 for k = 1..=K.
    pub fn theta_normalised(&self) -> Vec<f64> {
        let theta: Vec<f32> = self.theta.val().into_data().try_to_vec::<f32>().expect("θ is f32");
        theta.iter().map(|t| (*t - theta[0]) as f64).collect()
    }

    /// Grows the embedding to `vocabulary` entries (new pairs start at 0) for a warm start.
    pub fn grow_embedding(self, vocabulary: usize, device: &Device) -> Self {
        let Some(emb) = &self.embedding else { return self };
        let old: Vec<f32> = emb.val().into_data().try_to_vec::<f32>().expect("γ is f32");
        if old.len() >= vocabulary {
            return self;
        }
        let mut grown = old;
        grown.resize(vocabulary, 0.0);
        let embedding = Some(Param::from_tensor(Tensor::from_data(TensorData::new(grown, [vocabulary]), device)));
        TwoTower { embedding, ..self }
    }
}

/// Per-row binary cross-entropy with logits, −[c log σ(z) + (1−c) log(1−σ(z))], computed as
/// softplus(z) − c·z in the form that never overflows.
pub fn bce_with_logits(logits: Tensor<1>, clicks: Tensor<1>) -> Tensor<1> {
    let softplus = logits.clone().clamp_min(0.0) + logits.clone().abs().neg().exp().log1p();
    softplus - clicks * logits
}

/// Σ w·ℓ / denominator: N for Eq. 22, Σw when self-normalised.
pub fn weighted_loss(model: &TwoTower, b: &BatchTensors, denominator: f64) -> Tensor<1> {
    let per_row = bce_with_logits(model.forward(b), b.clicks.clone());
    (per_row * b.weights.clone()).sum().div_scalar(denominator)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::device::BackendKind;

    /// The branch-free ELU is burn's ELU: same values and same gradients, bit for bit, on both sides of 0.
    #[test]
    fn branch_free_elu_equals_burns_elu_and_its_gradient() {
        let device = BackendKind::Flex.autodiff_device().unwrap();
        let xs: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) / 173.0).chain([0.0, -1e-30, 1e-30, -80.0, 80.0]).collect();
        let weights: Vec<f32> = (0..xs.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let run = |f: &dyn Fn(Tensor<1>) -> Tensor<1>| -> (Vec<f32>, Vec<f32>) {
            let x = Tensor::<1>::from_data(TensorData::new(xs.clone(), [xs.len()]), &device).require_grad();
            let w = Tensor::<1>::from_data(TensorData::new(weights.clone(), [xs.len()]), &device);
            let y = f(x.clone());
            let grads = (y.clone() * w).sum().backward();
            (y.into_data().try_to_vec::<f32>().unwrap(), x.grad(&grads).unwrap().into_data().try_to_vec::<f32>().unwrap())
        };
        let (ours, our_grad) = run(&|x| elu(x));
        let (burns, burn_grad) = run(&|x| burn::tensor::activation::elu(x, 1.0));
        for i in 0..xs.len() {
            assert_eq!(ours[i].to_bits(), burns[i].to_bits(), "elu({}) = {} vs burn {}", xs[i], ours[i], burns[i]);
            assert_eq!(our_grad[i], burn_grad[i], "elu'({}) = {} vs burn {}", xs[i], our_grad[i], burn_grad[i]);
        }
    }
}
