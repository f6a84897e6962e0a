//! `ultr run`: the always-on service. The streaming loop (source → decode → windows → state), a
//! monitor thread fed each checkpoint's manifest, `/metrics`, `/healthz`, `/livez` and `/readyz`
//! over HTTP, scheduled retraining, and a graceful stop on SIGTERM/SIGINT (checkpoint, commit,
//! exit 0).

pub mod config;
pub mod http;
pub mod schedule;
pub mod status_page;

use parking_lot::{Condvar, Mutex};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::PipelineConfig;
use crate::monitor::metrics::Metrics;
use crate::monitor::Monitor;
use crate::pipeline::{Observer, RunReport};
use http::Health;
use ultr_core::sources::SourceHealth;
use ultr_core::state::{Manifest, StateStore};

pub struct ServiceOptions {
    pub state_dir: PathBuf,
    /// Overrides `[service] listen`.
    pub listen: Option<String>,
    /// Exit when a bounded source ends instead of serving until SIGTERM.
    pub exit_when_done: bool,
}

/// `[eval] qrels`, read once at start: an unreadable or malformed file stops the service, naming
/// the key, the file and the line.
fn judged_labels(config: &PipelineConfig) -> anyhow::Result<Option<ultr_train::eval::judged::Qrels>> {
    use anyhow::Context;
    config.eval.qrels.as_deref().map(|p| ultr_train::eval::judged::Qrels::read(p).context("key `eval.qrels`")).transpose()
}

/// A flag set by SIGTERM or SIGINT. The handlers are installed before this returns, so a signal
/// sent once the service reports it is listening is never lost.
pub fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // The handlers are installed (on the listening thread's runtime) before the thread is told to wait.
    let (installed, ready) = std::sync::mpsc::channel::<std::io::Result<()>>();
    std::thread::Builder::new().name("ultr-signals".into()).spawn(move || {
        let listen = ultr_core::context::run_here(async {
            let handlers = signal(SignalKind::terminate()).and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
            match handlers {
                Ok((mut term, mut int)) => {
                    let _ = installed.send(Ok(()));
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                Err(e) => {
                    let _ = installed.send(Err(e));
                }
            }
        });
        if listen.is_ok() {
            flag.store(true, Ordering::SeqCst);
        }
    })?;
    ready.recv().map_err(|_| anyhow::anyhow!("the signal thread ended before installing its handlers"))??;
    Ok(stop)
}

/// Hands the newest checkpoint to the monitor thread without waiting: a slow monitor only skips
/// intermediate checkpoints, it never holds up ingest (and so never `max.poll.interval.ms`).
#[derive(Default)]
struct MonitorInbox {
    latest: Mutex<Option<Manifest>>,
    wake: Condvar,
}

/// The monitor on its own thread: identifiability, cumulative views and residual scoring of the
/// newest manifest; it also re-checks every few seconds, so a newly promoted model is scored. After
/// each look it rests as long as the look took, so it never takes more than half of one core.
struct MonitorThread {
    inbox: Arc<MonitorInbox>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl MonitorThread {
    fn start(mut monitor: Monitor, state_dir: PathBuf) -> anyhow::Result<MonitorThread> {
        let inbox = Arc::new(MonitorInbox::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (inbox2, stop2) = (inbox.clone(), stop.clone());
        let handle = std::thread::Builder::new().name("ultr-monitor".into()).spawn(move || {
            let mut current: Option<Manifest> = None;
            while !stop2.load(Ordering::SeqCst) {
                {
                    let mut slot = inbox2.latest.lock();
                    if slot.is_none() {
                        let _ = inbox2.wake.wait_for(&mut slot, Duration::from_secs(2));
                    }
                    if let Some(m) = slot.take() {
                        current = Some(m);
                    }
                }
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                if let Some(manifest) = &current {
                    let started = std::time::Instant::now();
                    // Errors are counted by observe_recorded (ultr_monitor_errors_total).
                    let _ = monitor.observe_recorded(&state_dir, manifest);
                    // Rest as long as the look took (one with nothing new takes microseconds), at most a
                    // minute: the monitor takes at most half of one core however fast windows close, and
                    // the windows that close meanwhile are scored together at the next look.
                    let rest_until = std::time::Instant::now() + started.elapsed().min(Duration::from_secs(60));
                    while !stop2.load(Ordering::SeqCst) && std::time::Instant::now() < rest_until {
                        std::thread::sleep(Duration::from_millis(50).min(rest_until.saturating_duration_since(std::time::Instant::now())));
                    }
                }
            }
        })?;
        Ok(MonitorThread { inbox, stop, handle: Some(handle) })
    }

    fn post(&self, manifest: Manifest) {
        *self.inbox.latest.lock() = Some(manifest);
        self.inbox.wake.notify_one();
    }
}

impl Drop for MonitorThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.inbox.wake.notify_one();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The service's hooks into the ingest loop: progress and the source's health for `/healthz` and
/// `/metrics`; each durable checkpoint (one instance) or merged view (scale-out) to the monitor; the
/// compactor lease to the schedule.
struct ServiceObserver<'a> {
    counters: &'a mut Monitor,
    monitor: &'a MonitorThread,
    health: Arc<Health>,
    stop: Arc<AtomicBool>,
    /// Scale-out: whether this instance holds the compactor lease (it alone trains); its partition
    /// tasks checkpoint on their own, so the instance counts as checkpointing while its loop turns.
    leader: Option<Arc<AtomicBool>>,
}

impl Observer for ServiceObserver<'_> {
    fn on_restored(&mut self, source: Option<Arc<SourceHealth>>) {
        // A file or the simulator has no connection to lose: `ultr_source_up` stays absent for them.
        *self.health.source.lock() = source;
        self.health.ready.store(true, Ordering::SeqCst);
    }

    fn on_progress(&mut self, report: &RunReport) {
        let now = chrono::Utc::now().timestamp_millis();
        self.health.last_progress_ms.store(now, Ordering::Relaxed);
        if self.leader.is_some() {
            self.health.last_checkpoint_ms.store(report.last_checkpoint_unix_ms.max(now), Ordering::Relaxed);
        }
        self.counters.ingest_live(report);
        self.health.export_source(&self.counters.metrics);
    }

    fn after_checkpoint(&mut self, store: &StateStore, report: &RunReport) {
        self.health.last_checkpoint_ms.store(report.last_checkpoint_unix_ms, Ordering::Relaxed);
        self.counters.ingest(report);
        self.monitor.post(store.manifest().clone());
    }

    fn on_merged(&mut self, merged_dir: &std::path::Path, report: &RunReport) {
        self.counters.ingest(report);
        if let Ok(manifest) = ultr_core::state::read_manifest(merged_dir) {
            self.monitor.post(manifest);
        }
    }

    fn on_lease(&mut self, held: bool) {
        if let Some(leader) = &self.leader {
            leader.store(held, Ordering::SeqCst);
        }
    }

    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Tells the status page's board where the stream comes from and where its dead letters go.
fn describe_stream(metrics: &Metrics, config: &PipelineConfig, state_dir: &std::path::Path, scaled: bool) {
    use crate::config::DeadLetterConfig;
    let source = config.source.kind().describe(&config.source_context());
    let (file, target) = match &config.dead_letter {
        Some(DeadLetterConfig::File { path, .. }) => (Some(path.clone()), format!("file {}", path.display())),
        Some(DeadLetterConfig::Kafka { topic, .. }) => (None, format!("Kafka topic {topic}")),
        None if scaled => (None, "each partition task's state folder".to_string()),
        None => {
            let path = state_dir.join("dead-letters.jsonl");
            (Some(path.clone()), format!("file {}", path.display()))
        }
    };
    metrics.board.update(|b| {
        b.source = source;
        b.dead_letter_file = file;
        b.dead_letter_target = target;
    });
}

/// Puts the models directory's newest checkpoints on the board, so the page lists trainings from
/// before a restart and from an external `ultr train` (this process adds its own as they finish).
fn list_earlier_trainings(metrics: &Metrics, models_dir: &std::path::Path) {
    if !models_dir.is_dir() {
        return;
    }
    let Ok(list) = ultr_train::checkpoint::ModelStore::open(models_dir).and_then(|s| s.list()) else { return };
    for info in list.iter().rev().take(crate::monitor::board::TRAININGS_KEPT).rev() {
        let finished = chrono::DateTime::parse_from_rfc3339(&info.created_at).map_or(0.0, |t| t.timestamp_millis() as f64 / 1000.0);
        metrics.board.push_training(crate::monitor::board::TrainingCard {
            finished_unix_s: finished,
            id: Some(info.id.clone()),
            result: if info.decision.promoted { "promoted" } else { "rejected" }.into(),
            reason: info.decision.reason.clone(),
            theta: info.theta.clone(),
            seconds: info.fit.get("seconds").and_then(|s| s.as_f64()).unwrap_or(0.0),
            warm_start: info.parent.is_some(),
            combination: info.fit.get("logged_order_combination").and_then(|c| serde_json::from_value(c.clone()).ok()),
        });
    }
}

/// After the source ended (and unless SIGTERM already came): keep serving `/metrics`, `/healthz` and
/// the schedule until SIGTERM.
fn idle_until_stopped(stop: &AtomicBool, health: &Health, why: &str) {
    if stop.load(Ordering::SeqCst) {
        return;
    }
    eprintln!("ultr run: {why}");
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        // The source is done: the loop is idle by design, not stuck.
        let now = chrono::Utc::now().timestamp_millis();
        health.last_progress_ms.store(now, Ordering::Relaxed);
        health.last_checkpoint_ms.store(now, Ordering::Relaxed);
    }
}

/// Runs the service until SIGTERM (or the end of a bounded source with `exit_when_done`). With
/// `[state.object_store]` this instance ingests its share of the group's partitions; the monitor
/// and the schedule then read the merged view (`<state>/merged`), only the compactor-lease holder
/// trains, and models go to `[train] models_dir`, else `<state>/models`.
pub fn run(config: &PipelineConfig, opts: &ServiceOptions) -> anyhow::Result<RunReport> {
    let scaled = config.state.object_store.is_some();
    let stop = stop_on_signals()?;
    let mut config = config.clone();
    // What the monitor and the schedule read: the state, or the scale-out group's merged view.
    let view = if scaled {
        config.train.models_dir.get_or_insert_with(|| opts.state_dir.join("models"));
        crate::scale_out::merged_dir(&opts.state_dir)
    } else {
        opts.state_dir.clone()
    };
    // One pipeline context for the ingest, the monitor and scheduled training: one memory pool.
    let context = config.context();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(60_000, config.state.checkpoint_interval().as_millis() as i64 * 6 + 60_000));
    let listen = opts.listen.clone().unwrap_or_else(|| config.service.listen.clone());
    // The monitors restore series from the state (the current model's time) before the first scrape
    // can see them: a scrape between serving and restoring read 0 and TrainingStale saw a 56-year-old model.
    let monitor = MonitorThread::start(Monitor::new(&context, metrics.clone(), &config, &view).judging(judged_labels(&config)?), view.clone())?;
    let mut counters = Monitor::new(&context, metrics.clone(), &config, &view);
    describe_stream(&metrics, &config, &opts.state_dir, scaled);
    let models_dir = ultr_train::models_dir(&config.train, &view);
    list_earlier_trainings(&metrics, &models_dir);
    let server = http::serve(&listen, metrics.clone(), health.clone())?;
    eprintln!(
        "ultr run: open the status page at http://{}/ (metrics at http://{}/metrics, health at http://{}/healthz); {} in {}",
        server.addr,
        server.addr,
        server.addr,
        if scaled { "merged view" } else { "state" },
        view.display()
    );
    let leader = scaled.then(|| Arc::new(AtomicBool::new(false)));
    let scheduler = schedule::Scheduler::start(&context, &config, view.clone(), metrics.clone(), leader.clone())?;
    if let Some(s) = &config.train.schedule {
        eprintln!("ultr run: retraining on schedule {s:?} (models in {})", models_dir.display());
    }
    let mut observer = ServiceObserver { counters: &mut counters, monitor: &monitor, health: health.clone(), stop: stop.clone(), leader };
    if scaled {
        health.ready.store(true, Ordering::SeqCst);
    }
    let report = crate::pipeline::ingest(&context, &config, &opts.state_dir, &mut observer)?.report;
    if !opts.exit_when_done {
        let why = if scaled { "every partition task ended" } else { "the source ended" };
        idle_until_stopped(&stop, &health, &format!("{why}; serving metrics and the schedule until SIGTERM"));
    }
    health.stopping.store(true, Ordering::SeqCst);
    drop(scheduler); // cancels a training in progress and waits for it
    drop(monitor);
    if scaled {
        eprintln!("ultr run: stopped; partition states are in the object store and offsets are committed");
    } else {
        eprintln!("ultr run: stopped; state is durable and offsets are committed");
    }
    Ok(report)
}
