//! `[train]`: the two-tower model, IPS weights, optimiser and promotion settings, documented and
//! strict (unknown keys are refused). Defaults follow Hager et al. 2025 §7.

use serde::{Deserialize, Serialize};

use super::device::BackendKind;
use super::models::ModelSections;
pub use super::models::{Architecture, ModelKind, TowerKind};

/// `[train] aggregated_epoch`: what one epoch over aggregated rows is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AggregatedEpoch {
    /// As many steps as the raw path, rows drawn ∝ impressions.
    Impressions,
    /// Every row once, count-weighted.
    Rows,
}

/// `[train] position_bias`: where θ_k of a model with a feature tower comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PositionBiasSource {
    /// Before the tower trains, from the swap pairs: the (query, document) pairs shown at two
    /// positions or more, by the pairwise conditional likelihood (of a clicked and a skipped
    /// impression of one pair at positions k and l, the click is at k with probability
    /// σ(θ_k − θ_l), the pair's relevance cancelling; `crates/train/src/refit.rs`); then held fixed
    /// while r(x) trains. Relevance the features miss cancels instead of leaking into θ through the
    /// logging policy (Hager et al. 2025, the omitted-variable case). Where the swap
    /// pairs leave a position not estimable (no swap, or no click on them) training falls back to
    /// `joint`, and the fit report says so.
    SwapPairs,
    /// Learned with the tower by gradient descent, then refit by maximum likelihood with r(x) held
    /// fixed (`refit_position_bias`). Biased toward 0 when the features explain relevance only in
    /// part and the logging policy ranks by what they miss.
    Joint,
}

/// `[train] validation`: what the early-stopping slice holds out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ValidationUnit {
    /// A feature tower stops on queries it never trained on: the fit's sessions outside the
    /// evaluation slice are split by their query's hash (`validation_fraction` of them, in
    /// expectation). A tower that ranks new queries is selected on new queries; on a log where every
    /// document has hundreds of impressions, sessions of the training queries reward memorising
    /// them. The embedding tower, which cannot score a new query, keeps `sessions`.
    Queries,
    /// The sessions' own hash, as the windows split them.
    Sessions,
}

/// What to do with a training row whose (q,d,k) has no cumulative propensity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MissingPropensity {
    /// Refuse to train (the default: the state is inconsistent).
    Error,
    /// Weight such rows 1 and report how many there were.
    UnitWeight,
}

/// Where a logging policy's π(d,k|q) comes from (`sql/ips_propensity.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PropensitySource {
    /// Counted: the share of the query's sessions that showed d at k.
    Empirical,
    /// The policy's own `propensity` per item, as logged; a cell whose impressions lack it has no π.
    Logged,
    /// Logged where every impression of the cell carried a propensity, counted elsewhere.
    Auto,
}

impl PropensitySource {
    pub fn name(self) -> &'static str {
        match self {
            PropensitySource::Empirical => "empirical",
            PropensitySource::Logged => "logged",
            PropensitySource::Auto => "auto",
        }
    }
}

/// Inverse-propensity sample weights w = 1/π(d,k|q) (Hager Eq. 22).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct IpsConfig {
    /// Weight each impression by 1/π(d,k|q) (off by default: with θ from the swap
    /// pairs the weights added variance and no ranking, docs/benchmarks.md). Not applied with
    /// `tower = "embedding"`: a free γ per
    /// (query, document) already conditions on the document the logging policy placed, so the
    /// weights add only variance, and on sparse pairs they steepen θ (the fit report says so).
    pub enabled: bool,
    /// Weights above this are clipped to it.
    pub max_weight: f64,
    /// Divide the weighted loss by Σw instead of N.
    pub self_normalize: bool,
    pub on_missing: MissingPropensity,
    /// Where π comes from for every policy not named in `policies`.
    pub source: PropensitySource,
    /// Per `policy_id`, where its π comes from (overrides `source`).
    pub policies: std::collections::BTreeMap<String, PropensitySource>,
    /// Shrinks counted π toward the position's mean π with a prior worth this many sessions:
    /// π̃ = (impressions + m·π̄_k) / (sessions + m). 0 (the default) = no shrinkage. Logged π is
    /// never shrunk. See docs/propensities.md for its measured effect.
    pub prior_sessions: f64,
}

impl Default for IpsConfig {
    fn default() -> Self {
        IpsConfig {
            enabled: false,
            max_weight: 100.0,
            self_normalize: false,
            on_missing: MissingPropensity::Error,
            source: PropensitySource::Empirical,
            policies: Default::default(),
            prior_sessions: 0.0,
        }
    }
}

/// `[train]`: the click model and its relevance tower, the IPS weights, the optimiser, the stopping
/// rule, the promotion gate and the retraining schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// The click model (`crates/train/src/models/`): additive (PAL, the default), biased,
    /// gradient_reversal, observation_dropout, dla, rem, edot, einter, mixem, xpa.
    pub model: ModelKind,
    /// The relevance tower r(x) every model has.
    pub tower: TowerKind,
    pub hidden_layers: usize,
    pub hidden_units: usize,
    /// The tower sees only the first N features (None: all). For omitted-variable studies.
    pub feature_limit: Option<usize>,
    /// Add a small MLP b(z) over the sessions' bias features to the bias tower.
    pub bias_feature_tower: bool,
    /// θ_k is learned for positions 1..=max_positions; deeper impressions are left out (and counted).
    pub max_positions: usize,
    pub ips: IpsConfig,
    pub learning_rate: f64,
    pub weight_decay: f64,
    /// Impressions per optimizer step. A batch is whole sessions (raw) or whole aggregated rows,
    /// taken in shuffled order until they hold this many impressions, so an epoch takes the same
    /// number of steps whether the rows are raw or aggregated (Hager §7: 512 sessions × 10).
    pub batch_impressions: usize,
    /// Aggregated rows per optimizer step, drawn ∝ impressions: as many distinct keys per step as
    /// `batch_impressions / 10` raw sessions bring queries.
    pub batch_rows: usize,
    /// How an epoch walks aggregated rows of a pointwise model (raw rows and session models are
    /// unaffected). `impressions` (the default): the raw path's number of steps, impressions /
    /// `batch_impressions`, each drawing `batch_rows` rows ∝ impressions, so an epoch costs as many
    /// steps as the stream has events. `rows`: one pass over the rows in shuffled order, `batch_rows`
    /// rows per step, each entering with its count (the binomial loss of its impressions), so an
    /// epoch costs as many rows as the horizon has unique keys; it takes fewer steps per epoch and
    /// so more epochs (raise `max_epochs`).
    pub aggregated_epoch: AggregatedEpoch,
    /// A guard, not the stopping rule: training stops by `patience`. Set far above what any log
    /// tried needed (CLARA 2 stopped at 117, the simulator's densest regime at 120, its sparse
    /// regime, 2 optimizer steps an epoch, at 1,386–1,541; docs/models.md); the fit report says
    /// `max_epochs` when it is hit.
    pub max_epochs: usize,
    /// Stop after this many epochs without a better validation loss (the default stopping rule).
    pub patience: usize,
    /// Keep the epoch with the best validation loss and stop after `patience` epochs without one
    /// (the default). `false` trains all `max_epochs` and keeps the last: the converged estimate,
    /// which early stopping's shrinkage does not flatten (`ultr train --theta-intervals` reports both).
    pub early_stopping: bool,
    /// After training, re-estimate θ_k by maximum likelihood with the relevance tower frozen
    /// (`crates/train/src/refit.rs`): early stopping keeps r(x) from over-fitting but leaves θ
    /// flattened toward 0; the refit gives the θ the data support given the shipped r(x). Models
    /// whose logit has no additive θ_k are left as trained. A warm start (`--warm-start`, the
    /// service's scheduled runs) is not refit: its rows are only the windows its parent has not
    /// seen; it starts from the parent's refit θ.
    pub refit_position_bias: bool,
    /// Where a feature tower's θ_k comes from: `swap_pairs` (the default; estimated from the
    /// (query, document) pairs shown at two positions or more before the tower trains, then held
    /// fixed) or `joint` (trained with the tower, then refit with r(x) fixed). The embedding tower
    /// always estimates θ from its pairs. docs/models.md, "θ from the swap pairs", says why and
    /// with which figures.
    pub position_bias: PositionBiasSource,
    /// The embedding tower only: after the θ refit, re-estimate γ_{q,d} around a prior from the
    /// logging policy's order, γ ~ N(ρ_b, 1/λ) with b the pair's mean logged position
    /// (`crates/train/src/logged_order_prior.rs`). The strengths λ tried; the validation sessions'
    /// clicks choose one. Rare pairs then rank as the logging policy placed them and clicks move
    /// frequent ones; without it, never-clicked documents rank by how often they were shown. `[]`
    /// keeps γ as early stopping left it. Not applied to a warm start.
    pub logged_order_prior: Vec<f64>,
    /// With the logged-order prior: each pair's γ ships as its posterior mean less this many
    /// posterior standard deviations, 1/√(λ + Σ w·n·p(1−p)) over the pair's training rows. A pair
    /// whose clicks say little then ranks below one whose clicks show it; with the mean alone, a pair
    /// shown only at depth (where a steep θ makes a missing click uninformative) kept the prior's
    /// centre and ranked above the one clicked document of its query. The strength λ is chosen on the
    /// validation clicks of γ as shipped. `0` ships the posterior mean.
    pub logged_order_prior_lower_bound: f64,
    /// Every model: rank by the logged order (prior) combined with the clicks (evidence), c = (κ·μ +
    /// I·s + g)/(κ + I) per (query, document) (docs/models.md, "The logged order as prior, the clicks
    /// as evidence"). The prior precisions κ tried besides the model alone and the logged order
    /// alone; the validation sessions' clicks choose one. `[]`: no combination.
    pub logged_order_combination: Vec<f64>,
    /// Share of sessions held out for early stopping, chosen by session-id hash (stable across runs).
    pub validation_fraction: f64,
    /// What early stopping holds out: `queries` (the default; a feature tower is selected on queries
    /// it never trained on) or `sessions`. docs/models.md, "Early stopping on new queries".
    pub validation: ValidationUnit,
    /// Share of sessions held out of training and of early stopping: the promotion gate, `ultr eval`
    /// and the monitor's residual tests score them (the same hash, next slice).
    pub evaluation_fraction: f64,
    pub seed: u64,
    pub backend: BackendKind,
    /// Where checkpoints live (default `<state>/models`).
    pub models_dir: Option<std::path::PathBuf>,
    /// Memory the training examples may take (rows, feature vectors, the fit's per-row arrays).
    /// A horizon beyond it is spilled to disk in chunks of at most this size and streamed chunk by
    /// chunk every epoch. `512MiB`, `2GiB`, or bytes.
    pub memory_budget: ultr_core::units::ConfigBytes,
    /// With examples spilled to chunks: every epoch visits each training chunk this many times (in
    /// a fresh shuffled order each round, each visit with its share of the chunk's steps). More
    /// visits keep SGD from drifting towards the chunk it trained on last, at one chunk read each.
    pub chunk_visits: usize,
    /// A candidate is promoted when its validation loss ≤ current's × (1 + tolerance).
    pub promotion_tolerance: f64,
    /// After each training keep at most this many checkpoints besides the current one, deleting the
    /// oldest (rejected candidates and superseded models). Unset keeps every checkpoint.
    pub keep_checkpoints: Option<usize>,
    /// Cron expression (sec min hour day month weekday) for `ultr run`'s scheduled retraining.
    pub schedule: Option<String>,
    /// Scheduled runs after the first warm-start from the current model on the windows it has not seen.
    pub warm_start: bool,
    /// `ultr run` trains its first model only once the closed windows hold at least this many
    /// sessions; earlier firings of the schedule are skipped. A first model fit on a few seconds of a
    /// stream is underfit in the direction of the logging policy, which the misspecification signal
    /// then reports until the next training. 0: train on any closed window.
    pub min_sessions: u64,
    /// The models' own sections (`[train.<section>]`, e.g. `[train.dla]`), each declared in its
    /// model's file and listed by the registry (`crates/train/src/models/mod.rs`).
    #[serde(flatten)]
    pub sections: ModelSections,
    /// θ_k's intervals and converged estimate (`ultr train --theta-intervals`).
    pub uncertainty: UncertaintyConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelKind::Additive,
            // The rule of docs/models.md ("θ from the swap pairs"), applied to the 24 cells of
            // scripts/bench-vs-gbdt.sh (docs/benchmarks.md): a linear tower, no IPS weights.
            tower: TowerKind::Linear,
            hidden_layers: 2,
            hidden_units: 32,
            feature_limit: None,
            bias_feature_tower: false,
            max_positions: 50,
            ips: IpsConfig::default(),
            learning_rate: 0.003,
            weight_decay: 0.01,
            batch_impressions: 5_120,
            batch_rows: 512,
            aggregated_epoch: AggregatedEpoch::Impressions,
            max_epochs: 5_000,
            patience: 3,
            early_stopping: true,
            refit_position_bias: true,
            position_bias: PositionBiasSource::SwapPairs,
            logged_order_prior: vec![0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0],
            logged_order_prior_lower_bound: 1.0,
            logged_order_combination: vec![0.1, 1.0, 10.0, 100.0, 1000.0],
            validation_fraction: 0.1,
            validation: ValidationUnit::Queries,
            evaluation_fraction: 0.1,
            seed: 1,
            backend: BackendKind::default(),
            models_dir: None,
            memory_budget: ultr_core::units::bytes("2GiB"),
            chunk_visits: 16,
            promotion_tolerance: 0.002,
            keep_checkpoints: None,
            schedule: None,
            warm_start: true,
            min_sessions: 0,
            sections: ModelSections::default(),
            uncertainty: Default::default(),
        }
    }
}

impl TrainConfig {
    /// The defaults before θ came from the swap pairs, with which the paper replications (`ultr experiment`) and their
    /// recorded figures were measured: an MLP tower, IPS weights on, θ trained with the tower and
    /// refit, early stopping on sessions. The papers' estimators are these, so the experiments keep them.
    pub fn paper_replication() -> TrainConfig {
        TrainConfig {
            tower: TowerKind::Mlp,
            ips: IpsConfig { enabled: true, ..IpsConfig::default() },
            position_bias: PositionBiasSource::Joint,
            validation: ValidationUnit::Sessions,
            ..TrainConfig::default()
        }
    }

    /// The IPS weighting training applies: `[train.ips]` as configured, but off with the embedding
    /// tower. With a free γ per (query, document), the clicks' likelihood given where the logging
    /// policy put each pair is the model's own, so the weights correct nothing; they only add
    /// variance, and on sparse pairs they bias θ steeper (docs/propensities.md).
    pub fn applied_ips(&self) -> IpsConfig {
        IpsConfig { enabled: self.ips.enabled && self.tower.reads_features(), ..self.ips.clone() }
    }

    /// Why the configured IPS weights are not applied, when `applied_ips` turned them off.
    pub fn ips_not_applied(&self) -> Option<&'static str> {
        (self.ips.enabled && !self.applied_ips().enabled).then_some(
            "IPS not applied with the embedding tower: its free γ per (query, document) conditions on what the logging policy placed, so 1/π weights add only variance (train.ips.enabled is ignored)",
        )
    }

    /// Whether the fit's validation slice is queries (`validation = "queries"` with a tower that reads
    /// features) rather than the windows' sessions.
    pub fn validates_on_queries(&self) -> bool {
        self.validation == ValidationUnit::Queries && self.tower.reads_features()
    }

    /// The three-way session split the window rows are stored with.
    pub fn holdout(&self) -> ultr_core::window::Holdout {
        ultr_core::window::Holdout { validation: self.validation_fraction, evaluation: self.evaluation_fraction }
    }

    /// Checks ranges; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |v: usize, key: &str| if v == 0 { Err(format!("key `train.{key}` must be >= 1")) } else { Ok(()) };
        positive(self.batch_impressions, "batch_impressions")?;
        positive(self.batch_rows, "batch_rows")?;
        positive(self.max_epochs, "max_epochs")?;
        positive(self.chunk_visits, "chunk_visits")?;
        positive(self.max_positions, "max_positions")?;
        if self.uncertainty.enabled {
            self.uncertainty.validate()?;
        }
        if self.tower.has_hidden_layers() {
            positive(self.hidden_layers, "hidden_layers")?;
            positive(self.hidden_units, "hidden_units")?;
        }
        if let Some(0) = self.keep_checkpoints {
            return Err("key `train.keep_checkpoints` must be >= 1 (or unset to keep every checkpoint)".into());
        }
        if let Some(0) = self.feature_limit {
            return Err("key `train.feature_limit` must be >= 1 (or unset for all features)".into());
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return Err(format!("key `train.learning_rate` = {} must be > 0", self.learning_rate));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(format!("key `train.weight_decay` = {} must be >= 0", self.weight_decay));
        }
        if !(self.logged_order_prior_lower_bound >= 0.0 && self.logged_order_prior_lower_bound.is_finite()) {
            return Err(format!("key `train.logged_order_prior_lower_bound` is {}: it must be a finite number ≥ 0", self.logged_order_prior_lower_bound));
        }
        if let Some(bad) = self.logged_order_prior.iter().find(|l| !(**l > 0.0 && l.is_finite())) {
            return Err(format!("key `train.logged_order_prior` holds {bad}: every strength must be > 0 (or [] for no prior)"));
        }
        if let Some(bad) = self.logged_order_combination.iter().find(|l| !(**l > 0.0 && l.is_finite())) {
            return Err(format!("key `train.logged_order_combination` holds {bad}: every κ must be a finite number > 0 (or [] for no combination)"));
        }
        if !(0.0 < self.validation_fraction && self.validation_fraction < 1.0) {
            return Err(format!("key `train.validation_fraction` = {} must lie in (0, 1)", self.validation_fraction));
        }
        if !(0.0 < self.evaluation_fraction && self.validation_fraction + self.evaluation_fraction < 1.0) {
            return Err(format!(
                "key `train.evaluation_fraction` = {} must be > 0 and leave training rows (validation_fraction + evaluation_fraction < 1)",
                self.evaluation_fraction
            ));
        }
        if !(self.ips.prior_sessions >= 0.0 && self.ips.prior_sessions.is_finite()) {
            return Err(format!("key `train.ips.prior_sessions` = {} must be a finite number >= 0", self.ips.prior_sessions));
        }
        if !(self.ips.max_weight >= 1.0) {
            return Err(format!("key `train.ips.max_weight` = {} must be >= 1", self.ips.max_weight));
        }
        if !(self.promotion_tolerance >= 0.0) {
            return Err(format!("key `train.promotion_tolerance` = {} must be >= 0", self.promotion_tolerance));
        }
        self.model.validate(self.tower, self.max_positions, &self.sections)?;
        self.sections.validate()?;
        self.memory_budget_bytes()?;
        if let Some(expr) = &self.schedule {
            expr.parse::<cron::Schedule>().map_err(|e| format!("key `train.schedule` = {expr:?} is not a cron expression: {e}"))?;
        }
        Ok(())
    }

    /// `train.memory_budget` in bytes.
    pub fn memory_budget_bytes(&self) -> Result<usize, String> {
        Ok(self.memory_budget.bytes())
    }

    /// The settings a checkpoint must share with this config to warm-start from it.
    pub fn architecture(&self) -> Architecture {
        let mut arch = Architecture {
            model: self.model,
            shapes: Default::default(),
            tower: self.tower,
            hidden_layers: if self.tower.has_hidden_layers() { self.hidden_layers } else { 0 },
            hidden_units: if self.tower.has_hidden_layers() { self.hidden_units } else { 0 },
            feature_limit: self.feature_limit,
            bias_feature_tower: self.bias_feature_tower,
            max_positions: self.max_positions,
        };
        self.model.set_shape(&mut arch, &self.sections);
        arch
    }
}

impl TrainConfig {
    /// The name metrics and reports give the configured model (`Model::label`).
    pub fn model_label(&self) -> String {
        self.model.label(self.tower)
    }
}

/// `[train.uncertainty]`: what `ultr train --theta-intervals` computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UncertaintyConfig {
    /// Compute them after every training (`ultr train --theta-intervals` sets it for one run).
    pub enabled: bool,
    /// Bootstrap replicates (refits).
    pub replicates: usize,
    /// What a replicate resamples: `query` (the default) or `impression`.
    pub unit: ResampleUnit,
    /// Two-sided coverage of the intervals.
    pub level: f64,
    /// Epochs (optimizer steps) each replicate trains, warm-started from the converged model.
    pub epochs: usize,
    /// Most epochs of the converged (not early-stopped) fit; it trains in blocks of 10 epochs and
    /// stops once a block moves no θ_k by more than `tolerance`.
    pub converged_epochs: usize,
    pub tolerance: f64,
    pub seed: u64,
}

impl Default for UncertaintyConfig {
    fn default() -> Self {
        UncertaintyConfig {
            enabled: false,
            replicates: 50,
            unit: ResampleUnit::Query,
            level: 0.95,
            epochs: 50,
            converged_epochs: 2000,
            tolerance: 0.002,
            seed: 7,
        }
    }
}

impl UncertaintyConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.replicates < 10 {
            return Err(format!("key `train.uncertainty.replicates` = {} must be >= 10 (percentile intervals need replicates in both tails)", self.replicates));
        }
        if !(self.level > 0.0 && self.level < 1.0) {
            return Err(format!("key `train.uncertainty.level` = {} must lie in (0, 1)", self.level));
        }
        if self.epochs == 0 || self.converged_epochs == 0 {
            return Err("keys `train.uncertainty.epochs` and `train.uncertainty.converged_epochs` must be >= 1".into());
        }
        if !(self.tolerance > 0.0) {
            return Err(format!("key `train.uncertainty.tolerance` = {} must be > 0", self.tolerance));
        }
        Ok(())
    }
}

/// What a bootstrap replicate resamples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResampleUnit {
    /// Every query's sessions together, multiplicity Poisson(1): queries are the independent units,
    /// so the between-query variation of θ̂ (which queries the log happens to hold) is included.
    Query,
    /// Every impression on its own, multiplicity Poisson(1): only the click noise given the queries.
    Impression,
}
