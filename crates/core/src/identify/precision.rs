//! How precisely the horizon determines θ, beyond whether a swap path exists: the position-based
//! model with a free relevance per (query, document), P(click) = σ(γ_qd + θ_k) — the model swaps
//! identify (Hager §4.3) — fitted to the lookback horizon's click counts by maximum likelihood, and
//! the standard errors of θ_k − θ_1 from its observed information with every γ_qd profiled out.
//!
//! With γ free, a (query, document) shown at one position only fits its clicks exactly and carries
//! no information about θ. One shown at several positions carries, between positions a and b,
//! w_a·w_b / W (w_k = n_k·p_k(1 − p_k), W = Σ_k w_k): the profile information is the Laplacian of
//! the swap graph with those weights. A graph held together by a handful of pairs, or by pairs
//! without clicks, is connected and still says little about θ; the standard errors say how little.

use std::collections::{BTreeMap, HashMap};

use datafusion::arrow::array::{Array as _, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, UInt32Type};
use serde::Serialize;

use crate::math::{invert, sigmoid};

/// z of a two-sided 95% normal interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// Clicks and impressions of one (query, document) at each position it was shown at (≤ K).
pub type Cells = Vec<(usize, f64, f64)>;

/// θ's precision from the swap pairs' information.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThetaPrecision {
    /// θ_k − θ_1 for k = 1..=K: the maximum-likelihood estimate of the per-document model.
    pub theta: Vec<f64>,
    /// Standard error of θ_k − θ_1 (0 for k = 1; infinite where no informative swap path reaches
    /// position 1).
    pub standard_error: Vec<f64>,
    /// Per position pair (a < b) linked by a (query, document) with information: the information
    /// Σ w_a·w_b / W, and the effective number of pairs carrying it, (Σ s)² / Σ s² over the pairs'
    /// shares s: a link resting on one pair counts 1 however many pairs touch it.
    pub edges: Vec<EdgeInformation>,
    /// (query, document) pairs shown at two positions or more (≤ K): the only ones that inform θ.
    pub swapped_pairs: usize,
    /// Pearson dispersion of the swapped pairs' clicks around the fit, Σ (c − n·p̂)² / (n·p̂(1 − p̂))
    /// over the residual degrees of freedom, floored at 1: clicks of one document vary more than a
    /// binomial when its users or sessions differ, and the standard errors are scaled by its root.
    pub dispersion: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EdgeInformation {
    /// The linked positions, a < b.
    pub a: u32,
    pub b: u32,
    pub information: f64,
    pub effective_pairs: f64,
}

impl ThetaPrecision {
    /// Width of the 95% interval of θ_k − θ_1 (infinite where the standard error is).
    pub fn interval_width(&self, k: usize) -> f64 {
        2.0 * Z95 * self.standard_error[k]
    }

    /// The widest interval over positions 2..=K, and its position.
    pub fn widest(&self) -> Option<(u32, f64)> {
        (1..self.standard_error.len()).map(|k| (k as u32 + 1, self.interval_width(k))).max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// (impressions, clicks) by position index, per (query, document).
type CellsByPair<'a> = HashMap<(&'a str, &'a str), BTreeMap<usize, (f64, f64)>>;

/// (query, document) → its cells at positions 1..=`max_position`, contexts merged, from the
/// cumulative propensity table (query_id, doc_id, position, impressions, clicks).
pub fn cells_of(propensity: &[RecordBatch], max_position: u32) -> Vec<Cells> {
    // The columns as Utf8 and Float64, held here so that the merge below keys on borrowed strings.
    let columns: Vec<_> = propensity
        .iter()
        .filter_map(|b| {
            let (q, d, k, n, c) = (
                b.column_by_name("query_id")?,
                b.column_by_name("doc_id")?,
                b.column_by_name("position")?,
                b.column_by_name("impressions")?,
                b.column_by_name("clicks")?,
            );
            Some((
                cast(q, &DataType::Utf8).ok()?,
                cast(d, &DataType::Utf8).ok()?,
                k.clone(),
                cast(n, &DataType::Float64).ok()?,
                cast(c, &DataType::Float64).ok()?,
            ))
        })
        .collect();
    let mut merged: CellsByPair = HashMap::new();
    for (q, d, k, n, c) in &columns {
        let (q, d, k, n, c) =
            (q.as_string::<i32>(), d.as_string::<i32>(), k.as_primitive::<UInt32Type>(), n.as_primitive::<Float64Type>(), c.as_primitive::<Float64Type>());
        for i in 0..q.len() {
            let position = k.value(i);
            if position == 0 || position > max_position || n.value(i) <= 0.0 {
                continue;
            }
            let cell = merged.entry((q.value(i), d.value(i))).or_default().entry(position as usize - 1).or_default();
            cell.0 += c.value(i);
            cell.1 += n.value(i);
        }
    }
    let mut out: Vec<((&str, &str), Cells)> = merged.into_iter().map(|(key, cells)| (key, cells.into_iter().map(|(k, (c, n))| (k, c, n)).collect())).collect();
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0)); // a fixed order: the fit's sums do not depend on hashing
    out.into_iter().map(|(_, cells)| cells).collect()
}

/// Fits σ(γ_qd + θ_k) to `pairs` (each a (query, document)'s cells; only those at two positions or
/// more inform θ, the rest are skipped) over positions 1..=`k`, and returns θ with its precision.
pub fn theta_precision(pairs: &[Cells], k: usize) -> ThetaPrecision {
    let swapped: Vec<&Cells> = pairs.iter().filter(|c| c.len() >= 2).collect();
    let (theta, gamma) = fit(&swapped, k);
    // Per pair and position: w = n·p(1 − p) at the fit.
    let weights: Vec<Vec<(usize, f64)>> = swapped
        .iter()
        .zip(&gamma)
        .map(|(cells, g)| {
            cells
                .iter()
                .map(|&(j, _, n)| {
                    let p = sigmoid(g + theta[j]);
                    (j, n * p * (1.0 - p))
                })
                .collect()
        })
        .collect();
    let mut information = vec![0.0; k * k];
    let mut shares: BTreeMap<(u32, u32), (f64, f64)> = BTreeMap::new();
    for w in &weights {
        let total: f64 = w.iter().map(|x| x.1).sum();
        if total <= 0.0 {
            continue;
        }
        for &(a, wa) in w {
            information[a * k + a] += wa;
            for &(b, wb) in w {
                information[a * k + b] -= wa * wb / total;
                if a < b {
                    let s = wa * wb / total;
                    let e = shares.entry((a as u32 + 1, b as u32 + 1)).or_default();
                    e.0 += s;
                    e.1 += s * s;
                }
            }
        }
    }
    let edges = shares
        .into_iter()
        .filter(|(_, (s, _))| *s > 1e-6) // below, a link whose pairs have no clicks: no information
        .map(|((a, b), (s, ss))| EdgeInformation { a, b, information: s, effective_pairs: s * s / ss })
        .collect::<Vec<_>>();
    let dispersion = pearson_dispersion(&swapped, &gamma, &theta);
    let standard_error = standard_errors(&information, k, &edges).into_iter().map(|se| se * dispersion.sqrt()).collect();
    ThetaPrecision { theta: theta.iter().map(|t| t - theta[0]).collect(), standard_error, edges, swapped_pairs: swapped.len(), dispersion }
}

/// Σ (c − n·p̂)² / (n·p̂(1 − p̂)) over the cells, divided by cells − pairs − (K − 1), at least 1.
fn pearson_dispersion(pairs: &[&Cells], gamma: &[f64], theta: &[f64]) -> f64 {
    let (mut pearson, mut cells) = (0.0, 0usize);
    for (cells_of_pair, g) in pairs.iter().zip(gamma) {
        for &(j, c, n) in cells_of_pair.iter() {
            let p = sigmoid(g + theta[j]);
            let variance = n * p * (1.0 - p);
            if variance > 1e-9 {
                pearson += (c - n * p).powi(2) / variance;
                cells += 1;
            }
        }
    }
    let dof = cells.saturating_sub(pairs.len() + theta.len() - 1);
    if dof == 0 {
        1.0
    } else {
        (pearson / dof as f64).max(1.0)
    }
}

/// Maximum likelihood: per iteration one Newton step on each γ at the current θ, then a Newton step
/// on θ_2..θ_K (θ_1 = 0) against the profile information, the γ's eliminated: the joint Newton step,
/// which converges quadratically where steps on γ alone and θ alone, alternating, converge linearly
/// and slowly (docs/benchmarks.md, "The monitor's θ-precision fit"). Where that information is
/// singular (a position no informative pair links to the others) the step falls back to each θ_k's
/// own curvature. A pair without clicks (or with only clicks) has its maximum at γ = ∓∞, where its
/// weights, and so its information, vanish: it is held at the bound and left out of the steps.
fn fit(pairs: &[&Cells], k: usize) -> (Vec<f64>, Vec<f64>) {
    const BOUND: f64 = 20.0;
    let mut theta = vec![0.0; k];
    let mut gamma = Vec::with_capacity(pairs.len());
    let mut free = Vec::with_capacity(pairs.len());
    for cells in pairs {
        let (c, n) = cells.iter().fold((0.0, 0.0), |(c, n), &(_, ci, ni)| (c + ci, n + ni));
        let bound = if c <= 0.0 {
            Some(-BOUND)
        } else if c >= n {
            Some(BOUND)
        } else {
            None
        };
        gamma.push(bound.unwrap_or(0.0));
        free.push(bound.is_none());
    }
    let mut cell_terms: Vec<(usize, f64, f64)> = Vec::with_capacity(k);
    for _ in 0..500 {
        let mut information = vec![0.0; k * k];
        let (mut profile_grad, mut grad, mut hess) = (vec![0.0; k], vec![0.0; k], vec![0.0; k]);
        for ((g, cells), _) in gamma.iter_mut().zip(pairs).zip(&free).filter(|(_, free)| **free) {
            let (mut r_sum, mut w_sum) = (0.0, 0.0);
            for &(j, c, n) in cells.iter() {
                let p = sigmoid(*g + theta[j]);
                r_sum += c - n * p;
                w_sum += n * p * (1.0 - p);
            }
            *g = (*g + r_sum / w_sum.max(1e-12)).clamp(-BOUND, BOUND);
            // Residuals r and weights w at the new γ: the θ step's gradient and information.
            cell_terms.clear();
            let (mut r_sum, mut w_sum) = (0.0, 0.0);
            for &(j, c, n) in cells.iter() {
                let p = sigmoid(*g + theta[j]);
                let (r, w) = (c - n * p, n * p * (1.0 - p));
                cell_terms.push((j, r, w));
                grad[j] += r;
                hess[j] += w;
                r_sum += r;
                w_sum += w;
            }
            for &(a, r, wa) in &cell_terms {
                profile_grad[a] += r;
                information[a * k + a] += wa;
                if w_sum > 0.0 {
                    profile_grad[a] -= wa * r_sum / w_sum;
                    for &(b, _, wb) in &cell_terms {
                        information[a * k + b] -= wa * wb / w_sum;
                    }
                }
            }
        }
        let active: Vec<usize> = (1..k).filter(|&j| hess[j] > 1e-12).collect();
        let m = active.len();
        let mut sub: Vec<f64> = active.iter().flat_map(|&r| active.iter().map(move |&c| (r, c))).map(|(r, c)| information[r * k + c]).collect();
        let steps: Vec<f64> = match invert(&mut sub, m) {
            Some(inverse) => (0..m).map(|i| (0..m).map(|l| inverse[i * m + l] * profile_grad[active[l]]).sum()).collect(),
            None => active.iter().map(|&j| grad[j] / hess[j]).collect(),
        };
        let mut largest = 0f64;
        for (&j, step) in active.iter().zip(steps) {
            let step = step.clamp(-1.0, 1.0);
            theta[j] = (theta[j] + step).clamp(-BOUND, BOUND);
            largest = largest.max(step.abs());
        }
        if largest < 1e-9 {
            break;
        }
    }
    (theta, gamma)
}

/// Standard errors of θ_k − θ_1 from the profile information (θ_1 fixed): the inverse of the
/// information over the positions an informative path links to position 1; infinite elsewhere.
fn standard_errors(information: &[f64], k: usize, edges: &[EdgeInformation]) -> Vec<f64> {
    let mut linked = vec![false; k];
    linked[0] = true;
    loop {
        let mut grew = false;
        for e in edges {
            let (a, b) = (e.a as usize - 1, e.b as usize - 1);
            if linked[a] != linked[b] {
                linked[a] = true;
                linked[b] = true;
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    let free: Vec<usize> = (1..k).filter(|&j| linked[j]).collect();
    let m = free.len();
    let mut a: Vec<f64> = free.iter().flat_map(|&r| free.iter().map(move |&c| information[r * k + c])).collect();
    let mut out = vec![f64::INFINITY; k];
    out[0] = 0.0;
    if let Some(inverse) = invert(&mut a, m) {
        for (i, &j) in free.iter().enumerate() {
            out[j] = inverse[i * m + i].max(0.0).sqrt();
        }
    }
    out
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A log of `queries` queries with `docs` documents each, every document shown `shows` times at
    /// positions drawn uniformly from 1..=k, clicked with σ(γ + θ_k).
    fn simulate(theta: &[f64], queries: usize, docs: usize, shows: usize, rng: &mut impl Rng) -> Vec<Cells> {
        let k = theta.len();
        let mut out = Vec::new();
        for _ in 0..queries * docs {
            let gamma: f64 = rng.random_range(-2.0..1.0);
            let mut cells: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
            for _ in 0..shows {
                let j = rng.random_range(0..k);
                let e = cells.entry(j).or_default();
                e.1 += 1.0;
                if rng.random::<f64>() < sigmoid(gamma + theta[j]) {
                    e.0 += 1.0;
                }
            }
            out.push(cells.into_iter().map(|(j, (c, n))| (j, c, n)).collect());
        }
        out
    }

    /// The standard errors are the spread of the estimate: over 200 simulated logs the estimates'
    /// standard deviation per position matches the mean reported standard error within 20% (the
    /// sd of an sd estimated from 200 draws is ~5%), and the estimates centre on the truth.
    pub fn standard_errors_match_the_spread_of_the_estimates_over_simulated_logs() {
        let theta = [0.0, -0.5, -0.9, -1.2, -1.4];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let runs: Vec<ThetaPrecision> = (0..200).map(|_| theta_precision(&simulate(&theta, 20, 10, 60, &mut rng), theta.len())).collect();
        #[allow(clippy::needless_range_loop, reason = "j indexes the truth and every run's estimates in step")]
        for j in 1..theta.len() {
            let estimates: Vec<f64> = runs.iter().map(|r| r.theta[j]).collect();
            let mean = estimates.iter().sum::<f64>() / estimates.len() as f64;
            let sd = (estimates.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (estimates.len() - 1) as f64).sqrt();
            let se = runs.iter().map(|r| r.standard_error[j]).sum::<f64>() / runs.len() as f64;
            eprintln!(
                "θ_{}: truth {:+.3}, mean estimate {mean:+.4}, spread {sd:.4}, mean se {se:.4} (ratio {:.3}; dispersion {:.3})",
                j + 1,
                theta[j],
                se / sd,
                runs[0].dispersion
            );
            assert!((se / sd - 1.0).abs() < 0.2, "θ_{}: reported se {se:.4}, spread of the estimates {sd:.4}", j + 1);
            assert!((mean - theta[j]).abs() < 3.0 * sd / (runs.len() as f64).sqrt() + 0.02, "θ_{}: mean estimate {mean:.4}, truth {}", j + 1, theta[j]);
        }
    }

    /// One pair per link, as many pairs without clicks as one likes: connected, and the standard
    /// errors say it determines little; no swap at all leaves a position at an infinite error.
    pub fn a_graph_held_by_a_few_pairs_is_imprecise_and_a_cut_position_is_unknown() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let theta = [0.0, -0.5, -0.9];
        let dense = theta_precision(&simulate(&theta, 50, 10, 20, &mut rng), 3);
        // Positions 1–2 and 2–3 linked by one document each, with a few clicks.
        let sparse = vec![vec![(0, 2.0, 10.0), (1, 1.0, 10.0)], vec![(1, 1.0, 8.0), (2, 1.0, 12.0)], vec![(0, 0.0, 5.0), (2, 0.0, 5.0)]];
        let thin = theta_precision(&sparse, 3);
        assert!(dense.widest().unwrap().1 < 0.5, "{:?}", dense.standard_error);
        assert!(thin.widest().unwrap().1 > 2.0, "{:?}", thin.standard_error);
        let link = |a: u32, b: u32| thin.edges.iter().find(|e| (e.a, e.b) == (a, b));
        assert_eq!(link(1, 2).unwrap().effective_pairs, 1.0);
        // The pair without clicks carries no information: no 1–3 link.
        assert!(link(1, 3).is_none());
        let cut = theta_precision(&[vec![(0, 3.0, 10.0), (1, 2.0, 10.0)], vec![(2, 1.0, 10.0)]], 3);
        assert!(cut.standard_error[2].is_infinite() && cut.standard_error[1].is_finite());
    }

    /// With two positions the one link carries all the information about θ_2 − θ_1: the link's
    /// information (summed per pair, w_a·w_b / (w_a + w_b)) equals the inverse of θ_2's variance,
    /// which the profile information matrix gives by another sum (its standard error squared,
    /// divided by the dispersion it was scaled by). Regression test for a mutant cargo-mutants found
    /// surviving (the per-pair share multiplied by the pair's total instead of divided).
    pub fn with_two_positions_the_link_information_is_the_inverse_variance_of_theta_2() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let pairs = simulate(&[0.0, -0.7], 30, 5, 12, &mut rng);
        let p = theta_precision(&pairs, 2);
        assert_eq!(p.edges.len(), 1, "{:?}", p.edges);
        let (link, variance) = (p.edges[0].information, p.standard_error[1].powi(2) / p.dispersion);
        assert!((link * variance - 1.0).abs() < 1e-9, "link information {link}, 1 / variance {}", 1.0 / variance);
        assert!(p.edges[0].effective_pairs >= 1.0 && p.edges[0].effective_pairs <= p.swapped_pairs as f64, "{:?}", p.edges[0]);
    }
}
