//! Click models: additive PBM (Hager §7), examination PBM, DCM and CPM (Zhuang 2021 §5.2), and
//! per-session mixtures of RCM/RCTR/DCTR/PBM (Yan 2022 §4.1.2).

use rand::Rng;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClickModelKind {
    /// P(c) = σ(θ_k + rel − 2), θ_k = −ln k.
    AdditivePbm,
    /// P(c) = γ_k·ω, γ_k = (1/k)^η.
    ExaminationPbm,
    /// Cascade: examine top-down, click with ω, continue after a click with prob `dcm_continue`.
    Dcm,
    /// PBM pass; each click starts a sub-pass examining k with 1/|p_k − p_j|.
    Cpm,
    /// Per session one of RCM, RCTR, DCTR, PBM drawn by `mixture` weights.
    Mixture,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClickModel {
    pub kind: ClickModelKind,
    /// Examination exponent η in γ_k = (1/k)^η.
    pub eta: f64,
    /// ε in ω = ε + (1−ε)(2^y − 1)/(2^ymax − 1).
    pub epsilon: f64,
    /// DCM: probability to continue after a click.
    pub dcm_continue: f64,
    /// Mixture weights RCM:RCTR:DCTR:PBM (e.g. 0:1:1:0).
    pub mixture: [f64; 4],
}

impl Default for ClickModel {
    fn default() -> Self {
        ClickModel { kind: ClickModelKind::AdditivePbm, eta: 1.0, epsilon: 0.1, dcm_continue: 0.1, mixture: [0.0, 1.0, 1.0, 0.0] }
    }
}

/// What the click models need to know about one displayed document.
#[derive(Debug, Clone, Copy)]
pub struct DocTruth {
    /// Relevance on [0, 4] (the additive model's scale).
    pub relevance: f64,
    /// Attractiveness ω from the graded label.
    pub omega: f64,
}

pub use ultr_core::math::sigmoid;

/// Additive model's true position logit.
pub fn theta(position: usize) -> f64 {
    -(position as f64).ln()
}

/// ω = ε + (1−ε)(2^y − 1)/(2^ymax − 1).
pub fn omega(epsilon: f64, y: f64, y_max: f64) -> f64 {
    let y = y.clamp(0.0, y_max); // synthetic relevance has unclipped tails; a probability must stay in [ε, 1]
    epsilon + (1.0 - epsilon) * (2f64.powf(y) - 1.0) / (2f64.powf(y_max) - 1.0)
}

impl ClickModel {
    /// Examination probability γ_k.
    pub fn gamma(&self, position: usize) -> f64 {
        (1.0 / position as f64).powf(self.eta)
    }

    /// Mixture weights as `parse_mixture` reads them (`0:1:1:0`).
    pub fn mixture_text(weights: &[f64; 4]) -> String {
        weights.iter().map(f64::to_string).collect::<Vec<_>>().join(":")
    }

    /// Parses `a:b:c:d` mixture weights.
    pub fn parse_mixture(text: &str) -> anyhow::Result<[f64; 4]> {
        let parts: Vec<f64> = text
            .split(':')
            .map(|p| p.trim().parse::<f64>().map_err(|_| anyhow::anyhow!("mixture weight `{p}` is not a number")))
            .collect::<anyhow::Result<_>>()?;
        let w: [f64; 4] = parts.try_into().map_err(|_| anyhow::anyhow!("mixture needs 4 weights RCM:RCTR:DCTR:PBM, got `{text}`"))?;
        anyhow::ensure!(w.iter().all(|x| *x >= 0.0 && x.is_finite()) && w.iter().sum::<f64>() > 0.0, "mixture weights must be >= 0 and not all 0: `{text}`");
        Ok(w)
    }

    /// Clicks for one session; `shown[i]` is the document at position i + 1.
    pub fn clicks(&self, shown: &[DocTruth], rng: &mut impl Rng) -> Vec<bool> {
        let n = shown.len();
        let bern = |rng: &mut dyn rand::RngCore, p: f64| rng.random::<f64>() < p;
        match self.kind {
            ClickModelKind::AdditivePbm => (0..n).map(|i| bern(rng, sigmoid(theta(i + 1) + shown[i].relevance - 2.0))).collect(),
            ClickModelKind::ExaminationPbm => (0..n).map(|i| bern(rng, self.gamma(i + 1) * shown[i].omega)).collect(),
            ClickModelKind::Dcm => {
                let mut out = vec![false; n];
                for i in 0..n {
                    if bern(rng, shown[i].omega) {
                        out[i] = true;
                        if !bern(rng, self.dcm_continue) {
                            break;
                        }
                    }
                }
                out
            }
            ClickModelKind::Cpm => {
                let mut out = vec![false; n];
                for j in 0..n {
                    if bern(rng, self.gamma(j + 1)) && bern(rng, shown[j].omega) {
                        out[j] = true;
                        // Sub-process: examine others by distance; its clicks start no new sub-process.
                        for k in (0..n).filter(|&k| k != j) {
                            let dist = (k as f64 - j as f64).abs();
                            if bern(rng, 1.0 / dist) && bern(rng, shown[k].omega) {
                                out[k] = true;
                            }
                        }
                    }
                }
                out
            }
            ClickModelKind::Mixture => {
                let total: f64 = self.mixture.iter().sum();
                let mut u = rng.random::<f64>() * total;
                let mut which = 3;
                for (m, w) in self.mixture.iter().enumerate() {
                    if u < *w {
                        which = m;
                        break;
                    }
                    u -= w;
                }
                (0..n)
                    .map(|i| {
                        let p = match which {
                            0 => 0.1,
                            1 => 0.5 * self.gamma(i + 1),
                            2 => 0.5 * shown[i].omega,
                            _ => shown[i].omega * self.gamma(i + 1),
                        };
                        bern(rng, p)
                    })
                    .collect()
            }
        }
    }

    /// Expected click probability at each position for one query, given the displayed order is
    /// `ranking` with probability 1 − τ and a uniformly random permutation with probability τ.
    /// Exact for the additive/examination PBM, mixtures and DCM; `None` for CPM (no closed form here).
    pub fn expected_ctr(&self, docs: &[DocTruth], ranking: &[usize], tau: f64) -> Option<Vec<f64>> {
        let n = docs.len();
        let mut det = vec![0.0; n];
        let mut uni = vec![0.0; n];
        match self.kind {
            ClickModelKind::AdditivePbm | ClickModelKind::ExaminationPbm | ClickModelKind::Mixture => {
                let total: f64 = self.mixture.iter().sum();
                let p = |k: usize, d: &DocTruth| match self.kind {
                    ClickModelKind::AdditivePbm => sigmoid(theta(k) + d.relevance - 2.0),
                    ClickModelKind::ExaminationPbm => self.gamma(k) * d.omega,
                    // Pointwise mixture: the per-position marginal is the weighted sum of the parts.
                    _ => {
                        let parts = [0.1, 0.5 * self.gamma(k), 0.5 * d.omega, d.omega * self.gamma(k)];
                        parts.iter().zip(&self.mixture).map(|(p, w)| p * w).sum::<f64>() / total
                    }
                };
                for k in 0..n {
                    det[k] = p(k + 1, &docs[ranking[k]]);
                    uni[k] = docs.iter().map(|d| p(k + 1, d)).sum::<f64>() / n as f64;
                }
            }
            ClickModelKind::Dcm => {
                // Passing a document without stopping: 1 − ω + ω·continue.
                let pass = |d: &DocTruth| 1.0 - d.omega * (1.0 - self.dcm_continue);
                let mut reach = 1.0;
                for k in 0..n {
                    let d = &docs[ranking[k]];
                    det[k] = reach * d.omega;
                    reach *= pass(d);
                }
                // Uniform order: P(click at k) = (1/n) Σ_d ω_d · e_{k−1}(pass of the others) / C(n−1, k−1).
                for (di, d) in docs.iter().enumerate() {
                    let others: Vec<f64> = docs.iter().enumerate().filter(|(j, _)| *j != di).map(|(_, o)| pass(o)).collect();
                    let e = elementary_symmetric(&others);
                    for k in 0..n {
                        uni[k] += d.omega * e[k] / binomial(n - 1, k) / n as f64;
                    }
                }
            }
            _ => return None,
        }
        Some((0..n).map(|k| (1.0 - tau) * det[k] + tau * uni[k]).collect())
    }
}

/// e_0..e_m of the values (e_0 = 1).
fn elementary_symmetric(values: &[f64]) -> Vec<f64> {
    let mut e = vec![0.0; values.len() + 1];
    e[0] = 1.0;
    for (i, &v) in values.iter().enumerate() {
        for j in (1..=i + 1).rev() {
            e[j] += v * e[j - 1];
        }
    }
    e
}

fn binomial(n: usize, k: usize) -> f64 {
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}
