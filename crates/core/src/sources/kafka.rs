//! Kafka source on rdkafka: a consumer-group member that yields raw records with partition offsets.
//! The state, not the group, decides where reading starts: every assigned partition is positioned
//! at the state's resume offset in the rebalance callback (the group's committed offset is only a
//! lag report). Transient broker errors are counted and retried, never fatal.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::secrets::resolve_properties;
use super::{Poll, RawRecord, RecordSource, ResumeOffsets, SourceHealth, SourcePosition};

/// How to reach and read the session topic. Lives under `[source.kafka]` in a pipeline config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Consumer group id.
    pub group_id: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// Extra librdkafka properties passed through verbatim (e.g. `security.protocol`,
    /// `sasl.mechanism`). A value `env:NAME` is read from environment variable NAME and
    /// `file:PATH` from a file (trailing newline dropped), so secrets need not sit in the TOML.
    /// `auto.offset.reset` (default `earliest`) says where a partition the state has never read
    /// starts. `queued.max.messages.kbytes` defaults to 4096 here (see `DEFAULT_QUEUED_MAX_KBYTES`).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Stop (end of stream) after waiting this long without a message (the pipeline's own work
    /// between polls does not count) while every assigned partition is read to its high watermark;
    /// records still below a watermark (a stalled broker) restart the wait. Unset runs forever.
    #[serde(default)]
    pub idle_exit_ms: Option<u64>,
}

/// librdkafka's `queued.max.messages.kbytes` unless `properties` set it: how much the consumer
/// prefetches. librdkafka queues a broker-down error behind the messages already prefetched, so
/// this bounds how long an outage goes unreported while they are read (its own default, 64 MiB,
/// took minutes on a loaded machine); 4 MiB is still several fetches ahead of the reader.
pub const DEFAULT_QUEUED_MAX_KBYTES: &str = "4096";

/// Offsets the state has accounted for, shared with the rebalance callback.
type Position = Arc<Mutex<ResumeOffsets>>;

/// The consumer's callbacks: seek-on-assign and error accounting.
pub struct StateSeekingContext {
    position: Position,
    /// Where a partition unknown to the state starts (`auto.offset.reset`).
    reset: Offset,
    health: Arc<SourceHealth>,
}

impl ClientContext for StateSeekingContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let (kind, down) = classify(&error);
        tracing::warn!(kind, "Kafka: {error} ({reason}); retrying");
        self.health.error(kind, down);
    }
}

impl ConsumerContext for StateSeekingContext {
    /// The answer to an asynchronous commit (`KafkaSource::commit`), accounted like a synchronous one.
    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, _offsets: &TopicPartitionList) {
        account_commit(&self.health, &result);
    }

    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let cooperative = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let position = self.position.lock().clone();
                let parts: Vec<(String, i32)> = tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
                for (topic, partition) in parts {
                    let offset = match position.get(&format!("kafka:{topic}"), partition) {
                        Some(o) => Offset::Offset(o),
                        None => self.reset,
                    };
                    tracing::info!(topic, partition, ?offset, "assigned; reading from the state's offset");
                    if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                        tracing::warn!("cannot position {topic}[{partition}]: {e}");
                    }
                }
                if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                let code: RDKafkaErrorCode = other.into();
                tracing::warn!("rebalance error {code}; dropping the assignment");
                self.health.error("rebalance", false);
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            tracing::warn!("applying the rebalance: {e}");
            self.health.error("rebalance", false);
        }
    }
}

/// A label for `ultr_kafka_errors_total{kind}`, and whether the error means the broker is unreachable.
pub fn classify(error: &KafkaError) -> (&'static str, bool) {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::AllBrokersDown) => ("all_brokers_down", true),
        Some(RDKafkaErrorCode::BrokerTransportFailure) => ("transport", true),
        Some(RDKafkaErrorCode::Resolve) => ("resolve", true),
        Some(RDKafkaErrorCode::Authentication) | Some(RDKafkaErrorCode::SaslAuthenticationFailed) => ("authentication", true),
        Some(RDKafkaErrorCode::SSL) => ("tls", true),
        Some(RDKafkaErrorCode::RebalanceInProgress) | Some(RDKafkaErrorCode::IllegalGeneration) | Some(RDKafkaErrorCode::UnknownMemberId) => {
            ("rebalance", false)
        }
        Some(RDKafkaErrorCode::OperationTimedOut) | Some(RDKafkaErrorCode::RequestTimedOut) => ("timeout", false),
        _ => ("other", false),
    }
}

/// A commit's answer, synchronous or through `commit_callback`: the manifest is the truth and already
/// durable, so a failed commit only delays the group's lag report. It is counted and warned about,
/// and the next checkpoint commits again.
fn account_commit(health: &SourceHealth, result: &rdkafka::error::KafkaResult<()>) {
    match result {
        Ok(()) => health.ok(),
        Err(e) => {
            let (kind, down) = classify(e);
            health.error(kind, down);
            tracing::warn!(kind, "committing Kafka offsets after a durable checkpoint failed: {e}; continuing");
        }
    }
}

/// Reads with a consumer group; auto-commit is off, because offsets are committed only after the
/// state covering them is durable (`commit`).
pub struct KafkaSource {
    consumer: BaseConsumer<StateSeekingContext>,
    idle_exit: Option<Duration>,
    /// When the polls started coming back empty: idle is time spent waiting for a message, not
    /// the pipeline's own work between polls (a slow checkpoint once counted as idle and ended a
    /// run mid-stream).
    idle_since: Option<Instant>,
    /// Everything before these offsets is in the state (durable or in memory): skip it, and seek
    /// to it when a partition is (re)assigned.
    position: Position,
    streams: BTreeMap<String, Arc<str>>,
    health: Arc<SourceHealth>,
    /// Where a partition the state has never read starts.
    reset: Offset,
    /// False for a partition task: its instance's group member commits.
    commits: bool,
}

impl KafkaSource {
    /// Reads from `resume` (a state's offsets); partitions it does not name start at
    /// `auto.offset.reset`, never at the group's committed offset.
    pub fn new(config: &KafkaSourceConfig, resume: ResumeOffsets) -> anyhow::Result<Self> {
        Self::open(config, resume, false, true)
    }

    /// Without a state (`ultr consume`): every partition continues from the group's committed offset.
    pub fn from_group_offsets(config: &KafkaSourceConfig) -> anyhow::Result<Self> {
        Self::open(config, ResumeOffsets::default(), true, true)
    }

    /// One partition, assigned by the caller instead of the group (a scale-out partition task):
    /// reads from `resume` (or `auto.offset.reset`), joins no group and commits nothing — the
    /// instance's group member commits for it.
    /// `health` is the instance's: every partition task's client reports into it, so the
    /// instance's `ultr_source_up` does not hang on one client (its group member may be busy in a
    /// commit or a rebalance while the tasks poll and see the outage).
    pub fn assigned(config: &KafkaSourceConfig, resume: ResumeOffsets, topic: &str, partition: i32, health: Arc<SourceHealth>) -> anyhow::Result<Self> {
        let mut source = Self::open_with(config, resume, false, false, health)?;
        let offset = source.position.lock().get(&format!("kafka:{topic}"), partition);
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, partition, offset.map(Offset::Offset).unwrap_or(source.reset))?;
        source.consumer.assign(&list).with_context(|| format!("assigning {topic}[{partition}]"))?;
        source.commits = false;
        Ok(source)
    }

    fn open(config: &KafkaSourceConfig, resume: ResumeOffsets, group_offsets: bool, subscribe: bool) -> anyhow::Result<Self> {
        Self::open_with(config, resume, group_offsets, subscribe, Arc::new(SourceHealth::default()))
    }

    fn open_with(config: &KafkaSourceConfig, resume: ResumeOffsets, group_offsets: bool, subscribe: bool, health: Arc<SourceHealth>) -> anyhow::Result<Self> {
        let properties = resolve_properties(&config.properties).context("[source.kafka] properties")?;
        let reset = match properties.get("auto.offset.reset").map(String::as_str) {
            None | Some("earliest" | "smallest" | "beginning") => Offset::Beginning,
            Some("latest" | "largest" | "end") => Offset::End,
            Some(other) => anyhow::bail!("key `source.kafka.properties.\"auto.offset.reset\"` = {other:?}: use earliest or latest"),
        };
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.brokers)
            .set("group.id", &config.group_id)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("queued.max.messages.kbytes", DEFAULT_QUEUED_MAX_KBYTES);
        for (k, v) in &properties {
            client.set(k, v);
        }
        let position: Position = Arc::new(Mutex::new(resume));
        let reset = if group_offsets { Offset::Stored } else { reset };
        let context = StateSeekingContext { position: position.clone(), reset, health: health.clone() };
        let consumer: BaseConsumer<StateSeekingContext> = client.create_with_context(context).context("creating Kafka consumer")?;
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        if subscribe {
            consumer.subscribe(&topics).with_context(|| format!("subscribing to {topics:?}"))?;
        }
        Ok(KafkaSource {
            reset,
            commits: true,
            consumer,
            idle_exit: config.idle_exit_ms.map(Duration::from_millis),
            idle_since: None,
            position,
            streams: BTreeMap::new(),
            health,
        })
    }

    /// Commits resume offsets to the group (for lag visibility; the state manifest stays the truth).
    /// Only the `last` commit of a run waits for the broker's answer: a synchronous commit in flight
    /// when the broker went away waited for it for the whole outage, and the pipeline with it (the
    /// outage test caught it under load). The others are answered through `commit_callback`.
    pub fn commit(&self, offsets: &ResumeOffsets, last: bool) -> anyhow::Result<()> {
        if !self.commits {
            return Ok(());
        }
        let mut list = TopicPartitionList::new();
        for (stream, parts) in &offsets.0 {
            let Some(topic) = stream.strip_prefix("kafka:") else { continue };
            for (&partition, &offset) in parts {
                list.add_partition_offset(topic, partition, Offset::Offset(offset))?;
            }
        }
        if list.count() > 0 {
            let mode = if last { CommitMode::Sync } else { CommitMode::Async };
            let result = self.consumer.commit(&list, mode);
            // An asynchronous commit that was sent is answered through `commit_callback`.
            if result.is_err() || last {
                account_commit(&self.health, &result);
            }
        }
        Ok(())
    }

    /// How many records of the assigned partitions lie between where reading stands and the high
    /// watermarks: what `idle_exit_ms` must not abandon. The watermark is the one the last fetch
    /// response carried (no broker round trip, so a stalled broker still answers), else one fetched
    /// now; a partition with neither counts as read.
    fn records_behind(&self, position: &ResumeOffsets) -> i64 {
        self.behind_by_partition(position, true).into_iter().map(|(_, _, n)| n).sum()
    }

    /// Records not yet read per assigned (topic, partition), where more than none. Reading stands at
    /// the later of the state's offset and the consumer's own position (which passes transaction
    /// markers the state never sees). The high watermark is librdkafka's cached one; with `fetch`, a
    /// partition without one asks the broker (up to a second), otherwise it counts as read.
    fn behind_by_partition(&self, position: &ResumeOffsets, fetch: bool) -> Vec<(String, i32, i64)> {
        let Ok(assignment) = self.consumer.assignment() else { return Vec::new() };
        let consumed: BTreeMap<(String, i32), i64> = self
            .consumer
            .position()
            .map(|list| {
                list.elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut behind = Vec::new();
        for el in assignment.elements() {
            let (topic, partition) = (el.topic(), el.partition());
            let high = match self.cached_high_watermark(topic, partition) {
                Some(high) => high,
                None if fetch => match self.consumer.fetch_watermarks(topic, partition, Duration::from_secs(1)) {
                    Ok((_, high)) => high,
                    Err(_) => continue,
                },
                None => continue,
            };
            let state = position.get(&format!("kafka:{topic}"), partition).unwrap_or(0);
            let read = consumed.get(&(topic.to_string(), partition)).copied().unwrap_or(0).max(state);
            if high > read {
                behind.push((topic.to_string(), partition, high - read));
            }
        }
        behind
    }

    /// The high watermark of `topic[partition]` as of the last fetch response, without asking the
    /// broker (librdkafka's `rd_kafka_get_watermark_offsets`); None before the first response.
    fn cached_high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        let topic = std::ffi::CString::new(topic).ok()?;
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: the client pointer lives as long as `self.consumer`; the topic is a NUL-terminated
        // string that outlives the call; librdkafka only writes the two offsets.
        let err =
            unsafe { rdkafka::bindings::rd_kafka_get_watermark_offsets(self.consumer.client().native_ptr(), topic.as_ptr(), partition, &mut low, &mut high) };
        (err == rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
    }

    /// Consumer lag per (topic, partition): high watermark minus the next offset we will read.
    pub fn lag(&self, position: &ResumeOffsets) -> BTreeMap<(String, i32), i64> {
        let mut out = BTreeMap::new();
        if let Ok(assignment) = self.consumer.assignment() {
            for el in assignment.elements() {
                if let Ok((_, high)) = self.consumer.fetch_watermarks(el.topic(), el.partition(), Duration::from_secs(1)) {
                    let next = position.get(&format!("kafka:{}", el.topic()), el.partition()).unwrap_or(0);
                    out.insert((el.topic().to_string(), el.partition()), (high - next).max(0));
                }
            }
        }
        out
    }
}

impl RecordSource for KafkaSource {
    fn poll(&mut self, max: usize) -> anyhow::Result<Poll> {
        let mut out: Vec<RawRecord> = Vec::new();
        let deadline = Instant::now() + Duration::from_millis(200);
        let mut position = self.position.lock().clone();
        while out.len() < max {
            let wait = deadline.saturating_duration_since(Instant::now());
            let Some(msg) = self.consumer.poll(if out.is_empty() { wait } else { Duration::ZERO }) else {
                if out.is_empty() && Instant::now() < deadline {
                    continue;
                }
                break;
            };
            let msg = match msg {
                Ok(m) => m,
                Err(KafkaError::PartitionEOF(_)) => {
                    self.health.ok();
                    continue;
                }
                Err(e) => {
                    // Transient (broker down, transport, rebalance): count it and keep polling.
                    // librdkafka paces reconnects itself (`reconnect.backoff.ms`); sleeping here
                    // instead would drain its error queue slower than it fills during an outage,
                    // and messages queued behind the errors would wait long after recovery.
                    let (kind, down) = classify(&e);
                    self.health.error(kind, down);
                    tracing::debug!(kind, "reading from Kafka: {e}; retrying");
                    if Instant::now() >= deadline {
                        break;
                    }
                    continue;
                }
            };
            self.health.ok();
            self.idle_since = None;
            let stream = self.streams.entry(msg.topic().to_string()).or_insert_with(|| format!("kafka:{}", msg.topic()).into()).clone();
            if let Some(resume) = position.get(&stream, msg.partition()) {
                if msg.offset() < resume {
                    continue; // already in the state
                }
            }
            let record = RawRecord {
                payload: msg.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                position: SourcePosition { stream, partition: msg.partition(), offset: msg.offset() },
                next_offset: msg.offset() + 1,
            };
            position.advance(&record);
            out.push(record);
        }
        *self.position.lock() = position;
        if !out.is_empty() {
            return Ok(Poll::Records(out));
        }
        let idle_since = *self.idle_since.get_or_insert_with(Instant::now);
        match self.idle_exit {
            Some(limit) if idle_since.elapsed() >= limit => {
                let behind = self.records_behind(&self.position.lock().clone());
                if behind > 0 {
                    // A stalled broker, not the stream's end: wait another full period.
                    tracing::warn!(behind, "no record for {limit:?}, but {behind} records lie below the high watermarks; waiting on");
                    self.idle_since = Some(Instant::now());
                    return Ok(Poll::Idle);
                }
                Ok(Poll::End)
            }
            _ => Ok(Poll::Idle),
        }
    }

    fn commit(&mut self, offsets: &ResumeOffsets, last: bool) -> anyhow::Result<()> {
        KafkaSource::commit(self, offsets, last)
    }

    fn assigned_partitions(&self) -> Vec<String> {
        self.consumer.assignment().map(|a| a.elements().iter().map(|e| format!("kafka:{}[{}]", e.topic(), e.partition())).collect()).unwrap_or_default()
    }

    fn partitions_behind(&self) -> Vec<String> {
        let position = self.position.lock().clone();
        self.behind_by_partition(&position, false).into_iter().map(|(topic, partition, _)| format!("kafka:{topic}[{partition}]")).collect()
    }

    fn lag(&self, position: &ResumeOffsets) -> Vec<(String, i32, i64)> {
        KafkaSource::lag(self, position).into_iter().map(|((t, p), l)| (t, p, l)).collect()
    }

    fn health(&self) -> Option<Arc<SourceHealth>> {
        Some(self.health.clone())
    }
}
