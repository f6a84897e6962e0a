//! Kafka source on rdkafka: a consumer-group member that yields raw records with partition offsets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::{Poll, RawRecord, RecordSource, ResumeOffsets, SourcePosition};

/// How to reach and read the session topic. Lives under `[source.kafka]` in a pipeline config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Consumer group id.
    pub group_id: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// Extra librdkafka properties passed through verbatim (e.g. `security.protocol`).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Stop (end of stream) after this long without a message; unset runs forever.
    #[serde(default)]
    pub idle_exit_ms: Option<u64>,
}

/// Reads with a consumer group; auto-commit is off, because offsets are committed only after the
/// state covering them is durable (`commit`).
pub struct KafkaSource {
    consumer: BaseConsumer,
    idle_exit: Option<Duration>,
    last_message: Instant,
    /// Records before these offsets were already accounted for by a checkpoint: skip them.
    resume: ResumeOffsets,
    streams: BTreeMap<String, Arc<str>>,
}

impl KafkaSource {
    pub fn new(config: &KafkaSourceConfig, resume: ResumeOffsets) -> anyhow::Result<Self> {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.brokers)
            .set("group.id", &config.group_id)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest");
        for (k, v) in &config.properties {
            client.set(k, v);
        }
        let consumer: BaseConsumer = client.create().context("creating Kafka consumer")?;
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).with_context(|| format!("subscribing to {topics:?}"))?;
        Ok(KafkaSource {
            consumer,
            idle_exit: config.idle_exit_ms.map(Duration::from_millis),
            last_message: Instant::now(),
            resume,
            streams: BTreeMap::new(),
        })
    }


    /// Commits resume offsets to the group (for lag visibility; the state manifest stays the truth).
    pub fn commit(&self, offsets: &ResumeOffsets) -> anyhow::Result<()> {
        let mut list = TopicPartitionList::new();
        for (stream, parts) in &offsets.0 {
            let Some(topic) = stream.strip_prefix("kafka:") else { continue };
            for (&partition, &offset) in parts {
                list.add_partition_offset(topic, partition, Offset::Offset(offset))?;
            }
        }
        if list.count() > 0 {
            self.consumer.commit(&list, CommitMode::Sync).context("committing Kafka offsets")?;
        }
        Ok(())
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
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_millis(200);
        while out.len() < max {
            let wait = deadline.saturating_duration_since(Instant::now());
            let Some(msg) = self.consumer.poll(if out.is_empty() { wait } else { Duration::ZERO }) else {
                if out.is_empty() && Instant::now() < deadline {
                    continue;
                }
                break;
            };
            let msg = msg.context("reading from Kafka")?;
            self.last_message = Instant::now();
            let stream = self
                .streams
                .entry(msg.topic().to_string())
                .or_insert_with(|| format!("kafka:{}", msg.topic()).into())
                .clone();
            if let Some(resume) = self.resume.get(&stream, msg.partition()) {
                if msg.offset() < resume {
                    continue; // already in a durable checkpoint
                }
            }
            out.push(RawRecord {
                payload: msg.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                position: SourcePosition { stream, partition: msg.partition(), offset: msg.offset() },
                next_offset: msg.offset() + 1,
            });
        }
        if !out.is_empty() {
            return Ok(Poll::Records(out));
        }
        match self.idle_exit {
            Some(limit) if self.last_message.elapsed() >= limit => Ok(Poll::End),
            _ => Ok(Poll::Idle),
        }
    }

    fn commit(&mut self, offsets: &ResumeOffsets) -> anyhow::Result<()> {
        KafkaSource::commit(self, offsets)
    }

    fn assigned_partitions(&self) -> Vec<String> {
        self.consumer
            .assignment()
            .map(|a| a.elements().iter().map(|e| format!("kafka:{}[{}]", e.topic(), e.partition())).collect())
            .unwrap_or_default()
    }

    fn lag(&self, position: &ResumeOffsets) -> Vec<(String, i32, i64)> {
        KafkaSource::lag(self, position).into_iter().map(|((t, p), l)| (t, p, l)).collect()
    }
}
