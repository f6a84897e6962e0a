//! Cumulative views over the lookback horizon: π(d,k|q), the swap graph and the overlap sample,
//! computed by the same `sql/` files from the closed windows' statistics.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::prelude::SessionContext;
use std::sync::Arc;

use super::{read_window_table, write_parquet, Manifest, WindowEntry};
use crate::window::{register, run_sql, CUMULATIVE_PROPENSITY, OVERLAP_SAMPLE, SWAP_EDGES};

/// The cumulative tables and which windows they cover.
pub struct Cumulative {
    pub windows: Vec<WindowEntry>,
    /// query_id, doc_id, position, context, impressions, clicks, sessions, propensity
    pub propensity: Vec<RecordBatch>,
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
    register(
        &ctx,
        "propensity_counts",
        empty_schema(&[
            ("query_id", DataType::Utf8),
            ("doc_id", DataType::Utf8),
            ("position", DataType::UInt32),
            ("context", DataType::Utf8),
            ("impressions", DataType::Int64),
            ("clicks", DataType::Int64),
        ]),
        load("propensity_counts")?,
    )?;
    register(&ctx, "query_sessions", empty_schema(&[("query_id", DataType::Utf8), ("sessions", DataType::Int64)]), load("query_sessions")?)?;
    let propensity = run_sql(&ctx, &CUMULATIVE_PROPENSITY).await?;

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
        empty_schema(&[
            ("position", DataType::UInt32),
            ("context", DataType::Utf8),
            ("sample_key", DataType::UInt64),
            ("features", DataType::List(item)),
        ]),
        load("overlap_sample")?,
    )?;
    let overlap_sample = run_sql(&sample_ctx, &OVERLAP_SAMPLE).await?;
    Ok(Cumulative { windows, propensity, swap_edges, overlap_sample })
}

/// Writes the cumulative tables under `cumulative/` (each file atomically).
pub fn write(dir: &std::path::Path, c: &Cumulative) -> anyhow::Result<()> {
    let out = dir.join("cumulative");
    std::fs::create_dir_all(&out)?;
    write_parquet(&out.join("propensity.parquet"), &c.propensity)?;
    write_parquet(&out.join("swap_edges.parquet"), &c.swap_edges)?;
    write_parquet(&out.join("overlap_sample.parquet"), &c.overlap_sample)?;
    Ok(())
}
