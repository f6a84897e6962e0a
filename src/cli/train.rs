//! Command-line parsing for training commands: train, eval, score, models.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use ultr::config::PipelineConfig;
use ultr_train::checkpoint::ModelStore;
use ultr_train::device::BackendKind;
use ultr_train::{train_from_state, TrainRequest};

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
        context: &config.context(),
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        print!("{}", outcome.render());
    }
    Ok(outcome.decision.promoted)
}

pub fn eval(args: &EvalArgs) -> anyhow::Result<()> {
    let config = load_config(&args.config)?;
    if let Some(qrels) = &args.qrels {
        return eval_judged(args, &config, qrels);
    }
    let refs = ultr::evaluation::References { truth: args.truth.clone(), labels: args.labels.clone(), positions: args.positions };
    let (id, report) = ultr::evaluation::on_held_out_clicks(&config, &args.state, args.model.as_deref(), &refs)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "model": id, "report": report }))?);
    } else {
        println!("model {id}");
        print!("{}", report.render());
    }
    Ok(())
}

/// `ultr eval --qrels`: every ranking from the same state, scored against editors' labels.
fn eval_judged(args: &EvalArgs, config: &PipelineConfig, qrels_path: &Path) -> anyhow::Result<()> {
    use ultr_train::eval::judged::{Qrels, Unjudged};
    let qrels = Qrels::read(qrels_path)?;
    let unjudged = match args.unjudged {
        UnjudgedArg::Zero => Unjudged::Zero,
        UnjudgedArg::Drop => Unjudged::Drop,
    };
    let judged = ultr::evaluation::on_editors_labels(config, &args.state, args.model.as_deref(), &qrels, unjudged, args.bootstrap, args.seed)?;
    let id = &judged.id;
    if let Some(path) = &args.run_out {
        let ranking = judged
            .rankings
            .iter()
            .find(|r| r.ranker == args.run_ranker)
            .with_context(|| format!("--run-ranker {}: one of model, logged, naive_ctr, biased, combined", args.run_ranker))?;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?);
        let tag = if ranking.ranker == "model" { format!("ultr-{id}") } else { format!("ultr-{}", ranking.ranker) };
        ranking.write_run(&mut out, &tag)?;
        out.flush()?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "model": id, "judged": judged.report }))?);
    } else {
        println!("model {id}");
        print!("{}", judged.report.render());
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
