//! Identifiability thresholds (`[identifiability]`).

use serde::{Deserialize, Serialize};

/// Identifiability thresholds (`[identifiability]`). Which graph identifies the model and which
/// positions count follow `[train]` (`tower`, `max_positions`), so the verdict is for the model trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct IdentifiabilityConfig {
    /// Adjacent positions are linked in the overlap graph when their cross-fitted overlap score
    /// (1 − |2·AUC − 1|) reaches this.
    pub min_overlap_score: f64,
    /// Positions with fewer sampled impressions are left out of the overlap graph.
    pub min_samples: usize,
    /// Below this impression-weighted within-position sd of π(d,k|q), residuals cannot be tested
    /// against the policy: misspecification is reported as not assessable instead of healthy.
    pub min_policy_variation: f64,
    /// A policy's logged propensities are flagged as disagreeing with its counted π when the
    /// Pearson dispersion of its (q, d, k) display counts around the logged π exceeds this (≈ 1 when
    /// the log is right; `identify::logged`).
    pub max_logged_propensity_dispersion: f64,
    /// A connected swap graph is only weakly identified when some θ_k − θ_1's 95% interval, from the
    /// information of the (query, document) pairs shown at several positions, is wider than this (logits).
    pub max_theta_interval: f64,
    /// The randomization the service plans at each verdict, and `ultr plan`'s defaults.
    pub randomization: RandomizationPlanConfig,
    /// Keys of earlier releases, refused with what replaced them.
    #[serde(skip_serializing)]
    #[schemars(skip)]
    pub max_position: Option<toml::Value>,
    #[serde(skip_serializing)]
    #[schemars(skip)]
    pub eta: Option<toml::Value>,
    #[serde(skip_serializing)]
    #[schemars(skip)]
    pub identified_by: Option<toml::Value>,
}

impl Default for IdentifiabilityConfig {
    fn default() -> Self {
        IdentifiabilityConfig {
            min_overlap_score: 0.1,
            min_samples: 30,
            min_policy_variation: 0.01,
            max_logged_propensity_dispersion: 2.0,
            max_theta_interval: 2.0,
            randomization: RandomizationPlanConfig::default(),
            max_position: None,
            eta: None,
            identified_by: None,
        }
    }
}

/// The randomization a team would run to make θ precise (`[identifiability.randomization]`): the
/// planner (`identify::plan`) answers how many sessions it needs, per position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RandomizationPlanConfig {
    /// The swap design.
    pub design: super::plan::Design,
    /// Share of sessions randomized, in (0, 1].
    pub fraction: f64,
    /// Target half-width of every θ_k − θ_1's 95% interval (unset: half of `max_theta_interval`, the
    /// width above which the verdict is WEAKLY IDENTIFIED).
    pub epsilon: Option<f64>,
}

impl Default for RandomizationPlanConfig {
    fn default() -> Self {
        RandomizationPlanConfig { design: super::plan::Design::AdjacentSwaps, fraction: 0.05, epsilon: None }
    }
}

impl IdentifiabilityConfig {
    /// The plan request these settings make for positions 1..=`positions`.
    pub fn plan_request(&self, positions: usize) -> super::plan::PlanRequest {
        let r = &self.randomization;
        super::plan::PlanRequest::uniform(r.design, r.fraction, positions, r.epsilon.unwrap_or(self.max_theta_interval / 2.0))
    }

    /// Every `[identifiability]` key checked, removed keys refused with what replaced them.
    pub fn validate(&self) -> Result<(), String> {
        for (key, set, now) in [
            ("max_position", self.max_position.is_some(), "the graphs cover `[train] max_positions`, the positions the model has"),
            ("eta", self.eta.is_some(), "the overlap score is a cross-fitted AUC and has no η"),
            (
                "identified_by",
                self.identified_by.is_some(),
                "identification follows `[train] tower` (swaps for `embedding`, swaps or feature overlap otherwise)",
            ),
        ] {
            if set {
                return Err(format!("key `identifiability.{key}` was removed: {now}"));
            }
        }
        if !(0.0..=1.0).contains(&self.min_overlap_score) {
            return Err(format!("key `identifiability.min_overlap_score` = {} must lie in [0, 1]", self.min_overlap_score));
        }
        if !(self.max_logged_propensity_dispersion > 0.0 && self.max_logged_propensity_dispersion.is_finite()) {
            return Err(format!(
                "key `identifiability.max_logged_propensity_dispersion` = {} must be a finite number > 0",
                self.max_logged_propensity_dispersion
            ));
        }
        if self.max_theta_interval.is_nan() || self.max_theta_interval <= 0.0 {
            return Err(format!("key `identifiability.max_theta_interval` = {} must be a number > 0", self.max_theta_interval));
        }
        let r = &self.randomization;
        if !(r.fraction > 0.0 && r.fraction <= 1.0) {
            return Err(format!("key `identifiability.randomization.fraction` = {} must lie in (0, 1]", r.fraction));
        }
        if let Some(e) = r.epsilon.filter(|e| !(*e > 0.0 && e.is_finite())) {
            return Err(format!("key `identifiability.randomization.epsilon` = {e} must be a finite number > 0"));
        }
        if !(0.0..=1.0).contains(&self.min_policy_variation) {
            return Err(format!("key `identifiability.min_policy_variation` = {} must lie in [0, 1]", self.min_policy_variation));
        }
        Ok(())
    }
}
