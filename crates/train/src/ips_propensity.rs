//! Which π(d,k|q) the IPS weights use: counted, or the logging policies' own logged propensities,
//! chosen per policy (`[train.ips] source`, `policies`), with optional shrinkage of counted π —
//! `sql/ips_propensity.sql` over the horizon's per-policy table (`sql/policy_propensity.sql`).

use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use super::config::IpsConfig;
use ultr_core::identify::policy::policy_propensity_schema;
use ultr_core::window::{register, run_sql, IPS_PROPENSITY};

/// Columns of `sql/ips_propensity.sql`'s output (what `sql/training_examples.sql` joins).
pub fn ips_propensity_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("query_id", DataType::Utf8, true),
        Field::new("doc_id", DataType::Utf8, true),
        Field::new("position", DataType::UInt32, true),
        Field::new("sessions", DataType::Int64, true),
        Field::new("propensity", DataType::Float64, true),
        Field::new("logged", DataType::Boolean, true),
    ]))
}

/// The IPS π per (query, document, position) from the per-policy table, as `cfg` chooses.
pub async fn ips_propensity(
    context: &ultr_core::context::PipelineContext,
    policy_propensity: Vec<RecordBatch>,
    cfg: &IpsConfig,
) -> anyhow::Result<Vec<RecordBatch>> {
    let ctx = context.query_session();
    register(&ctx, "policy_propensity", policy_propensity_schema(), policy_propensity)?;
    let mut policies: Vec<Option<&str>> = vec![None];
    let mut sources = vec![cfg.source.name()];
    for (policy, source) in &cfg.policies {
        policies.push(Some(policy));
        sources.push(source.name());
    }
    let schema = Arc::new(Schema::new(vec![Field::new("policy_id", DataType::Utf8, true), Field::new("source", DataType::Utf8, false)]));
    let table = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(policies)), Arc::new(StringArray::from(sources))])?;
    register(&ctx, "ips_sources", schema, vec![table])?;
    let schema = Arc::new(Schema::new(vec![Field::new("prior_sessions", DataType::Float64, false)]));
    let table = RecordBatch::try_new(schema.clone(), vec![Arc::new(Float64Array::from(vec![cfg.prior_sessions]))])?;
    register(&ctx, "ips_smoothing", schema, vec![table])?;
    run_sql(&ctx, &IPS_PROPENSITY).await
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::config::PropensitySource;
    use datafusion::arrow::array::{Array, AsArray, Int64Array, UInt32Array};
    use datafusion::arrow::datatypes::{Float64Type, UInt32Type};
    use std::collections::BTreeMap;

    /// Two policies share query q (10 sessions of A, 30 of B): A logs propensities, B does not.
    /// Rows: (doc, position, policy, impressions, logged impressions, Σ 1/p, policy sessions).
    fn table() -> Vec<RecordBatch> {
        let rows: [(&str, u32, &str, i64, i64, f64, i64); 4] = [
            ("d1", 1, "A", 8, 8, 8.0 / 0.7, 10),
            ("d1", 1, "B", 30, 0, 0.0, 30),
            ("d2", 1, "A", 2, 2, 2.0 / 0.3, 10),
            ("d2", 2, "A", 5, 4, 4.0 / 0.5, 10), // one of its five impressions lacks a propensity
        ];
        let logged: Vec<Option<f64>> = rows.iter().map(|r| (r.4 == r.3 && r.5 > 0.0).then(|| r.4 as f64 / r.5)).collect();
        let b = RecordBatch::try_new(
            policy_propensity_schema(),
            vec![
                Arc::new(StringArray::from(vec!["q"; 4])),
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(UInt32Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.3).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.4).collect::<Vec<_>>())),
                Arc::new(Float64Array::from(rows.iter().map(|r| r.5).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.6).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(vec![40i64; 4])),
                Arc::new(Float64Array::from(rows.iter().map(|r| r.3 as f64 / r.6 as f64).collect::<Vec<_>>())),
                Arc::new(Float64Array::from(logged)),
            ],
        )
        .unwrap();
        vec![b]
    }

    fn pis(cfg: &IpsConfig) -> BTreeMap<(String, u32), Option<f64>> {
        let context = ultr_core::context::PipelineContext::default();
        let out = context.run("ultr-test", ips_propensity(&context, table(), cfg)).unwrap().unwrap();
        let mut m = BTreeMap::new();
        for b in &out {
            let (d, k, p) = (b.column(1).as_string::<i32>(), b.column(2).as_primitive::<UInt32Type>(), b.column(4).as_primitive::<Float64Type>());
            for i in 0..b.num_rows() {
                m.insert((d.value(i).to_string(), k.value(i)), (!p.is_null(i)).then(|| p.value(i)));
            }
        }
        m
    }

    fn close(got: Option<f64>, want: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() < 1e-12)
    }

    /// Each policy contributes its expected displays of a cell (counted, or its sessions × its logged
    /// π) over all 40 sessions of the query; brute-force values by hand.
    pub fn each_policy_contributes_its_counted_or_logged_displays() {
        let empirical = pis(&IpsConfig::default());
        assert!(close(empirical[&("d1".into(), 1)], 38.0 / 40.0) && close(empirical[&("d2".into(), 2)], 5.0 / 40.0));

        // A logged, B counted (by default): d1 at 1 is (10 · 0.7 + 30) / 40.
        let cfg = IpsConfig { policies: [("A".to_string(), PropensitySource::Logged)].into(), ..IpsConfig::default() };
        let mixed = pis(&cfg);
        assert!(close(mixed[&("d1".into(), 1)], (10.0 * 0.7 + 30.0) / 40.0), "{mixed:?}");
        assert!(close(mixed[&("d2".into(), 1)], 10.0 * 0.3 / 40.0));
        // "logged" for a policy whose impressions lack a propensity: no π (the trainer refuses it).
        assert_eq!(mixed[&("d2".into(), 2)], None);

        // "auto" counts where the log is incomplete.
        let auto = pis(&IpsConfig { source: PropensitySource::Auto, ..IpsConfig::default() });
        assert!(close(auto[&("d1".into(), 1)], (10.0 * 0.7 + 30.0) / 40.0) && close(auto[&("d2".into(), 2)], 5.0 / 40.0), "{auto:?}");

        // Shrinkage applies to counted cells only, toward the position's impression-weighted mean π.
        let m = 4.0;
        let shrunk = pis(&IpsConfig { prior_sessions: m, policies: cfg.policies.clone(), ..IpsConfig::default() });
        let pos2_mean = 5.0 / 40.0; // position 2 has one cell
        assert!(close(shrunk[&("d1".into(), 1)], mixed[&("d1".into(), 1)].unwrap()), "logged cells are not shrunk");
        let empirical_shrunk = pis(&IpsConfig { prior_sessions: m, ..IpsConfig::default() });
        assert!(close(empirical_shrunk[&("d2".into(), 2)], (5.0 + m * pos2_mean) / (40.0 + m)), "{empirical_shrunk:?}");
        let pos1_mean = (38.0 * (38.0 / 40.0) + 2.0 * (2.0 / 40.0)) / 40.0;
        assert!(close(empirical_shrunk[&("d2".into(), 1)], (2.0 + m * pos1_mean) / (40.0 + m)));
    }
}
