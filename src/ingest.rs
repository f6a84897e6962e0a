//! Ingest: pull raw records from a source, decode them, and hand out impression batches with their
//! resume offsets and the records that were refused.

use datafusion::arrow::record_batch::RecordBatch;

use crate::session::{DecodeLimits, Decoder};
use crate::sinks::dead_letter::DeadLetter;
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
    pub rows: usize,
}

/// Source + decoder: the same stream of decoded batches whatever the source.
pub struct Ingest<S> {
    source: S,
    decoder: Decoder,
    batch_records: usize,
    resume: ResumeOffsets,
}

pub enum Next {
    Batch(DecodedBatch),
    Idle,
    End,
}

impl<S: RecordSource> Ingest<S> {
    pub fn new(source: S, limits: DecodeLimits, batch_records: usize) -> Self {
        Ingest { source, decoder: Decoder::new(limits), batch_records: batch_records.max(1), resume: ResumeOffsets::default() }
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
    pub fn drain(
        &mut self,
        dead: &mut crate::sinks::dead_letter::DeadLetterSink,
        mut on_batch: impl FnMut(DecodedBatch),
    ) -> anyhow::Result<crate::summary::IngestSummary> {
        let mut summary = crate::summary::IngestSummary::default();
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
        for record in &records {
            match self.decoder.decode(&record.payload) {
                Ok(rows) => {
                    sessions += 1;
                    origins.push(SessionOrigin { stream: record.position.stream.clone(), partition: record.position.partition, rows });
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
