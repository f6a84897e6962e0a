//! REM, regression EM (Wang et al. 2018, "Position Bias Estimation for Unbiased Learning to Rank
//! in Personal Search", §4; the REM baseline of Yan et al. 2022 Table 2): the examination
//! hypothesis P(C=1|q,d,k) = P(E=1|k)·P(R=1|q,d) with E and R latent. Each step is one online EM
//! iteration: the E-step posteriors of E and R given the click, from the current parameters and
//! without gradient, are the targets of the M-step's two cross-entropies, one per tower (Wang
//! regresses the relevance posterior with a GBDT; here the relevance tower takes its gradient).
//! For a row of n impressions and c clicks the posteriors are linear in c, so aggregated rows are
//! exact. IPS weights apply as to every pointwise model.

use burn::module::{Module, Param};
use burn::tensor::activation::{log_sigmoid, sigmoid};
use burn::tensor::{Device, Tensor};

use super::inputs::{BatchTensors, Dimensions};
use super::interface::Model;
use super::tower::{bce_with_logits, Mlp, RelevanceTower};

#[derive(Module, Debug)]
pub struct Rem {
    /// logit P(R=1|q,d).
    pub relevance: RelevanceTower,
    /// logit P(E=1|k) for positions 1..=K.
    pub examination: Param<Tensor<1>>,
}

impl Model for Rem {
    const NAME: &'static str = "rem";
    const SUMMARY: &'static str = "Wang et al. 2018: regression EM on the examination hypothesis (Yan 2022's REM).";
    type Shape = ();
    type Settings = ();

    fn new(dims: &Dimensions, _shape: &(), device: &Device) -> Self {
        Rem { relevance: RelevanceTower::new(dims, device), examination: Param::from_tensor(Tensor::zeros([dims.max_positions], device)) }
    }

    fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        self.relevance.forward(b)
    }

    fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
        (self.relevance.embedding.clone(), self.relevance.mlp.clone())
    }

    fn grow_embedding(mut self, vocabulary: usize, device: &Device) -> Self {
        self.relevance = self.relevance.grow(vocabulary, device);
        self
    }

    /// logit of P(E)·P(R): log p − log(1 − p) with log p = log σ(e) + log σ(r).
    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        let log_p = log_sigmoid(self.examination.val().select(0, b.positions.clone())) + log_sigmoid(self.relevance.forward(b));
        // p < 1 strictly; the clamp keeps log(1 − p) finite where both towers saturate.
        let log_p = log_p.clamp_max(-1.0e-6);
        log_p.clone() - log_p.exp().neg().log1p()
    }

    /// Σ w·[BCE(e_k, P(E=1|c)) + BCE(r, P(R=1|c))], the posteriors fixed (the E-step):
    /// P(E=1|c) = c + (1−c)·σ(e)(1−σ(r))/(1−σ(e)σ(r)), and symmetrically for R (c: the row's click rate).
    fn objective_sum(&self, b: &BatchTensors, _settings: &()) -> Tensor<1> {
        let e = self.examination.val().select(0, b.positions.clone());
        let r = self.relevance.forward(b);
        let (pe, pr) = (sigmoid(e.clone()).detach(), sigmoid(r.clone()).detach());
        let not_clicked = pe.clone().mul(pr.clone()).neg().add_scalar(1.0).clamp_min(1.0e-6);
        let c = b.clicks.clone();
        let unclicked = c.clone().neg().add_scalar(1.0);
        let examined = c.clone() + unclicked.clone() * pe.clone() * pr.clone().neg().add_scalar(1.0) / not_clicked.clone();
        let relevant = c + unclicked * pr * pe.neg().add_scalar(1.0) / not_clicked;
        ((bce_with_logits(e, examined) + bce_with_logits(r, relevant)) * b.weights.clone()).sum()
    }

    /// log P(E|k)/P(E|1) for k = 1..=K.
    fn position_bias(&self, _max_positions: usize) -> Vec<f64> {
        let e: Vec<f32> = log_sigmoid(self.examination.val()).into_data().try_to_vec::<f32>().expect("f32");
        e.iter().map(|v| (*v - e[0]) as f64).collect()
    }
}
