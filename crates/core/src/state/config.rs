//! Durable state settings (`[state]`): where, how far back, how often to checkpoint, query memory.

use serde::{Deserialize, Serialize};

use crate::units::{parse_bytes, parse_duration_ms};

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
    pub object_store: Option<super::remote::ObjectStoreConfig>,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig { dir: None, lookback: "28d".into(), checkpoint_every_records: 200_000, checkpoint_interval: "10s".into(), retention: None, query_memory_limit: "1GiB".into(), object_store: None }
    }
}

impl StateConfig {
    pub fn checkpoint_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(parse_duration_ms(&self.checkpoint_interval).unwrap_or(10_000).max(0) as u64)
    }

    /// `state.query_memory_limit` in bytes.
    pub fn query_memory_limit_bytes(&self) -> Result<usize, String> {
        parse_bytes(&self.query_memory_limit).map_err(|e| format!("key `state.query_memory_limit`: {e}"))
    }

    pub fn lookback_ms(&self) -> i64 {
        parse_duration_ms(&self.lookback).unwrap_or(28 * 86_400_000)
    }

    pub fn retention_ms(&self) -> i64 {
        self.retention.as_deref().and_then(|r| parse_duration_ms(r).ok()).unwrap_or_else(|| self.lookback_ms()).max(self.lookback_ms())
    }

    /// Every `[state]` key checked but `object_store`'s sharing rules (they depend on the source).
    pub fn validate(&self) -> Result<(), String> {
        parse_duration_ms(&self.lookback).map_err(|e| format!("key `state.lookback`: {e}"))?;
        parse_duration_ms(&self.checkpoint_interval).map_err(|e| format!("key `state.checkpoint_interval`: {e}"))?;
        self.query_memory_limit_bytes()?;
        if let Some(r) = &self.retention {
            parse_duration_ms(r).map_err(|e| format!("key `state.retention`: {e}"))?;
        }
        Ok(())
    }
}
