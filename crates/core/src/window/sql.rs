//! The statistics' SQL files and what runs them: the statements compiled in from `sql/`, the
//! DataFusion contexts with their bounded, spilling memory pool, and the in-memory tables their
//! inputs are registered as. A leaf of `window`: the operator's windows and the prepared statements
//! both build on it.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};

/// A statement and its SQL text (compiled in from `sql/`; the catalog, `super::catalog`, lists them).
pub struct Statistic {
    pub name: &'static str,
    pub sql: &'static str,
}

/// Default memory pool of the queries: 1 GiB.
pub const DEFAULT_QUERY_MEMORY_LIMIT: usize = 1 << 30;

/// A query runtime whose sorts, joins and aggregations share a pool of `limit` bytes and spill to
/// the OS temp directory beyond it (`[state] query_memory_limit`; a pipeline context holds one).
pub fn sql_env(limit: usize) -> Arc<RuntimeEnv> {
    // A fair pool: every spillable operator gets its share and spills past it, rather than the
    // first one taking the whole pool. Without one (no temp directory) the queries run unbounded.
    RuntimeEnvBuilder::new().with_memory_pool(Arc::new(FairSpillPool::new(limit))).build_arc().unwrap_or_else(|e| {
        tracing::warn!("a bounded query memory pool: {e}; queries run unbounded");
        Arc::new(RuntimeEnv::default())
    })
}

/// A query session on `env` (the cumulative views, training data).
pub fn query_session(env: &Arc<RuntimeEnv>) -> SessionContext {
    SessionContext::new_with_config_rt(SessionConfig::new(), env.clone())
}

/// The session of a window's statistics (reduce, merge, finish) on `env`: one partition. Their
/// inputs are one micro-batch or one window's partials, so splitting them buys little, while a hash
/// repartition copies every column it routes (the feature lists included) and buffers the copies.
/// Sorted inputs stay sorted (a merge of sorted runs rather than a re-sort).
pub fn window_session(env: &Arc<RuntimeEnv>) -> SessionContext {
    let mut config = SessionConfig::new().with_target_partitions(1);
    config.options_mut().optimizer.prefer_existing_sort = true;
    SessionContext::new_with_config_rt(config, env.clone())
}

/// What the window statistics' SQL leaves to the config: `{name}` in `sql/` (`[window]` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatisticBounds {
    /// Distinct sessions (patterns) a window's session store keeps (`sql/session_store.sql`).
    pub session_store_patterns: usize,
}

/// `[window] session_store_patterns` by default.
pub const DEFAULT_SESSION_STORE_PATTERNS: usize = 4096;

impl Default for StatisticBounds {
    fn default() -> Self {
        StatisticBounds { session_store_patterns: DEFAULT_SESSION_STORE_PATTERNS }
    }
}

impl StatisticBounds {
    /// `stat`'s SQL with the bounds filled in, for inputs whose keys are strings.
    pub fn sql(&self, stat: &Statistic) -> String {
        self.sql_for(stat, false)
    }

    /// `stat`'s SQL with the bounds filled in, and `{empty_context}` as the empty context in the
    /// inputs' key type: `''`, or id 0 where the keys are ids (`window::keys`).
    pub fn sql_for(&self, stat: &Statistic, ids: bool) -> String {
        let empty_context = if ids { "CAST(0 AS BIGINT UNSIGNED)" } else { "''" };
        stat.sql.replace("{session_store_patterns}", &self.session_store_patterns.to_string()).replace("{empty_context}", empty_context)
    }
}

/// Runs `stat` on `ctx`. Always returns at least one batch (possibly empty), so a table's schema
/// survives an empty result.
pub async fn run_sql(ctx: &SessionContext, stat: &Statistic) -> anyhow::Result<Vec<RecordBatch>> {
    run_bounded_sql(ctx, stat, &StatisticBounds::default()).await
}

/// `run_sql` with `bounds` filled into the statistic's SQL.
pub async fn run_bounded_sql(ctx: &SessionContext, stat: &Statistic, bounds: &StatisticBounds) -> anyhow::Result<Vec<RecordBatch>> {
    let df = ctx.sql(&bounds.sql(stat)).await.map_err(|e| sql_error(stat, e))?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let out = df.collect().await.map_err(|e| sql_error(stat, e))?;
    Ok(batches_or_empty(out, schema))
}

/// An error of statistic `stat`, naming its file.
pub(super) fn sql_error(stat: &Statistic, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("sql/{}.sql: {e}", stat.name)
}

/// A result's non-empty batches, or one empty batch of `schema` when there are none.
pub(super) fn batches_or_empty(mut out: Vec<RecordBatch>, schema: SchemaRef) -> Vec<RecordBatch> {
    out.retain(|b| b.num_rows() > 0);
    if out.is_empty() {
        out.push(RecordBatch::new_empty(schema));
    }
    out
}

/// Every top-level field nullable: partials of one table (a reduce's and a merge's output) then
/// share one schema whatever nullability each query inferred.
fn relaxed(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect::<Vec<_>>()))
}

/// Registers `batches` as table `name` (with `schema` when there are none).
pub fn register(ctx: &SessionContext, name: &str, schema: SchemaRef, batches: Vec<RecordBatch>) -> anyhow::Result<()> {
    register_runs(ctx, name, schema, vec![batches], &[])
}

/// Registers partials of one table as table `name`, one partition per partial (with `schema` when
/// there are no batches; every field nullable, see `relaxed`). When every partial
/// is sorted by `order` (what the reduce and merge SQL write), the table says so and the merge
/// streams; a partial that is not (e.g. written by an older `ultr`) makes it an ordinary table.
pub fn register_runs(ctx: &SessionContext, name: &str, schema: SchemaRef, runs: Vec<Vec<RecordBatch>>, order: &[&str]) -> anyhow::Result<()> {
    let (_, table) = mem_table(name, schema, runs, order)?;
    ctx.register_table(name, Arc::new(table))?;
    Ok(())
}

/// The table `register_runs` registers, and its schema.
pub(super) fn mem_table(name: &str, schema: SchemaRef, runs: Vec<Vec<RecordBatch>>, order: &[&str]) -> anyhow::Result<(SchemaRef, MemTable)> {
    let schema = relaxed(&runs.first().and_then(|r| r.first()).map(|b| b.schema()).unwrap_or(schema));
    let sorted = !order.is_empty() && runs.iter().all(|run| is_sorted_by(run, order));
    let runs = runs
        .into_iter()
        .map(|run| run.into_iter().map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec())).collect::<Result<Vec<_>, _>>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("table {name}: batches of different schemas: {e}"))?;
    let runs = if runs.is_empty() { vec![Vec::new()] } else { runs };
    let mut table = MemTable::try_new(schema.clone(), runs)?;
    if sorted {
        table = table.with_sort_order(vec![order.iter().map(|c| datafusion::prelude::col(*c).sort(true, false)).collect()]);
    }
    Ok((schema, table))
}

/// Whether the rows of `run` (its batches in order) ascend by the columns `order`, NULLs last.
pub fn is_sorted_by(run: &[RecordBatch], order: &[&str]) -> bool {
    use datafusion::arrow::array::make_comparator;
    use datafusion::arrow::compute::SortOptions;
    let options = SortOptions { descending: false, nulls_first: false };
    let keys = |b: &RecordBatch| order.iter().map(|c| b.column_by_name(c).cloned()).collect::<Option<Vec<ArrayRef>>>();
    let mut previous: Option<(Vec<ArrayRef>, usize)> = None;
    for batch in run.iter().filter(|b| b.num_rows() > 0) {
        let Some(current) = keys(batch) else { return false };
        let check = |left: &[ArrayRef], i: usize, j: usize| -> bool {
            for (l, r) in left.iter().zip(&current) {
                let Ok(cmp) = make_comparator(l.as_ref(), r.as_ref(), options) else { return false };
                match cmp(i, j) {
                    std::cmp::Ordering::Less => return true,
                    std::cmp::Ordering::Greater => return false,
                    std::cmp::Ordering::Equal => {}
                }
            }
            true
        };
        if let Some((left, last)) = &previous {
            if !check(left, *last, 0) {
                return false;
            }
        }
        let comparators: Option<Vec<_>> = current.iter().map(|a| make_comparator(a.as_ref(), a.as_ref(), options).ok()).collect();
        let Some(comparators) = comparators else { return false };
        for i in 1..batch.num_rows() {
            for cmp in &comparators {
                match cmp(i - 1, i) {
                    std::cmp::Ordering::Less => break,
                    std::cmp::Ordering::Greater => return false,
                    std::cmp::Ordering::Equal => {}
                }
            }
        }
        previous = Some((current.clone(), batch.num_rows() - 1));
    }
    true
}
