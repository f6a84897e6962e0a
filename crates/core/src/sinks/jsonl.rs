//! File session sink, plain or gzip (by `.gz` extension): one record per line (JSON) or each behind
//! its varint length (the binary formats).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use flate2::write::GzEncoder;

use super::SessionSink;
use crate::session::codec::FileFraming;

pub struct JsonlSink {
    out: Box<dyn Write + Send>,
    framing: FileFraming,
}

impl JsonlSink {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let out: Box<dyn Write + Send> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(GzEncoder::new(BufWriter::with_capacity(1 << 20, file), flate2::Compression::fast()))
        } else {
            Box::new(BufWriter::with_capacity(1 << 20, file))
        };
        Ok(JsonlSink { out, framing: FileFraming::Lines })
    }

    pub fn to_writer(out: Box<dyn Write + Send>) -> Self {
        JsonlSink { out, framing: FileFraming::Lines }
    }

    /// Records laid out as `framing` says (the codec's `file_framing`).
    pub fn framed(mut self, framing: FileFraming) -> Self {
        self.framing = framing;
        self
    }
}

impl SessionSink for JsonlSink {
    fn send(&mut self, _key: &str, payload: &[u8]) -> anyhow::Result<()> {
        match self.framing {
            FileFraming::Lines => {
                self.out.write_all(payload)?;
                self.out.write_all(b"\n")?;
            }
            FileFraming::LengthDelimited => {
                let mut len = Vec::with_capacity(10);
                crate::session::codec::wire::put_varint(&mut len, payload.len() as u64);
                self.out.write_all(&len)?;
                self.out.write_all(payload)?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

impl Drop for JsonlSink {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}
