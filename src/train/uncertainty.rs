//! θ_k with uncertainty, for click logs without ground truth: the converged estimate (no early
//! stopping, no weight decay — both shrink θ towards 0) beside the early-stopped one, and intervals
//! from a Poisson bootstrap that refits the converged estimator on resampled data: θ̂ ± t·se with the
//! replicates' standard error (t from Student's t with B − 1 degrees of freedom), and the percentile
//! interval beside it. With tens of replicates the percentile interval runs between the extreme
//! replicates and covers less than its level (a new draw falls between the i-th and j-th of B
//! order statistics with probability (j − i)/(B + 1)); the t interval does not have that problem.
//!
//! The bootstrap draws every impression's multiplicity from Poisson(1). On aggregated rows that is
//! exact and cheap: a row of n impressions and c clicks becomes (c′ + u′, c′) with c′ ~ Poisson(c),
//! u′ ~ Poisson(n − c). Impressions, not sessions, are the resampled unit — under a position-based
//! click model a session's clicks are independent given its ranking, so the two agree up to the
//! ranking's dependence; `ultr experiment theta-coverage` measures the coverage this gives against
//! the simulator's true θ. π (the IPS weights) is held at the full data's estimate. Each replicate
//! starts from the converged model and trains `epochs` more epochs (a warm start: the replicate's
//! optimum lies near the full data's, so far fewer epochs reach it than a cold fit needs).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Poisson};
use serde::{Deserialize, Serialize};

use super::config::TrainConfig;
use super::data::Examples;
use super::fit::{fit, Trained};

/// `[train.uncertainty]`: what `ultr train --theta-intervals` computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UncertaintyConfig {
    /// Compute them after every training (`ultr train --theta-intervals` sets it for one run).
    pub enabled: bool,
    /// Bootstrap replicates (refits).
    pub replicates: usize,
    /// Two-sided coverage of the intervals.
    pub level: f64,
    /// Epochs each replicate trains, warm-started from the converged model.
    pub epochs: usize,
    /// Epochs of the converged (not early-stopped) fit.
    pub converged_epochs: usize,
    pub seed: u64,
}

impl Default for UncertaintyConfig {
    fn default() -> Self {
        UncertaintyConfig { enabled: false, replicates: 50, level: 0.95, epochs: 5, converged_epochs: 50, seed: 7 }
    }
}

impl UncertaintyConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.replicates < 10 {
            return Err(format!("key `train.uncertainty.replicates` = {} must be >= 10 (percentile intervals need replicates in both tails)", self.replicates));
        }
        if !(self.level > 0.0 && self.level < 1.0) {
            return Err(format!("key `train.uncertainty.level` = {} must lie in (0, 1)", self.level));
        }
        if self.epochs == 0 || self.converged_epochs == 0 {
            return Err("keys `train.uncertainty.epochs` and `train.uncertainty.converged_epochs` must be >= 1".into());
        }
        Ok(())
    }
}

/// θ_k − θ_1 per position k = 1..=K, three ways, and the interval of the converged estimator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThetaIntervals {
    /// The model trained as configured (early stopping on the validation loss, weight decay).
    pub early_stopped: Vec<f64>,
    /// Trained `converged_epochs` without early stopping or weight decay, last epoch kept.
    pub converged: Vec<f64>,
    /// converged ± t·standard_error: the interval reported.
    pub lower: Vec<f64>,
    pub upper: Vec<f64>,
    /// The replicates' (α/2, 1 − α/2) quantiles.
    pub percentile_lower: Vec<f64>,
    pub percentile_upper: Vec<f64>,
    /// The replicates' standard deviation per position.
    pub standard_error: Vec<f64>,
    pub level: f64,
    pub replicates: usize,
    pub method: String,
}

/// The configuration of the converged estimator: no early stopping, no weight decay.
pub fn converged_config(cfg: &TrainConfig, u: &UncertaintyConfig) -> TrainConfig {
    TrainConfig { early_stopping: false, weight_decay: 0.0, max_epochs: u.converged_epochs, ..cfg.clone() }
}

/// `ex` with every impression's multiplicity drawn from Poisson(1) (rows left empty are dropped;
/// the spans of aggregated rows follow their rows).
pub fn poisson_resample(ex: &Examples, rng: &mut ChaCha8Rng) -> Examples {
    let draw = |mean: u32, rng: &mut ChaCha8Rng| -> u32 {
        if mean == 0 {
            0
        } else {
            Poisson::new(mean as f64).map(|p| p.sample(rng) as u32).unwrap_or(0)
        }
    };
    let mut out = Examples { rows: Vec::with_capacity(ex.rows.len()), bias: Vec::new(), sessions: Vec::with_capacity(ex.sessions.len()), ..ex.clone() };
    let z = ex.n_bias_features;
    for span in &ex.sessions {
        let start = out.rows.len();
        for i in span.start..span.start + span.len {
            let r = ex.rows[i];
            let clicks = draw(r.clicks, rng);
            let impressions = clicks + draw(r.impressions - r.clicks.min(r.impressions), rng);
            if impressions == 0 {
                continue;
            }
            out.rows.push(super::data::Row { impressions, clicks, ..r });
            out.bias.extend_from_slice(&ex.bias[i * z..(i + 1) * z]);
        }
        if out.rows.len() > start {
            out.sessions.push(super::data::SessionSpan { start, len: out.rows.len() - start, ..*span });
        }
    }
    out
}

/// Φ(x), the standard normal CDF, from erf's Maclaurin series (|x| ≤ 6: ample terms in f64; beyond,
/// 0 or 1 to f64 precision).
fn normal_cdf(x: f64) -> f64 {
    if x.abs() > 6.0 {
        return if x > 0.0 { 1.0 } else { 0.0 };
    }
    let z = x / std::f64::consts::SQRT_2;
    let (mut term, mut sum) = (z, z);
    for n in 1..200 {
        term *= -z * z / n as f64;
        let next = term / (2 * n + 1) as f64;
        sum += next;
        if next.abs() < 1e-17 {
            break;
        }
    }
    0.5 + sum / std::f64::consts::PI.sqrt()
}

/// The p-quantile of the standard normal, by bisection on Φ.
fn normal_quantile(p: f64) -> f64 {
    let (mut lo, mut hi) = (-6.0f64, 6.0f64);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if normal_cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The p-quantile of Student's t with ν degrees of freedom (Cornish–Fisher expansion around the
/// normal quantile; within 0.01 of the exact value for ν ≥ 5 at the usual levels).
fn student_t_quantile(p: f64, nu: f64) -> f64 {
    let z = normal_quantile(p);
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * nu) + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * nu * nu) + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * nu.powi(3))
}

/// The q-quantile of sorted values (linear interpolation).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let h = q * (sorted.len() - 1) as f64;
    let (i, f) = (h.floor() as usize, h - h.floor());
    if i + 1 < sorted.len() {
        sorted[i] * (1.0 - f) + sorted[i + 1] * f
    } else {
        sorted[i]
    }
}

/// The converged estimate and its bootstrap interval, for a model already trained as configured
/// (`early`). `positions` limits the report to the positions seen in training.
pub fn theta_intervals(ex: &Examples, cfg: &TrainConfig, u: &UncertaintyConfig, early: &Trained, positions: usize) -> anyhow::Result<ThetaIntervals> {
    anyhow::ensure!(!cfg.model.listwise(), "θ intervals resample aggregated rows; the session model `{}` trains on whole sessions", cfg.model.name());
    let conv_cfg = converged_config(cfg, u);
    let (converged, _) = fit(ex, &conv_cfg, None, false)?;
    let replicate_cfg = TrainConfig { max_epochs: u.epochs, ..conv_cfg.clone() };
    let mut rng = ChaCha8Rng::seed_from_u64(u.seed);
    let mut draws: Vec<Vec<f64>> = Vec::with_capacity(u.replicates);
    for b in 0..u.replicates {
        let resampled = poisson_resample(ex, &mut rng);
        let cfg_b = TrainConfig { seed: cfg.seed.wrapping_add(1 + b as u64), ..replicate_cfg.clone() };
        let (t, _) = fit(&resampled, &cfg_b, Some(&converged), false)?;
        draws.push(t.position_bias());
    }
    let k = positions.min(converged.position_bias().len());
    let centre: Vec<f64> = converged.position_bias().into_iter().take(k).collect();
    let alpha = (1.0 - u.level) / 2.0;
    let t = student_t_quantile(1.0 - alpha, (u.replicates - 1) as f64);
    let (mut percentile_lower, mut percentile_upper, mut standard_error) = (Vec::with_capacity(k), Vec::with_capacity(k), Vec::with_capacity(k));
    for j in 0..k {
        let mut v: Vec<f64> = draws.iter().map(|d| d[j]).collect();
        v.sort_by(f64::total_cmp);
        percentile_lower.push(quantile(&v, alpha));
        percentile_upper.push(quantile(&v, 1.0 - alpha));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        standard_error.push((v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1).max(1) as f64).sqrt());
    }
    Ok(ThetaIntervals {
        early_stopped: early.position_bias().into_iter().take(k).collect(),
        lower: centre.iter().zip(&standard_error).map(|(c, s)| c - t * s).collect(),
        upper: centre.iter().zip(&standard_error).map(|(c, s)| c + t * s).collect(),
        converged: centre,
        percentile_lower,
        percentile_upper,
        standard_error,
        level: u.level,
        replicates: u.replicates,
        method: format!(
            "converged estimate ({} epochs, no early stopping, no weight decay) ± t({}, {:.4})·se, se over {} Poisson(1) bootstrap replicates of the impressions, each warm-started and trained {} epochs",
            u.converged_epochs,
            u.replicates - 1,
            1.0 - alpha,
            u.replicates,
            u.epochs
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::data::{Row, SessionSpan};

    /// Poisson(1) multiplicities keep every row's expected impressions and clicks.
    #[test]
    fn poisson_resampling_is_unbiased_per_row() {
        let mut ex = Examples { n_features: 1, docs: vec![0.0], ..Examples::default() };
        for (i, (n, c)) in [(1000u32, 100u32), (50, 0), (7, 7)].into_iter().enumerate() {
            ex.rows.push(Row { doc: 0, qd: 0, position: i as u32 + 1, impressions: n, clicks: c, propensity: 1.0 });
            ex.sessions.push(SessionSpan { start: i, len: 1, hash: i as u64, split: None });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut sums = [(0f64, 0f64); 3];
        let draws = 2000;
        for _ in 0..draws {
            let r = poisson_resample(&ex, &mut rng);
            for row in &r.rows {
                assert!(row.clicks <= row.impressions);
                let s = &mut sums[row.position as usize - 1];
                s.0 += row.impressions as f64;
                s.1 += row.clicks as f64;
            }
            assert_eq!(r.rows.len(), r.sessions.len());
        }
        for (i, (n, c)) in [(1000.0, 100.0), (50.0, 0.0), (7.0, 7.0)].into_iter().enumerate() {
            let (mn, mc) = (sums[i].0 / draws as f64, sums[i].1 / draws as f64);
            assert!((mn - n).abs() < 4.0 * (n as f64 / draws as f64).sqrt() + 1e-9, "row {i}: mean impressions {mn} vs {n}");
            assert!((mc - c).abs() < 4.0 * (c as f64 / draws as f64).sqrt() + 1e-9, "row {i}: mean clicks {mc} vs {c}");
        }
    }

    /// Φ⁻¹ and Student's t against tabulated values.
    #[test]
    fn normal_and_t_quantiles_match_tables() {
        assert!((normal_quantile(0.975) - 1.959964).abs() < 1e-5);
        assert!((normal_quantile(0.95) - 1.644854).abs() < 1e-5);
        assert!((normal_cdf(1.0) - 0.841345).abs() < 1e-6);
        assert!((student_t_quantile(0.975, 19.0) - 2.093024).abs() < 2e-3);
        assert!((student_t_quantile(0.975, 49.0) - 2.009575).abs() < 1e-3);
        assert!((student_t_quantile(0.95, 9.0) - 1.833113).abs() < 5e-3);
    }

    #[test]
    fn quantiles_interpolate() {
        let v = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 0.125), 0.5);
        assert_eq!(quantile(&v, 1.0), 4.0);
    }
}
