//! Cumulative views over the lookback horizon: π(d,k|q), the swap graph and the overlap sample,
//! computed by the same `sql/` files from the closed windows' statistics.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::prelude::SessionContext;
use std::sync::Arc;

use super::{read_window_table, write_parquet, Manifest, WindowEntry};
use crate::window::{register, run_sql, CUMULATIVE_PROPENSITY, OVERLAP_SAMPLE, POLICY_PROPENSITY, SWAP_EDGES};

/// The cumulative tables and which windows they cover.
pub struct Cumulative {
    pub windows: Vec<WindowEntry>,
    /// query_id, doc_id, position, context, impressions, clicks, sessions, propensity
    pub propensity: Vec<RecordBatch>,
    /// Per (query, document, position, policy): counted and logged π (`sql/policy_propensity.sql`).
    pub policy_propensity: Vec<RecordBatch>,
    /// position_a, context_a, position_b, context_b, pairs
    pub swap_edges: Vec<RecordBatch>,
    /// position, context, sample_key, features
    pub overlap_sample: Vec<RecordBatch>,
}

/// Windows ending within `horizon_ms` of the newest regular window's end: the newest window end at
/// or before the event watermark (so a flushed outlier window far in the future cannot push every
/// real window out of the horizon), or the newest window end for states without one.
pub fn windows_in_horizon(manifest: &Manifest, horizon_ms: i64) -> Vec<WindowEntry> {
    let newest = manifest.windows.iter().map(|w| w.end_ms).max();
    let regular = manifest.operator.event_watermark.and_then(|wm| {
        manifest.windows.iter().map(|w| w.end_ms).filter(|e| *e <= wm.saturating_add(manifest.window.allowed_lateness_ms + manifest.window.size_ms)).max()
    });
    let Some(latest) = regular.or(newest) else { return Vec::new() };
    manifest.windows.iter().filter(|w| w.end_ms > latest - horizon_ms).cloned().collect()
}

fn empty_schema(fields: &[(&str, DataType)]) -> Arc<Schema> {
    Arc::new(Schema::new(fields.iter().map(|(n, t)| Field::new(*n, t.clone(), true)).collect::<Vec<_>>()))
}

/// `batches` with exactly `schema`'s columns: a column a window written by an older build lacks
/// (no policy_id or logged propensities) gets its neutral value — policy "" (unknown), nothing logged.
fn conform(batches: Vec<RecordBatch>, schema: &Arc<Schema>) -> anyhow::Result<Vec<RecordBatch>> {
    use datafusion::arrow::array::{new_null_array, ArrayRef, Float64Array, Int64Array, StringArray};
    use datafusion::arrow::compute::cast;
    batches
        .into_iter()
        .map(|b| {
            let n = b.num_rows();
            let columns = schema
                .fields()
                .iter()
                .map(|f| -> anyhow::Result<ArrayRef> {
                    Ok(match (b.column_by_name(f.name()), f.data_type()) {
                        (Some(c), t) => cast(c, t)?,
                        (None, DataType::Utf8) => Arc::new(StringArray::from(vec![""; n])),
                        (None, DataType::Int64) => Arc::new(Int64Array::from(vec![0i64; n])),
                        (None, DataType::Float64) => Arc::new(Float64Array::from(vec![0.0; n])),
                        (None, t) => new_null_array(t, n),
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(RecordBatch::try_new(schema.clone(), columns)?)
        })
        .collect()
}

/// Computes the cumulative views from the state in `dir`.
pub async fn compute(dir: &std::path::Path, manifest: &Manifest, horizon_ms: i64) -> anyhow::Result<Cumulative> {
    let windows = windows_in_horizon(manifest, horizon_ms);
    let load = |table: &str| -> anyhow::Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for w in &windows {
            out.extend(read_window_table(dir, w, table)?);
        }
        Ok(out)
    };
    let ctx = SessionContext::new();
    let counts_schema = empty_schema(&[
        ("query_id", DataType::Utf8),
        ("doc_id", DataType::Utf8),
        ("position", DataType::UInt32),
        ("context", DataType::Utf8),
        ("policy_id", DataType::Utf8),
        ("impressions", DataType::Int64),
        ("clicks", DataType::Int64),
        ("logged_impressions", DataType::Int64),
        ("logged_inverse_sum", DataType::Float64),
    ]);
    let sessions_schema = empty_schema(&[("query_id", DataType::Utf8), ("policy_id", DataType::Utf8), ("sessions", DataType::Int64)]);
    register(&ctx, "propensity_counts", counts_schema.clone(), conform(load("propensity_counts")?, &counts_schema)?)?;
    register(&ctx, "query_sessions", sessions_schema.clone(), conform(load("query_sessions")?, &sessions_schema)?)?;
    let propensity = run_sql(&ctx, &CUMULATIVE_PROPENSITY).await?;
    let policy_propensity = run_sql(&ctx, &POLICY_PROPENSITY).await?;

    let swap_ctx = SessionContext::new();
    let prop_schema = propensity.first().map(|b| b.schema()).unwrap_or_else(|| {
        empty_schema(&[("query_id", DataType::Utf8), ("doc_id", DataType::Utf8), ("position", DataType::UInt32), ("context", DataType::Utf8)])
    });
    register(&swap_ctx, "impressions", prop_schema, propensity.clone())?;
    let swap_edges = run_sql(&swap_ctx, &SWAP_EDGES).await?;

    let sample_ctx = SessionContext::new();
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    register(
        &sample_ctx,
        "impressions",
        empty_schema(&[("position", DataType::UInt32), ("context", DataType::Utf8), ("sample_key", DataType::UInt64), ("features", DataType::List(item))]),
        load("overlap_sample")?,
    )?;
    let overlap_sample = run_sql(&sample_ctx, &OVERLAP_SAMPLE).await?;
    Ok(Cumulative { windows, propensity, policy_propensity, swap_edges, overlap_sample })
}

/// Writes the cumulative tables under `cumulative/` (each file atomically).
pub fn write(dir: &std::path::Path, c: &Cumulative) -> anyhow::Result<()> {
    let out = dir.join("cumulative");
    std::fs::create_dir_all(&out)?;
    write_parquet(&out.join("propensity.parquet"), &c.propensity)?;
    write_parquet(&out.join("policy_propensity.parquet"), &c.policy_propensity)?;
    write_parquet(&out.join("swap_edges.parquet"), &c.swap_edges)?;
    write_parquet(&out.join("overlap_sample.parquet"), &c.overlap_sample)?;
    Ok(())
}
