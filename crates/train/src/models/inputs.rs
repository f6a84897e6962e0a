//! What a model is built from and fed: the relevance tower's kind, the dimensions every model
//! shares, and a batch on the device. The lowest layer of `models/`: it imports no model.

use burn::tensor::{Int, Tensor};
use serde::{Deserialize, Serialize};

/// The relevance tower r(x).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TowerKind {
    /// One free parameter γ_{q,d} per query-document pair (needs swaps to be identified).
    Embedding,
    /// w·x + b.
    Linear,
    /// `hidden_layers` × `hidden_units` ELU layers, then a linear output.
    Mlp,
}

impl TowerKind {
    pub fn name(self) -> &'static str {
        match self {
            TowerKind::Embedding => "embedding",
            TowerKind::Linear => "linear",
            TowerKind::Mlp => "mlp",
        }
    }

    /// What identifies θ for this tower (Hager §4): swaps for per-document relevance, swaps or
    /// feature overlap for a function of features.
    pub fn identification(self) -> ultr_core::identify::Identification {
        match self {
            TowerKind::Embedding => ultr_core::identify::Identification::Swaps,
            TowerKind::Linear | TowerKind::Mlp => ultr_core::identify::Identification::SwapsOrFeatureOverlap,
        }
    }
}

/// The shape every model shares: the relevance tower's, the positions, and the sizes the data fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dimensions {
    pub tower: TowerKind,
    pub hidden_layers: usize,
    pub hidden_units: usize,
    pub bias_feature_tower: bool,
    pub max_positions: usize,
    pub n_features: usize,
    pub n_bias_features: usize,
    /// Entries of the γ embedding (the checkpoint's vocabulary).
    pub vocabulary: usize,
}

/// A batch on the device: rows of whole sessions or aggregated rows.
pub struct BatchTensors {
    /// 0-based position index.
    pub positions: Tensor<1, Int>,
    pub qd: Option<Tensor<1, Int>>,
    pub features: Option<Tensor<2>>,
    pub bias_features: Option<Tensor<2>>,
    /// Click rate c/n of each row.
    pub clicks: Tensor<1>,
    /// w·n (count-weighted) or w (a row drawn ∝ n enters with its mean loss).
    pub weights: Tensor<1>,
    /// Relevance labels ÷ their maximum, where the examples carry them (simulations).
    pub labels: Option<Tensor<1>>,
    /// For listwise models: the rows form `count` lists of `width` slots, by position.
    pub lists: Option<Lists>,
}

/// Rows laid out as [count, width]: list i's items at rows i·width.., top position first, padded.
pub struct Lists {
    pub count: usize,
    pub width: usize,
    /// 1 for an item, 0 for padding.
    pub mask: Tensor<2>,
}
