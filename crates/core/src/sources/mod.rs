//! Where session records come from (files, Kafka; the simulator is `ultr_simulate::source`): raw bytes plus the source position of each.

pub mod click_log;
pub mod file;
pub mod kafka;
pub mod secrets;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Where one record sits in its source: a Kafka topic partition and offset, or a file and byte offset
/// (files use partition 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourcePosition {
    pub stream: Arc<str>,
    pub partition: i32,
    pub offset: i64,
}

impl fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]@{}", self.stream, self.partition, self.offset)
    }
}

/// One undecoded record.
#[derive(Debug, Clone)]
pub struct RawRecord {
    pub payload: Vec<u8>,
    pub position: SourcePosition,
    /// Where reading resumes after this record (file: the next line's byte offset; Kafka: offset + 1).
    pub next_offset: i64,
}

/// The resume point of every (stream, partition) read so far: the next offset to read.
/// This is what a checkpoint stores and what a restart seeks to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeOffsets(pub BTreeMap<String, BTreeMap<i32, i64>>);

impl ResumeOffsets {
    pub fn advance(&mut self, record: &RawRecord) {
        let slot = self.0.entry(record.position.stream.to_string()).or_default().entry(record.position.partition).or_insert(record.next_offset);
        *slot = (*slot).max(record.next_offset);
    }

    pub fn merge(&mut self, other: &ResumeOffsets) {
        for (stream, parts) in &other.0 {
            let mine = self.0.entry(stream.clone()).or_default();
            for (&p, &o) in parts {
                let slot = mine.entry(p).or_insert(o);
                *slot = (*slot).max(o);
            }
        }
    }

    pub fn get(&self, stream: &str, partition: i32) -> Option<i64> {
        self.0.get(stream).and_then(|p| p.get(&partition)).copied()
    }
}

/// A source's connection health, shared with the service's metrics and `/healthz`: transient errors
/// (broker down, transport failures, a rebalance during commit) are counted here and retried, never
/// fatal to the loop.
#[derive(Debug)]
pub struct SourceHealth {
    up: AtomicBool,
    last_ok_ms: AtomicI64,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Default for SourceHealth {
    fn default() -> Self {
        SourceHealth { up: AtomicBool::new(true), last_ok_ms: AtomicI64::new(chrono::Utc::now().timestamp_millis()), errors: Mutex::new(BTreeMap::new()) }
    }
}

impl SourceHealth {
    /// The source answered (a message, an end-of-partition, a successful commit).
    pub fn ok(&self) {
        self.up.store(true, Ordering::Relaxed);
        self.last_ok_ms.store(chrono::Utc::now().timestamp_millis(), Ordering::Relaxed);
    }

    /// A transient error of `kind`; `down` when it means the source is unreachable.
    pub fn error(&self, kind: &str, down: bool) {
        if down {
            self.up.store(false, Ordering::Relaxed);
        }
        *self.errors.lock().entry(kind.to_string()).or_default() += 1;
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Wall-clock ms of the last sign of life.
    pub fn last_ok_ms(&self) -> i64 {
        self.last_ok_ms.load(Ordering::Relaxed)
    }

    /// Errors so far, by kind.
    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().clone()
    }
}

/// What a poll of a source returned.
#[derive(Debug)]
pub enum Poll {
    /// Some records (never empty).
    Records(Vec<RawRecord>),
    /// Nothing right now; an unbounded source may have more later.
    Idle,
    /// The source is exhausted (end of file, or a bounded Kafka read is done).
    End,
}

/// A source of raw session records. Sources only do I/O; decoding happens downstream.
pub trait RecordSource {
    /// Up to `max` records.
    fn poll(&mut self, max: usize) -> anyhow::Result<Poll>;

    /// Tells the source that everything before `offsets` is durable (Kafka commits it to the group).
    /// `last`: the run stops after this one, so the source waits for its answer; otherwise it sends
    /// the commit and goes on, since a broker that goes away mid-commit must not stall the pipeline
    /// (the state's manifest, not the group, says where reading resumes).
    fn commit(&mut self, _offsets: &ResumeOffsets, _last: bool) -> anyhow::Result<()> {
        Ok(())
    }

    /// Partitions this reader is assigned, as `stream[partition]` keys. A partition that has not
    /// produced yet still holds the watermark back (until its idle timeout), so its early events are
    /// not declared late just because another partition was read first.
    fn assigned_partitions(&self) -> Vec<String> {
        Vec::new()
    }

    /// Assigned partitions (`stream[partition]` keys) with records below their high watermark that
    /// this reader has not returned yet, as far as the source knows without a round trip. They are
    /// busy, not idle, whatever the wall clock says (`WindowOperator::hold_partition`). Sources that
    /// read in order (files, the simulator) have none.
    fn partitions_behind(&self) -> Vec<String> {
        Vec::new()
    }

    /// Messages behind the end of each (topic, partition), given the next offsets to read. Sources
    /// without a broker report none.
    fn lag(&self, _position: &ResumeOffsets) -> Vec<(String, i32, i64)> {
        Vec::new()
    }

    /// True for replays of a recorded log (files, the simulator): their event times are judged
    /// against the stream's own clock, not the wall clock.
    fn replays_history(&self) -> bool {
        false
    }

    /// Connection health, for sources that have a connection to lose.
    fn health(&self) -> Option<Arc<SourceHealth>> {
        None
    }
}

impl RecordSource for Box<dyn RecordSource + Send> {
    fn poll(&mut self, max: usize) -> anyhow::Result<Poll> {
        (**self).poll(max)
    }
    fn commit(&mut self, offsets: &ResumeOffsets, last: bool) -> anyhow::Result<()> {
        (**self).commit(offsets, last)
    }
    fn assigned_partitions(&self) -> Vec<String> {
        (**self).assigned_partitions()
    }
    fn partitions_behind(&self) -> Vec<String> {
        (**self).partitions_behind()
    }
    fn lag(&self, position: &ResumeOffsets) -> Vec<(String, i32, i64)> {
        (**self).lag(position)
    }
    fn replays_history(&self) -> bool {
        (**self).replays_history()
    }
    fn health(&self) -> Option<Arc<SourceHealth>> {
        (**self).health()
    }
}
