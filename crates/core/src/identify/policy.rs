//! Whether the logging policy varies within positions: what any test of residuals against the
//! policy (misspecification, Hager §5.2) needs. A deterministic policy puts each document at one
//! position for its query (π ≡ 1), and such data cannot show misspecification through the policy.

use std::collections::{BTreeMap, HashMap};

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, UInt32Type};

/// Impression-weighted within-position standard deviation of π over (position, π, impressions).
pub fn policy_variation(rows: impl IntoIterator<Item = (u32, f64, f64)>) -> f64 {
    let mut by_pos: BTreeMap<u32, (f64, f64, f64)> = Default::default();
    for (k, p, n) in rows {
        if p.is_finite() && n > 0.0 {
            let s = by_pos.entry(k).or_default();
            s.0 += n;
            s.1 += n * p;
            s.2 += n * p * p;
        }
    }
    let (mut within, mut total) = (0.0, 0.0);
    for (n, sp, spp) in by_pos.values() {
        within += (spp - sp * sp / n).max(0.0);
        total += n;
    }
    if total > 0.0 {
        (within / total).sqrt()
    } else {
        0.0
    }
}

/// `policy_variation` of the cumulative propensity table (its per-context rows merged into
/// π(d,k|q) = Σ impressions / sessions(q), as training uses it), positions up to `max_position`.
pub fn policy_variation_of(propensity: &[RecordBatch], max_position: u32) -> f64 {
    let mut merged: HashMap<(String, String, u32), (f64, f64)> = HashMap::new();
    for b in propensity {
        let (Some(q), Some(d), Some(k), Some(n), Some(s)) = (
            b.column_by_name("query_id"),
            b.column_by_name("doc_id"),
            b.column_by_name("position"),
            b.column_by_name("impressions"),
            b.column_by_name("sessions"),
        ) else {
            continue;
        };
        let (q, d, k) = (q.as_string::<i32>(), d.as_string::<i32>(), k.as_primitive::<UInt32Type>());
        let as_f64 = |c: &datafusion::arrow::array::ArrayRef| datafusion::arrow::compute::cast(c, &DataType::Float64);
        let (Ok(n), Ok(s)) = (as_f64(n), as_f64(s)) else { continue };
        let (n, s) = (n.as_primitive::<Float64Type>(), s.as_primitive::<Float64Type>());
        for i in 0..b.num_rows() {
            if k.value(i) > max_position {
                continue;
            }
            let e = merged.entry((q.value(i).to_string(), d.value(i).to_string(), k.value(i))).or_default();
            e.0 += n.value(i);
            e.1 = s.value(i); // sessions of the query: the same on every row of it
        }
    }
    policy_variation(merged.into_iter().filter(|(_, (_, s))| *s > 0.0).map(|((_, _, k), (n, s))| (k, n / s, n)))
}

/// Why data with this policy variation cannot be tested, or None when it can.
pub fn blind_reason(policy_variation: f64, min_policy_variation: f64) -> Option<String> {
    (policy_variation < min_policy_variation).then(|| {
        format!(
            "π(d,k|q) hardly varies within positions (impression-weighted sd {policy_variation:.4} < {min_policy_variation}): the logging \
             policy puts each document at one position for its query and there is no randomised traffic, so residuals cannot be tested \
             against the policy — misspecification cannot be assessed from this data (randomise a share of traffic)"
        )
    })
}

/// Columns of `sql/policy_propensity.sql`'s output.
pub fn policy_propensity_schema() -> std::sync::Arc<Schema> {
    std::sync::Arc::new(Schema::new(vec![
        Field::new("query_id", DataType::Utf8, true),
        Field::new("doc_id", DataType::Utf8, true),
        Field::new("position", DataType::UInt32, true),
        Field::new("policy_id", DataType::Utf8, true),
        Field::new("impressions", DataType::Int64, true),
        Field::new("logged_impressions", DataType::Int64, true),
        Field::new("logged_inverse_sum", DataType::Float64, true),
        Field::new("policy_sessions", DataType::Int64, true),
        Field::new("sessions", DataType::Int64, true),
        Field::new("empirical_propensity", DataType::Float64, true),
        Field::new("logged_propensity", DataType::Float64, true),
    ]))
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn policy_variation_is_the_within_position_sd() {
        // Position 1: π ∈ {0.2, 0.6} equally weighted (sd 0.2); position 2 constant; pooled over 4 impressions.
        let v = policy_variation([(1, 0.2, 1.0), (1, 0.6, 1.0), (2, 0.5, 2.0)]);
        assert!((v - (0.08f64 / 4.0).sqrt()).abs() < 1e-12, "{v}");
        assert_eq!(policy_variation([(1, 1.0, 5.0), (2, 1.0, 3.0)]), 0.0);
        assert!(blind_reason(0.0, 0.01).is_some_and(|r| r.contains("cannot be assessed")) && blind_reason(0.2, 0.01).is_none());
    }
}
