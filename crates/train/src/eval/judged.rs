//! Judged evaluation: rankings of the documents the state saw per query, scored against editors'
//! graded labels (TREC qrels) with nDCG@1/3/5/10 and DCG@10, paired bootstrap intervals over
//! queries, win/tie/loss counts against the logged order, and TREC run files.
//!
//! Definitions (those of trec_eval's `ndcg_cut`, with the exponential gain): gain 2^g − 1 (a grade
//! ≤ 0 gains 0); discount log2(rank + 1); the ideal ranking holds every document the qrels judge for
//! the query, shown or not. A ranking orders by score, descending, and breaks ties by document id,
//! descending, as trec_eval does, so a run file written here scores the same in trec_eval.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::Path;

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::artefact::Trained;
use crate::config::TrainConfig;
use crate::data::Examples;

/// The cutoffs of nDCG.
pub const CUTOFFS: [usize; 4] = [1, 3, 5, 10];
/// Metric names, in the order of [`QueryFigures::values`].
pub const METRICS: [&str; 5] = ["nDCG@1", "nDCG@3", "nDCG@5", "nDCG@10", "DCG@10"];

/// Graded labels: query → document → grade.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Qrels(pub BTreeMap<String, BTreeMap<String, i64>>);

impl Qrels {
    /// TREC qrels: `query iteration document grade` per line, whitespace-separated; `#` lines and
    /// blank lines are skipped. `origin` names the input in errors.
    pub fn parse(text: &str, origin: &str) -> anyhow::Result<Qrels> {
        let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = t.split_whitespace().collect();
            if f.len() != 4 {
                anyhow::bail!("{origin}:{line_no}: {} fields; a qrels line is `query iteration document grade`", f.len());
            }
            let grade: i64 = f[3].parse().map_err(|_| anyhow::anyhow!("{origin}:{line_no}: grade {:?} is not an integer", f[3]))?;
            let docs = out.entry(f[0].to_string()).or_default();
            if let Some(previous) = docs.insert(f[2].to_string(), grade) {
                if previous != grade {
                    anyhow::bail!("{origin}:{line_no}: query {} document {} graded {previous} earlier and {grade} here", f[0], f[2]);
                }
            }
        }
        Ok(Qrels(out))
    }

    pub fn read(path: &Path) -> anyhow::Result<Qrels> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading qrels {}", path.display()))?;
        Qrels::parse(&text, &path.display().to_string())
    }
}

pub use super::config::Unjudged;

/// Gain of a grade: 2^g − 1, and 0 for g ≤ 0.
pub fn gain(grade: i64) -> f64 {
    if grade <= 0 {
        0.0
    } else {
        2f64.powi(grade.min(62) as i32) - 1.0
    }
}

fn dcg(gains: &[f64], k: usize) -> f64 {
    gains.iter().take(k).enumerate().map(|(i, g)| g / ((i + 2) as f64).log2()).sum()
}

/// One query's figures for one ranking: nDCG at [`CUTOFFS`], then DCG@10.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct QueryFigures {
    pub values: [f64; 5],
}

/// The figures of `ranked` (best first) against the query's labels.
pub fn figures(ranked: &[&str], judged: &BTreeMap<String, i64>, unjudged: Unjudged) -> QueryFigures {
    let gains: Vec<f64> = ranked
        .iter()
        .filter_map(|d| match (judged.get(*d), unjudged) {
            (Some(g), _) => Some(gain(*g)),
            (None, Unjudged::Zero) => Some(0.0),
            (None, Unjudged::Drop) => None,
        })
        .collect();
    let mut ideal: Vec<f64> = judged.values().map(|g| gain(*g)).collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let mut values = [0.0; 5];
    for (i, k) in CUTOFFS.iter().enumerate() {
        let best = dcg(&ideal, *k);
        values[i] = if best > 0.0 { dcg(&gains, *k) / best } else { 0.0 };
    }
    values[4] = dcg(&gains, 10);
    QueryFigures { values }
}

/// Documents ordered by score, descending; ties by document id, descending (trec_eval's order).
pub fn order(scored: &[(String, f64)]) -> Vec<&str> {
    let mut v: Vec<&(String, f64)> = scored.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    v.into_iter().map(|(d, _)| d.as_str()).collect()
}

/// What the state saw of one (query, document).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    pub impressions: u64,
    pub clicks: u64,
    /// Σ position × impressions.
    pub position_sum: f64,
}

/// Per query, per document: impressions, clicks and positions over the examples' rows.
pub fn seen_by_query(ex: &Examples) -> BTreeMap<String, BTreeMap<String, Seen>> {
    let mut out: BTreeMap<String, BTreeMap<String, Seen>> = BTreeMap::new();
    let mut per_qd: HashMap<u32, Seen> = HashMap::new();
    for r in &ex.rows {
        let s = per_qd.entry(r.qd).or_default();
        s.impressions += r.impressions as u64;
        s.clicks += r.clicks as u64;
        s.position_sum += r.position as f64 * r.impressions as f64;
    }
    for (qd, s) in per_qd {
        let (q, d) = &ex.qd_keys[qd as usize];
        out.entry(q.clone()).or_default().insert(d.clone(), s);
    }
    out
}

/// One ranker's scores, per query, for every document the state saw for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    pub ranker: String,
    pub by_query: BTreeMap<String, Vec<(String, f64)>>,
}

impl Ranking {
    /// Each document's mean shown position, lowest first: what the production ranker did.
    pub fn logged(seen: &BTreeMap<String, BTreeMap<String, Seen>>) -> Ranking {
        Ranking::from_seen("logged", seen, |s| -(s.position_sum / s.impressions.max(1) as f64))
    }

    /// The logged order combined with the clicks at the weight training chose; None without one.
    pub fn combined(trained: &Trained, ex: &Examples, train: &TrainConfig) -> anyhow::Result<Option<Ranking>> {
        Ok(crate::logged_order_combination::combined_scores(trained, ex, train)?.map(|by_query| Ranking { ranker: "combined".into(), by_query }))
    }

    /// Clicks ÷ impressions.
    pub fn naive_ctr(seen: &BTreeMap<String, BTreeMap<String, Seen>>) -> Ranking {
        Ranking::from_seen("naive_ctr", seen, |s| s.clicks as f64 / s.impressions.max(1) as f64)
    }

    fn from_seen(ranker: &str, seen: &BTreeMap<String, BTreeMap<String, Seen>>, score: impl Fn(&Seen) -> f64) -> Ranking {
        Ranking {
            ranker: ranker.to_string(),
            by_query: seen.iter().map(|(q, docs)| (q.clone(), docs.iter().map(|(d, s)| (d.clone(), score(s))).collect())).collect(),
        }
    }

    /// A model's relevance per row of `ex` (rows of one (query, document) share it).
    pub fn from_rows(ranker: &str, ex: &Examples, relevance: &[f32]) -> Ranking {
        let mut per_qd: BTreeMap<u32, f64> = BTreeMap::new();
        for (r, s) in ex.rows.iter().zip(relevance) {
            per_qd.entry(r.qd).or_insert(*s as f64);
        }
        let mut by_query: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
        for (qd, s) in per_qd {
            let (q, d) = &ex.qd_keys[qd as usize];
            by_query.entry(q.clone()).or_default().push((d.clone(), s));
        }
        Ranking { ranker: ranker.to_string(), by_query }
    }

    /// A TREC run: `query Q0 document rank score tag`, in ranked order per query.
    pub fn write_run(&self, out: &mut dyn Write, tag: &str) -> std::io::Result<()> {
        for (q, docs) in &self.by_query {
            let scores: HashMap<&str, f64> = docs.iter().map(|(d, s)| (d.as_str(), *s)).collect();
            for (i, d) in order(docs).into_iter().enumerate() {
                writeln!(out, "{q} Q0 {d} {} {} {tag}", i + 1, scores[d])?;
            }
        }
        Ok(())
    }
}

/// The rankings `ultr eval --qrels` compares, of every (query, document) in `all`: the logged
/// order, naive click-through, `model`, and the biased model a team would train first (the same
/// tower and settings as `train`, no position term, no inverse-propensity weights), trained here on
/// the same rows; and, when training chose a weight for it, the logged order combined with the clicks
/// (`combined`). Labels are the editors', not the clicks', so nothing is held out.
pub fn standard_rankings(all: &Examples, trained: &Trained, train: &TrainConfig) -> anyhow::Result<Vec<Ranking>> {
    let device = train.backend.device()?;
    let seen = seen_by_query(all);
    let model = Ranking::from_rows("model", all, &trained.relevance_of_rows(all, &device));
    let mut biased_cfg = train.clone();
    biased_cfg.model = crate::models::ModelKind::Biased;
    biased_cfg.ips.enabled = false;
    let (biased, _) = crate::fit::fit(all, &biased_cfg, None, false).context("training the biased model for the comparison")?;
    let biased = Ranking::from_rows("biased", all, &biased.relevance_of_rows(all, &device));
    let mut out = vec![Ranking::logged(&seen), Ranking::naive_ctr(&seen), model, biased];
    // The logged order combined with the clicks, at the weight training chose (when it ran).
    out.extend(Ranking::combined(trained, all, train)?);
    Ok(out)
}

/// An estimate with its 95% bootstrap interval (percentiles over resampled query sets).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
}

/// One ranker's figures over the evaluated queries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankerFigures {
    pub ranker: String,
    /// Per metric (in [`METRICS`] order): the mean over queries.
    pub mean: Vec<Interval>,
    /// Per metric: the mean paired difference to the logged order, and to naive click-through.
    pub minus_logged: Vec<Interval>,
    pub minus_naive_ctr: Vec<Interval>,
    /// nDCG@10 against the logged order, per query: better, equal, worse.
    pub wins: usize,
    pub ties: usize,
    pub losses: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JudgedReport {
    pub metrics: Vec<&'static str>,
    /// Queries both judged (with at least two distinct grades) and seen by the state.
    pub queries: usize,
    /// Judged queries the state never saw, and seen-and-judged queries whose labels are all one grade.
    pub judged_not_seen: usize,
    pub single_grade: usize,
    pub unjudged: Unjudged,
    /// Ranked (query, document) pairs without a label.
    pub unjudged_documents: usize,
    pub judged_documents: usize,
    pub bootstrap: usize,
    pub rankers: Vec<RankerFigures>,
    /// Per ranker, per evaluated query (sorted by query id): the figures.
    #[serde(skip)]
    pub per_query: BTreeMap<String, Vec<(String, QueryFigures)>>,
}

/// The queries a judged evaluation scores: judged with at least two distinct grades and seen by the
/// state; and how many it leaves out as never seen, and as judged with one grade only.
fn scored_queries<'a>(qrels: &'a Qrels, seen: &Ranking) -> (Vec<&'a String>, usize, usize) {
    let mut queries = Vec::new();
    let (mut judged_not_seen, mut single_grade) = (0, 0);
    for (q, judged) in &qrels.0 {
        if !seen.by_query.contains_key(q) {
            judged_not_seen += 1;
        } else if judged.values().collect::<BTreeSet<_>>().len() < 2 {
            single_grade += 1;
        } else {
            queries.push(q);
        }
    }
    (queries, judged_not_seen, single_grade)
}

/// Mean of metric `m` over the picked queries, minus the baseline's when given.
fn mean_of(v: &[[f64; 5]], picks: &[usize], m: usize, base: Option<&[[f64; 5]]>) -> f64 {
    let s: f64 = picks.iter().map(|i| v[*i][m] - base.map_or(0.0, |b| b[*i][m])).sum();
    s / picks.len().max(1) as f64
}

/// The 95% percentile interval of `reps` around `estimate` (NaN bounds without replicates).
fn percentile_interval(estimate: f64, reps: &mut [f64]) -> Interval {
    if reps.is_empty() {
        return Interval { estimate, low: f64::NAN, high: f64::NAN };
    }
    reps.sort_by(f64::total_cmp);
    let at = |p: f64| reps[((p * (reps.len() - 1) as f64).round() as usize).min(reps.len() - 1)];
    Interval { estimate, low: at(0.025), high: at(0.975) }
}

/// One ranker's means and paired differences with their bootstrap intervals, and its wins, ties and
/// losses in nDCG@10 against the logged order. `values[ranker][query][metric]`; `reps[metric]` holds
/// the replicates of (mean, − logged, − naive).
fn ranker_figures(ranker: &str, r: usize, values: &[Vec<[f64; 5]>], baselines: (usize, usize), reps: &mut [[Vec<f64>; 3]]) -> RankerFigures {
    let (logged, naive) = baselines;
    let all: Vec<usize> = (0..values[r].len()).collect();
    let v = &values[r];
    let (mut mean, mut minus_logged, mut minus_naive_ctr) = (Vec::new(), Vec::new(), Vec::new());
    for (m, rep) in reps.iter_mut().enumerate() {
        mean.push(percentile_interval(mean_of(v, &all, m, None), &mut rep[0]));
        minus_logged.push(percentile_interval(mean_of(v, &all, m, Some(values[logged].as_slice())), &mut rep[1]));
        minus_naive_ctr.push(percentile_interval(mean_of(v, &all, m, Some(values[naive].as_slice())), &mut rep[2]));
    }
    let (mut wins, mut ties, mut losses) = (0, 0, 0);
    for (a, b) in v.iter().zip(&values[logged]) {
        let d = a[3] - b[3];
        if d > 1e-12 {
            wins += 1;
        } else if d < -1e-12 {
            losses += 1;
        } else {
            ties += 1;
        }
    }
    RankerFigures { ranker: ranker.to_string(), mean, minus_logged, minus_naive_ctr, wins, ties, losses }
}

/// Scores `rankings` against `qrels`; `rankings` must hold "logged" and "naive_ctr" (the paired
/// baselines). Intervals: `bootstrap` resamples of the query set, seeded by `seed`.
pub fn evaluate(qrels: &Qrels, rankings: &[Ranking], unjudged: Unjudged, bootstrap: usize, seed: u64) -> anyhow::Result<JudgedReport> {
    let index = |name: &str| rankings.iter().position(|r| r.ranker == name).with_context(|| format!("the judged evaluation needs the {name} ranking"));
    let (logged, naive) = (index("logged")?, index("naive_ctr")?);
    let (queries, judged_not_seen, single_grade) = scored_queries(qrels, &rankings[logged]);
    let shown: Vec<&String> = queries.iter().flat_map(|q| rankings[logged].by_query[*q].iter().map(|(d, _)| d)).collect();
    let judged_documents: usize = queries.iter().map(|q| rankings[logged].by_query[*q].iter().filter(|(d, _)| qrels.0[*q].contains_key(d)).count()).sum();
    let unjudged_documents = shown.len() - judged_documents;
    // values[ranker][query][metric]
    let values: Vec<Vec<[f64; 5]>> = rankings
        .iter()
        .map(|r| queries.iter().map(|q| figures(&order(r.by_query.get(*q).map(Vec::as_slice).unwrap_or(&[])), &qrels.0[*q], unjudged).values).collect())
        .collect();
    let n = queries.len();
    // Per ranker × metric × (mean, − logged, − naive): the bootstrap replicates.
    let mut replicates = vec![vec![[Vec::with_capacity(bootstrap), Vec::with_capacity(bootstrap), Vec::with_capacity(bootstrap)]; 5]; rankings.len()];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut picks = vec![0usize; n];
    for _ in 0..if n == 0 { 0 } else { bootstrap } {
        for p in picks.iter_mut() {
            *p = rng.random_range(0..n);
        }
        for (r, v) in values.iter().enumerate() {
            #[allow(clippy::needless_range_loop, reason = "m is the metric index mean_of reads as well")]
            for m in 0..5 {
                replicates[r][m][0].push(mean_of(v, &picks, m, None));
                replicates[r][m][1].push(mean_of(v, &picks, m, Some(values[logged].as_slice())));
                replicates[r][m][2].push(mean_of(v, &picks, m, Some(values[naive].as_slice())));
            }
        }
    }
    let rankers = rankings.iter().enumerate().map(|(r, ranking)| ranker_figures(&ranking.ranker, r, &values, (logged, naive), &mut replicates[r])).collect();
    let per_query = queries
        .iter()
        .enumerate()
        .map(|(i, q)| ((*q).clone(), rankings.iter().zip(&values).map(|(r, v)| (r.ranker.clone(), QueryFigures { values: v[i] })).collect()))
        .collect();
    Ok(JudgedReport {
        metrics: METRICS.to_vec(),
        queries: n,
        judged_not_seen,
        single_grade,
        unjudged,
        unjudged_documents,
        judged_documents,
        bootstrap,
        rankers,
        per_query,
    })
}

impl JudgedReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "judged evaluation: {} queries ({} judged but never seen, {} with one grade only, left out); {} ranked documents judged, {} unjudged (counted as {})\n",
            self.queries,
            self.judged_not_seen,
            self.single_grade,
            self.judged_documents,
            self.unjudged_documents,
            match self.unjudged {
                Unjudged::Zero => "gain 0 at their rank, as trec_eval",
                Unjudged::Drop => "absent: removed before the cutoffs",
            }
        );
        s.push_str(&format!("mean [95% bootstrap interval, {} resamples of the queries]\n", self.bootstrap));
        s.push_str(&format!("{:<10}", "ranker"));
        for m in METRICS {
            s.push_str(&format!(" {m:>24}"));
        }
        s.push('\n');
        let show = |i: &Interval| format!("{:.4} [{:.4}, {:.4}]", i.estimate, i.low, i.high);
        for r in &self.rankers {
            s.push_str(&format!("{:<10}", r.ranker));
            for i in &r.mean {
                s.push_str(&format!(" {:>24}", show(i)));
            }
            s.push('\n');
        }
        s.push_str("paired differences (nDCG@10): ranker − logged order, ranker − naive click-through; wins/ties/losses against the logged order\n");
        for r in &self.rankers {
            if r.ranker == "logged" {
                continue;
            }
            s.push_str(&format!(
                "{:<10} {:>+.4} [{:+.4}, {:+.4}]   {:>+.4} [{:+.4}, {:+.4}]   {}/{}/{}\n",
                r.ranker,
                r.minus_logged[3].estimate,
                r.minus_logged[3].low,
                r.minus_logged[3].high,
                r.minus_naive_ctr[3].estimate,
                r.minus_naive_ctr[3].low,
                r.minus_naive_ctr[3].high,
                r.wins,
                r.ties,
                r.losses
            ));
        }
        s
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    fn labels(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
        pairs.iter().map(|(d, g)| (d.to_string(), *g)).collect()
    }

    pub fn ndcg_follows_the_definition_by_hand() {
        let judged = labels(&[("a", 3), ("b", 1), ("c", 0), ("z", 2)]);
        // Ranked: b, x (unjudged), a. Ideal over every judged document: a(7), z(3), b(1), c(0).
        let f = figures(&["b", "x", "a"], &judged, Unjudged::Zero);
        let d3 = 1.0 + 0.0 / 3f64.log2() + 7.0 / 2.0;
        let i3 = 7.0 + 3.0 / 3f64.log2() + 1.0 / 2.0;
        assert!((f.values[2] - d3 / i3).abs() < 1e-12);
        assert!((f.values[0] - 1.0 / 7.0).abs() < 1e-12);
        assert!((f.values[4] - d3).abs() < 1e-12);
        // Dropping the unjudged document lifts a to rank 2.
        let f = figures(&["b", "x", "a"], &judged, Unjudged::Drop);
        assert!((f.values[4] - (1.0 + 7.0 / 3f64.log2())).abs() < 1e-12);
    }

    pub fn ties_break_by_document_id_descending() {
        let scored = vec![("a".to_string(), 1.0), ("c".to_string(), 2.0), ("b".to_string(), 1.0)];
        assert_eq!(order(&scored), vec!["c", "b", "a"]);
    }

    pub fn qrels_errors_name_the_file_and_line() {
        let e = Qrels::parse("q1 0 d1 2\nq1 0 d2\n", "x.qrels").unwrap_err().to_string();
        assert!(e.contains("x.qrels:2"), "{e}");
        let e = Qrels::parse("q1 0 d1 2\nq1 0 d1 3\n", "x.qrels").unwrap_err().to_string();
        assert!(e.contains("x.qrels:2") && e.contains("graded 2"), "{e}");
        let q = Qrels::parse("# comment\n\nq1 0 d1 2\nq1 0 d1 2\n", "x").unwrap();
        assert_eq!(q.0["q1"]["d1"], 2);
    }

    pub fn a_ranking_equal_to_the_logged_order_ties_every_query_and_differs_by_zero() {
        let mut seen = BTreeMap::new();
        for q in 0..20 {
            let docs: BTreeMap<String, Seen> =
                (0..5).map(|d| (format!("d{d}"), Seen { impressions: 10, clicks: (d * q) % 7, position_sum: 10.0 * (d + 1) as f64 })).collect();
            seen.insert(format!("q{q}"), docs);
        }
        let qrels = Qrels((0..20).map(|q| (format!("q{q}"), (0..5).map(|d| (format!("d{d}"), ((d + q) % 3) as i64)).collect())).collect());
        let logged = Ranking::logged(&seen);
        let same = Ranking { ranker: "model".into(), ..logged.clone() };
        let report = evaluate(&qrels, &[logged, Ranking::naive_ctr(&seen), same], Unjudged::Zero, 200, 1).unwrap();
        let model = &report.rankers[2];
        assert_eq!((model.wins, model.ties, model.losses), (0, 20, 0));
        assert!(model.minus_logged.iter().all(|i| i.estimate == 0.0 && i.low == 0.0 && i.high == 0.0));
        assert_eq!(report.queries, 20);
    }
}
