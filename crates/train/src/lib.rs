//! Training: the models of the registry (`models/`) in burn, fitted on the state's windows with IPS weights,
//! checkpointed, and promoted only through the gate. `ultr train` and `ultr run`'s schedule both call
//! [`train_from_state`].

pub mod artefact;
pub mod baselines;
pub mod batches;
pub mod checkpoint;
pub mod chunks;
pub mod config;
pub mod data;
pub mod device;
pub mod eval;
pub mod export;
pub mod fit;
pub mod gate;
pub mod ips_propensity;
/// The learning-to-rank file loaders live in `ultr-core`, below the simulator (which does not link burn).
pub use ultr_core::letor;
pub mod logged_order_combination;
pub mod logged_order_prior;
pub mod logged_order_weight;
pub mod misspecification;
pub mod models;
pub mod onnx;
pub mod outcome_text;
pub mod refit;
pub mod scoring;
pub mod train_from_state;
pub mod uncertainty;
pub mod weights;

use crate::config::TrainConfig;

pub use gate::{evaluation_losses, evaluation_slice, ColdComparison};
pub use train_from_state::{models_dir, spill_dir, train_from_state, TrainOutcome, TrainRequest};

/// Identifiability of the model this config trains (its tower, its positions): the one verdict the
/// CLI, the monitor's metrics and the alerts share.
pub fn identifiability(
    cumulative: &ultr_core::state::cumulative::Cumulative,
    thresholds: &ultr_core::identify::config::IdentifiabilityConfig,
    train: &TrainConfig,
) -> anyhow::Result<ultr_core::identify::IdentifiabilityReport> {
    ultr_core::identify::analyse(cumulative, thresholds, &train.model_label(), train.model.identification(train.tower), train.max_positions as u32)
}
