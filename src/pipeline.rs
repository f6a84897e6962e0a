//! The configured pipeline: opens the source the pipeline file names (files, Kafka, the simulator)
//! and runs the streaming core's loop (`crate::pipeline`) on it, locally or as one instance of a
//! scale-out group, as the pipeline file says.

use std::path::{Path, PathBuf};

use ultr_core::context::PipelineContext;
use ultr_core::sources::{RecordSource, ResumeOffsets};

use crate::config::PipelineConfig;

pub use ultr_core::pipeline::*;

/// The configured source, positioned at the state's resume offsets.
pub fn open_source(config: &PipelineConfig, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> {
    config.source.kind().open(&config.source_context(), resume)
}

/// Runs until a bounded source ends (or the observer asks to stop), checkpointing into `state_dir`,
/// on a pipeline context of the config's own.
pub fn run_to_state(config: &PipelineConfig, state_dir: &Path, observer: &mut dyn Observer) -> anyhow::Result<RunReport> {
    run_to_state_in(&config.context(), config, state_dir, observer)
}

/// `run_to_state` on `context` (shared with the rest of a service).
pub fn run_to_state_in(context: &PipelineContext, config: &PipelineConfig, state_dir: &Path, observer: &mut dyn Observer) -> anyhow::Result<RunReport> {
    run_with_source(context, &config.core(), state_dir, observer, &|resume| open_source(config, resume))
}

/// What `ingest` did: the run's report, and where the merged view of a scale-out group is.
pub struct Ingested {
    pub report: RunReport,
    /// A scale-out instance's merged view (as of its last compaction or fetch); `None` locally.
    pub merged_view: Option<PathBuf>,
}

/// Ingests until a bounded source ends into `state_dir`: as one instance of a scale-out group where
/// the pipeline file has `[state.object_store]`, else locally (`run_to_state`).
pub fn ingest(context: &PipelineContext, config: &PipelineConfig, state_dir: &Path, observer: &mut dyn Observer) -> anyhow::Result<Ingested> {
    if config.state.object_store.is_some() {
        let report = crate::scale_out::run(context, &config.core(), config.scale_out_source()?, state_dir, observer)?;
        Ok(Ingested { report, merged_view: Some(crate::scale_out::merged_dir(state_dir)) })
    } else {
        Ok(Ingested { report: run_to_state_in(context, config, state_dir, observer)?, merged_view: None })
    }
}
