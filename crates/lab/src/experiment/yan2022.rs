//! `ultr experiment yan2022`: Yan et al. 2022 Table 3 (§4.1, §4.4–4.5) on the LTR data we have
//! (MQ2008 fold 1; LightGBM's rank data, labels 0–4 like Yahoo's). Logging policy: a linear (ridge)
//! ranker fitted on the labels of 1 % of the training queries ranks every training query once
//! (deterministic; the top `max_positions` are shown). Clicks: per session one of RCM (ρ = 0.1),
//! RCTR (0.5·γ_k), DCTR (0.5·ω) and PBM (ω·γ_k) drawn by the mixture ratio, γ_k = 1/k,
//! ω = 0.1 + 0.9(2^y − 1)/(2^y_max − 1) (Eq. 6–9). Sessions are drawn as queries uniformly at random
//! and split by a hash of their index; identical sessions (same query, split and click pattern)
//! become one list with their count — exact for the session-level E-step of MixEM — and pointwise
//! models see one row per (query, split, position). Hyperparameters (T of MixEM, D_emb of EDot and
//! EInter) are chosen per (dataset, mixture) by mean validation nDCG@5 over seeds, as the paper does;
//! the table reports the chosen variant's nDCG@5 on the test queries.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use ndarray::Array2;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::zhang2023::{beyond_noise, mean_sd, test_ndcg, DataSpec};
use crate::simulate::click::{omega, ClickModel as ClickSimulator, ClickModelKind, DocTruth};
use crate::simulate::dataset::Dataset;
use ultr_train::config::{ModelKind, TowerKind, TrainConfig};
use ultr_train::data::{Examples, Row, SessionSpan, Split};
use ultr_train::device::BackendKind;
use ultr_train::fit::fit;

/// Yan Table 1's mixtures, RCM:RCTR:DCTR:PBM.
pub const MIXTURES: [&str; 5] = ["0:0:0:1", "0:1:0:1", "1:0:1:0", "1:1:1:1", "0:1:1:0"];
/// Mixtures whose clicks factorise into E(k)·R(q,d) (Yan Table 1, Eq. 10).
pub const FACTORISABLE: [&str; 3] = ["0:0:0:1", "0:1:0:1", "1:0:1:0"];
/// Table 3's columns.
pub const FAMILIES: [&str; 6] = ["Biased", "REM", "Additive", "EDot", "EInter", "MixEM"];

/// A method of the table with its hyperparameter.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Method {
    /// The column it belongs to (`FAMILIES`).
    pub family: String,
    /// `family` plus its hyperparameter, e.g. `EInter D=8`.
    pub name: String,
    pub model: ModelKind,
    pub dimension: usize,
    pub temperature: f64,
}

impl Method {
    /// Every family; EDot and EInter once per dimension, MixEM once per temperature.
    pub fn grid(families: &[String], dimensions: &[usize], temperatures: &[f64]) -> anyhow::Result<Vec<Method>> {
        let plain = |family: &str, model| Method { family: family.into(), name: family.into(), model, dimension: 0, temperature: 0.0 };
        let mut out = Vec::new();
        for family in families {
            match family.as_str() {
                "Biased" => out.push(plain("Biased", ModelKind::Biased)),
                "REM" => out.push(plain("REM", ModelKind::Rem)),
                "Additive" => out.push(plain("Additive", ModelKind::Additive)),
                "EDot" | "EInter" => {
                    let model = if family == "EDot" { ModelKind::EDot } else { ModelKind::EInter };
                    out.extend(dimensions.iter().map(|&d| Method { name: format!("{family} D={d}"), dimension: d, ..plain(family, model) }));
                }
                "MixEM" => {
                    out.extend(temperatures.iter().map(|&t| Method { name: format!("MixEM T={t}"), temperature: t, ..plain("MixEM", ModelKind::MixEm) }))
                }
                other => anyhow::bail!("unknown method `{other}` (Biased, REM, Additive, EDot, EInter, MixEM)"),
            }
        }
        Ok(out)
    }
}

/// A dataset with validation queries (their labels choose hyperparameters; they get no clicks).
pub struct Data {
    pub spec: DataSpec,
    pub validation: Dataset,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub out: PathBuf,
    /// Sessions whose split is training, per cell.
    pub train_sessions: u64,
    pub seeds: Vec<u64>,
    pub max_epochs: usize,
    pub jobs: usize,
    pub backend: BackendKind,
    pub tower: TowerKind,
    /// The top this many of each ranking are shown.
    pub max_positions: usize,
    /// Share of training queries whose labels fit the logging ranker.
    pub logging_label_fraction: f64,
    pub mixtures: Vec<String>,
    pub methods: Vec<Method>,
    pub progress: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub dataset: String,
    pub mixture: String,
    pub family: String,
    pub method: String,
    pub model: ModelKind,
    pub seed: u64,
    pub ndcg5: f64,
    pub ndcg10: f64,
    pub validation_ndcg5: f64,
    /// nDCG@5 of the logging ranker on the test queries (the same for every method of a cell).
    pub logging_ndcg5: f64,
    /// Mean per-impression click log-likelihood on the evaluation sessions (nats).
    pub click_log_likelihood: f64,
    pub train_sessions: u64,
    /// Distinct (query, click pattern) lists among the training sessions.
    pub train_lists: usize,
    pub train_impressions: usize,
    pub epochs: usize,
    pub best_epoch: usize,
    pub seconds: f64,
    pub impressions_per_second: f64,
    /// MixEM's mixing weights π (RCM, RCTR, DCTR, PBM); empty for other models.
    pub mixing_weights: Vec<f64>,
    /// The model's position effect relative to position 1, k = 1..=10 (`ClickModel::position_bias`;
    /// the simulated examination of RCTR and PBM is log(1/k)).
    pub position_bias: Vec<f64>,
}

pub use super::Check;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub runs: Vec<RunResult>,
    /// (dataset, mixture, family) → the chosen method name.
    pub chosen: Vec<(String, String, String, String)>,
    pub checks: Vec<Check>,
    pub seconds: f64,
}

/// One cell's log: session lists (one per distinct query, split and click pattern, with its
/// count), the same sessions as (query, split, position) rows, and the evaluation rows.
pub struct Simulated {
    pub lists: Examples,
    /// One list per (query, split) with the click counts of all its sessions: exact for a model whose
    /// loss is linear in each item's clicks given the shown list (XPA), and less noisy per step.
    pub query_lists: Examples,
    pub rows: Examples,
    pub evaluation: Examples,
    pub train_sessions: u64,
    pub train_lists: usize,
}

/// The logging ranker (Yan §4.1.1): ridge regression on the labels of `fraction` of the training
/// queries (at least two), chosen by `seed`.
pub struct LoggingRanker {
    /// [intercept, w…].
    weights: ndarray::Array1<f64>,
}

impl LoggingRanker {
    pub fn fit(train: &Dataset, fraction: f64, seed: u64) -> LoggingRanker {
        let n = train.queries.len();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1a22);
        let mut queries: Vec<usize> = (0..n).collect();
        queries.shuffle(&mut rng);
        queries.truncate(((n as f64 * fraction).round() as usize).clamp(2.min(n), n));
        let f = train.n_features;
        let labelled: Vec<&crate::simulate::dataset::Doc> = queries.iter().flat_map(|&q| train.queries[q].docs.iter()).collect();
        let x = Array2::from_shape_fn((labelled.len(), f), |(i, j)| labelled[i].features[j]);
        let y: Vec<f64> = labelled.iter().map(|d| d.label.unwrap_or(0.0) as f64).collect();
        LoggingRanker { weights: crate::simulate::policy::ridge_fit(&x, &y, 1e-3) }
    }

    /// Each query's documents in the ranker's order, best first.
    pub fn rankings(&self, data: &Dataset) -> Vec<Vec<usize>> {
        let w = &self.weights;
        data.queries
            .iter()
            .map(|q| {
                let scores: Vec<f64> =
                    q.docs.iter().map(|d| w[0] + d.features.iter().zip(w.iter().skip(1)).map(|(x, wj)| wj * *x as f64).sum::<f64>()).collect();
                crate::simulate::policy::deterministic_ranking(&scores)
            })
            .collect()
    }

    /// nDCG@5 of the ranker's own order on `data`'s labels.
    pub fn ndcg5(&self, data: &Dataset) -> f64 {
        let mut scores = HashMap::new();
        let mut labels = HashMap::new();
        for (q, ranking) in data.queries.iter().zip(self.rankings(data)) {
            for (rank, &d) in ranking.iter().enumerate() {
                scores.insert((q.query_id.clone(), q.docs[d].doc_id.clone()), -(rank as f64));
                labels.insert((q.query_id.clone(), q.docs[d].doc_id.clone()), q.docs[d].label.unwrap_or(0.0) as f64);
            }
        }
        ultr_train::eval::mean_ndcg(&scores, &labels, &[5]).0[&5]
    }
}

/// Yan's mixture click model (ρ = 0.1, ρ_k = 0.5·γ_k, ρ_qd = 0.5·ω, γ_k = 1/k, ε = 0.1).
pub fn mixture_clicks(mixture: [f64; 4]) -> ClickSimulator {
    ClickSimulator { kind: ClickModelKind::Mixture, eta: 1.0, epsilon: 0.1, dcm_continue: 0.1, mixture }
}

/// Simulates `train_sessions` training sessions (and the validation/evaluation ones around them)
/// under `clicks`, each query shown in its logging ranking's order.
pub fn simulate(
    data: &Dataset,
    rankings: &[Vec<usize>],
    clicks: &ClickSimulator,
    seed: u64,
    train_sessions: u64,
    max_positions: usize,
    holdout: ultr_core::window::Holdout,
) -> Simulated {
    let y_max = data.max_label().unwrap_or(1.0).max(1.0) as f64;
    let shown: Vec<Vec<usize>> = rankings.iter().map(|r| r.iter().copied().take(max_positions.min(64)).collect()).collect();
    let truths: Vec<Vec<DocTruth>> = shown
        .iter()
        .enumerate()
        .map(|(q, docs)| {
            docs.iter()
                .map(|&d| {
                    let y = data.queries[q].docs[d].label.unwrap_or(0.0) as f64;
                    DocTruth { relevance: y, omega: omega(clicks.epsilon, y, y_max) }
                })
                .collect()
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7a22);
    // (query, split, click pattern) → sessions.
    let mut patterns: BTreeMap<(u32, u8, u64), u32> = BTreeMap::new();
    let (mut trained_sessions, mut s) = (0u64, 0u64);
    while trained_sessions < train_sessions {
        let q = rng.random_range(0..data.queries.len());
        let split = holdout.split(ultr_core::window::session_key(&format!("{seed}-{s}")));
        trained_sessions += (split == Split::Training) as u64;
        s += 1;
        let c = clicks.clicks(&truths[q], &mut rng);
        let bits = c.iter().enumerate().fold(0u64, |acc, (i, &clicked)| acc | ((clicked as u64) << i));
        *patterns.entry((q as u32, split as u8, bits)).or_default() += 1;
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
    let mut aggregated: BTreeMap<(u32, u8, u32), (u32, u32, u32)> = BTreeMap::new();
    let mut train_lists = 0;
    for (&(q, split, bits), &m) in &patterns {
        let split_of = Split::ALL[split as usize];
        train_lists += (split_of == Split::Training) as usize;
        let start = lists.rows.len();
        for (i, &d) in shown[q as usize].iter().enumerate() {
            let doc = (offsets[q as usize] + d) as u32;
            let clicked = ((bits >> i) & 1) as u32;
            lists.rows.push(Row { doc, qd: doc, position: i as u32 + 1, impressions: m, clicks: m * clicked, propensity: 1.0 });
            let e = aggregated.entry((q, split, i as u32 + 1)).or_insert((doc, 0, 0));
            e.1 += m;
            e.2 += m * clicked;
        }
        lists.sessions.push(SessionSpan { start, len: lists.rows.len() - start, hash: 0, split: Some(split_of) });
    }
    let mut rows = Examples { rows: Vec::new(), sessions: Vec::new(), ..lists.clone() };
    let mut query_lists = Examples { rows: Vec::new(), sessions: Vec::new(), ..lists.clone() };
    let mut open: Option<(u32, u8)> = None;
    for (&(q, split, position), &(doc, impressions, clicks)) in &aggregated {
        rows.sessions.push(SessionSpan { start: rows.rows.len(), len: 1, hash: 0, split: Some(Split::ALL[split as usize]) });
        rows.rows.push(Row { doc, qd: doc, position, impressions, clicks, propensity: 1.0 });
        if open != Some((q, split)) {
            open = Some((q, split));
            query_lists.sessions.push(SessionSpan { start: query_lists.rows.len(), len: 0, hash: 0, split: Some(Split::ALL[split as usize]) });
        }
        query_lists.rows.push(Row { doc, qd: doc, position, impressions, clicks, propensity: 1.0 });
        query_lists.sessions.last_mut().expect("opened").len += 1;
    }
    let evaluation = rows.filter_sessions(|s| s.split == Some(Split::Evaluation));
    Simulated { lists, query_lists, rows, evaluation, train_sessions: trained_sessions, train_lists }
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
    if method.dimension > 0 {
        cfg.sections.embedding_model.dimension = method.dimension;
    }
    if method.temperature > 0.0 {
        cfg.sections.mixem.temperature = method.temperature;
    }
    // Yan's E-step: p(α|s) ∝ exp(−ℓ_α(s)/T), no mixing prior.
    cfg.sections.mixem.learn_prior = false;
    cfg
}

/// Trains one method on one simulated log and scores it.
#[allow(clippy::too_many_arguments, reason = "one run of the grid: each argument is one of its axes or a shared input")]
pub fn run_one(opts: &Options, data: &Data, sim: &Simulated, mixture: &str, method: &Method, seed: u64, logging_ndcg5: f64) -> anyhow::Result<RunResult> {
    let cfg = train_config(opts, method, seed);
    cfg.validate().map_err(|e| anyhow::anyhow!(e))?;
    let examples = method.model.input_shape().select(&sim.rows, &sim.lists);
    let (trained, report) = fit(examples, &cfg, None, false)?;
    let device = cfg.backend.device()?;
    let (ndcg5, ndcg10, _) = test_ndcg(&trained, &data.spec.test, &device);
    let (validation_ndcg5, _, _) = test_ndcg(&trained, &data.validation, &device);
    let ones = vec![1f32; sim.evaluation.rows.len()];
    let click_log_likelihood = -trained.loss(&sim.evaluation, &ones, false, &device);
    let ips = report.epochs.iter().map(|e| e.impressions_per_second).sum::<f64>() / report.epochs.len().max(1) as f64;
    let mixing_weights = match &trained.model {
        ultr_train::models::AnyModel::MixEm(m) => m.mixing_weights(),
        _ => Vec::new(),
    };
    Ok(RunResult {
        dataset: data.spec.name.clone(),
        mixture: mixture.into(),
        family: method.family.clone(),
        method: method.name.clone(),
        model: method.model,
        seed,
        ndcg5,
        ndcg10,
        validation_ndcg5,
        logging_ndcg5,
        click_log_likelihood,
        train_sessions: sim.train_sessions,
        train_lists: sim.train_lists,
        train_impressions: report.train_impressions,
        epochs: report.epochs.len(),
        best_epoch: report.best_epoch,
        seconds: report.seconds,
        impressions_per_second: ips,
        mixing_weights,
        position_bias: trained.position_bias().into_iter().take(10).collect(),
    })
}

/// Per (dataset, mixture, family): the method with the best mean validation nDCG@5 over seeds.
pub fn choose(runs: &[RunResult]) -> Vec<(String, String, String, String)> {
    let mut by: BTreeMap<(String, String, String), BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for r in runs {
        by.entry((r.dataset.clone(), r.mixture.clone(), r.family.clone())).or_default().entry(r.method.clone()).or_default().push(r.validation_ndcg5);
    }
    by.into_iter()
        .map(|((d, m, f), methods)| {
            let best = methods.into_iter().map(|(name, v)| (mean_sd(&v).0, name)).max_by(|a, b| a.0.total_cmp(&b.0)).map(|x| x.1).unwrap_or_default();
            (d, m, f, best)
        })
        .collect()
}

/// The chosen method's (seed, test nDCG@5) of a cell.
fn cell(runs: &[RunResult], chosen: &[(String, String, String, String)], dataset: &str, mixture: &str, family: &str) -> Vec<(u64, f64)> {
    let Some(name) = chosen.iter().find(|c| c.0 == dataset && c.1 == mixture && c.2 == family).map(|c| c.3.clone()) else { return Vec::new() };
    runs.iter().filter(|r| r.dataset == dataset && r.mixture == mixture && r.method == name).map(|r| (r.seed, r.ndcg5)).collect()
}

/// Yan's claims on one dataset.
pub fn checks(dataset: &str, runs: &[RunResult], chosen: &[(String, String, String, String)], mixtures: &[String]) -> Vec<Check> {
    let c = |m: &str, f: &str| cell(runs, chosen, dataset, m, f);
    let has = |m: &str| mixtures.iter().any(|x| x == m);
    let mut out = Vec::new();
    let mut push = |claim: u8, statement: &str, holds: bool, detail: String| {
        out.push(Check { dataset: dataset.into(), claim, statement: statement.into(), holds, detail })
    };
    // 1. Additive ≈ REM where clicks factorise: neither beats the other beyond noise.
    let mut holds = true;
    let mut text = Vec::new();
    for m in FACTORISABLE.iter().filter(|m| has(m)) {
        let (a, diff, se) = beyond_noise(&c(m, "Additive"), &c(m, "REM"));
        let (b, _, _) = beyond_noise(&c(m, "REM"), &c(m, "Additive"));
        holds &= !a && !b;
        text.push(format!("{m}: Additive − REM {diff:+.4} (t·se {se:.4})"));
    }
    push(1, "Additive ≈ REM on the factorisable mixtures", holds, text.join("; "));
    // 2. On 0:1:1:0 MixEM and EInter beat Additive beyond noise.
    if has("0:1:1:0") {
        let mut holds = true;
        let mut text = Vec::new();
        for f in ["MixEM", "EInter"] {
            let (h, diff, se) = beyond_noise(&c("0:1:1:0", f), &c("0:1:1:0", "Additive"));
            holds &= h;
            text.push(format!("{f} − Additive {diff:+.4} (t·se {se:.4})"));
        }
        push(2, "on 0:1:1:0 MixEM and EInter beat Additive beyond seed noise", holds, text.join("; "));
    }
    // 3. EInter ≥ EDot in most rows (means).
    let rows: Vec<(String, f64)> = mixtures
        .iter()
        .map(|m| {
            let mean = |f: &str| mean_sd(&c(m, f).iter().map(|x| x.1).collect::<Vec<_>>()).0;
            (m.clone(), mean("EInter") - mean("EDot"))
        })
        .collect();
    let wins = rows.iter().filter(|r| r.1 >= 0.0).count();
    push(
        3,
        "EInter ≥ EDot in most rows",
        2 * wins > rows.len(),
        format!("EInter − EDot: {}", rows.iter().map(|(m, d)| format!("{m} {d:+.4}")).collect::<Vec<_>>().join(", ")),
    );
    // 4. Biased below Additive except 1:0:1:0 (no position bias there).
    let mut holds = true;
    let mut text = Vec::new();
    for m in mixtures.iter().filter(|m| m.as_str() != "1:0:1:0") {
        let (h, diff, se) = beyond_noise(&c(m, "Additive"), &c(m, "Biased"));
        holds &= h;
        text.push(format!("{m}: Additive − Biased {diff:+.4} (t·se {se:.4})"));
    }
    push(4, "Biased is below Additive except on 1:0:1:0", holds, text.join("; "));
    out
}

/// Runs every (dataset, mixture, seed) cell with `opts.jobs` cells in parallel (each cell's log is
/// simulated once and dropped after its methods ran), writing results.csv, summary.md, summary.json.
pub fn run(opts: &Options, datasets: &[Data]) -> anyhow::Result<Summary> {
    let started = std::time::Instant::now();
    std::fs::create_dir_all(&opts.out)?;
    let holdout = TrainConfig::default().holdout();
    let mut cells: Vec<(usize, String, u64)> = Vec::new();
    for (d, _) in datasets.iter().enumerate() {
        for mixture in &opts.mixtures {
            for &seed in &opts.seeds {
                cells.push((d, mixture.clone(), seed));
            }
        }
    }
    let total = cells.len() * opts.methods.len();
    let work = |(d, mixture, seed): (usize, String, u64), emit: &dyn Fn(RunResult)| -> anyhow::Result<()> {
        let data = &datasets[d];
        let weights = crate::simulate::click::ClickModel::parse_mixture(&mixture)?;
        let ranker = LoggingRanker::fit(&data.spec.train, opts.logging_label_fraction, seed);
        let logging = ranker.ndcg5(&data.spec.test);
        let sim =
            simulate(&data.spec.train, &ranker.rankings(&data.spec.train), &mixture_clicks(weights), seed, opts.train_sessions, opts.max_positions, holdout);
        for method in &opts.methods {
            emit(
                run_one(opts, data, &sim, &mixture, method, seed, logging)
                    .map_err(|e| e.context(format!("{} {mixture} {} seed {seed}", data.spec.name, method.name)))?,
            );
        }
        Ok(())
    };
    let progress = |n: usize, r: &RunResult| {
        if opts.progress {
            eprintln!(
                "[{n}/{total}] {} {} {} seed {}: nDCG@5 {:.4} (validation {:.4}, logging {:.4}) LL {:.4} (best epoch {} of {}, {:.0}s)",
                r.dataset, r.mixture, r.method, r.seed, r.ndcg5, r.validation_ndcg5, r.logging_ndcg5, r.click_log_likelihood, r.best_epoch, r.epochs, r.seconds
            );
        }
    };
    let mut runs = super::run_cells(cells, opts.jobs, work, progress)?;
    runs.sort_by(|a, b| {
        (a.dataset.as_str(), a.mixture.as_str(), a.method.as_str(), a.seed).cmp(&(b.dataset.as_str(), b.mixture.as_str(), b.method.as_str(), b.seed))
    });
    let chosen = choose(&runs);
    let checks: Vec<Check> = datasets.iter().flat_map(|d| checks(&d.spec.name, &runs, &chosen, &opts.mixtures)).collect();
    let summary = Summary { runs, chosen, checks, seconds: started.elapsed().as_secs_f64() };
    write_outputs(opts, datasets, &summary)?;
    Ok(summary)
}

/// Table 3's shape: rows = mixture, columns = family, the chosen variant's mean ± sd over seeds.
pub fn table_markdown(dataset: &str, summary: &Summary, opts: &Options, metric: fn(&RunResult) -> f64) -> String {
    let families: Vec<&str> = FAMILIES.iter().copied().filter(|f| opts.methods.iter().any(|m| m.family == *f)).collect();
    let mut s = format!("| {dataset} | {} |\n|---|{}\n", families.join(" | "), "---|".repeat(families.len()));
    for mixture in &opts.mixtures {
        s.push_str(&format!("| {mixture} |"));
        for f in &families {
            let name = summary.chosen.iter().find(|c| c.0 == dataset && &c.1 == mixture && c.2 == *f).map(|c| c.3.clone()).unwrap_or_default();
            let v: Vec<f64> = summary.runs.iter().filter(|r| r.dataset == dataset && &r.mixture == mixture && r.method == name).map(metric).collect();
            let (mean, sd) = mean_sd(&v);
            let tag = if name.as_str() != *f { format!(" ({})", name.trim_start_matches(f).trim()) } else { String::new() };
            s.push_str(&if v.is_empty() { " – |".to_string() } else { format!(" {mean:.4} ± {sd:.4}{tag} |") });
        }
        s.push('\n');
    }
    s
}

fn write_outputs(opts: &Options, datasets: &[Data], summary: &Summary) -> anyhow::Result<()> {
    let columns = "dataset,mixture,family,method,model,seed,ndcg5,ndcg10,validation_ndcg5,logging_ndcg5,click_log_likelihood,train_sessions,train_lists,train_impressions,epochs,best_epoch,seconds,impressions_per_second,mixing_weights";
    let rows = summary.runs.iter().map(|r| {
        let f = |v: f64| format!("{v:.6}");
        vec![
            r.dataset.to_string(),
            r.mixture.to_string(),
            r.family.to_string(),
            r.method.to_string(),
            r.model.name().to_string(),
            r.seed.to_string(),
            f(r.ndcg5),
            f(r.ndcg10),
            f(r.validation_ndcg5),
            f(r.logging_ndcg5),
            f(r.click_log_likelihood),
            r.train_sessions.to_string(),
            r.train_lists.to_string(),
            r.train_impressions.to_string(),
            r.epochs.to_string(),
            r.best_epoch.to_string(),
            format!("{:.2}", r.seconds),
            format!("{:.0}", r.impressions_per_second),
            r.mixing_weights.iter().map(|w| format!("{w:.3}")).collect::<Vec<_>>().join(":"),
        ]
    });
    super::write_csv(&opts.out.join("results.csv"), &super::header(columns), rows)?;
    let mut md = format!(
        "# Yan et al. 2022 Table 3 on our data\n\n{} training sessions per cell, seeds {:?}, {} tower, top {} positions shown, at most {} epochs; logging ranker fitted on {}% of the training queries' labels. nDCG@5 of the serving relevance on the test queries' labels, mean ± sd over seeds, for the variant with the best mean validation nDCG@5 (in brackets).\n\n",
        opts.train_sessions, opts.seeds, opts.tower.name(), opts.max_positions, opts.max_epochs, opts.logging_label_fraction * 100.0
    );
    for d in datasets {
        let name = &d.spec.name;
        let logging: Vec<f64> = summary.runs.iter().filter(|r| &r.dataset == name && r.family == "Biased").map(|r| r.logging_ndcg5).collect();
        md.push_str(&format!(
            "## {name}: nDCG@5 (the logging ranker itself: {:.4})\n\n{}\n",
            mean_sd(&logging).0,
            table_markdown(name, summary, opts, |r| r.ndcg5)
        ));
        md.push_str(&format!("### {name}: nDCG@10\n\n{}\n", table_markdown(name, summary, opts, |r| r.ndcg10)));
        md.push_str(&format!(
            "### {name}: click log-likelihood per impression on evaluation sessions\n\n{}\n",
            table_markdown(name, summary, opts, |r| r.click_log_likelihood)
        ));
        let mix: Vec<&RunResult> = summary.runs.iter().filter(|r| &r.dataset == name && !r.mixing_weights.is_empty()).collect();
        if !mix.is_empty() {
            md.push_str(&format!(
                "### {name}: MixEM's learnt mixing weights (RCM:RCTR:DCTR:PBM, mean over seeds)\n\n| mixture | method | π |\n|---|---|---|\n"
            ));
            let mut keys: Vec<(&str, &str)> = mix.iter().map(|r| (r.mixture.as_str(), r.method.as_str())).collect();
            keys.dedup();
            for (m, method) in keys {
                let ws: Vec<&RunResult> = mix.iter().copied().filter(|r| r.mixture == m && r.method == method).collect();
                let mean: Vec<String> = (0..4).map(|i| format!("{:.2}", ws.iter().map(|r| r.mixing_weights[i]).sum::<f64>() / ws.len() as f64)).collect();
                md.push_str(&format!("| {m} | {method} | {} |\n", mean.join(":")));
            }
            md.push('\n');
        }
    }
    md.push_str("## Training throughput (impressions/s per epoch, mean over runs)\n\n| method | impressions/s |\n|---|---|\n");
    let mut methods: Vec<&str> = summary.runs.iter().map(|r| r.method.as_str()).collect();
    methods.sort();
    methods.dedup();
    for m in methods {
        let v: Vec<f64> = summary.runs.iter().filter(|r| r.method == m).map(|r| r.impressions_per_second).collect();
        md.push_str(&format!("| {m} | {:.0} |\n", mean_sd(&v).0));
    }
    md.push_str("\n## Claims\n\n");
    for c in &summary.checks {
        md.push_str(&c.markdown_line());
    }
    md.push_str(&format!("\nWall time {:.0} s.\n", summary.seconds));
    std::fs::write(opts.out.join("summary.md"), md)?;
    std::fs::write(opts.out.join("summary.json"), serde_json::to_string_pretty(summary)?)?;
    Ok(())
}

/// MQ2008 fold 1: train S1–S3, validation S4, test S5.
pub fn mq2008(dir: &Path) -> anyhow::Result<Data> {
    let spec = super::zhang2023::mq2008(dir)?;
    let validation = crate::simulate::dataset::load_svmlight(&[&dir.join("S4.txt")])?;
    Ok(Data { spec, validation })
}

/// LightGBM's rank data: every fifth training query is held out as validation (no clicks).
pub fn lightgbm_rank(dir: &Path) -> anyhow::Result<Data> {
    let mut spec = super::zhang2023::lightgbm_rank(dir)?;
    let all = std::mem::take(&mut spec.train.queries);
    let mut validation = spec.train.clone();
    for (i, q) in all.into_iter().enumerate() {
        if i % 5 == 4 {
            validation.queries.push(q);
        } else {
            spec.train.queries.push(q);
        }
    }
    Ok(Data { spec, validation })
}
