//! The gate's trivial baselines: a position-only click model and a smoothed per-(query, document)
//! click-through model, counted on the rows a candidate learned from and scored, like the candidate,
//! by the click log-likelihood per impression on the evaluation slice.
//!
//! A ranking model that predicts held-out clicks worse than click-through by position alone has
//! learned nothing a ranker can use (on one held-out real log a degenerate θ scored −1.036 per
//! impression where position alone scored −0.168), so the gate never promotes it (`decide`).
//!
//! The smoothing is fixed in advance, not tuned to a log: a position's rate is (c + 1) / (n + 2); a
//! pair's is (c + m·p̄) / (n + m) with p̄ the training click-through rate and m = 10 impressions, a
//! prior worth one page of results; a position or pair never seen in training gets p̄.

use std::collections::HashMap;

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use super::artefact::Trained;
use super::chunks::ExampleChunks;
use super::config::TrainConfig;
use super::data::{split_of, Examples, Split};

/// Pseudo-impressions of the per-pair model's prior at the training click-through rate.
pub const PAIR_PRIOR_IMPRESSIONS: f64 = 10.0;

/// Click log-likelihoods per impression on the evaluation slice (unweighted: what a deployed model
/// is asked to predict), the candidate beside the trivial baselines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldOutClicks {
    pub candidate: f64,
    /// The current model's, when there is one that can score these rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<f64>,
    /// P(click | position) counted on the training and validation rows.
    pub position_only: f64,
    /// P(click | query, document), smoothed toward the training click-through rate.
    pub pair_ctr: f64,
    pub impressions: f64,
    /// Whether a feature tower's candidate predicts the held-out clicks worse than per-pair CTR: the
    /// features miss relevance that repeats per (query, document). Reported, not gated: per-pair
    /// CTR cannot score a pair it has not seen, a ranking model must (docs/models.md, "The gate").
    #[serde(default)]
    pub below_pair_ctr: bool,
    /// Whether the candidate's click logits are click probabilities, so the comparison binds
    /// (false for DLA, whose listwise losses fix no level: reported, not gated).
    pub applies: bool,
}

impl HeldOutClicks {
    /// One line for `ultr train`, the three (or four) side by side.
    pub fn line(&self) -> String {
        let current = self.current.map(|c| format!(", current model {c:.5}")).unwrap_or_default();
        let note = if self.applies { "" } else { " (this model's click logits are uncalibrated: not gated on it)" };
        let below = if self.below_pair_ctr {
            "\n  the candidate predicts held-out clicks worse than per-(query, document) CTR: its features miss relevance that repeats per pair (not gated: per-pair CTR cannot rank a pair it has not seen)"
        } else {
            ""
        };
        format!(
            "held-out click log-likelihood per impression ({:.0} impressions): candidate {:.5}, position-only {:.5}, per-(query, document) CTR {:.5}{current}{note}{below}",
            self.impressions, self.candidate, self.position_only, self.pair_ctr
        )
    }
}

/// Click and impression counts of the rows a model learned from.
#[derive(Debug, Default)]
pub struct BaselineCounts {
    by_position: Vec<(f64, f64)>,
    by_pair: HashMap<(String, String), (f64, f64)>,
    clicks: f64,
    impressions: f64,
}

impl BaselineCounts {
    /// Adds the training and validation rows of `ex` (the evaluation rows are left out).
    pub fn add(&mut self, ex: &Examples, cfg: &TrainConfig) {
        for span in ex.sessions.iter().filter(|s| split_of(s, cfg.holdout()) != Split::Evaluation) {
            for r in &ex.rows[span.start..span.start + span.len] {
                let (c, n) = (r.clicks as f64, r.impressions as f64);
                let k = r.position as usize;
                if self.by_position.len() < k + 1 {
                    self.by_position.resize(k + 1, (0.0, 0.0));
                }
                self.by_position[k].0 += c;
                self.by_position[k].1 += n;
                let pair = self.by_pair.entry(ex.qd_keys[r.qd as usize].clone()).or_default();
                pair.0 += c;
                pair.1 += n;
                self.clicks += c;
                self.impressions += n;
            }
        }
    }

    fn mean(&self) -> f64 {
        (self.clicks + 1.0) / (self.impressions + 2.0)
    }

    /// The position-only model's click probability at 1-based `k`.
    pub fn position_rate(&self, k: usize) -> f64 {
        match self.by_position.get(k) {
            Some(&(c, n)) if n > 0.0 => (c + 1.0) / (n + 2.0),
            _ => self.mean(),
        }
    }

    /// The per-pair model's click probability of `(query, document)`.
    pub fn pair_rate(&self, key: &(String, String)) -> f64 {
        let (c, n) = self.by_pair.get(key).copied().unwrap_or((0.0, 0.0));
        let p = self.mean();
        (c + PAIR_PRIOR_IMPRESSIONS * p) / (n + PAIR_PRIOR_IMPRESSIONS)
    }
}

/// Σ over `n` impressions with `c` clicks of the Bernoulli log-likelihood at probability `p`.
fn log_likelihood(c: f64, n: f64, p: f64) -> f64 {
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    c * p.ln() + (n - c) * (1.0 - p).ln()
}

/// Sums over evaluation rows, which add up over chunks of the data.
#[derive(Debug, Default)]
struct Sums {
    candidate: f64,
    current: Option<f64>,
    position_only: f64,
    pair_ctr: f64,
    impressions: f64,
}

impl Sums {
    fn add(&mut self, ex: &Examples, counts: &BaselineCounts, candidate: &Trained, current: Option<&Trained>, cfg: &TrainConfig, device: &Device) {
        let val = ex.filter_sessions(|s| split_of(s, cfg.holdout()) == Split::Evaluation);
        if val.rows.is_empty() {
            return;
        }
        let ones = vec![1f32; val.rows.len()];
        // The models' unweighted click loss sums are −Σ log-likelihood.
        self.candidate -= candidate.loss_sums(&val, &ones, device).weighted_loss;
        if let Some(m) = current {
            *self.current.get_or_insert(0.0) -= m.loss_sums(&val, &ones, device).weighted_loss;
        }
        for r in &val.rows {
            let (c, n) = (r.clicks as f64, r.impressions as f64);
            self.position_only += log_likelihood(c, n, counts.position_rate(r.position as usize));
            self.pair_ctr += log_likelihood(c, n, counts.pair_rate(&val.qd_keys[r.qd as usize]));
            self.impressions += n;
        }
    }
}

/// The candidate's (and the current model's, when it can score these rows) held-out click
/// log-likelihood beside the trivial baselines'. None when the evaluation slice is empty.
pub fn held_out_clicks(data: &dyn ExampleChunks, candidate: &Trained, current: Option<&Trained>, cfg: &TrainConfig) -> anyhow::Result<Option<HeldOutClicks>> {
    let device = cfg.backend.device()?;
    let current = current.filter(|m| match data.in_memory() {
        Some(ex) => m.check_compatible(ex).is_ok(),
        None => true,
    });
    let mut counts = BaselineCounts::default();
    let mut sums = Sums::default();
    match data.in_memory() {
        Some(ex) => {
            counts.add(ex, cfg);
            sums.add(ex, &counts, candidate, current, cfg, &device);
        }
        None => {
            for split in [Split::Training, Split::Validation] {
                for i in 0..data.chunk_count(split) {
                    counts.add(&data.load_chunk(split, i)?, cfg);
                }
            }
            for i in 0..data.chunk_count(Split::Evaluation) {
                let chunk = data.load_chunk(Split::Evaluation, i)?;
                let current = current.filter(|m| m.check_compatible(&chunk).is_ok());
                sums.add(&chunk, &counts, candidate, current, cfg, &device);
            }
        }
    }
    if sums.impressions == 0.0 {
        return Ok(None);
    }
    let n = sums.impressions;
    Ok(Some(HeldOutClicks {
        candidate: sums.candidate / n,
        current: sums.current.map(|c| c / n),
        position_only: sums.position_only / n,
        pair_ctr: sums.pair_ctr / n,
        impressions: n,
        below_pair_ctr: candidate.meta.architecture.tower.reads_features() && sums.candidate < sums.pair_ctr,
        applies: candidate.meta.architecture.model.calibrated_clicks(),
    }))
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn bernoulli_log_likelihood_matches_a_hand_count() {
        // 3 clicks in 10 impressions at p = 0.3: 3·ln 0.3 + 7·ln 0.7.
        let want = 3.0 * 0.3f64.ln() + 7.0 * 0.7f64.ln();
        assert!((log_likelihood(3.0, 10.0, 0.3) - want).abs() < 1e-12);
        // A certain miss at p = 0 is finite (clamped), not −∞.
        assert!(log_likelihood(1.0, 1.0, 0.0).is_finite());
    }

    pub fn smoothed_rates_follow_the_stated_priors() {
        let mut counts = BaselineCounts { clicks: 8.0, impressions: 98.0, ..Default::default() };
        counts.by_position = vec![(0.0, 0.0), (6.0, 48.0), (2.0, 50.0)];
        counts.by_pair.insert(("q".into(), "d".into()), (4.0, 10.0));
        assert!((counts.position_rate(1) - 7.0 / 50.0).abs() < 1e-12);
        assert!((counts.position_rate(2) - 3.0 / 52.0).abs() < 1e-12);
        let mean = 9.0 / 100.0;
        assert!((counts.position_rate(7) - mean).abs() < 1e-12, "an unseen position gets the mean");
        assert!((counts.pair_rate(&("q".into(), "d".into())) - (4.0 + 10.0 * mean) / 20.0).abs() < 1e-12);
        assert!((counts.pair_rate(&("q".into(), "x".into())) - mean).abs() < 1e-12);
    }
}
