//! Durable state settings (`[state]`): where, how far back, how often to checkpoint, query memory.

use serde::{Deserialize, Serialize};

use crate::units::{bytes, duration, ConfigBytes, ConfigDuration};

/// Durable state (`[state]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// State directory (the `--state` flag overrides it; unset: `ultr-state/<pipeline file name>`).
    pub dir: Option<std::path::PathBuf>,
    /// Horizon of the cumulative views.
    pub lookback: ConfigDuration,
    /// Checkpoint at least this often, in records read.
    pub checkpoint_every_records: u64,
    /// Checkpoint as soon as the windows closed since the last checkpoint hold this much: a closed
    /// window's statistics wait in memory for the next checkpoint, so when many close at once
    /// (catching up on a backlog) one checkpoint writes them all. `1B` checkpoints at every close.
    pub checkpoint_closed_bytes: ConfigBytes,
    /// ... and at least this often in wall time while records arrive or closed windows wait, so a
    /// quiet stream's tail is made durable, its offsets committed and its consumer lag reported.
    pub checkpoint_interval: ConfigDuration,
    /// Keep closed windows this far back from the newest (default: `lookback`).
    pub retention: Option<ConfigDuration>,
    /// Memory pool of the SQL queries (window merges, horizon views, training rows): beyond it,
    /// sorts, joins and aggregations spill to the OS temp directory. `512MiB`, `2GiB`, or bytes.
    pub query_memory_limit: ConfigBytes,
    /// Scale-out: keep each Kafka partition's state, and the merged view, in this object store, so
    /// several `ultr run` instances in one consumer group share the work (`scale_out`).
    pub object_store: Option<super::remote::ObjectStoreConfig>,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            dir: None,
            lookback: duration("28d"),
            checkpoint_every_records: 200_000,
            checkpoint_closed_bytes: bytes("64MiB"),
            checkpoint_interval: duration("10s"),
            retention: None,
            query_memory_limit: bytes("1GiB"),
            object_store: None,
        }
    }
}

impl StateConfig {
    pub fn checkpoint_interval(&self) -> std::time::Duration {
        self.checkpoint_interval.std()
    }

    pub fn checkpoint_closed_bytes(&self) -> usize {
        self.checkpoint_closed_bytes.bytes()
    }

    /// `state.query_memory_limit` in bytes.
    pub fn query_memory_limit_bytes(&self) -> Result<usize, String> {
        Ok(self.query_memory_limit.bytes())
    }

    pub fn lookback_ms(&self) -> i64 {
        self.lookback.ms()
    }

    pub fn retention_ms(&self) -> i64 {
        self.retention.as_ref().map_or(self.lookback_ms(), ConfigDuration::ms).max(self.lookback_ms())
    }

    /// Every `[state]` key checked but `object_store`'s sharing rules (they depend on the source).
    pub fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}
