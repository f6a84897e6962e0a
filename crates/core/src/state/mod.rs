//! Durable state: closed windows' statistics as Parquet, open windows' partial aggregates and
//! duplicate filters, late sessions, and a manifest naming all of them plus the source offsets they
//! cover. Every file is zstd-compressed Parquet. A
//! checkpoint writes files first and the manifest last (write-then-rename), so a crash at any point
//! leaves the previous checkpoint intact; files the manifest does not name are garbage.

pub mod config;
pub mod cumulative;
pub mod lease;
pub mod lock;
pub mod merged;
pub mod remote;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use datafusion::arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, UInt64Type};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};

use crate::sources::ResumeOffsets;
use crate::window::catalog::WindowTotal;
use crate::window::operator::{OperatorSnapshot, WindowSpec};
use crate::window::{StateTable, Tables};

pub const MANIFEST: &str = "manifest.json";
const FORMAT: &str = "ultr-state";
/// 2: open windows are partial aggregates and a session-key filter (1 kept their raw rows).
const VERSION: u32 = 3;

/// One closed window in the state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WindowEntry {
    pub start_ms: i64,
    pub end_ms: i64,
    /// Folder under `windows/` holding `<statistic>.parquet`.
    pub dir: String,
    pub sessions: u64,
    pub impressions: u64,
    /// Bytes of each statistic's Parquet file (statistic → bytes). A statistic absent here had no
    /// rows; a listed file that is missing or of another size is an error naming it, never zeros.
    #[serde(default)]
    pub files: BTreeMap<String, u64>,
}

/// A segment of the open windows' duplicate filter (window start, session key), and the windows it
/// holds keys for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Segment {
    pub file: String,
    pub windows: BTreeSet<i64>,
    /// The file's size when written (checked on restore).
    #[serde(default)]
    pub bytes: Option<u64>,
}

/// An open window's merged partial aggregates: folder `open/<dir>` with `<table>.parquet`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OpenWindowEntry {
    pub start_ms: i64,
    pub dir: String,
    /// Bytes of each partial table's file.
    pub files: BTreeMap<String, u64>,
}

/// A late-session segment: its file, size and newest event time (retention drops it by the latter).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LateSegment {
    pub file: String,
    pub bytes: u64,
    pub max_event_ms: i64,
}

/// The truth about what the state covers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// The source this state was built from; a different source refuses to reuse it.
    pub source: String,
    pub window: WindowSpec,
    /// Checkpoint sequence number; names new segment files.
    pub seq: u64,
    /// Next offset to read, per (stream, partition): everything before is in this state.
    pub resume: ResumeOffsets,
    pub operator: OperatorSnapshot,
    pub windows: Vec<WindowEntry>,
    /// Open windows' partial aggregates, one folder per window (rewritten when the window changed).
    pub open_windows: Vec<OpenWindowEntry>,
    /// The open windows' duplicate filter, appended per checkpoint.
    pub filter_segments: Vec<Segment>,
    /// The session split the training rows were stored with (`train.validation_fraction`,
    /// `train.evaluation_fraction`).
    pub holdout: crate::window::Holdout,
    /// Late segments written by earlier versions (no size or time recorded).
    #[serde(default)]
    pub late_segments: Vec<String>,
    #[serde(default)]
    pub late: Vec<LateSegment>,
    /// What the decoder has fixed (feature dimensions, replay clocks), so a restart decodes alike.
    #[serde(default)]
    pub decoder: crate::ingest::DecoderState,
    /// Dead letters written by the run so far, by reason.
    #[serde(default)]
    pub dead_letters: BTreeMap<String, u64>,
    /// Length of the dead-letter file holding exactly those letters (file targets only).
    #[serde(default)]
    pub dead_letter_file_bytes: Option<u64>,
    /// A merged view's sources: per window (`start-end`), the partition windows it was merged
    /// from, so compaction re-merges only windows whose parts changed (`state::merged`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub merged_from: BTreeMap<String, String>,
    /// A merged view's windows still open in its parts (an ingest's shards, or scale-out
    /// partitions), whose partials stay there; a state holding its own open windows lists them in
    /// `open_windows` instead.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub open_in_parts: BTreeSet<i64>,
}

impl Manifest {
    /// The windows open in what this state covers: its own, or a merged view's parts'.
    pub fn open_window_starts(&self) -> BTreeSet<i64> {
        self.open_windows.iter().map(|w| w.start_ms).chain(self.open_in_parts.iter().copied()).collect()
    }

    /// Every file this manifest names, relative to the state directory, with its recorded size
    /// (None where an older build recorded none): what a copy of the state must carry.
    pub fn named_files(&self) -> Vec<(String, Option<u64>)> {
        let mut out = Vec::new();
        for w in &self.windows {
            out.extend(w.files.iter().map(|(table, bytes)| (format!("windows/{}/{table}.parquet", w.dir), Some(*bytes))));
        }
        for w in &self.open_windows {
            out.extend(w.files.iter().map(|(table, bytes)| (format!("open/{}/{table}.parquet", w.dir), Some(*bytes))));
        }
        out.extend(self.filter_segments.iter().map(|s| (format!("open/{}", s.file), s.bytes)));
        out.extend(self.late_segments.iter().map(|f| (format!("late/{f}"), None)));
        out.extend(self.late.iter().map(|l| (format!("late/{}", l.file), Some(l.bytes))));
        out
    }
}

/// A closed window's statistics, ready to persist.
pub struct ClosedOutput {
    pub start_ms: i64,
    pub end_ms: i64,
    pub tables: Tables,
    /// `Some` while `tables` hold the window's ids (`window::keys`), not strings: a shard's partial
    /// on its way to the merged view. Written to Parquet, they become strings first.
    pub keys: Option<crate::window::keys::Keys>,
}

/// Everything one checkpoint adds.
pub struct Checkpoint {
    pub closed: Vec<ClosedOutput>,
    /// Merged partials of the open windows that changed since the last checkpoint.
    pub open_partials: Vec<(i64, Tables)>,
    /// Session keys the open windows admitted since the last checkpoint.
    pub admitted: Vec<(i64, u64)>,
    pub late: Vec<RecordBatch>,
    pub operator: OperatorSnapshot,
    pub open_windows: BTreeSet<i64>,
    pub resume: ResumeOffsets,
    pub dead_letters: BTreeMap<String, u64>,
    pub dead_letter_file_bytes: Option<u64>,
    /// Closed windows ending, and late segments whose newest event lies, this long before the
    /// watermark are dropped (their files deleted), so the state holds the lookback horizon, not
    /// the whole history. Measured from the watermark, which one partition's outlier event time
    /// cannot drag forward (see `window.max_partition_clock_jump`).
    pub retention_ms: Option<i64>,
    pub decoder: crate::ingest::DecoderState,
}

pub struct StateStore {
    dir: PathBuf,
    manifest: Manifest,
    /// One writer per state directory (a second `ultr ingest`/`ultr run` on it is refused).
    _lock: lock::DirLock,
    /// Closed windows a checkpoint writes side by side (`set_write_threads`).
    write_threads: usize,
}

impl StateStore {
    /// Opens (or creates) the state for `source`. Refuses a foreign directory, a manifest from another
    /// source, or one written with other window settings — naming the file and the key.
    pub fn open(dir: &Path, source: &str, window: WindowSpec, holdout: crate::window::Holdout) -> anyhow::Result<Self> {
        let manifest_path = dir.join(MANIFEST);
        if manifest_path.exists() {
            let lock = lock::DirLock::acquire(dir, "state directory")?;
            let manifest = read_manifest(dir)?;
            if manifest.source != source {
                bail!("{}: key `source` is {:?} but this run reads {:?}; use another --state directory", manifest_path.display(), manifest.source, source);
            }
            if manifest.window != window {
                bail!(
                    "{}: key `window` is {:?} but the config says {:?}; window settings cannot change under existing state",
                    manifest_path.display(),
                    manifest.window,
                    window
                );
            }
            if manifest.holdout != holdout {
                bail!(
                    "{}: key `holdout` is {:?} but the config's `train.validation_fraction` / `train.evaluation_fraction` give {holdout:?}; the stored training rows are split with the former — use another --state directory or the same fractions",
                    manifest_path.display(),
                    manifest.holdout
                );
            }
            let store = StateStore { dir: dir.to_path_buf(), manifest, _lock: lock, write_threads: 1 };
            store.remove_garbage()?;
            return Ok(store);
        }
        if dir.exists() {
            let foreign: Vec<String> = fs::read_dir(dir)
                .with_context(|| format!("reading state directory {}", dir.display()))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    !matches!(n.as_str(), "windows" | "open" | "late" | "cumulative" | "shards" | "dead-letters.jsonl" | lock::LOCK_FILE)
                        && !n.starts_with(".tmp")
                })
                .collect();
            if !foreign.is_empty() {
                bail!("{} is not an ultr state directory (no {MANIFEST}, holds {:?})", dir.display(), foreign);
            }
        }
        let lock = lock::DirLock::acquire(dir, "state directory")?;
        for sub in ["windows", "open", "late"] {
            fs::create_dir_all(dir.join(sub)).with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        sync_dir(dir)?;
        let manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            source: source.to_string(),
            window,
            seq: 0,
            resume: ResumeOffsets::default(),
            operator: OperatorSnapshot { partitions: Default::default(), watermark: i64::MIN, counters: Default::default(), event_watermark: None },
            windows: Vec::new(),
            open_windows: Vec::new(),
            filter_segments: Vec::new(),
            holdout,
            late_segments: Vec::new(),
            late: Vec::new(),
            decoder: Default::default(),
            dead_letters: BTreeMap::new(),
            dead_letter_file_bytes: None,
            merged_from: BTreeMap::new(),
            open_in_parts: BTreeSet::new(),
        };
        let store = StateStore { dir: dir.to_path_buf(), manifest, _lock: lock, write_threads: 1 };
        store.remove_garbage()?;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The open windows' duplicate filters, as `(window_start, session keys)`.
    pub fn open_filters(&self) -> anyhow::Result<Vec<(i64, Vec<u64>)>> {
        let mut by_window: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
        for seg in &self.manifest.filter_segments {
            let path = self.dir.join("open").join(&seg.file);
            check_file(&path, seg.bytes)?;
            for batch in read_parquet(&path)? {
                let starts = batch.column(0).as_primitive::<Int64Type>();
                let keys = batch.column(1).as_primitive::<UInt64Type>();
                for i in 0..batch.num_rows() {
                    if seg.windows.contains(&starts.value(i)) {
                        by_window.entry(starts.value(i)).or_default().push(keys.value(i));
                    }
                }
            }
        }
        Ok(by_window.into_iter().collect())
    }

    /// The open windows' merged partial aggregates.
    pub fn open_partials(&self) -> anyhow::Result<Vec<(i64, Tables)>> {
        let mut out = Vec::new();
        for w in &self.manifest.open_windows {
            let mut tables: Tables = Vec::new();
            for t in crate::window::StateTable::partials() {
                let batches = match w.files.get(t.name()) {
                    Some(&bytes) => {
                        let path = self.dir.join("open").join(&w.dir).join(format!("{t}.parquet"));
                        check_file(&path, Some(bytes))?;
                        read_parquet(&path)?
                    }
                    None => Vec::new(),
                };
                tables.push((t, batches));
            }
            out.push((w.start_ms, tables));
        }
        Ok(out)
    }

    /// Closed windows a checkpoint writes at once, each on a thread of its own (default 1: in order,
    /// on the caller's thread).
    pub fn set_write_threads(&mut self, threads: usize) {
        self.write_threads = threads.max(1);
    }

    /// Persists a checkpoint: window folders and segments first, then the manifest, then garbage removal.
    pub fn checkpoint(&mut self, mut cp: Checkpoint) -> anyhow::Result<()> {
        let closed = std::mem::take(&mut cp.closed).into_iter().map(|c| ((c.start_ms, c.end_ms), c)).collect();
        self.checkpoint_computing(cp, closed, Ok)
    }

    /// `checkpoint` with closed windows computed as they are written: `compute` turns each of
    /// `closed`'s items (keyed by the window's start and end) into its window, on the thread that then
    /// writes it (`set_write_threads`), so only as many computed windows live at once as threads.
    pub fn checkpoint_computing<T: Send>(
        &mut self,
        cp: Checkpoint,
        closed: Vec<((i64, i64), T)>,
        compute: impl Fn(T) -> anyhow::Result<ClosedOutput> + Sync,
    ) -> anyhow::Result<()> {
        let mut next = self.manifest.clone();
        next.seq += 1;
        let windows_dir = self.dir.join("windows");
        let mut todo = Vec::with_capacity(closed.len());
        let mut named = BTreeSet::new();
        for ((start_ms, end_ms), item) in closed {
            // A new folder per checkpoint: re-processing a window writes a fresh folder and the
            // manifest switches to it atomically; the old one becomes garbage after the manifest.
            let base = format!("{start_ms}-{end_ms}");
            let taken = next.windows.iter().any(|w| w.dir == base) || named.contains(&base) || windows_dir.join(&base).exists();
            let name = if taken { format!("{base}.{}", next.seq) } else { base };
            named.insert(name.clone());
            todo.push((item, name));
        }
        let seq = next.seq;
        let written = crate::runtime::in_threads(todo, self.write_threads, |(item, name)| -> anyhow::Result<WindowEntry> {
            let mut closed = compute(item)?;
            if let Some(keys) = closed.keys.take() {
                closed.tables = keys.tables_to_strings(std::mem::take(&mut closed.tables))?;
            }
            let (sessions, impressions, files) = write_window(&windows_dir, &name, seq, &closed.tables)?;
            Ok(WindowEntry { start_ms: closed.start_ms, end_ms: closed.end_ms, dir: name, sessions, impressions, files })
        });
        for entry in written {
            let entry = entry?;
            next.windows.retain(|w| !(w.start_ms == entry.start_ms && w.end_ms == entry.end_ms));
            next.windows.push(entry);
        }
        sync_dir(&windows_dir)?;
        next.windows.sort_by_key(|w| (w.start_ms, w.end_ms));
        let reference = cp.operator.event_watermark.unwrap_or(cp.operator.watermark);
        let horizon_end = if reference > i64::MIN { Some(reference) } else { None };
        if let (Some(keep), Some(end)) = (cp.retention_ms, horizon_end) {
            let cutoff = end.saturating_sub(keep);
            next.windows.retain(|w| w.end_ms > cutoff);
            next.late.retain(|l| l.max_event_ms > cutoff);
        }

        let open_dir = self.dir.join("open");
        for (start, tables) in &cp.open_partials {
            if !cp.open_windows.contains(start) {
                continue; // closed in this same checkpoint
            }
            let name = format!("{start}.{}", next.seq);
            let tmp = open_dir.join(format!(".tmp-{name}"));
            fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
            let mut files = BTreeMap::new();
            for (table, batches) in tables {
                if let Some(bytes) = write_parquet(&tmp.join(format!("{table}.parquet")), batches)? {
                    files.insert(table.to_string(), bytes);
                }
            }
            sync_dir(&tmp)?;
            fs::rename(&tmp, open_dir.join(&name)).with_context(|| format!("renaming {} into {}", tmp.display(), open_dir.display()))?;
            next.open_windows.retain(|w| w.start_ms != *start);
            next.open_windows.push(OpenWindowEntry { start_ms: *start, dir: name, files });
        }
        next.open_windows.retain(|w| cp.open_windows.contains(&w.start_ms));
        next.open_windows.sort_by_key(|w| w.start_ms);
        let admitted: Vec<&(i64, u64)> = cp.admitted.iter().filter(|(s, _)| cp.open_windows.contains(s)).collect();
        if !admitted.is_empty() {
            let file = format!("filter-{:08}.parquet", next.seq);
            let windows: BTreeSet<i64> = admitted.iter().map(|(s, _)| *s).collect();
            let schema = Arc::new(Schema::new(vec![Field::new("window_start", DataType::Int64, false), Field::new("session_key", DataType::UInt64, false)]));
            let batch = RecordBatch::try_new(
                schema,
                vec![
                    Arc::new(Int64Array::from_iter_values(admitted.iter().map(|(s, _)| *s))) as ArrayRef,
                    Arc::new(UInt64Array::from_iter_values(admitted.iter().map(|(_, k)| *k))),
                ],
            )?;
            let bytes = write_parquet(&open_dir.join(&file), &[batch])?;
            next.filter_segments.push(Segment { file, windows, bytes });
        }
        sync_dir(&open_dir)?;
        for seg in &mut next.filter_segments {
            seg.windows.retain(|s| cp.open_windows.contains(s));
        }
        next.filter_segments.retain(|s| !s.windows.is_empty());
        if !cp.late.is_empty() {
            let file = format!("late-{:08}.parquet", next.seq);
            let max_event_ms = cp.late.iter().filter_map(max_event_time).max().unwrap_or(i64::MIN);
            if let Some(bytes) = write_parquet(&self.dir.join("late").join(&file), &cp.late)? {
                next.late.push(LateSegment { file, bytes, max_event_ms });
            }
        }
        next.decoder = cp.decoder;
        next.operator = cp.operator;
        next.resume = cp.resume;
        next.dead_letters = cp.dead_letters;
        next.dead_letter_file_bytes = cp.dead_letter_file_bytes;
        write_manifest(&self.dir, &next)?;
        self.manifest = next;
        self.remove_garbage()
    }

    /// Records a new dead-letter file length (after the file was rotated) without other changes.
    pub fn record_dead_letter_file_bytes(&mut self, bytes: u64) -> anyhow::Result<()> {
        let mut next = self.manifest.clone();
        next.seq += 1;
        next.dead_letter_file_bytes = Some(bytes);
        write_manifest(&self.dir, &next)?;
        self.manifest = next;
        Ok(())
    }

    /// Records which partition windows each merged window was built from, and the windows open in
    /// the parts (compaction only).
    pub fn record_merged_from(&mut self, merged_from: BTreeMap<String, String>, open_in_parts: BTreeSet<i64>) -> anyhow::Result<()> {
        let mut next = self.manifest.clone();
        next.seq += 1;
        next.merged_from = merged_from;
        next.open_in_parts = open_in_parts;
        write_manifest(&self.dir, &next)?;
        self.manifest = next;
        Ok(())
    }

    /// Deletes files and folders the manifest does not name (left by a crash or superseded).
    fn remove_garbage(&self) -> anyhow::Result<()> {
        let keep_windows: BTreeSet<&str> = self.manifest.windows.iter().map(|w| w.dir.as_str()).collect();
        let keep_open: BTreeSet<&str> =
            self.manifest.filter_segments.iter().map(|s| s.file.as_str()).chain(self.manifest.open_windows.iter().map(|w| w.dir.as_str())).collect();
        let keep_late: BTreeSet<&str> =
            self.manifest.late_segments.iter().map(String::as_str).chain(self.manifest.late.iter().map(|l| l.file.as_str())).collect();
        for (sub, keep) in [("windows", &keep_windows), ("open", &keep_open), ("late", &keep_late)] {
            let Ok(entries) = fs::read_dir(self.dir.join(sub)) else { continue };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !keep.contains(name.as_str()) {
                    let p = e.path();
                    if p.is_dir() {
                        fs::remove_dir_all(&p)?;
                    } else {
                        fs::remove_file(&p)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Impressions of late sessions (the side output).
    pub fn late_rows(&self) -> anyhow::Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for f in &self.manifest.late_segments {
            out.extend(read_parquet(&self.dir.join("late").join(f))?);
        }
        for l in &self.manifest.late {
            let path = self.dir.join("late").join(&l.file);
            check_file(&path, Some(l.bytes))?;
            out.extend(read_parquet(&path)?);
        }
        Ok(out)
    }

    /// One statistic of one closed window.
    pub fn window_table(&self, entry: &WindowEntry, table: StateTable) -> anyhow::Result<Vec<RecordBatch>> {
        read_window_table(&self.dir, entry, table)
    }
}

/// One statistic of one closed window under state directory `dir`. A file the manifest lists must
/// exist with its recorded size; a statistic it does not list had no rows.
pub fn read_window_table(dir: &Path, entry: &WindowEntry, table: StateTable) -> anyhow::Result<Vec<RecordBatch>> {
    let path = dir.join("windows").join(&entry.dir).join(format!("{table}.parquet"));
    if entry.files.is_empty() {
        // Written by an ultr that recorded no sizes: a missing file there meant an empty table.
        return if path.exists() { read_parquet(&path) } else { Ok(Vec::new()) };
    }
    match entry.files.get(table.name()) {
        Some(&bytes) => {
            check_file(&path, Some(bytes))?;
            read_parquet(&path)
        }
        None => Ok(Vec::new()),
    }
}

/// The Parquet file of one statistic of one closed window, checked as `read_window_table` checks it;
/// None when the statistic had no rows (for queries that read the files themselves).
pub fn window_table_path(dir: &Path, entry: &WindowEntry, table: StateTable) -> anyhow::Result<Option<PathBuf>> {
    let path = dir.join("windows").join(&entry.dir).join(format!("{table}.parquet"));
    if entry.files.is_empty() {
        return Ok(path.exists().then_some(path));
    }
    match entry.files.get(table.name()) {
        Some(&bytes) => {
            check_file(&path, Some(bytes))?;
            Ok(Some(path))
        }
        None => Ok(None),
    }
}

/// The Arrow schema a Parquet file was written with (its footer only).
pub fn parquet_schema(path: &Path) -> anyhow::Result<datafusion::arrow::datatypes::SchemaRef> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(ParquetRecordBatchReaderBuilder::try_new(f).with_context(|| format!("{} is not Parquet", path.display()))?.schema().clone())
}

/// A state file must exist and, when its size was recorded, have exactly that size.
fn check_file(path: &Path, bytes: Option<u64>) -> anyhow::Result<()> {
    let meta = fs::metadata(path).with_context(|| format!("state file {} named by the manifest is missing", path.display()))?;
    if let Some(expected) = bytes {
        if meta.len() != expected {
            bail!("state file {} is {} bytes but the manifest recorded {expected}: truncated or replaced", path.display(), meta.len());
        }
    }
    Ok(())
}

/// Newest `event_time` in an impressions batch.
fn max_event_time(batch: &RecordBatch) -> Option<i64> {
    use datafusion::arrow::datatypes::TimestampMillisecondType;
    let col = batch.column_by_name(crate::session::schema::col::EVENT_TIME)?;
    datafusion::arrow::compute::max(col.as_primitive::<TimestampMillisecondType>())
}

/// Makes a directory's entries (creations, renames) durable.
pub fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing directory {}", dir.display()))
}

/// Reads and checks a manifest without opening the state for writing (for read-only commands).
pub fn read_manifest(dir: &Path) -> anyhow::Result<Manifest> {
    let path = dir.join(MANIFEST);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    // Format and version first: an older manifest lacks newer keys and should say so, not "missing field".
    #[derive(Deserialize)]
    struct Header {
        format: String,
        version: u32,
    }
    let header: Header = serde_json::from_str(&text).with_context(|| format!("{} is not an ultr manifest", path.display()))?;
    if header.format != FORMAT {
        bail!("{}: key `format` is {:?}, expected {FORMAT:?}", path.display(), header.format);
    }
    if header.version != VERSION {
        bail!(
            "{}: key `version` is {}, this build reads {VERSION} (version 1 kept open windows as raw rows, version 2 split sessions \
             two ways without an evaluation slice; re-ingest into a new state directory)",
            path.display(),
            header.version
        );
    }
    let manifest: Manifest = serde_json::from_str(&text).with_context(|| format!("{} is not an ultr manifest", path.display()))?;
    Ok(manifest)
}

fn write_manifest(dir: &Path, manifest: &Manifest) -> anyhow::Result<()> {
    let tmp = dir.join(".tmp-manifest.json");
    let mut f = File::create(&tmp)?;
    // Serialized whole first: `to_writer_pretty` on a file makes a write call per token (about 3,000
    // per manifest of the 200,000-session bench).
    f.write_all(&serde_json::to_vec_pretty(manifest)?)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(MANIFEST))?;
    sync_dir(dir) // make the rename itself durable
}

/// Writes one closed window's tables into `windows_dir/name`, whole or not at all (a temporary
/// folder renamed once every file is durable); returns its sessions, impressions and file sizes.
fn write_window(windows_dir: &Path, name: &str, seq: u64, tables: &Tables) -> anyhow::Result<(u64, u64, BTreeMap<String, u64>)> {
    let tmp = windows_dir.join(format!(".tmp-{name}-{seq}"));
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut sessions = 0;
    let mut impressions = 0;
    let mut files = BTreeMap::new();
    for (table, batches) in tables {
        match table.entry().total {
            Some(WindowTotal::Sessions(column)) => sessions = sum_column(batches, column),
            Some(WindowTotal::Impressions(column)) => impressions = sum_column(batches, column),
            None => {}
        }
        if let Some(bytes) = write_parquet(&tmp.join(format!("{table}.parquet")), batches)? {
            files.insert(table.to_string(), bytes);
        }
    }
    sync_dir(&tmp)?;
    let dest = windows_dir.join(name);
    fs::rename(&tmp, &dest).with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    Ok((sessions, impressions, files))
}

fn sum_column(batches: &[RecordBatch], name: &str) -> u64 {
    batches
        .iter()
        .filter_map(|b| b.column_by_name(name))
        .map(|c| {
            let c = c.as_primitive::<Int64Type>();
            (0..c.len()).map(|i| c.value(i) as u64).sum::<u64>()
        })
        .sum()
}

/// Writes Parquet atomically: to a temporary name, fsync, rename, fsync the folder. No batches: no
/// file. Returns the file's size.
pub fn write_parquet(path: &Path, batches: &[RecordBatch]) -> anyhow::Result<Option<u64>> {
    let Some(first) = batches.first() else { return Ok(None) };
    let tmp = path.with_extension("parquet.tmp");
    let f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let props = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
    // Buffered: the writer emits a page's header and its data as separate small writes.
    let mut w = ArrowWriter::try_new(std::io::BufWriter::with_capacity(1 << 20, f), first.schema(), Some(props))?;
    for b in batches {
        w.write(b)?;
    }
    let f = w.into_inner()?.into_inner().map_err(|e| anyhow::anyhow!("writing {}: {}", tmp.display(), e.error()))?;
    f.sync_all()?;
    let bytes = f.metadata()?.len();
    drop(f);
    fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(Some(bytes))
}

/// Reads a Parquet file; a missing file is an error naming it.
pub fn read_parquet(path: &Path) -> anyhow::Result<Vec<RecordBatch>> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(f).with_context(|| format!("{} is not Parquet", path.display()))?.build()?;
    reader.map(|b| b.with_context(|| format!("reading {}", path.display()))).collect()
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::window::operator::WindowCounters;

    /// A state holding one file of every kind — a closed window's table, an open window's partial, a
    /// duplicate-filter segment and a late segment — names each of them in `named_files` with its
    /// size on disk, and no file that is not there: what a copy of the state must carry.
    pub fn named_files_are_exactly_the_states_files_with_their_sizes() {
        let root = tempfile::tempdir().unwrap();
        let spec = WindowSpec { size_ms: 600_000, slide_ms: 600_000, allowed_lateness_ms: 0, idle_timeout_ms: 60_000 };
        let mut store = StateStore::open(root.path(), "src", spec, crate::window::Holdout { validation: 0.1, evaluation: 0.1 }).unwrap();
        let batch = |name: &str| {
            let schema = Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, false)]));
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1_i64, 2, 3])) as ArrayRef]).unwrap()
        };
        store
            .checkpoint(Checkpoint {
                closed: vec![ClosedOutput { start_ms: 0, end_ms: 600_000, tables: vec![(StateTable::QuerySessions, vec![batch("sessions")])], keys: None }],
                open_partials: vec![(600_000, vec![(StateTable::PropensityCounts, vec![batch("impressions")])])],
                admitted: vec![(600_000, 42)],
                late: vec![batch("x")],
                operator: OperatorSnapshot { partitions: BTreeMap::new(), watermark: 600_000, counters: WindowCounters::default(), event_watermark: None },
                open_windows: BTreeSet::from([600_000]),
                resume: ResumeOffsets::default(),
                dead_letters: BTreeMap::new(),
                dead_letter_file_bytes: None,
                retention_ms: None,
                decoder: Default::default(),
            })
            .unwrap();
        fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, u64>) {
            for e in fs::read_dir(dir).unwrap().flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, base, out);
                } else {
                    out.insert(path.strip_prefix(base).unwrap().to_string_lossy().into_owned(), e.metadata().unwrap().len());
                }
            }
        }
        let mut on_disk = BTreeMap::new();
        walk(root.path(), root.path(), &mut on_disk);
        on_disk.retain(|name, _| name != MANIFEST && name != ".lock");
        let named = store.manifest().named_files();
        assert_eq!(named.len(), 4, "{named:?}");
        for (name, bytes) in &named {
            let size = on_disk.get(name).unwrap_or_else(|| panic!("{name} is named but not on disk: {on_disk:?}"));
            assert!(bytes.is_none_or(|b| b == *size), "{name}: named with {bytes:?} bytes, {size} on disk");
        }
        assert_eq!(on_disk.len(), named.len(), "files on disk that the manifest does not name: {on_disk:?}");
    }
}
