//! Sessions written in the configured format: the JSON records the simulator and the click-log
//! importer build, re-encoded by the codec before the sink takes them.

use std::sync::Arc;

use super::SessionSink;
use crate::session::Codec;

pub struct Encoding<S> {
    codec: Arc<dyn Codec>,
    inner: S,
    buf: Vec<u8>,
}

impl<S: SessionSink> Encoding<S> {
    pub fn new(codec: Arc<dyn Codec>, inner: S) -> Self {
        Encoding { codec, inner, buf: Vec::with_capacity(16 << 10) }
    }
}

impl<S: SessionSink> SessionSink for Encoding<S> {
    fn send(&mut self, key: &str, payload: &[u8]) -> anyhow::Result<()> {
        self.buf.clear();
        self.codec.transcode_json(payload, &mut self.buf)?;
        self.inner.send(key, &self.buf)
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        self.inner.flush()
    }
}
