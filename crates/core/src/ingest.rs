//! Ingest: pull raw records from a source, decode them, and hand out impression batches with their
//! resume offsets and the records that were refused, and keep the run's running totals.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, BooleanArray};
use datafusion::arrow::record_batch::RecordBatch;
use serde::Serialize;

use crate::session::schema::col;
use crate::session::{DecodeLimits, Decoder};
use crate::sinks::dead_letter::{DeadLetter, ReasonCounts};
use crate::sources::{Poll, RecordSource, ResumeOffsets};

/// One decoded batch and what it covers.
pub struct DecodedBatch {
    pub impressions: RecordBatch,
    /// Records read (accepted + refused).
    pub records: usize,
    /// Sessions accepted.
    pub sessions: usize,
    pub dead_letters: Vec<DeadLetter>,
    /// Where to resume after this batch, per (stream, partition).
    pub resume: ResumeOffsets,
    /// Each accepted session's origin and row count, in row order (rows of a session are contiguous).
    pub origins: Vec<SessionOrigin>,
}

/// Where an accepted session came from, and how many impression rows it has in the batch.
#[derive(Debug, Clone)]
pub struct SessionOrigin {
    pub stream: std::sync::Arc<str>,
    pub partition: i32,
    /// The record's offset in its (stream, partition).
    pub offset: i64,
    pub rows: usize,
    /// Items the session listed but the decoder dropped as repeats of an earlier `doc_id`.
    pub repeated_items: u32,
}

/// What the decoding side of a state has fixed so far, checkpointed in the manifest so a restart
/// decodes exactly as the run before it did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecoderState {
    /// The feature dimension the stream locked to.
    pub feature_dim: Option<usize>,
    pub bias_feature_dim: Option<usize>,
    /// Newest accepted event time per replayed stream (the reference clock of `future_event_time`).
    #[serde(default)]
    pub stream_clocks: BTreeMap<String, i64>,
}

/// Source + decoder: the same stream of decoded batches whatever the source.
pub struct Ingest<S> {
    source: S,
    decoder: Decoder,
    batch_records: usize,
    resume: ResumeOffsets,
    /// `decode.max_clock_skew` in ms; `None` disables the future-event-time check.
    max_clock_skew_ms: Option<i64>,
    /// `decode.max_event_age` in ms, for live sources.
    max_event_age_ms: Option<i64>,
    stream_clocks: BTreeMap<String, i64>,
    /// The latest wall clock this process has read: the future-time guard's reference never steps
    /// back with the clock (an NTP correction would otherwise refuse valid live records).
    wall_high_ms: i64,
}

/// The guard's live reference: the wall clock, but never earlier than it has been.
fn monotonic_wall(high: &mut i64, wall_ms: i64) -> i64 {
    *high = (*high).max(wall_ms);
    *high
}

pub enum Next {
    Batch(DecodedBatch),
    Idle,
    End,
}

impl<S: RecordSource> Ingest<S> {
    pub fn new(source: S, limits: DecodeLimits, batch_records: usize) -> Self {
        let max_clock_skew_ms = limits.max_clock_skew_ms();
        let max_event_age_ms = limits.max_event_age_ms();
        Ingest {
            source,
            decoder: Decoder::new(limits),
            batch_records: batch_records.max(1),
            resume: ResumeOffsets::default(),
            max_clock_skew_ms,
            max_event_age_ms,
            stream_clocks: BTreeMap::new(),
            wall_high_ms: i64::MIN,
        }
    }

    /// Continues from a checkpointed decoder state (locked dimensions, stream clocks).
    pub fn restore(&mut self, state: &DecoderState) {
        self.decoder.lock_dims(state.feature_dim, state.bias_feature_dim);
        for (k, v) in &state.stream_clocks {
            let slot = self.stream_clocks.entry(k.clone()).or_insert(*v);
            *slot = (*slot).max(*v);
        }
    }

    /// What to checkpoint so a restart decodes the same way.
    pub fn decoder_state(&self) -> DecoderState {
        DecoderState { feature_dim: self.decoder.feature_dim(), bias_feature_dim: self.decoder.bias_feature_dim(), stream_clocks: self.stream_clocks.clone() }
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Offsets after everything handed out so far.
    pub fn resume(&self) -> &ResumeOffsets {
        &self.resume
    }

    /// Reads until the source ends, writing dead letters and handing every batch to `on_batch`;
    /// returns the run's totals.
    pub fn drain(&mut self, dead: &mut crate::sinks::dead_letter::DeadLetterSink, mut on_batch: impl FnMut(DecodedBatch)) -> anyhow::Result<IngestSummary> {
        let mut summary = IngestSummary::default();
        loop {
            match self.next()? {
                Next::Batch(batch) => {
                    for letter in &batch.dead_letters {
                        dead.write(letter)?;
                    }
                    summary.add(&batch);
                    on_batch(batch);
                }
                Next::Idle => continue,
                Next::End => break,
            }
        }
        dead.flush()?;
        summary.feature_dim = self.decoder.feature_dim();
        Ok(summary)
    }

    #[allow(clippy::should_implement_trait, reason = "a fallible poll with Idle and End, not an Iterator's Option")]
    pub fn next(&mut self) -> anyhow::Result<Next> {
        let records = match self.source.poll(self.batch_records)? {
            Poll::Records(r) => r,
            Poll::Idle => return Ok(Next::Idle),
            Poll::End => return Ok(Next::End),
        };
        let mut dead_letters = Vec::new();
        let mut sessions = 0;
        let mut origins = Vec::with_capacity(records.len());
        let mut batch_resume = ResumeOffsets::default();
        let wall_ms = monotonic_wall(&mut self.wall_high_ms, chrono::Utc::now().timestamp_millis());
        let replay = self.source.replays_history();
        // A live stream's events are judged against the wall clock from below too; a replay's are not.
        let floor = if replay { None } else { self.max_event_age_ms.map(|age| wall_ms.saturating_sub(age)) };
        self.decoder.set_event_time_floor(floor);
        for record in &records {
            let ceiling = self.max_clock_skew_ms.map(|skew| {
                // A replay is judged against its own newest event time as well as the wall clock: a log
                // from the past is never in the future, however long its gaps, and a replay running
                // ahead of the wall clock (a simulation) moves its own reference.
                let reference = if replay { self.stream_clocks.get(&*record.position.stream).map_or(wall_ms, |&clock| clock.max(wall_ms)) } else { wall_ms };
                reference.saturating_add(skew)
            });
            self.decoder.set_event_time_ceiling(ceiling);
            match self.decoder.decode(&record.payload) {
                Ok(rows) => {
                    sessions += 1;
                    if replay {
                        if let Some(t) = self.decoder.last_event_ms() {
                            match self.stream_clocks.get_mut(&*record.position.stream) {
                                Some(clock) => *clock = (*clock).max(t),
                                None => {
                                    self.stream_clocks.insert(record.position.stream.to_string(), t);
                                }
                            }
                        }
                    }
                    origins.push(SessionOrigin {
                        stream: record.position.stream.clone(),
                        partition: record.position.partition,
                        offset: record.position.offset,
                        rows,
                        repeated_items: self.decoder.last_repeats(),
                    });
                }
                Err(rejected) => dead_letters.push(DeadLetter {
                    reason: rejected.reason,
                    detail: rejected.detail,
                    payload: record.payload.clone(),
                    position: record.position.clone(),
                }),
            }
            batch_resume.advance(record);
        }
        self.resume.merge(&batch_resume);
        Ok(Next::Batch(DecodedBatch {
            impressions: self.decoder.finish(),
            records: records.len(),
            sessions,
            dead_letters,
            resume: self.resume.clone(),
            origins,
        }))
    }
}

/// Running totals of an ingest run (records, sessions, impressions, clicks, dead letters by reason).
#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestSummary {
    pub records: u64,
    pub sessions: u64,
    pub impressions: u64,
    pub clicks: u64,
    pub dead_letters: ReasonCounts,
    pub feature_dim: Option<usize>,
}

impl IngestSummary {
    pub fn add(&mut self, batch: &DecodedBatch) {
        self.records += batch.records as u64;
        self.sessions += batch.sessions as u64;
        self.impressions += batch.impressions.num_rows() as u64;
        if let Some(clicked) = batch.impressions.column_by_name(col::CLICKED).and_then(|c| c.as_any().downcast_ref::<BooleanArray>()) {
            self.clicks += clicked.true_count() as u64;
        }
        for letter in &batch.dead_letters {
            self.dead_letters.add(letter.reason);
        }
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "records      {}\nsessions     {}\nimpressions  {}\nclicks       {}\ndead letters {}\n",
            self.records,
            self.sessions,
            self.impressions,
            self.clicks,
            self.dead_letters.total()
        );
        for (reason, n) in &self.dead_letters.0 {
            out.push_str(&format!("  {reason:<28} {n}\n"));
        }
        if let Some(d) = self.feature_dim {
            out.push_str(&format!("feature dim  {d}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    /// Regression: a wall clock stepping back (NTP) lowered the future-time ceiling with it, and
    /// live records stamped by producers on the right time were refused as `future_event_time`.
    #[test]
    fn the_guard_reference_never_steps_back_with_the_wall_clock() {
        let mut high = i64::MIN;
        assert_eq!(super::monotonic_wall(&mut high, 10_000), 10_000);
        assert_eq!(super::monotonic_wall(&mut high, 4_000), 10_000, "stepped back 6 s");
        assert_eq!(super::monotonic_wall(&mut high, 12_000), 12_000);
    }
}
