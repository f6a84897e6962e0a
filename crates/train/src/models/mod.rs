//! The model registry: every click model `ultr` trains, chosen by `[train] model`. Each model is one
//! file that implements `Model` (`interface.rs`), with its paper and equations at its head and its
//! own config section; `registry!` below lists them, one line each, and generates `ModelKind` (the
//! config's choice), `AnyModel` (the model, dispatched), the lookups, and `ModelSections` (the
//! models' `[train.<section>]` tables, flattened into `[train]` and documented from their types). A
//! model, with or without a section of its own, is one new file plus one line here.

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
    shared_shapes {
        observation_tower: observation_tower::ObservationTowerConfig,
        embedding_model: edot::EmbeddingModelConfig,
    }
    models {
        Biased => biased::Biased,
        Additive => additive::Additive,
        GradientReversal => gradient_reversal::GradientReversal [shape observation_tower] [settings gradient_reversal: GradientReversalConfig],
        ObservationDropout => observation_dropout::ObservationDropout [shape observation_tower] [settings observation_dropout: ObservationDropoutConfig],
        Dla => dla::Dla [settings dla: DlaConfig],
        Rem => rem::Rem,
        EDot => edot::EDot [shape embedding_model],
        EInter => einter::EInter [shape embedding_model],
        MixEm => mixem::MixEm [settings mixem: MixEmConfig],
        Xpa => xpa::Xpa [shape xpa: XpaConfig],
    }
}

/// The shape of a model: what must match to reuse a checkpoint's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Architecture {
    /// Checkpoints from before the model family are additive.
    #[serde(default)]
    pub model: ModelKind,
    /// The chosen model's shape section (observation_tower, embedding_model, xpa), the others unset.
    #[serde(flatten)]
    pub shapes: ShapeSections,
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

/// The names `[train] model` accepts, each with its one-line summary (the configuration reference).
impl schemars::JsonSchema for ModelKind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ModelKind".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let choices: Vec<serde_json::Value> = ModelKind::ALL.iter().map(|k| serde_json::json!({ "const": k.name(), "description": k.summary() })).collect();
        schemars::json_schema!({ "type": "string", "oneOf": choices })
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
