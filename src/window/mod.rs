//! Runs the statistics in `sql/` over impression batches with DataFusion. The SQL files are the single
//! source of truth for every statistic; this module only wires them.

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use crate::session::impressions_schema;

/// A named statistic and its SQL text (compiled in from `sql/`).
pub struct Statistic {
    pub name: &'static str,
    pub sql: &'static str,
}

pub const POSITION_CTR: Statistic = Statistic { name: "position_ctr", sql: include_str!("../../sql/position_ctr.sql") };

/// Registers `batches` as table `impressions` and runs one statistic over them.
pub async fn run_statistic(stat: &Statistic, batches: Vec<RecordBatch>) -> anyhow::Result<Vec<RecordBatch>> {
    let ctx = SessionContext::new();
    let table = MemTable::try_new(impressions_schema(), vec![batches])?;
    ctx.register_table("impressions", std::sync::Arc::new(table))?;
    let df = ctx.sql(stat.sql).await.map_err(|e| anyhow::anyhow!("sql/{}.sql: {e}", stat.name))?;
    Ok(df.collect().await?)
}
