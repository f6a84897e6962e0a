//! Event-time window settings (`[window]`): read once, checked, and turned into a [`WindowSpec`].

use serde::{Deserialize, Serialize};

use super::operator::WindowSpec;
use crate::units::{duration, ConfigDuration};

/// Event-time windows (`[window]`). Durations are written `500ms`, `30s`, `10m`, `1h`, `28d`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WindowConfig {
    /// Window length.
    pub size: ConfigDuration,
    /// Hop between window starts; unset for tumbling windows. Must divide `size`.
    pub slide: Option<ConfigDuration>,
    /// How far behind the newest event time a session may arrive and still count.
    pub allowed_lateness: ConfigDuration,
    /// A partition silent this long stops holding back the watermark, unless its Kafka source still
    /// holds unread records of it below the high watermark (then it is behind, not idle).
    pub idle_partition_timeout: ConfigDuration,
    /// One session may move its partition's clock at most this far past the watermark (plus
    /// `allowed_lateness`), so one outlier event time cannot close every open window at once.
    pub max_partition_clock_jump: ConfigDuration,
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
    pub fn statistic_bounds(&self) -> super::StatisticBounds {
        super::StatisticBounds { session_store_patterns: self.session_store_patterns }
    }
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            size: duration("1h"),
            slide: None,
            allowed_lateness: duration("5m"),
            idle_partition_timeout: duration("30s"),
            max_partition_clock_jump: duration("1h"),
            reduce_rows: 65_536,
            session_store_patterns: super::DEFAULT_SESSION_STORE_PATTERNS,
        }
    }
}

impl WindowConfig {
    /// The window settings in milliseconds, checked: size > 0, slide divides size, lateness ≥ 0.
    pub fn spec(&self) -> Result<WindowSpec, String> {
        let size = self.size.ms();
        if size <= 0 {
            return Err("key `window.size` must be longer than 0".into());
        }
        let slide = match &self.slide {
            Some(s) => s.ms(),
            None => size,
        };
        if slide <= 0 || slide > size || size % slide != 0 {
            return Err(format!("key `window.slide` ({slide} ms) must be > 0 and divide `window.size` ({size} ms)"));
        }
        let lateness = self.allowed_lateness.ms();
        let idle = self.idle_partition_timeout.ms();
        if idle <= 0 {
            return Err("key `window.idle_partition_timeout` must be longer than 0".into());
        }
        Ok(WindowSpec { size_ms: size, slide_ms: slide, allowed_lateness_ms: lateness, idle_timeout_ms: idle })
    }

    /// `window.max_partition_clock_jump` in milliseconds.
    pub fn max_clock_jump_ms(&self) -> i64 {
        self.max_partition_clock_jump.ms()
    }

    /// Every `[window]` key checked, each error naming its key.
    pub fn validate(&self) -> Result<(), String> {
        self.spec()?;
        if self.reduce_rows == 0 {
            return Err("key `window.reduce_rows` must be >= 1".into());
        }
        if self.session_store_patterns == 0 {
            return Err("key `window.session_store_patterns` must be >= 1".into());
        }
        Ok(())
    }
}
