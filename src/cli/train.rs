//! Command-line parsing for training commands: train, eval, score, models, experiment.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};

use ultr::config::PipelineConfig;
use ultr_simulate::{dataset, GroundTruth};
use ultr_simulate::{labels_from_truth, truth_theta};
use ultr_train::checkpoint::ModelStore;
use ultr_train::data::{load_from_state, split_of, Examples, Horizon, Split};
use ultr_train::device::BackendKind;
use ultr_train::eval::{evaluate, Labels};
use ultr_train::{models_dir, train_from_state, TrainOutcome, TrainRequest};

#[derive(Args)]
pub struct TrainArgs {
    #[arg(long)]
    state: PathBuf,
    #[arg(long)]
    config: PathBuf,
    /// Continue from the current model on the windows it has not seen.
    #[arg(long)]
    warm_start: bool,
    /// With --warm-start: also retrain cold on the whole horizon and print both.
    #[arg(long, requires = "warm_start")]
    compare_cold: bool,
    /// Promote even if the validation loss is worse (never a diverged model).
    #[arg(long)]
    force: bool,
    #[arg(long)]
    json: bool,
    /// Also report θ_k's converged estimate and bootstrap intervals (`[train.uncertainty]`), and
    /// plot them to `theta_intervals.svg` in the checkpoint.
    #[arg(long)]
    theta_intervals: bool,
}

#[derive(Args)]
pub struct EvalArgs {
    #[arg(long)]
    state: PathBuf,
    #[arg(long)]
    config: PathBuf,
    /// Checkpoint id (default: CURRENT).
    #[arg(long)]
    model: Option<String>,
    /// Ground-truth JSON from `ultr simulate --truth` (default: rebuilt from a simulator config).
    #[arg(long)]
    truth: Option<PathBuf>,
    /// SVMlight file(s) with graded labels for nDCG (doc ids as the simulator names them).
    #[arg(long)]
    labels: Vec<PathBuf>,
    /// Positions the bias RMSE covers.
    #[arg(long, default_value_t = 10)]
    positions: usize,
    /// Editors' graded labels as TREC qrels (`query iteration document grade`): rank every document
    /// the state saw per query by the model, the logged order, naive click-through and a `biased`
    /// model trained on the same rows, and score each ranking (nDCG@1/3/5/10, DCG@10).
    #[arg(long, conflicts_with_all = ["labels", "truth"])]
    qrels: Option<PathBuf>,
    /// With --qrels: a ranked document without a label gains 0 at its rank (as trec_eval), or is
    /// dropped before the cutoffs.
    #[arg(long, value_enum, default_value = "zero")]
    unjudged: UnjudgedArg,
    /// With --qrels: bootstrap resamples of the query set for the intervals.
    #[arg(long, default_value_t = 1000)]
    bootstrap: usize,
    /// With --qrels: the bootstrap's seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// With --qrels: write a TREC run file (`query Q0 document rank score tag`) of one ranking.
    #[arg(long, requires = "qrels")]
    run_out: Option<PathBuf>,
    /// The ranking --run-out writes: model, logged, naive_ctr or biased.
    #[arg(long, default_value = "model")]
    run_ranker: String,
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum UnjudgedArg {
    Zero,
    Drop,
}

#[derive(Args)]
pub struct ScoreArgs {
    /// A checkpoint directory, or a models directory (its CURRENT is used).
    #[arg(long)]
    model: PathBuf,
    /// SVMlight/LETOR file, or JSONL sessions in the contract.
    #[arg(long)]
    input: PathBuf,
    /// Output TSV (query_id, doc_id, score); `-` for stdout.
    #[arg(long, default_value = "-")]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
}

#[derive(Args)]
pub struct ModelsArgs {
    /// A models directory (default `<state>/models`).
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum ExperimentCommand {
    /// Hager et al. 2025 §8 on MQ2008: bias recovery per setting over seeds.
    Hager2025(Hager2025Args),
    /// Zhang et al. 2023 Table 1 (Biased, PAL, DLA, GradRev, Drop under five logging policies) and
    /// the η / dropout sweeps, on MQ2008 fold 1 and LightGBM's rank data.
    Zhang2023(Zhang2023Args),
    /// Yan et al. 2022 Table 3 (Biased, REM, Additive, EDot, EInter, MixEM under five mixtures of
    /// click models), on MQ2008 fold 1 and LightGBM's rank data.
    Yan2022(Yan2022Args),
    /// Zhuang et al. 2021 Tables 1–2 (NoPos, Pos, XPA and its ablations under PBM, DCM and CPM
    /// clicks) and the attention matrix of Fig. 5, on MQ2008 fold 1 and LightGBM's rank data.
    Zhuang2021(Zhuang2021Args),
    /// θ_k's bootstrap intervals (`ultr train --theta-intervals`) against the simulator's truth:
    /// coverage per position over seeds, early-stopped and converged estimates.
    ThetaCoverage(ThetaCoverageArgs),
    /// Counted π(d,k|q) against the simulator's true π by sessions per query, with and without
    /// shrinkage (`train.ips.prior_sessions`).
    PropensitySmoothing(PropensitySmoothingArgs),
}

#[derive(Args)]
pub struct PropensitySmoothingArgs {
    #[arg(long, default_value = "results/propensity_smoothing")]
    out: PathBuf,
    #[arg(long, default_value_t = 30_000)]
    sessions: u64,
    #[arg(long, default_value_t = 10_000)]
    queries: usize,
    #[arg(long, default_value_t = 10)]
    docs_per_query: usize,
    #[arg(long, default_value_t = 0.3)]
    tau: f64,
    /// Values of `train.ips.prior_sessions` to compare.
    #[arg(long, value_delimiter = ',', default_value = "0,0.5,1,2,4,8")]
    priors: Vec<f64>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
}

#[derive(Args)]
pub struct ThetaCoverageArgs {
    #[arg(long, default_value = "results/theta_coverage")]
    out: PathBuf,
    /// Directory holding MQ2008's S1.txt … S5.txt; `none` for the simulator's synthetic queries.
    #[arg(long, default_value = "none")]
    data: PathBuf,
    #[arg(long, default_value_t = 20_000)]
    sessions: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20")]
    seeds: Vec<u64>,
    #[arg(long, default_value_t = 0.3)]
    tau: f64,
    #[arg(long, value_enum, default_value = "linear")]
    relevance: ultr_simulate::relevance::RelevanceKind,
    /// σ of the simulator's per-document relevance noise: 0 keeps a linear tower well specified.
    #[arg(long, default_value_t = 0.0)]
    noise: f64,
    #[arg(long, value_enum, default_value = "linear")]
    tower: ultr_train::config::TowerKind,
    #[arg(long, default_value_t = 10)]
    positions: usize,
    #[arg(long, default_value_t = 50)]
    max_epochs: usize,
    /// Bootstrap replicates per seed.
    #[arg(long, default_value_t = 50)]
    replicates: usize,
    /// What a replicate resamples: query or impression.
    #[arg(long, default_value = "query")]
    unit: String,
    /// Epochs (optimizer steps) per replicate, warm-started from the converged model.
    #[arg(long, default_value_t = 50)]
    replicate_epochs: usize,
    /// Most epochs (optimizer steps) of the converged fit (it stops when θ settles).
    #[arg(long, default_value_t = 2000)]
    converged_epochs: usize,
    #[arg(long, default_value_t = 0.95)]
    level: f64,
    #[arg(long, default_value_t = 2)]
    jobs: usize,
}

#[derive(Args)]
pub struct Zhuang2021Args {
    #[arg(long, default_value = "results/zhuang2021")]
    out: PathBuf,
    #[command(flatten)]
    run: LtrExperimentArgs,
    /// PBM, DCM, CPM.
    #[arg(long, value_delimiter = ',', default_value = "PBM,DCM,CPM")]
    click_models: Vec<String>,
    /// NoPos, Pos, XPA, XPA Pos, XPA Item.
    #[arg(long, value_delimiter = ',', default_value = "NoPos,Pos,XPA,XPA Pos,XPA Item")]
    methods: Vec<String>,
}

/// What `yan2022` and `zhuang2021` share: the data, the simulated log and the training budget.
#[derive(Args)]
pub struct LtrExperimentArgs {
    /// Directory holding MQ2008's S1.txt … S5.txt.
    #[arg(long)]
    mq2008: Option<PathBuf>,
    /// Directory holding LightGBM's rank.train, rank.test and their .query files; `none` skips it.
    #[arg(long)]
    lightgbm_rank: Option<PathBuf>,
    /// Training sessions per cell.
    #[arg(long, default_value_t = 200_000)]
    train_sessions: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    #[arg(long, default_value_t = 50)]
    max_epochs: usize,
    /// Cells (dataset, click model, seed) in parallel.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    #[arg(long, value_enum, default_value = "mlp")]
    tower: ultr_train::config::TowerKind,
    /// The top this many of each ranking are shown (1..=64: a click pattern is 64 bits).
    #[arg(long, default_value_t = 10)]
    max_positions: usize,
    /// Share of training queries whose labels fit the logging ranker (Yan §4.1.1: 1 %).
    #[arg(long, default_value_t = 0.01)]
    logging_label_fraction: f64,
}

#[derive(Args)]
pub struct Yan2022Args {
    #[arg(long, default_value = "results/yan2022")]
    out: PathBuf,
    #[command(flatten)]
    run: LtrExperimentArgs,
    /// Mixtures RCM:RCTR:DCTR:PBM.
    #[arg(long, value_delimiter = ',', default_value = "0:0:0:1,0:1:0:1,1:0:1:0,1:1:1:1,0:1:1:0")]
    mixtures: Vec<String>,
    /// The table's methods.
    #[arg(long, value_delimiter = ',', default_value = "Biased,REM,Additive,EDot,EInter,MixEM")]
    methods: Vec<String>,
    /// D_emb grid of EDot and EInter.
    #[arg(long, value_delimiter = ',', default_value = "4,8")]
    dimensions: Vec<usize>,
    /// T grid of MixEM.
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,2")]
    temperatures: Vec<f64>,
}

#[derive(Args)]
pub struct Zhang2023Args {
    #[arg(long, default_value = "results/zhang2023")]
    out: PathBuf,
    /// Directory holding MQ2008's S1.txt … S5.txt.
    #[arg(long)]
    mq2008: Option<PathBuf>,
    /// Directory holding LightGBM's rank.train, rank.test and their .query files; `none` skips it.
    #[arg(long)]
    lightgbm_rank: Option<PathBuf>,
    /// Training sessions per cell.
    #[arg(long, default_value_t = 200_000)]
    train_sessions: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    #[arg(long, default_value_t = 20)]
    max_epochs: usize,
    /// Runs in parallel.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    #[arg(long, value_enum, default_value = "mlp")]
    tower: ultr_train::config::TowerKind,
    #[arg(long, default_value_t = 50)]
    max_positions: usize,
    /// Logging policies: w of the label in s = w·y + (1−w)·n.
    #[arg(long, value_delimiter = ',', default_value = "1,0.8,0.6,0.2,0")]
    policies: Vec<f64>,
    /// η values swept at w = 1.
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.4,0.6,0.8,1.0")]
    eta_sweep: Vec<f64>,
    /// Dropout rates swept at w = 1.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.3,0.5,0.7")]
    dropout_sweep: Vec<f64>,
    /// Skip both sweeps.
    #[arg(long)]
    no_sweeps: bool,
    /// The methods of the table (Biased, PAL, DLA, GradRev, Drop).
    #[arg(long, value_delimiter = ',', default_value = "Biased,PAL,DLA,GradRev,Drop")]
    methods: Vec<String>,
}

#[derive(Args)]
pub struct Hager2025Args {
    #[arg(long, default_value = "results/hager2025")]
    out: PathBuf,
    /// Directory holding MQ2008's S1.txt … S5.txt.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, default_value_t = 200_000)]
    train_sessions: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// Policy strengths τ of the misspecified cells (must hold 0 and 1).
    #[arg(long, value_delimiter = ',', default_values_t = ultr_lab::experiment::hager2025::TAUS.to_vec())]
    taus: Vec<f64>,
    #[arg(long, default_value_t = 50)]
    max_epochs: usize,
    /// Runs in parallel.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    #[arg(long, default_value_t = 10)]
    positions: usize,
    /// Skip training; compute only the infinite-session optimum of the linear-tower cells (minutes).
    #[arg(long)]
    population_only: bool,
}

fn load_config(path: &Path) -> anyhow::Result<PipelineConfig> {
    Ok(PipelineConfig::load(path)?)
}

pub fn train(args: &TrainArgs) -> anyhow::Result<bool> {
    let mut config = load_config(&args.config)?;
    if args.theta_intervals {
        config.train.uncertainty.enabled = true;
        config.train.uncertainty.validate().map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    }
    let qrels = config.eval.qrels.as_deref().map(|p| ultr_train::eval::judged::Qrels::read(p).context("key `eval.qrels`")).transpose()?;
    let outcome = train_from_state(&TrainRequest {
        state_dir: &args.state,
        core: &config.core(),
        config: &config.train,
        warm_start: args.warm_start,
        compare_cold: args.compare_cold,
        force: args.force,
        progress: !args.json,
        cancel: None,
        judged: qrels.as_ref().map(|qrels| ultr_train::gate::TeamRanking { qrels, eval: &config.eval }),
        truth_theta: config.truth_theta().as_deref(),
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        print!("{}", render_outcome(&outcome));
    }
    Ok(outcome.decision.promoted)
}

/// `ultr train`'s report on the console.
fn render_outcome(outcome: &TrainOutcome) -> String {
    let f = &outcome.fit;
    let mut s = String::new();
    s.push_str(&format!("checkpoint {} in {}\n", outcome.id, outcome.models_dir.display()));
    s.push_str(&f.trained_line());
    if !f.converged && f.stop == ultr_train::fit::StopReason::MaxEpochs {
        s.push_str(&format!(
            "  NOT CONVERGED: max_epochs ({}) ran out with the validation loss still falling; θ is flattened toward 0 (raise [train] max_epochs)\n",
            f.epochs.len()
        ));
    }
    if let Some(last) = f.epochs.last() {
        s.push_str(&format!(
            "  last epoch: train loss {:.5}, validation loss {:.5}, {:.0} impressions/s\n",
            last.train_loss, last.validation_loss, last.impressions_per_second
        ));
    }
    let w = &f.weights;
    s.push_str(&format!(
        "  IPS {}: min π {:.4}, max weight {:.2}, clipped {:.2}%, effective sample size {:.0} ({:.1}%)\n",
        if w.enabled { "on" } else { "off" },
        w.min_propensity,
        w.max_weight,
        100.0 * w.clipped_fraction,
        w.effective_sample_size,
        100.0 * w.effective_sample_fraction
    ));
    if let Some(r) = &f.position_refit {
        let moved = r.before.iter().zip(&r.after).map(|(b, a)| (a - b).abs()).fold(0.0, f64::max);
        if r.method == ultr_train::refit::RefitMethod::SwapPairs {
            s.push_str(&format!(
                "  θ from the swap pairs before training, then held fixed ([train] position_bias = \"swap_pairs\"): {} positions\n",
                r.positions
            ));
        } else {
            s.push_str(&format!(
                "  θ refit after early stopping ([train] refit_position_bias): {} positions, θ_k − θ_1 moved by up to {moved:.3}\n",
                r.positions
            ));
        }
        if !r.not_estimable.is_empty() {
            let list = r.not_estimable.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", ");
            s.push_str(&format!(
                "  NOT ESTIMABLE: θ at position(s) {list}: their swap pairs carry no click (or only clicks), so they keep the early-stopped θ\n"
            ));
        }
    }
    if let Some(p) = &f.logged_order_prior {
        let tried = p.candidates.iter().map(|(l, ll)| format!("{l} → {ll:.5}")).collect::<Vec<_>>().join(", ");
        let prior = p.prior.iter().map(|(k, r)| format!("{k}: {r:+.2}")).collect::<Vec<_>>().join(" ");
        s.push_str(&format!(
            "  γ of {} pairs around the logged-order prior ([train] logged_order_prior): λ = {} chosen by validation clicks per impression ({tried})\n",
            p.pairs, p.strength
        ));
        s.push_str(&format!("    ρ by mean logged position: {prior}\n"));
    }
    if let Some(c) = &f.logged_order_combination {
        s.push_str("  ");
        s.push_str(ultr_train::logged_order_combination::describe(c).replace('\n', "\n  ").trim_end_matches(' '));
    }
    s.push_str("  θ_k − θ_1: ");
    s.push_str(&outcome.theta.iter().take(10).map(|t| format!("{t:+.3}")).collect::<Vec<_>>().join(" "));
    s.push('\n');
    if let Some(t) = &outcome.theta_intervals {
        s.push_str(&format!("  θ_k − θ_1 with {:.0}% intervals ({} bootstrap replicates of the converged estimator):\n", 100.0 * t.level, t.replicates));
        s.push_str("      k   early-stopped   shipped   converged   interval\n");
        for k in 1..t.converged.len() {
            let shipped = t.shipped.get(k).copied().unwrap_or(f64::NAN);
            let within = if t.lower[k] <= shipped && shipped <= t.upper[k] { "" } else { "   shipped θ outside the interval" };
            s.push_str(&format!(
                "    {:3}   {:+13.3}   {:+7.3}   {:+9.3}   [{:+.3}, {:+.3}]{within}\n",
                k + 1,
                t.early_stopped[k],
                shipped,
                t.converged[k],
                t.lower[k],
                t.upper[k]
            ));
        }
    }
    if let Some(h) = &outcome.decision.held_out_clicks {
        s.push_str(&format!("  {}\n", h.line()));
    }
    s.push_str(&format!("  {}: {}\n", if outcome.decision.promoted { "PROMOTED" } else { "REJECTED" }, outcome.decision.reason));
    if let Some(c) = &outcome.cold_comparison {
        s.push_str(&format!(
            "  warm vs cold retrain on the whole horizon ({} impressions): evaluation loss {:.6} vs {:.6}, {:.1}s vs {:.1}s, max |Δθ| {:.4}\n",
            c.cold_train_impressions, c.warm_evaluation_loss, c.cold_evaluation_loss, c.warm_seconds, c.cold_seconds, c.max_theta_difference
        ));
    }
    if let Some(n) = &outcome.note {
        s.push_str(&format!("  note: {n}\n"));
    }
    if !outcome.pruned.is_empty() {
        s.push_str(&format!("  deleted {} old checkpoint(s) (train.keep_checkpoints): {}\n", outcome.pruned.len(), outcome.pruned.join(", ")));
    }
    s
}

/// The ground truth for a state built from the simulator, or from a file.
fn ground_truth(config: &PipelineConfig, file: &Option<PathBuf>) -> anyhow::Result<Option<GroundTruth>> {
    if let Some(f) = file {
        return Ok(Some(GroundTruth::load(f)?));
    }
    config.source.kind().ground_truth(&config.source_context())
}

fn labels_from_svmlight(files: &[PathBuf]) -> anyhow::Result<Labels> {
    let data = dataset::load_svmlight(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
    Ok(data.queries.iter().flat_map(|q| q.docs.iter().filter_map(move |d| d.label.map(|l| ((q.query_id.clone(), d.doc_id.clone()), l as f64)))).collect())
}

pub fn eval(args: &EvalArgs) -> anyhow::Result<()> {
    if let Some(qrels) = &args.qrels {
        return eval_judged(args, qrels);
    }
    let config = load_config(&args.config)?;
    let (id, trained, all) = model_and_horizon(args, &config)?;
    let device = config.train.backend.device()?;
    // The evaluation slice: sessions the model's optimizer, early stopping and promotion gate never chose by.
    let heldout = all.filter_sessions(|s| split_of(s, config.train.holdout()) == Split::Evaluation);
    let truth = ground_truth(&config, &args.truth)?;
    let labels = if !args.labels.is_empty() { Some(labels_from_svmlight(&args.labels)?) } else { truth.as_ref().map(labels_from_truth) };
    let theta = truth.as_ref().map(truth_theta);
    let mut report = evaluate(&trained, &heldout, labels.as_ref(), theta.as_deref(), args.positions, &device);
    report.misspecification = Some(ultr_train::misspecification::of_model(&trained, &heldout, config.identifiability.min_policy_variation, &device));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "model": id, "report": report }))?);
    } else {
        println!("model {id}");
        print!("{}", report.render());
    }
    Ok(())
}

/// The model `ultr eval` scores (`--model`, or CURRENT), checked against the stream's schema, and
/// every row of the state's lookback horizon.
fn model_and_horizon(args: &EvalArgs, config: &PipelineConfig) -> anyhow::Result<(String, ultr_train::artefact::Trained, Examples)> {
    let store = ModelStore::open(&models_dir(&config.train, &args.state))?;
    let id = match &args.model {
        Some(id) => id.clone(),
        None => store.current_id()?.with_context(|| format!("{}: no current model (train one first)", store.dir().display()))?,
    };
    let trained = store.load(&id, &config.train.backend.device()?)?;
    trained.check_feature_schema(config.decode.feature_schema.as_ref()).with_context(|| format!("model {id}"))?;
    let manifest = ultr_core::state::read_manifest(&args.state)?;
    let rt = ultr_core::runtime::multi_thread("ultr-eval")?;
    let lookback = config.state.lookback_ms();
    let all = rt.block_on(load_from_state(
        &args.state,
        &manifest,
        lookback,
        Horizon::Lookback(lookback),
        trained.meta.architecture.max_positions,
        &config.train.ips,
    ))?;
    trained.check_compatible(&all)?;
    Ok((id, trained, all))
}

/// `ultr eval --qrels`: every ranking from the same state, scored against editors' labels.
fn eval_judged(args: &EvalArgs, qrels_path: &Path) -> anyhow::Result<()> {
    use ultr_train::eval::judged::{evaluate as evaluate_judged, standard_rankings, Qrels, Unjudged};
    let qrels = Qrels::read(qrels_path)?;
    let config = load_config(&args.config)?;
    let (id, trained, all) = model_and_horizon(args, &config)?;
    eprintln!("eval: training the biased model on the same {} rows", all.rows.len());
    let rankings = standard_rankings(&all, &trained, &config.train)?;
    let unjudged = match args.unjudged {
        UnjudgedArg::Zero => Unjudged::Zero,
        UnjudgedArg::Drop => Unjudged::Drop,
    };
    let report = evaluate_judged(&qrels, &rankings, unjudged, args.bootstrap, args.seed)?;
    if let Some(path) = &args.run_out {
        let ranking = rankings
            .iter()
            .find(|r| r.ranker == args.run_ranker)
            .with_context(|| format!("--run-ranker {}: one of model, logged, naive_ctr, biased, combined", args.run_ranker))?;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?);
        let tag = if ranking.ranker == "model" { format!("ultr-{id}") } else { format!("ultr-{}", ranking.ranker) };
        ranking.write_run(&mut out, &tag)?;
        out.flush()?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "model": id, "judged": report }))?);
    } else {
        println!("model {id}");
        print!("{}", report.render());
    }
    Ok(())
}

pub fn score(args: &ScoreArgs) -> anyhow::Result<()> {
    let mut out: Box<dyn Write> = if args.out.as_os_str() == "-" {
        Box::new(std::io::BufWriter::new(std::io::stdout()))
    } else {
        Box::new(std::io::BufWriter::new(std::fs::File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?))
    };
    ultr::score::score(&args.model, &args.input, args.backend, &mut out)?;
    out.flush()?;
    Ok(())
}

pub fn models(args: &ModelsArgs) -> anyhow::Result<()> {
    let store = ModelStore::open(&args.dir)?;
    let current = store.current_id()?;
    let list = store.list()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "current": current, "checkpoints": list }))?);
        return Ok(());
    }
    for c in list {
        let mark = if current.as_deref() == Some(c.id.as_str()) { "*" } else { " " };
        println!("{mark} {}  {}  {}  {}", c.id, c.config.model_label(), if c.decision.promoted { "promoted" } else { "rejected" }, c.decision.reason);
    }
    Ok(())
}

pub fn experiment(cmd: &ExperimentCommand) -> anyhow::Result<bool> {
    let a = match cmd {
        ExperimentCommand::Hager2025(a) => a,
        ExperimentCommand::Zhang2023(z) => return zhang2023(z),
        ExperimentCommand::Yan2022(y) => return yan2022(y),
        ExperimentCommand::Zhuang2021(z) => return zhuang2021(z),
        ExperimentCommand::ThetaCoverage(t) => return theta_coverage(t),
        ExperimentCommand::PropensitySmoothing(p) => return propensity_smoothing(p),
    };
    let data_dir = match &a.data {
        Some(d) => d.clone(),
        None => ultr_simulate::dataset::default_mq2008_dir().context("MQ2008 not found: pass --data DIR (with S1.txt … S5.txt)")?,
    };
    let data: Vec<PathBuf> = (1..=5).map(|i| data_dir.join(format!("S{i}.txt"))).collect();
    for f in &data {
        anyhow::ensure!(ultr_simulate::dataset::data_file_exists(f), "{} does not exist (nor gzipped)", f.display());
    }
    let summary = ultr_lab::experiment::hager2025::run(&ultr_lab::experiment::hager2025::Options {
        out: a.out.clone(),
        data,
        train_sessions: a.train_sessions,
        seeds: a.seeds.clone(),
        taus: a.taus.clone(),
        max_epochs: a.max_epochs,
        jobs: a.jobs,
        backend: a.backend,
        positions: a.positions,
        progress: true,
        population_only: a.population_only,
    })?;
    print!("{}", std::fs::read_to_string(a.out.join("summary.md"))?);
    let files = if a.population_only { "summary.md,summary.json,population.csv" } else { "results.csv,summary.md,summary.json,theta.svg,population.csv" };
    println!("\nwrote {}/{{{files}}} in {:.0}s", a.out.display(), summary.seconds);
    Ok(summary.checks.iter().all(|c| c.holds))
}

impl LtrExperimentArgs {
    /// MQ2008 fold 1 (train, validation, test) and, when found or named, LightGBM's rank data.
    fn datasets(&self) -> anyhow::Result<Vec<ultr_lab::experiment::yan2022::Data>> {
        use ultr_lab::experiment::yan2022 as y;
        let (mq, rank) = data_dirs(&self.mq2008, &self.lightgbm_rank)?;
        let mut datasets = vec![y::mq2008(&mq)?];
        if let Some(dir) = rank {
            datasets.push(y::lightgbm_rank(&dir)?);
        }
        Ok(datasets)
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!((1..=64).contains(&self.max_positions), "--max-positions must lie in 1..=64 (a click pattern is 64 bits)");
        anyhow::ensure!(self.logging_label_fraction > 0.0 && self.logging_label_fraction <= 1.0, "--logging-label-fraction must lie in (0, 1]");
        Ok(())
    }
}

fn propensity_smoothing(a: &PropensitySmoothingArgs) -> anyhow::Result<bool> {
    use ultr_lab::experiment::propensity_smoothing as p;
    let opts = p::Options {
        out: a.out.clone(),
        sessions: a.sessions,
        queries: a.queries,
        docs_per_query: a.docs_per_query,
        tau: a.tau,
        priors: a.priors.clone(),
        seeds: a.seeds.clone(),
    };
    p::run(&opts)?;
    print!("{}", std::fs::read_to_string(a.out.join("summary.md"))?);
    Ok(true)
}

fn theta_coverage(a: &ThetaCoverageArgs) -> anyhow::Result<bool> {
    use ultr_lab::experiment::theta_coverage as t;
    let uncertainty = ultr_train::uncertainty::UncertaintyConfig {
        enabled: true,
        replicates: a.replicates,
        unit: match a.unit.as_str() {
            "query" => ultr_train::uncertainty::ResampleUnit::Query,
            "impression" => ultr_train::uncertainty::ResampleUnit::Impression,
            other => anyhow::bail!("--unit {other:?}: query or impression"),
        },
        level: a.level,
        epochs: a.replicate_epochs,
        converged_epochs: a.converged_epochs,
        ..Default::default()
    };
    uncertainty.validate().map_err(anyhow::Error::msg)?;
    let data = if a.data.as_os_str() == "none" { Vec::new() } else { (1..=5).map(|i| a.data.join(format!("S{i}.txt"))).collect() };
    let opts = t::Options {
        out: a.out.clone(),
        data,
        sessions: a.sessions,
        seeds: a.seeds.clone(),
        tau: a.tau,
        relevance: a.relevance,
        noise: a.noise,
        tower: a.tower,
        positions: a.positions,
        max_epochs: a.max_epochs,
        uncertainty,
        jobs: a.jobs,
    };
    let summary = t::run(&opts)?;
    print!("{}", std::fs::read_to_string(a.out.join("summary.md"))?);
    println!("\nwrote {}/{{results.csv,summary.md,summary.json,intervals.svg}} in {:.0}s", a.out.display(), summary.seconds);
    Ok(true)
}

fn zhuang2021(a: &Zhuang2021Args) -> anyhow::Result<bool> {
    use ultr_lab::experiment::zhuang2021 as z;
    let r = &a.run;
    r.check()?;
    let datasets = r.datasets()?;
    for c in &a.click_models {
        z::click_model(c).context("--click-models")?;
    }
    let opts = z::Options {
        out: a.out.clone(),
        train_sessions: r.train_sessions,
        seeds: r.seeds.clone(),
        max_epochs: r.max_epochs,
        jobs: r.jobs,
        backend: r.backend,
        tower: r.tower,
        max_positions: r.max_positions,
        logging_label_fraction: r.logging_label_fraction,
        click_models: a.click_models.clone(),
        methods: a
            .methods
            .iter()
            .map(|m| {
                z::Method::table()
                    .into_iter()
                    .find(|t| t.name == *m)
                    .with_context(|| format!("--methods: unknown method `{m}` (NoPos, Pos, XPA, XPA Pos, XPA Item)"))
            })
            .collect::<anyhow::Result<_>>()?,
        progress: true,
    };
    let summary = z::run(&opts, &datasets)?;
    print!("{}", std::fs::read_to_string(a.out.join("summary.md"))?);
    println!("\nwrote {}/{{results.csv,summary.md,summary.json,attention.svg}} in {:.0}s", a.out.display(), summary.seconds);
    Ok(true)
}

fn yan2022(a: &Yan2022Args) -> anyhow::Result<bool> {
    use ultr_lab::experiment::yan2022 as y;
    let r = &a.run;
    r.check()?;
    let datasets = r.datasets()?;
    for m in &a.mixtures {
        ultr_simulate::click::ClickModel::parse_mixture(m).with_context(|| format!("--mixtures `{m}`"))?;
    }
    let opts = y::Options {
        out: a.out.clone(),
        train_sessions: r.train_sessions,
        seeds: r.seeds.clone(),
        max_epochs: r.max_epochs,
        jobs: r.jobs,
        backend: r.backend,
        tower: r.tower,
        max_positions: r.max_positions,
        logging_label_fraction: r.logging_label_fraction,
        mixtures: a.mixtures.clone(),
        methods: y::Method::grid(&a.methods, &a.dimensions, &a.temperatures).context("--methods")?,
        progress: true,
    };
    let summary = y::run(&opts, &datasets)?;
    print!("{}", std::fs::read_to_string(a.out.join("summary.md"))?);
    println!("\nwrote {}/{{results.csv,summary.md,summary.json}} in {:.0}s", a.out.display(), summary.seconds);
    Ok(true)
}

/// MQ2008's directory (named or found) and LightGBM's rank directory: named, `none` for none, or found
/// beside MQ2008's.
fn data_dirs(mq2008: &Option<PathBuf>, lightgbm_rank: &Option<PathBuf>) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    let mq = match mq2008 {
        Some(d) => d.clone(),
        None => ultr_simulate::dataset::default_mq2008_dir().context("MQ2008 not found: pass --mq2008 DIR (with S1.txt … S5.txt)")?,
    };
    let rank = match lightgbm_rank {
        Some(d) if d.as_os_str() == "none" => None,
        Some(d) => Some(d.clone()),
        None => mq.parent().map(|p| p.join("lightgbm-rank")).filter(|d| ultr_simulate::dataset::data_file_exists(&d.join("rank.train"))),
    };
    Ok((mq, rank))
}

fn zhang2023(a: &Zhang2023Args) -> anyhow::Result<bool> {
    use ultr_lab::experiment::zhang2023 as z;
    let (mq, rank) = data_dirs(&a.mq2008, &a.lightgbm_rank)?;
    let mut datasets = vec![z::mq2008(&mq)?];
    if let Some(dir) = rank {
        datasets.push(z::lightgbm_rank(&dir)?);
    }
    let opts = z::Options {
        out: a.out.clone(),
        train_sessions: a.train_sessions,
        seeds: a.seeds.clone(),
        max_epochs: a.max_epochs,
        jobs: a.jobs,
        backend: a.backend,
        tower: a.tower,
        max_positions: a.max_positions,
        policies: a.policies.clone(),
        methods: a
            .methods
            .iter()
            .map(|m| {
                z::Method::table()
                    .into_iter()
                    .find(|t| t.name == *m)
                    .with_context(|| format!("--methods: unknown method `{m}` (Biased, PAL, DLA, GradRev, Drop)"))
            })
            .collect::<anyhow::Result<_>>()?,
        eta_sweep: if a.no_sweeps { Vec::new() } else { a.eta_sweep.clone() },
        dropout_sweep: if a.no_sweeps { Vec::new() } else { a.dropout_sweep.clone() },
        progress: true,
    };
    let summary = z::run(&opts, &datasets)?;
    print!("{}", std::fs::read_to_string(a.out.join("summary.md"))?);
    println!("\nwrote {}/{{results.csv,summary.md,summary.json,ndcg.svg}} in {:.0}s", a.out.display(), summary.seconds);
    Ok(true)
}
