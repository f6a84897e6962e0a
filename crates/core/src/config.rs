//! The streaming core's settings in one value: each stage's own config (decode, dead letters,
//! windows, state, identifiability) and the holdout split the windows keep apart. The `ultr` binary
//! reads them from the pipeline file and hands them down; nothing here knows the file's other tables.

use crate::identify::config::IdentifiabilityConfig;
use crate::session::DecodeLimits;
use crate::sinks::config::DeadLetterConfig;
use crate::state::config::StateConfig;
use crate::window::config::WindowConfig;
use crate::window::Holdout;

#[derive(Debug, Clone, PartialEq)]
pub struct CoreConfig {
    pub decode: DecodeLimits,
    pub dead_letter: Option<DeadLetterConfig>,
    /// Sessions per decoded batch.
    pub batch_records: usize,
    pub window: WindowConfig,
    pub state: StateConfig,
    pub identifiability: IdentifiabilityConfig,
    /// The sessions held out from training (validation, evaluation), kept apart by every window.
    pub holdout: Holdout,
    /// A stable name of the source, recorded in the manifest (a restart on another source is refused).
    pub source_identity: String,
    /// Ingest workers for a new state (`[runtime] workers`); an existing state keeps its own count.
    pub workers: usize,
}

/// Sessions per decoded batch when `batch_records` is not set.
pub const DEFAULT_BATCH_RECORDS: usize = 4096;

impl CoreConfig {
    /// Every stage at its defaults, for the named source and holdout.
    pub fn defaults(source_identity: String, holdout: Holdout) -> Self {
        CoreConfig {
            decode: DecodeLimits::default(),
            dead_letter: None,
            batch_records: DEFAULT_BATCH_RECORDS,
            window: WindowConfig::default(),
            state: StateConfig::default(),
            identifiability: IdentifiabilityConfig::default(),
            holdout,
            source_identity,
            workers: crate::runtime::RuntimeConfig::default().ingest_workers(),
        }
    }

    /// Every key of the core's tables checked; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.workers == 0 {
            return Err("key `runtime.workers` must be >= 1".into());
        }
        if self.batch_records == 0 {
            return Err("key `batch_records` must be >= 1".into());
        }
        if self.decode.max_items == 0 || self.decode.max_features == 0 {
            return Err("keys `decode.max_items` and `decode.max_features` must be >= 1".into());
        }
        self.window.validate()?;
        self.state.validate()?;
        self.identifiability.validate()?;
        crate::session::codec::validate(&self.decode.codec())?;
        if let Some(schema) = &self.decode.feature_schema {
            schema.validate(self.decode.feature_dim, self.decode.bias_feature_dim)?;
        }
        Ok(())
    }
}
