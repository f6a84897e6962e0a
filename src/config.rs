//! Pipeline configuration files (`pipelines/*.toml`): documented structs that reject unknown keys, and
//! errors that name the file and the key.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::session::DecodeLimits;
use crate::simulate::SimConfig;
use crate::sources::kafka::KafkaSourceConfig;

/// Where sessions come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum SourceConfig {
    /// JSONL files (plain or gzip), read in order.
    File { paths: Vec<std::path::PathBuf> },
    Kafka(KafkaSourceConfig),
    /// The built-in simulator (the `[simulator]` table).
    Simulator,
}

/// Where refused records go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum DeadLetterConfig {
    File { path: std::path::PathBuf },
    Kafka { brokers: String, topic: String },
}

/// A whole pipeline config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    pub source: SourceConfig,
    #[serde(default)]
    pub decode: DecodeLimits,
    pub dead_letter: Option<DeadLetterConfig>,
    /// Sessions per decoded batch.
    #[serde(default = "default_batch_records")]
    pub batch_records: usize,
    #[serde(default)]
    pub simulator: SimConfig,
}

fn default_batch_records() -> usize {
    4096
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config {path}: {message}")]
    Invalid { path: String, message: String },
}

impl PipelineConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses config text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid { path: origin.to_string(), message };
        let config: PipelineConfig = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if config.batch_records == 0 {
            return Err(invalid("key `batch_records` must be >= 1".into()));
        }
        if config.decode.max_items == 0 || config.decode.max_features == 0 {
            return Err(invalid("keys `decode.max_items` and `decode.max_features` must be >= 1".into()));
        }
        if matches!(config.source, SourceConfig::Simulator) {
            config.simulator.validate().map_err(|e| invalid(format!("[simulator]: {e}")))?;
        }
        Ok(config)
    }
}
