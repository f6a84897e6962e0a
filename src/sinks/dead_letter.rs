//! Dead-letter output: every refused record, its original bytes and its reason, to a file or a Kafka topic.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use base64::Engine;
use rdkafka::message::{Header, OwnedHeaders};
use serde::{Deserialize, Serialize};

use super::kafka::KafkaSink;
use crate::session::Reason;
use crate::sources::SourcePosition;

/// One refused record.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub reason: Reason,
    pub detail: String,
    pub payload: Vec<u8>,
    pub position: SourcePosition,
}

/// The JSON form of a dead letter in a file. `payload_base64` is always the exact original bytes;
/// `payload` repeats them as text when they are UTF-8, for people reading the file.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadLetterLine {
    pub reason: String,
    pub detail: String,
    pub source: String,
    pub partition: i32,
    pub offset: i64,
    pub payload_base64: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

impl DeadLetterLine {
    pub fn original_bytes(&self) -> anyhow::Result<Vec<u8>> {
        Ok(base64::engine::general_purpose::STANDARD.decode(&self.payload_base64)?)
    }
}

/// Dead letters counted by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReasonCounts(pub BTreeMap<Reason, u64>);

impl ReasonCounts {
    pub fn add(&mut self, reason: Reason) {
        *self.0.entry(reason).or_default() += 1;
    }
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
    pub fn get(&self, reason: Reason) -> u64 {
        self.0.get(&reason).copied().unwrap_or(0)
    }
}

impl Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

enum Target {
    File(BufWriter<File>),
    Kafka(Box<KafkaSink>),
    Discard,
}

/// Writes dead letters and counts them by reason.
pub struct DeadLetterSink {
    target: Target,
    counts: ReasonCounts,
}

impl DeadLetterSink {
    /// Appends to a JSONL file (created if missing).
    pub fn file(path: &Path) -> anyhow::Result<Self> {
        Self::file_resuming(path, None)
    }

    /// Appends to a JSONL file, first cutting it back to `committed` bytes: the length the last
    /// checkpoint recorded. Letters past it were written before a crash and the replay from that
    /// checkpoint writes them again, so keeping them would list a refused record twice.
    pub fn file_resuming(path: &Path, committed: Option<u64>) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening dead-letter file {}", path.display()))?;
        if let Some(len) = committed {
            let now = f.metadata()?.len();
            if now > len {
                tracing::info!("dead-letter file {}: dropping {} bytes written after the last checkpoint (they are replayed)", path.display(), now - len);
                f.set_len(len).with_context(|| format!("truncating {} to its checkpointed length", path.display()))?;
                f.sync_data()?;
            }
        }
        Ok(DeadLetterSink { target: Target::File(BufWriter::new(f)), counts: ReasonCounts::default() })
    }

    /// Publishes the original bytes to a Kafka topic with `ultr.reason`, `ultr.detail`, `ultr.source` headers.
    pub fn kafka(sink: KafkaSink) -> Self {
        DeadLetterSink { target: Target::Kafka(Box::new(sink)), counts: ReasonCounts::default() }
    }

    /// Counts only (for benchmarks and dry runs).
    pub fn discard() -> Self {
        DeadLetterSink { target: Target::Discard, counts: ReasonCounts::default() }
    }

    pub fn counts(&self) -> &ReasonCounts {
        &self.counts
    }

    /// The file's length (call after `flush`), for the checkpoint; `None` for other targets.
    pub fn file_len(&self) -> anyhow::Result<Option<u64>> {
        match &self.target {
            Target::File(out) => Ok(Some(out.get_ref().metadata()?.len())),
            _ => Ok(None),
        }
    }

    pub fn write(&mut self, letter: &DeadLetter) -> anyhow::Result<()> {
        self.counts.add(letter.reason);
        match &mut self.target {
            Target::File(out) => {
                let line = DeadLetterLine {
                    reason: letter.reason.as_str().to_string(),
                    detail: letter.detail.clone(),
                    source: letter.position.stream.to_string(),
                    partition: letter.position.partition,
                    offset: letter.position.offset,
                    payload_base64: base64::engine::general_purpose::STANDARD.encode(&letter.payload),
                    payload: std::str::from_utf8(&letter.payload).ok().map(str::to_string),
                };
                serde_json::to_writer(&mut *out, &line)?;
                out.write_all(b"\n")?;
            }
            Target::Kafka(sink) => {
                let source = letter.position.to_string();
                let headers = OwnedHeaders::new()
                    .insert(Header { key: "ultr.reason", value: Some(letter.reason.as_str()) })
                    .insert(Header { key: "ultr.detail", value: Some(letter.detail.as_str()) })
                    .insert(Header { key: "ultr.source", value: Some(source.as_str()) });
                sink.send_with_headers(&source, &letter.payload, headers)?;
            }
            Target::Discard => {}
        }
        Ok(())
    }

    /// Makes every written dead letter durable.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        match &mut self.target {
            Target::File(out) => {
                out.flush()?;
                out.get_ref().sync_data()?;
            }
            Target::Kafka(sink) => crate::sinks::SessionSink::flush(sink.as_mut())?,
            Target::Discard => {}
        }
        Ok(())
    }
}

/// Reads a dead-letter file back (tests and the `ultr` CLI use this).
pub fn read_dead_letters(path: &Path) -> anyhow::Result<Vec<DeadLetterLine>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad dead-letter line in {}", path.display())))
        .collect()
}
