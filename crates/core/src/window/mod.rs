//! Windows and their statistics: `operator` decides which sessions belong to which event-time
//! window; `aggregates` keeps each open window as mergeable partial aggregates; the statistics
//! themselves — reduce, merge and finish — are the SQL files in `sql/`, run here by DataFusion on
//! the contexts and tables of `sql` (module), through the statements `prepared` keeps planned.

pub mod aggregates;
pub mod config;
mod hash;
pub mod keys;
pub mod operator;
pub mod prepared;
pub mod sql;

pub use sql::*;

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};

use crate::session::impressions_schema;
use crate::session::schema::col;
use hash::{fnv, mix, FNV_OFFSET, FNV_PRIME};

/// A decomposable statistic: `reduce` turns a micro-batch of impressions into a partial table named
/// `table`; `merge` (reading table `merge_input`) turns a union of partials into one. Both end in
/// `ORDER BY order` (ascending, NULLs last), so a merge reads its partials as sorted runs: DataFusion
/// then merges them as they stream, holding a key at a time instead of a hash table of every key
/// plus a sort of the result.
pub struct Decomposable {
    pub table: &'static str,
    pub reduce: &'static Statistic,
    pub merge: &'static Statistic,
    pub merge_input: &'static str,
    pub order: &'static [&'static str],
    /// Every key of the table holds `query_id`: partials of disjoint sets of queries (the shards of
    /// one ingest, `pipeline::shards`) merge by putting their rows together.
    pub keyed_by_query: bool,
}

/// What an open window keeps: the partial aggregates, in this order.
pub const PARTIALS: [Decomposable; 6] = [
    Decomposable {
        table: "propensity_counts",
        reduce: &PROPENSITY_COUNTS,
        merge: &MERGE_PROPENSITY_COUNTS,
        merge_input: "propensity_counts",
        order: &["query_id", "doc_id", "position", "context", "policy_id"],
        keyed_by_query: true,
    },
    Decomposable {
        table: "query_sessions",
        reduce: &QUERY_SESSIONS,
        merge: &MERGE_QUERY_SESSIONS,
        merge_input: "query_sessions",
        order: &["query_id", "policy_id"],
        keyed_by_query: true,
    },
    // The bottom-k sample is its own merge.
    Decomposable {
        table: "overlap_sample",
        reduce: &OVERLAP_SAMPLE,
        merge: &OVERLAP_SAMPLE,
        merge_input: "impressions",
        order: &["position", "context", "sample_key"],
        keyed_by_query: false,
    },
    Decomposable {
        table: "training_rows",
        reduce: &TRAINING_ROWS,
        merge: &MERGE_TRAINING_ROWS,
        merge_input: "training_rows",
        order: &["query_id", "doc_id", "position", "split", "feature_key"],
        keyed_by_query: true,
    },
    Decomposable {
        table: "training_features",
        reduce: &TRAINING_FEATURES,
        merge: &MERGE_TRAINING_FEATURES,
        merge_input: "training_features",
        order: &["query_id", "doc_id", "feature_key"],
        keyed_by_query: true,
    },
    Decomposable {
        table: "session_store",
        reduce: &SESSION_STORE,
        merge: &MERGE_SESSION_STORE,
        merge_input: "session_store",
        order: &["pattern_key", "position"],
        keyed_by_query: false,
    },
];

/// Every table a closed window writes, in order: the merged partials plus the two statistics
/// finished from the merged propensity counts (position CTR, swap edges — the distinct (q, d, k)
/// set the swap graph needs is exactly the counts' keys).
pub const WINDOW_TABLES: [&str; 8] =
    ["propensity_counts", "query_sessions", "position_ctr", "swap_edges", "overlap_sample", "training_rows", "training_features", "session_store"];

/// The batches of table `name` (empty when absent).
pub fn table<'a>(tables: &'a Tables, name: &str) -> &'a [RecordBatch] {
    tables.iter().find(|(n, _)| *n == name).map(|(_, b)| b.as_slice()).unwrap_or(&[])
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

/// Reduces keyed impressions (`with_window_keys`) to partial aggregates.
pub async fn reduce(sql: &prepared::Statements, keyed: Vec<RecordBatch>, bounds: &StatisticBounds) -> anyhow::Result<Tables> {
    let mut out = Vec::with_capacity(PARTIALS.len());
    for p in &PARTIALS {
        let input = prepared::Input { name: "impressions", schema: window_schema(), runs: vec![keyed.clone()], order: &[] };
        out.push((p.table, sql.run(p.reduce, bounds, vec![input]).await?));
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
    let mut out = Vec::with_capacity(PARTIALS.len());
    for p in &PARTIALS {
        let runs: Vec<Vec<RecordBatch>> =
            partials.iter().map(|t| table(t, p.table).iter().filter(|b| b.num_rows() > 0).cloned().collect::<Vec<_>>()).filter(|run| !run.is_empty()).collect();
        let Some(first) = partials.iter().flat_map(|t| table(t, p.table).first()).next() else {
            out.push((p.table, Vec::new()));
            continue;
        };
        // Each shard's share is one merged partial already (`close_partial`), of the merge's schema;
        // put together in one batch, as a merge hands out.
        if disjoint_queries && p.keyed_by_query && runs.iter().flatten().all(|b| b.schema() == first.schema()) {
            let together = datafusion::arrow::compute::concat_batches(&first.schema(), runs.iter().flatten())?;
            out.push((p.table, vec![together]));
            continue;
        }
        let input = prepared::Input { name: p.merge_input, schema: first.schema(), runs, order: p.order };
        out.push((p.table, sql.run(p.merge, bounds, vec![input]).await?));
    }
    Ok(out)
}

/// A closed window's statistics from its merged partials (`WINDOW_TABLES`, in order), with its ids
/// (`keys`) still in place of strings.
pub async fn finish(sql: &prepared::Statements, merged: Tables) -> anyhow::Result<Tables> {
    let counts = table(&merged, "propensity_counts").to_vec();
    let counts_schema = counts.first().map(|b| b.schema()).unwrap_or_else(|| Arc::new(Schema::empty()));
    let (position_ctr, swap_edges) = if counts.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        let bounds = StatisticBounds::default();
        let input = |name| prepared::Input { name, schema: counts_schema.clone(), runs: vec![counts.clone()], order: &[] };
        let ctr = sql.run(&POSITION_CTR, &bounds, vec![input("propensity_counts")]).await?;
        (ctr, sql.run(&SWAP_EDGES, &bounds, vec![input("impressions")]).await?)
    };
    let mut out: Tables = Vec::with_capacity(WINDOW_TABLES.len());
    for name in WINDOW_TABLES {
        let batches = match name {
            "position_ctr" => position_ctr.clone(),
            "swap_edges" => swap_edges.clone(),
            _ => table(&merged, name).to_vec(),
        };
        out.push((name, batches));
    }
    Ok(out)
}

/// Per-position impressions, clicks and CTR of a set of impressions (propensity counts, then CTR).
pub async fn position_ctr(sql: &prepared::Statements, impressions: Vec<RecordBatch>) -> anyhow::Result<Vec<RecordBatch>> {
    let ctx = sql.session();
    register(&ctx, "impressions", impressions_schema(), impressions)?;
    let counts = run_sql(&ctx, &PROPENSITY_COUNTS).await?;
    let ctx = sql.session();
    register(&ctx, "propensity_counts", counts[0].schema(), counts)?;
    run_sql(&ctx, &POSITION_CTR).await
}

/// Every statistic of one window's impressions at once (reduce, then finish): the batch reference
/// the incremental path must equal.
pub async fn window_statistics(sql: &prepared::Statements, impressions: &[RecordBatch], holdout: Holdout, bounds: &StatisticBounds) -> anyhow::Result<Tables> {
    let mut ids = keys::Keys::default();
    let keyed = impressions.iter().map(|b| with_window_keys(b, holdout, &mut ids)).collect::<anyhow::Result<Vec<_>>>()?;
    ids.tables_to_strings(finish(sql, merge(sql, vec![reduce(sql, keyed, bounds).await?], bounds).await?).await?)
}
