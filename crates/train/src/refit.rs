//! The bias tower refit after early stopping: θ_k re-estimated by maximum likelihood on the
//! training rows, the relevance the model ships left as early stopping left it.
//!
//! Early stopping protects the relevance tower from over-fitting, but it stops θ too: started at 0,
//! θ moves slowly and the early-stopped θ_k − θ_1 is flattened toward 0 (on the simulator by +0.08
//! at k = 2 to +0.40 at k = 10, where the converged fit is unbiased to 0.025). The refit maximises
//! the weighted click log-likelihood Σ w·[c·ℓ − n·log(1 + e^ℓ)] in θ with the fit's own IPS weights:
//!
//! - **A feature tower** (linear, MLP): r(x) is shared by every document, so it is held fixed as an
//!   offset (ℓ = θ_k + r(x) + b(z)) and the problem separates into one concave Newton problem per
//!   position.
//! - **The embedding tower**: γ_{q,d} is free per pair, as θ's identification assumes (Hager §4).
//!   Early stopping shrinks each γ toward 0 by an amount that depends on its pair's count, and a pair
//!   shown at one position only carries no information about θ once its γ is free (its γ absorbs
//!   it); held fixed, such shrunk γ would hand θ the logging policy's ranking (on CLARA 2 the fixed-γ
//!   refit overshot the converged interval at 3 of 9 positions). So θ is fitted with a free γ per
//!   pair (profiled out by alternating Newton steps), on the pairs shown at two positions or more:
//!   the converged joint estimate's θ. The shipped γ are kept; one common shift of θ then matches
//!   the model's predicted clicks to the observed ones.

use serde::{Deserialize, Serialize};

use super::artefact::Trained;
use super::chunks::ExampleChunks;
use super::config::TrainConfig;
use super::data::{split_of, Examples, Split};
use super::weights::weights_of;
use ultr_core::math::sigmoid;

/// What the refit changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionRefit {
    /// θ_k − θ_1 before (as early stopping left it) and after the refit, k = 1..=K.
    pub before: Vec<f64>,
    pub after: Vec<f64>,
    /// Positions whose θ was refit (a position with no clicks, or only clicks, keeps its θ).
    pub positions: usize,
    /// Positions (1-based) with rows whose θ the data cannot estimate, kept as early stopping left
    /// them: their informative rows (the swap pairs, for the embedding tower) carry no click, or
    /// nothing but clicks, so the likelihood has no maximum there.
    #[serde(default)]
    pub not_estimable: Vec<usize>,
    /// The most Newton steps any position took.
    pub iterations: usize,
}

/// Weighted sufficient statistics of one training row: its position, its (query, document) in the
/// model's vocabulary (embedding tower), its click logit without the refit's shift, Σ w·n and Σ w·c.
pub(crate) struct RowTerms {
    pub position: usize,
    pub pair: u32,
    pub logit: f64,
    pub weighted_impressions: f64,
    pub weighted_clicks: f64,
}

/// Refits θ of `trained` on the training rows of `data` (see the module doc). None when the model's
/// logit has no additive per-position parameter (a session model, or position through a tower).
pub fn refit_position_bias(trained: &mut Trained, data: &dyn ExampleChunks, cfg: &TrainConfig) -> anyhow::Result<Option<PositionRefit>> {
    let positions = trained.meta.architecture.max_positions;
    if trained.meta.architecture.model.listwise() || !trained.model.clone().shift_position_logits(&vec![0.0; positions]) {
        return Ok(None);
    }
    let device = cfg.backend.device()?;
    let mut terms = Vec::new();
    match data.in_memory() {
        Some(ex) => row_terms(trained, ex, cfg, &device, positions, &mut terms),
        None => {
            for i in 0..data.chunk_count(Split::Training) {
                row_terms(trained, &data.load_chunk(Split::Training, i)?, cfg, &device, positions, &mut terms);
            }
        }
    }
    let before = trained.position_bias();
    let (delta, refit, iterations) = if trained.meta.architecture.tower == super::config::TowerKind::Embedding {
        profiled_shifts(&terms, positions)
    } else {
        newton_shifts(&terms, positions)
    };
    let not_estimable = not_estimable(&terms, positions, &delta);
    if refit == 0 {
        return Ok(None);
    }
    trained.model.shift_position_logits(&delta);
    let after = trained.position_bias();
    Ok(Some(PositionRefit { before, after, positions: refit, iterations, not_estimable }))
}

/// The 1-based positions that have rows but were not refit (a zero shift where rows exist).
fn not_estimable(terms: &[RowTerms], positions: usize, delta: &[f32]) -> Vec<usize> {
    let mut seen = vec![false; positions];
    terms.iter().for_each(|t| seen[t.position] = true);
    (0..positions).filter(|&k| seen[k] && delta[k] == 0.0).map(|k| k + 1).collect()
}

/// Appends the terms of `ex`'s training rows at positions 1..=`positions`.
fn row_terms(trained: &Trained, ex: &Examples, cfg: &TrainConfig, device: &burn::tensor::Device, positions: usize, out: &mut Vec<RowTerms>) {
    let logits = trained.logits(ex, device);
    let (weights, _) = weights_of(&ex.rows, &cfg.applied_ips());
    let qd_map = trained.qd_map(ex);
    for span in ex.sessions.iter().filter(|s| split_of(s, cfg.holdout()) == Split::Training) {
        for i in span.start..span.start + span.len {
            let r = &ex.rows[i];
            let k = r.position as usize;
            if k == 0 || k > positions {
                continue;
            }
            let w = weights[i] as f64;
            let pair = qd_map.get(r.qd as usize).copied().unwrap_or(0);
            out.push(RowTerms { position: k - 1, pair, logit: logits[i] as f64, weighted_impressions: w * r.impressions as f64, weighted_clicks: w * r.clicks as f64 });
        }
    }
}

/// The δ that zeroes Σ w·(c − n·σ(ℓ + offset + δ)) − ridge·δ over the rows `rows` of `terms`
/// (`offset(i)` added to row i's logit; `ridge` a Gaussian prior's precision on δ, 0 for none), by
/// damped Newton steps from `start`; and the steps taken.
pub(crate) fn newton_one(terms: &[RowTerms], rows: &[usize], offset: impl Fn(usize) -> f64, start: f64, ridge: f64) -> (f64, usize) {
    let mut d = start;
    for iteration in 1..=MAX_ITERATIONS {
        let (mut gradient, mut curvature) = (-ridge * d, ridge);
        for &i in rows {
            let t = &terms[i];
            let p = sigmoid(t.logit + offset(i) + d);
            gradient += t.weighted_clicks - t.weighted_impressions * p;
            curvature += t.weighted_impressions * p * (1.0 - p);
        }
        let step = (gradient / curvature.max(f64::MIN_POSITIVE)).clamp(-MAX_STEP, MAX_STEP);
        d += step;
        if step.abs() < 1e-7 {
            return (d, iteration);
        }
    }
    (d, MAX_ITERATIONS)
}

/// Rounds of the alternating (θ, γ) iteration, and the largest change of θ that ends it.
const MAX_ROUNDS: usize = 2000;
const ROUND_TOLERANCE: f64 = 1e-5;
/// The precision of a weak Gaussian prior N(0, 10²) on every shift of the profiled refit: negligible
/// where the likelihood has a maximum (a pair's or position's curvature is Σ w·n·p(1−p), hundreds
/// on any estimable one), and a finite answer where quasi-separation leaves it none. Without it a
/// position whose swap pairs carried no clicks ran to θ = −834 on a real log.
const SHIFT_RIDGE: f64 = 1e-2;

/// The embedding tower's refit (module doc): per position δ_k with a free shift ε per pair, over the
/// pairs shown at two positions or more with clicked and unclicked weight; then δ relative to
/// position 1 plus the common shift that matches predicted to observed clicks over every row, γ as
/// shipped. Returns δ, the positions refit and the rounds taken.
fn profiled_shifts(terms: &[RowTerms], positions: usize) -> (Vec<f32>, usize, usize) {
    use std::collections::HashMap;
    let mut pairs: HashMap<u32, (Vec<usize>, u64, f64, f64)> = HashMap::new();
    for (i, t) in terms.iter().enumerate() {
        let e = pairs.entry(t.pair).or_insert((Vec::new(), 0, 0.0, 0.0));
        e.0.push(i);
        e.1 |= 1 << t.position.min(63);
        e.2 += t.weighted_clicks;
        e.3 += t.weighted_impressions;
    }
    let mut informative: Vec<Vec<usize>> =
        pairs.into_values().filter(|(_, seen, c, n)| seen.count_ones() >= 2 && *c > 0.0 && *c < *n).map(|(rows, ..)| rows).collect();
    // A position whose informative rows carry no click (or only clicks) has no θ these data can
    // estimate: it keeps the early-stopped θ instead of running to −∞ (reported as not estimable),
    // and its rows, which say nothing about a pair's γ without that θ, leave the problem.
    let mut sums = vec![(0f64, 0f64); positions];
    for &i in informative.iter().flatten() {
        sums[terms[i].position].0 += terms[i].weighted_clicks;
        sums[terms[i].position].1 += terms[i].weighted_impressions;
    }
    let estimable: Vec<bool> = sums.iter().map(|&(c, n)| c > 0.0 && c < n).collect();
    informative.iter_mut().for_each(|rows| rows.retain(|&i| estimable[terms[i].position]));
    informative.retain(|rows| !rows.is_empty());
    let mut by_position: Vec<Vec<usize>> = vec![Vec::new(); positions];
    let mut pair_of = vec![usize::MAX; terms.len()];
    for (p, rows) in informative.iter().enumerate() {
        for &i in rows {
            by_position[terms[i].position].push(i);
            pair_of[i] = p;
        }
    }
    let mut delta = vec![0f64; positions];
    let mut epsilon = vec![0f64; informative.len()];
    let mut rounds = 0;
    while rounds < MAX_ROUNDS {
        rounds += 1;
        for (p, rows) in informative.iter().enumerate() {
            epsilon[p] = newton_one(terms, rows, |i| delta[terms[i].position], epsilon[p], SHIFT_RIDGE).0;
        }
        let mut moved = 0f64;
        for (k, rows) in by_position.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let next = newton_one(terms, rows, |i| epsilon[pair_of[i]], delta[k], SHIFT_RIDGE).0;
            moved = moved.max((next - delta[k]).abs());
            delta[k] = next;
        }
        // δ and ε share one free constant; pin δ_1 so `moved` measures θ_k − θ_1.
        let anchor = delta[0];
        delta.iter_mut().for_each(|d| *d -= anchor);
        epsilon.iter_mut().for_each(|e| *e += anchor);
        if moved < ROUND_TOLERANCE {
            break;
        }
    }
    let refit = by_position.iter().filter(|rows| !rows.is_empty()).count();
    let every_row: Vec<usize> = (0..terms.len()).collect();
    let level = newton_one(terms, &every_row, |i| if by_position[terms[i].position].is_empty() { 0.0 } else { delta[terms[i].position] }, 0.0, 0.0).0;
    let shifts = (0..positions).map(|k| if by_position[k].is_empty() { 0.0 } else { (delta[k] + level) as f32 }).collect();
    (shifts, refit, rounds)
}

/// Newton steps larger than this are cut to it (the per-position problem is concave, so a damped
/// Newton iteration converges from δ = 0).
const MAX_STEP: f64 = 1.0;
const MAX_ITERATIONS: usize = 100;

/// Per position, the δ_k that zeroes Σ w·(c − n·σ(ℓ + δ_k)); positions without both clicked and
/// unclicked weight keep δ = 0. Returns δ, the positions refit and the most iterations taken.
fn newton_shifts(terms: &[RowTerms], positions: usize) -> (Vec<f32>, usize, usize) {
    let mut by_position: Vec<Vec<usize>> = vec![Vec::new(); positions];
    for (i, t) in terms.iter().enumerate() {
        by_position[t.position].push(i);
    }
    let (mut delta, mut refit, mut most) = (vec![0f32; positions], 0, 0);
    for (k, rows) in by_position.iter().enumerate() {
        let clicks: f64 = rows.iter().map(|&i| terms[i].weighted_clicks).sum();
        let impressions: f64 = rows.iter().map(|&i| terms[i].weighted_impressions).sum();
        if clicks <= 0.0 || clicks >= impressions {
            continue;
        }
        let (d, steps) = newton_one(terms, rows, |_| 0.0, 0.0, 0.0);
        delta[k] = d as f32;
        refit += 1;
        most = most.max(steps);
    }
    (delta, refit, most)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shift solves the per-position score equation: after it, the weighted expected clicks at
    /// each position equal the weighted clicks (an independent check of the Newton iteration).
    #[test]
    fn the_refit_matches_expected_to_observed_clicks_at_every_position() {
        let mut terms = Vec::new();
        let mut state = 7u64;
        let mut uniform = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for i in 0..600 {
            let position = i % 3;
            let n = 1.0 + (uniform() * 20.0).floor();
            let c = (n * (0.6 - 0.2 * position as f64) * uniform()).floor();
            terms.push(RowTerms { position, pair: i as u32, logit: uniform() * 2.0 - 1.0, weighted_impressions: 1.5 * n, weighted_clicks: 1.5 * c });
        }
        // A position with no clicks keeps its θ.
        terms.push(RowTerms { position: 3, pair: 0, logit: 0.0, weighted_impressions: 4.0, weighted_clicks: 0.0 });
        let (delta, refit, iterations) = newton_shifts(&terms, 4);
        assert_eq!(refit, 3);
        assert!(iterations < MAX_ITERATIONS, "{iterations}");
        assert_eq!(delta[3], 0.0);
        for k in 0..3 {
            let rows = terms.iter().filter(|t| t.position == k);
            let (observed, expected) = rows.fold((0.0, 0.0), |(o, e), t| (o + t.weighted_clicks, e + t.weighted_impressions * sigmoid(t.logit + delta[k] as f64)));
            assert!((observed - expected).abs() < 1e-3 * observed, "k = {k}: {observed} observed, {expected} expected");
        }
        // The positions' click rates fall with k, so their shifts do too.
        assert!(delta[0] > delta[1] && delta[1] > delta[2], "{delta:?}");
    }

    /// The embedding tower's refit recovers θ from shrunk γ where holding γ fixed does not. Pairs
    /// are placed by the logging policy (higher γ, higher position: confounded), some at two or
    /// three positions, others at one; clicks are the model's expected counts, so the likelihood's
    /// optimum is the truth (up to rounding the counts) and the tolerance needs no seed.
    /// 400 pairs placed by a confounding policy (higher γ, higher position), some at two or three
    /// positions, others at one, 300 impressions a row, clicks the expected count under `truth`, and
    /// logits as early stopping left them (`early` θ, γ shrunk to 0.3 of itself).
    fn confounded_terms(truth: &[f64; 5], early: &[f64; 5]) -> Vec<RowTerms> {
        let mut terms = Vec::new();
        for pair in 0..400u32 {
            let gamma = 2.0 - 4.0 * pair as f64 / 400.0;
            let top = ((pair as usize * 5) / 400).min(4);
            let shown: Vec<usize> = match pair % 3 { 0 => vec![top], 1 => vec![top, (top + 1) % 5], _ => vec![top, (top + 2) % 5, (top + 3) % 5] };
            for k in shown {
                let n = 300.0;
                let c = (n * sigmoid(truth[k] + gamma)).round();
                terms.push(RowTerms { position: k, pair, logit: early[k] + 0.3 * gamma, weighted_impressions: n, weighted_clicks: c });
            }
        }
        terms
    }

    #[test]
    fn the_profiled_refit_recovers_theta_from_shrunk_relevance_under_a_confounding_policy() {
        let truth = [0.0, -0.7, -1.1, -1.4, -1.6];
        let early = [0.0, -0.3, -0.5, -0.6, -0.7];
        let terms = confounded_terms(&truth, &early);
        let relative = |delta: &[f32]| -> Vec<f64> { (0..5).map(|k| early[k] + delta[k] as f64 - early[0] - delta[0] as f64).collect() };
        let (delta, refit, _) = profiled_shifts(&terms, 5);
        assert_eq!(refit, 5);
        let profiled = relative(&delta);
        for k in 1..5 {
            assert!((profiled[k] - truth[k]).abs() < 0.02, "k = {}: profiled {:?} vs truth {truth:?}", k + 1, profiled);
        }
        // Held fixed, the shrunk γ hand θ the policy's ranking: θ comes out too steep.
        let fixed = relative(&newton_shifts(&terms, 5).0);
        assert!(fixed[4] < truth[4] - 0.3, "fixed-γ refit {fixed:?} vs truth {truth:?}");
        // The common shift matches predicted to observed clicks over every row.
        let (observed, expected) = terms.iter().fold((0.0, 0.0), |(o, e), t| (o + t.weighted_clicks, e + t.weighted_impressions * sigmoid(t.logit + delta[t.position] as f64)));
        assert!((observed - expected).abs() < 1e-3 * observed, "{observed} vs {expected}");
    }

    /// Regression (issue 55): a position whose swap pairs carry no clicks has no maximum-likelihood
    /// θ, and the profiled refit ran it to −∞ (θ_5 − θ_1 = −834 on a real log, 2,000 rounds of
    /// Newton steps of −1). Now that position keeps the early-stopped θ (a zero shift), is reported
    /// as not estimable, and the other positions are recovered as in the test above.
    #[test]
    fn a_position_whose_swap_pairs_carry_no_clicks_keeps_a_finite_theta_and_is_reported() {
        // Nobody clicks at position 5: σ(−∞ + γ) = 0.
        let truth = [0.0, -0.7, -1.1, -1.4, f64::NEG_INFINITY];
        let early = [0.0, -0.3, -0.5, -0.6, -0.7];
        let terms = confounded_terms(&truth, &early);
        assert!(terms.iter().filter(|t| t.position == 4).all(|t| t.weighted_clicks == 0.0));
        let (delta, refit, rounds) = profiled_shifts(&terms, 5);
        assert!(delta.iter().all(|d| d.is_finite()), "{delta:?}");
        assert_eq!(refit, 4);
        assert!(rounds < MAX_ROUNDS, "the alternating iteration settled ({rounds} rounds)");
        assert_eq!(delta[4], 0.0, "position 5 keeps the early-stopped θ: {delta:?}");
        assert_eq!(not_estimable(&terms, 5, &delta), vec![5]);
        let relative: Vec<f64> = (0..4).map(|k| early[k] + delta[k] as f64 - early[0] - delta[0] as f64).collect();
        for k in 1..4 {
            assert!((relative[k] - truth[k]).abs() < 0.02, "k = {}: profiled {relative:?} vs truth {truth:?}", k + 1);
        }
    }
}
