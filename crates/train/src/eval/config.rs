//! `[eval]`: the editors' labels a service scores its promoted model against, live.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a ranked document without a label counts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Unjudged {
    /// It keeps its rank and gains 0 (trec_eval's treatment).
    #[default]
    Zero,
    /// It is removed before the cutoffs apply (a condensed list).
    Drop,
}

/// `[eval]`: judged evaluation in the service. With `qrels` set, `ultr run` scores the promoted
/// model, the logged order and naive click-through against the labels after each promotion and each
/// closed window, and exports `ultr_judged_ndcg` and `ultr_judged_ndcg_difference` (docs/metrics.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// TREC qrels (`query iteration document grade` per line), read when the service starts. Unset: no judged evaluation.
    pub qrels: Option<PathBuf>,
    /// What a ranked document without a label counts for: `zero` (gain 0 at its rank, as trec_eval) or `drop` (removed before the cutoffs).
    pub unjudged: Unjudged,
    /// Bootstrap resamples of the query set for the 95% intervals of the paired differences.
    pub bootstrap: usize,
    /// The bootstrap's seed.
    pub seed: u64,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig { qrels: None, unjudged: Unjudged::Zero, bootstrap: 1000, seed: 0 }
    }
}

impl EvalConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.qrels.is_some() && self.bootstrap < 100 {
            return Err(format!("key `eval.bootstrap` = {}: at least 100 resamples for a 95% interval", self.bootstrap));
        }
        Ok(())
    }
}
