//! Kafka sink on rdkafka: publishes sessions under the key it is given (the simulator and `rekey` use the query id), and counts failed deliveries.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

use super::SessionSink;

/// How long a flush waits without any delivery completing before it fails.
const FLUSH_STALL: Duration = Duration::from_secs(60);

/// Counts delivery outcomes reported by librdkafka.
#[derive(Default)]
pub struct DeliveryCounter {
    pub delivered: AtomicU64,
    pub failed: AtomicU64,
}

#[derive(Clone, Default)]
pub struct CountingContext(pub Arc<DeliveryCounter>);

impl ClientContext for CountingContext {}

impl ProducerContext for CountingContext {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.0.delivered.fetch_add(1, Ordering::Relaxed),
            Err((e, _)) => {
                tracing::warn!(error = %e, "Kafka delivery failed");
                self.0.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

pub struct KafkaSink {
    producer: BaseProducer<CountingContext>,
    topic: String,
    counter: Arc<DeliveryCounter>,
    sent: u64,
}

impl KafkaSink {
    /// `properties` are librdkafka properties (TLS, SASL, compression); `env:`/`file:` values are
    /// resolved as secrets.
    pub fn new(brokers: &str, topic: &str, properties: &BTreeMap<String, String>) -> anyhow::Result<Self> {
        let properties = crate::sources::secrets::resolve_properties(properties)?;
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers).set("linger.ms", "20").set("queue.buffering.max.messages", "200000").set("enable.idempotence", "false");
        for (k, v) in &properties {
            config.set(k, v);
        }
        let counter = Arc::new(DeliveryCounter::default());
        let producer = config.create_with_context(CountingContext(counter.clone())).context("creating Kafka producer")?;
        Ok(KafkaSink { producer, topic: topic.to_string(), counter, sent: 0 })
    }

    pub fn delivered(&self) -> u64 {
        self.counter.delivered.load(Ordering::Relaxed)
    }

    /// Deliveries librdkafka reported failed, plus sends dropped because its queue stayed full.
    pub fn failed(&self) -> u64 {
        self.counter.failed.load(Ordering::Relaxed)
    }

    /// Sends without blocking for long: while librdkafka's queue is full (broker down) it waits at
    /// most about a second, then counts the record as failed and returns an error.
    pub fn try_send_with_headers(&mut self, key: &str, payload: &[u8], headers: OwnedHeaders) -> anyhow::Result<()> {
        let mut record = BaseRecord::to(&self.topic).key(key).payload(payload).headers(headers);
        for _ in 0..20 {
            match self.producer.send(record) {
                Ok(()) => {
                    self.sent += 1;
                    self.producer.poll(Duration::ZERO);
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    self.producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => {
                    self.counter.failed.fetch_add(1, Ordering::Relaxed);
                    return Err(e).context("producing to Kafka");
                }
            }
        }
        self.counter.failed.fetch_add(1, Ordering::Relaxed);
        anyhow::bail!("librdkafka's queue stayed full (broker unreachable?)")
    }

    /// Waits up to `limit` for outstanding deliveries; returns how many are still in flight.
    pub fn flush_bounded(&mut self, limit: Duration) -> usize {
        let _ = self.producer.flush(limit);
        self.producer.in_flight_count().max(0) as usize
    }

    /// Sends with headers (dead letters carry their reason this way).
    pub fn send_with_headers(&mut self, key: &str, payload: &[u8], headers: OwnedHeaders) -> anyhow::Result<()> {
        send_record(&self.producer, &mut self.sent, BaseRecord::to(&self.topic).key(key).payload(payload).headers(headers))
    }
}

/// Sends one record, waiting while librdkafka's queue is full; serves delivery callbacks now and then.
fn send_record(producer: &BaseProducer<CountingContext>, sent: &mut u64, mut record: BaseRecord<'_, str, [u8], ()>) -> anyhow::Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => break,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(50));
            }
            Err((e, _)) => return Err(e).context("producing to Kafka"),
        }
    }
    *sent += 1;
    if sent.is_multiple_of(1024) {
        producer.poll(Duration::ZERO);
    }
    Ok(())
}

impl SessionSink for KafkaSink {
    fn send(&mut self, key: &str, payload: &[u8]) -> anyhow::Result<()> {
        send_record(&self.producer, &mut self.sent, BaseRecord::to(&self.topic).key(key).payload(payload))
    }

    /// Waits until every record is delivered. It gives up only when no delivery completes for
    /// `FLUSH_STALL` in a row: a slow broker that keeps acknowledging is waited for, whatever the
    /// backlog, and an unreachable one fails the flush after that long.
    fn flush(&mut self) -> anyhow::Result<()> {
        let mut in_flight = self.producer.in_flight_count();
        let mut stalled_since = std::time::Instant::now();
        loop {
            match self.producer.flush(Duration::from_secs(5)) {
                Ok(()) => break,
                Err(e) => {
                    let now = self.producer.in_flight_count();
                    if now < in_flight {
                        (in_flight, stalled_since) = (now, std::time::Instant::now());
                    } else if stalled_since.elapsed() >= FLUSH_STALL {
                        return Err(e)
                            .with_context(|| format!("flushing Kafka producer: no delivery for {} s, {now} records in flight", FLUSH_STALL.as_secs()));
                    }
                }
            }
        }
        let failed = self.counter.failed.load(Ordering::Relaxed);
        anyhow::ensure!(failed == 0, "{failed} Kafka deliveries failed");
        Ok(())
    }
}

/// Creates `topic` with `partitions` partitions if it does not exist yet.
pub fn ensure_topic(brokers: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    ensure_topic_with(brokers, topic, partitions, &BTreeMap::new())
}

/// `ensure_topic` with client properties (TLS, SASL; `env:`/`file:` secrets).
pub fn ensure_topic_with(brokers: &str, topic: &str, partitions: i32, properties: &BTreeMap<String, String>) -> anyhow::Result<()> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (k, v) in crate::sources::secrets::resolve_properties(properties)? {
        config.set(k, v);
    }
    let admin: AdminClient<DefaultClientContext> = config.create().context("creating Kafka admin client")?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = crate::context::run_here(admin.create_topics([&new], &opts))?.context("creating topic")?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => anyhow::bail!("creating topic {name}: {code}"),
        }
    }
    Ok(())
}
