//! What a kind of source is: the `Source` trait the pipeline, the service and the CLI hold, and the
//! parts of the pipeline config a kind may read (`SourceContext`).

use ultr_core::session::DecodeLimits;
use ultr_core::sources::kafka::KafkaSourceConfig;
use ultr_core::sources::{RecordSource, ResumeOffsets};
use ultr_simulate::{GroundTruth, SimConfig};

/// The parts of the pipeline config beyond `[source]` that a kind reads.
pub struct SourceContext<'a> {
    /// `[decode]`: the format, which fixes how a file holds records.
    pub decode: &'a DecodeLimits,
    /// `[simulator]`.
    pub simulator: &'a SimConfig,
}

/// What the pipeline, the service and the CLI ask of a configured source kind.
pub trait Source {
    /// The reader, positioned at the state's resume offsets.
    fn open(&self, context: &SourceContext<'_>, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>>;

    /// A stable name for the stream, recorded in the state's manifest.
    fn identity(&self, context: &SourceContext<'_>) -> String;

    /// The stream in words, for the status page.
    fn describe(&self, context: &SourceContext<'_>) -> String;

    /// How many records a bounded source holds, where it can tell cheaply (a progress bar's length).
    fn expected_records(&self, _context: &SourceContext<'_>) -> Option<u64> {
        None
    }

    /// The Kafka subscription instances share the partitions of (`[state.object_store]` scale-out).
    fn kafka(&self) -> Option<&KafkaSourceConfig> {
        None
    }

    /// Checks the parts of the pipeline config this kind reads, beyond their types.
    fn validate(&self, _context: &SourceContext<'_>) -> Result<(), String> {
        Ok(())
    }

    /// The truth behind the stream, where the source knows it (the simulator).
    fn ground_truth(&self, _context: &SourceContext<'_>) -> anyhow::Result<Option<GroundTruth>> {
        Ok(None)
    }
}
