//! Windows and their statistics: `operator` decides which sessions belong to which event-time
//! window; `aggregates` keeps each open window as mergeable partial aggregates; the statistics
//! themselves — reduce, merge and finish — are the SQL files in `sql/`, run here by DataFusion on
//! the contexts and tables of `sql` (module), through the statements `prepared` keeps planned.

pub mod aggregates;
pub mod catalog;
pub mod config;
pub(crate) mod hash;
pub mod keys;
pub mod operator;
pub mod prepared;
pub mod sql;

pub use catalog::{table, StateTable, Tables, CUMULATIVE_PROPENSITY, IPS_PROPENSITY, POLICY_PROPENSITY, TRAINING_EXAMPLES};
pub use sql::*;

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};

use crate::session::impressions_schema;
use crate::session::schema::col;
use catalog::Computed;
use hash::{fnv, mix, FNV_OFFSET, FNV_PRIME};

impl StateTable {
    /// The table's schema as its Parquet files hold it: key columns (`keys::KEY_COLUMNS`) as
    /// strings, every field nullable. Planned from its SQL on empty inputs, never executed.
    pub async fn schema(self) -> anyhow::Result<SchemaRef> {
        let schema = self.id_schema().await?;
        Ok(with_string_keys(&schema))
    }

    /// The schema of the table inside a window, keys as ids: its SQL planned on the window's rows
    /// (a partial) or on the table it is finished from.
    async fn id_schema(self) -> anyhow::Result<SchemaRef> {
        let (stat, input, input_schema) = match &self.entry().computed {
            Computed::Partial { reduce, .. } => (reduce, "impressions", window_schema()),
            Computed::Finished { sql, from, input } => {
                let Computed::Partial { reduce, .. } = &from.entry().computed else {
                    anyhow::bail!("statistic {} is finished from {}, which is not a partial", self.name(), from.name())
                };
                (sql, *input, planned(reduce, "impressions", window_schema()).await?)
            }
        };
        planned(stat, input, input_schema).await
    }
}

/// The output schema of `stat` on an empty table `input` of `schema` (keys as ids).
async fn planned(stat: &Statistic, input: &str, schema: SchemaRef) -> anyhow::Result<SchemaRef> {
    // Planning only: the plan never runs, so the session needs no memory pool.
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_table(input, Arc::new(datafusion::datasource::MemTable::try_new(schema, vec![Vec::new()])?))?;
    let df = ctx.sql(&StatisticBounds::default().sql_for(stat, true)).await.map_err(|e| sql::sql_error(stat, e))?;
    Ok(Arc::new(df.schema().as_arrow().clone()))
}

/// `schema` with its id key columns as strings and every field nullable (what a window writes).
fn with_string_keys(schema: &Schema) -> SchemaRef {
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .map(|f| {
            let f = f.as_ref().clone().with_nullable(true);
            match keys::KEY_COLUMNS.contains(&f.name().as_str()) && f.data_type() == &DataType::UInt64 {
                true => f.with_data_type(DataType::Utf8),
                false => f,
            }
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// The impressions schema with `query_id`, `doc_id` and `context` as 64-bit ids (`keys`), plus the
/// per-impression keys the window statistics use: `sample_key` (orders the overlap sample),
/// `session_key`, `split` (the session's `Split`, as u8), `pattern_key` (the session's content, for
/// the session store) and `feature_key` (the feature and bias-feature bits, so training rows group on
/// a scalar). All 64-bit hashes: two different inputs share a key with probability 2⁻⁶⁴.
pub fn window_schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let mut fields: Vec<Field> = impressions_schema()
                .fields()
                .iter()
                .map(|f| match keys::KEY_COLUMNS.contains(&f.name().as_str()) {
                    true => f.as_ref().clone().with_data_type(DataType::UInt64),
                    false => f.as_ref().clone(),
                })
                .collect();
            fields.push(Field::new("sample_key", DataType::UInt64, false));
            fields.push(Field::new("session_key", DataType::UInt64, false));
            fields.push(Field::new("split", DataType::UInt8, false));
            fields.push(Field::new("pattern_key", DataType::UInt64, false));
            fields.push(Field::new("feature_key", DataType::UInt64, false));
            Arc::new(Schema::new(fields))
        })
        .clone()
}

/// FNV-1a of session id and position, finished with a 64-bit mix: stable across runs and machines.
pub fn sample_key(session_id: &str, position: u32) -> u64 {
    mix(fnv(fnv(FNV_OFFSET, session_id.bytes()), position.to_le_bytes()))
}

/// The session's 64-bit key: the duplicate filter's entry and the hold-out split's hash.
pub fn session_key(session_id: &str) -> u64 {
    sample_key(session_id, 0)
}

/// The slice a session belongs to, decided once from its key before anything is aggregated, so
/// every stage (window rows, training, gate, eval, monitor) agrees on it across runs and restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum Split {
    /// Rows the optimizer steps on (and the input normaliser is fitted on).
    Training = 0,
    /// Early stopping: chooses the epoch, so it is part of model selection.
    Validation = 1,
    /// Never used to fit or select within a run: the promotion gate, `ultr eval` and the monitor's
    /// residual tests on windows a model was trained on.
    Evaluation = 2,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Training, Split::Validation, Split::Evaluation];

    pub fn from_u8(v: u8) -> Option<Split> {
        Split::ALL.get(v as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Split::Training => "training",
            Split::Validation => "validation",
            Split::Evaluation => "evaluation",
        }
    }
}

/// The shares of sessions held out of training: `validation` for early stopping, `evaluation` for
/// the gate, `ultr eval` and the monitor. Recorded in the state's manifest (the stored rows are split
/// with it).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holdout {
    pub validation: f64,
    pub evaluation: f64,
}

impl Holdout {
    /// The session's slice: its key modulo 10⁶ against the cumulative shares (validation first, so a
    /// session's validation membership does not depend on `evaluation`).
    pub fn split(&self, key: u64) -> Split {
        let u = key % 1_000_000;
        if u < (self.validation * 1_000_000.0) as u64 {
            Split::Validation
        } else if u < ((self.validation + self.evaluation) * 1_000_000.0) as u64 {
            Split::Evaluation
        } else {
            Split::Training
        }
    }
}

/// Folds row `i` of a list of f32 (its length and bits; a null differs from an empty list) into `h`.
fn vector_hash(mut h: u64, list: &datafusion::arrow::array::ListArray, i: usize) -> u64 {
    if list.is_null(i) {
        return (h ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(FNV_PRIME);
    }
    let offsets = list.value_offsets();
    let (a, b) = (offsets[i] as usize, offsets[i + 1] as usize);
    let values = list.values().as_primitive::<datafusion::arrow::datatypes::Float32Type>().values();
    h = (h ^ (b - a) as u64).wrapping_mul(FNV_PRIME);
    for v in &values[a..b] {
        h = (h ^ v.to_bits() as u64).wrapping_mul(FNV_PRIME);
    }
    h
}

/// A batch of impressions (whole sessions, rows of a session contiguous) as window rows: its query,
/// document and context as ids remembered in `interned`, and the window keys added.
pub fn with_window_keys(batch: &RecordBatch, holdout: Holdout, interned: &mut keys::Keys) -> anyhow::Result<RecordBatch> {
    let ids = batch.column_by_name(col::SESSION_ID).expect("impressions schema").as_string::<i32>();
    let queries = batch.column_by_name(col::QUERY_ID).expect("impressions schema").as_string::<i32>();
    let contexts = batch.column_by_name(col::CONTEXT).expect("impressions schema").as_string::<i32>();
    let docs = batch.column_by_name(col::DOC_ID).expect("impressions schema").as_string::<i32>();
    let pos = batch.column_by_name(col::POSITION).expect("impressions schema").as_primitive::<UInt32Type>();
    let clicked = batch.column_by_name(col::CLICKED).expect("impressions schema").as_boolean();
    let features = batch.column_by_name(col::FEATURES).expect("impressions schema").as_list::<i32>();
    let bias = batch.column_by_name(col::BIAS_FEATURES).expect("impressions schema").as_list::<i32>();
    let n = batch.num_rows();
    let sample: UInt64Array = (0..n).map(|i| sample_key(ids.value(i), pos.value(i))).collect();
    let feature: UInt64Array = (0..n).map(|i| mix(vector_hash(vector_hash(FNV_OFFSET, features, i), bias, i))).collect();
    let mut session = Vec::with_capacity(n);
    let mut splits = Vec::with_capacity(n);
    let mut pattern = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j < n && ids.value(j) == ids.value(i) {
            j += 1;
        }
        let key = session_key(ids.value(i));
        let split = holdout.split(key) as u8;
        // Separators keep ("ab","c") and ("a","bc") apart.
        let mut h = fnv(FNV_OFFSET, queries.value(i).bytes().chain([0xff]));
        if contexts.is_valid(i) {
            h = fnv(h, contexts.value(i).bytes().chain([0xfe]));
        }
        for r in i..j {
            h = fnv(h, pos.value(r).to_le_bytes().into_iter().chain(docs.value(r).bytes()).chain([0xfd, clicked.value(r) as u8]));
        }
        let h = mix(h);
        session.extend(std::iter::repeat_n(key, j - i));
        splits.extend(std::iter::repeat_n(split, j - i));
        pattern.extend(std::iter::repeat_n(h, j - i));
        i = j;
    }
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    let schema = batch.schema();
    for (kind, name, strings) in
        [(keys::Kind::Query, col::QUERY_ID, queries), (keys::Kind::Doc, col::DOC_ID, docs), (keys::Kind::Context, col::CONTEXT, contexts)]
    {
        let i = schema.index_of(name)?;
        columns[i] = Arc::new(interned.intern_column(kind, strings)?);
    }
    columns.push(Arc::new(sample));
    columns.push(Arc::new(UInt64Array::from(session)));
    columns.push(Arc::new(datafusion::arrow::array::UInt8Array::from(splits)));
    columns.push(Arc::new(UInt64Array::from(pattern)));
    columns.push(Arc::new(feature));
    Ok(RecordBatch::try_new(window_schema(), columns)?)
}

/// Reduces keyed impressions (`with_window_keys`) to partial aggregates (`StateTable::partials`).
pub async fn reduce(sql: &prepared::Statements, keyed: Vec<RecordBatch>, bounds: &StatisticBounds) -> anyhow::Result<Tables> {
    let mut out = Vec::new();
    for t in StateTable::partials() {
        let Computed::Partial { reduce, .. } = &t.entry().computed else { continue };
        let input = prepared::Input { name: "impressions", schema: window_schema(), runs: vec![keyed.clone()], order: &[] };
        out.push((t, sql.run(reduce, bounds, vec![input]).await?));
    }
    Ok(out)
}

/// Merges partial aggregates of one window into one partial (with the bounds they were reduced with).
pub async fn merge(sql: &prepared::Statements, partials: Vec<Tables>, bounds: &StatisticBounds) -> anyhow::Result<Tables> {
    merge_partials(sql, partials, bounds, false).await
}

/// `merge` of one window's partials from shards that own disjoint sets of queries: a table keyed by
/// query holds each key in one partial alone, so its merge is the partials' rows put together (in
/// shard order, each shard's rows in their order); the others are merged.
pub async fn merge_disjoint_queries(sql: &prepared::Statements, partials: Vec<Tables>, bounds: &StatisticBounds) -> anyhow::Result<Tables> {
    merge_partials(sql, partials, bounds, true).await
}

async fn merge_partials(sql: &prepared::Statements, partials: Vec<Tables>, bounds: &StatisticBounds, disjoint_queries: bool) -> anyhow::Result<Tables> {
    let mut out = Vec::new();
    for t in StateTable::partials() {
        let entry = t.entry();
        let Computed::Partial { merge, merge_input, keyed_by_query, .. } = &entry.computed else { continue };
        let runs: Vec<Vec<RecordBatch>> =
            partials.iter().map(|p| table(p, t).iter().filter(|b| b.num_rows() > 0).cloned().collect::<Vec<_>>()).filter(|run| !run.is_empty()).collect();
        let Some(first) = partials.iter().flat_map(|p| table(p, t).first()).next() else {
            out.push((t, Vec::new()));
            continue;
        };
        // Each shard's share is one merged partial already (`close_partial`), of the merge's schema;
        // put together in one batch, as a merge hands out.
        if disjoint_queries && *keyed_by_query && runs.iter().flatten().all(|b| b.schema() == first.schema()) {
            let together = datafusion::arrow::compute::concat_batches(&first.schema(), runs.iter().flatten())?;
            out.push((t, vec![together]));
            continue;
        }
        let input = prepared::Input { name: merge_input, schema: first.schema(), runs, order: entry.order };
        out.push((t, sql.run(merge, bounds, vec![input]).await?));
    }
    Ok(out)
}

/// A closed window's statistics from its merged partials: every table of the catalog
/// (`StateTable::ALL`, in order), the finished ones computed from the partial they are finished
/// from, with the window's ids (`keys`) still in place of strings.
pub async fn finish(sql: &prepared::Statements, merged: Tables) -> anyhow::Result<Tables> {
    let mut out: Tables = Vec::with_capacity(StateTable::ALL.len());
    for &t in StateTable::ALL {
        let batches = match &t.entry().computed {
            Computed::Partial { .. } => table(&merged, t).to_vec(),
            Computed::Finished { sql: stat, from, input } => {
                let from = table(&merged, *from).to_vec();
                match from.first() {
                    None => Vec::new(),
                    Some(first) => {
                        let input = prepared::Input { name: input, schema: first.schema(), runs: vec![from.clone()], order: &[] };
                        sql.run(stat, &StatisticBounds::default(), vec![input]).await?
                    }
                }
            }
        };
        out.push((t, batches));
    }
    Ok(out)
}

/// Per-position impressions, clicks and CTR of a set of impressions (propensity counts, then CTR:
/// the catalog's statements, on string keys).
pub async fn position_ctr(sql: &prepared::Statements, impressions: Vec<RecordBatch>) -> anyhow::Result<Vec<RecordBatch>> {
    let (counts, ctr) = (&StateTable::PropensityCounts.entry().computed, &StateTable::PositionCtr.entry().computed);
    let ctx = sql.session();
    register(&ctx, counts.input(), impressions_schema(), impressions)?;
    let counts = run_sql(&ctx, counts.statement()).await?;
    let ctx = sql.session();
    register(&ctx, ctr.input(), counts[0].schema(), counts)?;
    run_sql(&ctx, ctr.statement()).await
}

/// Every statistic of one window's impressions at once (reduce, then finish): the batch reference
/// the incremental path must equal.
pub async fn window_statistics(sql: &prepared::Statements, impressions: &[RecordBatch], holdout: Holdout, bounds: &StatisticBounds) -> anyhow::Result<Tables> {
    let mut ids = keys::Keys::default();
    let keyed = impressions.iter().map(|b| with_window_keys(b, holdout, &mut ids)).collect::<anyhow::Result<Vec<_>>>()?;
    ids.tables_to_strings(finish(sql, merge(sql, vec![reduce(sql, keyed, bounds).await?], bounds).await?).await?)
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    /// The catalog (`catalog`): every entry's name is its own and names a table once; a finished table is finished from a
    /// partial; every table's planned schema holds the columns its order names.
    pub async fn every_entry_plans_and_its_order_names_its_columns() {
        let mut names = std::collections::BTreeSet::new();
        for &t in StateTable::ALL {
            assert!(names.insert(t.name()), "{t} twice");
            assert_eq!(StateTable::named(t.name()), Some(t));
            let schema = t.schema().await.unwrap();
            for c in t.entry().order {
                assert!(schema.field_with_name(c).is_ok(), "{t}: order column {c} is not in {schema:?}");
            }
            for k in keys::KEY_COLUMNS {
                if let Ok(f) = schema.field_with_name(k) {
                    assert_eq!(f.data_type(), &DataType::Utf8, "{t}: key {k}");
                }
            }
        }
        assert_eq!(StateTable::named("no_such_table"), None);
    }
}
