//! Ranks by the combination of the logging policy's order (prior) and the model's debiased clicks
//! (evidence), per the rule in docs/models.md, "The logged order as prior, the clicks as evidence":
//! c = (κ·μ + I·s + g) / (κ + I), with μ the logged order on the model's scale, s the model's
//! relevance, I and g the Fisher information and score of the pair's own clicks at s; κ chosen by
//! held-out clicks (cross-fitted on the validation sessions), never by editors' labels.
//!
//! Why: the model alone removes position, and with it what the production ranker knew; the logged
//! order alone ignores the clicks. A Gaussian posterior weighs each pair's clicks by how much they
//! say (I), so rare pairs keep the logged order and frequent ones follow their clicks.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::artefact::Trained;
use super::chunks::ExampleChunks;
use super::config::TrainConfig;
use super::data::{split_of, Examples, Split};
use super::weights::weights_of;
use ultr_core::math::sigmoid;

pub use super::logged_order_weight::Weight;

/// One bucket of queries by their clicks: where the clicks move the ranking and whether it helps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeBucket {
    /// Clicks per query, `[low, high)`.
    pub clicks_low: u64,
    pub clicks_high: Option<u64>,
    pub queries: usize,
    /// Share of the bucket's queries whose combined order differs from the logged order.
    pub moved_share: f64,
    /// Mean share of the queries' document pairs the two orders put in opposite order.
    pub discordant_share: f64,
    /// Validation sessions' rows scored (cross-fitted) in the bucket, bucketed by the clicks their
    /// combination saw (their query's clicks less the row's own half).
    pub heldout_impressions: f64,
    /// Held-out click log-likelihood per impression, combination − logged order alone.
    pub heldout_gain: f64,
    /// Its paired standard error (per impression).
    pub heldout_gain_se: f64,
}

/// What the combination chose and found (`ultr train`'s output, `checkpoint.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Combination {
    pub chosen: Weight,
    /// The most likely weight on the held-out clicks (the one-standard-error rule may pick a stronger one).
    pub most_likely: Weight,
    /// Each weight tried and the cross-fitted held-out click log-likelihood per impression.
    pub candidates: Vec<(Weight, f64)>,
    /// The prior's scale: mean model relevance by logged rank (1, 2, …), non-increasing.
    pub prior_by_rank: Vec<f64>,
    pub pairs: usize,
    pub by_click_volume: Vec<VolumeBucket>,
}

const VOLUME_EDGES: [u64; 5] = [0, 1, 10, 100, 1000];

/// One pair: its query, document, logged positions, the model's relevance.
struct Pair {
    query: u32,
    doc: String,
    position_sum: f64,
    impressions: f64,
    clicks: f64,
    s: f64,
}

/// One row: its pair, its logit less relevance, weighted impressions and clicks, split and fold.
struct RowT {
    pair: u32,
    offset: f64,
    wn: f64,
    wc: f64,
    validation: bool,
    fold: bool,
}

#[derive(Default)]
struct Pool {
    pairs: Vec<Pair>,
    index: HashMap<(String, String), u32>,
    queries: HashMap<String, u32>,
    rows: Vec<RowT>,
}

impl Pool {
    /// `every_split`: also the gate's evaluation sessions (as rows neither training nor validation);
    /// a ranking must hold every pair the log showed, the choice of κ must not read the gate's rows.
    fn add(&mut self, trained: &Trained, ex: &Examples, cfg: &TrainConfig, device: &burn::tensor::Device, every_split: bool) {
        let logits = trained.logits(ex, device);
        let relevance = trained.relevance_of_rows(ex, device);
        let (weights, _) = weights_of(&ex.rows, &cfg.applied_ips());
        for span in &ex.sessions {
            let split = split_of(span, cfg.holdout());
            if !every_split && !matches!(split, Split::Training | Split::Validation) {
                continue;
            }
            // A second, independent hash bit of the session: the cross-fitting fold.
            let fold = (span.hash ^ span.start as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 1;
            for i in span.start..span.start + span.len {
                let r = &ex.rows[i];
                if r.position == 0 {
                    continue;
                }
                let key = &ex.qd_keys[r.qd as usize];
                let next = self.pairs.len() as u32;
                let pair = *self.index.entry(key.clone()).or_insert(next);
                if pair == next {
                    let nq = self.queries.len() as u32;
                    let query = *self.queries.entry(key.0.clone()).or_insert(nq);
                    self.pairs.push(Pair { query, doc: key.1.clone(), position_sum: 0.0, impressions: 0.0, clicks: 0.0, s: relevance[i] as f64 });
                }
                let p = &mut self.pairs[pair as usize];
                p.position_sum += r.position as f64 * r.impressions as f64;
                p.impressions += r.impressions as f64;
                p.clicks += r.clicks as f64;
                let w = weights[i] as f64;
                self.rows.push(RowT {
                    pair,
                    offset: (logits[i] - relevance[i]) as f64,
                    wn: w * r.impressions as f64,
                    wc: w * r.clicks as f64,
                    validation: split == Split::Validation,
                    fold,
                });
            }
        }
    }

    /// Per query, its pairs in logged order (mean logged position ascending; ties by document id
    /// descending, as `judged::order` breaks the logged ranker's ties).
    fn logged_orders(&self) -> Vec<Vec<u32>> {
        let mut by_query: Vec<Vec<u32>> = vec![Vec::new(); self.queries.len()];
        for (i, p) in self.pairs.iter().enumerate() {
            by_query[p.query as usize].push(i as u32);
        }
        for v in &mut by_query {
            v.sort_by(|&a, &b| {
                let (pa, pb) = (&self.pairs[a as usize], &self.pairs[b as usize]);
                (pa.position_sum / pa.impressions).total_cmp(&(pb.position_sum / pb.impressions)).then_with(|| pb.doc.cmp(&pa.doc))
            });
        }
        by_query
    }

    /// μ per pair: the prior curve by logged rank, shifted to the query's mean relevance, with a
    /// vanishing slope so a flat stretch of the curve still keeps the logged order.
    fn prior_means(&self, orders: &[Vec<u32>]) -> (Vec<f64>, Vec<f64>) {
        let depth = orders.iter().map(Vec::len).max().unwrap_or(0);
        // Mean model relevance at each logged rank less its query's mean, made non-increasing.
        let (mut sum, mut weight) = (vec![0f64; depth], vec![0f64; depth]);
        for order in orders {
            let mean = order.iter().map(|&p| self.pairs[p as usize].s).sum::<f64>() / order.len() as f64;
            for (j, &p) in order.iter().enumerate() {
                sum[j] += self.pairs[p as usize].s - mean;
                weight[j] += 1.0;
            }
        }
        let curve = non_increasing(&sum.iter().zip(&weight).map(|(s, w)| s / w.max(1.0)).collect::<Vec<_>>(), &weight);
        let mut mu = vec![0.0; self.pairs.len()];
        for order in orders {
            let mean = order.iter().map(|&p| self.pairs[p as usize].s).sum::<f64>() / order.len() as f64;
            let curve_mean = (0..order.len()).map(|j| curve[j]).sum::<f64>() / order.len() as f64;
            for (j, &p) in order.iter().enumerate() {
                mu[p as usize] = mean + curve[j] - curve_mean - 1e-9 * j as f64;
            }
        }
        (mu, curve)
    }

    /// Σ w·n·p(1 − p) and Σ w·(c − n·p) at the model's relevance, over the rows `take` keeps.
    fn evidence(&self, take: impl Fn(&RowT) -> bool) -> (Vec<f64>, Vec<f64>) {
        let (mut info, mut score) = (vec![0.0; self.pairs.len()], vec![0.0; self.pairs.len()]);
        for r in self.rows.iter().filter(|r| take(r)) {
            let p = sigmoid(r.offset + self.pairs[r.pair as usize].s);
            info[r.pair as usize] += r.wn * p * (1.0 - p);
            score[r.pair as usize] += r.wc - r.wn * p;
        }
        (info, score)
    }
}

/// The combined relevance of one pair.
fn combine(weight: Weight, mu: f64, s: f64, info: f64, score: f64) -> f64 {
    match weight {
        Weight::ModelAlone => s,
        Weight::LoggedOrderAlone => mu,
        Weight::Kappa(k) => (k * mu + info * s + score) / (k + info),
    }
}

/// Pool adjacent violators: the weighted least-squares non-increasing fit of `y`.
fn non_increasing(y: &[f64], w: &[f64]) -> Vec<f64> {
    let mut blocks: Vec<(f64, f64, usize)> = Vec::new();
    for (&v, &wt) in y.iter().zip(w) {
        blocks.push((v, wt.max(1e-12), 1));
        while blocks.len() > 1 && blocks[blocks.len() - 2].0 < blocks[blocks.len() - 1].0 {
            let (b, a) = (blocks.pop().expect("two blocks"), blocks.pop().expect("two blocks"));
            let wsum = a.1 + b.1;
            blocks.push(((a.0 * a.1 + b.0 * b.1) / wsum, wsum, a.2 + b.2));
        }
    }
    blocks.into_iter().flat_map(|(v, _, n)| std::iter::repeat_n(v, n)).collect()
}

fn row_ll(r: &RowT, c: f64) -> f64 {
    let l = r.offset + c;
    r.wc * l - r.wn * (l.max(0.0) + (-l.abs()).exp().ln_1p())
}

fn weights_tried(cfg: &TrainConfig) -> Vec<Weight> {
    let mut w = vec![Weight::ModelAlone];
    w.extend(cfg.logged_order_combination.iter().map(|&k| Weight::Kappa(k)));
    w.push(Weight::LoggedOrderAlone);
    w
}

fn applies(trained: &Trained, cfg: &TrainConfig) -> bool {
    !cfg.logged_order_combination.is_empty() && !trained.meta.architecture.model.input_shape().lists()
}

/// Chooses κ on the validation sessions' clicks (cross-fitted: each half's clicks judge the
/// combination built from the other half's) and records it in `trained.meta`. None when the
/// combination is off (`[train] logged_order_combination = []`), the model reads lists, or no
/// validation session has rows.
pub fn fit_combination(trained: &mut Trained, data: &dyn ExampleChunks, cfg: &TrainConfig) -> anyhow::Result<Option<Combination>> {
    if !applies(trained, cfg) {
        return Ok(None);
    }
    let device = cfg.backend.device()?;
    let mut pool = Pool::default();
    match data.in_memory() {
        Some(ex) => pool.add(trained, ex, cfg, &device, false),
        None => {
            for split in [Split::Training, Split::Validation] {
                for i in 0..data.chunk_count(split) {
                    pool.add(trained, &data.load_chunk(split, i)?, cfg, &device, false);
                }
            }
        }
    }
    if !pool.rows.iter().any(|r| r.validation) || pool.pairs.is_empty() {
        return Ok(None);
    }
    let orders = pool.logged_orders();
    let (mu, curve) = pool.prior_means(&orders);
    // Evidence per fold: the training rows and the other fold's validation rows.
    let folds = [false, true].map(|f| pool.evidence(|r| !r.validation || r.fold != f));
    let checked: Vec<&RowT> = pool.rows.iter().filter(|r| r.validation).collect();
    let tried = weights_tried(cfg);
    let per_row: Vec<Vec<f64>> = tried
        .iter()
        .map(|&w| {
            checked
                .iter()
                .map(|r| {
                    let (info, score) = &folds[r.fold as usize];
                    let p = r.pair as usize;
                    row_ll(r, combine(w, mu[p], pool.pairs[p].s, info[p], score[p]))
                })
                .collect()
        })
        .collect();
    let impressions: f64 = checked.iter().map(|r| r.wn).sum::<f64>().max(f64::MIN_POSITIVE);
    let strengths: Vec<f64> = tried.iter().map(|w| w.strength()).collect();
    let (chosen_index, most_likely) = super::logged_order_prior::one_standard_error(&strengths, &per_row);
    let chosen = tried[chosen_index];
    let most_likely = tried[strengths.iter().position(|&s| s == most_likely).unwrap_or(chosen_index)];
    let candidates = tried.iter().zip(&per_row).map(|(w, r)| (*w, r.iter().sum::<f64>() / impressions)).collect();
    // The report: the shipped scores (every row's evidence) against the logged order, per bucket.
    let (info, score) = pool.evidence(|_| true);
    let combined: Vec<f64> = (0..pool.pairs.len()).map(|p| combine(chosen, mu[p], pool.pairs[p].s, info[p], score[p])).collect();
    let logged_index = tried.len() - 1;
    // A held-out row is bucketed by the clicks its combination saw (its query's evidence rows), not
    // by its own clicks: bucketing on the outcome would credit a query's silence to the bucket.
    let mut evidence_clicks = vec![[0f64; 2]; pool.queries.len()];
    for r in &pool.rows {
        let q = pool.pairs[r.pair as usize].query as usize;
        for f in [false, true] {
            if !r.validation || r.fold != f {
                evidence_clicks[q][f as usize] += r.wc;
            }
        }
    }
    let gains: Vec<(f64, f64, f64)> = checked
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let q = pool.pairs[r.pair as usize].query as usize;
            (evidence_clicks[q][r.fold as usize], r.wn, per_row[chosen_index][i] - per_row[logged_index][i])
        })
        .collect();
    let by_click_volume = volume_report(&pool, &orders, &combined, &gains);
    trained.meta.logged_order_combination = Some(chosen);
    Ok(Some(Combination { chosen, most_likely, candidates, prior_by_rank: curve, pairs: pool.pairs.len(), by_click_volume }))
}

/// `gains`: per held-out row, the clicks its combination saw for its query, its weighted
/// impressions and its log-likelihood gain over the logged order alone.
fn volume_report(pool: &Pool, orders: &[Vec<u32>], combined: &[f64], gains: &[(f64, f64, f64)]) -> Vec<VolumeBucket> {
    let bucket_of = |clicks: f64| VOLUME_EDGES.iter().rposition(|&e| clicks >= e as f64).unwrap_or(0);
    let clicks_of: Vec<f64> = orders.iter().map(|o| o.iter().map(|&p| pool.pairs[p as usize].clicks).sum()).collect();
    let mut out: Vec<VolumeBucket> = VOLUME_EDGES
        .iter()
        .enumerate()
        .map(|(b, &low)| VolumeBucket {
            clicks_low: low,
            clicks_high: VOLUME_EDGES.get(b + 1).copied(),
            queries: 0,
            moved_share: 0.0,
            discordant_share: 0.0,
            heldout_impressions: 0.0,
            heldout_gain: 0.0,
            heldout_gain_se: 0.0,
        })
        .collect();
    for (q, order) in orders.iter().enumerate() {
        let b = &mut out[bucket_of(clicks_of[q])];
        b.queries += 1;
        let (mut discordant, mut all) = (0usize, 0usize);
        for i in 0..order.len() {
            for j in i + 1..order.len() {
                all += 1;
                // The logged order puts i first; the combination disagrees when j scores higher.
                if combined[order[j] as usize] > combined[order[i] as usize] {
                    discordant += 1;
                }
            }
        }
        if discordant > 0 {
            b.moved_share += 1.0;
        }
        if all > 0 {
            b.discordant_share += discordant as f64 / all as f64;
        }
    }
    let mut per_bucket: Vec<Vec<(f64, f64)>> = vec![Vec::new(); out.len()];
    for &(clicks, wn, gain) in gains {
        per_bucket[bucket_of(clicks)].push((wn, gain));
    }
    for (b, rows) in out.iter_mut().zip(per_bucket) {
        if b.queries > 0 {
            b.moved_share /= b.queries as f64;
            b.discordant_share /= b.queries as f64;
        }
        let n: f64 = rows.iter().map(|r| r.0).sum();
        if n > 0.0 {
            let total: f64 = rows.iter().map(|r| r.1).sum();
            let mean = total / rows.len() as f64;
            let var = rows.iter().map(|r| (r.1 - mean).powi(2)).sum::<f64>() / (rows.len().max(2) - 1) as f64;
            b.heldout_impressions = n;
            b.heldout_gain = total / n;
            b.heldout_gain_se = (var * rows.len() as f64).sqrt() / n;
        }
    }
    out
}

/// Per query, each document with its score.
pub type ScoresByQuery = BTreeMap<String, Vec<(String, f64)>>;

/// The combined scores of every (query, document) in `ex` by query, with the weight the model
/// chose; None when it has none (trained before the combination, or with it off).
pub fn combined_scores(trained: &Trained, ex: &Examples, cfg: &TrainConfig) -> anyhow::Result<Option<ScoresByQuery>> {
    let Some(weight) = trained.meta.logged_order_combination else { return Ok(None) };
    let device = cfg.backend.device()?;
    let mut pool = Pool::default();
    pool.add(trained, ex, cfg, &device, true);
    let orders = pool.logged_orders();
    let (mu, _) = pool.prior_means(&orders);
    let (info, score) = pool.evidence(|_| true);
    let names: HashMap<u32, &String> = pool.queries.iter().map(|(q, i)| (*i, q)).collect();
    let mut by_query: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    for (p, pair) in pool.pairs.iter().enumerate() {
        by_query.entry(names[&pair.query].clone()).or_default().push((pair.doc.clone(), combine(weight, mu[p], pair.s, info[p], score[p])));
    }
    Ok(Some(by_query))
}

/// The report as lines for `ultr train`'s text output.
pub fn describe(c: &Combination) -> String {
    let mut s = format!("logged order × clicks: {} chosen by held-out clicks (most likely: {}); {} pairs\n", c.chosen.label(), c.most_likely.label(), c.pairs);
    s.push_str("  clicks per query   queries   moved   discordant pairs   held-out Δ log-lik/impr vs logged order [± SE]\n");
    for b in &c.by_click_volume {
        let range = match b.clicks_high {
            Some(h) => format!("{}–{}", b.clicks_low, h - 1),
            None => format!("≥ {}", b.clicks_low),
        };
        let gain = if b.heldout_impressions > 0.0 { format!("{:+.5} [± {:.5}]", b.heldout_gain, b.heldout_gain_se) } else { "no held-out rows".into() };
        s.push_str(&format!("  {range:>16} {:>9} {:>6.1}% {:>17.1}%   {gain}\n", b.queries, 100.0 * b.moved_share, 100.0 * b.discordant_share));
    }
    s
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn pool_adjacent_violators_matches_a_brute_force_non_increasing_fit() {
        // Brute force: the weighted mean of every block; [3, 1, 2] pools its last two into 1.5.
        assert_eq!(non_increasing(&[3.0, 1.0, 2.0], &[1.0, 1.0, 1.0]), vec![3.0, 1.5, 1.5]);
        assert_eq!(non_increasing(&[1.0, 2.0], &[3.0, 1.0]), vec![1.25, 1.25]);
    }

    pub fn the_endpoints_are_the_model_and_the_logged_order_and_kappa_weighs_by_information() {
        assert_eq!(combine(Weight::ModelAlone, 1.0, 2.0, 5.0, 0.0), 2.0);
        assert_eq!(combine(Weight::LoggedOrderAlone, 1.0, 2.0, 5.0, 0.0), 1.0);
        // κ = I: halfway; a pair with no information keeps the prior.
        assert_eq!(combine(Weight::Kappa(5.0), 1.0, 2.0, 5.0, 0.0), 1.5);
        assert_eq!(combine(Weight::Kappa(5.0), 1.0, 2.0, 0.0, 0.0), 1.0);
    }
}
