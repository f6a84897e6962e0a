//! `ultr experiment zhang2023`: Zhang et al. 2023 Table 1 (§5.2–5.3) and the sensitivity sweeps of
//! Figs. 6–7 on the LTR data we have (MQ2008 fold 1; LightGBM's rank data). Logging policy: one
//! deterministic ranking per query by s = w·y + (1−w)·n, n ~ U[0, 4] drawn once per (q, d) (ties
//! in s broken by n, then file order); clicks by the PBM P(E|p) = 1/p, P(R|y) = ε + (1−ε)(2^y − 1)/
//! (2^y_max − 1), ε = 0.1 (Eq. 15–17). Since a query's ranking never changes, its sessions differ
//! only in their clicks: sessions are drawn as queries uniformly at random, split by a hash of their
//! index (training / validation / evaluation, as the pipeline does), and each (query, split) is one
//! list whose items carry their session count and click count — exact for pointwise losses and for
//! DLA's listwise ones (a list's loss is linear in its clicks). Every method trains through the
//! shared fit loop; the relevance tower is scored by nDCG on the test queries' labels.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Binomial, Distribution};
use serde::Serialize;

use crate::simulate::dataset::Dataset;
use ultr_train::artefact::Trained;
use ultr_train::config::{ModelKind, TowerKind, TrainConfig};
use ultr_train::data::{Examples, Row, SessionSpan, Split};
use ultr_train::device::BackendKind;
use ultr_train::eval::mean_ndcg;
use ultr_train::fit::fit;

/// Zhang §5.2's five logging policies: the weight w of the true label in the ranking score.
pub const POLICIES: [(f64, &str); 5] = [(1.0, "Oracle"), (0.8, "L1"), (0.6, "L2"), (0.2, "L3"), (0.0, "Random")];
/// Click noise ε (Eq. 16).
pub const EPSILON: f64 = 0.1;

/// A training method of Table 1, or a point of a sweep.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Method {
    pub name: String,
    pub model: ModelKind,
    /// η (gradient reversal).
    pub eta: f64,
    /// τ (observation dropout; with η > 0, combined).
    pub dropout: f64,
}

impl Method {
    pub fn table() -> Vec<Method> {
        let m = |name: &str, model, eta, dropout| Method { name: name.into(), model, eta, dropout };
        vec![
            m("Biased", ModelKind::Biased, 0.0, 0.0),
            m("PAL", ModelKind::Additive, 0.0, 0.0),
            m("DLA", ModelKind::Dla, 0.0, 0.0),
            m("GradRev", ModelKind::GradientReversal, 0.6, 0.0),
            m("Drop", ModelKind::ObservationDropout, 0.0, 0.3),
        ]
    }
}

/// One dataset: training queries (clicks are simulated on them) and test queries (only their labels
/// are used, to score the relevance tower).
pub struct DataSpec {
    pub name: String,
    pub train: Dataset,
    pub test: Dataset,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub out: PathBuf,
    /// Sessions whose split is training, per cell (the stream has about this ÷ 0.8).
    pub train_sessions: u64,
    pub seeds: Vec<u64>,
    pub max_epochs: usize,
    pub jobs: usize,
    pub backend: BackendKind,
    pub tower: TowerKind,
    /// Deeper positions are not shown (the log holds the top this many of each ranking).
    pub max_positions: usize,
    pub policies: Vec<f64>,
    pub methods: Vec<Method>,
    /// η values swept at w = 1 (Zhang Fig. 6); empty: no sweep.
    pub eta_sweep: Vec<f64>,
    /// Dropout rates swept at w = 1 (Zhang Fig. 7); empty: no sweep.
    pub dropout_sweep: Vec<f64>,
    pub progress: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub dataset: String,
    pub w: f64,
    pub method: String,
    pub model: ModelKind,
    pub eta: f64,
    pub dropout: f64,
    pub seed: u64,
    /// The run belongs to a sensitivity sweep, not to the table.
    pub sweep: bool,
    pub ndcg5: f64,
    pub ndcg10: f64,
    pub test_queries: usize,
    /// Mean per-impression click log-likelihood on the evaluation sessions (nats).
    pub click_log_likelihood: f64,
    pub train_sessions: u64,
    pub train_impressions: usize,
    pub epochs: usize,
    pub best_epoch: usize,
    pub stop: ultr_train::fit::StopReason,
    /// The estimated position bias relative to position 1, k = 1..=10 (θ, g or φ by model; the
    /// simulation's examination is log(1/k) in probability).
    pub position_bias: Vec<f64>,
    pub seconds: f64,
    /// Training impressions per second of an epoch (mean over epochs).
    pub impressions_per_second: f64,
}

pub use super::Check;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub runs: Vec<RunResult>,
    pub checks: Vec<Check>,
    pub seconds: f64,
}

/// The simulated log of one (dataset, w, seed): list examples (one span per (query, split)) with
/// labels, the same as one row per span for pointwise models, and the held-out evaluation rows.
pub struct Simulated {
    pub lists: Examples,
    pub rows: Examples,
    pub evaluation: Examples,
    pub train_sessions: u64,
}

/// Stable per-(seed, query, doc) noise n ~ U[0, 4], independent of w, so policies differ only in w.
fn noise(seed: u64, q: usize, d: usize) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((q as u64) << 20) ^ d as u64);
    rng.random_range(0.0..4.0)
}

/// Simulates `train_sessions` training sessions (and the validation/evaluation ones around them).
pub fn simulate(data: &Dataset, w: f64, seed: u64, train_sessions: u64, max_positions: usize, holdout: ultr_core::window::Holdout) -> Simulated {
    let y_max = data.max_label().unwrap_or(1.0).max(1.0) as f64;
    let relevance = |y: f64| EPSILON + (1.0 - EPSILON) * (2f64.powf(y) - 1.0) / (2f64.powf(y_max) - 1.0);
    // Each query's ranking: (doc index, 1-based position), the top `max_positions`.
    let rankings: Vec<Vec<(usize, u32)>> = data
        .queries
        .iter()
        .enumerate()
        .map(|(q, query)| {
            let mut scored: Vec<(f64, f64, usize)> = query
                .docs
                .iter()
                .enumerate()
                .map(|(d, doc)| {
                    let n = noise(seed, q, d);
                    (w * doc.label.unwrap_or(0.0) as f64 + (1.0 - w) * n, n, d)
                })
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
            scored.iter().take(max_positions).enumerate().map(|(i, s)| (s.2, i as u32 + 1)).collect()
        })
        .collect();
    // Sessions: a uniformly drawn query each; the split by the session index's hash.
    // Until exactly `train_sessions` have landed in the training split.
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let mut counts = vec![[0u64; 3]; data.queries.len()];
    let (mut trained_sessions, mut s) = (0, 0u64);
    while trained_sessions < train_sessions {
        let q = rng.random_range(0..data.queries.len());
        let split = holdout.split(ultr_core::window::session_key(&format!("{seed}-{s}")));
        trained_sessions += (split == Split::Training) as u64;
        counts[q][split as usize] += 1;
        s += 1;
    }
    let mut lists = Examples { n_features: data.n_features, ..Examples::default() };
    for query in &data.queries {
        for doc in &query.docs {
            lists.docs.extend_from_slice(&doc.features);
            lists.doc_labels.push((doc.label.unwrap_or(0.0) as f64 / y_max) as f32);
            lists.qd_keys.push((query.query_id.clone(), doc.doc_id.clone()));
        }
    }
    let offsets: Vec<usize> = data
        .queries
        .iter()
        .scan(0, |acc, q| {
            let o = *acc;
            *acc += q.docs.len();
            Some(o)
        })
        .collect();
    for (q, ranking) in rankings.iter().enumerate() {
        for split in Split::ALL {
            let m = counts[q][split as usize];
            if m == 0 {
                continue;
            }
            let start = lists.rows.len();
            for &(d, position) in ranking {
                let y = data.queries[q].docs[d].label.unwrap_or(0.0) as f64;
                let p = relevance(y) / position as f64;
                let clicks = Binomial::new(m, p).expect("valid binomial").sample(&mut rng);
                let doc = (offsets[q] + d) as u32;
                lists.rows.push(Row { doc, qd: doc, position, impressions: m as u32, clicks: clicks as u32, propensity: 1.0 });
            }
            lists.sessions.push(SessionSpan { start, len: lists.rows.len() - start, hash: 0, split: Some(split) });
        }
    }
    let rows = Examples {
        sessions: lists
            .sessions
            .iter()
            .flat_map(|s| (s.start..s.start + s.len).map(move |i| SessionSpan { start: i, len: 1, hash: 0, split: s.split }))
            .collect(),
        ..lists.clone()
    };
    let evaluation = rows.filter_sessions(|s| s.split == Some(Split::Evaluation));
    Simulated { lists, rows, evaluation, train_sessions: trained_sessions }
}

/// The training config of one method.
pub fn train_config(opts: &Options, method: &Method, seed: u64) -> TrainConfig {
    let mut cfg = TrainConfig {
        model: method.model,
        tower: opts.tower,
        max_positions: opts.max_positions,
        max_epochs: opts.max_epochs,
        seed,
        backend: opts.backend,
        ..TrainConfig::paper_replication()
    };
    // Each model reads only its own section, so the method's settings go to both.
    cfg.sections.gradient_reversal.eta = method.eta;
    cfg.sections.gradient_reversal.dropout = method.dropout;
    cfg.sections.observation_dropout.rate = method.dropout;
    cfg
}

/// Scores the test queries' documents with the relevance tower: nDCG@5 and @10 and the queries.
pub fn test_ndcg(trained: &Trained, test: &Dataset, device: &burn::tensor::Device) -> (f64, f64, usize) {
    let (ndcg, n) = test_ndcg_at(trained, test, device, &[5, 10]);
    (ndcg[&5], ndcg[&10], n)
}

/// nDCG of the relevance tower on the test queries at each cutoff, and the queries scored.
pub fn test_ndcg_at(trained: &Trained, test: &Dataset, device: &burn::tensor::Device, cutoffs: &[usize]) -> (BTreeMap<usize, f64>, usize) {
    let mut ex = Examples { n_features: test.n_features, ..Examples::default() };
    let mut labels = HashMap::new();
    for query in &test.queries {
        for doc in &query.docs {
            let i = ex.rows.len() as u32;
            ex.docs.extend_from_slice(&doc.features);
            ex.qd_keys.push((query.query_id.clone(), doc.doc_id.clone()));
            ex.rows.push(Row { doc: i, qd: i, position: 1, impressions: 1, clicks: 0, propensity: 1.0 });
            ex.sessions.push(SessionSpan { start: i as usize, len: 1, hash: 0, split: Some(Split::Evaluation) });
            labels.insert((query.query_id.clone(), doc.doc_id.clone()), doc.label.unwrap_or(0.0) as f64);
        }
    }
    let scores: HashMap<(String, String), f64> =
        trained.relevance_of_rows(&ex, device).into_iter().enumerate().map(|(i, s)| (ex.qd_keys[i].clone(), s as f64)).collect();
    mean_ndcg(&scores, &labels, cutoffs)
}

/// Trains one method on one simulated log and scores it.
pub fn run_one(opts: &Options, data: &DataSpec, sim: &Simulated, w: f64, method: &Method, seed: u64, sweep: bool) -> anyhow::Result<RunResult> {
    let cfg = train_config(opts, method, seed);
    let examples = method.model.input_shape().select(&sim.rows, &sim.lists);
    let (trained, report) = fit(examples, &cfg, None, false)?;
    let device = cfg.backend.device()?;
    let (ndcg5, ndcg10, test_queries) = test_ndcg(&trained, &data.test, &device);
    let ones = vec![1f32; sim.evaluation.rows.len()];
    let click_log_likelihood = -trained.loss(&sim.evaluation, &ones, false, &device);
    let ips = report.epochs.iter().map(|e| e.impressions_per_second).sum::<f64>() / report.epochs.len().max(1) as f64;
    Ok(RunResult {
        dataset: data.name.clone(),
        w,
        method: method.name.clone(),
        model: method.model,
        eta: method.eta,
        dropout: method.dropout,
        seed,
        sweep,
        ndcg5,
        ndcg10,
        test_queries,
        click_log_likelihood,
        train_sessions: sim.train_sessions,
        train_impressions: report.train_impressions,
        epochs: report.epochs.len(),
        best_epoch: report.best_epoch,
        stop: report.stop,
        position_bias: trained.position_bias().into_iter().take(10).collect(),
        seconds: report.seconds,
        impressions_per_second: ips,
    })
}

/// Mean and sample sd.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// The per-seed differences a − b (both runs of a seed share its simulated log and its noise).
fn paired_differences(a: &[(u64, f64)], b: &[(u64, f64)]) -> Vec<f64> {
    a.iter().filter_map(|(s, x)| b.iter().find(|(t, _)| t == s).map(|(_, y)| x - y)).collect()
}

/// The mean of the paired differences a − b and the half-width of its one-sided 95% bound: t at
/// 0.95 with n − 1 degrees of freedom times the standard error (2.92·se at 3 seeds, 2.13·se at 5).
/// None below two seeds.
fn paired_t(a: &[(u64, f64)], b: &[(u64, f64)]) -> Option<(f64, f64)> {
    let diffs = paired_differences(a, b);
    if diffs.len() < 2 {
        return None;
    }
    let (mean, sd) = mean_sd(&diffs);
    let n = diffs.len() as f64;
    Some((mean, ultr_train::uncertainty::student_t_quantile(0.95, n - 1.0) * sd / n.sqrt()))
}

/// a beats b beyond seed noise: a one-sided paired t-test at 5% with its real degrees of freedom,
/// mean(a − b) > t(0.95, n − 1)·se. Returns (holds, mean, t·se); never holds below two seeds.
pub fn beyond_noise(a: &[(u64, f64)], b: &[(u64, f64)]) -> (bool, f64, f64) {
    match paired_t(a, b) {
        Some((mean, bound)) => (mean > bound, mean, bound),
        None => (false, f64::NAN, f64::NAN),
    }
}

/// a is not worse than b by more than `margin`: the one-sided 95% lower bound of mean(a − b) (paired
/// t, n − 1 degrees of freedom) lies above −margin. Returns (holds, mean, t·se); never holds below
/// two seeds. A claim that can fail, where "not worse beyond noise" at three seeds almost cannot.
pub fn not_worse_by(a: &[(u64, f64)], b: &[(u64, f64)], margin: f64) -> (bool, f64, f64) {
    match paired_t(a, b) {
        Some((mean, bound)) => (mean - bound > -margin, mean, bound),
        None => (false, f64::NAN, f64::NAN),
    }
}

/// Zhang's four claims on one dataset's table runs.
pub fn checks(dataset: &str, runs: &[RunResult]) -> Vec<Check> {
    let cell = |method: &str, w: f64| -> Vec<(u64, f64)> {
        runs.iter().filter(|r| r.dataset == dataset && !r.sweep && r.method == method && (r.w - w).abs() < 1e-9).map(|r| (r.seed, r.ndcg5)).collect()
    };
    let has = |w: f64| runs.iter().any(|r| r.dataset == dataset && !r.sweep && (r.w - w).abs() < 1e-9);
    let detail = |(holds, diff, bound): (bool, f64, f64), what: &str| (holds, format!("{what}: mean paired difference {diff:+.4}, t·se {bound:.4}"));
    let mut out = Vec::new();
    let mut push = |claim: u8, statement: &str, (holds, detail): (bool, String)| {
        out.push(Check { dataset: dataset.into(), claim, statement: statement.into(), holds, detail });
    };
    push(1, "PAL degrades as w → 1 relative to Random", detail(beyond_noise(&cell("PAL", 0.0), &cell("PAL", 1.0)), "PAL(Random) − PAL(Oracle)"));
    let mut all = true;
    let mut text = Vec::new();
    for method in ["GradRev", "Drop"] {
        for w in [1.0, 0.8].into_iter().filter(|w| has(*w)) {
            let (holds, diff, se) = beyond_noise(&cell(method, w), &cell("PAL", w));
            all &= holds;
            text.push(format!("{method} − PAL at w = {w}: {diff:+.4} (t·se {se:.4})"));
        }
    }
    push(2, "GradRev and Drop beat PAL at w ∈ {1.0, 0.8} beyond seed noise", (all, text.join("; ")));
    let two_tower = ["PAL", "DLA", "GradRev", "Drop"];
    let means: Vec<(String, f64, f64)> = two_tower
        .iter()
        .map(|m| {
            let (a, b) = mean_sd(&cell(m, 0.0).iter().map(|x| x.1).collect::<Vec<_>>());
            (m.to_string(), a, b)
        })
        .collect();
    let pal = cell("PAL", 0.0);
    let within = two_tower.iter().all(|m| !beyond_noise(&cell(m, 0.0), &pal).0 && !beyond_noise(&pal, &cell(m, 0.0)).0);
    push(
        3,
        "at Random all two-tower methods are within seed noise of PAL",
        (within, means.iter().map(|(m, a, s)| format!("{m} {a:.4} ± {s:.4}")).collect::<Vec<_>>().join(", ")),
    );
    push(
        4,
        "Biased is worse than the two-tower upper bound (PAL at Random)",
        detail(beyond_noise(&cell("PAL", 0.0), &cell("Biased", 0.0)), "PAL(Random) − Biased(Random)"),
    );
    out
}

/// Table 1's shape: rows = policy, columns = method, mean ± sd of nDCG@5 over seeds.
pub fn table_markdown(dataset: &str, runs: &[RunResult], methods: &[Method], policies: &[f64], metric: fn(&RunResult) -> f64) -> String {
    let mut s = format!("| {dataset} | {} |\n|---|{}\n", methods.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(" | "), "---|".repeat(methods.len()));
    for &w in policies {
        let name = POLICIES.iter().find(|p| (p.0 - w).abs() < 1e-9).map_or(format!("w = {w}"), |p| format!("{} (w = {w})", p.1));
        s.push_str(&format!("| {name} |"));
        for m in methods {
            let v: Vec<f64> = runs.iter().filter(|r| r.dataset == dataset && !r.sweep && r.method == m.name && (r.w - w).abs() < 1e-9).map(metric).collect();
            let (mean, sd) = mean_sd(&v);
            s.push_str(&if v.is_empty() { " – |".to_string() } else { format!(" {mean:.4} ± {sd:.4} |") });
        }
        s.push('\n');
    }
    s
}

/// Runs the grid (and the sweeps) with `opts.jobs` runs in parallel, writing results.csv,
/// summary.md, summary.json and ndcg.svg under `opts.out`.
pub fn run(opts: &Options, datasets: &[DataSpec]) -> anyhow::Result<Summary> {
    let started = std::time::Instant::now();
    std::fs::create_dir_all(&opts.out)?;
    let holdout = TrainConfig::default().holdout();
    // Work items: (dataset, w, seed, method, sweep).
    let mut jobs: VecDeque<(usize, f64, u64, Method, bool)> = VecDeque::new();
    for (d, _) in datasets.iter().enumerate() {
        for &seed in &opts.seeds {
            for &w in &opts.policies {
                for m in &opts.methods {
                    jobs.push_back((d, w, seed, m.clone(), false));
                }
            }
            for &eta in &opts.eta_sweep {
                jobs.push_back((d, 1.0, seed, Method { name: format!("GradRev η={eta}"), model: ModelKind::GradientReversal, eta, dropout: 0.0 }, true));
            }
            for &rate in &opts.dropout_sweep {
                jobs.push_back((d, 1.0, seed, Method { name: format!("Drop τ={rate}"), model: ModelKind::ObservationDropout, eta: 0.0, dropout: rate }, true));
            }
        }
    }
    let total = jobs.len();
    let queue = Mutex::new(jobs);
    let results: Mutex<Vec<RunResult>> = Mutex::new(Vec::new());
    let cache: Mutex<BTreeMap<(usize, u64, u64), std::sync::Arc<Simulated>>> = Mutex::new(BTreeMap::new());
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..opts.jobs.max(1) {
            scope.spawn(|| loop {
                let Some((d, w, seed, method, sweep)) = queue.lock().pop_front() else { break };
                let key = (d, w.to_bits(), seed);
                let cached = cache.lock().get(&key).cloned();
                let sim = match cached {
                    Some(s) => s,
                    None => {
                        let s = std::sync::Arc::new(simulate(&datasets[d].train, w, seed, opts.train_sessions, opts.max_positions, holdout));
                        cache.lock().insert(key, s.clone());
                        s
                    }
                };
                match run_one(opts, &datasets[d], &sim, w, &method, seed, sweep) {
                    Ok(r) => {
                        let mut all = results.lock();
                        if opts.progress {
                            eprintln!(
                                "[{}/{total}] {} w={} {} seed {}: nDCG@5 {:.4} @10 {:.4} LL {:.4} (best epoch {} of {}, {:?}, {:.0}s)",
                                all.len() + 1,
                                r.dataset,
                                r.w,
                                r.method,
                                r.seed,
                                r.ndcg5,
                                r.ndcg10,
                                r.click_log_likelihood,
                                r.best_epoch,
                                r.epochs,
                                r.stop,
                                r.seconds
                            );
                        }
                        all.push(r);
                    }
                    Err(e) => {
                        *failure.lock() = Some(e.context(format!("{} w={w} {} seed {seed}", datasets[d].name, method.name)));
                        queue.lock().clear();
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    let mut runs = results.into_inner();
    runs.sort_by(|a, b| {
        (a.dataset.as_str(), a.sweep, a.method.as_str(), b.w.total_cmp(&a.w), a.seed)
            .partial_cmp(&(b.dataset.as_str(), b.sweep, b.method.as_str(), a.w.total_cmp(&b.w), b.seed))
            .expect("ordered")
    });
    let checks: Vec<Check> = datasets.iter().flat_map(|d| checks(&d.name, &runs)).collect();
    let summary = Summary { runs, checks, seconds: started.elapsed().as_secs_f64() };
    write_outputs(opts, datasets, &summary)?;
    Ok(summary)
}

fn write_outputs(opts: &Options, datasets: &[DataSpec], summary: &Summary) -> anyhow::Result<()> {
    let columns = "dataset,w,method,model,eta,dropout,seed,sweep,ndcg5,ndcg10,test_queries,click_log_likelihood,train_sessions,train_impressions,epochs,seconds,impressions_per_second";
    let rows = summary.runs.iter().map(|r| {
        vec![
            r.dataset.to_string(),
            r.w.to_string(),
            r.method.to_string(),
            r.model.name().to_string(),
            r.eta.to_string(),
            r.dropout.to_string(),
            r.seed.to_string(),
            r.sweep.to_string(),
            format!("{:.6}", r.ndcg5),
            format!("{:.6}", r.ndcg10),
            r.test_queries.to_string(),
            format!("{:.6}", r.click_log_likelihood),
            r.train_sessions.to_string(),
            r.train_impressions.to_string(),
            r.epochs.to_string(),
            format!("{:.2}", r.seconds),
            format!("{:.0}", r.impressions_per_second),
        ]
    });
    super::write_csv(&opts.out.join("results.csv"), &super::header(columns), rows)?;
    let mut md = format!(
        "# Zhang et al. 2023 Table 1 on our data\n\n{} training sessions per cell, seeds {:?}, {} tower, top {} positions, at most {} epochs. nDCG@5 of the relevance tower on the test queries' labels, mean ± sd over seeds.\n\n",
        opts.train_sessions, opts.seeds, opts.tower.name(), opts.max_positions, opts.max_epochs
    );
    for d in datasets {
        md.push_str(&format!("## {}: nDCG@5\n\n{}\n", d.name, table_markdown(&d.name, &summary.runs, &opts.methods, &opts.policies, |r| r.ndcg5)));
        md.push_str(&format!("### {}: nDCG@10\n\n{}\n", d.name, table_markdown(&d.name, &summary.runs, &opts.methods, &opts.policies, |r| r.ndcg10)));
        md.push_str(&format!(
            "### {}: click log-likelihood per impression on evaluation sessions\n\n{}\n",
            d.name,
            table_markdown(&d.name, &summary.runs, &opts.methods, &opts.policies, |r| r.click_log_likelihood)
        ));
        let sweeps: Vec<&RunResult> = summary.runs.iter().filter(|r| r.dataset == d.name && r.sweep).collect();
        if !sweeps.is_empty() {
            md.push_str(&format!("### {}: sensitivity at w = 1 (Zhang Figs. 6–7)\n\n| method | nDCG@5 |\n|---|---|\n", d.name));
            let mut names: Vec<&str> = sweeps.iter().map(|r| r.method.as_str()).collect();
            names.dedup();
            for name in names {
                let v: Vec<f64> = sweeps.iter().filter(|r| r.method == name).map(|r| r.ndcg5).collect();
                let (m, s) = mean_sd(&v);
                md.push_str(&format!("| {name} | {m:.4} ± {s:.4} |\n"));
            }
            md.push('\n');
        }
    }
    md.push_str("## Claims\n\n");
    for c in &summary.checks {
        md.push_str(&c.markdown_line());
    }
    md.push_str(&format!("\nWall time {:.0} s.\n", summary.seconds));
    std::fs::write(opts.out.join("summary.md"), md)?;
    std::fs::write(opts.out.join("summary.json"), serde_json::to_string_pretty(summary)?)?;
    std::fs::write(opts.out.join("ndcg.svg"), ndcg_plot(datasets, summary, &opts.methods, &opts.policies))?;
    Ok(())
}

/// nDCG@5 against w, one line per method, one panel per dataset.
fn ndcg_plot(datasets: &[DataSpec], summary: &Summary, methods: &[Method], policies: &[f64]) -> String {
    let panels: Vec<super::plot::Series> = datasets
        .iter()
        .map(|d| super::plot::Series {
            title: format!("{}: nDCG@5 vs w", d.name),
            x: policies.to_vec(),
            lines: methods
                .iter()
                .map(|m| {
                    let ys = policies
                        .iter()
                        .map(|&w| {
                            mean_sd(
                                &summary
                                    .runs
                                    .iter()
                                    .filter(|r| r.dataset == d.name && !r.sweep && r.method == m.name && (r.w - w).abs() < 1e-9)
                                    .map(|r| r.ndcg5)
                                    .collect::<Vec<_>>(),
                            )
                            .0
                        })
                        .collect();
                    (m.name.clone(), ys)
                })
                .collect(),
        })
        .collect();
    super::plot::lines_svg(&panels)
}

/// Loads MQ2008 fold 1 (train S1–S3, test S5) from `dir`.
pub fn mq2008(dir: &Path) -> anyhow::Result<DataSpec> {
    let files: Vec<PathBuf> = (1..=5).map(|i| dir.join(format!("S{i}.txt"))).collect();
    let train = crate::simulate::dataset::load_svmlight(&[&files[0], &files[1], &files[2]])?;
    let test = crate::simulate::dataset::load_svmlight(&[&files[4]])?;
    Ok(DataSpec { name: "MQ2008".into(), train, test })
}

/// Loads LightGBM's rank example (rank.train / rank.test with their .query files) from `dir`.
pub fn lightgbm_rank(dir: &Path) -> anyhow::Result<DataSpec> {
    let train = crate::simulate::dataset::load_lightgbm(&dir.join("rank.train"), &dir.join("rank.train.query"))?;
    let mut test = crate::simulate::dataset::load_lightgbm(&dir.join("rank.test"), &dir.join("rank.test.query"))?;
    // Query ids restart at q0 in each file: keep the test ones apart.
    for q in &mut test.queries {
        q.query_id = format!("test-{}", q.query_id);
    }
    anyhow::ensure!(train.n_features == test.n_features, "rank.train has {} features but rank.test {}", train.n_features, test.n_features);
    Ok(DataSpec { name: "LightGBM rank".into(), train, test })
}
