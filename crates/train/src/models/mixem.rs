//! MixEM, the mixture-of-click-models EM (Yan et al. 2022, "Revisiting Two-tower Models for
//! Unbiased Learning to Rank", §3.1 and §4.4): four component models share one position tower e(k)
//! and one relevance tower r(x) — RCM f₀ = θ₀, RCTR f₁ = θ₁ + e(k), DCTR f₂ = θ₂ + r(x),
//! PBM f₃ = e(k) + r(x). The E-step assigns each session s to the components by
//! p(α|s) ∝ exp(−ℓ_α(s)/T), ℓ_α(s) the session's click cross-entropy under f_α and T the temperature
//! (`[train.mixem] temperature`; with `learn_prior`, the default, times the mixing weight π_α, which
//! makes T = 1 plain EM on the sessions' mixture likelihood); the M-step minimises Σ_s Σ_α p(α|s)·ℓ_α(s) with p(α|s) fixed.
//! Both run on every batch of sessions (online EM). Serving ranks by r(x).
//!
//! The E-step needs each session's whole click pattern, so MixEM trains on sessions (lists), not on
//! aggregated rows, and takes no IPS weights (a per-item weight inside a session has no meaning for
//! the session's likelihood). For the gate and the monitor, which score (q,d,k) rows, its click
//! probability is the mixture's marginal Σ_α π_α σ(f_α), with mixing weights π_α learnt as the mean
//! E-step assignment (a cross-entropy term that reaches only π).

use burn::module::{Module, Param};
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::inputs::{BatchTensors, Dimensions};
use super::interface::Model;
use super::tower::{bce_with_logits, Mlp, RelevanceTower};

/// `[train.mixem]` (model = "mixem").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MixEmConfig {
    /// T: → 0 assigns each session to its best component; → ∞ trains every component on every session.
    pub temperature: f64,
    /// The E-step weighs each component by its learnt mixing weight, p(α|s) ∝ π_α·exp(−ℓ_α(s)/T):
    /// with T = 1 this is EM on the sessions' mixture likelihood, whose marginal click probability the
    /// gate and the monitor score. `false` is Yan's E-step (a uniform prior).
    pub learn_prior: bool,
}

impl Default for MixEmConfig {
    fn default() -> Self {
        MixEmConfig { temperature: 1.0, learn_prior: true }
    }
}

/// Components, in the order of their logits.
pub const COMPONENTS: [&str; 4] = ["RCM", "RCTR", "DCTR", "PBM"];

#[derive(Module, Debug)]
pub struct MixEm {
    pub relevance: RelevanceTower,
    /// e(k) for positions 1..=K.
    pub examination: Param<Tensor<1>>,
    /// θ₀, θ₁, θ₂.
    pub offsets: Param<Tensor<1>>,
    /// log π_α up to a constant (softmax gives π).
    pub mixing: Param<Tensor<1>>,
}

impl Model for MixEm {
    const NAME: &'static str = "mixem";
    const SUMMARY: &'static str = "Yan 2022 §3.1: a mixture of RCM, RCTR, DCTR and PBM fitted by EM over sessions.";
    const LISTWISE: bool = true;
    type Shape = ();
    type Settings = MixEmConfig;

    fn validate_settings(settings: &MixEmConfig) -> Result<(), String> {
        let t = settings.temperature;
        if !(t > 0.0 && t.is_finite()) {
            return Err(format!("key `train.mixem.temperature` = {t} must be > 0"));
        }
        Ok(())
    }

    fn new(dims: &Dimensions, _shape: &(), device: &Device) -> Self {
        MixEm {
            relevance: RelevanceTower::new(dims, device),
            examination: Param::from_tensor(Tensor::zeros([dims.max_positions], device)),
            offsets: Param::from_tensor(Tensor::zeros([3], device)),
            mixing: Param::from_tensor(Tensor::zeros([4], device)),
        }
    }

    /// logit of the marginal Σ_α π_α σ(f_α).
    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        let f = self.component_logits(b);
        let n = f.dims()[0];
        let pi = softmax(self.mixing.val(), 0).reshape([1, 4]).repeat_dim(0, n);
        let p = (burn::tensor::activation::sigmoid(f) * pi).sum_dim(1).squeeze_dim::<1>(1).clamp(1.0e-6, 1.0 - 1.0e-6);
        p.clone().log() - p.neg().log1p()
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

    /// Σ_s w_s·Σ_α p(α|s)·(ℓ_α(s) − log π_α), p(α|s) = softmax_α(−ℓ_α(s)/T [+ log π_α]) without
    /// gradient (the prior term with `learn_prior`).
    fn objective_sum(&self, b: &BatchTensors, settings: &MixEmConfig) -> Tensor<1> {
        let (temperature, learn_prior) = (settings.temperature, settings.learn_prior);
        let (losses, weight) = self.session_losses(b);
        let count = losses.dims()[0];
        let log_pi = log_softmax(self.mixing.val(), 0).reshape([1, 4]).repeat_dim(0, count);
        let mut evidence = losses.clone().div_scalar(-temperature);
        if learn_prior {
            evidence = evidence + log_pi.clone();
        }
        let posterior = softmax(evidence, 1).detach();
        ((losses - log_pi) * posterior * weight).sum()
    }

    /// What early stopping watches: the sessions' negative log-likelihood under the mixture,
    /// −Σ_s w_s·log Σ_α π_α exp(−ℓ_α(s)).
    fn fit_loss_sum(&self, b: &BatchTensors) -> Tensor<1> {
        let (losses, weight) = self.session_losses(b);
        let count = losses.dims()[0];
        let x = log_softmax(self.mixing.val(), 0).reshape([1, 4]).repeat_dim(0, count) - losses;
        let top = x.clone().max_dim(1).detach();
        let log_likelihood = (x - top.clone().repeat_dim(1, 4)).exp().sum_dim(1).log() + top;
        (log_likelihood * weight).sum().neg()
    }

    /// e(k) − e(1): the RCTR/PBM components' position logits.
    fn position_bias(&self, _max_positions: usize) -> Vec<f64> {
        let e: Vec<f32> = self.examination.val().into_data().try_to_vec::<f32>().expect("f32");
        e.iter().map(|v| (*v - e[0]) as f64).collect()
    }
}

impl MixEm {
    /// [rows, 4]: f₀..f₃ of every row.
    pub fn component_logits(&self, b: &BatchTensors) -> Tensor<2> {
        let r = self.relevance.forward(b);
        let n = r.dims()[0];
        let e = self.examination.val().select(0, b.positions.clone());
        let theta = self.offsets.val();
        let constant = |i: usize| theta.clone().slice([i..i + 1]).expand([n]);
        Tensor::stack(vec![constant(0), constant(1) + e.clone(), constant(2) + r.clone(), e + r], 1)
    }

    /// ℓ_α(s) of every list, [lists, 4], and each list's weight, [lists, 1].
    fn session_losses(&self, b: &BatchTensors) -> (Tensor<2>, Tensor<2>) {
        let lists = b.lists.as_ref().expect("MixEM batches are laid out as sessions");
        let (count, width) = (lists.count, lists.width);
        let f = self.component_logits(b);
        let clicks = b.clicks.clone().reshape([count * width, 1]).repeat_dim(1, 4);
        let mask = lists.mask.clone().reshape([count, width, 1]).repeat_dim(2, 4);
        let losses = (bce_with_logits(f, clicks).reshape([count, width, 4]) * mask).sum_dim(1).reshape([count, 4]);
        let weight = b.weights.clone().reshape([count, width]).slice([0..count, 0..1]);
        (losses, weight)
    }

    /// π_α, in `COMPONENTS` order.
    pub fn mixing_weights(&self) -> Vec<f64> {
        softmax(self.mixing.val(), 0).into_data().try_to_vec::<f32>().expect("f32").into_iter().map(f64::from).collect()
    }
}
