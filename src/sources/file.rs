//! The file source kind: session files read in order, each resuming at its byte offset.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
pub use ultr_core::sources::file::*;

use super::interface::{Source, SourceContext};
use ultr_core::sources::{RecordSource, ResumeOffsets};

/// `[source.file]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSourceConfig {
    /// The files, read in this order (gzip detected by its magic bytes).
    pub paths: Vec<PathBuf>,
}

impl Source for FileSourceConfig {
    fn open(&self, context: &SourceContext<'_>, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> {
        let framing = ultr_core::session::codec::open(&context.decode.codec())?.file_framing();
        Ok(Box::new(FileChain::new(self.paths.clone(), resume.clone()).framed(framing)))
    }

    fn identity(&self, _: &SourceContext<'_>) -> String {
        self.paths.iter().map(|p| stream_name(p)).collect::<Vec<_>>().join(",")
    }

    fn describe(&self, _: &SourceContext<'_>) -> String {
        format!("file {}", self.paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
    }

    fn expected_records(&self, _: &SourceContext<'_>) -> Option<u64> {
        ultr_core::progress::estimate_records(&self.paths)
    }
}
