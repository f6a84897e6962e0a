//! What a model is built from and fed: the relevance tower's kind, the dimensions every model
//! shares, and a batch on the device. The lowest layer of `models/`: it imports no model.

use burn::tensor::{Int, Tensor};
use serde::{Deserialize, Serialize};

/// The relevance tower r(x).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
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

    /// Whether the relevance is one free γ per (query, document) pair, learned from the clicks
    /// (a vocabulary in the checkpoint), rather than a function of the item's features.
    pub fn pair_embedding(self) -> bool {
        matches!(self, TowerKind::Embedding)
    }

    /// Whether the tower reads the item's features (and so needs them, and their normaliser).
    pub fn reads_features(self) -> bool {
        !self.pair_embedding()
    }

    /// Whether `hidden_layers` and `hidden_units` shape this tower.
    pub fn has_hidden_layers(self) -> bool {
        matches!(self, TowerKind::Mlp)
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

/// How a model reads its training examples (`Model::LISTWISE`): what the shared training path
/// batches, weighs and hands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputShape {
    /// Independent rows (aggregated per query, document and position where the data allows), each
    /// with its IPS weight.
    Rows,
    /// Whole sessions, each laid out as a list top position first and padded; a session weighs 1.
    Lists,
}

impl InputShape {
    /// `rows` or `lists`, whichever this shape reads.
    pub fn select<'a, T: ?Sized>(self, rows: &'a T, lists: &'a T) -> &'a T {
        match self {
            InputShape::Rows => rows,
            InputShape::Lists => lists,
        }
    }

    /// Whether a batch of this shape lays its rows out as lists of whole sessions.
    pub fn lists(self) -> bool {
        self == InputShape::Lists
    }

    /// Whether its rows carry IPS weights (a whole session weighs 1).
    pub fn ips_weighted(self) -> bool {
        self == InputShape::Rows
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
