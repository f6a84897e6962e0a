//! The window statistics as prepared statements: each `sql/` statement is parsed, planned and
//! optimized once per input shape and re-run on every micro-batch, window and merge.
//!
//! Why: a window statistic runs on one micro-batch or one window's partials, so each run is small,
//! and parsing, analysing and optimizing its SQL were a large share of each run (measured in
//! docs/benchmarks.md, beside the profile that introduced prepared statements). The logical plan does not
//! depend on the data, only on the input tables' schemas; each run plugs its data into the plan's
//! tables and plans the physical side afresh, so a sorted input still streams through a sorted merge
//! and the partition count follows the input, exactly as an unprepared run would plan it.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::{MemTable, TableType};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_plan::{collect, ExecutionPlan};

use datafusion::execution::runtime_env::RuntimeEnv;

use super::sql::{batches_or_empty, mem_table, sql_error, window_session, Statistic, StatisticBounds};

/// One input table of a statement run: its name in the SQL, its batches as runs (one partition
/// each) and the order every run is sorted by, if any (`register_runs`).
pub struct Input<'a> {
    pub name: &'a str,
    pub schema: SchemaRef,
    pub runs: Vec<Vec<RecordBatch>>,
    pub order: &'a [&'a str],
}

/// A table whose data is plugged in for one run and taken out after it, so a cached plan can scan
/// new data without being planned again, and holds no batch between runs.
#[derive(Debug)]
struct Slot {
    schema: SchemaRef,
    data: Mutex<Option<Arc<MemTable>>>,
}

#[async_trait]
impl TableProvider for Slot {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let table = self.data.lock().clone();
        let table = table.ok_or_else(|| datafusion::error::DataFusionError::Internal("a prepared statement ran without its data".into()))?;
        table.scan(state, projection, filters, limit).await
    }
}

/// A statement's optimized logical plan, its tables and the session that planned it.
struct Prepared {
    plan: LogicalPlan,
    slots: Vec<(String, Arc<Slot>)>,
    state: SessionState,
}

/// The window statistics' statements on one memory pool: each prepared once per statement, bounds
/// and input schemas, and kept while not in use. A run takes one out (so runs on several workers at
/// once never share a slot) and puts it back; at most one per concurrent run of the same statement
/// is ever built. A pipeline context holds one (`crate::context`).
pub struct Statements {
    env: Arc<RuntimeEnv>,
    idle: Mutex<HashMap<String, Vec<Prepared>>>,
}

impl Statements {
    /// Statements whose queries run on `env` (its memory pool).
    pub fn new(env: Arc<RuntimeEnv>) -> Statements {
        Statements { env, idle: Mutex::new(HashMap::new()) }
    }

    /// The query runtime (memory pool) the statements run on.
    pub fn env(&self) -> &Arc<RuntimeEnv> {
        &self.env
    }

    /// A session of the window statistics' settings on this memory pool (`window_session`).
    pub fn session(&self) -> datafusion::prelude::SessionContext {
        window_session(&self.env)
    }

    async fn prepare(&self, stat: &Statistic, bounds: &StatisticBounds, tables: &[(String, SchemaRef, Arc<MemTable>)]) -> anyhow::Result<Prepared> {
        let ctx = self.session();
        let mut slots = Vec::with_capacity(tables.len());
        for (name, schema, _) in tables {
            let slot = Arc::new(Slot { schema: schema.clone(), data: Mutex::new(None) });
            ctx.register_table(name.as_str(), slot.clone())?;
            slots.push((name.clone(), slot));
        }
        let df = ctx.sql(&bounds.sql_for(stat, true)).await.map_err(|e| sql_error(stat, e))?;
        let state = ctx.state();
        let plan = state.optimize(df.logical_plan()).map_err(|e| sql_error(stat, e))?;
        Ok(Prepared { plan, slots, state })
    }

    /// Runs `stat` on `inputs`, planned once per statement, bounds and input schemas. Like
    /// `run_bounded_sql`: always at least one batch (possibly empty), so the schema survives. The
    /// inputs are a window's tables, keyed by ids (`window::keys`): `{empty_context}` is id 0. Tables
    /// keyed by strings (the cumulative views) run through `run_bounded_sql`.
    pub async fn run(&self, stat: &Statistic, bounds: &StatisticBounds, inputs: Vec<Input<'_>>) -> anyhow::Result<Vec<RecordBatch>> {
        let mut tables = Vec::with_capacity(inputs.len());
        for input in inputs {
            let (schema, table) = mem_table(input.name, input.schema, input.runs, input.order)?;
            tables.push((input.name.to_string(), schema, Arc::new(table)));
        }
        let mut key = format!("{}\u{0}{}", stat.name, bounds.session_store_patterns);
        for (name, schema, _) in &tables {
            key.push_str(&format!("\u{0}{name}\u{0}{:?}", schema.fields()));
        }
        let taken = self.idle.lock().get_mut(&key).and_then(Vec::pop);
        let prepared = match taken {
            Some(p) => p,
            None => self.prepare(stat, bounds, &tables).await?,
        };
        for ((_, slot), (_, _, table)) in prepared.slots.iter().zip(&tables) {
            *slot.data.lock() = Some(table.clone());
        }
        drop(tables);
        let result = execute(&prepared).await.map_err(|e| sql_error(stat, e));
        for (_, slot) in &prepared.slots {
            *slot.data.lock() = None;
        }
        let schema: SchemaRef = Arc::new(prepared.plan.schema().as_arrow().clone());
        self.idle.lock().entry(key).or_default().push(prepared);
        Ok(batches_or_empty(result?, schema))
    }
}

async fn execute(prepared: &Prepared) -> datafusion::error::Result<Vec<RecordBatch>> {
    let physical = prepared.state.query_planner().create_physical_plan(&prepared.plan, &prepared.state).await?;
    collect(physical, prepared.state.task_ctx()).await
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::window::{register_runs, run_bounded_sql, StateTable};

    /// The query sessions' merge statement (the catalog's).
    fn merge_query_sessions() -> &'static Statistic {
        StateTable::QuerySessions.entry().computed.merge().expect("query sessions are a partial aggregate").0
    }
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::compute::concat_batches;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn run_of(rows: &[(&str, &str, i64)]) -> Vec<RecordBatch> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("query_id", DataType::Utf8, true),
            Field::new("policy_id", DataType::Utf8, true),
            Field::new("sessions", DataType::Int64, true),
        ]));
        let q = StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
        let p = StringArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>());
        let s = Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>());
        vec![RecordBatch::try_new(schema, vec![Arc::new(q), Arc::new(p), Arc::new(s)]).unwrap()]
    }

    async fn unprepared(runs: Vec<Vec<RecordBatch>>, order: &[&str]) -> RecordBatch {
        let ctx = window_session(&Arc::new(RuntimeEnv::default()));
        register_runs(&ctx, "query_sessions", runs[0][0].schema(), runs, order).unwrap();
        let out = run_bounded_sql(&ctx, merge_query_sessions(), &StatisticBounds::default()).await.unwrap();
        concat_batches(&out[0].schema(), &out).unwrap()
    }

    /// A plan prepared on one input runs on the next with the next's data only: sorted runs, an
    /// unsorted one (planned with a sort), more partitions, and an empty input — each equal to a
    /// fresh, unprepared run of the same SQL, from one prepared plan.
    pub fn a_prepared_statement_equals_a_fresh_run_on_every_input() {
        let order: &[&str] = &["query_id", "policy_id"];
        let inputs = vec![
            vec![run_of(&[("a", "p", 1), ("b", "p", 2)]), run_of(&[("a", "p", 3), ("c", "q", 4)])],
            vec![run_of(&[("z", "p", 5), ("a", "p", 6), ("z", "p", 7)])],
            vec![run_of(&[("a", "q", 1)]), run_of(&[("b", "q", 2)]), run_of(&[("a", "q", 3), ("b", "r", 1)])],
            vec![run_of(&[])],
        ];
        let statements = Statements::new(Arc::new(RuntimeEnv::default()));
        let run = |input| crate::context::run_here(statements.run(merge_query_sessions(), &StatisticBounds::default(), vec![input])).unwrap();
        let key_runs = |runs: &Vec<Vec<RecordBatch>>| runs[0][0].schema();
        for runs in &inputs {
            let input = Input { name: "query_sessions", schema: key_runs(runs), runs: runs.clone(), order };
            let got = run(input).unwrap();
            let got = concat_batches(&got[0].schema(), &got).unwrap();
            let want = crate::context::run_here(unprepared(runs.clone(), order)).unwrap();
            assert_eq!(got, want, "input {runs:?}");
        }
        let pool = statements.idle.lock();
        let prepared: usize = pool.iter().filter(|(k, _)| k.starts_with("merge_query_sessions\u{0}")).map(|(_, v)| v.len()).sum();
        assert_eq!(prepared, 1, "one plan served every run");
        for (_, entries) in pool.iter() {
            for p in entries {
                assert!(p.slots.iter().all(|(_, s)| s.data.lock().is_none()), "a pooled plan holds no data between runs");
            }
        }
    }
}
