//! Source → decode → windows → state: the streaming loop, with checkpoint-then-commit. Restarting
//! resumes from the manifest's offsets, open windows' partial aggregates and duplicate filters, so a
//! crash loses and double-counts nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use datafusion::arrow::array::RecordBatch;

use crate::config::CoreConfig;
use crate::context::{PipelineContext, Runner};
use crate::ingest::{Ingest, Next};
use crate::sinks::config::DeadLetterConfig;
use crate::sinks::dead_letter::DeadLetterSink;
use crate::sinks::kafka::KafkaSink;
use crate::sources::{RecordSource, ResumeOffsets, SourceHealth};
use crate::state::{Checkpoint, ClosedOutput, StateStore};
use crate::window::aggregates::OpenWindows;
use crate::window::operator::{ClosedWindow, Role, WindowCounters, WindowOperator};

pub mod shards;

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
            Ok(DeadLetterSink::kafka(KafkaSink::new(brokers, topic, &properties).context("[dead_letter.kafka]")?).with_max_payload_bytes(*max_payload_bytes))
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
    /// A scale-out instance only: a new merged view of the group's partition states is in
    /// `merged_dir` (compacted here, or fetched from the lease holder); its partition tasks
    /// checkpoint on their own, so this is what the service's monitor reads.
    fn on_merged(&mut self, _merged_dir: &Path, _report: &RunReport) {}
    /// A scale-out instance only: whether it holds the compactor lease (and so runs the schedule).
    fn on_lease(&mut self, _held: bool) {}
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
///
/// With several workers (`CoreConfig::workers`, kept by the state as `shards/layout.json`), one
/// reader reads every record, each poll is decoded in as many stretches side by side
/// (`Ingest::decoders`), and each worker — a shard with its own state in `shards/<i>` —
/// assigns the sessions whose query hashes to it, while every session moves every shard's clocks:
/// windows close at the same session as in a one-worker run, and `state_dir` holds the shards'
/// merged view, equal to that run's state row for row. One worker runs on the reader's thread while
/// the next batch decodes on a thread of its own.
pub fn run_with_source(
    context: &PipelineContext,
    config: &CoreConfig,
    state_dir: &Path,
    observer: &mut dyn Observer,
    open_reader: &OpenSource,
) -> anyhow::Result<RunReport> {
    let shards = shards::layout(state_dir, config.workers)?;
    let mut merged = None;
    let mut workers = Vec::with_capacity(shards);
    if shards == 1 {
        workers.push(Worker::inline(Shard::restore(context, config, state_dir, state_dir, 0, 1)?));
    } else {
        let spec = config.window.spec().map_err(|e| anyhow::anyhow!("pipeline config: {e}"))?;
        // Held for the whole run: the merged view has one writer, as a one-worker state does.
        let mut store = StateStore::open(state_dir, &config.source_identity, spec, config.holdout)?;
        // The workers wait while the merged view is written: every core writes.
        store.set_write_threads(shards);
        merged = Some(store);
        for index in 0..shards {
            let shard = Shard::restore(context, config, &shards::dir(state_dir, index), state_dir, index, shards)?;
            workers.push(Worker::spawn(shard)?);
        }
    }
    let mut run = Coordinator::start(context, config, state_dir, workers, merged, open_reader)?;
    observer.on_restored(run.ingest.reader().source().health());
    let result = run.serve(config, observer);
    run.stop_workers();
    result
}

/// The reader's side of a run: decodes, hands every batch to every worker, and says when they
/// checkpoint (all at the same record), then merges their states and commits the source.
struct Coordinator {
    ingest: ReadAhead,
    workers: Vec<Worker>,
    /// The shards' merged view (several workers): their closed windows, merged in memory, at every
    /// checkpoint that has some.
    merged: Option<StateStore>,
    shard_dirs: Vec<std::path::PathBuf>,
    target: Option<crate::state::merged::MergeTarget>,
    /// Offsets after the last batch handed to the workers.
    sent: ResumeOffsets,
    checkpointed: ResumeOffsets,
    in_flight: bool,
    /// Closed windows computed by the workers and not yet written (see `Pending::closed`).
    closed_pending: bool,
    /// Their bytes, summed over the workers, after the last batch.
    closed_pending_bytes: usize,
    since_checkpoint: u64,
    last_checkpoint: Instant,
    report: RunReport,
}

impl Coordinator {
    fn start(
        context: &PipelineContext,
        config: &CoreConfig,
        state_dir: &Path,
        workers: Vec<Worker>,
        merged: Option<StateStore>,
        open_reader: &OpenSource,
    ) -> anyhow::Result<Coordinator> {
        let mut workers = workers;
        let mut states = Vec::with_capacity(workers.len());
        for w in &mut workers {
            w.send(Order::Describe)?;
        }
        for w in &mut workers {
            match w.recv()? {
                Reply::Described(d) => states.push(d),
                _ => anyhow::bail!("a worker answered out of turn"),
            }
        }
        // Every shard checkpoints at the same record; after a crash between two shards' checkpoints
        // the reader goes back to the earliest, and the shards ahead skip what they hold. Every shard
        // takes the earliest's clocks, so all of them close each window at the same session of the
        // replay (`WindowOperator::rewind_clock`).
        let resume = shards::earliest(states.iter().map(|d| &d.resume));
        if workers.len() > 1 {
            let clock = Arc::new(states[shards::earliest_shard(states.iter().map(|d| &d.resume))].clock.clone());
            for w in &mut workers {
                w.send(Order::Rewind(clock.clone()))?;
            }
            for w in &mut workers {
                match w.recv()? {
                    Reply::Rewound => {}
                    _ => anyhow::bail!("a worker answered out of turn"),
                }
            }
        }
        let decoder = shards::earliest_decoder(states.iter().map(|d| &d.decoder));
        // Where this run starts, for the operator after a crash (and the kill test, which checks that
        // a restart starts at its checkpoint, not at the stream's start).
        if resume.0.is_empty() {
            tracing::info!(target: "ultr::story", "no checkpoint: reading every source from its start");
        } else {
            tracing::info!(target: "ultr::story", "resuming from the checkpoint at offsets {}", serde_json::to_string(&resume).unwrap_or_default());
        }
        // One decoder per worker: with one, decoding already overlaps the worker (`ReadAhead`), and a
        // second decoder measured slower (docs/benchmarks.md).
        // The codec first: a schema registry that does not answer stops the run before any record is read.
        let codec = crate::session::codec::open(&config.decode.codec())?;
        let mut ingest = Ingest::new(open_reader(&resume)?, config.decode.clone(), config.batch_records).decoders(workers.len()).codec(codec);
        ingest.restore(&decoder);
        let shard_dirs = (0..workers.len()).map(|i| shards::dir(state_dir, i)).collect();
        let target = merged.as_ref().map(|_| crate::state::merged::MergeTarget {
            source: config.source_identity.clone(),
            window: config.window.spec().expect("validated"),
            holdout: config.holdout,
            retention_ms: Some(config.state.retention_ms()),
            bounds: config.window.statistic_bounds(),
            threads: workers.len(),
            context: context.clone(),
        });
        let dead_letters = states.first().map(|d| d.dead_letters.clone()).unwrap_or_default();
        Ok(Coordinator {
            ingest: ReadAhead::new(ingest),
            workers,
            merged,
            shard_dirs,
            target,
            sent: resume.clone(),
            checkpointed: states.first().map(|d| d.resume.clone()).unwrap_or_default(),
            in_flight: false,
            closed_pending: false,
            closed_pending_bytes: 0,
            since_checkpoint: 0,
            last_checkpoint: Instant::now(),
            report: RunReport { dead_letters, last_checkpoint_unix_ms: chrono::Utc::now().timestamp_millis(), ..RunReport::default() },
        })
    }

    fn serve(&mut self, config: &CoreConfig, observer: &mut dyn Observer) -> anyhow::Result<RunReport> {
        let mut next = self.ingest.reader_mut().next()?;
        loop {
            let ended = matches!(next, Next::End);
            match next {
                Next::Batch(batch) => self.dispatch(batch)?,
                Next::Idle => {}
                Next::End => {
                    for w in &mut self.workers {
                        w.send(Order::Flush)?;
                    }
                    self.in_flight = true;
                }
            }
            // Decoding the next batch overlaps the workers' windows of this one (a worker on the
            // reader's thread runs its batch while the reader decodes on a thread of its own); a batch
            // read ahead of a stop is not counted, and is read again by the next run.
            let following = if ended { Next::End } else { self.ingest.read_ahead(&mut self.workers)? };
            self.collect()?;
            // Closed windows wait in memory for the next checkpoint, up to `checkpoint_closed_bytes`:
            // one checkpoint then writes several closed windows, and the open ones' partials once.
            let due = (self.closed_pending && self.closed_pending_bytes >= config.state.checkpoint_closed_bytes())
                || self.since_checkpoint >= config.state.checkpoint_every_records
                || ended
                || ((self.since_checkpoint > 0 || self.closed_pending) && self.last_checkpoint.elapsed() >= config.state.checkpoint_interval());
            let stop = observer.should_stop();
            if (due || stop) && (self.closed_pending || self.since_checkpoint > 0 || self.sent != self.checkpointed) {
                self.checkpoint()?;
                observer.persist(self.store())?;
                // Only after the state covering it is durable; a failed commit is a warning (the
                // manifest, not the group, says where reading resumes).
                if let Err(e) = self.ingest.reader_mut().source_mut().commit(&self.sent, ended || stop) {
                    tracing::warn!("committing source offsets: {e:#}");
                }
                observer.after_checkpoint(self.store(), &self.report);
            }
            observer.on_progress(&self.report);
            if ended || stop {
                break;
            }
            next = following;
        }
        Ok(self.report.clone())
    }

    /// Hands one decoded batch to every worker.
    fn dispatch(&mut self, batch: crate::ingest::DecodedBatch) -> anyhow::Result<()> {
        self.report.records += batch.records as u64;
        self.since_checkpoint += batch.records as u64;
        self.sent.merge(&batch.resume);
        let owners = shards::owners(&batch, self.workers.len());
        let source = self.ingest.reader().source();
        let broadcast = Arc::new(Broadcast { assigned: source.assigned_partitions(), behind: source.partitions_behind(), batch, owners });
        for w in &mut self.workers {
            w.send(Order::Batch(broadcast.clone()))?;
        }
        self.in_flight = true;
        Ok(())
    }

    /// Waits for every worker's answer to the last order.
    fn collect(&mut self) -> anyhow::Result<()> {
        if !std::mem::take(&mut self.in_flight) {
            return Ok(());
        }
        let mut first_error = None;
        self.closed_pending_bytes = 0;
        for w in &mut self.workers {
            match w.recv() {
                Ok(Reply::Processed { closed, closed_bytes }) => {
                    self.closed_pending |= closed;
                    self.closed_pending_bytes += closed_bytes;
                }
                Ok(_) => anyhow::bail!("a worker answered out of turn"),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Every worker checkpoints at the same record; then the merged view. With several workers their
    /// closed windows are merged in memory and written to the merged view first: once, and before
    /// any shard's checkpoint drops them (`merged::write_merged`).
    fn checkpoint(&mut self) -> anyhow::Result<()> {
        let mut merged_closed = None;
        if let (Some(store), Some(target)) = (self.merged.as_mut(), self.target.as_ref()) {
            if self.closed_pending {
                let started = Instant::now();
                for w in &mut self.workers {
                    w.send(Order::TakeClosed)?;
                }
                let mut closed = Vec::with_capacity(self.workers.len());
                let mut compute_seconds: BTreeMap<(i64, i64), f64> = BTreeMap::new();
                for w in &mut self.workers {
                    match w.recv()? {
                        Reply::Closed(windows) => {
                            let (windows, seconds): (Vec<ClosedOutput>, Vec<f64>) = windows.into_iter().unzip();
                            for (w, s) in windows.iter().zip(seconds) {
                                // The shards computed their shares side by side: the slowest one's.
                                let slot = compute_seconds.entry((w.start_ms, w.end_ms)).or_default();
                                *slot = slot.max(s);
                            }
                            closed.push(windows);
                        }
                        _ => anyhow::bail!("a worker answered out of turn"),
                    }
                }
                // Counted as closed whether or not the merged view held them already (a replay after a
                // crash), as one worker counts a window its replay closes again.
                let n = compute_seconds.len();
                crate::state::merged::write_merged(closed, store, target)?;
                let share = started.elapsed().as_secs_f64() / n.max(1) as f64;
                merged_closed = Some((n as u64, compute_seconds.into_values().map(|s| s + share).collect::<Vec<f64>>()));
            }
        }
        for w in &mut self.workers {
            w.send(Order::Checkpoint)?;
        }
        let mut reports = Vec::with_capacity(self.workers.len());
        for w in &mut self.workers {
            match w.recv()? {
                Reply::Checkpointed(r) => reports.push(r),
                _ => anyhow::bail!("a worker answered out of turn"),
            }
        }
        // At every checkpoint, so the merged view's counters, offsets, late sessions and open windows
        // are as current as a one-worker state's.
        if let (Some(store), Some(target)) = (self.merged.as_mut(), self.target.as_ref()) {
            crate::state::merged::compact_into(&self.shard_dirs, store, target)?;
        }
        let r = &mut self.report;
        let first = &reports[0];
        // Several workers' shards close nothing of their own (the coordinator took their windows).
        let (closed, seconds) = merged_closed.unwrap_or_else(|| (first.windows_closed, first.window_close_seconds.clone()));
        r.windows_closed_this_run += closed;
        r.window_close_seconds = seconds;
        r.dead_letters = first.dead_letters.clone();
        r.dead_letter_failures = first.dead_letter_failures;
        r.counters = match &self.merged {
            // The view counts each window closed once (`merged::write_merged`).
            Some(store) => store.manifest().operator.counters.clone(),
            None => WindowCounters::sum(reports.iter().map(|x| &x.counters)),
        };
        r.watermark_ms = reports.iter().map(|x| x.watermark_ms).min().unwrap_or(i64::MIN);
        r.last_checkpoint_unix_ms = chrono::Utc::now().timestamp_millis();
        r.lag = self.ingest.reader().source().lag(&self.sent);
        r.checkpoints += 1;
        self.checkpointed = self.sent.clone();
        self.closed_pending = false;
        self.closed_pending_bytes = 0;
        self.since_checkpoint = 0;
        self.last_checkpoint = Instant::now();
        Ok(())
    }

    /// The state an observer sees: the merged view, or the one worker's state.
    fn store(&self) -> &StateStore {
        match (&self.merged, &self.workers[0]) {
            (Some(store), _) => store,
            (None, Worker::Inline { shard, .. }) => &shard.store,
            (None, Worker::Thread { .. }) => unreachable!("several workers have a merged view"),
        }
    }

    fn stop_workers(&mut self) {
        self.ingest.stop();
        for w in self.workers.drain(..) {
            w.join();
        }
    }
}

type Reader = Ingest<Box<dyn RecordSource + Send>>;

/// The reader lent to a thread of its own for one batch at a time, so that decoding the next batch
/// overlaps a worker running on the coordinator's thread. The reader travels to that thread and
/// back, so the coordinator holds it whenever it asks the source anything.
struct ReadAhead {
    reader: Option<Box<Reader>>,
    thread: Option<DecodeThread>,
}

struct DecodeThread {
    lend: std::sync::mpsc::SyncSender<Box<Reader>>,
    back: std::sync::mpsc::Receiver<(Box<Reader>, anyhow::Result<Next>)>,
    handle: std::thread::JoinHandle<()>,
}

impl ReadAhead {
    fn new(reader: Reader) -> ReadAhead {
        ReadAhead { reader: Some(Box::new(reader)), thread: None }
    }

    fn reader(&self) -> &Reader {
        self.reader.as_deref().expect("the reader is back after every batch")
    }

    fn reader_mut(&mut self) -> &mut Reader {
        self.reader.as_deref_mut().expect("the reader is back after every batch")
    }

    /// The next batch, decoded while the workers on this thread run the order they were given;
    /// workers on threads of their own are running theirs already.
    fn read_ahead(&mut self, workers: &mut [Worker]) -> anyhow::Result<Next> {
        if !workers.iter().any(Worker::holds_order) {
            return self.reader_mut().next();
        }
        if self.thread.is_none() {
            let (lend, inbox) = std::sync::mpsc::sync_channel::<Box<Reader>>(1);
            let (outbox, back) = std::sync::mpsc::sync_channel(1);
            let handle = std::thread::Builder::new()
                .name("ultr-decode".into())
                .spawn(move || {
                    for mut reader in inbox {
                        let next = reader.next();
                        if outbox.send((reader, next)).is_err() {
                            break;
                        }
                    }
                })
                .context("starting the decode thread")?;
            self.thread = Some(DecodeThread { lend, back, handle });
        }
        let thread = self.thread.as_ref().expect("started above");
        let reader = self.reader.take().expect("the reader is back after every batch");
        thread.lend.send(reader).map_err(|_| anyhow::anyhow!("the decode thread stopped"))?;
        workers.iter_mut().for_each(Worker::run_order);
        let (reader, next) = thread.back.recv().map_err(|_| anyhow::anyhow!("the decode thread stopped while decoding"))?;
        self.reader = Some(reader);
        next
    }

    fn stop(&mut self) {
        if let Some(DecodeThread { lend, back, handle }) = self.thread.take() {
            drop((lend, back));
            let _ = handle.join();
        }
    }
}

/// One decoded batch as every worker receives it.
struct Broadcast {
    batch: crate::ingest::DecodedBatch,
    /// The shard of each session (`batch.origins` order).
    owners: Vec<u16>,
    /// The source's assigned partitions, which hold the watermark until they speak.
    assigned: Vec<String>,
    /// Assigned partitions with unread records below their high watermark: not idle.
    behind: Vec<String>,
}

enum Order {
    Describe,
    /// Take these clocks (the earliest shard's) before the first batch.
    Rewind(Arc<crate::window::operator::OperatorSnapshot>),
    Batch(Arc<Broadcast>),
    /// The source ended: close every window.
    Flush,
    /// Hand over the closed windows' partials (several workers: the coordinator merges and writes them).
    TakeClosed,
    Checkpoint,
}

enum Reply {
    Described(Described),
    Rewound,
    /// Whether windows closed since the last checkpoint, and the bytes of their computed statistics.
    Processed {
        closed: bool,
        closed_bytes: usize,
    },
    Checkpointed(ShardReport),
    /// The closed windows' partials, with the seconds each took to compute.
    Closed(Vec<(ClosedOutput, f64)>),
}

/// What a restored shard holds.
struct Described {
    resume: ResumeOffsets,
    decoder: crate::ingest::DecoderState,
    dead_letters: BTreeMap<String, u64>,
    /// Its operator's clocks, watermark and counters.
    clock: crate::window::operator::OperatorSnapshot,
}

/// What one shard's checkpoint reports.
struct ShardReport {
    windows_closed: u64,
    window_close_seconds: Vec<f64>,
    counters: WindowCounters,
    watermark_ms: i64,
    dead_letters: BTreeMap<String, u64>,
    dead_letter_failures: u64,
}

/// A shard run on the coordinator's thread (one worker) or on its own.
enum Worker {
    Inline {
        shard: Box<Shard>,
        /// An order given and not yet run: it runs while the next batch decodes, or at `recv`.
        order: Option<Order>,
        /// The answer to the last order, until `recv` takes it.
        reply: Option<anyhow::Result<Reply>>,
    },
    Thread {
        orders: std::sync::mpsc::SyncSender<Order>,
        replies: std::sync::mpsc::Receiver<anyhow::Result<Reply>>,
        handle: std::thread::JoinHandle<()>,
        index: usize,
    },
}

impl Worker {
    fn inline(shard: Shard) -> Worker {
        Worker::Inline { shard: Box::new(shard), order: None, reply: None }
    }

    /// Whether this is a worker on the reader's thread with an order to run.
    fn holds_order(&self) -> bool {
        matches!(self, Worker::Inline { order: Some(_), .. })
    }

    /// Runs the order a worker on the reader's thread was given (a thread of its own runs it at once).
    fn run_order(&mut self) {
        if let Worker::Inline { shard, order, reply } = self {
            if let Some(order) = order.take() {
                *reply = Some(shard.handle(order));
            }
        }
    }

    fn spawn(mut shard: Shard) -> anyhow::Result<Worker> {
        let (orders, inbox) = std::sync::mpsc::sync_channel::<Order>(1);
        let (outbox, replies) = std::sync::mpsc::sync_channel(1);
        let index = shard.index;
        let handle = std::thread::Builder::new().name(format!("ultr-shard-{index}")).spawn(move || {
            for order in inbox {
                if outbox.send(shard.handle(order)).is_err() {
                    break;
                }
            }
        })?;
        Ok(Worker::Thread { orders, replies, handle, index })
    }

    fn send(&mut self, order: Order) -> anyhow::Result<()> {
        match self {
            Worker::Inline { order: slot, reply, .. } => {
                *reply = None;
                *slot = Some(order);
                Ok(())
            }
            Worker::Thread { orders, index, .. } => orders.send(order).map_err(|_| anyhow::anyhow!("ingest worker {index} stopped")),
        }
    }

    fn recv(&mut self) -> anyhow::Result<Reply> {
        match self {
            Worker::Inline { .. } => {
                self.run_order();
                let Worker::Inline { reply, .. } = self else { unreachable!() };
                reply.take().unwrap_or_else(|| Err(anyhow::anyhow!("no order was given")))
            }
            Worker::Thread { replies, index, .. } => {
                replies.recv().map_err(|_| anyhow::anyhow!("ingest worker {index} stopped"))?.with_context(|| format!("ingest worker {index}"))
            }
        }
    }

    fn join(self) {
        if let Worker::Thread { orders, handle, .. } = self {
            drop(orders);
            let _ = handle.join();
        }
    }
}

/// One shard of a run: its state, window operator, open windows, and (shard 0) the dead-letter
/// output, with what the next checkpoint owes the state.
struct Shard {
    index: usize,
    shards: usize,
    config: CoreConfig,
    store: StateStore,
    operator: WindowOperator,
    open: OpenWindows,
    dead: Option<DeadLetterSink>,
    dead_rotation: (u64, usize),
    dead_letters: BTreeMap<String, u64>,
    runtime: Runner,
    pending: Pending,
    resume: ResumeOffsets,
    /// Offsets this shard's state already covered when restored; records below them are skipped.
    covered: shards::Covered,
    decoder: crate::ingest::DecoderState,
}

impl Shard {
    /// Everything restored from the shard's manifest. Shard 0 writes the dead letters (to
    /// `dead_letter_dir` when the config names no output).
    fn restore(context: &PipelineContext, config: &CoreConfig, dir: &Path, dead_letter_dir: &Path, index: usize, shards: usize) -> anyhow::Result<Shard> {
        let spec = config.window.spec().map_err(|e| anyhow::anyhow!("pipeline config: {e}"))?;
        let mut store = StateStore::open(dir, &config.source_identity, spec, config.holdout)?;
        let manifest = store.manifest().clone();
        let operator =
            WindowOperator::restore(spec, manifest.operator.clone(), store.open_filters()?).with_max_clock_jump(Some(config.window.max_clock_jump_ms()));
        let open = OpenWindows::new(context.statements().clone(), config.window.reduce_rows, config.holdout, config.window.statistic_bounds())
            .restore(store.open_partials()?)?;
        let dead = if index == 0 { Some(open_dead_letters(config, dead_letter_dir, manifest.dead_letter_file_bytes)?) } else { None };
        if let Some(dead) = &dead {
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
        }
        let covered = shards::Covered::new(manifest.resume.clone());
        Ok(Shard {
            index,
            shards,
            config: config.clone(),
            store,
            operator,
            open,
            dead,
            dead_rotation: dead_letter_rotation(config),
            dead_letters: manifest.dead_letters.clone(),
            runtime: context.runner("ultr-pipeline")?,
            pending: Pending::default(),
            resume: manifest.resume.clone(),
            covered,
            decoder: manifest.decoder.clone(),
        })
    }

    fn handle(&mut self, order: Order) -> anyhow::Result<Reply> {
        match order {
            Order::Describe => Ok(Reply::Described(Described {
                resume: self.resume.clone(),
                decoder: self.decoder.clone(),
                dead_letters: self.dead_letters.clone(),
                clock: self.operator.snapshot(),
            })),
            Order::Rewind(clock) => {
                self.operator.rewind_clock(&clock);
                Ok(Reply::Rewound)
            }
            Order::Batch(b) => {
                self.process(&b)?;
                Ok(self.processed())
            }
            Order::Flush => {
                let closed = self.operator.flush_all();
                self.close_windows(closed)?;
                Ok(self.processed())
            }
            Order::TakeClosed => {
                self.pending.closed_bytes = 0;
                Ok(Reply::Closed(std::mem::take(&mut self.pending.closed)))
            }
            Order::Checkpoint => self.checkpoint().map(Reply::Checkpointed),
        }
    }

    fn processed(&self) -> Reply {
        Reply::Processed { closed: !self.pending.closed.is_empty(), closed_bytes: self.pending.closed_bytes }
    }

    /// Computes the windows that closed (finished, or a shard's merged partial), which frees their
    /// buffers and partials; the next checkpoint writes them.
    fn close_windows(&mut self, closed: Vec<ClosedWindow>) -> anyhow::Result<()> {
        for w in closed {
            let started = Instant::now();
            let (tables, keys) = if self.shards == 1 {
                (self.runtime.run(self.open.close(w.start))?, None)
            } else {
                let (tables, keys) = self.runtime.run(self.open.close_partial(w.start))?;
                (tables, Some(keys))
            };
            self.pending.closed_bytes += tables.iter().flat_map(|(_, b)| b.iter()).map(|b| b.get_array_memory_size()).sum::<usize>();
            self.pending.closed.push((ClosedOutput { start_ms: w.start, end_ms: w.end, tables, keys }, started.elapsed().as_secs_f64()));
        }
        Ok(())
    }

    /// One batch: the dead letters (shard 0), this shard's sessions into windows, every session's
    /// time into the clocks, and the windows that closed computed.
    fn process(&mut self, b: &Broadcast) -> anyhow::Result<()> {
        let now = Instant::now();
        for key in &b.assigned {
            self.operator.register_partition(key, now);
        }
        for key in &b.behind {
            self.operator.hold_partition(key, now);
        }
        let batch = &b.batch;
        if let Some(dead) = self.dead.as_mut() {
            for letter in &batch.dead_letters {
                // A lookup that leaves `covered` as it is: the letters of a batch come before its
                // sessions, and a letter past the crash point must not end the skipping of the
                // sessions before it (they were counted again as duplicates: the kill test, tests/deployment/kill_restart.rs).
                if self.covered.holds(&letter.position.stream, letter.position.partition, letter.position.offset) {
                    continue;
                }
                dead.write(letter)?;
                *self.dead_letters.entry(letter.reason.as_str().to_string()).or_default() += 1;
            }
        }
        let roles: Vec<Role> = batch
            .origins
            .iter()
            .zip(&b.owners)
            .map(|(o, owner)| {
                if self.covered.skip(&o.stream, o.partition, o.offset) {
                    Role::Covered
                } else if *owner as usize == self.index || self.shards == 1 {
                    Role::Mine
                } else {
                    Role::Others
                }
            })
            .collect();
        let out = self.operator.process_shard(batch, now, |i| roles[i]);
        for (start, rows) in &out.added {
            self.runtime.run(self.open.add(*start, rows))?;
        }
        self.pending.add(out.admitted, out.late, &out.closed);
        self.close_windows(out.closed)?;
        self.resume.merge(&batch.resume);
        self.decoder = b.batch.decoder.clone();
        Ok(())
    }

    /// Writes one checkpoint: dead letters first, then the state that counts them, with the windows
    /// closed since the last one.
    fn checkpoint(&mut self) -> anyhow::Result<ShardReport> {
        if let Some(dead) = &mut self.dead {
            dead.flush()?;
        }
        let write_started = Instant::now();
        let (closed, compute_seconds): (Vec<ClosedOutput>, Vec<f64>) = std::mem::take(&mut self.pending.closed).into_iter().unzip();
        self.pending.closed_bytes = 0;
        let n_closed = closed.len();
        let open_partials = self.runtime.run(self.open.checkpoint())?;
        let dead_letter_file_bytes = match &self.dead {
            Some(dead) => dead.file_len()?,
            None => None,
        };
        self.store.checkpoint(Checkpoint {
            closed,
            open_partials,
            admitted: std::mem::take(&mut self.pending.admitted),
            late: std::mem::take(&mut self.pending.late),
            operator: self.operator.snapshot(),
            open_windows: self.operator.open_starts(),
            resume: self.resume.clone(),
            dead_letters: self.dead_letters.clone(),
            dead_letter_file_bytes,
            retention_ms: Some(self.config.state.retention_ms()),
            decoder: self.decoder.clone(),
        })?;
        let mut dead_letter_failures = 0;
        if let Some(dead) = &mut self.dead {
            if dead.rotate_if_larger(self.dead_rotation.0, self.dead_rotation.1)? {
                self.store.record_dead_letter_file_bytes(0)?;
            }
            dead_letter_failures = dead.failed();
        }
        Ok(ShardReport {
            windows_closed: n_closed as u64,
            // Each window's own computation, and its share of the checkpoint that wrote it.
            window_close_seconds: {
                let share = write_started.elapsed().as_secs_f64() / n_closed.max(1) as f64;
                compute_seconds.iter().map(|s| s + share).collect()
            },
            counters: self.operator.counters().clone(),
            watermark_ms: self.operator.watermark(),
            dead_letters: self.dead_letters.clone(),
            dead_letter_failures,
        })
    }
}

/// What the next checkpoint owes the state.
#[derive(Default)]
struct Pending {
    admitted: Vec<(i64, u64)>,
    late: Vec<RecordBatch>,
    /// Windows closed since the last checkpoint, computed, with the seconds their computation took.
    /// Until it writes them a crash replays their sessions from the last checkpoint's offsets, where
    /// they are still open, so they close again: nothing is lost or counted twice.
    closed: Vec<(ClosedOutput, f64)>,
    /// Arrow bytes of `closed`.
    closed_bytes: usize,
}

impl Pending {
    fn add(&mut self, admitted: Vec<(i64, u64)>, late: Vec<RecordBatch>, closed: &[ClosedWindow]) {
        // A window that closed needs no filter entries.
        let closed_starts: Vec<i64> = closed.iter().map(|c| c.start).collect();
        self.admitted.retain(|(s, _)| !closed_starts.contains(s));
        self.admitted.extend(admitted.into_iter().filter(|(s, _)| !closed_starts.contains(s)));
        self.late.extend(late);
    }
}
