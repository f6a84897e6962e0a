//! The model interface: every click model `ultr` trains, chosen by `[train] model`, behind one type.
//! The fit loop, the gate, `ultr eval`/`score`, the export and the monitor see only `ClickModel`:
//! click logits of a batch, the relevance score r(x) used for serving, the training objective, the
//! position bias it estimates, its record, and the identification it needs. One file per model, its
//! paper and equation at its head.

pub mod additive;
pub mod biased;
pub mod dla;
pub mod edot;
pub mod einter;
pub mod mixem;
pub mod rem;
pub mod tower;
pub mod xpa;
pub mod zhang2023;

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{Device, Int, Tensor};
use serde::{Deserialize, Serialize};

use edot::EmbeddingModelConfig;
pub use tower::TowerKind;
use xpa::XpaConfig;
use zhang2023::ObservationTowerConfig;
pub use tower::{bce_with_logits, Mlp};

/// `[train] model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// One tower, no position input (Zhang 2023 §5.1).
    Biased,
    /// θ_k + b(z) + r(x): PAL, Hager Eq. 22 (the default).
    #[default]
    #[serde(alias = "pal")]
    Additive,
    /// Zhang 2023 §3.2: an observation tower with an adversarial head behind gradient reversal.
    GradientReversal,
    /// Zhang 2023 §3.3: dropout on the observation tower's output.
    ObservationDropout,
    /// Ai et al. 2018: ranking and propensity models trained by each other's listwise losses.
    Dla,
    /// Wang et al. 2018: regression EM on the examination hypothesis (Yan 2022's REM).
    Rem,
    /// Yan 2022 Eq. 4: r⃗(x)·e⃗(k).
    #[serde(rename = "edot")]
    #[value(name = "edot")]
    EDot,
    /// Yan 2022 Eq. 5: r⃗ᵀB e⃗ + b⃗_r·r⃗ + b⃗_e·e⃗ + b.
    #[serde(rename = "einter")]
    #[value(name = "einter")]
    EInter,
    /// Yan 2022 §3.1: a mixture of RCM, RCTR, DCTR and PBM fitted by EM over sessions.
    #[serde(rename = "mixem")]
    #[value(name = "mixem")]
    MixEm,
    /// Zhuang 2021 §4: examination from cross-positional attention over the session's items.
    Xpa,
}

impl ModelKind {
    pub const ALL: [ModelKind; 10] = [
        ModelKind::Biased,
        ModelKind::Additive,
        ModelKind::GradientReversal,
        ModelKind::ObservationDropout,
        ModelKind::Dla,
        ModelKind::Rem,
        ModelKind::EDot,
        ModelKind::EInter,
        ModelKind::MixEm,
        ModelKind::Xpa,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Biased => "biased",
            ModelKind::Additive => "additive",
            ModelKind::GradientReversal => "gradient_reversal",
            ModelKind::ObservationDropout => "observation_dropout",
            ModelKind::Dla => "dla",
            ModelKind::Rem => "rem",
            ModelKind::EDot => "edot",
            ModelKind::EInter => "einter",
            ModelKind::MixEm => "mixem",
            ModelKind::Xpa => "xpa",
        }
    }

    /// Trained on whole sessions (DLA's softmax over a session's items, MixEM's per-session E-step,
    /// XPA's attention over the session's other items), not on independent rows. These take no IPS
    /// weights.
    pub fn listwise(self) -> bool {
        matches!(self, ModelKind::Dla | ModelKind::MixEm | ModelKind::Xpa)
    }

    /// Its click logits need the item's session (XPA): losses are scored on lists.
    pub fn session_logits(self) -> bool {
        self == ModelKind::Xpa
    }

    /// Its logit mixes position and relevance embeddings (EDot, EInter): a feature tower only, and
    /// served at a canonical position.
    pub fn embedding_interaction(self) -> bool {
        matches!(self, ModelKind::EDot | ModelKind::EInter)
    }

    /// Has an observation tower g(k, z) (Zhang 2023).
    pub fn observation_tower(self) -> bool {
        matches!(self, ModelKind::GradientReversal | ModelKind::ObservationDropout)
    }

    /// What the data must provide for this model's position parameters to be identified (Hager
    /// §3–4): the relevance tower decides it — per-document γ need swaps, a function of features
    /// needs the union of swaps and feature overlap; a model without position parameters needs
    /// nothing.
    pub fn identification(self, tower: TowerKind) -> ultr_core::identify::Identification {
        match self {
            ModelKind::Biased => ultr_core::identify::Identification::Nothing,
            _ => tower.identification(),
        }
    }
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
    pub observation_tower: Option<ObservationTowerConfig>,
    /// The embedding width and serving position (edot, einter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_model: Option<EmbeddingModelConfig>,
    /// The attention's shape and variant (xpa).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xpa: Option<XpaConfig>,
    pub tower: TowerKind,
    pub hidden_layers: usize,
    pub hidden_units: usize,
    pub feature_limit: Option<usize>,
    pub bias_feature_tower: bool,
    pub max_positions: usize,
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

/// Everything a training objective takes besides the batch (warm starts may change it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObjectiveSettings {
    pub observation: zhang2023::Objective,
    pub dla_max_weight: f64,
    pub mixem_temperature: f64,
    pub mixem_learn_prior: bool,
}

/// The model: one variant per file.
#[derive(Module, Debug)]
pub enum ClickModel {
    Biased(biased::Biased),
    Additive(additive::Additive),
    Observation(zhang2023::ObservationModel),
    Dla(dla::Dla),
    Rem(rem::Rem),
    EDot(edot::EDot),
    EInter(einter::EInter),
    MixEm(mixem::MixEm),
    Xpa(xpa::Xpa),
}

impl ClickModel {
    /// A fresh model of `arch.model` (parameters at burn's default initialisation, θ = γ = 0).
    pub fn new(arch: &Architecture, n_features: usize, n_bias_features: usize, vocabulary: usize, device: &Device) -> Self {
        match arch.model {
            ModelKind::Biased => ClickModel::Biased(biased::Biased::new(arch, n_features, vocabulary, device)),
            ModelKind::Additive => ClickModel::Additive(additive::Additive::new(arch, n_features, n_bias_features, vocabulary, device)),
            ModelKind::GradientReversal | ModelKind::ObservationDropout => {
                ClickModel::Observation(zhang2023::ObservationModel::new(arch, n_features, n_bias_features, vocabulary, device))
            }
            ModelKind::Dla => ClickModel::Dla(dla::Dla::new(arch, n_features, vocabulary, device)),
            ModelKind::Rem => ClickModel::Rem(rem::Rem::new(arch, n_features, vocabulary, device)),
            ModelKind::EDot => ClickModel::EDot(edot::EDot::new(arch, n_features, device)),
            ModelKind::EInter => ClickModel::EInter(einter::EInter::new(arch, n_features, device)),
            ModelKind::MixEm => ClickModel::MixEm(mixem::MixEm::new(arch, n_features, vocabulary, device)),
            ModelKind::Xpa => ClickModel::Xpa(xpa::Xpa::new(arch, n_features, vocabulary, device)),
        }
    }

    /// The relevance score r(x) (γ_{q,d} for embeddings) of every row: what serving ranks by (for
    /// EDot and EInter, the click logit at the canonical position).
    pub fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        match self {
            ClickModel::Biased(m) => m.relevance.forward(b),
            ClickModel::Additive(m) => m.relevance(b),
            ClickModel::Observation(m) => m.relevance.forward(b),
            ClickModel::Dla(m) => m.relevance.forward(b),
            ClickModel::Rem(m) => m.relevance.forward(b),
            ClickModel::EDot(m) => m.relevance(b),
            ClickModel::EInter(m) => m.relevance(b),
            ClickModel::MixEm(m) => m.relevance.forward(b),
            ClickModel::Xpa(m) => m.relevance.forward(b),
        }
    }

    /// σ⁻¹ P(click) of every row, as the model predicts at inference (no dropout).
    pub fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        match self {
            ClickModel::Biased(m) => m.click_logits(b),
            ClickModel::Additive(m) => m.click_logits(b),
            ClickModel::Observation(m) => m.click_logits(b),
            ClickModel::Dla(m) => m.click_logits(b),
            ClickModel::Rem(m) => m.click_logits(b),
            ClickModel::EDot(m) => m.click_logits(b),
            ClickModel::EInter(m) => m.click_logits(b),
            ClickModel::MixEm(m) => m.click_logits(b),
            ClickModel::Xpa(m) => m.click_logits(b),
        }
    }

    /// Σ w·BCE of the click logits over the batch's rows: the loss every model is compared on (the
    /// promotion gate, `ultr eval`), and pointwise models' early stopping.
    pub fn click_loss_sum(&self, b: &BatchTensors) -> Tensor<1> {
        (bce_with_logits(self.click_logits(b), b.clicks.clone()) * b.weights.clone()).sum()
    }

    /// The loss early stopping watches: the click loss; for DLA the listwise likelihood of the
    /// clicks (`Dla::validation_sum`: its logits are uncalibrated, so their BCE says little).
    pub fn fit_loss_sum(&self, b: &BatchTensors) -> Tensor<1> {
        match self {
            ClickModel::Dla(m) => m.validation_sum(b),
            ClickModel::MixEm(m) => m.validation_sum(b),
            _ => self.click_loss_sum(b),
        }
    }

    /// The training objective of one batch ÷ `denominator` (N, Σw, or the rows/lists drawn).
    pub fn objective(&self, b: &BatchTensors, denominator: f64, settings: &ObjectiveSettings) -> Tensor<1> {
        let sum = match self {
            ClickModel::Observation(m) => m.objective_sum(b, &settings.observation),
            ClickModel::Dla(m) => m.objective_sum(b, settings.dla_max_weight),
            ClickModel::Rem(m) => m.objective_sum(b),
            ClickModel::MixEm(m) => m.objective_sum(b, settings.mixem_temperature, settings.mixem_learn_prior),
            ClickModel::Xpa(m) => m.objective_sum(b),
            _ => self.click_loss_sum(b),
        };
        sum.div_scalar(denominator)
    }

    /// The position bias the model estimates, relative to position 1, for k = 1..=K: θ_k − θ₁
    /// (additive), g(k, 0) − g(1, 0) (observation tower), φ_k − φ₁ (DLA); 0 for the biased model,
    /// which assumes none.
    pub fn position_bias(&self, max_positions: usize) -> Vec<f64> {
        match self {
            ClickModel::Biased(_) => vec![0.0; max_positions],
            ClickModel::Additive(m) => m.position_bias(),
            ClickModel::Observation(m) => m.position_bias(),
            ClickModel::Dla(m) => m.position_bias(),
            ClickModel::Rem(m) => m.position_bias(),
            ClickModel::EDot(m) => m.position_bias(),
            ClickModel::EInter(m) => m.position_bias(),
            ClickModel::MixEm(m) => m.position_bias(),
            ClickModel::Xpa(m) => m.position_bias(),
        }
    }

    /// The serving relevance as parameters (for the export): γ per pair, or one scalar MLP (EDot
    /// and EInter: their tower with the canonical position folded into its last layer).
    pub fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
        let tower = |t: &tower::RelevanceTower| (t.embedding.clone(), t.mlp.clone());
        match self {
            ClickModel::Biased(m) => tower(&m.relevance),
            ClickModel::Additive(m) => (m.embedding.clone(), m.relevance.clone()),
            ClickModel::Observation(m) => tower(&m.relevance),
            ClickModel::Dla(m) => tower(&m.relevance),
            ClickModel::Rem(m) => tower(&m.relevance),
            ClickModel::EDot(m) => (None, Some(m.serving_tower())),
            ClickModel::EInter(m) => (None, Some(m.serving_tower())),
            ClickModel::MixEm(m) => tower(&m.relevance),
            ClickModel::Xpa(m) => tower(&m.relevance),
        }
    }

    /// The position a serving system must assume for `relevance` (EDot, EInter), 1-based.
    pub fn canonical_position(&self) -> Option<usize> {
        match self {
            ClickModel::EDot(m) => Some(m.canonical + 1),
            ClickModel::EInter(m) => Some(m.canonical + 1),
            _ => None,
        }
    }

    /// Grows the embedding to `vocabulary` entries (new pairs start at 0) for a warm start.
    pub fn grow_embedding(self, vocabulary: usize, device: &Device) -> Self {
        match self {
            ClickModel::Biased(mut m) => {
                m.relevance = m.relevance.grow(vocabulary, device);
                ClickModel::Biased(m)
            }
            ClickModel::Additive(m) => ClickModel::Additive(m.grow_embedding(vocabulary, device)),
            ClickModel::Observation(mut m) => {
                m.relevance = m.relevance.grow(vocabulary, device);
                ClickModel::Observation(m)
            }
            ClickModel::Dla(mut m) => {
                m.relevance = m.relevance.grow(vocabulary, device);
                ClickModel::Dla(m)
            }
            ClickModel::Rem(mut m) => {
                m.relevance = m.relevance.grow(vocabulary, device);
                ClickModel::Rem(m)
            }
            ClickModel::MixEm(mut m) => {
                m.relevance = m.relevance.grow(vocabulary, device);
                ClickModel::MixEm(m)
            }
            ClickModel::Xpa(mut m) => {
                m.relevance = m.relevance.grow(vocabulary, device);
                ClickModel::Xpa(m)
            }
            // Feature towers only: no vocabulary.
            m @ (ClickModel::EDot(_) | ClickModel::EInter(_)) => m,
        }
    }

    /// Writes the variant's own record (an additive model's record is the one `ultr` wrote before
    /// the model family, so old checkpoints load).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let saved = match self.clone() {
            ClickModel::Biased(m) => m.save_file(path),
            ClickModel::Additive(m) => m.save_file(path),
            ClickModel::Observation(m) => m.save_file(path),
            ClickModel::Dla(m) => m.save_file(path),
            ClickModel::Rem(m) => m.save_file(path),
            ClickModel::EDot(m) => m.save_file(path),
            ClickModel::EInter(m) => m.save_file(path),
            ClickModel::MixEm(m) => m.save_file(path),
            ClickModel::Xpa(m) => m.save_file(path),
        };
        saved.map_err(|e| anyhow::anyhow!("writing the model record {}: {e}", path.display()))
    }

    /// Loads a record written by `save` into a skeleton of `arch`.
    pub fn load(arch: &Architecture, n_features: usize, n_bias_features: usize, vocabulary: usize, path: &Path, device: &Device) -> anyhow::Result<Self> {
        let wrong = |e: String| anyhow::anyhow!("{}: cannot load the model record ({e}); was it written for another architecture?", path.display());
        Ok(match ClickModel::new(arch, n_features, n_bias_features, vocabulary, device) {
            ClickModel::Biased(m) => ClickModel::Biased(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
            ClickModel::Additive(m) => ClickModel::Additive(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
            ClickModel::Observation(m) => ClickModel::Observation(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
            ClickModel::Dla(m) => ClickModel::Dla(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
            ClickModel::Rem(m) => ClickModel::Rem(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
            ClickModel::EDot(m) => ClickModel::EDot(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
            ClickModel::EInter(m) => ClickModel::EInter(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
            ClickModel::MixEm(m) => ClickModel::MixEm(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
            ClickModel::Xpa(m) => ClickModel::Xpa(m.try_load_file(path).map_err(|e| wrong(e.to_string()))?),
        })
    }
}
