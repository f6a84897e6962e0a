//! Where sessions come from: the `Source` trait each kind of source implements (one file each:
//! `file`, `kafka`, `simulator`) and the `[source]` config that names one. The readers themselves
//! (`RecordSource`) are the streaming core's, re-exported here.

pub mod file;
pub mod kafka;
pub mod simulator;

use serde::{Deserialize, Serialize};
pub use ultr_core::sources::{click_log, secrets, Poll, RawRecord, RecordSource, ResumeOffsets, SourceHealth, SourcePosition};

use crate::config::PipelineConfig;

/// What the pipeline, the service and the CLI ask of a configured source kind.
pub trait Source {
    /// The reader, positioned at the state's resume offsets.
    fn open(&self, config: &PipelineConfig, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>>;

    /// A stable name for the stream, recorded in the state's manifest.
    fn identity(&self, config: &PipelineConfig) -> String;

    /// The stream in words, for the status page.
    fn describe(&self, config: &PipelineConfig) -> String;

    /// How many records a bounded source holds, where it can tell cheaply (a progress bar's length).
    fn expected_records(&self, _config: &PipelineConfig) -> Option<u64> {
        None
    }

    /// The Kafka subscription instances share the partitions of (`[state.object_store]` scale-out).
    fn kafka(&self) -> Option<&kafka::KafkaSourceConfig> {
        None
    }

    /// Checks the parts of the pipeline config this kind reads, beyond their types.
    fn validate(&self, _config: &PipelineConfig) -> Result<(), String> {
        Ok(())
    }

    /// The truth behind the stream, where the source knows it (the simulator).
    fn ground_truth(&self, _config: &PipelineConfig) -> anyhow::Result<Option<crate::simulate::GroundTruth>> {
        Ok(None)
    }
}

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
