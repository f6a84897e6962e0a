//! The file source kind: session files read in order, each resuming at its byte offset.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
pub use ultr_core::sources::file::*;

use super::{RecordSource, ResumeOffsets, Source};
use crate::config::PipelineConfig;

/// `[source.file]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSourceConfig {
    /// The files, read in this order (gzip detected by its magic bytes).
    pub paths: Vec<PathBuf>,
}

impl Source for FileSourceConfig {
    fn open(&self, config: &PipelineConfig, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> {
        let framing = ultr_core::session::codec::open(&config.decode)?.file_framing();
        Ok(Box::new(FileChain::new(self.paths.clone(), resume.clone()).framed(framing)))
    }

    fn identity(&self, _: &PipelineConfig) -> String {
        self.paths.iter().map(|p| stream_name(p)).collect::<Vec<_>>().join(",")
    }

    fn describe(&self, _: &PipelineConfig) -> String {
        format!("file {}", self.paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
    }

    fn expected_records(&self, _: &PipelineConfig) -> Option<u64> {
        ultr_core::progress::estimate_records(&self.paths)
    }
}
