//! Where refused records go (`[dead_letter]`): the dead-letter sink's settings.

use serde::{Deserialize, Serialize};

/// Where refused records go. Every letter carries at most `max_payload_bytes` of its record (default
/// 256 KiB; the full length and SHA-256 are always kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum DeadLetterConfig {
    File {
        path: std::path::PathBuf,
        /// Rotate the file (to `<path>.1`, `.2`, …) at a checkpoint once it is larger than this.
        #[serde(default = "default_dead_letter_file_bytes")]
        max_file_bytes: u64,
        /// Rotated files kept.
        #[serde(default = "default_dead_letter_keep")]
        keep_files: usize,
        #[serde(default = "default_max_payload_bytes")]
        max_payload_bytes: usize,
    },
    Kafka {
        brokers: String,
        topic: String,
        /// librdkafka properties, as for `[source.kafka]` (TLS, SASL; `env:`/`file:` secrets).
        #[serde(default)]
        properties: std::collections::BTreeMap<String, String>,
        #[serde(default = "default_max_payload_bytes")]
        max_payload_bytes: usize,
    },
}

fn default_dead_letter_file_bytes() -> u64 {
    256 << 20
}
fn default_dead_letter_keep() -> usize {
    4
}
fn default_max_payload_bytes() -> usize {
    super::dead_letter::DEFAULT_MAX_PAYLOAD_BYTES
}

impl DeadLetterConfig {
    /// A file target with the default bounds.
    pub fn file(path: std::path::PathBuf) -> Self {
        DeadLetterConfig::File {
            path,
            max_file_bytes: default_dead_letter_file_bytes(),
            keep_files: default_dead_letter_keep(),
            max_payload_bytes: default_max_payload_bytes(),
        }
    }
}
