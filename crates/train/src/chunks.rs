//! Training data beyond memory: the horizon's examples, streamed from `sql/training_examples.sql`,
//! stay in memory while they fit `[train] memory_budget` and are otherwise cut into chunks on disk
//! (Arrow IPC, one split per chunk, each a hash-chosen sample of query-document pairs) that a fit reads back one
//! at a time, every epoch.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use anyhow::Context;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::UInt8Type;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use futures::StreamExt;

use super::data::{data_range, horizon_windows, training_example_stream, Examples, ExamplesBuilder, Horizon, Split};
use ultr_core::state::Manifest;

/// The examples a fit reads, chunk by chunk. Examples in memory are one chunk holding every split.
pub trait ExampleChunks {
    /// The examples when they are all in memory (every split together).
    fn in_memory(&self) -> Option<&Examples>;
    /// Chunks holding `split`'s rows (on disk each chunk holds one split).
    fn chunk_count(&self, split: Split) -> usize;
    fn load_chunk(&self, split: Split, i: usize) -> anyhow::Result<Examples>;
}

impl ExampleChunks for Examples {
    fn in_memory(&self) -> Option<&Examples> {
        Some(self)
    }
    fn chunk_count(&self, _: Split) -> usize {
        1
    }
    fn load_chunk(&self, _: Split, _: usize) -> anyhow::Result<Examples> {
        Ok(self.clone())
    }
}

/// A horizon's examples, in memory or spilled.
pub enum TrainingData {
    InMemory(Examples),
    Spilled(SpilledExamples),
}

impl TrainingData {
    pub fn chunks(&self) -> &dyn ExampleChunks {
        match self {
            TrainingData::InMemory(ex) => ex,
            TrainingData::Spilled(s) => s,
        }
    }

    /// `Examples::validate_on_queries` on every chunk (spilled chunks when each is loaded: a
    /// training chunk's rows of validation queries are then left out of training, and a validation
    /// chunk's rows of training queries out of both).
    pub fn validate_on_queries(&mut self, holdout: ultr_core::window::Holdout) {
        match self {
            TrainingData::InMemory(ex) => ex.validate_on_queries(holdout),
            TrainingData::Spilled(s) => s.validate_on_queries = Some(holdout),
        }
    }

    pub fn data_range_ms(&self) -> Option<(i64, i64)> {
        match self {
            TrainingData::InMemory(ex) => ex.data_range_ms,
            TrainingData::Spilled(s) => s.data_range_ms,
        }
    }
}

/// Chunks of examples in Arrow IPC files under a temporary folder (removed when this is dropped).
pub struct SpilledExamples {
    dir: tempfile::TempDir,
    /// Chunk files per split (`Split as usize`).
    files: [Vec<PathBuf>; 3],
    max_positions: usize,
    pub data_range_ms: Option<(i64, i64)>,
    /// Examples-size estimate of each chunk when it was cut (training, validation, evaluation chunks).
    pub chunk_bytes: Vec<usize>,
    /// `TrainingData::validate_on_queries`, applied to each chunk as it is loaded.
    pub validate_on_queries: Option<ultr_core::window::Holdout>,
}

impl SpilledExamples {
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn load(&self, path: &Path) -> anyhow::Result<Examples> {
        let file = File::open(path).with_context(|| format!("opening training chunk {}", path.display()))?;
        let reader = StreamReader::try_new(BufReader::new(file), None).with_context(|| format!("reading training chunk {}", path.display()))?;
        let mut b = ExamplesBuilder::new(self.max_positions);
        for batch in reader {
            b.add(&batch.with_context(|| format!("reading training chunk {}", path.display()))?)?;
        }
        let mut ex = b.finish()?;
        ex.data_range_ms = self.data_range_ms;
        if let Some(holdout) = self.validate_on_queries {
            ex.validate_on_queries(holdout);
        }
        Ok(ex)
    }
}

impl ExampleChunks for SpilledExamples {
    fn in_memory(&self) -> Option<&Examples> {
        None
    }
    fn chunk_count(&self, split: Split) -> usize {
        self.files[split as usize].len()
    }
    fn load_chunk(&self, split: Split, i: usize) -> anyhow::Result<Examples> {
        self.load(&self.files[split as usize][i])
    }
}

/// Loads a horizon's examples within `budget_bytes` (by `Examples::approx_bytes`): in memory when
/// they fit, otherwise spilled to chunks of about the budget (plus at most `SLICE_ROWS` rows) under
/// `spill_dir`. One pass over the query's stream either way.
#[allow(clippy::too_many_arguments, reason = "the state, its horizon and the memory budget are independent inputs of one load")]
pub async fn load_training_data(
    context: &ultr_core::context::PipelineContext,
    dir: &Path,
    manifest: &Manifest,
    lookback_ms: i64,
    horizon: Horizon,
    max_positions: usize,
    ips: &super::config::IpsConfig,
    budget_bytes: usize,
    spill_dir: &Path,
) -> anyhow::Result<TrainingData> {
    let (windows, propensity) = horizon_windows(context, dir, manifest, lookback_ms, horizon, ips).await?;
    let mut stream = training_example_stream(context, dir, &windows, propensity).await?;
    let mut spill = Spiller::new(spill_dir, max_positions, budget_bytes)?;
    while let Some(batch) = stream.next().await {
        spill.push(batch.map_err(|e| anyhow::anyhow!("sql/training_examples.sql: {e}"))?)?;
    }
    let mut data = spill.finish()?;
    match &mut data {
        TrainingData::InMemory(ex) => ex.data_range_ms = data_range(&windows),
        TrainingData::Spilled(s) => s.data_range_ms = data_range(&windows),
    }
    Ok(data)
}

/// Rows added at a time: a chunk's estimate exceeds the budget by at most this many rows.
const SLICE_ROWS: usize = 1024;

/// Cuts a stream of example batches (sorted by split) into chunks.
struct Spiller {
    dir: tempfile::TempDir,
    max_positions: usize,
    budget: usize,
    /// While everything so far fits: all rows (every split). After: the current chunk's rows, only to
    /// measure it.
    builder: ExamplesBuilder,
    spilled: bool,
    /// The open chunk file and its split.
    writer: Option<(StreamWriter<BufWriter<File>>, Split)>,
    /// Closed and open chunk files: (path, split, estimated bytes).
    chunks: Vec<(PathBuf, Split, usize)>,
    /// `builder`'s size when the open chunk began.
    chunk_base: usize,
}

impl Spiller {
    fn new(spill_dir: &Path, max_positions: usize, budget: usize) -> anyhow::Result<Self> {
        std::fs::create_dir_all(spill_dir).with_context(|| format!("creating {}", spill_dir.display()))?;
        let dir = tempfile::Builder::new().prefix("training-").tempdir_in(spill_dir).with_context(|| format!("a folder in {}", spill_dir.display()))?;
        Ok(Spiller {
            dir,
            max_positions,
            budget,
            builder: ExamplesBuilder::new(max_positions),
            spilled: false,
            writer: None,
            chunks: Vec::new(),
            chunk_base: 0,
        })
    }

    fn push(&mut self, batch: RecordBatch) -> anyhow::Result<()> {
        // The query orders rows by split: a batch is a run of training, then validation, then
        // evaluation rows.
        let splits = batch.column_by_name("split").context("training examples have no `split`")?.as_primitive::<UInt8Type>().clone();
        let mut start = 0;
        while start < batch.num_rows() {
            let v = splits.value(start);
            let split = Split::from_u8(v).with_context(|| format!("training examples: split {v} is not 0, 1 or 2"))?;
            if self.chunks.last().is_some_and(|c| c.1 > split) {
                anyhow::bail!("sql/training_examples.sql must order rows by split (training rows first)");
            }
            let end = (start..batch.num_rows()).find(|&i| splits.value(i) != v).unwrap_or(batch.num_rows());
            // Slices of a few rows, so a chunk ends within `SLICE_ROWS` rows past the budget.
            for at in (start..end).step_by(SLICE_ROWS) {
                self.push_part(&batch.slice(at, SLICE_ROWS.min(end - at)), split)?;
            }
            start = end;
        }
        Ok(())
    }

    fn push_part(&mut self, part: &RecordBatch, split: Split) -> anyhow::Result<()> {
        if self.writer.as_ref().is_some_and(|(_, s)| *s != split) {
            self.close_chunk()?;
        }
        if self.writer.is_none() {
            let path = self.dir.path().join(format!("chunk-{:05}-{}.arrow", self.chunks.len(), split.name()));
            let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            self.writer = Some((StreamWriter::try_new(BufWriter::new(file), &part.schema())?, split));
            self.chunks.push((path, split, 0));
        }
        let (writer, _) = self.writer.as_mut().expect("an open chunk");
        writer.write(part)?;
        self.builder.add(part)?;
        let bytes = self.builder.approx_bytes();
        self.chunks.last_mut().expect("an open chunk").2 = bytes - self.chunk_base.min(bytes);
        if bytes > self.budget {
            // Beyond the budget: the rows so far are the first chunk(s); from here on every chunk
            // is measured alone and cut when it reaches the budget.
            self.spilled = true;
            self.close_chunk()?;
        }
        Ok(())
    }

    fn close_chunk(&mut self) -> anyhow::Result<()> {
        if let Some((mut w, _)) = self.writer.take() {
            w.finish()?;
        }
        if self.spilled {
            self.builder = ExamplesBuilder::new(self.max_positions);
            self.chunk_base = 0;
        } else {
            self.chunk_base = self.builder.approx_bytes();
        }
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<TrainingData> {
        if !self.spilled {
            let builder = std::mem::replace(&mut self.builder, ExamplesBuilder::new(self.max_positions));
            self.close_chunk()?;
            return Ok(TrainingData::InMemory(builder.finish()?));
        }
        self.close_chunk()?;
        let (mut files, mut chunk_bytes): ([Vec<PathBuf>; 3], _) = (Default::default(), Vec::new());
        for split in Split::ALL {
            let pieces: Vec<(PathBuf, usize)> = self.chunks.iter().filter(|c| c.1 == split).map(|c| (c.0.clone(), c.2)).collect();
            for (path, bytes) in repartition(self.dir.path(), &pieces, split, self.budget)? {
                files[split as usize].push(path);
                chunk_bytes.push(bytes);
            }
        }
        Ok(TrainingData::Spilled(SpilledExamples {
            dir: self.dir,
            files,
            max_positions: self.max_positions,
            data_range_ms: None,
            chunk_bytes,
            validate_on_queries: None,
        }))
    }
}

/// Redistributes one split's sequential pieces (consecutive query ranges, in the query's order)
/// into chunks that are each a hash-chosen sample of (query, document) pairs, every position of a
/// pair together (so its feature vector is stored once): SGD over one chunk after another then sees,
/// chunk by chunk, nearly the distribution of the whole horizon. Consecutive query ranges, and
/// samples of whole queries, made the model drift to each epoch's last chunk (measured in the
/// README). A quarter of headroom keeps hash chunks within the budget. Returns the chunks with
/// their estimated bytes.
fn repartition(dir: &Path, pieces: &[(PathBuf, usize)], split: Split, budget: usize) -> anyhow::Result<Vec<(PathBuf, usize)>> {
    let total: usize = pieces.iter().map(|p| p.1).sum();
    let n = (total + total / 4).div_ceil(budget.max(1)).max(1);
    if pieces.len() <= 1 && n == 1 {
        return Ok(pieces.to_vec());
    }
    let name = split.name();
    let paths: Vec<PathBuf> = (0..n).map(|j| dir.join(format!("{name}-{j:05}.arrow"))).collect();
    let mut writers: Vec<Option<StreamWriter<BufWriter<File>>>> = (0..n).map(|_| None).collect();
    let mut rows = vec![0usize; n];
    for (piece, _) in pieces {
        let file = File::open(piece).with_context(|| format!("opening {}", piece.display()))?;
        for batch in StreamReader::try_new(BufReader::new(file), None)? {
            let batch = batch?;
            let column = |name: &str| -> anyhow::Result<_> {
                let c = batch.column_by_name(name).with_context(|| format!("training examples have no `{name}`"))?;
                Ok(datafusion::arrow::compute::cast(c, &datafusion::arrow::datatypes::DataType::Utf8)?)
            };
            let (queries, docs) = (column("query_id")?, column("doc_id")?);
            let (queries, docs) = (queries.as_string::<i32>(), docs.as_string::<i32>());
            let mut members: Vec<Vec<u32>> = vec![Vec::new(); n];
            let mut key = String::new();
            for i in 0..batch.num_rows() {
                key.clear();
                key.push_str(queries.value(i));
                key.push('\u{1f}');
                key.push_str(docs.value(i));
                members[(ultr_core::window::session_key(&key) % n as u64) as usize].push(i as u32);
            }
            for (j, idx) in members.into_iter().enumerate().filter(|(_, idx)| !idx.is_empty()) {
                let part = datafusion::arrow::compute::take_record_batch(&batch, &datafusion::arrow::array::UInt32Array::from(idx))?;
                if writers[j].is_none() {
                    let file = File::create(&paths[j]).with_context(|| format!("creating {}", paths[j].display()))?;
                    writers[j] = Some(StreamWriter::try_new(BufWriter::new(file), &part.schema())?);
                }
                rows[j] += part.num_rows();
                writers[j].as_mut().expect("opened above").write(&part)?;
            }
        }
        std::fs::remove_file(piece).with_context(|| format!("removing {}", piece.display()))?;
    }
    let all_rows: usize = rows.iter().sum::<usize>().max(1);
    let mut out = Vec::new();
    for (j, w) in writers.into_iter().enumerate() {
        if let Some(mut w) = w {
            w.finish()?;
            out.push((paths[j].clone(), total * rows[j] / all_rows));
        }
    }
    Ok(out)
}
