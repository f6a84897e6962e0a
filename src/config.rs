//! Pipeline configuration files (`pipelines/*.toml`): documented structs that reject unknown keys, and
//! errors that name the file and the key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use ultr_core::config::CoreConfig;
use ultr_core::session::DecodeLimits;
use ultr_simulate::SimConfig;

pub use crate::sources::SourceConfig;

/// A whole pipeline config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    #[serde(default)]
    pub window: WindowConfig,
    #[serde(default)]
    pub state: StateConfig,
    #[serde(default)]
    pub identifiability: IdentifiabilityConfig,
    #[serde(default)]
    pub train: ultr_train::config::TrainConfig,
    #[serde(default)]
    pub eval: ultr_train::eval::config::EvalConfig,
    #[serde(default)]
    pub service: crate::service::config::ServiceConfig,
    #[serde(default)]
    pub runtime: ultr_core::runtime::RuntimeConfig,
}

pub use ultr_core::units::{parse_bytes, parse_duration_ms};
// The stage configs the file is made of, each defined by its stage.
pub use ultr_core::identify::config::IdentifiabilityConfig;
pub use ultr_core::sinks::config::DeadLetterConfig;
pub use ultr_core::state::config::StateConfig;
pub use ultr_core::window::config::WindowConfig;

fn default_batch_records() -> usize {
    ultr_core::config::DEFAULT_BATCH_RECORDS
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config {path}: {message}")]
    Invalid { path: String, message: String },
}

impl PipelineConfig {
    /// The streaming core's part of this config (what `ultr ingest` and the service's loop run with).
    pub fn core(&self) -> CoreConfig {
        CoreConfig {
            decode: self.decode.clone(),
            dead_letter: self.dead_letter.clone(),
            batch_records: self.batch_records,
            window: self.window.clone(),
            state: self.state.clone(),
            identifiability: self.identifiability.clone(),
            holdout: self.train.holdout(),
            source_identity: self.source_identity(),
            workers: self.runtime.ingest_workers(),
        }
    }

    /// The Kafka source a scale-out instance (`[state.object_store]`) joins the group of; `parse`
    /// refuses an object store without one.
    pub fn scale_out_source(&self) -> anyhow::Result<&ultr_core::sources::kafka::KafkaSourceConfig> {
        match self.source.kind().kafka() {
            Some(kafka) if self.state.object_store.is_some() => Ok(kafka),
            _ => anyhow::bail!("scale-out needs `[state.object_store]` and `[source.kafka]`"),
        }
    }

    /// How many records the configured source holds, where it knows (files, the simulator): a
    /// progress bar's total.
    pub fn expected_records(&self) -> Option<u64> {
        self.source.kind().expected_records(&self.source_context())
    }

    /// The ground truth of a simulated source (`None` for a real log).
    pub fn ground_truth(&self) -> anyhow::Result<Option<ultr_simulate::GroundTruth>> {
        self.source.kind().ground_truth(&self.source_context())
    }

    /// A stable name for the configured source, recorded in the manifest.
    pub fn source_identity(&self) -> String {
        self.source.kind().identity(&self.source_context())
    }

    /// What a source kind may read of this config beyond `[source]`.
    pub fn source_context(&self) -> crate::sources::SourceContext<'_> {
        crate::sources::SourceContext { decode: &self.decode, simulator: &self.simulator }
    }

    /// The state directory of a command run with the pipeline file `config_path`: `--state`
    /// (`flag`), else `[state] dir`, else `ultr-state/<the file's name without extension>`. One rule
    /// for every command that writes a state (`ingest`, `run`, `compact`).
    pub fn state_dir(&self, flag: Option<&Path>, config_path: &Path) -> PathBuf {
        flag.map(Path::to_path_buf).or_else(|| self.state.dir.clone()).unwrap_or_else(|| {
            PathBuf::from("ultr-state").join(config_path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "pipeline".into()))
        })
    }

    /// The simulator's true θ_k − θ_1, which training draws beside its θ intervals: only when
    /// `[train.uncertainty]` is on and the source is the simulator (building the simulator's truth
    /// is skipped otherwise; none for a real log or a simulator config that does not build).
    pub fn truth_theta(&self) -> Option<Vec<f64>> {
        if !self.train.uncertainty.enabled {
            return None;
        }
        let truth = self.ground_truth().ok().flatten()?;
        Some(ultr_simulate::truth_theta(&truth))
    }

    /// Reads and checks the file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// A pipeline context with this file's settings: `[runtime] worker_threads` for its runtimes,
    /// `[state] query_memory_limit` for its queries' memory pool. One per pipeline: the service's
    /// ingest, monitor and training share one.
    pub fn context(&self) -> ultr_core::context::PipelineContext {
        let limit = self.state.query_memory_limit_bytes().unwrap_or(ultr_core::window::DEFAULT_QUERY_MEMORY_LIMIT);
        ultr_core::context::PipelineContext::new(self.runtime.worker_threads, limit)
    }

    /// Parses config text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid { path: origin.to_string(), message };
        let config: PipelineConfig = toml::from_str(text).map_err(|e| invalid(name_the_key(text, &e)))?;
        config.core().validate().map_err(&invalid)?;
        config.runtime.validate().map_err(&invalid)?;
        if let Some(store) = &config.state.object_store {
            if config.source.kind().kafka().is_none() {
                return Err(invalid("key `state.object_store` needs `[source.kafka]`: instances share the work by Kafka partitions".into()));
            }
            if matches!(config.dead_letter, Some(DeadLetterConfig::File { .. })) {
                return Err(invalid(
                    "key `dead_letter.file` cannot be shared by several instances with `state.object_store`: leave `[dead_letter]` unset (each partition's letters are kept with its state) or use `[dead_letter.kafka]`".into(),
                ));
            }
            if store.compact_interval.ms() <= 0 || store.lease_ttl.ms() <= 0 {
                return Err(invalid("keys `state.object_store.compact_interval` and `state.object_store.lease_ttl` must be longer than 0".into()));
            }
            let url = url::Url::parse(&store.url).map_err(|e| invalid(format!("key `state.object_store.url` = {:?}: {e}", store.url)))?;
            if url.scheme() != "s3" {
                return Err(invalid(format!(
                    "key `state.object_store.url` = {:?}: use s3://bucket/prefix (S3 or an S3-compatible store with conditional writes)",
                    store.url
                )));
            }
            store.check_option_keys().map_err(invalid)?;
        }
        config.train.validate().map_err(&invalid)?;
        config.eval.validate().map_err(&invalid)?;
        config.source.kind().validate(&config.source_context()).map_err(&invalid)?;
        Ok(config)
    }
}

/// A TOML error with the dotted key it is about (`key `state.lookback`: ...`), found from the
/// error's position: the key on that line under the nearest table header above it. Values that fail
/// their type at load (durations, sizes, enum names) so name their key as `validate()`'s errors do.
fn name_the_key(text: &str, error: &toml::de::Error) -> String {
    let message = error.to_string();
    let Some(span) = error.span() else { return message };
    let before = &text[..span.start.min(text.len())];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    // A table whose struct flattens another (`[train]` and its models' sections) reports an unknown
    // key at the table's header, naming the key only in the message.
    let unknown = error.message().strip_prefix("unknown field `").and_then(|r| r.split('`').next());
    if let (Some(header), Some(key)) = (line.trim().strip_prefix('[').and_then(|l| l.strip_suffix(']')), unknown) {
        return format!("key `{}.{key}`: {message}", header.trim());
    }
    let Some((key, _)) = line.split_once('=') else { return message };
    let key = key.trim().trim_matches('"');
    let table = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    match table {
        Some(table) => format!("key `{table}.{key}`: {message}"),
        None => format!("key `{key}`: {message}"),
    }
}
