//! The parts every model shares: the ELU MLP, the relevance tower r(x) (embedding, linear or MLP)
//! and the binary cross-entropy with logits.

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor, TensorData};

use super::inputs::{BatchTensors, Dimensions, TowerKind};

/// ELU with α = 1 (the Flax default Hager's code uses) as relu(x) + exp(min(x, 0)) − 1, with
/// min(x, 0) = x − relu(x): equal bit for bit to burn's `elu(x, 1.0)` and its gradient (1 at x = 0,
/// as burn's), but built from branch-free ops. burn's `elu` selects with `mask_where`, whose
/// data-dependent branch mispredicts on half the hidden units, a large share of a training step's
/// profile (docs/benchmarks.md).
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
        Mlp::with_outputs(input, hidden_layers, hidden_units, 1, device)
    }

    /// An MLP whose last layer has `outputs` units (an embedding tower, Yan 2022 §3.2).
    pub fn with_outputs(input: usize, hidden_layers: usize, hidden_units: usize, outputs: usize, device: &Device) -> Self {
        let mut layers = Vec::with_capacity(hidden_layers + 1);
        let mut width = input;
        for _ in 0..hidden_layers {
            layers.push(LinearConfig::new(width, hidden_units).init(device));
            width = hidden_units;
        }
        layers.push(LinearConfig::new(width, outputs).init(device));
        Mlp { layers }
    }

    /// [n, input] → [n].
    pub fn forward(&self, x: Tensor<2>) -> Tensor<1> {
        self.forward_matrix(x).squeeze_dim::<1>(1)
    }

    /// [n, input] → [n, outputs].
    pub fn forward_matrix(&self, x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len() - 1;
        let mut h = x;
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(h);
            if i < last {
                h = elu(h);
            }
        }
        h
    }

    /// The scalar MLP x ↦ v·f(x) + c of a vector-output MLP f: its last layer folded with v and c
    /// (what serving an embedding model at a canonical position computes).
    pub fn folded(&self, v: Tensor<1>, c: f32) -> Mlp {
        let mut layers = self.layers.clone();
        let last = layers.pop().expect("an MLP has a layer");
        let [_, outputs] = last.weight.val().dims();
        let v2: Tensor<2> = v.clone().reshape([outputs, 1]);
        let weight = last.weight.val().matmul(v2.clone());
        let bias = match &last.bias {
            Some(b) => b.val().reshape([1, outputs]).matmul(v2).reshape([1]).add_scalar(c),
            None => Tensor::<1>::zeros([1], &v.device()).add_scalar(c),
        };
        layers.push(Linear { weight: Param::from_tensor(weight), bias: Some(Param::from_tensor(bias)) });
        Mlp { layers }
    }
}

/// A feature tower with a `dimension`-wide output r⃗(x) (Yan 2022 §3.2): `hidden_layers` ELU layers,
/// then a linear layer to the embedding (the linear tower: one layer).
pub fn vector_tower(dims: &Dimensions, dimension: usize, device: &Device) -> Mlp {
    let hidden = if dims.tower == TowerKind::Mlp { dims.hidden_layers } else { 0 };
    Mlp::with_outputs(dims.n_features, hidden, dims.hidden_units, dimension, device)
}

/// Small normal draws from a fixed generator, for parameters that must start apart from 0
/// (position embeddings: at 0 a dot product has no gradient).
pub fn normal_init(len: usize, sd: f32, seed: u64) -> Vec<f32> {
    use rand::SeedableRng;
    use rand_distr::Distribution;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let normal = rand_distr::Normal::new(0.0f32, sd).expect("valid normal");
    (0..len).map(|_| normal.sample(&mut rng)).collect()
}

/// The relevance tower r(x): γ_{q,d} per query-document pair (embedding), or an MLP over features
/// (no hidden layer: linear). The score a serving system ranks by.
#[derive(Module, Debug)]
pub struct RelevanceTower {
    /// γ_{q,d}, indexed by the checkpoint's vocabulary (0: unseen pair, γ = 0).
    pub embedding: Option<Param<Tensor<1>>>,
    pub mlp: Option<Mlp>,
}

impl RelevanceTower {
    pub fn new(dims: &Dimensions, device: &Device) -> Self {
        let (embedding, mlp) = new_parts(dims, device);
        RelevanceTower { embedding, mlp }
    }

    /// [rows] relevance logits of the batch.
    pub fn forward(&self, b: &BatchTensors) -> Tensor<1> {
        relevance_logits(&self.embedding, &self.mlp, b)
    }

    pub fn grow(self, vocabulary: usize, device: &Device) -> Self {
        RelevanceTower { embedding: grow_embedding(self.embedding, vocabulary, device), ..self }
    }
}

/// A relevance tower's parameters for `dims`: γ = 0, or layers with burn's default initialisation.
pub fn new_parts(dims: &Dimensions, device: &Device) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
    match dims.tower {
        TowerKind::Embedding => (Some(Param::from_tensor(Tensor::zeros([dims.vocabulary.max(1)], device))), None),
        TowerKind::Linear => (None, Some(Mlp::new(dims.n_features, 0, 0, device))),
        TowerKind::Mlp => (None, Some(Mlp::new(dims.n_features, dims.hidden_layers, dims.hidden_units, device))),
    }
}

/// r(x) (or γ_{q,d}) of the batch's rows.
pub fn relevance_logits(embedding: &Option<Param<Tensor<1>>>, mlp: &Option<Mlp>, b: &BatchTensors) -> Tensor<1> {
    if let (Some(emb), Some(qd)) = (embedding, &b.qd) {
        return emb.val().select(0, qd.clone());
    }
    let tower = mlp.as_ref().expect("a feature tower when there is no embedding");
    tower.forward(b.features.clone().expect("features for a feature tower"))
}

/// Grows γ to `vocabulary` entries (new pairs start at 0) for a warm start.
pub fn grow_embedding(embedding: Option<Param<Tensor<1>>>, vocabulary: usize, device: &Device) -> Option<Param<Tensor<1>>> {
    let emb = embedding?;
    let old: Vec<f32> = emb.val().into_data().try_to_vec::<f32>().expect("γ is f32");
    if old.len() >= vocabulary {
        return Some(emb);
    }
    let mut grown = old;
    grown.resize(vocabulary, 0.0);
    Some(Param::from_tensor(Tensor::from_data(TensorData::new(grown, [vocabulary]), device)))
}

/// Per-row binary cross-entropy with logits, −[c log σ(z) + (1−c) log(1−σ(z))], computed as
/// softplus(z) − c·z in the form that never overflows.
pub fn bce_with_logits<const D: usize>(logits: Tensor<D>, clicks: Tensor<D>) -> Tensor<D> {
    let softplus = logits.clone().clamp_min(0.0) + logits.clone().abs().neg().exp().log1p();
    softplus - clicks * logits
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::device::BackendKind;
    use burn::tensor::TensorData;

    /// The branch-free ELU is burn's ELU: same values and same gradients, bit for bit, on both sides of 0.
    pub fn branch_free_elu_equals_burns_elu_and_its_gradient() {
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
