//! Residual monitoring (Hager §5.2, §9.1): residuals e = c − σ(θ_k + r(x)) of the current model on a
//! window, their policy-weighted mean per position, and their correlation with the logging policy's
//! display propensity π(d,k|q). A well-specified additive model has E[e | x, k] = 0 whatever the
//! policy, so the correlation stays near 0; misspecification lets the policy leak into the residuals.

use serde::Serialize;

use crate::train::data::Row;

/// Residual histogram bins over [−1, 1] (for the PSI drift statistic).
pub const BINS: usize = 10;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResidualSummary {
    pub rows: usize,
    /// (position, IPS-weighted mean residual, Σ weights)
    pub per_position: Vec<(u32, f64, f64)>,
    /// Pearson correlation of residuals with π(d,k|q); 0 when either is constant.
    pub propensity_correlation: f64,
    pub mean_abs: f64,
    /// Share of residuals per bin of [−1, 1].
    pub histogram: [f64; BINS],
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

pub fn bin_of(e: f64) -> usize {
    (((e + 1.0) / 2.0 * BINS as f64).floor().max(0.0) as usize).min(BINS - 1)
}

/// Summarises residuals of `rows` under click logits `logits`; π-weights are clipped at `max_weight`.
pub fn summarize(rows: &[Row], logits: &[f32], max_weight: f64) -> ResidualSummary {
    let mut by_pos: std::collections::BTreeMap<u32, (f64, f64)> = Default::default();
    let (mut se, mut sp, mut see, mut spp, mut sep, mut sabs) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    let mut hist = [0f64; BINS];
    let mut n = 0usize;
    for (r, z) in rows.iter().zip(logits) {
        let e = (r.clicked as u8 as f64) - sigmoid(*z as f64);
        let p = if r.propensity.is_finite() && r.propensity > 0.0 { r.propensity } else { 1.0 };
        let w = (1.0 / p).min(max_weight);
        let entry = by_pos.entry(r.position).or_default();
        entry.0 += w * e;
        entry.1 += w;
        se += e;
        sp += p;
        see += e * e;
        spp += p * p;
        sep += e * p;
        sabs += e.abs();
        hist[bin_of(e)] += 1.0;
        n += 1;
    }
    let nf = n.max(1) as f64;
    let cov = sep / nf - (se / nf) * (sp / nf);
    let var_e = see / nf - (se / nf).powi(2);
    let var_p = spp / nf - (sp / nf).powi(2);
    let correlation = if var_e > 1e-12 && var_p > 1e-12 { cov / (var_e * var_p).sqrt() } else { 0.0 };
    for h in &mut hist {
        *h /= nf;
    }
    ResidualSummary {
        rows: n,
        per_position: by_pos.into_iter().map(|(k, (s, w))| (k, if w > 0.0 { s / w } else { 0.0 }, w)).collect(),
        propensity_correlation: correlation,
        mean_abs: sabs / nf,
        histogram: hist,
    }
}
