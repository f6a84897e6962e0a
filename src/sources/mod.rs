//! Where sessions come from: the `[source]` config that names a kind of source, each kind in one
//! file (`file`, `kafka`, `simulator`) implementing the `Source` trait (`interface.rs`). The readers themselves
//! (`RecordSource`) are the streaming core's, re-exported here.

pub mod file;
pub mod kafka;
pub mod simulator;

pub mod interface;

pub use interface::{Source, SourceContext};
use serde::{Deserialize, Serialize};
pub use ultr_core::sources::{click_log, secrets, Poll, RawRecord, RecordSource, ResumeOffsets, SourceHealth, SourcePosition};

/// `[source]`: where sessions come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum SourceConfig {
    /// Session files (plain or gzip) in the `[decode]` format, read in order.
    File(file::FileSourceConfig),
    Kafka(kafka::KafkaSourceConfig),
    /// The built-in simulator (the `[simulator]` table).
    Simulator,
}

impl SourceConfig {
    /// The configured kind (the only place that tells the kinds apart).
    pub fn kind(&self) -> &dyn Source {
        match self {
            SourceConfig::File(f) => f,
            SourceConfig::Kafka(k) => k,
            SourceConfig::Simulator => &simulator::SimulatorSource,
        }
    }
}
