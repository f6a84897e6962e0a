//! Residual monitoring (Hager §5.2, §9.1): residuals e = c − σ(θ_k + r(x)) of the current model on a
//! window, their policy-weighted mean per position, and their correlation with the logging policy's
//! display propensity π(d,k|q). A well-specified additive model has E[e | x, k] = 0 whatever the
//! policy, so the correlation stays near 0; misspecification lets the policy leak into the residuals.

use serde::Serialize;

use ultr_core::math::sigmoid;
use ultr_train::data::Row;

/// Residual histogram bins over [−1, 1] (for the PSI drift statistic).
pub const BINS: usize = 10;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResidualSummary {
    /// Impressions summarised.
    pub rows: usize,
    /// (position, IPS-weighted mean residual, Σ weights)
    pub per_position: Vec<(u32, f64, f64)>,
    /// Policy dependence of the residuals: the row-weighted root mean square over positions of the
    /// within-position Pearson correlation of residuals with π(d,k|q). ≈ 1/√(rows per position) for a
    /// well-specified model, whatever the policy.
    pub propensity_correlation: f64,
    /// The correlation pooled over positions (each centred on its position's mean).
    pub pooled_correlation: f64,
    /// The same correlation at each position.
    pub correlation_by_position: Vec<(u32, f64)>,
    pub mean_abs: f64,
    /// Share of residuals per bin of [−1, 1].
    pub histogram: [f64; BINS],
}

pub fn bin_of(e: f64) -> usize {
    (((e + 1.0) / 2.0 * BINS as f64).floor().max(0.0) as usize).min(BINS - 1)
}

/// Summarises residuals of `rows` under click logits `logits`; π-weights are clipped at `max_weight`.
///
/// The correlation with π is taken within positions (both centred on their position's mean): a model
/// that is only off in its overall level at some position (drift, which the PSI and Page-Hinkley
/// statistics watch) does not count as correlated with the policy; a model whose errors depend on
/// whether the policy put the item there does.
pub fn summarize(rows: &[Row], logits: &[f32], max_weight: f64) -> ResidualSummary {
    // A row of n impressions and c clicks has c residuals 1 − σ and n − c residuals −σ.
    let outcomes = |r: &Row, z: f32| {
        let q = sigmoid(z as f64);
        [(r.clicks as f64, 1.0 - q), (r.impressions.saturating_sub(r.clicks) as f64, -q)]
    };
    let propensity = |r: &Row| if r.propensity.is_finite() && r.propensity > 0.0 { r.propensity } else { 1.0 };
    // pass 1: per-position sums
    let mut by_pos: std::collections::BTreeMap<u32, PositionSums> = Default::default();
    let mut hist = [0f64; BINS];
    let mut sabs = 0.0;
    for (r, z) in rows.iter().zip(logits) {
        let p = propensity(r);
        let w = (1.0 / p).min(max_weight);
        for (m, e) in outcomes(r, *z).into_iter().filter(|(m, _)| *m > 0.0) {
            let s = by_pos.entry(r.position).or_default();
            s.weighted += m * w * e;
            s.weights += m * w;
            s.e += m * e;
            s.p += m * p;
            s.n += m;
            sabs += m * e.abs();
            hist[bin_of(e)] += m;
        }
    }
    // pass 2: within-position covariance, pooled and per position
    let (mut cov, mut var_e, mut var_p) = (0.0, 0.0, 0.0);
    let mut per: std::collections::BTreeMap<u32, (f64, f64, f64)> = Default::default();
    for (r, z) in rows.iter().zip(logits) {
        for (m, e) in outcomes(r, *z).into_iter().filter(|(m, _)| *m > 0.0) {
            let s = &by_pos[&r.position];
            let de = e - s.e / s.n;
            let dp = propensity(r) - s.p / s.n;
            cov += m * de * dp;
            var_e += m * de * de;
            var_p += m * dp * dp;
            let t = per.entry(r.position).or_default();
            t.0 += m * de * dp;
            t.1 += m * de * de;
            t.2 += m * dp * dp;
        }
    }
    let by_position: Vec<(u32, f64)> = per.iter().map(|(k, (c, ve, vp))| (*k, if *ve > 1e-12 && *vp > 1e-12 { c / (ve * vp).sqrt() } else { 0.0 })).collect();
    let n = rows.iter().zip(logits).map(|(r, _)| r.impressions as usize).sum::<usize>();
    let nf = n.max(1) as f64;
    let pooled = if var_e > 1e-12 && var_p > 1e-12 { cov / (var_e * var_p).sqrt() } else { 0.0 };
    // Misfit often changes sign with position (over-predicting on-policy items at the top, under- at the
    // bottom), which cancels in the pooled value; the row-weighted RMS over positions does not cancel.
    let rms = (by_position.iter().map(|(k, c)| by_pos[k].n * c * c).sum::<f64>() / nf).sqrt();
    for h in &mut hist {
        *h /= nf;
    }
    ResidualSummary {
        rows: n,
        per_position: by_pos.into_iter().map(|(k, s)| (k, if s.weights > 0.0 { s.weighted / s.weights } else { 0.0 }, s.weights)).collect(),
        propensity_correlation: rms,
        pooled_correlation: pooled,
        correlation_by_position: by_position,
        mean_abs: sabs / nf,
        histogram: hist,
    }
}

#[derive(Default)]
struct PositionSums {
    weighted: f64,
    weights: f64,
    e: f64,
    p: f64,
    n: f64,
}
