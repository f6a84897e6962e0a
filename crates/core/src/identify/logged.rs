//! Do a policy's logged propensities agree with what it was seen to do? Per policy, over the
//! (query, document, position) cells whose every impression carried a logged propensity, the display
//! count n of a cell is Binomial(S, π) under a right log (S: the policy's sessions of the query, π:
//! its logged propensity). The Pearson dispersion Σ (n − Sπ)² / (Sπ(1 − π)) / cells is then ≈ 1; a
//! log of another policy, a stale exploration rate or a logging bug moves it far above. Cells with
//! fewer than `MIN_EXPECTED` expected displays are left out: only cells that were shown at least once
//! are in the state, and for rare cells that selection alone would inflate the statistic.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use serde::Serialize;

/// Expected displays S·π a cell needs to be tested (the usual χ² rule of thumb).
pub const MIN_EXPECTED: f64 = 5.0;
/// Cells a policy needs before its dispersion is judged.
pub const MIN_CELLS: usize = 20;
/// Variance floor of a cell (π = 1 has none): a count that misses a certain display is still judged.
const MIN_VARIANCE: f64 = 0.5;

/// One policy's verdict.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LoggedPropensityCheck {
    pub policy_id: String,
    /// Share of the policy's impressions that carried a logged propensity.
    pub logged_share: f64,
    /// Cells tested (every impression logged, S·π ≥ MIN_EXPECTED).
    pub cells: usize,
    /// Pearson χ² / cells: ≈ 1 when the log is right.
    pub dispersion: f64,
    /// Impression-weighted mean of ln(n / (S·π)) over tested cells: > 0 when the policy showed
    /// documents where it logged them as less likely than it was.
    pub mean_log_ratio: f64,
    /// Too few cells to judge.
    pub inconclusive: bool,
    /// The dispersion exceeds `identifiability.max_logged_propensity_dispersion`.
    pub disagrees: bool,
}

#[derive(Default)]
struct Sums {
    impressions: f64,
    logged_impressions: f64,
    cells: usize,
    chi2: f64,
    log_ratio: f64,
    tested_impressions: f64,
}

fn f64s(b: &RecordBatch, name: &str) -> Option<datafusion::arrow::array::ArrayRef> {
    cast(b.column_by_name(name)?, &DataType::Float64).ok()
}

/// The check of every policy that logged any propensity, from `sql/policy_propensity.sql`'s table.
pub fn check(policy_propensity: &[RecordBatch], max_dispersion: f64) -> Vec<LoggedPropensityCheck> {
    let mut by_policy: BTreeMap<String, Sums> = BTreeMap::new();
    for b in policy_propensity {
        let (Some(policy), Some(n), Some(logged_n), Some(s), Some(pi)) = (
            b.column_by_name("policy_id").and_then(|c| cast(c, &DataType::Utf8).ok()),
            f64s(b, "impressions"),
            f64s(b, "logged_impressions"),
            f64s(b, "policy_sessions"),
            f64s(b, "logged_propensity"),
        ) else {
            continue;
        };
        let policy = policy.as_string::<i32>();
        let (n, logged_n, s, pi) =
            (n.as_primitive::<Float64Type>(), logged_n.as_primitive::<Float64Type>(), s.as_primitive::<Float64Type>(), pi.as_primitive::<Float64Type>());
        for i in 0..b.num_rows() {
            let e = by_policy.entry(policy.value(i).to_string()).or_default();
            e.impressions += n.value(i);
            e.logged_impressions += logged_n.value(i);
            if pi.is_null(i) {
                continue;
            }
            let (n, s, p) = (n.value(i), s.value(i), pi.value(i));
            let expected = s * p;
            if expected < MIN_EXPECTED {
                continue;
            }
            let variance = (expected * (1.0 - p)).max(MIN_VARIANCE);
            e.cells += 1;
            e.chi2 += (n - expected).powi(2) / variance;
            e.log_ratio += n * (n / expected).ln();
            e.tested_impressions += n;
        }
    }
    by_policy
        .into_iter()
        .filter(|(_, s)| s.logged_impressions > 0.0)
        .map(|(policy_id, s)| {
            let dispersion = if s.cells > 0 { s.chi2 / s.cells as f64 } else { f64::NAN };
            let inconclusive = s.cells < MIN_CELLS;
            LoggedPropensityCheck {
                policy_id,
                logged_share: s.logged_impressions / s.impressions.max(1.0),
                cells: s.cells,
                dispersion,
                mean_log_ratio: if s.tested_impressions > 0.0 { s.log_ratio / s.tested_impressions } else { f64::NAN },
                inconclusive,
                disagrees: !inconclusive && dispersion > max_dispersion,
            }
        })
        .collect()
}

impl LoggedPropensityCheck {
    pub fn render(&self) -> String {
        let verdict = if self.inconclusive {
            format!("too few cells to judge (< {MIN_CELLS} with S·π ≥ {MIN_EXPECTED})")
        } else if self.disagrees {
            "DISAGREES with the counted π — the logs or the policy changed (a stale exploration rate, another policy's log, a logging bug); do not use source = \"logged\" for it".to_string()
        } else {
            "agrees with the counted π".to_string()
        };
        format!(
            "  policy {:?}: {:.1}% of impressions logged; {} cells, dispersion {:.2} (≈ 1 when right), mean ln(counted/logged) {:+.3}: {verdict}\n",
            self.policy_id,
            100.0 * self.logged_share,
            self.cells,
            self.dispersion,
            self.mean_log_ratio
        )
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    /// Cells of one policy: n ~ Binomial(S, true π), logged as `logged(true π)`.
    fn table(seed: u64, logged: impl Fn(f64) -> f64) -> RecordBatch {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let (mut n, mut s, mut p) = (Vec::new(), Vec::new(), Vec::new());
        for cell in 0..400 {
            let sessions = 50 + (cell % 7) * 30;
            let pi = [0.1, 0.3, 0.6, 0.9][cell % 4];
            n.push((0..sessions).filter(|_| rng.random::<f64>() < pi).count() as i64);
            s.push(sessions as i64);
            p.push(logged(pi));
        }
        let schema = crate::identify::policy::policy_propensity_schema();
        let project: Vec<_> = ["policy_id", "impressions", "logged_impressions", "policy_sessions", "logged_propensity"]
            .iter()
            .map(|c| schema.field_with_name(c).unwrap().clone())
            .collect();
        RecordBatch::try_new(
            Arc::new(datafusion::arrow::datatypes::Schema::new(project)),
            vec![
                Arc::new(StringArray::from(vec!["explore"; n.len()])),
                Arc::new(Int64Array::from(n.clone())),
                Arc::new(Int64Array::from(n)),
                Arc::new(Int64Array::from(s)),
                Arc::new(Float64Array::from(p)),
            ],
        )
        .unwrap()
    }

    pub fn a_right_log_has_dispersion_near_one_and_a_wrong_one_is_flagged() {
        for seed in 0..5 {
            let right = &check(&[table(seed, |p| p)], 2.0)[0];
            assert!((right.dispersion - 1.0).abs() < 0.25 && !right.disagrees && !right.inconclusive, "{right:?}");
            // A log 20% low: counts exceed it, dispersion far above 1, flagged.
            let wrong = &check(&[table(seed, |p| 0.8 * p)], 2.0)[0];
            assert!(wrong.disagrees && wrong.mean_log_ratio > 0.1, "{wrong:?}");
        }
    }
}
