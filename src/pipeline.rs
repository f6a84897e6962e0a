//! The configured pipeline: opens the source the pipeline file names (files, Kafka, the simulator)
//! and runs the streaming core's loop (`crate::pipeline`) on it.

use std::path::Path;
use std::sync::Arc;

use ultr_core::sources::file::FileChain;
use ultr_core::sources::kafka::KafkaSource;
use ultr_core::sources::{RecordSource, ResumeOffsets};
use ultr_simulate::Simulator;

use crate::config::{PipelineConfig, SourceConfig};

pub use ultr_core::pipeline::*;

/// The configured source, positioned at the state's resume offsets.
pub fn open_source(config: &PipelineConfig, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> {
    Ok(match &config.source {
        SourceConfig::File { paths } => {
            Box::new(FileChain::new(paths.clone(), resume.clone()).framed(ultr_core::session::codec::open(&config.decode)?.file_framing()))
        }
        SourceConfig::Kafka(k) => Box::new(KafkaSource::new(k, resume.clone())?),
        SourceConfig::Simulator => ultr_simulate::source::open(Arc::new(Simulator::new(config.simulator.clone())?), resume),
    })
}

/// Runs until a bounded source ends (or the observer asks to stop), checkpointing into `state_dir`.
pub fn run_to_state(config: &PipelineConfig, state_dir: &Path, observer: &mut dyn Observer) -> anyhow::Result<RunReport> {
    run_with_source(&config.core(), state_dir, observer, &|resume| open_source(config, resume))
}
