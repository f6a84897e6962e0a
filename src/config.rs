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

/// Where refused records go. Every letter carries at most `max_payload_bytes` of its record (default
/// 256 KiB; the full length and SHA-256 are always kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    crate::sinks::dead_letter::DEFAULT_MAX_PAYLOAD_BYTES
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
    #[serde(default)]
    pub window: WindowConfig,
    #[serde(default)]
    pub state: StateConfig,
    #[serde(default)]
    pub identifiability: IdentifiabilityConfig,
    #[serde(default)]
    pub train: crate::train::config::TrainConfig,
    #[serde(default)]
    pub service: crate::service::ServiceConfig,
}

/// Event-time windows (`[window]`). Durations are text: `500ms`, `30s`, `10m`, `1h`, `28d`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WindowConfig {
    /// Window length.
    pub size: String,
    /// Hop between window starts; unset for tumbling windows. Must divide `size`.
    pub slide: Option<String>,
    /// How far behind the newest event time a session may arrive and still count.
    pub allowed_lateness: String,
    /// A partition silent this long stops holding back the watermark.
    pub idle_partition_timeout: String,
    /// One session may move its partition's clock at most this far past the watermark (plus
    /// `allowed_lateness`), so one outlier event time cannot close every open window at once.
    pub max_partition_clock_jump: String,
    /// An open window buffers at most this many impression rows before reducing them to partial
    /// aggregates (by the `sql/` statistics); its memory is this buffer plus its distinct keys.
    pub reduce_rows: usize,
    /// Distinct sessions each window keeps in its session store, the training data of the session
    /// models (mixem, xpa, dla): a uniform sample of the window's distinct sessions (the smallest
    /// content hashes), each with its exact count. A session model trains on at most this many
    /// sessions per window, so set it to at least a window's sessions for it to see all of them
    /// (`ultr train` warns with how many it got). The store holds one row per stored impression.
    /// A change applies from the next window on (the window open at the change mixes both bounds).
    pub session_store_patterns: usize,
}

impl WindowConfig {
    pub fn statistic_bounds(&self) -> crate::window::StatisticBounds {
        crate::window::StatisticBounds { session_store_patterns: self.session_store_patterns }
    }
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            size: "1h".into(),
            slide: None,
            allowed_lateness: "5m".into(),
            idle_partition_timeout: "30s".into(),
            max_partition_clock_jump: "1h".into(),
            reduce_rows: 65_536,
            session_store_patterns: crate::window::DEFAULT_SESSION_STORE_PATTERNS,
        }
    }
}

/// Durable state (`[state]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// State directory (the `--state` flag overrides it).
    pub dir: Option<std::path::PathBuf>,
    /// Horizon of the cumulative views.
    pub lookback: String,
    /// Checkpoint at least this often, in records read (and whenever a window closes).
    pub checkpoint_every_records: u64,
    /// ... and at least this often in wall time while records arrive, so a quiet stream's tail is
    /// made durable, its offsets committed and its consumer lag reported.
    pub checkpoint_interval: String,
    /// Keep closed windows this far back from the newest (default: `lookback`).
    pub retention: Option<String>,
    /// Memory pool of the SQL queries (window merges, horizon views, training rows): beyond it,
    /// sorts, joins and aggregations spill to the OS temp directory. `512MiB`, `2GiB`, or bytes.
    pub query_memory_limit: String,
    /// Scale-out: keep each Kafka partition's state, and the merged view, in this object store, so
    /// several `ultr run` instances in one consumer group share the work (`scale_out`).
    pub object_store: Option<crate::state::remote::ObjectStoreConfig>,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig { dir: None, lookback: "28d".into(), checkpoint_every_records: 200_000, checkpoint_interval: "10s".into(), retention: None, query_memory_limit: "1GiB".into(), object_store: None }
    }
}

/// Identifiability thresholds (`[identifiability]`). Which graph identifies the model and which
/// positions count follow `[train]` (`tower`, `max_positions`), so the verdict is for the model trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentifiabilityConfig {
    /// Adjacent positions are linked in the overlap graph when their cross-fitted overlap score
    /// (1 − |2·AUC − 1|) reaches this.
    pub min_overlap_score: f64,
    /// Positions with fewer sampled impressions are left out of the overlap graph.
    pub min_samples: usize,
    /// Below this impression-weighted within-position sd of π(d,k|q), residuals cannot be tested
    /// against the policy: misspecification is reported as not assessable instead of healthy.
    pub min_policy_variation: f64,
    /// A policy's logged propensities are flagged as disagreeing with its counted π when the
    /// Pearson dispersion of its (q, d, k) display counts around the logged π exceeds this (≈ 1 when
    /// the log is right; `identify::logged`).
    pub max_logged_propensity_dispersion: f64,
    /// Keys of earlier releases, refused with what replaced them.
    #[serde(skip_serializing)]
    pub max_position: Option<toml::Value>,
    #[serde(skip_serializing)]
    pub eta: Option<toml::Value>,
    #[serde(skip_serializing)]
    pub identified_by: Option<toml::Value>,
}

impl Default for IdentifiabilityConfig {
    fn default() -> Self {
        IdentifiabilityConfig {
            min_overlap_score: 0.1,
            min_samples: 30,
            min_policy_variation: 0.01,
            max_logged_propensity_dispersion: 2.0,
            max_position: None,
            eta: None,
            identified_by: None,
        }
    }
}

pub use crate::units::{parse_bytes, parse_duration_ms};

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
    /// The window settings in milliseconds, checked: size > 0, slide divides size, lateness ≥ 0.
    pub fn window_spec(&self) -> Result<crate::window::operator::WindowSpec, String> {
        let w = &self.window;
        let size = parse_duration_ms(&w.size).map_err(|e| format!("key `window.size`: {e}"))?;
        if size <= 0 {
            return Err("key `window.size` must be longer than 0".into());
        }
        let slide = match &w.slide {
            Some(s) => parse_duration_ms(s).map_err(|e| format!("key `window.slide`: {e}"))?,
            None => size,
        };
        if slide <= 0 || slide > size || size % slide != 0 {
            return Err(format!("key `window.slide` ({slide} ms) must be > 0 and divide `window.size` ({size} ms)"));
        }
        let lateness = parse_duration_ms(&w.allowed_lateness).map_err(|e| format!("key `window.allowed_lateness`: {e}"))?;
        let idle = parse_duration_ms(&w.idle_partition_timeout).map_err(|e| format!("key `window.idle_partition_timeout`: {e}"))?;
        if idle <= 0 {
            return Err("key `window.idle_partition_timeout` must be longer than 0".into());
        }
        Ok(crate::window::operator::WindowSpec { size_ms: size, slide_ms: slide, allowed_lateness_ms: lateness, idle_timeout_ms: idle })
    }

    /// `window.max_partition_clock_jump` in milliseconds.
    pub fn max_clock_jump_ms(&self) -> i64 {
        parse_duration_ms(&self.window.max_partition_clock_jump).unwrap_or(3_600_000)
    }

    pub fn checkpoint_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(parse_duration_ms(&self.state.checkpoint_interval).unwrap_or(10_000).max(0) as u64)
    }

    /// `state.query_memory_limit` in bytes.
    pub fn query_memory_limit_bytes(&self) -> Result<usize, String> {
        parse_bytes(&self.state.query_memory_limit).map_err(|e| format!("key `state.query_memory_limit`: {e}"))
    }

    pub fn lookback_ms(&self) -> i64 {
        parse_duration_ms(&self.state.lookback).unwrap_or(28 * 86_400_000)
    }

    pub fn retention_ms(&self) -> i64 {
        self.state.retention.as_deref().and_then(|r| parse_duration_ms(r).ok()).unwrap_or_else(|| self.lookback_ms()).max(self.lookback_ms())
    }

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
        config.window_spec().map_err(|e| invalid(e))?;
        parse_duration_ms(&config.window.max_partition_clock_jump)
            .map_err(|e| invalid(format!("key `window.max_partition_clock_jump`: {e}")))?;
        parse_duration_ms(&config.decode.max_clock_skew).map_err(|e| invalid(format!("key `decode.max_clock_skew`: {e}")))?;
        parse_duration_ms(&config.decode.max_event_age).map_err(|e| invalid(format!("key `decode.max_event_age`: {e}")))?;
        parse_duration_ms(&config.state.lookback).map_err(|e| invalid(format!("key `state.lookback`: {e}")))?;
        parse_duration_ms(&config.state.checkpoint_interval).map_err(|e| invalid(format!("key `state.checkpoint_interval`: {e}")))?;
        config.query_memory_limit_bytes().map_err(|e| invalid(e))?;
        if config.window.reduce_rows == 0 {
            return Err(invalid("key `window.reduce_rows` must be >= 1".into()));
        }
        if config.window.session_store_patterns == 0 {
            return Err(invalid("key `window.session_store_patterns` must be >= 1".into()));
        }
        if let Some(r) = &config.state.retention {
            parse_duration_ms(r).map_err(|e| invalid(format!("key `state.retention`: {e}")))?;
        }
        if let Some(store) = &config.state.object_store {
            if !matches!(config.source, SourceConfig::Kafka(_)) {
                return Err(invalid("key `state.object_store` needs `[source.kafka]`: instances share the work by Kafka partitions".into()));
            }
            if matches!(config.dead_letter, Some(DeadLetterConfig::File { .. })) {
                return Err(invalid(
                    "key `dead_letter.file` cannot be shared by several instances with `state.object_store`: leave `[dead_letter]` unset (each partition's letters are kept with its state) or use `[dead_letter.kafka]`".into(),
                ));
            }
            for (key, text) in [("compact_interval", &store.compact_interval), ("lease_ttl", &store.lease_ttl)] {
                parse_duration_ms(text).map_err(|e| invalid(format!("key `state.object_store.{key}`: {e}")))?;
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
        let id = &config.identifiability;
        for (key, set, now) in [
            ("max_position", id.max_position.is_some(), "the graphs cover `[train] max_positions`, the positions the model has"),
            ("eta", id.eta.is_some(), "the overlap score is a cross-fitted AUC and has no η"),
            ("identified_by", id.identified_by.is_some(), "identification follows `[train] tower` (swaps for `embedding`, swaps or feature overlap otherwise)"),
        ] {
            if set {
                return Err(invalid(format!("key `identifiability.{key}` was removed: {now}")));
            }
        }
        if !(0.0..=1.0).contains(&id.min_overlap_score) {
            return Err(invalid(format!("key `identifiability.min_overlap_score` = {} must lie in [0, 1]", id.min_overlap_score)));
        }
        if !(id.max_logged_propensity_dispersion > 0.0 && id.max_logged_propensity_dispersion.is_finite()) {
            return Err(invalid(format!("key `identifiability.max_logged_propensity_dispersion` = {} must be a finite number > 0", id.max_logged_propensity_dispersion)));
        }
        if !(0.0..=1.0).contains(&id.min_policy_variation) {
            return Err(invalid(format!("key `identifiability.min_policy_variation` = {} must lie in [0, 1]", id.min_policy_variation)));
        }
        if let Some(schema) = &config.decode.feature_schema {
            schema.validate(config.decode.feature_dim, config.decode.bias_feature_dim).map_err(|e| invalid(e))?;
        }
        config.train.validate().map_err(|e| invalid(e))?;
        if matches!(config.source, SourceConfig::Simulator) {
            config.simulator.validate().map_err(|e| invalid(format!("[simulator]: {e}")))?;
        }
        Ok(config)
    }
}
