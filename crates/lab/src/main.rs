//! `ultr-lab`: the command line of the reproduced experiments (`ultr experiment …` runs it). A
//! binary apart from `ultr`, so that neither the `ultr` binary nor its library links the laboratory:
//! the compiler refuses production code that uses it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use ultr_train::device::BackendKind;

#[derive(Parser)]
#[command(name = "ultr-lab", version, about = "The reproduced experiments of ultr, on its click simulator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reproduce a paper's experiment on the simulator. Exit 0 when every claim holds, 1 otherwise.
    #[command(subcommand)]
    Experiment(ExperimentCommand),
}

fn main() -> ExitCode {
    // `ULTR_LOG` (or `RUST_LOG`) filters; by default warnings and the pipeline's story lines.
    let filter = tracing_subscriber::EnvFilter::try_from_env("ULTR_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| "warn,ultr::story=info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let Command::Experiment(cmd) = Cli::parse().command;
    match experiment(&cmd) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[derive(Subcommand)]
enum ExperimentCommand {
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
struct PropensitySmoothingArgs {
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
struct ThetaCoverageArgs {
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
    /// Whose estimator of θ: `shipped` (`ultr train`'s defaults: θ from the swap pairs) or
    /// `paper-replication` (θ trained with the tower, IPS weights; results/theta_coverage before issue 89).
    #[arg(long, value_enum, default_value = "shipped")]
    defaults: ultr_lab::experiment::theta_coverage::Defaults,
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
struct Zhuang2021Args {
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
struct LtrExperimentArgs {
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
struct Yan2022Args {
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
struct Zhang2023Args {
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
struct Hager2025Args {
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

fn experiment(cmd: &ExperimentCommand) -> anyhow::Result<bool> {
    let a = match cmd {
        ExperimentCommand::Hager2025(a) => a,
        ExperimentCommand::Zhang2023(z) => return zhang2023(z),
        ExperimentCommand::Yan2022(y) => return yan2022(y),
        ExperimentCommand::Zhuang2021(z) => return zhuang2021(z),
        ExperimentCommand::ThetaCoverage(t) => return theta_coverage(t),
        ExperimentCommand::PropensitySmoothing(p) => return propensity_smoothing(p),
    };
    let data = ultr_lab::experiment::mq2008_folds(a.data.as_deref()).context("--data")?;
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
        let (mq, rank) = ultr_lab::experiment::data_dirs(self.mq2008.as_deref(), self.lightgbm_rank.as_deref()).context("--mq2008")?;
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
        defaults: a.defaults,
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

fn zhang2023(a: &Zhang2023Args) -> anyhow::Result<bool> {
    use ultr_lab::experiment::zhang2023 as z;
    let (mq, rank) = ultr_lab::experiment::data_dirs(a.mq2008.as_deref(), a.lightgbm_rank.as_deref()).context("--mq2008")?;
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
