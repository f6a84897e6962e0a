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
    let spec = config.window.spec().map_err(|e| anyhow::anyhow!("pipeline config: {e}"))?;
    crate::window::set_query_memory_limit(config.state.query_memory_limit_bytes().map_err(|e| anyhow::anyhow!("pipeline config: {e}"))?);
    let mut store = StateStore::open(state_dir, &config.source_identity, spec, config.holdout)?;
    let manifest = store.manifest().clone();
    let mut operator =
        WindowOperator::restore(spec, manifest.operator.clone(), store.open_filters()?).with_max_clock_jump(Some(config.window.max_clock_jump_ms()));
    let mut open = OpenWindows::new(config.window.reduce_rows, config.holdout, config.window.statistic_bounds()).restore(store.open_partials()?);
    let source = open_reader(&manifest.resume)?;
    let source_health = source.health();
    let mut ingest = Ingest::new(source, config.decode.clone(), config.batch_records);
    ingest.restore(&manifest.decoder);
    let mut dead = open_dead_letters(config, state_dir, manifest.dead_letter_file_bytes)?;
    if manifest.dead_letter_file_bytes.is_none() {
        // No length recorded yet (a new state, or one from an older ultr): record the file as it is
        // now, before this run writes a letter, so a crash before the first checkpoint is cut back
        // to here and letters this state did not write are never cut.
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
    let (dead_max_bytes, dead_keep) = dead_letter_rotation(config);
    observer.on_restored(source_health);
    let runtime = crate::runtime::multi_thread("ultr-pipeline")?;

    let mut report = RunReport {
        dead_letters: manifest.dead_letters.clone(),
        last_checkpoint_unix_ms: chrono::Utc::now().timestamp_millis(),
        ..RunReport::default()
    };
    let mut resume = manifest.resume.clone();
    let mut pending = Pending::default();
    let mut since_checkpoint = 0u64;
    let mut last_checkpoint = Instant::now();
    let interval = config.state.checkpoint_interval();
    loop {
        let next = ingest.next()?;
        for key in ingest.source().assigned_partitions() {
            operator.register_partition(&key, Instant::now());
        }
        let ended = matches!(next, Next::End);
        match next {
            Next::Batch(batch) => {
                report.records += batch.records as u64;
                since_checkpoint += batch.records as u64;
                for letter in &batch.dead_letters {
                    dead.write(letter)?;
                    *report.dead_letters.entry(letter.reason.as_str().to_string()).or_default() += 1;
                }
                let out = operator.process(&batch, Instant::now());
                for (start, rows) in &out.added {
                    runtime.block_on(open.add(*start, rows))?;
                }
                pending.add(out.admitted, out.late, out.closed);
                resume.merge(&batch.resume);
            }
            Next::Idle => {}
            Next::End => pending.closed.extend(operator.flush_all()),
        }
        let due = !pending.closed.is_empty()
            || since_checkpoint >= config.state.checkpoint_every_records
            || ended
            || (since_checkpoint > 0 && last_checkpoint.elapsed() >= interval);
        let stop = observer.should_stop();
        if (due || stop) && (pending.has_work() || resume != store.manifest().resume) {
            dead.flush()?; // dead letters before the manifest that counts them
            let close_started = Instant::now();
            let n_closed = pending.closed.len();
            let closed = runtime.block_on(compute_closed(&mut open, std::mem::take(&mut pending.closed)))?;
            let open_partials = runtime.block_on(open.checkpoint())?;
            report.windows_closed_this_run += closed.len() as u64;
            store.checkpoint(Checkpoint {
                closed,
                open_partials,
                admitted: std::mem::take(&mut pending.admitted),
                late: std::mem::take(&mut pending.late),
                operator: operator.snapshot(),
                open_windows: operator.open_starts(),
                resume: resume.clone(),
                dead_letters: report.dead_letters.clone(),
                dead_letter_file_bytes: dead.file_len()?,
                retention_ms: Some(config.state.retention_ms()),
                decoder: ingest.decoder_state(),
            })?;
            if dead.rotate_if_larger(dead_max_bytes, dead_keep)? {
                store.record_dead_letter_file_bytes(0)?;
            }
            observer.persist(&store)?;
            // Only after the state covering it is durable; a failed commit is a warning (the
            // manifest, not the group, says where reading resumes).
            if let Err(e) = ingest.source_mut().commit(&resume) {
                tracing::warn!("committing source offsets: {e:#}");
            }
            report.last_checkpoint_unix_ms = chrono::Utc::now().timestamp_millis();
            report.dead_letter_failures = dead.failed();
            report.window_close_seconds = vec![close_started.elapsed().as_secs_f64() / n_closed.max(1) as f64; n_closed];
            report.lag = ingest.source().lag(&resume);
            report.checkpoints += 1;
            since_checkpoint = 0;
            last_checkpoint = Instant::now();
            report.counters = operator.counters().clone();
            report.watermark_ms = operator.watermark();
            observer.after_checkpoint(&store, &report);
        }
        observer.on_progress(&report);
        if ended || stop {
            break;
        }
    }
    report.counters = operator.counters().clone();
    report.watermark_ms = operator.watermark();
    Ok(report)
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
