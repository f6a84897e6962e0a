//! Scale-out: several instances in one Kafka consumer group share a topic's partitions, and an
//! object store holds every partition's state. The group decides who owns which partition
//! (cooperative-sticky); the instance runs one partition task per owned partition — the usual
//! pipeline (`pipeline::run_with_source`) over that partition alone, with its own state directory
//! copied to the store before its offsets are committed. On revocation a task checkpoints, copies
//! and stops; on assignment a task restores the partition's state from the store and reads from
//! its offsets. The topic must be keyed by `query_id`, so π(d,k|q) of a query is one partition's.
//!
//! One instance at a time holds the compactor lease (`state::lease`): it merges the partitions'
//! windows into the merged view (`state::merged`) and copies it to the store; the others fetch it.
//! Training, identifiability and the monitor read the merged view, `<state>/merged`.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::CoreConfig;
use crate::context::PipelineContext;
use crate::pipeline::{run_with_source, Observer, RunReport};
use crate::sources::kafka::{KafkaSource, KafkaSourceConfig};
use crate::sources::{RecordSource, ResumeOffsets, SourceHealth};
use crate::state::merged::{compact, CompactReport, MergeTarget};
use crate::state::remote::{partition_prefix, Fenced, Remote, Writer, MERGED_PREFIX, RECORD};
use crate::state::{lease, StateStore};

/// The merged view's folder under an instance's `--state` directory.
pub fn merged_dir(root: &Path) -> PathBuf {
    root.join("merged")
}

/// A running partition task.
struct Task {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<anyhow::Result<RunReport>>,
}

/// What the group callbacks, the tasks and the main loop share.
struct Shared {
    context: PipelineContext,
    config: CoreConfig,
    kafka: KafkaSourceConfig,
    root: PathBuf,
    remote: Arc<Remote>,
    stop: Arc<AtomicBool>,
    tasks: Mutex<BTreeMap<(String, i32), Task>>,
    /// Offsets whose state is in the store: the group member commits them.
    durable: Mutex<ResumeOffsets>,
    /// Reports of finished tasks, and the first error of a failed one.
    finished: Mutex<Vec<RunReport>>,
    failure: Mutex<Option<String>>,
    /// Partitions whose task was fenced off: restarted while the group still assigns them here.
    fenced: Mutex<Vec<(String, i32)>>,
    last_rebalance: Mutex<Instant>,
    /// The group member's view of the brokers (what `ultr_source_up` and `/healthz` report).
    health: Arc<SourceHealth>,
    /// The running tasks' reports so far: the instance's counters include them while they run
    /// (they were counted only when a task ended, so a busy instance exported almost nothing).
    /// Moved into `finished` when the task ends, under `finished`'s lock.
    live: Mutex<BTreeMap<(String, i32), RunReport>>,
}

impl Shared {
    fn start(self: &Arc<Self>, topic: &str, partition: i32) {
        let key = (topic.to_string(), partition);
        let mut tasks = self.tasks.lock();
        if tasks.contains_key(&key) {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, task_stop, topic_name) = (self.clone(), stop.clone(), topic.to_string());
        let spawned = std::thread::Builder::new().name(format!("ultr-{topic}-{partition}")).spawn(move || shared.run_task(&topic_name, partition, task_stop));
        match spawned {
            Ok(handle) => {
                tracing::info!(topic, partition, "partition task started");
                tasks.insert(key, Task { stop, handle });
            }
            Err(e) => *self.failure.lock() = Some(format!("starting the task of {topic}[{partition}]: {e}")),
        }
    }

    /// Stops the tasks of `parts` (each checkpoints and copies its state first, all at once) and
    /// waits for them.
    fn release(&self, parts: &[(String, i32)]) {
        let tasks: Vec<((String, i32), Task)> = {
            let mut map = self.tasks.lock();
            parts.iter().filter_map(|k| map.remove(k).map(|t| (k.clone(), t))).collect()
        };
        for (_, task) in &tasks {
            task.stop.store(true, Ordering::SeqCst);
        }
        for ((topic, partition), task) in tasks {
            self.reap(&topic, partition, task.handle);
            tracing::info!(topic, partition, "partition released");
        }
    }

    fn reap(&self, topic: &str, partition: i32, handle: JoinHandle<anyhow::Result<RunReport>>) {
        let joined = handle.join();
        {
            // The task's counts move from live to finished at once: a reader never sees them twice or not at all.
            let mut finished = self.finished.lock();
            let live = self.live.lock().remove(&(topic.to_string(), partition));
            match &joined {
                Ok(Ok(report)) => finished.push(report.clone()),
                _ => finished.extend(live),
            }
        }
        match joined {
            Ok(Ok(report)) => {
                tracing::info!(topic, partition, records = report.records, "partition task ended");
            }
            Ok(Err(e)) if e.chain().any(|c| c.is::<Fenced>()) => {
                // Another instance took the partition over while this one still held it (a
                // rebalance answered late): the newer owner's state stands. If the group gives (or
                // still gives) the partition to this instance, the main loop starts a task again.
                tracing::warn!(topic, partition, "partition task fenced off: {e:#}");
                self.fenced.lock().push((topic.to_string(), partition));
            }
            Ok(Err(e)) => {
                let mut failure = self.failure.lock();
                failure.get_or_insert_with(|| format!("partition task {topic}[{partition}]: {e:#}"));
            }
            Err(_) => {
                let mut failure = self.failure.lock();
                failure.get_or_insert_with(|| format!("partition task {topic}[{partition}] panicked"));
            }
        }
    }

    fn run_task(&self, topic: &str, partition: i32, stop: Arc<AtomicBool>) -> anyhow::Result<RunReport> {
        let dir = self.root.join("partitions").join(format!("{topic}-{partition}"));
        let prefix = partition_prefix(topic, partition);
        // The store, not this machine's disk, is the truth: another instance may have moved the
        // partition on since this one last held it.
        let (writer, restored) = self.remote.take_over(&prefix, &dir).with_context(|| format!("restoring {topic}[{partition}] from {}", self.remote.url))?;
        tracing::info!(topic, partition, restored, "partition state ready");
        let mut observer = TaskObserver { shared: self, writer, stop, global: self.stop.clone(), key: (topic.to_string(), partition) };
        let (kafka, health) = (self.kafka.clone(), self.health.clone());
        let open = move |resume: &ResumeOffsets| -> anyhow::Result<Box<dyn RecordSource + Send>> {
            Ok(Box::new(KafkaSource::assigned(&kafka, resume.clone(), topic, partition, health.clone())?))
        };
        // Partition tasks are this instance's parallelism: each is one worker over its partition.
        let core = CoreConfig { workers: 1, ..self.config.clone() };
        run_with_source(&self.context, &core, &dir, &mut observer, &open)
    }
}

/// A partition task's hooks: copy each checkpoint to the store, then hand its offsets to the
/// group member to commit; stop on revocation or on the instance's stop.
struct TaskObserver<'a> {
    shared: &'a Shared,
    key: (String, i32),
    writer: Writer,
    stop: Arc<AtomicBool>,
    global: Arc<AtomicBool>,
}

impl Observer for TaskObserver<'_> {
    fn on_progress(&mut self, report: &RunReport) {
        let mut live = report.clone();
        live.window_close_seconds.clear(); // observed by no one in scale-out; not worth the copies
        self.shared.live.lock().insert(self.key.clone(), live);
    }

    fn persist(&mut self, store: &StateStore) -> anyhow::Result<()> {
        self.shared.remote.push(&mut self.writer, store.dir())?;
        self.shared.durable.lock().merge(&store.manifest().resume);
        Ok(())
    }

    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.global.load(Ordering::SeqCst)
    }
}

/// The group member's callbacks: start a task per assigned partition, stop it on revocation.
/// The member itself reads nothing (its partitions are paused); the tasks read.
struct GroupContext {
    shared: Arc<Shared>,
}

impl ClientContext for GroupContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let (kind, down) = crate::sources::kafka::classify(&error);
        tracing::warn!(kind, "Kafka: {error} ({reason}); retrying");
        self.shared.health.error(kind, down);
    }

    /// librdkafka's own lines go to the instance's log under target `ultr::librdkafka` (the group
    /// protocol step by step with the property `debug = "cgrp"` and `ULTR_LOG=ultr::librdkafka=debug`).
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                tracing::error!(target: "ultr::librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "ultr::librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::info!(target: "ultr::librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Debug => tracing::debug!(target: "ultr::librdkafka", facility, "{message}"),
        }
    }
}

impl ConsumerContext for GroupContext {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let cooperative = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let parts: Vec<(String, i32)> = tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
        *self.shared.last_rebalance.lock() = Instant::now();
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let assigned = if cooperative { consumer.incremental_assign(tpl) } else { consumer.assign(tpl) };
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!("pausing the group member's partitions: {e}");
                }
                for (topic, partition) in &parts {
                    tracing::info!(topic, partition, "assigned");
                    self.shared.start(topic, *partition);
                }
                assigned
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // Checkpoint and copy before the partition goes to another instance.
                for (topic, partition) in &parts {
                    tracing::info!(topic, partition, "revoked");
                }
                self.shared.release(&parts);
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::warn!("rebalance error {other:?}; releasing every partition");
                let keys: Vec<(String, i32)> = self.shared.tasks.lock().keys().cloned().collect();
                self.shared.release(&keys);
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            tracing::warn!("applying the rebalance: {e}");
        }
    }
}

/// The merged view's target settings for `config`.
pub fn merge_target(context: &PipelineContext, config: &CoreConfig) -> anyhow::Result<MergeTarget> {
    Ok(MergeTarget {
        source: config.source_identity.clone(),
        window: config.window.spec().map_err(|e| anyhow::anyhow!("pipeline config: {e}"))?,
        holdout: config.holdout,
        retention_ms: Some(config.state.retention_ms()),
        bounds: config.window.statistic_bounds(),
        threads: 1,
        context: context.clone(),
    })
}

/// Copies every partition's closed windows from the store into `<root>/compact/` and merges them
/// into `<root>/merged`, continuing the merged view in the store; then copies it to the store.
/// `writer` is the compactor's hold on the merged copy: taken over (fetching the merged view) when
/// None, kept across rounds while this instance holds the lease, dropped when fenced.
pub fn compact_once(
    context: &PipelineContext,
    config: &CoreConfig,
    remote: &Remote,
    root: &Path,
    writer: &mut Option<Writer>,
) -> anyhow::Result<CompactReport> {
    let started = Instant::now();
    let cache = root.join("compact");
    let mut parts = Vec::new();
    for prefix in partition_prefixes(remote)? {
        let dir = cache.join(prefix.trim_start_matches("partitions/").replace('/', "-"));
        remote.sync_windows(&prefix, &dir)?;
        parts.push(dir);
    }
    let merged = merged_dir(root);
    if writer.is_none() {
        *writer = Some(remote.take_over(MERGED_PREFIX, &merged)?.0); // continues the last compactor's view
    }
    let mut report = compact(&parts, &merged, &merge_target(context, config)?)?;
    if let Err(e) = remote.push(writer.as_mut().expect("taken over above"), &merged) {
        *writer = None;
        return Err(e);
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The prefixes holding a partition's state (`partitions/<topic>/<partition>`).
pub fn partition_prefixes(remote: &Remote) -> anyhow::Result<Vec<String>> {
    let mut out: Vec<String> = remote
        .list("partitions")?
        .into_iter()
        .filter_map(|p| p.strip_suffix(&format!("/{RECORD}")).map(str::to_string))
        .filter(|p| p.split('/').count() == 3)
        .collect();
    out.sort();
    Ok(out)
}

/// `ultr compact`: one merge of the store's partition states into `root`'s merged view, holding the
/// compactor lease for it. Waits up to `wait` for an instance that holds the lease; after that the
/// error names the holder. The lease is released whether or not the merge succeeds.
pub fn compact_holding_the_lease(
    context: &PipelineContext,
    config: &CoreConfig,
    store: &crate::state::remote::ObjectStoreConfig,
    root: &Path,
    wait: Duration,
) -> anyhow::Result<CompactReport> {
    let ttl = store.lease_ttl.ms();
    let remote = Remote::open(store, context)?;
    let me = instance_id();
    let deadline = Instant::now() + wait;
    while !lease::try_acquire(&remote, &me, ttl, chrono::Utc::now().timestamp_millis())? {
        if Instant::now() >= deadline {
            let holder = lease::holder(&remote, chrono::Utc::now().timestamp_millis())?;
            bail!("the compactor lease in {} is held by {holder:?}; it compacts, or try again after its lease_ttl", remote.url);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let result = crate::state::lock::DirLock::acquire(root, "state directory").and_then(|_lock| compact_once(context, config, &remote, root, &mut None));
    lease::release(&remote, &me)?;
    result
}

/// A name for this instance in the lease.
pub fn instance_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "host".into());
    format!("{host}-{}-{}", std::process::id(), chrono::Utc::now().timestamp_millis())
}

/// The instance's counts: tasks that ended (drained into `ended`) plus the running ones so far.
/// Lag and watermark in `total` are the main loop's own and stay.
fn count(total: &mut RunReport, ended: &mut RunReport, shared: &Shared) {
    let mut sum = {
        let mut finished = shared.finished.lock();
        for r in finished.drain(..) {
            add(ended, &r);
        }
        let mut sum = ended.clone();
        for r in shared.live.lock().values() {
            add(&mut sum, r);
        }
        sum
    };
    total.records = sum.records;
    total.windows_closed_this_run = sum.windows_closed_this_run;
    total.checkpoints = sum.checkpoints;
    total.counters = std::mem::take(&mut sum.counters);
    total.dead_letters = std::mem::take(&mut sum.dead_letters);
    total.last_checkpoint_unix_ms = total.last_checkpoint_unix_ms.max(sum.last_checkpoint_unix_ms);
    total.dead_letter_failures = sum.dead_letter_failures;
}

fn add(total: &mut RunReport, r: &RunReport) {
    total.records += r.records;
    total.windows_closed_this_run += r.windows_closed_this_run;
    total.checkpoints += r.checkpoints;
    let c = &mut total.counters;
    c.sessions += r.counters.sessions;
    c.impressions += r.counters.impressions;
    c.late_sessions += r.counters.late_sessions;
    c.late_impressions += r.counters.late_impressions;
    c.duplicate_sessions += r.counters.duplicate_sessions;
    c.repeated_items += r.counters.repeated_items;
    c.windows_closed += r.counters.windows_closed;
    for (k, v) in &r.dead_letters {
        *total.dead_letters.entry(k.clone()).or_default() += v;
    }
    total.last_checkpoint_unix_ms = total.last_checkpoint_unix_ms.max(r.last_checkpoint_unix_ms);
    total.dead_letter_failures += r.dead_letter_failures;
}

/// Runs this instance's share of the group until the instance is stopped, or — with
/// `idle_exit_ms` — until every task it ran has ended, the group has been quiet that long and the
/// store holds every partition of the topics finished (`unfinished`: read to its end, windows
/// closed), so an instance does not leave while a killed member's partitions still wait to be
/// reassigned, nor while a revoked partition's windows are still open.
/// The report sums the partition tasks this instance ran.
pub fn run(context: &PipelineContext, config: &CoreConfig, kafka: &KafkaSourceConfig, root: &Path, observer: &mut dyn Observer) -> anyhow::Result<RunReport> {
    let store_config = config.state.object_store.as_ref().context("scale-out needs `[state.object_store]`")?;
    let remote = Arc::new(Remote::open(store_config, context)?);
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let _lock = crate::state::lock::DirLock::acquire(root, "scale-out state directory")?;
    let me = instance_id();
    let shared = Arc::new(Shared {
        context: context.clone(),
        config: config.clone(),
        kafka: kafka.clone(),
        root: root.to_path_buf(),
        remote: remote.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        tasks: Mutex::new(BTreeMap::new()),
        durable: Mutex::new(ResumeOffsets::default()),
        finished: Mutex::new(Vec::new()),
        failure: Mutex::new(None),
        fenced: Mutex::new(Vec::new()),
        last_rebalance: Mutex::new(Instant::now()),
        health: Arc::new(SourceHealth::default()),
        live: Mutex::new(BTreeMap::new()),
    });
    observer.on_restored(Some(shared.health.clone()));
    let consumer = join_group(kafka, &shared)?;
    eprintln!("ultr: instance {me} joined group {:?} on {:?}; partition states in {}", kafka.group_id, kafka.topics, remote.url);

    let mut member = Member {
        context,
        config,
        root,
        remote: &remote,
        me: &me,
        consumer: &consumer,
        shared: &shared,
        compact_every: store_config.compact_interval.std().max(Duration::from_millis(1)),
        lease_ttl: store_config.lease_ttl.ms(),
        idle_exit: kafka.idle_exit_ms.map(Duration::from_millis),
        total: RunReport::default(),
        ended: RunReport::default(),
        committed: ResumeOffsets::default(),
        last_compaction: None,
        merged_writer: None,
        last_done_check: None,
        reported_unfinished: None,
        last_probe: None,
    };
    let result = member.serve(observer);
    // Stop every task (each checkpoints and copies its state), commit, leave the group.
    shared.stop.store(true, Ordering::SeqCst);
    let keys: Vec<(String, i32)> = shared.tasks.lock().keys().cloned().collect();
    shared.release(&keys);
    count(&mut member.total, &mut member.ended, &shared);
    commit_durable(&consumer, &shared, &mut member.committed);
    consumer.unsubscribe();
    result?;
    if let Some(f) = shared.failure.lock().take() {
        bail!(f);
    }
    // A last merge covers this instance's final checkpoints (when it holds the lease).
    let Member { mut total, mut merged_writer, lease_ttl, .. } = member;
    drop(consumer);
    compaction_round(context, config, &remote, root, &me, lease_ttl, &mut merged_writer).report(root, &mut total, observer);
    lease::release(&remote, &me)?;
    Ok(total)
}

/// Joins the consumer group: cooperative-sticky assignment, and no auto-commit (offsets are
/// committed once their state is durable in the store).
fn join_group(kafka: &KafkaSourceConfig, shared: &Arc<Shared>) -> anyhow::Result<BaseConsumer<GroupContext>> {
    let properties = crate::sources::secrets::resolve_properties(&kafka.properties).context("[source.kafka] properties")?;
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &kafka.brokers)
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("partition.assignment.strategy", "cooperative-sticky");
    for (k, v) in &properties {
        client.set(k, v);
    }
    // rdkafka drops librdkafka's lines below this level before they reach `GroupContext::log`.
    client.set_log_level(if tracing::enabled!(target: "ultr::librdkafka", tracing::Level::DEBUG) { RDKafkaLogLevel::Debug } else { RDKafkaLogLevel::Info });
    let consumer: BaseConsumer<GroupContext> =
        client.create_with_context(GroupContext { shared: shared.clone() }).context("creating the Kafka group member")?;
    let topics: Vec<&str> = kafka.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).with_context(|| format!("subscribing to {topics:?}"))?;
    Ok(consumer)
}

/// The partitions the group assigns to this member now.
fn assigned_partitions(consumer: &BaseConsumer<GroupContext>) -> Vec<(String, i32)> {
    consumer.assignment().map(|a| a.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect()).unwrap_or_default()
}

/// One instance's group membership while it serves: what its loop keeps between polls.
struct Member<'a> {
    context: &'a PipelineContext,
    config: &'a CoreConfig,
    root: &'a Path,
    remote: &'a Remote,
    me: &'a str,
    consumer: &'a BaseConsumer<GroupContext>,
    shared: &'a Arc<Shared>,
    compact_every: Duration,
    lease_ttl: i64,
    idle_exit: Option<Duration>,
    total: RunReport,
    /// What ended tasks did; `total` adds the running tasks' reports to it.
    ended: RunReport,
    committed: ResumeOffsets,
    last_compaction: Option<Instant>,
    merged_writer: Option<Writer>,
    last_done_check: Option<Instant>,
    reported_unfinished: Option<Vec<(String, i32, String)>>,
    last_probe: Option<Instant>,
}

impl Member<'_> {
    /// Polls the group until the observer stops it, a task fails, or (with `idle_exit`) every
    /// partition is read to its end.
    ///
    /// Compaction rounds run on a thread of their own, one at a time: a merge can take longer than
    /// `session.timeout.ms`, and a member that stops polling for that long misses the group's
    /// rebalances, is dropped, and holds every other member's join back meanwhile.
    fn serve(&mut self, observer: &mut dyn Observer) -> anyhow::Result<()> {
        let (context, config, remote, root, me, lease_ttl) = (self.context, self.config, self.remote, self.root, self.me, self.lease_ttl);
        std::thread::scope(|scope| {
            let mut round: Option<std::thread::ScopedJoinHandle<'_, (Round, Option<Writer>)>> = None;
            let result = loop {
                if round.as_ref().is_some_and(|r| r.is_finished()) {
                    let (done, writer) = round.take().expect("checked above").join().map_err(|_| anyhow::anyhow!("a compaction round panicked"))?;
                    self.merged_writer = writer;
                    done.report(root, &mut self.total, observer);
                    observer.on_lease(done.leader);
                }
                if round.is_none() && self.last_compaction.is_none_or(|t| t.elapsed() >= self.compact_every) {
                    self.last_compaction = Some(Instant::now());
                    self.total.lag = lag(self.consumer, self.shared);
                    let mut writer = self.merged_writer.take();
                    round = Some(scope.spawn(move || (compaction_round(context, config, remote, root, me, lease_ttl, &mut writer), writer)));
                }
                match self.poll_once(observer) {
                    Ok(false) => {}
                    Ok(true) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            // The round in flight finishes; its hold on the merged view serves the last round.
            if let Some(Ok((_, writer))) = round.map(|r| r.join()) {
                self.merged_writer = writer;
            }
            result
        })
    }

    /// One turn of the loop besides compaction: serves the group's callbacks (assignments start
    /// tasks, revocations stop them), commits durable offsets, and says whether to stop.
    fn poll_once(&mut self, observer: &mut dyn Observer) -> anyhow::Result<bool> {
        if let Some(Err(e)) = self.consumer.poll(Duration::from_millis(100)) {
            tracing::debug!("group member: {e}");
        }
        if let Some(f) = self.shared.failure.lock().take() {
            bail!(f);
        }
        commit_durable(self.consumer, self.shared, &mut self.committed);
        probe_brokers(self.consumer, &self.shared.health, &self.shared.kafka.topics, &mut self.last_probe);
        self.reap_ended();
        count(&mut self.total, &mut self.ended, self.shared);
        self.restart_fenced();
        observer.on_progress(&self.total);
        Ok(observer.should_stop() || self.read_to_the_end())
    }

    /// Tasks whose source ended (idle_exit) are reaped; their partitions stay assigned.
    fn reap_ended(&self) {
        let done: Vec<(String, i32)> = self.shared.tasks.lock().iter().filter(|(_, t)| t.handle.is_finished()).map(|(k, _)| k.clone()).collect();
        for (topic, partition) in done {
            if let Some(task) = self.shared.tasks.lock().remove(&(topic.clone(), partition)) {
                self.shared.reap(&topic, partition, task.handle);
            }
        }
    }

    /// A fenced task whose partition the group still assigns here starts again.
    fn restart_fenced(&self) {
        let fenced: Vec<(String, i32)> = self.shared.fenced.lock().drain(..).collect();
        if fenced.is_empty() {
            return;
        }
        let assigned = assigned_partitions(self.consumer);
        for (topic, partition) in fenced {
            if assigned.contains(&(topic.clone(), partition)) {
                tracing::info!(topic, partition, "the group still assigns this partition here: taking it over again");
                self.shared.start(&topic, partition);
            }
        }
    }

    /// With `idle_exit`: whether the group has read every partition to its end. Idle is not done:
    /// partitions a dead member held wait for the group to notice, and one assigned here without a
    /// task (its last one was stopped, not ended) gets a task that restores it, reads to the end and
    /// closes its windows.
    fn read_to_the_end(&mut self) -> bool {
        let Some(limit) = self.idle_exit else { return false };
        let idle = self.shared.tasks.lock().is_empty();
        let quiet = self.shared.last_rebalance.lock().elapsed();
        if !(idle && quiet >= limit && self.last_done_check.is_none_or(|t| t.elapsed() >= Duration::from_secs(1))) {
            return false;
        }
        self.last_done_check = Some(Instant::now());
        match unfinished_partitions(self.consumer, self.remote, &self.shared.kafka.topics) {
            Ok(unfinished) if unfinished.is_empty() => return true,
            Ok(unfinished) => {
                let assigned = assigned_partitions(self.consumer);
                for (topic, partition, reason) in &unfinished {
                    if assigned.contains(&(topic.clone(), *partition)) {
                        tracing::info!(topic, partition, reason, "assigned here and not finished: running it to its end");
                        self.shared.start(topic, *partition);
                    }
                }
                if self.reported_unfinished.as_ref() != Some(&unfinished) {
                    tracing::info!(?unfinished, "no partition task runs here, but the group has not finished these partitions: waiting");
                    self.reported_unfinished = Some(unfinished);
                }
            }
            Err(e) => tracing::warn!("checking whether the topic is read to its end: {e:#}"),
        }
        false
    }
}

/// What one compaction round did: whether this instance holds the compactor lease, and whether the
/// merged view here changed (compacted here, or fetched from the lease holder).
struct Round {
    leader: bool,
    changed: bool,
}

impl Round {
    /// Hands a changed merged view, with its watermark, to the observer.
    fn report(&self, root: &Path, total: &mut RunReport, observer: &mut dyn Observer) {
        if self.changed {
            let merged = merged_dir(root);
            if let Ok(m) = crate::state::read_manifest(&merged) {
                total.watermark_ms = m.operator.watermark;
            }
            observer.on_merged(&merged, total);
        }
    }
}

/// Takes or renews the lease; the holder compacts, the others fetch the merged view. A failing
/// store is a warning here (the partition tasks fail on their own when they cannot copy their state).
fn compaction_round(
    context: &PipelineContext,
    config: &CoreConfig,
    remote: &Remote,
    root: &Path,
    me: &str,
    lease_ttl: i64,
    merged_writer: &mut Option<Writer>,
) -> Round {
    let now = chrono::Utc::now().timestamp_millis();
    let leader = match lease::try_acquire(remote, me, lease_ttl, now) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("compactor lease: {e:#}");
            return Round { leader: false, changed: false };
        }
    };
    let merged = merged_dir(root);
    if !leader {
        *merged_writer = None;
    }
    let outcome = if leader {
        compact_once(context, config, remote, root, merged_writer).map(|r| {
            tracing::info!(windows_merged = r.windows_merged, windows = r.windows, partitions = r.partitions, seconds = r.seconds, "compacted");
            true
        })
    } else {
        let local_seq = crate::state::read_manifest(&merged).ok().map(|m| m.seq);
        match remote.manifest(MERGED_PREFIX) {
            Ok(Some(m)) if Some(m.seq) != local_seq => remote.fetch(MERGED_PREFIX, &merged),
            Ok(_) => Ok(false),
            Err(e) => Err(e),
        }
    };
    let changed = match outcome {
        Ok(changed) => changed,
        Err(e) => {
            tracing::warn!("merged view: {e:#}");
            false
        }
    };
    Round { leader, changed }
}

/// Why a partition's state in the store is not yet the end of a bounded run, if it is not: it must
/// be read to the partition's end offset `high` and its windows closed — the state a task leaves
/// when its source ends. A task stopped by a revocation checkpoints its windows open, even when
/// it had read everything, and the member that receives the partition closes them; offsets alone
/// do not tell that this happened.
pub fn unfinished(manifest: Option<&crate::state::Manifest>, topic: &str, partition: i32, high: i64) -> Option<String> {
    let stored = manifest.and_then(|m| m.resume.get(&format!("kafka:{topic}"), partition)).unwrap_or(0);
    if stored < high {
        return Some(format!("stored to offset {stored} of {high}"));
    }
    let open = manifest.map_or(0, |m| m.open_window_starts().len());
    (open > 0).then(|| format!("read to its end ({high}) but {open} windows still open"))
}

/// The partitions of `topics` whose state in the store is not finished (`unfinished`), as
/// (topic, partition, reason).
fn unfinished_partitions(consumer: &BaseConsumer<GroupContext>, remote: &Remote, topics: &[String]) -> anyhow::Result<Vec<(String, i32, String)>> {
    let mut out = Vec::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).with_context(|| format!("metadata of topic {topic:?}"))?;
        let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
        for partition in partitions {
            let (low, high) = consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(5))
                .with_context(|| format!("end offset of {topic:?} partition {partition}"))?;
            if high <= low {
                continue;
            }
            let manifest = remote.manifest(&partition_prefix(topic, partition))?;
            if let Some(reason) = unfinished(manifest.as_ref(), topic, partition, high) {
                out.push((topic.clone(), partition, reason));
            }
        }
    }
    Ok(out)
}

/// Messages behind the end of each partition this instance holds, from the offsets its tasks have
/// made durable (a partition not yet copied counts from its start).
fn lag(consumer: &BaseConsumer<GroupContext>, shared: &Shared) -> Vec<(String, i32, i64)> {
    let durable = shared.durable.lock().clone();
    let Ok(assignment) = consumer.assignment() else { return Vec::new() };
    assignment
        .elements()
        .iter()
        .filter_map(|e| {
            let (_, high) = consumer.fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(1)).ok()?;
            let next = durable.get(&format!("kafka:{}", e.topic()), e.partition()).unwrap_or(0);
            Some((e.topic().to_string(), e.partition(), (high - next).max(0)))
        })
        .collect()
}

/// Commits the offsets whose state is in the store (the group's offsets report lag; the partition
/// manifests in the store say where reading resumes).
/// While the brokers count as unreachable, asks for the topic's metadata about once a second: an
/// answer is the sign of life that ends the outage (librdkafka reports errors, not recoveries, and
/// a member whose partitions are idle or paused reads nothing that would say so).
fn probe_brokers(consumer: &BaseConsumer<GroupContext>, health: &SourceHealth, topics: &[String], last: &mut Option<Instant>) {
    if health.is_up() || last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
        return;
    }
    *last = Some(Instant::now());
    if consumer.fetch_metadata(topics.first().map(String::as_str), Duration::from_millis(500)).is_ok_and(|m| m.brokers().iter().len() > 0) {
        health.ok();
    }
}

fn commit_durable(consumer: &BaseConsumer<GroupContext>, shared: &Shared, committed: &mut ResumeOffsets) {
    let durable = shared.durable.lock().clone();
    if durable == *committed {
        return;
    }
    let assignment: Vec<(String, i32)> =
        consumer.assignment().map(|a| a.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect()).unwrap_or_default();
    let mut list = TopicPartitionList::new();
    for (stream, parts) in &durable.0 {
        let Some(topic) = stream.strip_prefix("kafka:") else { continue };
        for (&partition, &offset) in parts {
            if assignment.iter().any(|(t, p)| t == topic && *p == partition) {
                let _ = list.add_partition_offset(topic, partition, Offset::Offset(offset));
            }
        }
    }
    if list.count() > 0 {
        if let Err(e) = consumer.commit(&list, CommitMode::Sync) {
            tracing::warn!("committing offsets of durable partition states: {e}; the next round retries");
            return;
        }
    }
    *committed = durable;
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::state::{Manifest, OpenWindowEntry, StateStore};

    /// Regression test: a clean-clone CI run merged 3 of 6 partitions' windows. Those partitions'
    /// last tasks had been stopped by a revocation after reading everything, so their states held
    /// every offset with the windows open, and the offset-only exit rule let both instances leave.
    pub fn a_state_read_to_the_end_with_open_windows_is_not_finished() {
        let dir = tempfile::tempdir().unwrap();
        let config = CoreConfig::defaults("test".into(), crate::window::Holdout { validation: 0.1, evaluation: 0.1 });
        let store = StateStore::open(dir.path(), "test", config.window.spec().unwrap(), config.holdout).unwrap();
        let mut m: Manifest = store.manifest().clone();
        assert_eq!(unfinished(None, "t", 0, 10).as_deref(), Some("stored to offset 0 of 10"));
        m.resume.merge(&crate::sources::ResumeOffsets([("kafka:t".to_string(), [(0, 10)].into_iter().collect())].into_iter().collect()));
        assert_eq!(unfinished(Some(&m), "t", 0, 10), None, "read to the end, nothing open");
        assert!(unfinished(Some(&m), "t", 0, 11).is_some(), "one record short");
        m.open_windows.push(OpenWindowEntry { start_ms: 0, dir: "open-0".into(), files: Default::default() });
        let reason = unfinished(Some(&m), "t", 0, 10).expect("windows open");
        assert!(reason.contains("1 windows still open"), "{reason}");
    }
}
