//! The model registry: every click model `ultr` trains, chosen by `[train] model`. Each model is one
//! file that implements `Model` (`interface.rs`), with its paper and equations at its head and its
//! own config section; `registry!` below lists them, one line each, and generates `ModelKind` (the
//! config's choice), `AnyModel` (the model, dispatched) and the lookups. A model without a config
//! section is one new file plus one line here.

#[macro_use]
mod registry;

// The models' files are declared by `registry!` below, one per line.
pub mod inputs;
pub mod interface;
pub mod observation_tower;
pub mod tower;

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

pub use inputs::{BatchTensors, Dimensions, InputShape, Lists, TowerKind};
pub use interface::Model;
pub use tower::{bce_with_logits, Mlp};

registry! {
    Biased => biased::Biased,
    Additive => additive::Additive,
    GradientReversal => gradient_reversal::GradientReversal [shape observation_tower] [settings gradient_reversal],
    ObservationDropout => observation_dropout::ObservationDropout [shape observation_tower] [settings observation_dropout],
    Dla => dla::Dla [settings dla],
    Rem => rem::Rem,
    EDot => edot::EDot [shape embedding_model],
    EInter => einter::EInter [shape embedding_model],
    MixEm => mixem::MixEm [settings mixem],
    Xpa => xpa::Xpa [shape xpa],
}

/// The config sections models own (`[train.<section>]`): shapes (part of the architecture) and
/// objective settings (a warm start may change them). `TrainConfig::model_sections` fills it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelSections {
    pub observation_tower: observation_tower::ObservationTowerConfig,
    pub gradient_reversal: gradient_reversal::GradientReversalConfig,
    pub observation_dropout: observation_dropout::ObservationDropoutConfig,
    pub dla: dla::DlaConfig,
    pub embedding_model: edot::EmbeddingModelConfig,
    pub mixem: mixem::MixEmConfig,
    pub xpa: xpa::XpaConfig,
}

/// The shape of a model: what must match to reuse a checkpoint's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Architecture {
    /// Checkpoints from before the model family are additive.
    #[serde(default)]
    pub model: ModelKind,
    /// The observation tower's shape (gradient_reversal, observation_dropout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_tower: Option<observation_tower::ObservationTowerConfig>,
    /// The embedding width and serving position (edot, einter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_model: Option<edot::EmbeddingModelConfig>,
    /// The attention's shape and variant (xpa).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xpa: Option<xpa::XpaConfig>,
    pub tower: TowerKind,
    pub hidden_layers: usize,
    pub hidden_units: usize,
    pub feature_limit: Option<usize>,
    pub bias_feature_tower: bool,
    pub max_positions: usize,
}

impl Architecture {
    /// The dimensions a fresh model of this architecture is built with.
    pub fn dimensions(&self, n_features: usize, n_bias_features: usize, vocabulary: usize) -> Dimensions {
        Dimensions {
            tower: self.tower,
            hidden_layers: self.hidden_layers,
            hidden_units: self.hidden_units,
            bias_feature_tower: self.bias_feature_tower,
            max_positions: self.max_positions,
            n_features,
            n_bias_features,
            vocabulary,
        }
    }
}

/// Checkpoints from before the model family are additive, and so is a config that names none.
impl Default for ModelKind {
    fn default() -> Self {
        ModelKind::Additive
    }
}

impl ModelKind {
    /// What the data must provide for this model's position parameters to be identified (Hager
    /// §3–4): the relevance tower decides it — per-document γ need swaps, a function of features
    /// needs the union of swaps and feature overlap; a model without position parameters needs
    /// nothing.
    pub fn identification(self, tower: TowerKind) -> ultr_core::identify::Identification {
        if self.position_parameters() {
            tower.identification()
        } else {
            ultr_core::identify::Identification::Nothing
        }
    }

    /// The model a `[train] model` name (or alias) selects.
    pub fn from_name(name: &str) -> Option<ModelKind> {
        ModelKind::ALL.iter().copied().find(|k| k.name() == name || k.aliases().contains(&name))
    }
}

impl Serialize for ModelKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for ModelKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        ModelKind::from_name(&name).ok_or_else(|| {
            let names: Vec<&str> = ModelKind::ALL.iter().map(|k| k.name()).collect();
            serde::de::Error::custom(format!("unknown model `{name}`, expected one of {}", names.join(", ")))
        })
    }
}

impl clap::ValueEnum for ModelKind {
    fn value_variants<'a>() -> &'a [Self] {
        ModelKind::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).aliases(self.aliases().iter().copied()).help(self.summary()))
    }
}
