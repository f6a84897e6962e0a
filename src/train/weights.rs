//! Inverse-propensity sample weights w = 1/π(d,k|q), clipped, with the diagnostics a ranking
//! engineer checks before trusting them: clipped share, effective sample size, and whether they
//! can do anything at all (a deterministic policy has π = 1 everywhere).

use serde::Serialize;

use super::config::{IpsConfig, MissingPropensity};
use super::data::Row;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WeightReport {
    pub enabled: bool,
    /// Impressions the weights apply to (aggregated rows count their impressions).
    pub rows: usize,
    pub min_propensity: f64,
    pub max_weight: f64,
    pub clipped_fraction: f64,
    pub missing_propensity: usize,
    /// Kish's effective sample size (Σw)² / Σw², and as a share of the rows.
    pub effective_sample_size: f64,
    pub effective_sample_fraction: f64,
    /// Why the weights change nothing, when they do not.
    pub note: Option<String>,
}

/// The per-row weights (one per impression of the row) and their report, counted over impressions.
/// Missing propensities are an error unless configured.
pub fn ips_weights(rows: &[Row], cfg: &IpsConfig) -> anyhow::Result<(Vec<f32>, WeightReport)> {
    let impressions: usize = rows.iter().map(|r| r.impressions as usize).sum();
    let missing: usize = rows.iter().filter(|r| !r.propensity.is_finite() || r.propensity <= 0.0).map(|r| r.impressions as usize).sum();
    if cfg.enabled && missing > 0 && cfg.on_missing == MissingPropensity::Error {
        anyhow::bail!(
            "{missing} of {impressions} training impressions have no propensity π(d,k|q) in the state (key `train.ips.on_missing` = \"unit_weight\" trains them with weight 1)"
        );
    }
    let min_propensity = rows.iter().map(|r| r.propensity).filter(|p| p.is_finite() && *p > 0.0).fold(f64::INFINITY, f64::min);
    let mut clipped = 0usize;
    let weights: Vec<f32> = rows
        .iter()
        .map(|r| {
            if !cfg.enabled || !(r.propensity.is_finite() && r.propensity > 0.0) {
                return 1.0;
            }
            let w = 1.0 / r.propensity;
            if w > cfg.max_weight {
                clipped += r.impressions as usize;
                cfg.max_weight as f32
            } else {
                w as f32
            }
        })
        .collect();
    let (sum, sum_sq) = rows.iter().zip(&weights).fold((0.0f64, 0.0f64), |(s, q), (r, &w)| {
        let n = r.impressions as f64;
        (s + n * w as f64, q + n * (w as f64) * (w as f64))
    });
    let ess = if sum_sq > 0.0 { sum * sum / sum_sq } else { 0.0 };
    let n = impressions.max(1) as f64;
    let all_one = weights.iter().all(|w| (*w - 1.0).abs() < 1e-6);
    let note = if !cfg.enabled {
        Some("IPS disabled (train.ips.enabled = false): plain binary cross-entropy".to_string())
    } else if all_one && !rows.is_empty() {
        Some(
            "IPS changes nothing: every π(d,k|q) = 1, i.e. the logging policy always showed each document at one position. \
             Propensity weighting needs positivity (a chance to appear elsewhere); randomise the policy to use it"
                .to_string(),
        )
    } else {
        None
    };
    let report = WeightReport {
        enabled: cfg.enabled,
        rows: impressions,
        min_propensity: if min_propensity.is_finite() { min_propensity } else { f64::NAN },
        max_weight: weights.iter().copied().fold(0.0f32, f32::max) as f64,
        clipped_fraction: clipped as f64 / n,
        missing_propensity: missing,
        effective_sample_size: ess,
        effective_sample_fraction: ess / n,
        note,
    };
    Ok((weights, report))
}
