//! The configured pipeline: opens the source the pipeline file names (files, Kafka, the simulator)
//! and runs the streaming core's loop (`crate::pipeline`) on it.

use std::path::Path;

use ultr_core::sources::{RecordSource, ResumeOffsets};

use crate::config::PipelineConfig;

pub use ultr_core::pipeline::*;

/// The configured source, positioned at the state's resume offsets.
pub fn open_source(config: &PipelineConfig, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> {
    config.source.kind().open(&config.source_context(), resume)
}

/// Runs until a bounded source ends (or the observer asks to stop), checkpointing into `state_dir`.
pub fn run_to_state(config: &PipelineConfig, state_dir: &Path, observer: &mut dyn Observer) -> anyhow::Result<RunReport> {
    run_with_source(&config.core(), state_dir, observer, &|resume| open_source(config, resume))
}
