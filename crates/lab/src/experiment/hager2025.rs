//! `ultr experiment hager2025`: Hager et al. 2025 §8 on MQ2008 through the real pipeline (simulator →
//! windows → state → training), over seeds, with a CSV/Markdown table, an SVG plot and the four
//! claims checked: features identify well-specified models without swaps; embeddings need swaps;
//! the logging policy amplifies misspecification; IPS (Eq. 22) reweights to uniform exposure, so with
//! it θ no longer depends on the policy, and at τ = 0 (π = 1 everywhere) it can do nothing.

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::simulate::relevance::RelevanceKind;
use crate::simulate::{labels_from_truth, truth_theta};
use crate::simulate::{SimConfig, Simulator};
use ultr_train::config::{TowerKind, TrainConfig};
use ultr_train::data::{split_of, Examples, Split};
use ultr_train::device::BackendKind;
use ultr_train::eval::{bias_rmse, mean_ndcg, Labels};
use ultr_train::fit::fit;

/// One cell of the experiment grid.
#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    pub name: String,
    pub claim: u8,
    pub relevance: RelevanceKind,
    pub tower: TowerKind,
    pub feature_limit: Option<usize>,
    pub tau: f64,
    pub ips: bool,
}

/// The grid's policy strengths by default: no swaps, two partial randomisations, uniform.
pub const TAUS: [f64; 4] = [0.0, 0.333, 0.666, 1.0];

/// The grid: claims 1–4 of the issue (Hager Figs. 2–4), with the policy strengths `taus` for the claim-3 and claim-4 cells (the
/// embedding cells of claim 2 are at τ = 0 and 1 always).
pub fn settings(taus: &[f64]) -> Vec<Setting> {
    let s = |name: &str, claim, relevance, tower, feature_limit, tau, ips| Setting { name: name.into(), claim, relevance, tower, feature_limit, tau, ips };
    let mut out = vec![
        s("well-specified linear", 1, RelevanceKind::Linear, TowerKind::Linear, None, 0.0, false),
        s("well-specified mlp", 1, RelevanceKind::Mlp, TowerKind::Mlp, None, 0.0, false),
        s("embedding", 2, RelevanceKind::Linear, TowerKind::Embedding, None, 0.0, false),
        s("embedding", 2, RelevanceKind::Linear, TowerKind::Embedding, None, 1.0, false),
    ];
    for (name, relevance, limit) in
        [("linear tower on mlp relevance", RelevanceKind::Mlp, None), ("omitted features (30 of 46)", RelevanceKind::Linear, Some(30))]
    {
        for &tau in taus {
            out.push(s(name, 3, relevance, TowerKind::Linear, limit, tau, false));
            if tau < 1.0 {
                out.push(s(name, 4, relevance, TowerKind::Linear, limit, tau, true));
            }
        }
    }
    out
}

#[derive(Debug, Clone)]
pub struct Options {
    pub out: PathBuf,
    /// SVMlight files (MQ2008 S1–S5).
    pub data: Vec<PathBuf>,
    /// Training sessions per run (the stream has this / (1 − validation share) sessions).
    pub train_sessions: u64,
    pub seeds: Vec<u64>,
    /// Policy strengths of the misspecified cells; must hold 0 and 1 (claims 3 and 4 compare
    /// against them). [`TAUS`] by default.
    pub taus: Vec<f64>,
    pub max_epochs: usize,
    pub jobs: usize,
    pub backend: BackendKind,
    /// Positions the bias RMSE covers.
    pub positions: usize,
    pub progress: bool,
    /// Skip the training runs; compute only the population optimum of the linear-tower cells.
    pub population_only: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub setting: Setting,
    pub seed: u64,
    pub rmse: f64,
    pub ndcg10: f64,
    pub theta: Vec<f64>,
    pub epochs: usize,
    pub seconds: f64,
    pub train_impressions: usize,
    pub impressions_per_second: f64,
    pub ess_fraction: f64,
    pub clipped_fraction: f64,
    pub ips_note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub claim: u8,
    pub statement: String,
    pub holds: bool,
    pub detail: String,
}

/// The infinite-session optimum of one linear-tower cell (see `population`): what its training runs
/// converge to, free of finite-sample noise.
#[derive(Debug, Clone, Serialize)]
pub struct PopulationResult {
    pub name: String,
    pub alpha: f64,
    pub tau: f64,
    pub ips: bool,
    pub seed: u64,
    pub rmse: f64,
    pub theta: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub runs: Vec<RunResult>,
    pub population: Vec<PopulationResult>,
    pub checks: Vec<Check>,
    pub truth: Vec<f64>,
    pub seconds: f64,
}

/// Simulator config for one stream.
fn sim_config(opts: &Options, relevance: RelevanceKind, tau: f64, seed: u64, held_out_fraction: f64) -> SimConfig {
    let mut c = SimConfig { data: opts.data.clone(), relevance, seed, ..SimConfig::default() };
    c.policy.tau = tau;
    c.policy.alpha = 1.0;
    c.sessions = (opts.train_sessions as f64 / (1.0 - held_out_fraction)).ceil() as u64;
    c
}

/// Streams one simulated log through the pipeline into a state directory and loads its examples.
fn stream(opts: &Options, sim: SimConfig, dir: &Path) -> anyhow::Result<(Examples, Labels, Vec<f64>)> {
    let (ex, truth) = super::examples_through_pipeline(sim, dir, opts.positions.max(50), &Default::default())?;
    Ok((ex, labels_from_truth(&truth), truth_theta(&truth)))
}

fn train_config(opts: &Options, s: &Setting, seed: u64) -> TrainConfig {
    let mut t = TrainConfig {
        tower: s.tower,
        feature_limit: s.feature_limit,
        seed,
        max_epochs: opts.max_epochs,
        backend: opts.backend,
        ..TrainConfig::paper_replication()
    };
    t.ips.enabled = s.ips;
    t
}

fn one_run(opts: &Options, s: &Setting, seed: u64, data: &(Examples, Labels, Vec<f64>)) -> anyhow::Result<RunResult> {
    let (ex, labels, truth) = data;
    let cfg = train_config(opts, s, seed);
    let (trained, report) = fit(ex, &cfg, None, false)?;
    let theta = trained.position_bias();
    let device = cfg.backend.device()?;
    let val = ex.filter_sessions(|span| split_of(span, cfg.holdout()) == Split::Evaluation);
    let rel = trained.relevance_of_rows(&val, &device);
    let mut scores = std::collections::HashMap::new();
    for (r, v) in val.rows.iter().zip(rel) {
        scores.entry(val.qd_keys[r.qd as usize].clone()).or_insert(v as f64);
    }
    let (ndcg, _) = mean_ndcg(&scores, labels, &[10]);
    let k = opts.positions.min(ex.max_position() as usize);
    Ok(RunResult {
        setting: s.clone(),
        seed,
        rmse: bias_rmse(&theta, truth, k),
        ndcg10: ndcg.get(&10).copied().unwrap_or(f64::NAN),
        theta: theta.into_iter().take(k).collect(),
        epochs: report.epochs.len(),
        seconds: report.seconds,
        train_impressions: report.train_impressions,
        impressions_per_second: report.epochs.iter().map(|e| e.impressions_per_second).sum::<f64>() / report.epochs.len().max(1) as f64,
        ess_fraction: report.weights.effective_sample_fraction,
        clipped_fraction: report.weights.clipped_fraction,
        ips_note: if s.ips { report.weights.note.clone() } else { None },
    })
}

/// The linear-tower cells at the population level, for the grid's policy (α = 1) and for the
/// inverse policy (α = −1, Hager Fig. 6), where the policy pushes θ the other way.
fn population_grid(opts: &Options) -> anyhow::Result<Vec<PopulationResult>> {
    let cells = [
        ("well-specified linear", RelevanceKind::Linear, None),
        ("linear tower on mlp relevance", RelevanceKind::Mlp, None),
        ("omitted features (30 of 46)", RelevanceKind::Linear, Some(30)),
    ];
    let ips_clip = TrainConfig::default().ips.max_weight;
    let mut jobs = Vec::new();
    for &seed in &opts.seeds {
        for alpha in [1.0, -1.0] {
            for relevance in [RelevanceKind::Linear, RelevanceKind::Mlp] {
                jobs.push((seed, alpha, relevance));
            }
        }
    }
    let per_job = parallel_map(jobs, opts.jobs, |(seed, alpha, relevance)| {
        let one = || -> anyhow::Result<Vec<PopulationResult>> {
            let mut sim = sim_config(opts, relevance, 0.0, seed, 0.0);
            sim.policy.alpha = alpha;
            let sim = Simulator::new(sim)?;
            let truth = truth_theta(sim.truth());
            let mut out = Vec::new();
            for (name, _, feature_limit) in cells.iter().filter(|c| c.1 == relevance) {
                for &tau in &opts.taus {
                    for ips in [false, true] {
                        if ips && tau == 1.0 {
                            continue;
                        }
                        let spec = super::population::PopulationSpec { tau, feature_limit: *feature_limit, ips, ips_clip };
                        let fit = super::population::fit_linear(&sim, spec)?;
                        let k = opts.positions.min(fit.theta.len());
                        out.push(PopulationResult {
                            name: name.to_string(),
                            alpha,
                            tau,
                            ips,
                            seed,
                            rmse: bias_rmse(&fit.theta, &truth, k),
                            theta: fit.theta.into_iter().take(k).collect(),
                        });
                    }
                }
            }
            Ok(out)
        };
        let r = one();
        if opts.progress {
            eprintln!("  population optimum, {relevance:?} relevance, α = {alpha}, seed {seed}: {}", if r.is_ok() { "done" } else { "failed" });
        }
        r
    });
    let mut out: Vec<PopulationResult> = per_job.into_iter().collect::<anyhow::Result<Vec<_>>>()?.into_iter().flatten().collect();
    out.sort_by(|a, b| {
        (cells.iter().position(|c| c.0 == a.name), -a.alpha, a.tau, a.ips, a.seed)
            .partial_cmp(&(cells.iter().position(|c| c.0 == b.name), -b.alpha, b.tau, b.ips, b.seed))
            .expect("finite")
    });
    Ok(out)
}

/// Mean population RMSE over seeds of one cell.
fn population_rmse(pop: &[PopulationResult], name: &str, alpha: f64, tau: f64, ips: bool) -> Option<f64> {
    let v: Vec<f64> = pop.iter().filter(|p| p.name == name && p.alpha == alpha && p.tau == tau && p.ips == ips).map(|p| p.rmse).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn key(relevance: RelevanceKind, tau: f64, seed: u64) -> String {
    format!("{relevance:?}-tau{tau}-seed{seed}").to_lowercase()
}

/// Runs the grid and writes `results.csv`, `summary.md`, `theta.svg` and `summary.json` under `opts.out`.
pub fn run(opts: &Options) -> anyhow::Result<Summary> {
    let started = std::time::Instant::now();
    anyhow::ensure!(
        opts.taus.contains(&0.0) && opts.taus.contains(&1.0) && opts.taus.iter().all(|t| (0.0..=1.0).contains(t)),
        "the grid's policy strengths {:?} must lie in [0, 1] and hold 0 and 1",
        opts.taus
    );
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    if opts.progress {
        eprintln!("population optimum of the linear-tower cells ...");
    }
    let population = population_grid(opts)?;
    if opts.population_only {
        let truth = (1..=opts.positions).map(crate::simulate::click::theta).collect();
        let summary = Summary { runs: Vec::new(), population, checks: Vec::new(), truth, seconds: started.elapsed().as_secs_f64() };
        write_outputs(opts, &summary)?;
        return Ok(summary);
    }
    let grid = settings(&opts.taus);
    let defaults = TrainConfig::default();
    let held_out_fraction = defaults.validation_fraction + defaults.evaluation_fraction;
    let mut streams: BTreeMap<String, (Examples, Labels, Vec<f64>)> = BTreeMap::new();
    for seed in &opts.seeds {
        for s in &grid {
            if let std::collections::btree_map::Entry::Vacant(slot) = streams.entry(key(s.relevance, s.tau, *seed)) {
                let k = slot.key().clone();
                if opts.progress {
                    eprintln!("simulating {k} ...");
                }
                let sim = sim_config(opts, s.relevance, s.tau, *seed, held_out_fraction);
                slot.insert(stream(opts, sim, &opts.out.join("scratch").join(&k))?);
            }
        }
    }
    std::fs::remove_dir_all(opts.out.join("scratch")).ok();

    let jobs: Vec<(Setting, u64)> = opts.seeds.iter().flat_map(|seed| grid.iter().map(move |s| (s.clone(), *seed))).collect();
    let results = parallel_map(jobs, opts.jobs, |(s, seed)| {
        let r = one_run(opts, &s, seed, &streams[&key(s.relevance, s.tau, seed)]);
        if opts.progress {
            match &r {
                Ok(r) => eprintln!("  {} τ={} ips={} seed {}: RMSE {:.4} ({} epochs, {:.0}s)", s.name, s.tau, s.ips, seed, r.rmse, r.epochs, r.seconds),
                Err(e) => eprintln!("  {} τ={} seed {}: {e:#}", s.name, s.tau, seed),
            }
        }
        r
    });
    let runs = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let truth = streams.values().next().map(|d| d.2.iter().take(opts.positions).copied().collect()).unwrap_or_default();
    let summary = Summary { checks: checks(&runs, &population), runs, population, truth, seconds: started.elapsed().as_secs_f64() };
    write_outputs(opts, &summary)?;
    Ok(summary)
}

/// Runs `work` on every job with `threads` workers (the runs are independent); results in job order.
fn parallel_map<J: Send, R: Send>(jobs: Vec<J>, threads: usize, work: impl Fn(J) -> R + Sync) -> Vec<R> {
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<VecDeque<_>>());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let Some((i, job)) = queue.lock().pop_front() else { break };
                let r = work(job);
                results.lock().push((i, r));
            });
        }
    });
    let mut results = results.into_inner();
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Mean RMSE over seeds of the runs matching `pred`.
fn mean_rmse(runs: &[RunResult], pred: impl Fn(&Setting) -> bool) -> f64 {
    let v: Vec<f64> = runs.iter().filter(|r| pred(&r.setting)).map(|r| r.rmse).collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Mean θ vector over seeds of the runs matching `pred`.
fn mean_theta(runs: &[RunResult], pred: impl Fn(&Setting) -> bool) -> Vec<f64> {
    let chosen: Vec<&RunResult> = runs.iter().filter(|r| pred(&r.setting)).collect();
    let k = chosen.iter().map(|r| r.theta.len()).min().unwrap_or(0);
    (0..k).map(|j| chosen.iter().map(|r| r.theta[j]).sum::<f64>() / chosen.len() as f64).collect()
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

fn checks(runs: &[RunResult], population: &[PopulationResult]) -> Vec<Check> {
    let mut out = Vec::new();
    let mut check = |claim, statement: String, holds: bool, detail: String| out.push(Check { claim, statement, holds, detail });
    // The partial randomisations on the grid (claim 4 is checked at each).
    let mut partial: Vec<f64> = runs.iter().map(|r| r.setting.tau).filter(|t| *t > 0.0 && *t < 1.0).collect();
    partial.sort_by(f64::total_cmp);
    partial.dedup();
    for name in ["well-specified linear", "well-specified mlp"] {
        let r = mean_rmse(runs, |s| s.name == name);
        check(1, format!("{name}, τ = 0: bias RMSE ≤ 0.05"), r <= 0.05, format!("{r:.4}"));
    }
    let e0 = mean_rmse(runs, |s| s.tower.pair_embedding() && s.tau == 0.0);
    let e1 = mean_rmse(runs, |s| s.tower.pair_embedding() && s.tau == 1.0);
    check(2, "embedding tower, τ = 0: RMSE ≥ 0.3 (unidentified)".into(), e0 >= 0.3, format!("{e0:.4}"));
    check(2, "embedding tower, τ = 1: RMSE ≤ 0.05".into(), e1 <= 0.05, format!("{e1:.4}"));
    for name in ["linear tower on mlp relevance", "omitted features (30 of 46)"] {
        let at = |tau: f64, ips: bool| mean_rmse(runs, |s| s.name == name && s.tau == tau && s.ips == ips);
        let (r0, r1) = (at(0.0, false), at(1.0, false));
        check(3, format!("{name}: RMSE at τ = 0 > at τ = 1"), r0 > r1, format!("{r0:.4} vs {r1:.4}"));
        for &tau in &partial {
            let (plain, ips) = (at(tau, false), at(tau, true));
            let cut = 1.0 - ips / plain;
            let estimand = match (population_rmse(population, name, 1.0, tau, false), population_rmse(population, name, 1.0, tau, true)) {
                (Some(p), Some(i)) => format!("; population optimum {p:.4} → {i:.4} ({:.0}% lower)", 100.0 * (1.0 - i / p)),
                _ => String::new(),
            };
            check(
                4,
                format!("{name}, τ = {tau}: IPS lowers RMSE by ≥ 30%"),
                cut >= 0.30,
                format!("{plain:.4} → {ips:.4} ({:.0}% lower){estimand}", 100.0 * cut),
            );
        }
        // What IPS does by construction (Eq. 22 reweights to uniform exposure): its θ matches τ = 1's.
        let theta_at = |tau: f64, ips: bool| mean_theta(runs, |s| s.name == name && s.tau == tau && s.ips == ips);
        let uniform = theta_at(1.0, false);
        for &tau in &partial {
            let (d_ips, d_plain) = (max_abs_diff(&theta_at(tau, true), &uniform), max_abs_diff(&theta_at(tau, false), &uniform));
            check(
                4,
                format!("{name}, τ = {tau}: IPS makes θ policy-independent (closer to the τ = 1 estimate than without IPS)"),
                d_ips < d_plain,
                format!("max |θ − θ(τ=1)|: {d_ips:.4} with IPS, {d_plain:.4} without"),
            );
        }
        let (plain, ips) = (at(0.0, false), at(0.0, true));
        let said = runs
            .iter()
            .filter(|r| r.setting.name == name && r.setting.tau == 0.0 && r.setting.ips)
            .all(|r| r.ips_note.as_deref().is_some_and(|n| n.contains("changes nothing")));
        check(
            4,
            format!("{name}, τ = 0: IPS changes nothing (all π = 1) and the trainer says so"),
            said && (plain - ips).abs() <= 0.01 * plain.max(0.01),
            format!("{plain:.4} vs {ips:.4}; note given: {said}"),
        );
    }
    out
}

fn write_outputs(opts: &Options, summary: &Summary) -> anyhow::Result<()> {
    let k = summary.truth.len();
    let mut columns = super::header("setting,claim,relevance,tower,feature_limit,tau,ips,seed,bias_rmse,ndcg10,epochs,seconds,train_impressions,impressions_per_second,ess_fraction,clipped_fraction");
    columns.extend((1..=k).map(|j| format!("theta_{j}")));
    let rows = summary.runs.iter().map(|r| {
        let s = &r.setting;
        let mut row = vec![
            s.name.to_string(),
            s.claim.to_string(),
            format!("{:?}", s.relevance),
            format!("{:?}", s.tower),
            s.feature_limit.map(|l| l.to_string()).unwrap_or_default(),
            s.tau.to_string(),
            s.ips.to_string(),
            r.seed.to_string(),
            format!("{:.5}", r.rmse),
            format!("{:.5}", r.ndcg10),
            r.epochs.to_string(),
            format!("{:.1}", r.seconds),
            r.train_impressions.to_string(),
            format!("{:.0}", r.impressions_per_second),
            format!("{:.4}", r.ess_fraction),
            format!("{:.4}", r.clipped_fraction),
        ];
        row.extend(r.theta.iter().map(|t| format!("{t:.5}")));
        row
    });
    if !summary.runs.is_empty() {
        super::write_csv(&opts.out.join("results.csv"), &columns, rows)?;
    }

    let mut md = String::from("# Hager et al. 2025 §8 on MQ2008 — bias recovery\n\n");
    if !summary.runs.is_empty() {
        md.push_str(&format!(
            "{} training sessions per run, seeds {:?}, bias RMSE of θ_k − θ_1 over positions 1..{k}, mean ± sd over seeds. Wall time {:.0}s.\n\n",
            opts.train_sessions, opts.seeds, summary.seconds
        ));
        md.push_str("| claim | setting | tower | τ | IPS | bias RMSE | nDCG@10 | epochs |\n|---|---|---|---|---|---|---|---|\n");
        for (s, same) in by_setting(&summary.runs) {
            let (m, sd) = mean_sd(same.iter().map(|o| o.rmse));
            let (nd, _) = mean_sd(same.iter().map(|o| o.ndcg10));
            let (ep, _) = mean_sd(same.iter().map(|o| o.epochs as f64));
            md.push_str(&format!(
                "| {} | {} | {:?} | {} | {} | {m:.4} ± {sd:.4} | {nd:.4} | {ep:.1} |\n",
                s.claim,
                s.name,
                s.tower,
                s.tau,
                if s.ips { "yes" } else { "no" }
            ));
        }
    }
    if !summary.checks.is_empty() {
        md.push_str("\n## Claims\n\n");
    }
    for c in &summary.checks {
        md.push_str(&format!("- [{}] ({}) {} — {}\n", if c.holds { "x" } else { " " }, c.claim, c.statement, c.detail));
    }
    if !summary.runs.is_empty() {
        md.push_str("\nPlot: `theta.svg` (true θ_k − θ_1 in black, one colour per seed).\n");
    }
    md.push_str(&population_markdown(opts, &summary.population));
    std::fs::write(opts.out.join("summary.md"), md)?;
    write_population_csv(&opts.out.join("population.csv"), &summary.population)?;
    std::fs::write(opts.out.join("summary.json"), serde_json::to_string_pretty(summary)?)?;

    let panels: Vec<super::plot::Panel> = by_setting(&summary.runs)
        .into_iter()
        .map(|(s, same)| super::plot::Panel {
            title: format!("{} τ={}{}", s.name, s.tau, if s.ips { " +IPS" } else { "" }),
            truth: summary.truth.clone(),
            estimates: same.iter().map(|o| o.theta.clone()).collect(),
        })
        .collect();
    if !panels.is_empty() {
        std::fs::write(opts.out.join("theta.svg"), super::plot::theta_panels_svg(&panels, 4))?;
    }
    Ok(())
}

fn write_population_csv(path: &std::path::Path, pop: &[PopulationResult]) -> anyhow::Result<()> {
    let k = pop.iter().map(|p| p.theta.len()).max().unwrap_or(0);
    let mut columns = super::header("setting,alpha,tau,ips,seed,bias_rmse");
    columns.extend((1..=k).map(|j| format!("theta_{j}")));
    let rows = pop.iter().map(|p| {
        let mut row = vec![p.name.to_string(), p.alpha.to_string(), p.tau.to_string(), p.ips.to_string(), p.seed.to_string(), format!("{:.5}", p.rmse)];
        row.extend(p.theta.iter().map(|t| format!("{t:.5}")));
        row
    });
    super::write_csv(path, &columns, rows)
}

/// The population table: per cell, mean RMSE over seeds without and with IPS.
fn population_markdown(opts: &Options, pop: &[PopulationResult]) -> String {
    if pop.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\n## Population optimum (infinite sessions)\n\nWhat each linear-tower cell converges to as sessions → ∞: Newton's method on the exact expected \
         log-likelihood over every (q, d, k), weighted by π(d,k|q) (IPS: by π·min(1/π, clip)), with the true click probability as the label — \
         no click noise, early stopping or weight decay. Bias RMSE over positions 1..{}, mean over seeds {:?}. α = 1 is the grid's logging \
         policy; α = −1 the inverse policy (Hager Fig. 6). `population.csv` has every seed and θ.\n\n\
         | setting | α | τ | RMSE, no IPS | RMSE, IPS | IPS change |\n|---|---|---|---|---|---|\n",
        opts.positions, opts.seeds
    );
    let mut seen: Vec<(&str, f64, f64)> = Vec::new();
    for p in pop {
        let cell = (p.name.as_str(), p.alpha, p.tau);
        if seen.contains(&cell) {
            continue;
        }
        seen.push(cell);
        let plain = population_rmse(pop, cell.0, cell.1, cell.2, false).unwrap_or(f64::NAN);
        match population_rmse(pop, cell.0, cell.1, cell.2, true) {
            Some(ips) => md.push_str(&format!("| {} | {} | {} | {plain:.4} | {ips:.4} | {:+.0}% |\n", cell.0, cell.1, cell.2, 100.0 * (ips / plain - 1.0))),
            None => md.push_str(&format!("| {} | {} | {} | {plain:.4} | – | – |\n", cell.0, cell.1, cell.2)),
        }
    }
    md
}

/// Runs grouped by setting (name, τ, IPS), in first-seen order.
fn by_setting(runs: &[RunResult]) -> Vec<(&Setting, Vec<&RunResult>)> {
    let mut out: Vec<(&Setting, Vec<&RunResult>)> = Vec::new();
    for r in runs {
        let s = &r.setting;
        match out.iter_mut().find(|(o, _)| o.name == s.name && o.tau == s.tau && o.ips == s.ips) {
            Some((_, group)) => group.push(r),
            None => out.push((s, vec![r])),
        }
    }
    out
}

fn mean_sd(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = values.collect();
    let n = v.len().max(1) as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (m, var.sqrt())
}
