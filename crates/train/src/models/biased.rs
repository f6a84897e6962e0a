//! Biased (Zhang et al. 2023 §5.1, the "Biased baseline"): one tower r(x) fitted to the clicks as
//! they were logged, P(click) = σ(r(x)), with no position input. It learns relevance and exposure
//! together, so what it ranks by is the logging policy's click-through rate, not relevance.

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::tower::RelevanceTower;
use super::BatchTensors;
use super::Architecture;

#[derive(Module, Debug)]
pub struct Biased {
    pub relevance: RelevanceTower,
}

impl Biased {
    pub fn new(arch: &Architecture, n_features: usize, vocabulary: usize, device: &Device) -> Self {
        Biased { relevance: RelevanceTower::new(arch, n_features, vocabulary, device) }
    }

    /// σ⁻¹ P(click) = r(x): the same at every position.
    pub fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        self.relevance.forward(b)
    }
}
