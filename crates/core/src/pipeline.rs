//! Source → decode → windows → state: the streaming loop, with checkpoint-then-commit. Restarting
//! resumes from the manifest's offsets, open windows' partial aggregates and duplicate filters, so a
//! crash loses and double-counts nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use datafusion::arrow::array::RecordBatch;

use crate::config::CoreConfig;
use crate::ingest::{Ingest, Next};
use crate::sinks::config::DeadLetterConfig;
use crate::sinks::dead_letter::DeadLetterSink;
use crate::sinks::kafka::KafkaSink;
use crate::sources::{RecordSource, ResumeOffsets, SourceHealth};
use crate::state::{Checkpoint, ClosedOutput, StateStore};
use crate::window::aggregates::OpenWindows;
use crate::window::operator::{ClosedWindow, WindowCounters, WindowOperator};

/// The dead-letter output; a file is cut back to the length the last checkpoint recorded
/// (`committed`), so a crash's replay does not list a record twice. A Kafka topic cannot be cut
/// back: there a crash can repeat letters (at-least-once).
pub fn open_dead_letters(config: &CoreConfig, state_dir: &Path, committed: Option<u64>) -> anyhow::Result<DeadLetterSink> {
    match &config.dead_letter {
        Some(DeadLetterConfig::File { path, max_payload_bytes, .. }) => {
            Ok(DeadLetterSink::file_resuming(path, committed)?.with_max_payload_bytes(*max_payload_bytes))
        }
        Some(DeadLetterConfig::Kafka { brokers, topic, properties, max_payload_bytes }) => {
            // A letter the broker cannot take within 30 s is counted as failed, not retried for
            // librdkafka's default 5 minutes.
            let mut properties = properties.clone();
            properties.entry("message.timeout.ms".to_string()).or_insert_with(|| "30000".to_string());
            Ok(DeadLetterSink::kafka(KafkaSink::new(brokers, topic, &properties).context("[dead_letter.kafka]")?)
                .with_max_payload_bytes(*max_payload_bytes))
        }
        None => DeadLetterSink::file_resuming(&state_dir.join("dead-letters.jsonl"), committed),
    }
}

/// Size bound of the dead-letter file: (max bytes, rotated files kept).
fn dead_letter_rotation(config: &CoreConfig) -> (u64, usize) {
    match &config.dead_letter {
        Some(DeadLetterConfig::File { max_file_bytes, keep_files, .. }) => (*max_file_bytes, *keep_files),
        _ => (256 << 20, 4),
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunReport {
    pub records: u64,
    pub windows_closed_this_run: u64,
    pub checkpoints: u64,
    pub counters: WindowCounters,
    pub dead_letters: BTreeMap<String, u64>,
    pub watermark_ms: i64,
    /// Consumer lag per (topic, partition) after the last commit (Kafka sources).
    pub lag: Vec<(String, i32, i64)>,
    /// Seconds the last checkpoint spent computing and persisting closed windows.
    pub window_close_seconds: Vec<f64>,
    /// Dead letters the Kafka dead-letter sink could not deliver.
    pub dead_letter_failures: u64,
    /// Wall-clock ms of the last durable checkpoint.
    pub last_checkpoint_unix_ms: i64,
}

/// Hooks the always-on service uses to observe the loop; `ultr ingest` passes none.
pub trait Observer {
    /// The state is restored and the source opened (its health, when it has a connection).
    fn on_restored(&mut self, _source: Option<std::sync::Arc<SourceHealth>>) {}
    /// Called on every turn of the loop (progress for `/healthz`).
    fn on_progress(&mut self, _report: &RunReport) {}
    /// The checkpoint is durable locally; make it durable wherever else it must be (a scale-out
    /// partition task copies it to the object store) before the source commits its offsets.
    fn persist(&mut self, _store: &StateStore) -> anyhow::Result<()> {
        Ok(())
    }
    fn after_checkpoint(&mut self, _store: &StateStore, _report: &RunReport) {}
    fn should_stop(&self) -> bool {
        false
    }
}

pub struct NoObserver;
impl Observer for NoObserver {}

/// A source opened at the state's resume offsets.
pub type OpenSource<'a> = dyn Fn(&ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> + 'a;

/// Runs until a bounded source ends (or the observer asks to stop), checkpointing into `state_dir`;
/// the source is opened by `open_reader` at the state's resume offsets (a scale-out partition task
/// reads one partition).
pub fn run_with_source(config: &CoreConfig, state_dir: &Path, observer: &mut dyn Observer, open_reader: &OpenSource) -> anyhow::Result<RunReport> {
    let mut run = Running::restore(config, state_dir, open_reader)?;
    observer.on_restored(run.ingest.source().health());
    loop {
        let next = run.ingest.next()?;
        for key in run.ingest.source().assigned_partitions() {
            run.operator.register_partition(&key, Instant::now());
        }
        let ended = matches!(next, Next::End);
        match next {
            Next::Batch(batch) => run.process(&batch)?,
            Next::Idle => {}
            Next::End => run.pending.closed.extend(run.operator.flush_all()),
        }
        let due = !run.pending.closed.is_empty()
            || run.since_checkpoint >= config.state.checkpoint_every_records
            || ended
            || (run.since_checkpoint > 0 && run.last_checkpoint.elapsed() >= config.state.checkpoint_interval());
        let stop = observer.should_stop();
        if (due || stop) && (run.pending.has_work() || run.resume != run.store.manifest().resume) {
            run.checkpoint(config)?;
            observer.persist(&run.store)?;
            // Only after the state covering it is durable; a failed commit is a warning (the
            // manifest, not the group, says where reading resumes).
            if let Err(e) = run.ingest.source_mut().commit(&run.resume) {
                tracing::warn!("committing source offsets: {e:#}");
            }
            observer.after_checkpoint(&run.store, &run.report);
        }
        observer.on_progress(&run.report);
        if ended || stop {
            break;
        }
    }
    run.report.counters = run.operator.counters().clone();
    run.report.watermark_ms = run.operator.watermark();
    Ok(run.report)
}

/// One run of the pipeline over a state: the restored operator, open windows, decoder and dead-letter
/// output, and what the next checkpoint owes the state.
struct Running {
    store: StateStore,
    operator: WindowOperator,
    open: OpenWindows,
    ingest: Ingest<Box<dyn RecordSource + Send>>,
    dead: DeadLetterSink,
    dead_rotation: (u64, usize),
    runtime: tokio::runtime::Runtime,
    pending: Pending,
    resume: ResumeOffsets,
    report: RunReport,
    since_checkpoint: u64,
    last_checkpoint: Instant,
}

impl Running {
    /// Everything restored from the state's manifest, and the source opened at its offsets.
    fn restore(config: &CoreConfig, state_dir: &Path, open_reader: &OpenSource) -> anyhow::Result<Running> {
        let spec = config.window.spec().map_err(|e| anyhow::anyhow!("pipeline config: {e}"))?;
        crate::window::set_query_memory_limit(config.state.query_memory_limit_bytes().map_err(|e| anyhow::anyhow!("pipeline config: {e}"))?);
        let mut store = StateStore::open(state_dir, &config.source_identity, spec, config.holdout)?;
        let manifest = store.manifest().clone();
        let operator =
            WindowOperator::restore(spec, manifest.operator.clone(), store.open_filters()?).with_max_clock_jump(Some(config.window.max_clock_jump_ms()));
        let open = OpenWindows::new(config.window.reduce_rows, config.holdout, config.window.statistic_bounds()).restore(store.open_partials()?);
        let mut ingest = Ingest::new(open_reader(&manifest.resume)?, config.decode.clone(), config.batch_records);
        ingest.restore(&manifest.decoder);
        let dead = open_dead_letters(config, state_dir, manifest.dead_letter_file_bytes)?;
        if manifest.dead_letter_file_bytes.is_none() {
            // No length recorded yet (a new state, or one from an older ultr): record the file as it
            // is now, before this run writes a letter, so a crash before the first checkpoint is cut
            // back to here and letters this state did not write are never cut.
            if let Some(len) = dead.file_len()? {
                store.checkpoint(Checkpoint {
                    closed: Vec::new(),
                    open_partials: Vec::new(),
                    admitted: Vec::new(),
                    late: Vec::new(),
                    operator: operator.snapshot(),
                    open_windows: operator.open_starts(),
                    resume: manifest.resume.clone(),
                    dead_letters: manifest.dead_letters.clone(),
                    dead_letter_file_bytes: Some(len),
                    retention_ms: None,
                    decoder: manifest.decoder.clone(),
                })?;
            }
        }
        Ok(Running {
            store,
            operator,
            open,
            ingest,
            dead,
            dead_rotation: dead_letter_rotation(config),
            runtime: crate::runtime::multi_thread("ultr-pipeline")?,
            pending: Pending::default(),
            resume: manifest.resume.clone(),
            report: RunReport { dead_letters: manifest.dead_letters.clone(), last_checkpoint_unix_ms: chrono::Utc::now().timestamp_millis(), ..RunReport::default() },
            since_checkpoint: 0,
            last_checkpoint: Instant::now(),
        })
    }

    /// One decoded batch: its dead letters written, its sessions into windows.
    fn process(&mut self, batch: &crate::ingest::DecodedBatch) -> anyhow::Result<()> {
        self.report.records += batch.records as u64;
        self.since_checkpoint += batch.records as u64;
        for letter in &batch.dead_letters {
            self.dead.write(letter)?;
            *self.report.dead_letters.entry(letter.reason.as_str().to_string()).or_default() += 1;
        }
        let out = self.operator.process(batch, Instant::now());
        for (start, rows) in &out.added {
            self.runtime.block_on(self.open.add(*start, rows))?;
        }
        self.pending.add(out.admitted, out.late, out.closed);
        self.resume.merge(&batch.resume);
        Ok(())
    }

    /// Closes the pending windows and writes one checkpoint: dead letters first, then the state that
    /// counts them.
    fn checkpoint(&mut self, config: &CoreConfig) -> anyhow::Result<()> {
        self.dead.flush()?;
        let close_started = Instant::now();
        let n_closed = self.pending.closed.len();
        let closed = self.runtime.block_on(compute_closed(&mut self.open, std::mem::take(&mut self.pending.closed)))?;
        let open_partials = self.runtime.block_on(self.open.checkpoint())?;
        self.report.windows_closed_this_run += closed.len() as u64;
        self.store.checkpoint(Checkpoint {
            closed,
            open_partials,
            admitted: std::mem::take(&mut self.pending.admitted),
            late: std::mem::take(&mut self.pending.late),
            operator: self.operator.snapshot(),
            open_windows: self.operator.open_starts(),
            resume: self.resume.clone(),
            dead_letters: self.report.dead_letters.clone(),
            dead_letter_file_bytes: self.dead.file_len()?,
            retention_ms: Some(config.state.retention_ms()),
            decoder: self.ingest.decoder_state(),
        })?;
        if self.dead.rotate_if_larger(self.dead_rotation.0, self.dead_rotation.1)? {
            self.store.record_dead_letter_file_bytes(0)?;
        }
        let r = &mut self.report;
        r.last_checkpoint_unix_ms = chrono::Utc::now().timestamp_millis();
        r.dead_letter_failures = self.dead.failed();
        r.window_close_seconds = vec![close_started.elapsed().as_secs_f64() / n_closed.max(1) as f64; n_closed];
        r.lag = self.ingest.source().lag(&self.resume);
        r.checkpoints += 1;
        r.counters = self.operator.counters().clone();
        r.watermark_ms = self.operator.watermark();
        self.since_checkpoint = 0;
        self.last_checkpoint = Instant::now();
        Ok(())
    }
}

/// What the next checkpoint owes the state.
#[derive(Default)]
struct Pending {
    admitted: Vec<(i64, u64)>,
    late: Vec<RecordBatch>,
    closed: Vec<ClosedWindow>,
}

impl Pending {
    fn add(&mut self, admitted: Vec<(i64, u64)>, late: Vec<RecordBatch>, closed: Vec<ClosedWindow>) {
        // A window that closed needs no filter entries.
        let closed_starts: Vec<i64> = closed.iter().map(|c| c.start).collect();
        self.admitted.retain(|(s, _)| !closed_starts.contains(s));
        self.admitted.extend(admitted.into_iter().filter(|(s, _)| !closed_starts.contains(s)));
        self.late.extend(late);
        self.closed.extend(closed);
    }

    fn has_work(&self) -> bool {
        !self.admitted.is_empty() || !self.late.is_empty() || !self.closed.is_empty()
    }
}

async fn compute_closed(open: &mut OpenWindows, closed: Vec<ClosedWindow>) -> anyhow::Result<Vec<ClosedOutput>> {
    let mut out = Vec::with_capacity(closed.len());
    for w in closed {
        let tables = open.close(w.start).await?;
        out.push(ClosedOutput { start_ms: w.start, end_ms: w.end, tables });
    }
    Ok(out)
}
