//! The infinite-data optimum of the additive model with a linear relevance tower under an ε-greedy
//! logging policy: what training converges to as sessions → ∞, with no click noise, early stopping
//! or weight decay. It separates an estimator's bias (what it converges to) from its finite-sample
//! error, so a claim about IPS can be checked against the estimand itself.
//!
//! The expected log-likelihood sums over every (query, document, position) with weight
//! P(q)·π(d,k|q) — or P(q)·π·min(1/π, clip) with IPS (Hager Eq. 22) — and the true click
//! probability σ(−ln k + rel − 2) as a fractional label. It is convex; Newton's method solves it.

use anyhow::{bail, ensure};

use crate::simulate::click::{sigmoid, ClickModelKind};
use crate::simulate::policy::cholesky_solve;
use crate::simulate::Simulator;

/// The policy's randomisation, how the model is weighted and which features its tower reads.
#[derive(Debug, Clone, Copy)]
pub struct PopulationSpec {
    /// ε-greedy temperature: a uniformly random order with probability τ, else the simulator's
    /// deterministic logging ranking (whatever sampling the simulator itself is configured with).
    pub tau: f64,
    /// The tower reads the first `feature_limit` features (all when `None`).
    pub feature_limit: Option<usize>,
    /// Weight each (d, k) by min(1/π, `ips_clip`) (Eq. 22).
    pub ips: bool,
    pub ips_clip: f64,
}

#[derive(Debug, Clone)]
pub struct PopulationFit {
    /// θ_k − θ_1 for k = 1..=K (K = the longest query).
    pub theta: Vec<f64>,
    pub iterations: usize,
    /// Largest |∂L/∂parameter| at the solution.
    pub gradient_max: f64,
}

/// One weighted row of the expected likelihood: document features, position, weight, P(click).
struct Row {
    doc: usize,
    position: usize,
    weight: f64,
    click_probability: f64,
}

/// Fits the linear-tower additive model to the simulator's exact expected clicks.
pub fn fit_linear(sim: &Simulator, spec: PopulationSpec) -> anyhow::Result<PopulationFit> {
    let cfg = sim.config();
    if cfg.click_model.kind != ClickModelKind::AdditivePbm {
        bail!("the population fit needs the additive click model (the one the fitted model assumes)");
    }
    let tau = spec.tau;
    ensure!((0.0..=1.0).contains(&tau), "τ = {tau} must lie in [0, 1]");
    let truth = sim.truth();
    let n_queries = truth.queries.len();
    ensure!(n_queries > 0, "the simulator has no queries");
    let n_features = spec.feature_limit.unwrap_or(truth.n_features).min(truth.n_features);

    // Documents' features (standardised below) and the weighted rows.
    let mut docs: Vec<Vec<f64>> = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut max_n = 0;
    for (qi, q) in truth.queries.iter().enumerate() {
        let n = q.docs.len();
        max_n = max_n.max(n);
        let first = docs.len();
        docs.extend(sim.query_features(qi).into_iter().map(|f| f.iter().take(n_features).map(|&v| f64::from(v)).collect()));
        let mut position_of = vec![0usize; n];
        for (k, &d) in q.logging_ranking.iter().enumerate() {
            position_of[d] = k;
        }
        for (d, doc) in q.docs.iter().enumerate() {
            for k in 0..n {
                let pi = tau / n as f64 + if position_of[d] == k { 1.0 - tau } else { 0.0 };
                if pi <= 0.0 {
                    continue;
                }
                let w = if spec.ips { pi * (1.0 / pi).min(spec.ips_clip) } else { pi };
                let click_probability = sigmoid(crate::simulate::click::theta(k + 1) + doc.relevance - 2.0);
                rows.push(Row { doc: first + d, position: k, weight: w / n_queries as f64, click_probability });
            }
        }
    }
    standardise_columns(&mut docs, n_features);

    // Parameters: θ_2..θ_K (θ_1 = 0), w (n_features), b.
    let n_theta = max_n - 1;
    let dim = n_theta + n_features + 1;
    let mut params = vec![0.0; dim];
    let logit = |p: &[f64], r: &Row| -> f64 {
        let theta = if r.position == 0 { 0.0 } else { p[r.position - 1] };
        let x = &docs[r.doc];
        theta + x.iter().zip(&p[n_theta..n_theta + n_features]).map(|(a, b)| a * b).sum::<f64>() + p[dim - 1]
    };
    let loss = |p: &[f64]| -> f64 {
        rows.iter()
            .map(|r| {
                let z = logit(p, r);
                // −[c log σ(z) + (1−c) log(1−σ(z))] written without overflow.
                r.weight * (softplus(z) - r.click_probability * z)
            })
            .sum()
    };
    let mut current = loss(&params);
    let mut iterations = 0;
    let mut gradient_max = f64::INFINITY;
    for _ in 0..100 {
        iterations += 1;
        let mut grad = vec![0.0; dim];
        let mut hess = ndarray::Array2::<f64>::zeros((dim, dim));
        // A row's regressors are (its position's indicator, its document's features, 1), so the
        // Hessian's feature × feature block and the gradient's feature part are sums over documents
        // of (Σ over the document's rows of h or g) times the document's features: one outer product
        // per document, not per (document, position) row. Only the blocks that involve θ need the rows.
        let (mut doc_g, mut doc_h) = (vec![0.0; docs.len()], vec![0.0; docs.len()]);
        for r in &rows {
            let z = logit(&params, r);
            let s = sigmoid(z);
            let g = r.weight * (s - r.click_probability);
            let h = r.weight * s * (1.0 - s);
            doc_g[r.doc] += g;
            doc_h[r.doc] += h;
            if r.position > 0 {
                let k = r.position - 1;
                grad[k] += g;
                hess[(k, k)] += h;
                for (j, &v) in docs[r.doc].iter().enumerate() {
                    hess[(n_theta + j, k)] += h * v;
                }
                hess[(dim - 1, k)] += h;
            }
        }
        for (d, x) in docs.iter().enumerate() {
            let (g, h) = (doc_g[d], doc_h[d]);
            for (i, &vi) in x.iter().enumerate() {
                grad[n_theta + i] += g * vi;
                for (j, &vj) in x.iter().enumerate().take(i + 1) {
                    hess[(n_theta + i, n_theta + j)] += h * vi * vj;
                }
                hess[(dim - 1, n_theta + i)] += h * vi;
            }
            grad[dim - 1] += g;
            hess[(dim - 1, dim - 1)] += h;
        }
        gradient_max = grad.iter().fold(0.0, |m, g| f64::max(m, g.abs()));
        if gradient_max < 1e-12 {
            break;
        }
        for i in 0..dim {
            // Positions no query fills and constant features leave a zero row; a tiny ridge keeps
            // the system solvable without moving the optimum of the others.
            hess[(i, i)] += 1e-12;
        }
        let step = cholesky_solve(hess, ndarray::Array1::from_vec(grad));
        // Backtracking keeps every step a descent step (the objective is convex).
        let mut t = 1.0;
        loop {
            let trial: Vec<f64> = params.iter().zip(&step).map(|(p, s)| p - t * s).collect();
            let value = loss(&trial);
            if value <= current || t < 1e-6 {
                params = trial;
                let done = (current - value).abs() < 1e-15;
                current = value;
                if done {
                    t = 0.0;
                }
                break;
            }
            t *= 0.5;
        }
        if t == 0.0 {
            break;
        }
    }
    let mut theta = vec![0.0];
    theta.extend_from_slice(&params[..n_theta]);
    Ok(PopulationFit { theta, iterations, gradient_max })
}

fn softplus(z: f64) -> f64 {
    if z > 0.0 {
        z + (-z).exp().ln_1p()
    } else {
        z.exp().ln_1p()
    }
}

/// Zero mean, unit variance per column (constant columns become 0): the same fit, better conditioned.
fn standardise_columns(x: &mut [Vec<f64>], n_features: usize) {
    let n = x.len().max(1) as f64;
    for j in 0..n_features {
        let mean = x.iter().map(|r| r[j]).sum::<f64>() / n;
        let var = x.iter().map(|r| (r[j] - mean).powi(2)).sum::<f64>() / n;
        let sd = if var > 1e-16 { var.sqrt() } else { f64::INFINITY };
        for r in x.iter_mut() {
            r[j] = (r[j] - mean) / sd;
        }
    }
}
