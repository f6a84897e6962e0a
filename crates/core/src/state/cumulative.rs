//! Cumulative views over the lookback horizon: π(d,k|q), the swap graph and the overlap sample,
//! computed by the same `sql/` files from the closed windows' statistics.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Schema};
use std::collections::BTreeMap;
use std::sync::Arc;

use super::{read_window_table, write_parquet, Manifest, WindowEntry};
use crate::context::PipelineContext;
use crate::window::catalog::Computed;
use crate::window::{register, run_sql, table, StateTable, Tables, CUMULATIVE_PROPENSITY, POLICY_PROPENSITY};

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

/// The windows' tables the views read: additive ones (propensity counts and sessions per query,
/// summed by the views' SQL) and the overlap samples (bottom-k samples).
const VIEW_INPUTS: [StateTable; 3] = [StateTable::PropensityCounts, StateTable::QuerySessions, StateTable::OverlapSample];

/// The views' inputs (`VIEW_INPUTS`): either every window's own tables, or reductions of several
/// windows' (`Inputs::reduce`): both give the same views.
struct Inputs(Tables);

impl Inputs {
    /// The windows' own tables, read from the state in `dir`, each conformed to its catalog schema.
    async fn read(dir: &std::path::Path, windows: &[WindowEntry]) -> anyhow::Result<Inputs> {
        let mut tables = Vec::with_capacity(VIEW_INPUTS.len());
        for t in VIEW_INPUTS {
            let mut batches = Vec::new();
            for w in windows {
                batches.extend(read_window_table(dir, w, t)?);
            }
            tables.push((t, conform(batches, &t.schema().await?)?));
        }
        Ok(Inputs(tables))
    }

    /// The same inputs reduced, each by the SQL its windows' partials are merged with (the counts
    /// and sessions summed per key, the sample cut to its bottom-k). Sums and bottom-k samples merge
    /// exactly, so views over reductions equal views over their parts.
    async fn reduce(self, context: &PipelineContext) -> anyhow::Result<Inputs> {
        let mut out = Vec::with_capacity(self.0.len());
        for (t, batches) in self.0 {
            let Computed::Partial { merge, merge_input, .. } = &t.entry().computed else { anyhow::bail!("view input {t} is not a partial aggregate") };
            let ctx = context.query_session();
            let schema = t.schema().await?;
            register(&ctx, merge_input, schema.clone(), batches)?;
            out.push((t, conform(run_sql(&ctx, merge).await?, &schema)?));
        }
        Ok(Inputs(out))
    }

    /// Another reduction's tables added to these.
    fn extend(&mut self, other: &Inputs) {
        for (t, batches) in &mut self.0 {
            batches.extend(table(&other.0, *t).iter().cloned());
        }
    }

    /// The cumulative views of these inputs (`sql/cumulative_propensity.sql`, `policy_propensity.sql`,
    /// and the swap edges' and overlap sample's own statements).
    async fn views(self, context: &PipelineContext, windows: Vec<WindowEntry>) -> anyhow::Result<Cumulative> {
        let ctx = context.query_session();
        for t in [StateTable::PropensityCounts, StateTable::QuerySessions] {
            register(&ctx, t.name(), t.schema().await?, table(&self.0, t).to_vec())?;
        }
        let propensity = run_sql(&ctx, &CUMULATIVE_PROPENSITY).await?;
        let policy_propensity = run_sql(&ctx, &POLICY_PROPENSITY).await?;

        // The swap graph of the horizon: its statement on the cumulative π, whose keys are the
        // distinct (q, d, k, context) shown (at least one batch: `run_sql` keeps the schema).
        let swap = &StateTable::SwapEdges.entry().computed;
        let swap_ctx = context.query_session();
        register(&swap_ctx, swap.input(), propensity[0].schema(), propensity.clone())?;
        let swap_edges = run_sql(&swap_ctx, swap.statement()).await?;

        let sample = StateTable::OverlapSample;
        let Computed::Partial { merge, merge_input, .. } = &sample.entry().computed else { anyhow::bail!("{sample} is not a partial aggregate") };
        let sample_ctx = context.query_session();
        register(&sample_ctx, merge_input, sample.schema().await?, table(&self.0, sample).to_vec())?;
        let overlap_sample = run_sql(&sample_ctx, merge).await?;
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
    Inputs::read(dir, &windows).await?.views(context, windows).await
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
                    let mut inputs = Inputs::read(dir, &joined).await?;
                    self.windows_read += joined.len() as u64;
                    inputs.extend(&block.reduced);
                    Block { windows: members, reduced: inputs.reduce(context).await? }
                }
                // New, or a window left or changed: the block's windows read again.
                _ => {
                    let reduced = Inputs::read(dir, &members).await?.reduce(context).await?;
                    self.windows_read += members.len() as u64;
                    Block { windows: members, reduced }
                }
            };
            self.blocks.insert(key, block);
        }
        let mut inputs = Inputs(VIEW_INPUTS.iter().map(|t| (*t, Vec::new())).collect());
        for block in self.blocks.values() {
            inputs.extend(&block.reduced);
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
