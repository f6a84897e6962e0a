//! Cumulative views over the lookback horizon: π(d,k|q), the swap graph and the overlap sample,
//! computed by the same `sql/` files from the closed windows' statistics.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use std::collections::BTreeMap;
use std::sync::Arc;

use super::{read_window_table, write_parquet, Manifest, WindowEntry};
use crate::context::PipelineContext;
use crate::window::{register, run_sql, CUMULATIVE_PROPENSITY, MERGE_PROPENSITY_COUNTS, MERGE_QUERY_SESSIONS, OVERLAP_SAMPLE, POLICY_PROPENSITY, SWAP_EDGES};

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

/// The additive inputs of the views: propensity counts and sessions per query (summed by the views'
/// SQL) and the overlap samples (a bottom-k sample, merged by `sql/overlap_sample.sql`). Either every
/// window's own tables, or reductions of several windows' (`Inputs::reduce`): both give the same views.
struct Inputs {
    counts: Vec<RecordBatch>,
    sessions: Vec<RecordBatch>,
    sample: Vec<RecordBatch>,
}

fn counts_schema() -> Arc<Schema> {
    empty_schema(&[
        ("query_id", DataType::Utf8),
        ("doc_id", DataType::Utf8),
        ("position", DataType::UInt32),
        ("context", DataType::Utf8),
        ("policy_id", DataType::Utf8),
        ("impressions", DataType::Int64),
        ("clicks", DataType::Int64),
        ("logged_impressions", DataType::Int64),
        ("logged_inverse_sum", DataType::Float64),
    ])
}

fn sessions_schema() -> Arc<Schema> {
    empty_schema(&[("query_id", DataType::Utf8), ("policy_id", DataType::Utf8), ("sessions", DataType::Int64)])
}

fn sample_schema() -> Arc<Schema> {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    empty_schema(&[("position", DataType::UInt32), ("context", DataType::Utf8), ("sample_key", DataType::UInt64), ("features", DataType::List(item))])
}

impl Inputs {
    /// The windows' own tables, read from the state in `dir`.
    fn read(dir: &std::path::Path, windows: &[WindowEntry]) -> anyhow::Result<Inputs> {
        let load = |table: &str| -> anyhow::Result<Vec<RecordBatch>> {
            let mut out = Vec::new();
            for w in windows {
                out.extend(read_window_table(dir, w, table)?);
            }
            Ok(out)
        };
        Ok(Inputs {
            counts: conform(load("propensity_counts")?, &counts_schema())?,
            sessions: conform(load("query_sessions")?, &sessions_schema())?,
            sample: load("overlap_sample")?,
        })
    }

    /// The same inputs reduced: counts and sessions summed per key by the merge SQL the windows'
    /// partials are merged with, the sample cut to its bottom-k by the SQL that drew it. Sums and
    /// bottom-k samples merge exactly, so views over reductions equal views over their parts.
    async fn reduce(self, context: &PipelineContext) -> anyhow::Result<Inputs> {
        let ctx = context.query_session();
        register(&ctx, "propensity_counts", counts_schema(), self.counts)?;
        register(&ctx, "query_sessions", sessions_schema(), self.sessions)?;
        register(&ctx, "impressions", sample_schema(), self.sample)?;
        Ok(Inputs {
            counts: conform(run_sql(&ctx, &MERGE_PROPENSITY_COUNTS).await?, &counts_schema())?,
            sessions: conform(run_sql(&ctx, &MERGE_QUERY_SESSIONS).await?, &sessions_schema())?,
            sample: run_sql(&ctx, &OVERLAP_SAMPLE).await?,
        })
    }

    /// The cumulative views of these inputs (`sql/cumulative_propensity.sql`, `policy_propensity.sql`,
    /// `swap_edges.sql`, `overlap_sample.sql`).
    async fn views(self, context: &PipelineContext, windows: Vec<WindowEntry>) -> anyhow::Result<Cumulative> {
        let ctx = context.query_session();
        register(&ctx, "propensity_counts", counts_schema(), self.counts)?;
        register(&ctx, "query_sessions", sessions_schema(), self.sessions)?;
        let propensity = run_sql(&ctx, &CUMULATIVE_PROPENSITY).await?;
        let policy_propensity = run_sql(&ctx, &POLICY_PROPENSITY).await?;

        let swap_ctx = context.query_session();
        let prop_schema = propensity.first().map(|b| b.schema()).unwrap_or_else(|| {
            empty_schema(&[("query_id", DataType::Utf8), ("doc_id", DataType::Utf8), ("position", DataType::UInt32), ("context", DataType::Utf8)])
        });
        register(&swap_ctx, "impressions", prop_schema, propensity.clone())?;
        let swap_edges = run_sql(&swap_ctx, &SWAP_EDGES).await?;

        let sample_ctx = context.query_session();
        register(&sample_ctx, "impressions", sample_schema(), self.sample)?;
        let overlap_sample = run_sql(&sample_ctx, &OVERLAP_SAMPLE).await?;
        Ok(Cumulative { windows, propensity, policy_propensity, swap_edges, overlap_sample })
    }
}

/// The cumulative views of the state in `dir` over `horizon_ms`, for a one-shot command: reads the
/// manifest, computes on a runtime of `context`'s, and refuses a state with no closed window in the
/// horizon, naming the directory.
pub fn of_state(context: &PipelineContext, dir: &std::path::Path, horizon_ms: i64) -> anyhow::Result<Cumulative> {
    let manifest = super::read_manifest(dir)?;
    let cumulative = context.run("ultr-cumulative", compute(context, dir, &manifest, horizon_ms))??;
    anyhow::ensure!(!cumulative.windows.is_empty(), "{}: no closed windows yet", dir.display());
    Ok(cumulative)
}

/// Computes the cumulative views from the state in `dir`, reading every window in the horizon.
pub async fn compute(context: &PipelineContext, dir: &std::path::Path, manifest: &Manifest, horizon_ms: i64) -> anyhow::Result<Cumulative> {
    let windows = windows_in_horizon(manifest, horizon_ms);
    Inputs::read(dir, &windows)?.views(context, windows).await
}

/// The cumulative views kept from one look to the next, for a caller that asks again each time
/// windows close (the monitor). `compute` reads every window of the horizon at every call, so its
/// cost grows with the lookback: 28 days of 10-minute windows is 4,032 windows read per closed
/// window. This keeps the horizon's windows in blocks of consecutive windows, each block's inputs
/// reduced (`Inputs::reduce`) and kept. A call reads the windows that joined a block (reduced
/// together with the block's reduction) and, when the sliding horizon leaves a window of the oldest
/// block, that block's remaining windows; it then computes the views over the blocks' reductions.
/// Blocks hold about √n windows of an n-window horizon, so a call reads O(√n) windows at most and
/// merges O(√n) reductions, instead of reading n windows. The views equal `compute`'s, up to the
/// order in which the logged 1/π are summed.
#[derive(Default)]
pub struct Incremental {
    /// Windows per block: a power of two near √(windows in the horizon), never lowered, so that
    /// a horizon whose size wavers does not regroup its blocks.
    per_block: i64,
    /// Block start (in units of `per_block` windows) → the block's windows and reduced inputs.
    blocks: BTreeMap<i64, Block>,
    /// Windows read from the state so far, over all calls.
    windows_read: u64,
    /// The state the blocks were read from: another one starts over.
    dir: Option<std::path::PathBuf>,
}

struct Block {
    windows: Vec<WindowEntry>,
    reduced: Inputs,
}

impl Incremental {
    /// The cumulative views of the state in `dir` over `horizon_ms`, as `compute` gives them.
    pub async fn update(&mut self, context: &PipelineContext, dir: &std::path::Path, manifest: &Manifest, horizon_ms: i64) -> anyhow::Result<Cumulative> {
        let windows = windows_in_horizon(manifest, horizon_ms);
        let wanted = ((windows.len() as f64).sqrt().ceil() as u64).max(4).next_power_of_two() as i64;
        if wanted > self.per_block || self.dir.as_deref() != Some(dir) {
            self.per_block = self.per_block.max(wanted);
            self.blocks.clear();
            self.dir = Some(dir.to_path_buf());
        }
        let span = manifest.window.slide_ms.max(1).saturating_mul(self.per_block);
        let mut grouped: BTreeMap<i64, Vec<WindowEntry>> = BTreeMap::new();
        for w in &windows {
            grouped.entry(w.start_ms.div_euclid(span)).or_default().push(w.clone());
        }
        let mut kept = std::mem::take(&mut self.blocks);
        for (key, members) in grouped {
            let block = match kept.remove(&key) {
                Some(block) if block.windows == members => block,
                // Windows joined the block and none left it: its reduction plus theirs, reduced.
                Some(block) if block.windows.iter().all(|w| members.contains(w)) => {
                    let joined: Vec<WindowEntry> = members.iter().filter(|w| !block.windows.contains(w)).cloned().collect();
                    let mut inputs = Inputs::read(dir, &joined)?;
                    self.windows_read += joined.len() as u64;
                    inputs.counts.extend(block.reduced.counts);
                    inputs.sessions.extend(block.reduced.sessions);
                    inputs.sample.extend(block.reduced.sample);
                    Block { windows: members, reduced: inputs.reduce(context).await? }
                }
                // New, or a window left or changed: the block's windows read again.
                _ => {
                    let reduced = Inputs::read(dir, &members)?.reduce(context).await?;
                    self.windows_read += members.len() as u64;
                    Block { windows: members, reduced }
                }
            };
            self.blocks.insert(key, block);
        }
        let mut inputs = Inputs { counts: Vec::new(), sessions: Vec::new(), sample: Vec::new() };
        for block in self.blocks.values() {
            inputs.counts.extend(block.reduced.counts.iter().cloned());
            inputs.sessions.extend(block.reduced.sessions.iter().cloned());
            inputs.sample.extend(block.reduced.sample.iter().cloned());
        }
        inputs.views(context, windows).await
    }

    /// Windows read from the state so far, over all calls (what a call costs is what it adds).
    pub fn windows_read(&self) -> u64 {
        self.windows_read
    }
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
