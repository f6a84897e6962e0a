//! The embedding tower's relevance re-estimated around a prior from the logging policy's order:
//! γ_{q,d} ~ N(α_q + ρ_b, 1/λ), where b is the pair's mean logged position (in half positions) and
//! α_q ~ N(0, 1) the query's effect.
//!
//! Why: a free γ per pair, started at 0 and shrunk toward 0 by early stopping, ignores what the
//! production ranker knew. On a log where most shown documents are never clicked, their γ order them
//! by how often they were shown without a click, and the debiased model ranks below naive
//! click-through and the logged order against editors' labels (`results/clara2`). Naive
//! click-through keeps the logging policy's knowledge
//! through position; a model that removes position removes it too (Hager §8's confounding, seen
//! from the ranking side). The pair's mean position under the logging policy is a property of the
//! document for its query, not of one impression, so a prior on it leaves θ's identification (the
//! swaps; `refit.rs`) untouched: rare pairs take the logging policy's judgement, and clicks move
//! frequent pairs away from it.
//!
//! Why the query effect: queries differ in how good their shown documents are (one has five relevant
//! results, another none), so one ρ per bucket across queries leaves that spread in δ, and the
//! validation clicks then choose a weak λ under which one click at depth lifts a rare pair above
//! the query's top ones. α_q takes the query's level; ranking within a query does not depend on it.
//!
//! With θ as the refit left it (ℓ = θ_k + b(z) + α_q + ρ_b + δ_{q,d}, γ = α_q + ρ_b + δ), α, ρ and
//! δ maximise the weighted click log-likelihood Σ w·[c·ℓ − n·log(1 + e^ℓ)] − λ/2·Σ δ² − 1/2·Σ α²,
//! a concave problem solved by alternating one-dimensional Newton steps (δ per pair, α per query,
//! ρ per bucket), ρ constrained not to rise with the mean logged position (`non_increasing`). ρ is
//! estimated, not assumed: under a logging policy that knows nothing, or one that shows worse
//! documents first, it comes out flat and the prior only shrinks. The strength λ is chosen among
//! `[train] logged_order_prior` by the click log-likelihood of the validation sessions (the ones
//! early stopping watches), the strongest within one standard error of the best; the editors'
//! labels are never read.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::artefact::Trained;
use super::chunks::ExampleChunks;
use super::config::TrainConfig;
use super::data::{split_of, Examples, Split};
use super::refit::{newton_one, RowTerms};
use super::weights::weights_of;
use ultr_core::math::sigmoid;

/// What the prior fit chose and found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedOrderPrior {
    /// The strength λ (prior precision of γ around ρ) the validation clicks chose: the strongest
    /// within one standard error of the most likely (`one_standard_error`).
    pub strength: f64,
    /// The strength with the best validation log-likelihood.
    #[serde(default)]
    pub most_likely: f64,
    /// Each strength tried and the validation sessions' click log-likelihood per impression.
    pub candidates: Vec<(f64, f64)>,
    /// ρ per bucket: (mean logged position, ρ), buckets with pairs only.
    pub prior: Vec<(f64, f64)>,
    /// Pairs whose γ was re-estimated.
    pub pairs: usize,
    /// The most alternating rounds any strength took.
    pub rounds: usize,
    /// Posterior standard deviations subtracted from each pair's γ (`[train]
    /// logged_order_prior_lower_bound`; 0 in checkpoints written before it).
    #[serde(default)]
    pub lower_bound: f64,
}

/// Buckets per position of the mean logged position.
const BUCKETS_PER_POSITION: f64 = 2.0;
/// A weak ridge on ρ: keeps a bucket whose pairs were never clicked finite (and far below the rest).
const BUCKET_RIDGE: f64 = 1e-2;
/// The query effects' prior precision, α_q ~ N(0, 1): the unit scale on the logit that every
/// parameter the data may not pin gets (`docs/models.md`, "Sparse logs").
const QUERY_PRECISION: f64 = 1.0;
const MAX_ROUNDS: usize = 2_000;
/// The largest move of ρ in one round.
const MAX_STEP: f64 = 1.0;
const ROUND_TOLERANCE: f64 = 1e-5;

/// Re-estimates the embedding tower's γ around the logged-order prior (module doc). None when the
/// prior is off (`[train] logged_order_prior = []`), the tower is not the embedding, or the model's
/// relevance is not a γ table in an additive logit.
pub fn fit_logged_order_prior(trained: &mut Trained, data: &dyn ExampleChunks, cfg: &TrainConfig) -> anyhow::Result<Option<LoggedOrderPrior>> {
    if cfg.logged_order_prior.is_empty() || !trained.meta.architecture.tower.pair_embedding() || trained.meta.architecture.model.input_shape().lists() {
        return Ok(None);
    }
    let Some(mut gamma) = trained.model.pair_relevance() else { return Ok(None) };
    let device = cfg.backend.device()?;
    let mut rows = Rows::default();
    match data.in_memory() {
        Some(ex) => rows.add(trained, ex, cfg, &device),
        None => {
            for split in [Split::Training, Split::Validation] {
                for i in 0..data.chunk_count(split) {
                    rows.add(trained, &data.load_chunk(split, i)?, cfg, &device);
                }
            }
        }
    }
    let problem = Problem::new(&rows, trained.meta.architecture.max_positions);
    if problem.pairs.is_empty() {
        return Ok(None);
    }
    let (mut candidates, mut rounds) = (Vec::new(), 0);
    let (mut solutions, mut per_row) = (Vec::new(), Vec::new());
    let mut solution = Solution::zero(&problem);
    for &strength in &cfg.logged_order_prior {
        // Warm-started from the previous strength's solution: the problem moves little between them.
        rounds = rounds.max(problem.solve(&rows.training, strength, &mut solution));
        // Judged as shipped: γ at `logged_order_prior_lower_bound` standard deviations below the mean.
        let shipped = problem.shipped(&rows.training, &solution, strength, cfg.logged_order_prior_lower_bound);
        candidates.push((strength, problem.log_likelihood(&rows.validation, &shipped)));
        per_row.push(problem.row_log_likelihoods(&rows.validation, &shipped));
        solutions.push(solution.clone());
    }
    let (chosen_index, most_likely) = one_standard_error(&cfg.logged_order_prior, &per_row);
    let (strength, chosen) = (cfg.logged_order_prior[chosen_index], solutions.swap_remove(chosen_index));
    let shipped = problem.shipped(&rows.training, &chosen, strength, cfg.logged_order_prior_lower_bound);
    for (&pair, &g) in problem.pairs.iter().zip(&shipped) {
        if let Some(slot) = gamma.get_mut(pair as usize) {
            *slot = g as f32;
        }
    }
    trained.model.set_pair_relevance(&gamma);
    let prior =
        chosen.rho.iter().enumerate().filter(|(b, _)| !problem.bucket_rows[*b].is_empty()).map(|(b, r)| (1.0 + b as f64 / BUCKETS_PER_POSITION, *r)).collect();
    let lower_bound = cfg.logged_order_prior_lower_bound;
    Ok(Some(LoggedOrderPrior { strength, most_likely, candidates, prior, pairs: problem.pairs.len(), rounds, lower_bound }))
}

/// The one-standard-error rule (Hastie, Tibshirani and Friedman, *The Elements of Statistical
/// Learning*, §7.10): the strongest prior whose validation log-likelihood is within one standard
/// error of the best one's, the error that of the paired per-row difference summed over the
/// validation rows. Returns its index and the strength with the best log-likelihood. Chosen for
/// ranking: the log-likelihood is dominated by frequent pairs, which any strength fits, and rewards
/// a weak prior that lets one click at a deep position (θ ≈ −5) lift a rare pair above every pair
/// shown on top; strengths it cannot tell apart from the best rank rare pairs by the logging
/// policy's order instead.
pub(crate) fn one_standard_error(strengths: &[f64], per_row: &[Vec<f64>]) -> (usize, f64) {
    let total = |r: &[f64]| r.iter().sum::<f64>();
    let best = (0..per_row.len()).max_by(|&a, &b| total(&per_row[a]).total_cmp(&total(&per_row[b]))).expect("at least one strength");
    let within = |j: usize| {
        let d: Vec<f64> = per_row[best].iter().zip(&per_row[j]).map(|(b, c)| b - c).collect();
        let n = d.len() as f64;
        if n < 2.0 {
            return j == best;
        }
        let mean = d.iter().sum::<f64>() / n;
        let se = (n * d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        total(&d) <= se
    };
    let chosen = (0..per_row.len()).filter(|&j| within(j)).max_by(|&a, &b| strengths[a].total_cmp(&strengths[b])).unwrap_or(best);
    (chosen, strengths[best])
}

/// The training and validation rows, each with its logit less γ (θ_k + b(z)), and the impressions
/// of every pair at every position (for its mean logged position).
#[derive(Default)]
struct Rows {
    training: Vec<RowTerms>,
    validation: Vec<RowTerms>,
    shown: HashMap<u32, (f64, f64)>,
    /// Each pair's query, as an index into `queries` (a pair missing here joins query 0).
    query_of: HashMap<u32, u32>,
    queries: HashMap<String, u32>,
}

impl Rows {
    fn add(&mut self, trained: &Trained, ex: &Examples, cfg: &TrainConfig, device: &burn::tensor::Device) {
        let logits = trained.logits(ex, device);
        let relevance = trained.relevance_of_rows(ex, device);
        let (weights, _) = weights_of(&ex.rows, &cfg.applied_ips());
        let qd_map = trained.qd_map(ex);
        let positions = trained.meta.architecture.max_positions;
        for span in &ex.sessions {
            let out = match split_of(span, cfg.holdout()) {
                Split::Training => &mut self.training,
                Split::Validation => &mut self.validation,
                _ => continue,
            };
            for i in span.start..span.start + span.len {
                let r = &ex.rows[i];
                let k = r.position as usize;
                let pair = qd_map.get(r.qd as usize).copied().unwrap_or(0);
                if k == 0 || k > positions || pair == 0 {
                    continue;
                }
                if !self.query_of.contains_key(&pair) {
                    let next = self.queries.len() as u32;
                    let query = *self.queries.entry(ex.qd_keys[r.qd as usize].0.clone()).or_insert(next);
                    self.query_of.insert(pair, query);
                }
                let shown = self.shown.entry(pair).or_insert((0.0, 0.0));
                shown.0 += r.impressions as f64;
                shown.1 += r.impressions as f64 * k as f64;
                let w = weights[i] as f64;
                let logit = (logits[i] - relevance[i]) as f64;
                out.push(RowTerms { position: k - 1, pair, logit, weighted_impressions: w * r.impressions as f64, weighted_clicks: w * r.clicks as f64 });
            }
        }
    }
}

/// The pairs, their buckets, and which training rows belong to each.
struct Problem {
    /// Vocabulary index of each pair.
    pairs: Vec<u32>,
    index: HashMap<u32, usize>,
    bucket_of: Vec<usize>,
    query_of: Vec<usize>,
    /// Training rows of each pair, and of each bucket; the pairs of each query.
    pair_rows: Vec<Vec<usize>>,
    bucket_rows: Vec<Vec<usize>>,
    query_pairs: Vec<Vec<usize>>,
}

#[derive(Clone)]
struct Solution {
    delta: Vec<f64>,
    rho: Vec<f64>,
    /// The query effects α_q.
    alpha: Vec<f64>,
}

impl Solution {
    fn zero(problem: &Problem) -> Solution {
        Solution { delta: vec![0.0; problem.pairs.len()], rho: vec![0.0; problem.bucket_rows.len()], alpha: vec![0.0; problem.query_pairs.len()] }
    }

    /// γ of pair `p` less its δ: its query's effect plus its bucket's ρ.
    fn centre(&self, problem: &Problem, p: usize) -> f64 {
        self.alpha[problem.query_of[p]] + self.rho[problem.bucket_of[p]]
    }
}

impl Problem {
    /// Pair `p`'s γ at the solution less `sds` posterior standard deviations: the standard deviation
    /// from the penalised log-likelihood's curvature in δ_p, 1/√(λ + Σ w·n·p(1−p)) over its rows.
    fn lower_bound(&self, terms: &[RowTerms], s: &Solution, strength: f64, p: usize, sds: f64) -> f64 {
        let mean = s.centre(self, p) + s.delta[p];
        if sds == 0.0 {
            return mean;
        }
        let information: f64 = self.pair_rows[p]
            .iter()
            .map(|&i| {
                let q = sigmoid(terms[i].logit + mean);
                terms[i].weighted_impressions * q * (1.0 - q)
            })
            .sum();
        mean - sds / (strength + information).sqrt()
    }

    fn new(rows: &Rows, positions: usize) -> Self {
        let mut pairs: Vec<u32> = rows.shown.keys().copied().collect();
        pairs.sort_unstable();
        let index: HashMap<u32, usize> = pairs.iter().enumerate().map(|(p, v)| (*v, p)).collect();
        let buckets = 1 + ((positions.max(1) - 1) as f64 * BUCKETS_PER_POSITION).round() as usize;
        let bucket_of: Vec<usize> = pairs
            .iter()
            .map(|v| {
                let (n, sum) = rows.shown[v];
                (((sum / n - 1.0) * BUCKETS_PER_POSITION).round().max(0.0) as usize).min(buckets - 1)
            })
            .collect();
        let query_of: Vec<usize> = pairs.iter().map(|v| rows.query_of.get(v).copied().unwrap_or(0) as usize).collect();
        let mut query_pairs = vec![Vec::new(); query_of.iter().max().map_or(1, |m| m + 1)];
        for (p, &q) in query_of.iter().enumerate() {
            query_pairs[q].push(p);
        }
        let mut pair_rows = vec![Vec::new(); pairs.len()];
        let mut bucket_rows = vec![Vec::new(); buckets];
        for (i, t) in rows.training.iter().enumerate() {
            let p = index[&t.pair];
            pair_rows[p].push(i);
            bucket_rows[bucket_of[p]].push(i);
        }
        Problem { pairs, index, bucket_of, query_of, pair_rows, bucket_rows, query_pairs }
    }

    /// The maximum of the penalised likelihood at `strength`, from and into `s`; returns the rounds
    /// taken. Each round solves every pair's δ given its bucket's ρ (Newton), then takes one Newton
    /// step in each ρ_b of the likelihood profiled over its pairs' δ: its score is λ·Σ δ_p and its
    /// information λ·Σ h_p/(h_p + λ) (h_p the pair's Fisher information). Plain alternation stalls
    /// where pairs are well measured (their δ absorb every move of ρ); the profiled step does not.
    fn solve(&self, terms: &[RowTerms], strength: f64, s: &mut Solution) -> usize {
        let buckets = self.bucket_rows.len();
        let mut information = vec![0.0; self.pairs.len()];
        for round in 1..=MAX_ROUNDS {
            let mut moved = 0f64;
            for (p, rows) in self.pair_rows.iter().enumerate() {
                let centre = s.centre(self, p);
                let next = newton_one(terms, rows, |_| centre, s.delta[p], strength).0;
                moved = moved.max((next - s.delta[p]).abs());
                s.delta[p] = next;
                information[p] = rows
                    .iter()
                    .map(|&i| {
                        let q = sigmoid(terms[i].logit + centre + next);
                        terms[i].weighted_impressions * q * (1.0 - q)
                    })
                    .sum();
            }
            // One profiled Newton step in each query's effect, as for ρ below, with its own prior.
            for (q, pairs) in self.query_pairs.iter().enumerate() {
                let score = pairs.iter().map(|&p| strength * s.delta[p]).sum::<f64>() - QUERY_PRECISION * s.alpha[q];
                let info = pairs.iter().map(|&p| strength * information[p] / (information[p] + strength)).sum::<f64>() + QUERY_PRECISION;
                let step = (score / info).clamp(-MAX_STEP, MAX_STEP);
                s.alpha[q] += step;
                moved = moved.max(step.abs());
                for &p in pairs {
                    s.delta[p] -= step * information[p] / (information[p] + strength);
                }
            }
            let (mut score, mut info) = (vec![0.0; buckets], vec![0.0; buckets]);
            for p in 0..self.pairs.len() {
                score[self.bucket_of[p]] += strength * s.delta[p];
                info[self.bucket_of[p]] += strength * information[p] / (information[p] + strength);
            }
            let mut step = vec![0.0; buckets];
            let informed: Vec<usize> = (0..buckets).filter(|b| info[*b] > 0.0).collect();
            // Newton proposals, projected onto the constraint, then damped (a damping before the
            // projection would stop where the damped steps average to 0, not the scores).
            let proposed: Vec<f64> = informed.iter().map(|&b| s.rho[b] + (score[b] - BUCKET_RIDGE * s.rho[b]) / (info[b] + BUCKET_RIDGE)).collect();
            let weights: Vec<f64> = informed.iter().map(|&b| info[b] + BUCKET_RIDGE).collect();
            for (&b, next) in informed.iter().zip(non_increasing(&proposed, &weights)) {
                step[b] = (next - s.rho[b]).clamp(-MAX_STEP, MAX_STEP);
                s.rho[b] += step[b];
                moved = moved.max(step[b].abs());
            }
            // Each pair's δ follows its bucket's move as its own Newton step would.
            for p in 0..self.pairs.len() {
                s.delta[p] -= step[self.bucket_of[p]] * information[p] / (information[p] + strength);
            }
            // Raising every α by x and lowering every ρ by x leaves each γ as it was: only the two
            // priors tell them apart, and alternating steps crawl along that line. One exact step
            // along it (the minimum of the two penalties; a common shift keeps ρ's order).
            let informed_rho: f64 = informed.iter().map(|&b| s.rho[b]).sum();
            let level = (BUCKET_RIDGE * informed_rho - QUERY_PRECISION * s.alpha.iter().sum::<f64>())
                / (QUERY_PRECISION * s.alpha.len() as f64 + BUCKET_RIDGE * informed.len() as f64);
            s.alpha.iter_mut().for_each(|a| *a += level);
            informed.iter().for_each(|&b| s.rho[b] -= level);
            moved = moved.max(level.abs());
            if moved < ROUND_TOLERANCE {
                self.fill_empty_buckets(&info, s);
                return round;
            }
        }
        self.fill_empty_buckets(&vec![1.0; buckets], s);
        MAX_ROUNDS
    }

    /// A bucket without training information (its pairs only in validation sessions) takes the ρ
    /// of the nearest bucket that has some, not 0 (which would rank its pairs above every other).
    fn fill_empty_buckets(&self, info: &[f64], s: &mut Solution) {
        let informed: Vec<usize> = (0..info.len()).filter(|b| info[*b] > 0.0).collect();
        for b in (0..info.len()).filter(|b| info[*b] <= 0.0) {
            if let Some(near) = informed.iter().min_by_key(|i| i.abs_diff(b)) {
                s.rho[b] = s.rho[*near];
            }
        }
    }

    /// Every pair's γ as shipped (`lower_bound`), in `pairs` order.
    fn shipped(&self, terms: &[RowTerms], s: &Solution, strength: f64, sds: f64) -> Vec<f64> {
        (0..self.pairs.len()).map(|p| self.lower_bound(terms, s, strength, p, sds)).collect()
    }

    /// Σ w·[c·ℓ − n·log(1 + e^ℓ)] ÷ Σ w·n over `terms`, with each pair's γ from `gamma`.
    fn log_likelihood(&self, terms: &[RowTerms], gamma: &[f64]) -> f64 {
        let weight: f64 = terms.iter().map(|t| t.weighted_impressions).sum();
        if weight > 0.0 {
            self.row_log_likelihoods(terms, gamma).iter().sum::<f64>() / weight
        } else {
            0.0
        }
    }

    /// Each row's w·[c·ℓ − n·log(1 + e^ℓ)].
    fn row_log_likelihoods(&self, terms: &[RowTerms], gamma: &[f64]) -> Vec<f64> {
        terms
            .iter()
            .map(|t| {
                let l = t.logit + gamma[self.index[&t.pair]];
                t.weighted_clicks * l - t.weighted_impressions * softplus(l)
            })
            .collect()
    }
}

/// The weighted least-squares projection of `values` onto non-increasing sequences (pool adjacent
/// violators): ρ by mean logged position may not rise with depth, since the prior encodes the
/// logging policy's order, better pairs higher. Without it ρ compensated an over-steep θ at deep
/// positions (rising with depth on a sparse simulated log, `results/regimes`) and ranked rarely
/// clicked deep pairs above the top ones.
fn non_increasing(values: &[f64], weights: &[f64]) -> Vec<f64> {
    // Blocks of (mean, weight, length), merged while a block's mean exceeds its predecessor's.
    let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(values.len());
    for (&v, &w) in values.iter().zip(weights) {
        blocks.push((v, w.max(f64::MIN_POSITIVE), 1));
        while blocks.len() > 1 && blocks[blocks.len() - 1].0 > blocks[blocks.len() - 2].0 {
            let (m2, w2, n2) = blocks.pop().expect("two blocks");
            let (m1, w1, n1) = blocks.pop().expect("two blocks");
            blocks.push(((m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2));
        }
    }
    blocks.into_iter().flat_map(|(m, _, n)| std::iter::repeat_n(m, n)).collect()
}

/// log(1 + e^x), without overflow.
fn softplus(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    /// 400 queries of 5 documents with relevance γ falling by document rank; the logging policy
    /// shows them in the truth's order (or its reverse), one document per query also one position
    /// lower. The document at position 1 is shown 60 times, the rest 3 times each, with Bernoulli
    /// clicks drawn from `seed`: most rare documents are never clicked, the regime where a bare γ
    /// ranks by impressions. Even queries' γ are `query_level` higher, odd ones' as much lower (one
    /// query with many good documents, one with none). Returns the rows and each pair's true γ.
    fn log(reverse: bool, seed: u64, query_level: f64) -> (Rows, HashMap<u32, f64>) {
        let theta = [0.0, -0.6, -1.0, -1.3, -1.5];
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut uniform = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut rows = Rows::default();
        let mut truth = HashMap::new();
        for q in 0..400u32 {
            for d in 0..5u32 {
                let pair = 1 + q * 5 + d;
                rows.query_of.insert(pair, q);
                let level = if q % 2 == 0 { query_level } else { -query_level };
                let gamma = 0.5 - 0.6 * d as f64 + 0.01 * (q % 7) as f64 + level;
                truth.insert(pair, gamma);
                let shown_at = if reverse { 4 - d as usize } else { d as usize };
                let swapped = if q % 5 == d % 5 { (shown_at + 1) % 5 } else { shown_at };
                let n = if shown_at == 0 { 60.0 } else { 3.0 };
                for (k, split) in [(shown_at, Split::Training), (swapped, Split::Training), (shown_at, Split::Validation)] {
                    let p = sigmoid(theta[k] + gamma - 1.0);
                    let c = (0..n as usize).filter(|_| uniform() < p).count() as f64;
                    let terms = RowTerms { position: k, pair, logit: theta[k] - 1.0, weighted_impressions: n, weighted_clicks: c };
                    let shown = rows.shown.entry(pair).or_insert((0.0, 0.0));
                    shown.0 += n;
                    shown.1 += n * (k + 1) as f64;
                    match split {
                        Split::Training => rows.training.push(terms),
                        _ => rows.validation.push(terms),
                    }
                }
            }
        }
        (rows, truth)
    }

    /// Share of each query's document pairs that `score` orders as the truth does (ties count half).
    fn pairwise_accuracy(problem: &Problem, s: &Solution, truth: &HashMap<u32, f64>) -> f64 {
        let score = |pair: u32| {
            let p = problem.index[&pair];
            s.centre(problem, p) + s.delta[p]
        };
        let (mut right, mut total) = (0.0, 0.0);
        for q in 0..400u32 {
            for a in 0..5 {
                for b in a + 1..5 {
                    let (pa, pb) = (1 + q * 5 + a, 1 + q * 5 + b);
                    let (sa, sb) = (score(pa), score(pb));
                    total += 1.0;
                    right += if sa == sb {
                        0.5
                    } else if (sa > sb) == (truth[&pa] > truth[&pb]) {
                        1.0
                    } else {
                        0.0
                    };
                }
            }
        }
        right / total
    }

    fn solved(rows: &Rows, positions: usize, strength: f64) -> (Problem, Solution) {
        let problem = Problem::new(rows, positions);
        let mut s = Solution::zero(&problem);
        let rounds = problem.solve(&rows.training, strength, &mut s);
        assert!(rounds < MAX_ROUNDS, "did not converge in {rounds} rounds");
        (problem, s)
    }

    /// ρ is estimated from the clicks, not assumed: it falls with the mean logged position under a
    /// policy that shows the better documents first, and comes out flat (one pooled value, the
    /// constraint that ρ may not rise with depth) under one that shows them last. Shown first, γ
    /// around the prior orders the documents better than γ shrunk toward one constant (a single
    /// bucket: what `[train] logged_order_prior = []` amounts to for rare pairs) by > 0.2; shown
    /// last, the flat prior gives every γ that single bucket gives (within 1e-3). Over three click
    /// draws; the margins (ρ apart by > 1 where the truth is 2.4 apart, accuracy ahead by > 0.2)
    /// are a fraction of what each draw shows.
    pub fn the_prior_is_estimated_from_the_clicks_and_orders_rare_documents_by_it() {
        for (reverse, seed) in [false, true].into_iter().flat_map(|r| [1, 2, 3].map(|s| (r, s))) {
            let (rows, truth) = log(reverse, seed, 0.0);
            let (problem, with_prior) = solved(&rows, 5, 1.0);
            let (flat_problem, without) = solved(&rows, 1, 1.0);
            let populated: Vec<f64> = (0..problem.bucket_rows.len()).filter(|b| !problem.bucket_rows[*b].is_empty()).map(|b| with_prior.rho[b]).collect();
            let (first, last) = (populated[0], *populated.last().unwrap());
            let (a, b) = (pairwise_accuracy(&problem, &with_prior, &truth), pairwise_accuracy(&flat_problem, &without, &truth));
            eprintln!("reverse = {reverse}, seed {seed}: ρ {populated:.2?}; pairwise accuracy {a:.3} with the prior, {b:.3} without");
            if reverse {
                assert!(last == first, "reversed policy: ρ {populated:?} should come out flat");
                let gap = problem.pairs.iter().enumerate().map(|(p, v)| {
                    let q = flat_problem.index[v];
                    ((with_prior.centre(&problem, p) + with_prior.delta[p]) - (without.centre(&flat_problem, q) + without.delta[q])).abs()
                });
                let gap = gap.fold(0.0, f64::max);
                assert!(gap < 1e-3, "reversed, seed {seed}: γ under the flat prior differs from one bucket's by {gap}");
            } else {
                assert!(first > last + 1.0, "ρ {populated:?} should fall with position");
                assert!(a > b + 0.2 && a > 0.85, "seed {seed}: pairwise accuracy {a:.3} with the prior, {b:.3} without");
            }
        }
    }

    /// Queries differ in how good their documents are; the query effects α_q take that up, so the
    /// prior's δ hold only each document's departure from its query and bucket. With ±1.5 query
    /// levels the effects' means come out apart by > 1.5 between even and odd queries (the truth: 3,
    /// which the N(0, 1) prior shrinks; the three draws give 1.84 to 1.88), and γ orders each
    /// query's documents better than with one effect for all queries (every pair in one query), by
    /// > 0.05 of pairwise accuracy (the draws: +0.09 to +0.10).
    pub fn query_effects_take_up_the_query_level_and_order_documents_better() {
        for seed in [1, 2, 3] {
            let (rows, truth) = log(false, seed, 1.5);
            let (problem, with) = solved(&rows, 5, 1.0);
            let mut pooled_rows = log(false, seed, 1.5).0;
            pooled_rows.query_of.clear();
            let (pooled, without) = solved(&pooled_rows, 5, 1.0);
            let mean = |parity: usize| {
                let a: Vec<f64> = with.alpha.iter().enumerate().filter(|(q, _)| q % 2 == parity).map(|(_, a)| *a).collect();
                a.iter().sum::<f64>() / a.len() as f64
            };
            let (a, b) = (pairwise_accuracy(&problem, &with, &truth), pairwise_accuracy(&pooled, &without, &truth));
            eprintln!("seed {seed}: mean α {:.2} (even) {:.2} (odd); pairwise accuracy {a:.3} with query effects, {b:.3} without", mean(0), mean(1));
            assert_eq!(without.alpha.len(), 1);
            assert!(mean(0) - mean(1) > 1.5, "seed {seed}: α even {:.2}, odd {:.2}", mean(0), mean(1));
            assert!(a > b + 0.05, "seed {seed}: pairwise accuracy {a:.3} with query effects, {b:.3} without");
        }
    }

    /// The pool-adjacent-violators projection equals the best non-increasing fit found by brute
    /// force: every split of the sequence into runs, each run at its weighted mean, the
    /// non-increasing ones compared by weighted squared error.
    pub fn the_non_increasing_projection_is_the_least_squares_one() {
        let mut state = 11u64;
        let mut uniform = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..200 {
            let n = 1 + (uniform() * 7.0) as usize;
            let values: Vec<f64> = (0..n).map(|_| uniform() * 4.0 - 2.0).collect();
            let weights: Vec<f64> = (0..n).map(|_| 0.1 + uniform() * 3.0).collect();
            let sse = |fit: &[f64]| -> f64 { fit.iter().zip(&values).zip(&weights).map(|((f, v), w)| w * (f - v).powi(2)).sum() };
            let mut best = f64::INFINITY;
            for cuts in 0u32..(1 << (n - 1)) {
                let mut fit = Vec::with_capacity(n);
                let mut start = 0;
                for end in 1..=n {
                    if end == n || cuts & (1 << (end - 1)) != 0 {
                        let w: f64 = weights[start..end].iter().sum();
                        let m = values[start..end].iter().zip(&weights[start..end]).map(|(v, w)| v * w).sum::<f64>() / w;
                        fit.extend(std::iter::repeat_n(m, end - start));
                        start = end;
                    }
                }
                if fit.windows(2).all(|p| p[0] >= p[1]) {
                    best = best.min(sse(&fit));
                }
            }
            let projected = non_increasing(&values, &weights);
            assert!(projected.windows(2).all(|p| p[0] >= p[1]), "{projected:?}");
            assert!((sse(&projected) - best).abs() < 1e-9, "{values:?} {weights:?}: {} vs brute force {best}", sse(&projected));
        }
    }

    /// At the solution the penalised score of every pair's δ and of every run of buckets the
    /// constraint pools is 0, and ρ does not rise with depth, under a policy that shows the better
    /// documents first and one that shows them last (an independent check that the projected
    /// Newton steps reached the constrained optimum).
    pub fn the_solution_zeroes_the_penalised_score_of_every_pair_and_bucket() {
        for reverse in [false, true] {
            let (rows, _) = log(reverse, 1, 1.0);
            let strength = 0.7;
            let (problem, s) = solved(&rows, 5, strength);
            let residual = |rows_of: &[usize], penalty: f64| -> f64 {
                let (mut g, mut n) = (-penalty, 0.0);
                for &i in rows_of {
                    let t = &rows.training[i];
                    let p = problem.index[&t.pair];
                    g += t.weighted_clicks - t.weighted_impressions * sigmoid(t.logit + s.centre(&problem, p) + s.delta[p]);
                    n += t.weighted_impressions;
                }
                g / n
            };
            for (p, r) in problem.pair_rows.iter().enumerate() {
                assert!(residual(r, strength * s.delta[p]).abs() < 1e-4, "pair {p}");
            }
            for (q, pairs) in problem.query_pairs.iter().enumerate() {
                let rows_of: Vec<usize> = pairs.iter().flat_map(|&p| problem.pair_rows[p].iter().copied()).collect();
                assert!(residual(&rows_of, QUERY_PRECISION * s.alpha[q]).abs() < 1e-4, "query {q}");
            }
            // ρ may not rise with depth: buckets the constraint pools share one ρ, and it is their
            // summed penalised score that is 0.
            let informed: Vec<usize> = (0..problem.bucket_rows.len()).filter(|b| !problem.bucket_rows[*b].is_empty()).collect();
            assert!(informed.windows(2).all(|p| s.rho[p[0]] >= s.rho[p[1]]), "ρ {:?}", s.rho);
            let mut run = Vec::new();
            for (j, &b) in informed.iter().enumerate() {
                run.push(b);
                if informed.get(j + 1).is_none_or(|&next| s.rho[next] != s.rho[b]) {
                    let rows_of: Vec<usize> = run.iter().flat_map(|&b| problem.bucket_rows[b].iter().copied()).collect();
                    let penalty: f64 = run.iter().map(|&b| BUCKET_RIDGE * s.rho[b]).sum();
                    assert!(residual(&rows_of, penalty).abs() < 1e-4, "reverse = {reverse}: buckets {run:?}");
                    run.clear();
                }
            }
        }
    }

    /// The shipped γ at `logged_order_prior_lower_bound = 1` (the default) is the posterior mean
    /// less one posterior standard deviation. One query, one bucket: A shown on top 50 times and
    /// clicked 25, C on top 50 times and clicked 35, B shown once at depth (logit −5) and never
    /// clicked. B's one impression says almost nothing, so its mean stays near the query's centre,
    /// above A's (whose clicks put it below C): the mean ranks the never-clicked B above A, which
    /// is what sparse seed 1 of `results/regimes` showed. One standard deviation (≈ 1 for B, ≈ 0.27
    /// for A) puts A above B. Each shipped value equals the mean less 1/√(λ + Σ n·q(1 − q)),
    /// q = σ(row logit + mean), summed here row by row.
    pub fn one_standard_deviation_below_the_mean_ranks_a_clicked_pair_above_an_unseen_one() {
        let mut rows = Rows::default();
        for (pair, position, logit, n, c) in [(1u32, 0usize, 0.0, 50.0, 25.0), (2, 0, 0.0, 50.0, 35.0), (3, 2, -5.0, 1.0, 0.0)] {
            rows.query_of.insert(pair, 0);
            rows.shown.insert(pair, (n, n * (position + 1) as f64));
            rows.training.push(RowTerms { position, pair, logit, weighted_impressions: n, weighted_clicks: c });
        }
        let strength = 1.0;
        let (problem, s) = solved(&rows, 1, strength);
        let (a, b) = (problem.index[&1], problem.index[&3]);
        let mean = |p: usize| problem.lower_bound(&rows.training, &s, strength, p, 0.0);
        assert_eq!(mean(a), s.centre(&problem, a) + s.delta[a]);
        assert!(mean(b) > mean(a), "the mean should rank the unseen B ({:.3}) above A ({:.3})", mean(b), mean(a));
        let shipped = |p: usize| problem.lower_bound(&rows.training, &s, strength, p, 1.0);
        assert!(shipped(a) > shipped(b), "one sd below: A {:.3} should rank above B {:.3}", shipped(a), shipped(b));
        for p in [a, b] {
            let information: f64 = rows
                .training
                .iter()
                .filter(|r| problem.index[&r.pair] == p)
                .map(|r| {
                    let q = 1.0 / (1.0 + (-(r.logit + mean(p))).exp());
                    r.weighted_impressions * q * (1.0 - q)
                })
                .sum();
            assert!((shipped(p) - (mean(p) - 1.0 / (strength + information).sqrt())).abs() < 1e-12);
        }
    }
}
