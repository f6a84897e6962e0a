//! File source, plain or gzip: one session per line (JSON) or each behind its varint length (the
//! binary formats), positioned by byte offset.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use flate2::read::MultiGzDecoder;

use super::{Poll, RawRecord, RecordSource, SourcePosition};
use crate::session::codec::FileFraming;

/// Reads a JSONL file line by line. Offsets are byte offsets into the (decompressed) text, so a
/// restart from a checkpoint resumes at the exact next line.
pub struct FileSource {
    reader: Box<dyn BufRead + Send>,
    stream: Arc<str>,
    offset: u64,
    line: Vec<u8>,
    framing: FileFraming,
}

impl FileSource {
    /// Opens `path` (gzip is detected by its magic bytes) and skips to `start_offset`.
    pub fn open(path: &Path, start_offset: u64) -> anyhow::Result<Self> {
        let reader = open_lines(path, start_offset)?;
        Ok(FileSource { reader, stream: stream_name(path).into(), offset: start_offset, line: Vec::new(), framing: FileFraming::Lines })
    }

    /// Records laid out as `framing` says (the codec's `file_framing`).
    pub fn framed(mut self, framing: FileFraming) -> Self {
        self.framing = framing;
        self
    }

    /// The next length-delimited record: `None` at the end; a record cut short by the file's end is
    /// returned as it is (its codec refuses it as truncated, and it is dead-lettered, not lost).
    fn next_delimited(&mut self) -> anyhow::Result<Option<(Vec<u8>, u64)>> {
        let mut len = 0u64;
        let mut header = 0u64;
        loop {
            let mut byte = [0u8; 1];
            if self.reader.read(&mut byte)? == 0 {
                return Ok((header > 0).then(|| (Vec::new(), header)));
            }
            len |= u64::from(byte[0] & 0x7f) << (7 * header);
            header += 1;
            if byte[0] & 0x80 == 0 || header == 10 {
                break;
            }
        }
        let mut payload = Vec::new();
        (&mut self.reader).take(len).read_to_end(&mut payload)?;
        let n = header + payload.len() as u64;
        Ok(Some((payload, n)))
    }

    /// The stream name this source stamps on positions: the file path as given.
    pub fn stream(&self) -> &str {
        &self.stream
    }
}

/// `path`'s text from byte `start_offset` of the decompressed text: gzip (by its magic bytes)
/// decompressed, a plain file as it is.
pub fn open_lines(path: &Path, start_offset: u64) -> anyhow::Result<Box<dyn BufRead + Send>> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).with_context(|| format!("reading {}", path.display()))?;
    file.seek(SeekFrom::Start(0))?;
    let gzip = n == 2 && magic == [0x1f, 0x8b];
    let mut reader: Box<dyn BufRead + Send> = if gzip {
        Box::new(BufReader::with_capacity(1 << 20, MultiGzDecoder::new(file)))
    } else {
        file.seek(SeekFrom::Start(start_offset))?;
        Box::new(BufReader::with_capacity(1 << 20, file))
    };
    if gzip && start_offset > 0 {
        // gzip cannot seek: decompress and discard up to the resume point.
        let skipped = std::io::copy(&mut (&mut reader).take(start_offset), &mut std::io::sink())?;
        anyhow::ensure!(skipped == start_offset, "{} ends before resume offset {start_offset}", path.display());
    }
    Ok(reader)
}

pub fn stream_name(path: &Path) -> String {
    let p: PathBuf = path.into();
    format!("file:{}", p.display())
}

impl RecordSource for FileSource {
    fn replays_history(&self) -> bool {
        true
    }

    fn poll(&mut self, max: usize) -> anyhow::Result<Poll> {
        let mut out = Vec::with_capacity(max.min(4096));
        while out.len() < max && self.framing == FileFraming::LengthDelimited {
            let Some((payload, n)) = self.next_delimited()? else { break };
            let start = self.offset;
            self.offset += n;
            out.push(RawRecord {
                payload,
                position: SourcePosition { stream: self.stream.clone(), partition: 0, offset: start as i64 },
                next_offset: self.offset as i64,
            });
        }
        while out.len() < max && self.framing == FileFraming::Lines {
            self.line.clear();
            let n = self.reader.read_until(b'\n', &mut self.line)?;
            if n == 0 {
                break;
            }
            let start = self.offset;
            self.offset += n as u64;
            let mut payload = std::mem::take(&mut self.line);
            while matches!(payload.last(), Some(b'\n' | b'\r')) {
                payload.pop();
            }
            if payload.iter().all(|b| b.is_ascii_whitespace()) {
                continue; // blank lines are not records
            }
            out.push(RawRecord {
                payload,
                position: SourcePosition { stream: self.stream.clone(), partition: 0, offset: start as i64 },
                next_offset: self.offset as i64,
            });
        }
        Ok(if out.is_empty() { Poll::End } else { Poll::Records(out) })
    }
}

/// Several files read in order, each resuming at its own offset.
pub struct FileChain {
    paths: Vec<PathBuf>,
    framing: FileFraming,
    resume: super::ResumeOffsets,
    current: Option<FileSource>,
    next: usize,
}

impl FileChain {
    pub fn new(paths: Vec<PathBuf>, resume: super::ResumeOffsets) -> Self {
        FileChain { paths, framing: FileFraming::Lines, resume, current: None, next: 0 }
    }

    /// Records laid out as `framing` says (the codec's `file_framing`).
    pub fn framed(mut self, framing: FileFraming) -> Self {
        self.framing = framing;
        self
    }
}

impl RecordSource for FileChain {
    fn replays_history(&self) -> bool {
        true
    }

    fn poll(&mut self, max: usize) -> anyhow::Result<Poll> {
        loop {
            if self.current.is_none() {
                let Some(path) = self.paths.get(self.next) else { return Ok(Poll::End) };
                self.next += 1;
                let start = self.resume.get(&stream_name(path), 0).unwrap_or(0);
                self.current = Some(FileSource::open(path, start as u64)?.framed(self.framing));
            }
            match self.current.as_mut().expect("just opened").poll(max)? {
                Poll::End => self.current = None,
                other => return Ok(other),
            }
        }
    }
}
