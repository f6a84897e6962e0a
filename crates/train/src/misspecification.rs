//! Misspecification test (Hager §5.2–5.3, §9.1): does the logging policy's propensity π(d,k|q)
//! predict held-out click residuals beyond what the model predicts? Calibrated, so one threshold
//! means the same false-alarm rate at any traffic, and explicit about data that cannot show it.
//!
//! Under a well-specified additive model E[c | x, k] = σ(θ_k + r(x)) whatever the policy did, so on
//! sessions the model was not fitted on the residual e = c − p̂ is uncorrelated with any function of
//! π once the model's own directions are taken out. Per position k this is the score test of adding
//! β_k·π to the logit:
//!
//!   g_i = π_i − (a_k + b_k·ẑ_i)   π residualised on [1, ẑ] (ẑ the model's logit) under the
//!                                 binomial weights n_i·p̂_i(1 − p̂_i), so a level or scale error of
//!                                 the logit (a slightly off θ_k) does not count as policy dependence;
//!   U_k = Σ_i (c_i − n_i·p̂_i)·g_i.
//!
//! Positions are pooled in dyadic blocks {1}, {2,3}, {4..7}, {8..15}, … (U_B = Σ_{k∈B} U_k, one β per
//! block): misspecification moves neighbouring positions alike (Hager Fig. 3: the bias is smooth in
//! k, largest at the top), so 6 degrees of freedom instead of 50 keep the power that 50 separate
//! tests would spread thin.
//! The covariance of U = (U_B1..U_BK) is estimated robustly, clustered by (query, document): a
//! document's unexplained relevance (noise no feature carries) makes its clicks overdispersed and
//! correlated across positions, which the binomial variance would mistake for a signal. Then
//! T = Uᵀ Σ̂⁻¹ U is χ²_K under the null, and z is its Wilson–Hilferty normal equivalent
//! (P(z > 4) ≈ 3·10⁻⁵ per test).
//!
//! Per-document relevance (the embedding tower: one γ_{q,d} each) needs more: each γ̂ is a
//! finite-sample estimate, and its error is largest for rarely shown documents, which are the low-π
//! ones. At a given ẑ a low-π document's true γ lies nearer the mean than a high-π one's (regression
//! to the mean), so residuals correlate with π through the model's own estimation noise, and the test
//! fired on a stream the model fits exactly (docs/metrics.md). The test is then made orthogonal to the model's own
//! parameters (`Nuisance::PerDocument`): per-(q, d) offsets δ and per-position levels α are refit on
//! the held-out rows (ẑ' = ẑ + δ_qd + α_k), and π is residualised on [1, ẑ'] per position and on the
//! (q, d) indicators, so only π's variation *within* a document across positions is tested. That is
//! the part of the policy a per-document model cannot absorb. It has less power than the feature
//! towers' test (the variation between documents is spent on the nuisance).
//!
//! Blindness: when π(d,k|q) does not vary within positions (a deterministic policy, π ≡ 1, and no
//! randomised traffic) there is nothing to correlate with; the test says so instead of reporting 0.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::data::Row;
use ultr_core::identify::policy::{blind_reason, policy_variation};
use ultr_core::math::sigmoid;

/// The test on one batch of held-out rows.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MisspecificationTest {
    /// Whether the data can show misspecification through the policy at all.
    pub assessable: bool,
    /// Why not, when not.
    pub reason: Option<String>,
    /// Normal equivalent of T (NaN when not assessable).
    pub z: f64,
    pub chi2: f64,
    /// Position blocks tested (degrees of freedom).
    pub dof: usize,
    /// Impression-weighted within-position standard deviation of π (0 under a deterministic policy).
    pub policy_variation: f64,
    /// (query, document) clusters behind the covariance.
    pub clusters: usize,
    pub impressions: u64,
    /// Signed per-block z_B = U_B / √Σ̂_BB, by the block's first position.
    pub per_block: Vec<(u32, f64)>,
}

/// The normal deviate with the same upper tail as χ²_k at t: z = −Φ⁻¹(P(χ²_k > t)) (statrs), taken
/// from the nearer tail so neither side loses its digits to 1 − p. Past the upper tail f64 can hold
/// (z ≳ 37), from the tail's logarithm: ln Q(k/2, t/2) by its asymptotic series and Φ̄'s Mills ratio.
pub fn chi2_to_z(t: f64, k: usize) -> f64 {
    use statrs::distribution::{ChiSquared, ContinuousCDF, Normal};
    if t.is_nan() || k == 0 {
        return f64::NAN;
    }
    let (t, kf) = (t.max(0.0), k as f64);
    let Ok(chi2) = ChiSquared::new(kf) else { return f64::NAN };
    let (tail, sign) = if t > kf { (chi2.sf(t), -1.0) } else { (chi2.cdf(t), 1.0) };
    if tail > f64::MIN_POSITIVE {
        return sign * Normal::standard().inverse_cdf(tail);
    }
    if t == f64::INFINITY {
        return f64::INFINITY;
    }
    // ln Q(a, x) = (a−1) ln x − x − ln Γ(a) + ln(1 + (a−1)/x + (a−1)(a−2)/x² + …), x ≫ a.
    let (a, x) = (kf / 2.0, t / 2.0);
    let (mut term, mut series) = (1.0f64, 1.0f64);
    for j in 1..=20 {
        term *= (a - j as f64) / x;
        series += term;
    }
    let log_tail = (a - 1.0) * x.ln() - x - statrs::function::gamma::ln_gamma(a) + series.ln();
    // Φ̄(z) ≈ φ(z)/z: solve z²/2 + ln z + ln √(2π) = −ln p by fixed point.
    let mut z = (-2.0 * log_tail).sqrt();
    for _ in 0..4 {
        z = (2.0 * (-log_tail - z.ln() - 0.5 * (2.0 * std::f64::consts::PI).ln())).sqrt();
    }
    z
}

/// The model's own free parameters, whose estimation error the test must not mistake for policy
/// dependence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nuisance {
    /// Feature towers: a level or scale error of the logit per position (θ_k, the tower's scale).
    PositionLogit,
    /// Per-(query, document) relevance (embedding tower): also one offset per document.
    PerDocument,
}

impl Nuisance {
    /// The nuisance of a model with this relevance tower: per document where the tower has a free
    /// γ per (query, document), per position otherwise.
    pub fn of_tower(tower: crate::models::TowerKind) -> Nuisance {
        if tower.pair_embedding() {
            Nuisance::PerDocument
        } else {
            Nuisance::PositionLogit
        }
    }
}

/// The test of `trained` on every row of `heldout` (rows no fit or early stopping chose by): what
/// `ultr eval` reports beside the monitor's per-window figures.
pub fn of_model(
    trained: &crate::artefact::Trained,
    heldout: &crate::data::Examples,
    min_policy_variation: f64,
    device: &burn::tensor::Device,
) -> MisspecificationTest {
    let logits = trained.logits(heldout, device);
    score_test(&heldout.rows, &logits, |_| true, min_policy_variation, Nuisance::of_tower(trained.meta.architecture.tower))
}

/// Runs the test on `rows` (with the model's logits) where `include` holds. Rows without a finite π
/// are left out. `min_policy_variation` is the within-position sd of π below which the data is
/// called blind.
pub fn score_test(rows: &[Row], logits: &[f32], include: impl Fn(usize) -> bool, min_policy_variation: f64, nuisance: Nuisance) -> MisspecificationTest {
    let chosen: Vec<usize> = (0..rows.len()).filter(|&i| include(i) && rows[i].propensity.is_finite() && rows[i].impressions > 0).collect();
    let impressions: u64 = chosen.iter().map(|&i| rows[i].impressions as u64).sum();
    let variation = policy_variation(chosen.iter().map(|&i| (rows[i].position, rows[i].propensity, rows[i].impressions as f64)));
    let blind = |reason: String| MisspecificationTest {
        assessable: false,
        reason: Some(reason),
        z: f64::NAN,
        chi2: f64::NAN,
        dof: 0,
        policy_variation: variation,
        clusters: 0,
        impressions,
        per_block: Vec::new(),
    };
    if chosen.is_empty() {
        return blind("no held-out impressions with a propensity to test".into());
    }
    if let Some(reason) = blind_reason(variation, min_policy_variation) {
        return blind(reason);
    }
    let mut by_pos: BTreeMap<u32, Vec<usize>> = Default::default();
    for &i in &chosen {
        by_pos.entry(rows[i].position).or_default().push(i);
    }
    // The logit the residuals are taken against: the model's, or (per-document relevance) the
    // model's with its per-document and per-position levels refit on these rows.
    let z: Vec<f64> = match nuisance {
        Nuisance::PositionLogit => logits.iter().map(|&z| z as f64).collect(),
        Nuisance::PerDocument => refit_levels(rows, logits, &chosen),
    };
    let weight: Vec<f64> = (0..rows.len())
        .map(|i| {
            let q = sigmoid(z[i]);
            rows[i].impressions as f64 * q * (1.0 - q)
        })
        .collect();
    let positions = testable_positions(rows, &by_pos, &weight, min_policy_variation);
    let g = residualised_propensity(rows, &by_pos, &positions, &z, &weight, nuisance);
    let mut blocks: Vec<u32> = positions.iter().map(|k| block_start(*k)).collect();
    blocks.dedup();
    let kdim = blocks.len();
    if kdim == 0 {
        return blind("no position has variation in π to test".into());
    }
    let slot: HashMap<u32, usize> = positions.iter().map(|k| (*k, blocks.iter().position(|b| *b == block_start(*k)).expect("its block"))).collect();
    let (u, cov, clusters) = cluster_robust_score(rows, &chosen, &slot, &z, &g, kdim);
    if clusters < 2 * kdim + 10 {
        return blind(format!("{clusters} (query, document) pairs are too few to estimate the residual covariance over {kdim} positions"));
    }
    let per_block: Vec<(u32, f64)> =
        blocks.iter().enumerate().map(|(j, k)| (*k, if cov[j * kdim + j] > 0.0 { u[j] / cov[j * kdim + j].sqrt() } else { 0.0 })).collect();
    let chi2 = quadratic_form_inverse(&cov, &u, kdim);
    MisspecificationTest {
        assessable: true,
        reason: None,
        z: chi2_to_z(chi2, kdim),
        chi2,
        dof: kdim,
        policy_variation: variation,
        clusters,
        impressions,
        per_block,
    }
}

/// Positions that carry a test: π varies within them and some residual can move (a position where
/// π is constant carries no test and no degree of freedom).
fn testable_positions(rows: &[Row], by_pos: &BTreeMap<u32, Vec<usize>>, weight: &[f64], min_policy_variation: f64) -> Vec<u32> {
    by_pos
        .iter()
        .filter(|(_, idx)| {
            let (mut sn, mut sp, mut spp, mut sw) = (0.0, 0.0, 0.0, 0.0);
            for &i in idx.iter() {
                let (n, p) = (rows[i].impressions as f64, rows[i].propensity);
                sn += n;
                sp += n * p;
                spp += n * p * p;
                sw += weight[i];
            }
            ((spp - sp * sp / sn).max(0.0) / sn).sqrt() >= min_policy_variation * 1e-3 && sw > 0.0
        })
        .map(|(k, _)| *k)
        .collect()
}

/// π residualised on the nuisance directions under w = n·p̂(1 − p̂): [1, ẑ] per position, and
/// (per-document) the (q, d) indicators, by alternating projections until they agree.
fn residualised_propensity(rows: &[Row], by_pos: &BTreeMap<u32, Vec<usize>>, positions: &[u32], z: &[f64], weight: &[f64], nuisance: Nuisance) -> Vec<f64> {
    let tested: Vec<usize> = positions.iter().flat_map(|k| by_pos[k].iter().copied()).collect();
    let mut g: Vec<f64> = rows.iter().map(|r| r.propensity).collect();
    let sweeps = if nuisance == Nuisance::PerDocument { 200 } else { 1 };
    // Each tested row's (q, d) as a dense slot, and each slot's total weight (constant across the
    // sweeps), summed in the tested rows' order as every sweep would: the sweeps index vectors
    // instead of hashing each row's key twice per sweep.
    let documents = if nuisance == Nuisance::PerDocument { Some(DocumentSlots::new(rows, &tested, weight)) } else { None };
    for _ in 0..sweeps {
        for k in positions {
            project_out_position_logit(&by_pos[k], z, weight, &mut g);
        }
        if let Some(documents) = &documents {
            if documents.project_out(&tested, weight, &mut g) < 1e-12 {
                break;
            }
        }
    }
    g
}

/// g minus its weighted regression on [1, ẑ] over one position's rows.
fn project_out_position_logit(idx: &[usize], z: &[f64], weight: &[f64], g: &mut [f64]) {
    let (mut s0, mut s1, mut s2, mut t0, mut t1) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &i in idx {
        let (w, zi) = (weight[i], z[i]);
        s0 += w;
        s1 += w * zi;
        s2 += w * zi * zi;
        t0 += w * g[i];
        t1 += w * zi * g[i];
    }
    let det = s0 * s2 - s1 * s1;
    let (a, b) = if det > 1e-12 * s0 * s2.max(1e-300) { ((t0 * s2 - t1 * s1) / det, (s0 * t1 - s1 * t0) / det) } else { (t0 / s0, 0.0) };
    for &i in idx {
        g[i] -= a + b * z[i];
    }
}

/// Dense slots, in first-seen order, for the keys of a list of rows: `slot[j]` is the `j`-th row's.
fn dense_slots(keys: impl Iterator<Item = u32>) -> (HashMap<u32, usize>, Vec<usize>) {
    let mut index: HashMap<u32, usize> = HashMap::new();
    let slot = keys
        .map(|key| {
            let next = index.len();
            *index.entry(key).or_insert(next)
        })
        .collect();
    (index, slot)
}

/// The tested rows' (q, d) slots and each (q, d)'s total weight over them.
struct DocumentSlots {
    slot: Vec<usize>,
    weight: Vec<f64>,
}

impl DocumentSlots {
    fn new(rows: &[Row], tested: &[usize], weight: &[f64]) -> Self {
        let (index, slot) = dense_slots(tested.iter().map(|&i| rows[i].qd));
        let mut total = vec![0f64; index.len()];
        for (&s, &i) in slot.iter().zip(tested) {
            total[s] += weight[i];
        }
        DocumentSlots { slot, weight: total }
    }

    /// g minus its weighted mean per (query, document) over the tested rows; returns the largest shift.
    fn project_out(&self, tested: &[usize], weight: &[f64], g: &mut [f64]) -> f64 {
        let mut weighted = vec![0f64; self.weight.len()];
        for (&s, &i) in self.slot.iter().zip(tested) {
            weighted[s] += weight[i] * g[i];
        }
        let mut largest = 0f64;
        for (&s, &i) in self.slot.iter().zip(tested) {
            let w = self.weight[s];
            let shift = if w > 0.0 { weighted[s] / w } else { 0.0 };
            g[i] -= shift;
            largest = largest.max(shift.abs());
        }
        largest
    }
}

/// The score vector U (one entry per position block) and its cluster-robust covariance (clusters =
/// (query, document), CR1 factor G/(G − 1)), row-major, with the number of clusters.
fn cluster_robust_score(rows: &[Row], chosen: &[usize], slot: &HashMap<u32, usize>, z: &[f64], g: &[f64], kdim: usize) -> (Vec<f64>, Vec<f64>, usize) {
    let mut u = vec![0f64; kdim];
    let mut cluster: HashMap<u32, Vec<f64>> = Default::default();
    for &i in chosen {
        let r = &rows[i];
        let Some(&j) = slot.get(&r.position) else { continue };
        let q = sigmoid(z[i]);
        let contribution = (r.clicks as f64 - r.impressions as f64 * q) * g[i];
        u[j] += contribution;
        cluster.entry(r.qd).or_insert_with(|| vec![0.0; kdim])[j] += contribution;
    }
    let clusters = cluster.len();
    let mut cov = vec![0f64; kdim * kdim];
    for v in cluster.values() {
        for a in 0..kdim {
            if v[a] == 0.0 {
                continue;
            }
            for b in 0..kdim {
                cov[a * kdim + b] += v[a] * v[b];
            }
        }
    }
    let factor = clusters as f64 / (clusters as f64 - 1.0).max(1.0);
    for c in &mut cov {
        *c *= factor;
    }
    (u, cov, clusters)
}

/// ẑ + δ_qd + α_k with δ (one per (query, document)) and α (one per position) the maximum-likelihood
/// levels on the `chosen` rows, by alternating Newton steps. A document with no clicks (or only
/// clicks) runs to a bound, where its rows have p̂(1 − p̂) ≈ 0 and so drop out of the test, as they
/// should: its clicks say nothing about its positions once its level is free.
fn refit_levels(rows: &[Row], logits: &[f32], chosen: &[usize]) -> Vec<f64> {
    const BOUND: f64 = 30.0;
    // Levels in vectors indexed by dense slots: the 80 passes below index instead of hashing.
    let (qd_index, qd_slot) = dense_slots(chosen.iter().map(|&i| rows[i].qd));
    let (position_index, position_slot) = dense_slots(chosen.iter().map(|&i| rows[i].position));
    let mut delta = vec![0f64; qd_index.len()];
    let mut alpha = vec![0f64; position_index.len()];
    for _ in 0..40 {
        for by_position in [false, true] {
            let mut steps = vec![(0f64, 0f64); if by_position { alpha.len() } else { delta.len() }];
            for (j, &i) in chosen.iter().enumerate() {
                let q = sigmoid(logits[i] as f64 + delta[qd_slot[j]] + alpha[position_slot[j]]);
                let s = &mut steps[if by_position { position_slot[j] } else { qd_slot[j] }];
                s.0 += rows[i].clicks as f64 - rows[i].impressions as f64 * q;
                s.1 += rows[i].impressions as f64 * q * (1.0 - q);
            }
            let levels = if by_position { &mut alpha } else { &mut delta };
            for (level, (gradient, curvature)) in levels.iter_mut().zip(steps) {
                *level = (*level + (gradient / curvature.max(1e-9)).clamp(-2.0, 2.0)).clamp(-BOUND, BOUND);
            }
        }
    }
    (0..rows.len())
        .map(|i| match (qd_index.get(&rows[i].qd), position_index.get(&rows[i].position)) {
            (Some(&d), Some(&a)) => logits[i] as f64 + delta[d] + alpha[a],
            _ => logits[i] as f64,
        })
        .collect()
}

/// First position of k's dyadic block: 1, 2, 4, 8, …
fn block_start(k: u32) -> u32 {
    1 << (31 - k.max(1).leading_zeros())
}

/// uᵀ A⁻¹ u for a symmetric positive semi-definite A (Cholesky; a direction A cannot see — zero
/// variance — contributes nothing).
fn quadratic_form_inverse(a: &[f64], u: &[f64], n: usize) -> f64 {
    let trace: f64 = (0..n).map(|i| a[i * n + i]).sum();
    let jitter = 1e-10 * trace / n as f64;
    let mut l = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = a[i * n + j] + if i == j { jitter } else { 0.0 };
            for k in 0..j {
                s -= l[i * n + k] * l[j * n + k];
            }
            if i == j {
                l[i * n + i] = if s > 0.0 { s.sqrt() } else { 0.0 };
            } else {
                l[i * n + j] = if l[j * n + j] > 0.0 { s / l[j * n + j] } else { 0.0 };
            }
        }
    }
    // Solve L y = u; T = |y|².
    let mut y = vec![0f64; n];
    let mut t = 0.0;
    for i in 0..n {
        let mut s = u[i];
        for k in 0..i {
            s -= l[i * n + k] * y[k];
        }
        y[i] = if l[i * n + i] > 0.0 { s / l[i * n + i] } else { 0.0 };
        t += y[i] * y[i];
    }
    t
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn positions_pool_in_dyadic_blocks() {
        let starts: Vec<u32> = (1..=9).map(block_start).collect();
        assert_eq!(starts, [1, 2, 2, 4, 4, 4, 4, 8, 8]);
    }

    /// The per-(q, d) projection by dense slots against a reference written here: each tested row
    /// minus the weighted mean of g over its (q, d)'s tested rows (a BTreeMap per key, computed in
    /// one pass), untested rows untouched, and the largest shift returned.
    pub fn the_document_projection_subtracts_each_documents_weighted_mean() {
        let qd = [7u32, 3, 7, 9, 3, 7, 5];
        let rows: Vec<Row> = qd.iter().map(|&qd| Row { doc: 0, qd, position: 1, impressions: 1, clicks: 0, propensity: 0.0 }).collect();
        let weight = [0.5, 2.0, 1.5, 0.25, 1.0, 3.0, 0.0];
        let g0 = [0.1, -0.4, 0.9, 0.3, 0.2, -0.6, 0.7];
        // Row 6 is the only row of its (q, d) and has weight 0; row 4 is not tested.
        let tested = [0usize, 1, 2, 3, 5, 6];
        let mut reference = g0;
        let mut sums: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
        for &i in &tested {
            let s = sums.entry(qd[i]).or_default();
            s.0 += weight[i];
            s.1 += weight[i] * g0[i];
        }
        let mut largest = 0f64;
        for &i in &tested {
            let (w, wg) = sums[&qd[i]];
            let mean = if w > 0.0 { wg / w } else { 0.0 };
            reference[i] -= mean;
            largest = largest.max(mean.abs());
        }
        let mut g = g0;
        let shift = DocumentSlots::new(&rows, &tested, &weight).project_out(&tested, &weight, &mut g);
        assert_eq!(g, reference);
        assert_eq!(shift, largest);
        assert_eq!(g[4], g0[4], "an untested row keeps its value");
        // (q, d) 3 has one tested row (1): it lands on 0 whatever its weight.
        assert_eq!(g[1], 0.0);
    }
}
