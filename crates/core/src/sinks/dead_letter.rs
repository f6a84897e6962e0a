//! Dead-letter output: every refused record, its original bytes (up to a cap) and its reason, to a
//! file or a Kafka topic. A dead-letter sink never stops ingest: an oversized record is cut to
//! `max_payload_bytes` (its full length and SHA-256 kept), and a Kafka letter that cannot be
//! delivered is counted (`failed`), not retried forever.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use base64::Engine;
use rdkafka::message::{Header, OwnedHeaders};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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

/// The JSON form of a dead letter in a file. The payload is stored once: as text in `payload` when
/// it is UTF-8 (readable), otherwise as `payload_base64`. Payloads longer than the cap keep their
/// first `max_payload_bytes` (cut at a character boundary for text) with `truncated: true`;
/// `payload_bytes` and `payload_sha256` always describe the whole original record.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadLetterLine {
    pub reason: String,
    pub detail: String,
    pub source: String,
    pub partition: i32,
    pub offset: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    #[serde(default)]
    pub payload_bytes: u64,
    #[serde(default)]
    pub payload_sha256: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl DeadLetterLine {
    /// The stored payload bytes (the whole record unless `truncated`).
    pub fn original_bytes(&self) -> anyhow::Result<Vec<u8>> {
        match (&self.payload, &self.payload_base64) {
            (Some(text), _) => Ok(text.as_bytes().to_vec()),
            (None, Some(b64)) => Ok(base64::engine::general_purpose::STANDARD.decode(b64)?),
            (None, None) => Ok(Vec::new()),
        }
    }
}

/// Largest payload a dead letter carries by default: far below Kafka's ~1 MB message limit.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 256 << 10;

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The first at most `max` bytes of `payload` (at a UTF-8 boundary when it is text) and whether it was cut.
fn capped(payload: &[u8], max: usize) -> (&[u8], bool) {
    if payload.len() <= max {
        return (payload, false);
    }
    let mut end = max;
    if std::str::from_utf8(payload).is_ok() {
        while end > 0 && (payload[end] & 0xC0) == 0x80 {
            end -= 1;
        }
    }
    (&payload[..end], true)
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
    File { out: BufWriter<File>, path: std::path::PathBuf },
    Kafka(Box<KafkaSink>),
    Discard,
}

/// Writes dead letters and counts them by reason.
pub struct DeadLetterSink {
    target: Target,
    counts: ReasonCounts,
    max_payload_bytes: usize,
    /// Letters that could not be delivered (Kafka target), so far.
    failed: u64,
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
        let f = OpenOptions::new().create(true).append(true).open(path).with_context(|| format!("opening dead-letter file {}", path.display()))?;
        if let Some(len) = committed {
            let now = f.metadata()?.len();
            if now > len {
                tracing::info!("dead-letter file {}: dropping {} bytes written after the last checkpoint (they are replayed)", path.display(), now - len);
                f.set_len(len).with_context(|| format!("truncating {} to its checkpointed length", path.display()))?;
                f.sync_data()?;
            }
        }
        Ok(Self::with_target(Target::File { out: BufWriter::new(f), path: path.to_path_buf() }))
    }

    /// Publishes the original bytes to a Kafka topic with `ultr.reason`, `ultr.detail`,
    /// `ultr.source`, `ultr.payload_bytes`, `ultr.payload_sha256` (and `ultr.truncated`) headers.
    pub fn kafka(sink: KafkaSink) -> Self {
        Self::with_target(Target::Kafka(Box::new(sink)))
    }

    /// Counts only (for benchmarks and dry runs).
    pub fn discard() -> Self {
        Self::with_target(Target::Discard)
    }

    fn with_target(target: Target) -> Self {
        DeadLetterSink { target, counts: ReasonCounts::default(), max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES, failed: 0 }
    }

    /// Caps the payload bytes one letter carries.
    pub fn with_max_payload_bytes(mut self, max: usize) -> Self {
        self.max_payload_bytes = max.max(1);
        self
    }

    /// Letters that could not be delivered so far (Kafka target).
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// When the file has grown past `max_bytes`, moves it to `<path>.1` (older ones to `.2` …,
    /// keeping `keep` of them) and starts an empty file. Call only right after a checkpoint
    /// recorded the file's length, then record length 0. Returns whether it rotated.
    pub fn rotate_if_larger(&mut self, max_bytes: u64, keep: usize) -> anyhow::Result<bool> {
        let Target::File { out, path } = &mut self.target else { return Ok(false) };
        out.flush()?;
        if out.get_ref().metadata()?.len() <= max_bytes {
            return Ok(false);
        }
        let numbered = |i: usize| std::path::PathBuf::from(format!("{}.{i}", path.display()));
        let _ = std::fs::remove_file(numbered(keep.max(1)));
        for i in (1..keep.max(1)).rev() {
            if numbered(i).exists() {
                std::fs::rename(numbered(i), numbered(i + 1))?;
            }
        }
        std::fs::rename(&*path, numbered(1)).with_context(|| format!("rotating {}", path.display()))?;
        let f = OpenOptions::new().create(true).append(true).open(&*path).with_context(|| format!("opening {}", path.display()))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir).and_then(|d| d.sync_all())?;
        }
        *out = BufWriter::new(f);
        Ok(true)
    }

    pub fn counts(&self) -> &ReasonCounts {
        &self.counts
    }

    /// The file's length (call after `flush`), for the checkpoint; `None` for other targets.
    pub fn file_len(&self) -> anyhow::Result<Option<u64>> {
        match &self.target {
            Target::File { out, .. } => Ok(Some(out.get_ref().metadata()?.len())),
            _ => Ok(None),
        }
    }

    /// Writes a refused record and counts it by reason.
    pub fn write(&mut self, letter: &DeadLetter) -> anyhow::Result<()> {
        self.counts.add(letter.reason);
        self.write_labelled(letter.reason.as_str(), &letter.detail, &letter.payload, &letter.position)
    }

    /// Writes a letter whose reason is not a decode [`Reason`] (`ultr import`'s refused log lines),
    /// in the same form: payload capped, its length and SHA-256 those of the whole original bytes.
    /// Not counted in [`DeadLetterSink::counts`].
    pub fn write_labelled(&mut self, reason: &str, detail: &str, payload: &[u8], position: &SourcePosition) -> anyhow::Result<()> {
        let (kept, truncated) = capped(payload, self.max_payload_bytes);
        let sha = sha256_hex(payload);
        match &mut self.target {
            Target::File { out, .. } => {
                let text = std::str::from_utf8(kept).ok();
                let line = DeadLetterLine {
                    reason: reason.to_string(),
                    detail: detail.to_string(),
                    source: position.stream.to_string(),
                    partition: position.partition,
                    offset: position.offset,
                    payload: text.map(str::to_string),
                    payload_base64: text.is_none().then(|| base64::engine::general_purpose::STANDARD.encode(kept)),
                    payload_bytes: payload.len() as u64,
                    payload_sha256: sha,
                    truncated,
                };
                serde_json::to_writer(&mut *out, &line)?;
                out.write_all(b"\n")?;
            }
            Target::Kafka(sink) => {
                let source = position.to_string();
                let length = payload.len().to_string();
                let mut detail = detail.to_string();
                if detail.len() > 4096 {
                    let mut end = 4096;
                    while !detail.is_char_boundary(end) {
                        end -= 1;
                    }
                    detail.truncate(end);
                }
                let mut headers = OwnedHeaders::new()
                    .insert(Header { key: "ultr.reason", value: Some(reason) })
                    .insert(Header { key: "ultr.detail", value: Some(detail.as_str()) })
                    .insert(Header { key: "ultr.source", value: Some(source.as_str()) })
                    .insert(Header { key: "ultr.payload_bytes", value: Some(length.as_str()) })
                    .insert(Header { key: "ultr.payload_sha256", value: Some(sha.as_str()) });
                if truncated {
                    headers = headers.insert(Header { key: "ultr.truncated", value: Some("true") });
                }
                if let Err(e) = sink.try_send_with_headers(&source, kept, headers) {
                    self.failed += 1;
                    tracing::warn!("dead letter for {source} not delivered: {e:#}");
                }
            }
            Target::Discard => {}
        }
        Ok(())
    }

    /// Makes every written dead letter durable. A Kafka target waits a bounded time and counts
    /// undelivered letters in `failed` instead of failing ingest.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        match &mut self.target {
            Target::File { out, .. } => {
                out.flush()?;
                out.get_ref().sync_data()?;
            }
            Target::Kafka(sink) => {
                let undelivered = sink.flush_bounded(std::time::Duration::from_secs(2));
                if undelivered > 0 {
                    tracing::warn!("{undelivered} dead letters not delivered at this flush");
                }
                self.failed = sink.failed().max(self.failed);
            }
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
