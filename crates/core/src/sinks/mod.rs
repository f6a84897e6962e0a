//! Where records go out: Kafka and files for sessions (in the configured format), and the dead-letter output for refused records.

pub mod config;
pub mod dead_letter;
pub mod encode;
pub mod jsonl;
pub mod kafka;
pub mod rekey;

/// Something that takes serialized sessions (the simulator writes through this).
pub trait SessionSink {
    fn send(&mut self, key: &str, payload: &[u8]) -> anyhow::Result<()>;
    /// Blocks until everything sent is durable at the destination.
    fn flush(&mut self) -> anyhow::Result<()>;
}

impl SessionSink for Box<dyn SessionSink> {
    fn send(&mut self, key: &str, payload: &[u8]) -> anyhow::Result<()> {
        (**self).send(key, payload)
    }
    fn flush(&mut self) -> anyhow::Result<()> {
        (**self).flush()
    }
}
