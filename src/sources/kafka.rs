//! The Kafka source kind: topics read by a consumer group, resuming at the state's offsets.

pub use ultr_core::sources::kafka::*;

use super::interface::{Source, SourceContext};
use ultr_core::sources::{RecordSource, ResumeOffsets};

impl Source for KafkaSourceConfig {
    fn open(&self, _: &SourceContext<'_>, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> {
        Ok(Box::new(KafkaSource::new(self, resume.clone())?))
    }

    // The group is not part of the identity: the manifest, not the group, says where to resume.
    fn identity(&self, _: &SourceContext<'_>) -> String {
        format!("kafka:topics={}", self.topics.join(","))
    }

    fn describe(&self, _: &SourceContext<'_>) -> String {
        format!("Kafka topic(s) {}", self.topics.join(", "))
    }

    fn kafka(&self) -> Option<&KafkaSourceConfig> {
        Some(self)
    }
}
