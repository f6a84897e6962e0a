//! `ultr import`'s work: a released click log file, plain or gzip, through [`ClickLogImporter`]
//! into a session sink, every refused line or page through the [`DeadLetterSink`] that ingest uses.

use std::io::BufRead;
use std::path::Path;

use anyhow::Context;

use crate::sinks::dead_letter::DeadLetterSink;
use crate::sinks::SessionSink;
use crate::sources::click_log::{ClickLogImporter, ImportSummary, Imported, TimeMapping};
use crate::sources::file::{open_lines, stream_name};
use crate::sources::SourcePosition;

/// Imports the log at `path`: each page becomes one contract record sent to `sessions` (keyed by
/// its query id); each refusal is a dead letter positioned at the byte offset where its line or
/// page starts, carrying the log's own bytes (a line that is not UTF-8 included). Flushes both.
pub fn import_click_log(
    path: &Path,
    time: TimeMapping,
    policy_id: &str,
    sessions: &mut dyn SessionSink,
    dead: &mut DeadLetterSink,
) -> anyhow::Result<ImportSummary> {
    let mut reader = open_lines(path, 0)?;
    let stream: std::sync::Arc<str> = stream_name(path).into();
    let mut importer = ClickLogImporter::new(time, policy_id);
    let mut summary = ImportSummary::default();
    let mut emit = |out: &mut Vec<Imported>| -> anyhow::Result<()> {
        for item in out.drain(..) {
            summary.add(&item);
            match item {
                Imported::Session { key, json, .. } => sessions.send(&key, json.as_bytes())?,
                Imported::Refused { offset, reason, detail, payload, .. } => {
                    let position = SourcePosition { stream: stream.clone(), partition: 0, offset: offset as i64 };
                    dead.write_labelled(reason.as_str(), &detail, &payload, &position)?;
                }
            }
        }
        Ok(())
    };
    let (mut out, mut buf, mut offset) = (Vec::new(), Vec::new(), 0u64);
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        match std::str::from_utf8(line) {
            Ok(text) => importer.push_line(text, offset, &mut out),
            Err(_) => importer.push_undecodable(line, offset, &mut out),
        }
        offset += n as u64;
        emit(&mut out)?;
    }
    importer.finish(&mut out);
    emit(&mut out)?;
    sessions.flush()?;
    dead.flush()?;
    summary.lines = importer.lines();
    Ok(summary)
}
