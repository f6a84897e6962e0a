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
    let (weights, totals) = weights_of(rows, cfg);
    totals.check(cfg)?;
    Ok((weights, totals.report(cfg, None)))
}

/// The weights of `rows` and their totals, without the missing-propensity check (a caller that
/// sees the data in chunks checks the merged totals).
pub fn weights_of(rows: &[Row], cfg: &IpsConfig) -> (Vec<f32>, WeightTotals) {
    let mut t = WeightTotals { min_propensity: f64::INFINITY, all_one: true, ..WeightTotals::default() };
    let weights: Vec<f32> = rows
        .iter()
        .map(|r| {
            let n = r.impressions as f64;
            t.impressions += r.impressions as u64;
            let known = r.propensity.is_finite() && r.propensity > 0.0;
            if known {
                t.min_propensity = t.min_propensity.min(r.propensity);
            } else {
                t.missing += r.impressions as u64;
            }
            let w = if !cfg.enabled || !known {
                1.0
            } else if 1.0 / r.propensity > cfg.max_weight {
                t.clipped += r.impressions as u64;
                cfg.max_weight as f32
            } else {
                (1.0 / r.propensity) as f32
            };
            t.sum += n * w as f64;
            t.sum_sq += n * (w as f64) * (w as f64);
            t.max_weight = t.max_weight.max(w);
            t.all_one &= (w - 1.0).abs() < 1e-6;
            t.rows += 1;
            w
        })
        .collect();
    (weights, t)
}

/// Sums over impressions that make a `WeightReport`; chunks of the data merge exactly.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightTotals {
    pub rows: u64,
    pub impressions: u64,
    pub missing: u64,
    pub clipped: u64,
    pub min_propensity: f64,
    pub max_weight: f32,
    /// Σ n·w and Σ n·w² over rows of n impressions.
    pub sum: f64,
    pub sum_sq: f64,
    pub all_one: bool,
}

impl WeightTotals {
    /// Totals of no rows (the identity of `merge`).
    pub fn empty() -> Self {
        WeightTotals { min_propensity: f64::INFINITY, all_one: true, ..WeightTotals::default() }
    }

    pub fn merge(&mut self, o: &WeightTotals) {
        self.rows += o.rows;
        self.impressions += o.impressions;
        self.missing += o.missing;
        self.clipped += o.clipped;
        self.min_propensity = self.min_propensity.min(o.min_propensity);
        self.max_weight = self.max_weight.max(o.max_weight);
        self.sum += o.sum;
        self.sum_sq += o.sum_sq;
        self.all_one &= o.all_one;
    }

    /// Refuses rows without a propensity unless `train.ips.on_missing` allows them.
    pub fn check(&self, cfg: &IpsConfig) -> anyhow::Result<()> {
        if cfg.enabled && self.missing > 0 && cfg.on_missing == MissingPropensity::Error {
            anyhow::bail!(
                "{} of {} training impressions have no propensity π(d,k|q) in the state (key `train.ips.on_missing` = \"unit_weight\" trains them with weight 1)",
                self.missing,
                self.impressions
            );
        }
        Ok(())
    }

    /// The report of these totals under `cfg`; `not_applied` says why configured weights were
    /// turned off (`TrainConfig::ips_not_applied`).
    pub fn report(&self, cfg: &IpsConfig, not_applied: Option<&str>) -> WeightReport {
        let ess = if self.sum_sq > 0.0 { self.sum * self.sum / self.sum_sq } else { 0.0 };
        let n = self.impressions.max(1) as f64;
        let note = if let Some(why) = not_applied {
            Some(why.to_string())
        } else if !cfg.enabled {
            Some("IPS disabled (train.ips.enabled = false): plain binary cross-entropy".to_string())
        } else if self.all_one && self.rows > 0 {
            Some(
                "IPS changes nothing: every π(d,k|q) = 1, i.e. the logging policy always showed each document at one position. \
                 Propensity weighting needs positivity (a chance to appear elsewhere); randomise the policy to use it"
                    .to_string(),
            )
        } else {
            None
        };
        WeightReport {
            enabled: cfg.enabled,
            rows: self.impressions as usize,
            min_propensity: if self.min_propensity.is_finite() { self.min_propensity } else { f64::NAN },
            max_weight: self.max_weight as f64,
            clipped_fraction: self.clipped as f64 / n,
            missing_propensity: self.missing as usize,
            effective_sample_size: ess,
            effective_sample_fraction: ess / n,
            note,
        }
    }
}
