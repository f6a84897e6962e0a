//! Event-time windows: assigns sessions to tumbling or hopping windows, tracks the watermark per source
//! partition, sends late sessions to a side output, counts duplicate sessions once (a 64-bit key per
//! admitted session and window), and says which windows close. Pure state: no I/O, so checkpoints and
//! tests drive it directly. The windows' contents live in `aggregates`.
//!
//! The duplicate filter holds `session_key(id)`, a 64-bit hash, per open window (8 bytes on disk, ~16
//! in RAM per session). Two different ids collide with probability 2⁻⁶⁴ per pair: among n sessions of
//! one window about n²/2⁶⁵ false duplicates are expected (3.5·10⁻⁷ for a window of 3.6 million
//! sessions), i.e. a real session counted as a duplicate about once in 10⁶ such windows.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::TimestampMillisecondType;
use serde::{Deserialize, Serialize};

use crate::ingest::DecodedBatch;
use crate::session::schema::col;
use crate::window::session_key;

/// Window geometry and lateness, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSpec {
    pub size_ms: i64,
    /// Equal to `size_ms` for tumbling windows; a divisor of it for hopping windows.
    pub slide_ms: i64,
    pub allowed_lateness_ms: i64,
    /// A partition silent this long (wall clock) stops holding the watermark back.
    pub idle_timeout_ms: i64,
}

impl WindowSpec {
    /// Start times of every window containing `t`.
    pub fn windows_for(&self, t: i64) -> impl Iterator<Item = i64> + '_ {
        let last = t.div_euclid(self.slide_ms) * self.slide_ms;
        let count = self.size_ms / self.slide_ms;
        (0..count).map(move |i| last - (count - 1 - i) * self.slide_ms).filter(move |s| *s + self.size_ms > t)
    }
}

/// Counters a run accumulates; checkpointed with the state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowCounters {
    pub sessions: u64,
    pub impressions: u64,
    pub late_sessions: u64,
    pub late_impressions: u64,
    pub duplicate_sessions: u64,
    pub windows_closed: u64,
    /// Items dropped from accepted sessions because their `doc_id` repeated an earlier item's
    /// (`[decode] duplicate_doc_id = "drop_repeats"`).
    #[serde(default)]
    pub repeated_items: u64,
}

impl WindowCounters {
    /// The counters of parts of one stream (shards, partitions) as one: sessions, impressions, late
    /// and duplicates add up; windows closed do not, since each part closes a window the others
    /// close too.
    pub fn sum<'a>(parts: impl IntoIterator<Item = &'a WindowCounters>) -> WindowCounters {
        let mut out = WindowCounters::default();
        for c in parts {
            out.sessions += c.sessions;
            out.impressions += c.impressions;
            out.late_sessions += c.late_sessions;
            out.late_impressions += c.late_impressions;
            out.duplicate_sessions += c.duplicate_sessions;
            out.repeated_items += c.repeated_items;
            out.windows_closed = out.windows_closed.max(c.windows_closed);
        }
        out
    }
}

/// A window that closed: its start and end (its statistics are in `aggregates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClosedWindow {
    pub start: i64,
    pub end: i64,
}

/// What a session of a batch is to one shard of the stream (`WindowOperator::process_shard`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The shard's own session: assigned to windows.
    Mine,
    /// Another shard's: it only moves the clocks.
    Others,
    /// Counted by this shard before a restart (below its resume offset): not counted again, but it
    /// moves the clocks as another shard's session does. A shard restored ahead of the others is
    /// rewound to the earliest shard's clock (`rewind_clock`), and the replay then moves every
    /// shard's clock through the same sessions, so all of them close each window at the same session.
    Covered,
}

/// What one batch produced.
#[derive(Default)]
pub struct Processed {
    pub closed: Vec<ClosedWindow>,
    /// Late sessions' impressions (side output).
    pub late: Vec<RecordBatch>,
    /// Rows newly admitted to windows, per window start, in order; a window's rows are all handed
    /// out before it appears in `closed`.
    pub added: Vec<(i64, RecordBatch)>,
    /// Session keys newly admitted, per window start (the duplicate filter's checkpoint delta).
    pub admitted: Vec<(i64, u64)>,
}

#[derive(Default)]
struct OpenWindow {
    sessions: HashSet<u64>,
}

/// Per-partition clock: the highest event time seen and when the partition last spoke.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionClock {
    pub max_event_ms: i64,
    #[serde(skip)]
    pub last_seen: Option<Instant>,
}

pub struct WindowOperator {
    spec: WindowSpec,
    partitions: BTreeMap<String, PartitionClock>,
    watermark: i64,
    event_watermark: i64,
    open: BTreeMap<i64, OpenWindow>,
    counters: WindowCounters,
    /// How far one session may move its partition's clock past the watermark (plus lateness).
    max_clock_jump_ms: Option<i64>,
}

/// The operator's checkpointable scalars (the duplicate filter is persisted separately).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperatorSnapshot {
    pub partitions: BTreeMap<String, PartitionClock>,
    pub watermark: i64,
    pub counters: WindowCounters,
    /// The watermark as events moved it, before an end-of-stream flush closed every window: the
    /// reference of retention and of the lookback horizon (a flushed outlier window cannot move it).
    #[serde(default)]
    pub event_watermark: Option<i64>,
}

impl WindowOperator {
    pub fn new(spec: WindowSpec) -> Self {
        WindowOperator {
            spec,
            partitions: BTreeMap::new(),
            watermark: i64::MIN,
            event_watermark: i64::MIN,
            open: BTreeMap::new(),
            counters: WindowCounters::default(),
            max_clock_jump_ms: None,
        }
    }

    /// Bounds how far one session can move its partition's clock beyond the current watermark
    /// (plus the allowed lateness): a single outlier event time then advances the watermark by at
    /// most `jump_ms`, instead of closing every window up to it and declaring the rest of the stream
    /// late. A genuine fast-forward still gets there, `jump_ms` per session.
    pub fn with_max_clock_jump(mut self, jump_ms: Option<i64>) -> Self {
        self.max_clock_jump_ms = jump_ms;
        self
    }

    /// Rebuilds from a snapshot plus the open windows' duplicate filters (`window_start`, session keys).
    pub fn restore(spec: WindowSpec, snapshot: OperatorSnapshot, filters: Vec<(i64, Vec<u64>)>) -> Self {
        let mut op = WindowOperator::new(spec);
        op.partitions = snapshot.partitions;
        op.watermark = snapshot.watermark;
        op.event_watermark = snapshot.event_watermark.unwrap_or(snapshot.watermark);
        op.counters = snapshot.counters;
        let now = Instant::now();
        for clock in op.partitions.values_mut() {
            clock.last_seen = Some(now);
        }
        for (start, keys) in filters {
            op.open.entry(start).or_default().sessions.extend(keys);
        }
        op
    }

    /// Sets the clocks and the watermark to `to`'s (the earliest shard's after a crash between the
    /// shards' checkpoints), keeping this shard's open windows and counters. A clock is not a
    /// function of the offsets read alone: one session moves its partition's clock at most
    /// `max_clock_jump` past the watermark of the moment, so the clocks depend on how the reader
    /// interleaved the partitions, and a replay interleaves them anew. A shard ahead that kept its
    /// own clocks closed windows at other sessions than the shards replaying, and the merged view,
    /// which writes a window once, kept a window with only the first shards' shares.
    pub fn rewind_clock(&mut self, to: &OperatorSnapshot) {
        let now = Instant::now();
        self.partitions = to.partitions.iter().map(|(k, c)| (k.clone(), PartitionClock { max_event_ms: c.max_event_ms, last_seen: Some(now) })).collect();
        self.watermark = to.watermark;
        self.event_watermark = to.event_watermark.unwrap_or(to.watermark);
    }

    pub fn snapshot(&self) -> OperatorSnapshot {
        OperatorSnapshot {
            partitions: self.partitions.clone(),
            watermark: self.watermark,
            counters: self.counters.clone(),
            event_watermark: Some(self.event_watermark),
        }
    }

    pub fn spec(&self) -> &WindowSpec {
        &self.spec
    }

    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    pub fn counters(&self) -> &WindowCounters {
        &self.counters
    }

    /// Registers a partition that has not produced yet: it holds the watermark at its (unknown) event
    /// time until it produces or stays silent past the idle timeout.
    pub fn register_partition(&mut self, key: &str, now: Instant) {
        if !self.partitions.contains_key(key) {
            self.partitions.insert(key.to_string(), PartitionClock { max_event_ms: i64::MIN, last_seen: Some(now) });
        }
    }

    /// Marks a partition as not idle now, though it has not spoken: its source still holds records
    /// of it below the high watermark, unread (a broker serving it behind the others, or a consumer
    /// that fetched the others first). Judged by the wall clock alone, such a partition would go
    /// idle while its records wait, the others' clocks would close its windows, and its sessions
    /// would then be counted late.
    pub fn hold_partition(&mut self, key: &str, now: Instant) {
        match self.partitions.get_mut(key) {
            Some(clock) => clock.last_seen = Some(now),
            None => self.register_partition(key, now),
        }
    }

    /// Assigns one decoded batch. Decisions are made session by session in arrival order (the
    /// watermark moves after each session), so they do not depend on how records were batched.
    pub fn process(&mut self, batch: &DecodedBatch, now: Instant) -> Processed {
        self.process_shard(batch, now, |_| Role::Mine)
    }

    /// Assigns the sessions of `batch` whose role is `Mine`; sessions of other shards only move the
    /// clocks, so every shard of a stream closes the same windows at the same session as one
    /// operator over all of it would. `Covered` sessions were counted before a restart and also only
    /// move the clocks.
    pub fn process_shard(&mut self, batch: &DecodedBatch, now: Instant, role: impl Fn(usize) -> Role) -> Processed {
        let mut out = Processed::default();
        let rb = &batch.impressions;
        if rb.num_rows() == 0 {
            return out;
        }
        let times = rb.column_by_name(col::EVENT_TIME).expect("impressions schema").as_primitive::<TimestampMillisecondType>();
        let ids = rb.column_by_name(col::SESSION_ID).expect("impressions schema").as_string::<i32>();
        let mut pending: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        let mut late_rows: Vec<u32> = Vec::new();
        let mut row = 0usize;
        for (i, origin) in batch.origins.iter().enumerate() {
            let rows = row as u32..(row + origin.rows) as u32;
            let t = times.value(row);
            let first = row;
            row += origin.rows;
            if role(i) == Role::Mine {
                let targets: Vec<i64> = self.spec.windows_for(t).filter(|s| s + self.spec.size_ms > self.watermark).collect();
                let key = session_key(ids.value(first));
                if targets.is_empty() {
                    self.counters.late_sessions += 1;
                    self.counters.late_impressions += origin.rows as u64;
                    late_rows.extend(rows);
                } else if self.open.values().any(|w| w.sessions.contains(&key)) {
                    // Counted once while any window holding it is open, whatever event time the re-send
                    // carries (a retry stamped anew would otherwise count again in the next window).
                    self.counters.duplicate_sessions += 1;
                } else {
                    self.counters.sessions += 1;
                    self.counters.impressions += origin.rows as u64;
                    self.counters.repeated_items += origin.repeated_items as u64;
                    for s in targets {
                        self.open.entry(s).or_default().sessions.insert(key);
                        out.admitted.push((s, key));
                        pending.entry(s).or_default().extend(rows.clone());
                    }
                }
            }
            let partition = format!("{}[{}]", origin.stream, origin.partition);
            let ceiling = match self.max_clock_jump_ms {
                Some(jump) if self.watermark > i64::MIN => self.watermark.saturating_add(self.spec.allowed_lateness_ms).saturating_add(jump),
                _ => i64::MAX,
            };
            let clock = self.partitions.entry(partition).or_insert(PartitionClock { max_event_ms: t.min(ceiling), last_seen: None });
            // A registered partition starts at i64::MIN; its first event sets the clock.
            clock.max_event_ms = clock.max_event_ms.max(t.min(ceiling));
            clock.last_seen = Some(now);
            self.advance_watermark(now, rb, &mut pending, &mut out);
        }
        self.materialize(rb, &mut pending, &mut out, None);
        if !late_rows.is_empty() {
            out.late.push(take(rb, late_rows));
        }
        out
    }

    /// Watermark = min over active partitions of (max event time − allowed lateness); never moves back.
    fn advance_watermark(&mut self, now: Instant, rb: &RecordBatch, pending: &mut BTreeMap<i64, Vec<u32>>, out: &mut Processed) {
        let idle = Duration::from_millis(self.spec.idle_timeout_ms.max(0) as u64);
        let active = self.partitions.values().filter(|c| c.last_seen.is_none_or(|s| now.duration_since(s) < idle));
        let candidate = active.map(|c| c.max_event_ms).min().or_else(|| self.partitions.values().map(|c| c.max_event_ms).max());
        let candidate = candidate.filter(|m| *m > i64::MIN);
        if let Some(m) = candidate {
            let wm = m.saturating_sub(self.spec.allowed_lateness_ms);
            self.event_watermark = self.event_watermark.max(wm);
            if wm > self.watermark {
                self.watermark = wm;
                let closing: Vec<i64> = self.open.keys().copied().filter(|s| s + self.spec.size_ms <= wm).collect();
                if !closing.is_empty() {
                    self.materialize(rb, pending, out, Some(&closing));
                    for s in closing {
                        out.closed.push(self.close(s));
                    }
                }
            }
        }
    }

    fn close(&mut self, start: i64) -> ClosedWindow {
        self.open.remove(&start);
        self.counters.windows_closed += 1;
        ClosedWindow { start, end: start + self.spec.size_ms }
    }

    /// Moves pending row indices of `only` (or all) windows into those windows' batches.
    fn materialize(&mut self, rb: &RecordBatch, pending: &mut BTreeMap<i64, Vec<u32>>, out: &mut Processed, only: Option<&[i64]>) {
        let starts: Vec<i64> = match only {
            Some(s) => s.to_vec(),
            None => pending.keys().copied().collect(),
        };
        for s in starts {
            if let Some(rows) = pending.remove(&s) {
                if rows.is_empty() {
                    continue;
                }
                out.added.push((s, take(rb, rows)));
            }
        }
    }

    /// Closes every open window (end of a bounded stream, or an explicit flush).
    pub fn flush_all(&mut self) -> Vec<ClosedWindow> {
        let starts: Vec<i64> = self.open.keys().copied().collect();
        if let Some(last) = starts.last() {
            self.watermark = self.watermark.max(last + self.spec.size_ms);
        }
        starts.into_iter().map(|s| self.close(s)).collect()
    }

    /// Windows still open, to tell which persisted segments are garbage.
    pub fn open_starts(&self) -> BTreeSet<i64> {
        self.open.keys().copied().collect()
    }
}

fn take(rb: &RecordBatch, rows: Vec<u32>) -> RecordBatch {
    take_record_batch(rb, &UInt32Array::from(rows)).expect("indices are in range")
}
