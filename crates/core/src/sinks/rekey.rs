//! Re-keys a session topic by `query_id` into another topic, for upstreams that key otherwise:
//! scale-out needs every session of a query in one partition (`scale_out`). At-least-once: the
//! consumer commits only after the producer flushed, and a session repeated by a crash is dropped
//! downstream by the windows' duplicate filter. A record without a readable `query_id` keeps its
//! key and is passed on, to be dead-lettered with a reason by the pipeline that reads it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;

use super::kafka::{ensure_topic_with, KafkaSink};
use super::SessionSink;

/// What a re-keying run moved.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct RekeyReport {
    pub records: u64,
    /// Records passed on with their original key (no readable `query_id`).
    pub without_query_id: u64,
}

/// Where to read, where to write.
pub struct Rekey<'a> {
    pub brokers: &'a str,
    pub from: &'a str,
    pub to: &'a str,
    pub group_id: &'a str,
    pub partitions: i32,
    pub properties: &'a BTreeMap<String, String>,
    /// Stop after this long without a record; None runs forever.
    pub idle_exit: Option<Duration>,
    /// The records' format (`query_id` is read through it).
    pub codec: std::sync::Arc<dyn crate::session::Codec>,
}

pub fn rekey(r: &Rekey) -> anyhow::Result<RekeyReport> {
    ensure_topic_with(r.brokers, r.to, r.partitions, r.properties)?;
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", r.brokers).set("group.id", r.group_id).set("enable.auto.commit", "false").set("auto.offset.reset", "earliest");
    for (k, v) in crate::sources::secrets::resolve_properties(r.properties)? {
        client.set(k, v);
    }
    let consumer: BaseConsumer = client.create().context("creating the re-keying consumer")?;
    consumer.subscribe(&[r.from]).with_context(|| format!("subscribing to {}", r.from))?;
    let mut sink = KafkaSink::new(r.brokers, r.to, r.properties)?;
    let mut report = RekeyReport::default();
    let mut uncommitted = 0u64;
    let mut last = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) => {
                let payload = msg.payload().unwrap_or_default();
                let key = match r.codec.query_id(payload) {
                    Some(q) => q,
                    None => {
                        report.without_query_id += 1;
                        msg.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default()
                    }
                };
                sink.send(&key, payload)?;
                report.records += 1;
                uncommitted += 1;
                last = Instant::now();
            }
            Some(Err(e)) => tracing::warn!("re-keying: reading {}: {e}", r.from),
            None => {}
        }
        let idle = r.idle_exit.is_some_and(|limit| last.elapsed() >= limit);
        if uncommitted >= 10_000 || (uncommitted > 0 && last.elapsed() >= Duration::from_secs(1)) || idle {
            sink.flush()?;
            if uncommitted > 0 {
                consumer.commit_consumer_state(CommitMode::Sync).context("committing the re-keyed offsets")?;
            }
            uncommitted = 0;
        }
        if idle {
            return Ok(report);
        }
    }
}
