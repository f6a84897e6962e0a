//! Biased (Zhang et al. 2023 §5.1, the "Biased baseline"): one tower r(x) fitted to the clicks as
//! they were logged, P(click) = σ(r(x)), with no position input. It learns relevance and exposure
//! together, so what it ranks by is the logging policy's click-through rate, not relevance.

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor};

use super::inputs::{BatchTensors, Dimensions};
use super::interface::Model;
use super::tower::{Mlp, RelevanceTower};

#[derive(Module, Debug)]
pub struct Biased {
    pub relevance: RelevanceTower,
}

impl Model for Biased {
    const NAME: &'static str = "biased";
    const SUMMARY: &'static str = "One tower, no position input (Zhang 2023 §5.1).";
    const POSITION_PARAMETERS: bool = false;
    type Shape = ();
    type Settings = ();

    fn new(dims: &Dimensions, _shape: &(), device: &Device) -> Self {
        Biased { relevance: RelevanceTower::new(dims, device) }
    }

    /// σ⁻¹ P(click) = r(x): the same at every position.
    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        self.relevance.forward(b)
    }

    fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        self.relevance.forward(b)
    }

    /// 0 at every position: the model assumes no position bias.
    fn position_bias(&self, max_positions: usize) -> Vec<f64> {
        vec![0.0; max_positions]
    }

    fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
        (self.relevance.embedding.clone(), self.relevance.mlp.clone())
    }

    fn grow_embedding(mut self, vocabulary: usize, device: &Device) -> Self {
        self.relevance = self.relevance.grow(vocabulary, device);
        self
    }
}
