//! The one interface every click model implements. The fit loop, the gate, `ultr eval`/`score`, the
//! export and the monitor reach a model only through it (dispatched by the registry in `mod.rs`).

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor};

use super::inputs::{BatchTensors, Dimensions};
use super::tower::{bce_with_logits, Mlp};

/// A click model: its parameters (a burn module), the click logits it predicts, the relevance r(x)
/// serving ranks by, the objective it trains, and the position bias it estimates.
pub trait Model: Module + Sized {
    /// Its `[train] model` name, and its name in reports and metric labels.
    const NAME: &'static str;
    /// Other names `[train] model` accepts.
    const ALIASES: &'static [&'static str] = &[];
    /// One line: the model and where it comes from.
    const SUMMARY: &'static str;
    /// Trains on whole sessions (a listwise loss or a per-session E-step), not on independent rows;
    /// takes no IPS weights.
    const LISTWISE: bool = false;
    /// Its click logits need the item's session (losses are scored on lists).
    const SESSION_LOGITS: bool = false;
    /// Its logit mixes position and relevance embeddings: a feature tower only, and served at a
    /// canonical position.
    const EMBEDDING_INTERACTION: bool = false;
    /// It estimates position effects (which the data must then identify, Hager §3–4).
    const POSITION_PARAMETERS: bool = true;
    /// Its click logits are click probabilities, so the gate holds its held-out click
    /// log-likelihood against the position-only model's (`baselines.rs`). False where the losses fix
    /// no level of the logits (DLA's listwise softmax).
    const CALIBRATED_CLICKS: bool = true;

    /// Its architecture section (`[train.<section>]`): what a warm start must share. `()` for none.
    type Shape: Clone + Default;
    /// Its objective's section: what a warm start may change. `()` for none.
    type Settings;

    /// A fresh model (parameters at burn's default initialisation, position parameters at 0 where
    /// the paper starts them there).
    fn new(dims: &Dimensions, shape: &Self::Shape, device: &Device) -> Self;

    /// σ⁻¹ P(click) of every row, as the model predicts at inference (no dropout).
    fn click_logits(&self, b: &BatchTensors) -> Tensor<1>;

    /// The relevance score r(x) (γ_{q,d} for embeddings) of every row: what serving ranks by.
    fn relevance(&self, b: &BatchTensors) -> Tensor<1>;

    /// The position bias relative to position 1, for k = 1..=K.
    fn position_bias(&self, max_positions: usize) -> Vec<f64>;

    /// The serving relevance as parameters (for the export): γ per pair, or one scalar MLP.
    fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>);

    /// Its click logit as a plain graph of (features, position) for the export: θ_k per position
    /// and the bias tower b(z), the logit being θ_k + b(z) + r(x). None (the default) where the click
    /// logit needs more than that: the session (XPA, DLA's listwise propensities), a mixture
    /// (MixEM), posteriors (REM), or no position at all.
    fn click_graph(&self) -> Option<(Tensor<1>, Option<Mlp>)> {
        None
    }

    /// The name metrics and reports give it with `tower`: `<model>/<tower>`.
    fn label(tower: super::inputs::TowerKind) -> String {
        format!("{}/{}", Self::NAME, tower.name())
    }

    /// Grows the γ embedding to `vocabulary` entries (new pairs start at 0) for a warm start.
    fn grow_embedding(self, vocabulary: usize, device: &Device) -> Self;

    /// Whether the click logit is additive in a per-position parameter θ_k, which
    /// `shift_position_logits` moves: the θ refit after early stopping (`refit.rs`) applies only then.
    fn has_position_logits(&self) -> bool {
        false
    }

    /// Adds `delta[k−1]` to the click logit of every impression at position k, if its click logit
    /// is additive in a per-position parameter (`θ_k`); false (and unchanged) otherwise. The
    /// refit of the bias tower after early stopping (`fit::refit`) uses it.
    fn shift_position_logits(&mut self, _delta: &[f32]) -> bool {
        false
    }

    /// Holds θ_k fixed in training (no gradient, no optimizer step) where the click logit has it;
    /// false (and unchanged) otherwise. `[train] position_bias = "swap_pairs"` fits θ first and
    /// then freezes it.
    fn freeze_position_logits(&mut self) -> bool {
        false
    }

    /// γ_{q,d} per vocabulary entry, if the click logit is θ_k + γ_{q,d} (+ b(z)) with an embedding
    /// tower; None otherwise. The logged-order prior (`logged_order_prior.rs`) re-estimates it.
    fn pair_relevance(&self) -> Option<Vec<f32>> {
        None
    }

    /// Replaces γ (same length as `pair_relevance`'s); false (and unchanged) where there is none.
    fn set_pair_relevance(&mut self, _gamma: &[f32]) -> bool {
        false
    }

    /// Σ w·BCE of the click logits: the loss every model is compared on.
    fn click_loss_sum(&self, b: &BatchTensors) -> Tensor<1> {
        (bce_with_logits(self.click_logits(b), b.clicks.clone()) * b.weights.clone()).sum()
    }

    /// The loss early stopping watches (the click loss unless the model's logits are uncalibrated).
    fn fit_loss_sum(&self, b: &BatchTensors) -> Tensor<1> {
        self.click_loss_sum(b)
    }

    /// Σ over the batch of the training objective.
    fn objective_sum(&self, b: &BatchTensors, _settings: &Self::Settings) -> Tensor<1> {
        self.click_loss_sum(b)
    }

    /// The position (1-based) a serving system must assume for `relevance`, if any.
    fn canonical_position(&self) -> Option<usize> {
        None
    }

    /// The setting (`key = value`) that makes training need the examples' relevance labels, which
    /// only simulations carry; None when these settings do not need them.
    fn needs_labels(_settings: &Self::Settings) -> Option<String> {
        None
    }

    /// Checks its sections against the shared dimensions; errors name the key.
    fn validate(_tower: super::inputs::TowerKind, _max_positions: usize, _shape: &Self::Shape) -> Result<(), String> {
        Ok(())
    }

    /// Checks its settings section (`Settings`); errors name the key. Every registered model's
    /// section is checked, whichever model is chosen (`ModelSections::validate`).
    fn validate_settings(_settings: &Self::Settings) -> Result<(), String> {
        Ok(())
    }

    /// Writes its record.
    fn write_record(&self, path: &Path) -> Result<(), String> {
        self.clone().save_file(path).map_err(|e| e.to_string())
    }

    /// Loads a record written by `write_record` into this skeleton.
    fn read_record(self, path: &Path) -> Result<Self, String> {
        self.try_load_file(path).map_err(|e| e.to_string())
    }
}
