//! Windows and their statistics: `operator` decides which impressions belong to which event-time
//! window; the statistics themselves are the SQL files in `sql/`, run here by DataFusion.

pub mod operator;

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use crate::session::impressions_schema;
use crate::session::schema::col;

/// A named statistic and its SQL text (compiled in from `sql/`).
pub struct Statistic {
    pub name: &'static str,
    pub sql: &'static str,
}

pub const POSITION_CTR: Statistic = Statistic { name: "position_ctr", sql: include_str!("../../sql/position_ctr.sql") };
pub const PROPENSITY_COUNTS: Statistic = Statistic { name: "propensity_counts", sql: include_str!("../../sql/propensity_counts.sql") };
pub const QUERY_SESSIONS: Statistic = Statistic { name: "query_sessions", sql: include_str!("../../sql/query_sessions.sql") };
pub const SWAP_EDGES: Statistic = Statistic { name: "swap_edges", sql: include_str!("../../sql/swap_edges.sql") };
pub const OVERLAP_SAMPLE: Statistic = Statistic { name: "overlap_sample", sql: include_str!("../../sql/overlap_sample.sql") };
pub const TRAINING_IMPRESSIONS: Statistic =
    Statistic { name: "training_impressions", sql: include_str!("../../sql/training_impressions.sql") };
pub const TRAINING_EXAMPLES: Statistic = Statistic { name: "training_examples", sql: include_str!("../../sql/training_examples.sql") };
pub const CUMULATIVE_PROPENSITY: Statistic =
    Statistic { name: "cumulative_propensity", sql: include_str!("../../sql/cumulative_propensity.sql") };

/// Every per-window statistic, in the order they are written.
pub const WINDOW_STATISTICS: [&Statistic; 6] =
    [&PROPENSITY_COUNTS, &QUERY_SESSIONS, &POSITION_CTR, &SWAP_EDGES, &OVERLAP_SAMPLE, &TRAINING_IMPRESSIONS];

/// The statistics of one window (or of a cumulative view), by name.
pub type Tables = Vec<(&'static str, Vec<RecordBatch>)>;

/// Registers `batches` under `name` (with `schema` when there are none) and runs `stat`.
pub async fn run_sql(ctx: &SessionContext, stat: &Statistic) -> anyhow::Result<Vec<RecordBatch>> {
    let df = ctx.sql(stat.sql).await.map_err(|e| anyhow::anyhow!("sql/{}.sql: {e}", stat.name))?;
    df.collect().await.map_err(|e| anyhow::anyhow!("sql/{}.sql: {e}", stat.name))
}

pub fn register(ctx: &SessionContext, name: &str, schema: SchemaRef, batches: Vec<RecordBatch>) -> anyhow::Result<()> {
    let schema = batches.first().map(|b| b.schema()).unwrap_or(schema);
    ctx.register_table(name, Arc::new(MemTable::try_new(schema, vec![batches])?))?;
    Ok(())
}

/// Registers `batches` as table `impressions` and runs one statistic over them.
pub async fn run_statistic(stat: &Statistic, batches: Vec<RecordBatch>) -> anyhow::Result<Vec<RecordBatch>> {
    let ctx = SessionContext::new();
    register(&ctx, "impressions", impressions_schema(), batches)?;
    run_sql(&ctx, stat).await
}

/// The impressions schema plus `sample_key`, the deterministic hash that orders the overlap sample.
pub fn window_schema() -> SchemaRef {
    let mut fields: Vec<Field> = impressions_schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new("sample_key", DataType::UInt64, false));
    Arc::new(Schema::new(fields))
}

/// FNV-1a of session id and position, finished with a 64-bit mix: stable across runs and machines.
pub fn sample_key(session_id: &str, position: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session_id.bytes().chain(position.to_le_bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

fn with_sample_key(batch: &RecordBatch) -> anyhow::Result<RecordBatch> {
    let ids = batch.column_by_name(col::SESSION_ID).expect("impressions schema").as_string::<i32>();
    let pos = batch.column_by_name(col::POSITION).expect("impressions schema").as_primitive::<UInt32Type>();
    let keys: UInt64Array = (0..batch.num_rows()).map(|i| sample_key(ids.value(i), pos.value(i))).collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(keys));
    Ok(RecordBatch::try_new(window_schema(), columns)?)
}

/// Every per-window statistic over one window's impressions.
pub async fn window_statistics(impressions: &[RecordBatch]) -> anyhow::Result<Tables> {
    let ctx = SessionContext::new();
    let keyed = impressions.iter().map(with_sample_key).collect::<anyhow::Result<Vec<_>>>()?;
    register(&ctx, "impressions", window_schema(), keyed)?;
    let mut out = Vec::new();
    for stat in WINDOW_STATISTICS {
        out.push((stat.name, run_sql(&ctx, stat).await?));
    }
    Ok(out)
}
