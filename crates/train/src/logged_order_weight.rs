//! The weight of the logged order against the clicks that training chose (`logged_order_combination.rs`),
//! kept in a model's meta: a leaf, so the artefact does not depend on the combination's code.

use serde::{Deserialize, Serialize};

/// The weight the logged order gets against the clicks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weight {
    /// The model's relevance alone.
    ModelAlone,
    /// The posterior with prior precision κ.
    Kappa(f64),
    /// The logged order alone (κ = ∞).
    LoggedOrderAlone,
}

impl Weight {
    /// The prior's strength, for the one-standard-error rule (stronger = more logged order).
    pub(crate) fn strength(self) -> f64 {
        match self {
            Weight::ModelAlone => -1.0,
            Weight::Kappa(k) => k,
            Weight::LoggedOrderAlone => f64::INFINITY,
        }
    }

    pub fn label(self) -> String {
        match self {
            Weight::ModelAlone => "model alone".into(),
            Weight::Kappa(k) => format!("κ = {k}"),
            Weight::LoggedOrderAlone => "logged order alone".into(),
        }
    }
}
