//! JSONL session sink, plain or gzip (by `.gz` extension).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use flate2::write::GzEncoder;

use super::SessionSink;

pub struct JsonlSink {
    out: Box<dyn Write + Send>,
}

impl JsonlSink {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let out: Box<dyn Write + Send> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(GzEncoder::new(BufWriter::with_capacity(1 << 20, file), flate2::Compression::fast()))
        } else {
            Box::new(BufWriter::with_capacity(1 << 20, file))
        };
        Ok(JsonlSink { out })
    }

    pub fn to_writer(out: Box<dyn Write + Send>) -> Self {
        JsonlSink { out }
    }
}

impl SessionSink for JsonlSink {
    fn send(&mut self, _key: &str, payload: &[u8]) -> anyhow::Result<()> {
        self.out.write_all(payload)?;
        self.out.write_all(b"\n")?;
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
