//! Ingest: pull raw records from a source, decode them, and hand out impression batches with their
//! resume offsets and the records that were refused, and keep the run's running totals.
//!
//! With several decoders (`Ingest::decoders`), one poll's records are cut into consecutive stretches
//! decoded side by side, each by a sibling decoder that starts from the stream's locked dimensions
//! and judges no future event time. The stretches are then confirmed in order against what only a
//! reading in order knows — each stream's clock (the future-time ceiling) and the dimensions the
//! stream locks — so every record is accepted or refused, for the same reason, as one decoder would;
//! a stretch whose guess cannot be confirmed (a refused record had locked a dimension, or an earlier
//! stretch locked one) is decoded again in order.

use std::collections::{BTreeMap, VecDeque};

use datafusion::arrow::array::{Array, BooleanArray};
use datafusion::arrow::record_batch::RecordBatch;
use serde::Serialize;

use crate::session::decode::future_event_time;
use crate::session::schema::col;
use crate::session::{DecodeLimits, Decoder, Rejected};
use crate::sinks::dead_letter::{DeadLetter, ReasonCounts};
use crate::sources::{Poll, RawRecord, RecordSource, ResumeOffsets};

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
    /// The decoder's state after this batch: what a checkpoint taken after it keeps.
    pub decoder: DecoderState,
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
    /// Offsets after every record decoded so far (some may wait in `ready`).
    decoded: ResumeOffsets,
    /// `decode.max_clock_skew` in ms; `None` disables the future-event-time check.
    max_clock_skew_ms: Option<i64>,
    /// `decode.max_event_age` in ms, for live sources.
    max_event_age_ms: Option<i64>,
    stream_clocks: BTreeMap<String, i64>,
    /// The latest wall clock this process has read: the future-time guard's reference never steps
    /// back with the clock (an NTP correction would otherwise refuse valid live records).
    wall_high_ms: i64,
    /// Sibling decoders of one poll's stretches, decoded side by side (none: one decoder reads in order).
    siblings: Vec<Decoder>,
    /// Batches decoded and not handed out yet (one per stretch of the last poll).
    ready: VecDeque<DecodedBatch>,
    /// Offsets after the last batch handed out.
    handed: ResumeOffsets,
}

/// A stretch shorter than this is not worth a thread of its own.
const MIN_STRETCH: usize = 64;

/// What a sibling decoder made of one record of its stretch, before the stretch is confirmed.
enum Guess {
    Accepted {
        rows: usize,
        event_ms: i64,
        repeats: u32,
        /// The record's own vector dimensions, and whether it locked one the stretch had not.
        dims: (Option<usize>, Option<usize>),
        locked: bool,
    },
    Refused {
        rejected: Rejected,
        /// Its event time, where a lower ceiling would have refused it as `future_event_time` first.
        judged_ms: Option<i64>,
    },
}

/// A sibling decoder's stretch: the rows of the records it accepted, and a guess per record.
struct Stretch {
    impressions: RecordBatch,
    guesses: Vec<Guess>,
    /// The dimensions it started from.
    dims: (Option<usize>, Option<usize>),
}

fn guess(decoder: &mut Decoder, records: &[RawRecord], dims: (Option<usize>, Option<usize>), floor: Option<i64>) -> Stretch {
    decoder.set_dims(dims.0, dims.1);
    decoder.set_event_time_floor(floor);
    decoder.set_event_time_ceiling(None);
    let mut guesses = Vec::with_capacity(records.len());
    for record in records {
        let before = (decoder.feature_dim(), decoder.bias_feature_dim());
        guesses.push(match decoder.decode(&record.payload) {
            Ok(rows) => Guess::Accepted {
                rows,
                event_ms: decoder.last_event_ms().expect("an accepted record has an event time"),
                repeats: decoder.last_repeats(),
                dims: decoder.last_dims(),
                locked: (decoder.feature_dim(), decoder.bias_feature_dim()) != before,
            },
            Err(rejected) => Guess::Refused { rejected, judged_ms: decoder.judged_event_ms() },
        });
    }
    Stretch { impressions: decoder.finish(), guesses, dims }
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
            decoded: ResumeOffsets::default(),
            max_clock_skew_ms,
            max_event_age_ms,
            stream_clocks: BTreeMap::new(),
            wall_high_ms: i64::MIN,
            siblings: Vec::new(),
            ready: VecDeque::new(),
            handed: ResumeOffsets::default(),
        }
    }

    /// Reads records with `codec` (the configured format: `session::codec::open`) instead of JSON.
    pub fn codec(mut self, codec: std::sync::Arc<dyn crate::session::Codec>) -> Self {
        let (f, b) = (self.decoder.feature_dim(), self.decoder.bias_feature_dim());
        self.decoder = Decoder::with_codec(self.decoder.limits().clone(), codec);
        self.decoder.set_dims(f, b);
        let n = self.siblings.len();
        self.siblings = (0..n).map(|_| self.decoder.sibling()).collect();
        self
    }

    /// Decodes each poll in `n` stretches side by side (1: in order, on the caller's thread), each
    /// stretch handed out as a batch of its own. A poll still reads `batch_records` records: polling
    /// `n` times as many measured more peak memory (docs/benchmarks.md).
    pub fn decoders(mut self, n: usize) -> Self {
        self.siblings = if n > 1 { (0..n).map(|_| self.decoder.sibling()).collect() } else { Vec::new() };
        self
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
        &self.handed
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
        if self.ready.is_empty() {
            let records = match self.source.poll(self.batch_records)? {
                Poll::Records(r) => r,
                Poll::Idle => return Ok(Next::Idle),
                Poll::End => return Ok(Next::End),
            };
            self.decode_poll(records);
        }
        let batch = self.ready.pop_front().expect("a poll with records decodes at least one batch");
        self.handed = batch.resume.clone();
        Ok(Next::Batch(batch))
    }

    /// Decodes one poll's records into `ready`: in order, or in stretches side by side.
    fn decode_poll(&mut self, mut records: Vec<RawRecord>) {
        let wall_ms = monotonic_wall(&mut self.wall_high_ms, chrono::Utc::now().timestamp_millis());
        let replay = self.source.replays_history();
        // A live stream's events are judged against the wall clock from below too; a replay's are not.
        let floor = if replay { None } else { self.max_event_age_ms.map(|age| wall_ms.saturating_sub(age)) };
        self.decoder.set_event_time_floor(floor);
        let n = self.siblings.len().min(records.len() / MIN_STRETCH);
        if n < 2 {
            let batch = self.decode_in_order(records, wall_ms, replay);
            self.ready.push_back(batch);
            return;
        }
        let len = records.len().div_ceil(n);
        let mut parts = Vec::with_capacity(n);
        while records.len() > len {
            let tail = records.split_off(len);
            parts.push(std::mem::replace(&mut records, tail));
        }
        parts.push(records);
        let dims = (self.decoder.feature_dim(), self.decoder.bias_feature_dim());
        let work: Vec<(&mut Decoder, &Vec<RawRecord>)> = self.siblings.iter_mut().zip(&parts).collect();
        let guessed: Vec<Stretch> = crate::runtime::in_threads(work, n, |(decoder, part)| guess(decoder, part, dims, floor));
        for (part, stretch) in parts.into_iter().zip(guessed) {
            let batch = match self.confirm(part, stretch, wall_ms, replay) {
                Ok(batch) => batch,
                Err(part) => self.decode_in_order(part, wall_ms, replay),
            };
            self.ready.push_back(batch);
        }
    }

    /// The future-time ceiling of a record of `stream` under `clocks`.
    fn ceiling(&self, clocks: &BTreeMap<String, i64>, stream: &str, wall_ms: i64, replay: bool) -> Option<i64> {
        self.max_clock_skew_ms.map(|skew| {
            // A replay is judged against its own newest event time as well as the wall clock: a log
            // from the past is never in the future, however long its gaps, and a replay running
            // ahead of the wall clock (a simulation) moves its own reference.
            let reference = if replay { clocks.get(stream).map_or(wall_ms, |&clock| clock.max(wall_ms)) } else { wall_ms };
            reference.saturating_add(skew)
        })
    }

    /// Advances `stream`'s clock to an accepted session's event time (replays only).
    fn tick(clocks: &mut BTreeMap<String, i64>, stream: &str, t: i64) {
        match clocks.get_mut(stream) {
            Some(clock) => *clock = (*clock).max(t),
            None => {
                clocks.insert(stream.to_string(), t);
            }
        }
    }

    /// One decoder reads `records` in order.
    fn decode_in_order(&mut self, records: Vec<RawRecord>, wall_ms: i64, replay: bool) -> DecodedBatch {
        let mut tally = Tally::new(records.len());
        for record in records {
            let ceiling = self.ceiling(&self.stream_clocks, &record.position.stream, wall_ms, replay);
            self.decoder.set_event_time_ceiling(ceiling);
            match self.decoder.decode(&record.payload) {
                Ok(rows) => {
                    if replay {
                        if let Some(t) = self.decoder.last_event_ms() {
                            Self::tick(&mut self.stream_clocks, &record.position.stream, t);
                        }
                    }
                    tally.accept(&record, rows, self.decoder.last_repeats());
                }
                Err(rejected) => tally.refuse(record, rejected),
            }
        }
        let impressions = self.decoder.finish();
        self.hand_out(tally, impressions)
    }

    /// A batch from its tally and rows: the offsets after it, and the decoder state after it.
    fn hand_out(&mut self, tally: Tally, impressions: RecordBatch) -> DecodedBatch {
        self.decoded.merge(&tally.resume);
        DecodedBatch {
            impressions,
            records: tally.records,
            sessions: tally.origins.len(),
            dead_letters: tally.dead_letters,
            resume: self.decoded.clone(),
            origins: tally.origins,
            decoder: self.decoder_state(),
        }
    }

    /// A stretch's guesses confirmed in order: its batch, or the stretch back when a guess cannot
    /// stand (it started from dimensions an earlier stretch has since locked, or a record it
    /// accepted and locked a dimension with is refused as `future_event_time`).
    fn confirm(&mut self, records: Vec<RawRecord>, stretch: Stretch, wall_ms: i64, replay: bool) -> Result<DecodedBatch, Vec<RawRecord>> {
        if stretch.dims != (self.decoder.feature_dim(), self.decoder.bias_feature_dim()) {
            return Err(records);
        }
        // First the verdicts, on a copy of the clocks: nothing changes when the stretch goes back.
        let mut clocks = self.stream_clocks.clone();
        let mut future: Vec<Option<i64>> = Vec::with_capacity(records.len());
        let mut dims = stretch.dims;
        let mut stands = true;
        for (record, guess) in records.iter().zip(&stretch.guesses) {
            let ceiling = self.ceiling(&clocks, &record.position.stream, wall_ms, replay);
            let beyond = |t: i64| ceiling.filter(|&c| t > c);
            match guess {
                Guess::Accepted { event_ms, locked, dims: own, .. } => match beyond(*event_ms) {
                    Some(_) if *locked => {
                        stands = false;
                        break;
                    }
                    Some(c) => future.push(Some(c)),
                    None => {
                        if replay {
                            Self::tick(&mut clocks, &record.position.stream, *event_ms);
                        }
                        dims = (dims.0.or(own.0), dims.1.or(own.1));
                        future.push(None);
                    }
                },
                Guess::Refused { judged_ms: Some(t), .. } => future.push(beyond(*t)),
                Guess::Refused { judged_ms: None, .. } => future.push(None),
            }
        }
        if !stands {
            return Err(records);
        }
        self.stream_clocks = clocks;
        self.decoder.lock_dims(dims.0, dims.1);
        let mut tally = Tally::new(records.len());
        let refused_rows = stretch.guesses.iter().zip(&future).any(|(g, f)| matches!(g, Guess::Accepted { .. }) && f.is_some());
        let mut keep = refused_rows.then(|| Vec::with_capacity(stretch.impressions.num_rows()));
        for ((record, guess), future) in records.into_iter().zip(stretch.guesses).zip(future) {
            let rejected = match (guess, future) {
                (Guess::Accepted { rows, repeats, .. }, None) => {
                    tally.accept(&record, rows, repeats);
                    if let Some(keep) = keep.as_mut() {
                        keep.extend(std::iter::repeat_n(true, rows));
                    }
                    continue;
                }
                (Guess::Accepted { rows, event_ms, .. }, Some(ceiling)) => {
                    if let Some(keep) = keep.as_mut() {
                        keep.extend(std::iter::repeat_n(false, rows));
                    }
                    future_event_time(event_ms, ceiling)
                }
                (Guess::Refused { judged_ms: Some(t), .. }, Some(ceiling)) => future_event_time(t, ceiling),
                (Guess::Refused { rejected, .. }, _) => rejected,
            };
            tally.refuse(record, rejected);
        }
        let impressions = match keep {
            Some(keep) => datafusion::arrow::compute::filter_record_batch(&stretch.impressions, &BooleanArray::from(keep))
                .expect("the mask has a value per row of the stretch"),
            None => stretch.impressions,
        };
        Ok(self.hand_out(tally, impressions))
    }
}

/// What a batch's records came to, record by record in order: the sessions accepted, the dead
/// letters, and the offsets after them.
struct Tally {
    records: usize,
    origins: Vec<SessionOrigin>,
    dead_letters: Vec<DeadLetter>,
    resume: ResumeOffsets,
}

impl Tally {
    fn new(records: usize) -> Tally {
        Tally { records, origins: Vec::with_capacity(records), dead_letters: Vec::new(), resume: ResumeOffsets::default() }
    }

    fn accept(&mut self, record: &RawRecord, rows: usize, repeated_items: u32) {
        self.resume.advance(record);
        let p = &record.position;
        self.origins.push(SessionOrigin { stream: p.stream.clone(), partition: p.partition, offset: p.offset, rows, repeated_items });
    }

    fn refuse(&mut self, record: RawRecord, rejected: Rejected) {
        self.resume.advance(&record);
        self.dead_letters.push(DeadLetter { reason: rejected.reason, detail: rejected.detail, payload: record.payload, position: record.position });
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

    /// Adds another summary's counts (files decoded one after another); the feature width is the
    /// first one seen.
    pub fn absorb(&mut self, other: IngestSummary) {
        self.records += other.records;
        self.sessions += other.sessions;
        self.impressions += other.impressions;
        self.clicks += other.clicks;
        for (reason, n) in other.dead_letters.0 {
            *self.dead_letters.0.entry(reason).or_default() += n;
        }
        self.feature_dim = self.feature_dim.or(other.feature_dim);
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

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::session::Reason;
    use crate::sources::file::FileSource;

    /// A replayed log whose acceptance depends on reading in order: event times up to 3 h past the
    /// wall clock (each accepted only within `max_clock_skew` of the stream's newest accepted one),
    /// sessions without features before the first with, a future session carrying the first
    /// features (it must not lock the dimension), vectors of another length, and empty pages.
    fn tricky_log(records: usize, seed: u64) -> String {
        let now = chrono::Utc::now().timestamp_millis();
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            state >> 33
        };
        let mut out = String::new();
        for i in 0..records {
            let r = next();
            // Mostly a slow climb past the wall clock; now and then a jump beyond the skew. The first
            // session, 30 minutes ahead, is accepted, and from then on the stream's clock and not the
            // wall clock (read at each poll) is every ceiling's reference.
            let ahead_min = 30 + (i as i64 * 180 / records as i64) + if r % 7 == 0 && i > 0 { 75 } else { 0 };
            let t = now + ahead_min * 60_000;
            let dim = match (i, r % 11) {
                (0..=150, _) => None,
                (_, 0) => Some(4),
                _ => Some(3),
            };
            let items: Vec<String> = (1..=(r % 4))
                .map(|k| {
                    let f = dim.map_or(String::new(), |d| format!(",\"features\":[{}]", vec!["0.5"; d].join(",")));
                    format!("{{\"doc_id\":\"d{}\",\"position\":{k},\"clicked\":{}{f}}}", next() % 5, k == 1)
                })
                .collect();
            out.push_str(&format!(
                "{{\"schema_version\":1,\"session_id\":\"s{i}\",\"query_id\":\"q{}\",\"event_time\":{t},\"policy_id\":\"p\",\"items\":[{}]}}\n",
                r % 13,
                items.join(",")
            ));
            if i == 140 {
                // The first features of the stream, on a session beyond the skew.
                out.push_str(&format!(
                    "{{\"schema_version\":1,\"session_id\":\"x\",\"query_id\":\"q\",\"event_time\":{},\"policy_id\":\"p\",\"items\":[{{\"doc_id\":\"d\",\"position\":1,\"clicked\":true,\"features\":[1,2,3,4,5]}}]}}\n",
                    t + 7_200_000
                ));
            }
        }
        out
    }

    type Decoded = (RecordBatch, Vec<(i64, usize, u32)>, Vec<(Reason, String, i64)>, DecoderState, ResumeOffsets, Vec<(ResumeOffsets, DecoderState)>);

    /// Everything a run of `decoders` decoders hands out, batches joined: rows, origins, dead letters
    /// (reason, detail, offset), the decoder's final state and offsets, and each batch's offsets
    /// and decoder state.
    fn decode_all(path: &std::path::Path, decoders: usize, batch_records: usize) -> Decoded {
        let mut ingest = Ingest::new(FileSource::open(path, 0).unwrap(), DecodeLimits::default(), batch_records).decoders(decoders);
        let (mut batches, mut origins, mut letters, mut states) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        while let Next::Batch(b) = ingest.next().unwrap() {
            states.push((b.resume.clone(), b.decoder.clone()));
            batches.push(b.impressions);
            origins.extend(b.origins.iter().map(|o| (o.offset, o.rows, o.repeated_items)));
            letters.extend(b.dead_letters.into_iter().map(|l| (l.reason, l.detail, l.position.offset)));
        }
        let rows = datafusion::arrow::compute::concat_batches(&crate::session::impressions_schema(), &batches).unwrap();
        (rows, origins, letters, ingest.decoder_state(), ingest.resume().clone(), states)
    }

    /// Decoding in stretches side by side hands out what one decoder reading in order does: the
    /// same rows, sessions, dead letters with the same reason and detail, and the same final clocks
    /// and dimensions, on logs where acceptance depends on the order (several seeds; 2 and 3
    /// decoders). Each batch's decoder state is the in-order state after that batch's last record
    /// (what a checkpoint after it keeps). The log is checked to hold the order-dependent cases it
    /// is built for.
    pub fn decoding_in_stretches_side_by_side_equals_decoding_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for seed in [1, 2, 3, 4] {
            let path = dir.path().join(format!("log-{seed}.jsonl"));
            std::fs::write(&path, tricky_log(1200, seed)).unwrap();
            let in_order = decode_all(&path, 1, 400);
            // The state after every single record, read in order one at a time.
            let after_each: BTreeMap<String, DecoderState> =
                decode_all(&path, 1, 1).5.into_iter().map(|(resume, state)| (format!("{resume:?}"), state)).collect();
            let count = |reason: Reason| in_order.2.iter().filter(|l| l.0 == reason).count();
            assert!(
                count(Reason::FutureEventTime) > 10 && count(Reason::FeatureLengthMismatch) > 10 && count(Reason::NoItems) > 10,
                "seed {seed}: {:?}",
                in_order.2.len()
            );
            assert_eq!(in_order.3.feature_dim, Some(3), "seed {seed}: the future session must not lock 5");
            for decoders in [2, 3] {
                let side_by_side = decode_all(&path, decoders, 400);
                assert!(side_by_side.5.len() >= decoders * (in_order.5.len() - 1), "seed {seed}: each full poll was cut into {decoders} stretches");
                for (resume, state) in &side_by_side.5 {
                    assert_eq!(
                        Some(state),
                        after_each.get(&format!("{resume:?}")),
                        "seed {seed}, {decoders} decoders: the state of the batch ending at {resume:?}"
                    );
                }
                assert_eq!(side_by_side.0, in_order.0, "seed {seed}, {decoders} decoders: rows");
                assert_eq!(side_by_side.1, in_order.1, "seed {seed}, {decoders} decoders: sessions");
                let first = side_by_side.2.iter().zip(&in_order.2).position(|(a, b)| a != b).unwrap_or(side_by_side.2.len().min(in_order.2.len()));
                assert!(
                    side_by_side.2 == in_order.2,
                    "seed {seed}, {decoders} decoders: dead letters differ first at {first} of {} and {}: {:?} against {:?}",
                    side_by_side.2.len(),
                    in_order.2.len(),
                    side_by_side.2.get(first),
                    in_order.2.get(first)
                );
                assert_eq!(side_by_side.3, in_order.3, "seed {seed}, {decoders} decoders: decoder state");
                assert_eq!(side_by_side.4, in_order.4, "seed {seed}, {decoders} decoders: resume offsets");
            }
        }
    }

    /// Regression: a wall clock stepping back (NTP) lowered the future-time ceiling with it, and
    /// live records stamped by producers on the right time were refused as `future_event_time`.
    pub fn the_guard_reference_never_steps_back_with_the_wall_clock() {
        let mut high = i64::MIN;
        assert_eq!(super::monotonic_wall(&mut high, 10_000), 10_000);
        assert_eq!(super::monotonic_wall(&mut high, 4_000), 10_000, "stepped back 6 s");
        assert_eq!(super::monotonic_wall(&mut high, 12_000), 12_000);
    }
}
