//! Logging policies (Hager §7, Eq. 25): a ranker f fitted on the relevance labels, blended with fixed
//! per-(q,d) noise by α, then made stochastic by ε-greedy temperature τ or Plackett-Luce sampling.

use ndarray::{Array1, Array2, Axis};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RankerKind {
    /// f = the true relevance itself (an oracle policy).
    Oracle,
    /// Ridge regression on the features.
    Linear,
    /// 16-unit tanh MLP fitted with Adam on squared error.
    Mlp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// With probability τ a uniformly random permutation, else the deterministic ranking.
    EpsilonGreedy,
    /// Sample without replacement with probability ∝ exp(score / temperature).
    PlackettLuce,
}

/// Fits f on (x, y) and returns its predictions on x.
pub fn fit_ranker(kind: RankerKind, x: &Array2<f32>, y: &[f64], rng: &mut impl Rng) -> Vec<f64> {
    match kind {
        RankerKind::Oracle => y.to_vec(),
        RankerKind::Linear => ridge_predict(x, y, 1e-3),
        RankerKind::Mlp => mlp_predict(x, y, rng),
    }
}

/// Ridge regression with an intercept: predictions on x.
fn ridge_predict(x: &Array2<f32>, y: &[f64], lambda: f64) -> Vec<f64> {
    let w = ridge_fit(x, y, lambda);
    let (n, d) = x.dim();
    (0..n).map(|i| w[0] + (0..d).map(|j| w[j + 1] * x[(i, j)] as f64).sum::<f64>()).collect()
}

/// Ridge regression with an intercept, solved by Cholesky on the normal equations: [intercept, w…].
pub fn ridge_fit(x: &Array2<f32>, y: &[f64], lambda: f64) -> Array1<f64> {
    let (n, d) = x.dim();
    let mut a = Array2::<f64>::zeros((d + 1, d + 1));
    let mut b = Array1::<f64>::zeros(d + 1);
    let mut row = vec![0f64; d + 1];
    for i in 0..n {
        row[0] = 1.0;
        for j in 0..d {
            row[j + 1] = x[(i, j)] as f64;
        }
        for p in 0..=d {
            b[p] += row[p] * y[i];
            for q in 0..=p {
                a[(p, q)] += row[p] * row[q];
            }
        }
    }
    for p in 0..=d {
        for q in 0..p {
            a[(q, p)] = a[(p, q)];
        }
        a[(p, p)] += lambda * n as f64;
    }
    cholesky_solve(a, b)
}

/// Solves A w = b for symmetric positive-definite A (ridge keeps it so).
pub fn cholesky_solve(mut a: Array2<f64>, mut b: Array1<f64>) -> Array1<f64> {
    let n = b.len();
    for j in 0..n {
        let mut diag = a[(j, j)];
        for k in 0..j {
            diag -= a[(j, k)] * a[(j, k)];
        }
        let l = diag.max(1e-12).sqrt();
        a[(j, j)] = l;
        for i in j + 1..n {
            let mut s = a[(i, j)];
            for k in 0..j {
                s -= a[(i, k)] * a[(j, k)];
            }
            a[(i, j)] = s / l;
        }
    }
    for i in 0..n {
        let mut s = b[i];
        for k in 0..i {
            s -= a[(i, k)] * b[k];
        }
        b[i] = s / a[(i, i)];
    }
    for i in (0..n).rev() {
        let mut s = b[i];
        for k in i + 1..n {
            s -= a[(k, i)] * b[k];
        }
        b[i] = s / a[(i, i)];
    }
    b
}

/// A 16-unit tanh MLP trained full-batch with Adam on standardised inputs.
fn mlp_predict(x: &Array2<f32>, y: &[f64], rng: &mut impl Rng) -> Vec<f64> {
    let z = super::relevance::standardize(x).mapv(f64::from);
    let (n, d) = z.dim();
    let h = 16;
    let y = Array1::from_vec(y.to_vec());
    let y_mean = y.mean().unwrap_or(0.0);
    let mut w1 = Array2::from_shape_fn((d, h), |_| rng.sample::<f64, _>(StandardNormal) / (d as f64).sqrt());
    let mut b1 = Array1::<f64>::zeros(h);
    let mut w2 = Array1::from_shape_fn(h, |_| rng.sample::<f64, _>(StandardNormal) / (h as f64).sqrt());
    let mut b2 = y_mean;
    let mut adam = [Adam::new(d * h), Adam::new(h), Adam::new(h), Adam::new(1)];
    for _ in 0..600 {
        let pre = z.dot(&w1) + &b1;
        let act = pre.mapv(f64::tanh);
        let pred = act.dot(&w2) + b2;
        let err = (&pred - &y) * (2.0 / n as f64);
        let g_w2 = act.t().dot(&err);
        let g_b2 = err.sum();
        let g_act = err.view().insert_axis(Axis(1)).dot(&w2.view().insert_axis(Axis(0)));
        let g_pre = g_act * act.mapv(|a| 1.0 - a * a);
        let g_w1 = z.t().dot(&g_pre).as_standard_layout().into_owned();
        let g_b1 = g_pre.sum_axis(Axis(0));
        adam[0].step(w1.as_slice_mut().expect("contiguous"), g_w1.as_slice().expect("contiguous"));
        adam[1].step(b1.as_slice_mut().expect("contiguous"), g_b1.as_slice().expect("contiguous"));
        adam[2].step(w2.as_slice_mut().expect("contiguous"), g_w2.as_slice().expect("contiguous"));
        let mut b2s = [b2];
        adam[3].step(&mut b2s, &[g_b2]);
        b2 = b2s[0];
    }
    let pred = (z.dot(&w1) + &b1).mapv(f64::tanh).dot(&w2) + b2;
    pred.to_vec()
}

struct Adam {
    m: Vec<f64>,
    v: Vec<f64>,
    t: i32,
}

impl Adam {
    fn new(n: usize) -> Self {
        Adam { m: vec![0.0; n], v: vec![0.0; n], t: 0 }
    }
    fn step(&mut self, params: &mut [f64], grads: &[f64]) {
        const LR: f64 = 0.01;
        const B1: f64 = 0.9;
        const B2: f64 = 0.999;
        self.t += 1;
        let c1 = 1.0 - B1.powi(self.t);
        let c2 = 1.0 - B2.powi(self.t);
        for i in 0..params.len() {
            self.m[i] = B1 * self.m[i] + (1.0 - B1) * grads[i];
            self.v[i] = B2 * self.v[i] + (1.0 - B2) * grads[i] * grads[i];
            params[i] -= LR * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + 1e-8);
        }
    }
}

/// Eq. 25: s = sign(α)(|α|·f + (1−|α|)·u), u ~ U(0, 4) drawn once per document.
pub fn blend_scores(f: &[f64], alpha: f64, rng: &mut impl Rng) -> Vec<f64> {
    let sign = if alpha < 0.0 { -1.0 } else { 1.0 };
    f.iter().map(|&fx| sign * (alpha.abs() * fx + (1.0 - alpha.abs()) * rng.random_range(0.0..4.0))).collect()
}

/// Indices sorted by score, best first (ties keep input order).
pub fn deterministic_ranking(scores: &[f64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    idx
}

/// One session's displayed order (indices into the query's documents, position 1 first).
pub fn sample_ranking(sampling: Sampling, tau: f64, pl_temperature: f64, scores: &[f64], deterministic: &[usize], rng: &mut impl Rng) -> Vec<usize> {
    match sampling {
        Sampling::EpsilonGreedy => {
            if tau > 0.0 && rng.random::<f64>() < tau {
                let mut order: Vec<usize> = (0..scores.len()).collect();
                order.shuffle(rng);
                order
            } else {
                deterministic.to_vec()
            }
        }
        Sampling::PlackettLuce => {
            // Gumbel-max: sorting score/T + Gumbel noise samples a Plackett-Luce ranking exactly.
            let keys: Vec<f64> = scores
                .iter()
                .map(|&s| {
                    let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
                    s / pl_temperature - (-u.ln()).ln()
                })
                .collect();
            deterministic_ranking(&keys)
        }
    }
}
