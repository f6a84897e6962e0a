//! Command-line parsing only: every command calls the library.

mod train;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use ultr::config::PipelineConfig;
use ultr_core::ingest::Ingest;
use ultr_core::ingest::IngestSummary;
use ultr_core::session::DecodeLimits;
use ultr_core::sinks::dead_letter::DeadLetterSink;
use ultr_core::sinks::jsonl::JsonlSink;
use ultr_core::sinks::kafka::{ensure_topic, KafkaSink};
use ultr_core::sinks::SessionSink;
use ultr_core::sources::file::FileSource;
use ultr_core::sources::kafka::{KafkaSource, KafkaSourceConfig};
use ultr_simulate::click::{ClickModel, ClickModelKind};
use ultr_simulate::policy::{RankerKind, Sampling};
use ultr_simulate::relevance::RelevanceKind;
use ultr_simulate::{DataFormat, PolicyConfig, SimConfig, Simulator, SyntheticData};

#[derive(Parser)]
#[command(name = "ultr", version, about = "Streaming unbiased learning to rank")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded demo: simulate a stream and run it through the pipeline.
    Demo(ultr::demo::DemoArgs),
    /// Simulate click sessions with known ground truth.
    Simulate(SimulateArgs),
    /// Decode JSONL session files (plain or gzip); refused records go to a dead-letter file.
    Decode(DecodeArgs),
    /// Consume sessions from Kafka and decode them.
    Consume(ConsumeArgs),
    /// Import a released click log (Yandex relevance-prediction layout: PyClick's, Yandex's, NAVER's
    /// CLARA 2) as contract sessions, one per result page, to JSONL or a Kafka topic.
    Import(ImportArgs),
    /// Run a pipeline config's source through windows into the state directory (resumes after a crash).
    Ingest(IngestArgs),
    /// Analyse whether the state's data identifies a two-tower model. Exit 0 identified (the report says when only weakly: a θ_k interval wider than `max_theta_interval`), 1 not, 2 error.
    Identifiability(IdentifiabilityArgs),
    /// Plan the randomization: per position, the sessions (and the time at the stream's rate) a swap
    /// design run on a share of traffic needs until θ_k − θ_1's 95% interval is within ±ε, and which
    /// swaps to run first. Exit 0 when every position is within reach, 1 when some is not, 2 error.
    Plan(PlanArgs),
    /// Train the two-tower model on the state's horizon; the promotion gate decides whether it becomes
    /// current. Exit 0 promoted, 1 rejected, 2 error.
    Train(train::TrainArgs),
    /// Evaluate a model: nDCG, click log-likelihood/perplexity on held-out sessions, bias recovery.
    Eval(train::EvalArgs),
    /// Score an SVMlight or JSONL file with a model's relevance tower.
    Score(train::ScoreArgs),
    /// List a models directory's checkpoints and which one is current.
    Models(train::ModelsArgs),
    /// Copy a session topic into another keyed by `query_id` (what several instances need when the
    /// upstream keys otherwise).
    Rekey(RekeyArgs),
    /// Merge every partition's windows in `[state.object_store]` into the merged view now (takes the
    /// compactor lease, waiting for it when another instance holds it).
    Compact(CompactArgs),
    /// The always-on service: stream → windows → state, metrics on HTTP, scheduled retraining, stop on SIGTERM.
    Run(RunArgs),
    /// Write a Prometheus rules file with every duration divided by a factor (`for:`, ranges,
    /// `N * 3600` constants), for running the shipped alerts against a time-compressed deployment.
    RulesTimeScale(RulesTimeScaleArgs),
    /// Print the configuration reference (every key, its type, default and meaning) as Markdown:
    /// `ultr config-reference > docs/configuration.md`.
    ConfigReference,
    /// Print the shipped Prometheus alert rules, generated from the signals catalog:
    /// `ultr alert-rules > pipelines/alerts.yml`; with `--tests`, their promtool unit tests:
    /// `ultr alert-rules --tests > pipelines/alerts.test.yml`.
    AlertRules {
        /// Print the promtool unit tests of the rules instead of the rules.
        #[arg(long)]
        tests: bool,
    },
    /// Reproduce a paper's experiment on the simulator (`ultr experiment --help` lists them): runs
    /// the `ultr-lab` binary beside this one, or on PATH. Exit 0 when every claim holds, 1 otherwise.
    #[command(disable_help_flag = true)]
    Experiment {
        /// The experiment and its flags, handed to `ultr-lab experiment`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Args)]
struct IngestArgs {
    /// Pipeline config (TOML).
    #[arg(long)]
    config: PathBuf,
    /// State directory (default: `[state] dir`, else `ultr-state/<config name>`).
    #[arg(long)]
    state: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RulesTimeScaleArgs {
    /// The rules file, e.g. pipelines/alerts.yml.
    rules: PathBuf,
    /// Every duration is divided by this (120: an hour of rules time is 30 s).
    #[arg(long)]
    factor: f64,
    /// Where to write the result (default: standard output); what was scaled goes to standard error.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn rules_time_scale(args: &RulesTimeScaleArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.rules).with_context(|| format!("reading {}", args.rules.display()))?;
    let (scaled, found) = ultr::monitor::rules_time::scale_rules(&text, args.factor).map_err(|e| anyhow::anyhow!("{}: {e}", args.rules.display()))?;
    for f in &found {
        eprintln!("{}:{}: {} {} -> {}", args.rules.display(), f.line, f.kind, f.original, f.replacement);
    }
    match &args.out {
        Some(path) => std::fs::write(path, scaled).with_context(|| format!("writing {}", path.display()))?,
        None => print!("{scaled}"),
    }
    Ok(())
}

#[derive(Args)]
struct RekeyArgs {
    #[arg(long)]
    brokers: String,
    /// The topic as the upstream writes it.
    #[arg(long)]
    from: String,
    /// The topic `ultr` instances read (created with --partitions when absent).
    #[arg(long)]
    to: String,
    #[arg(long, default_value = "ultr-rekey")]
    group: String,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Stop after this many milliseconds without a record (default: run forever).
    #[arg(long)]
    idle_exit_ms: Option<u64>,
    /// librdkafka properties for both ends, `key=value`, repeatable.
    #[arg(long = "property", value_parser = parse_property)]
    properties: Vec<(String, String)>,
    /// A pipeline config whose `[decode]` format the records are in (JSON without it).
    #[arg(long = "format-of")]
    format_of: Option<PathBuf>,
}

#[derive(Args)]
struct CompactArgs {
    /// Pipeline config (TOML) with `[state.object_store]`.
    #[arg(long)]
    config: PathBuf,
    /// Local working directory; the merged view is written to `<state>/merged` (default: `[state]
    /// dir`, else `ultr-state/<config name>`).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Give up when the lease is still held by another instance after this long.
    #[arg(long, default_value = "5m")]
    wait: String,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RunArgs {
    /// Pipeline config (TOML), e.g. pipelines/demo.toml.
    config: PathBuf,
    /// State directory (default: `[state] dir`, else `ultr-state/<config name>`).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Address for /metrics and /healthz (overrides `[service] listen`).
    #[arg(long)]
    listen: Option<String>,
    /// Exit when a bounded source (file, simulator) ends instead of serving until SIGTERM.
    #[arg(long)]
    exit_when_done: bool,
}

#[derive(Args)]
struct IdentifiabilityArgs {
    #[arg(long)]
    state: PathBuf,
    /// Config whose `[identifiability]` thresholds and `[state].lookback` apply.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PlanArgs {
    #[arg(long)]
    state: PathBuf,
    /// Config whose `[state].lookback`, `[train].max_positions` and
    /// `[identifiability].max_theta_interval` apply.
    #[arg(long)]
    config: Option<PathBuf>,
    /// adjacent_swaps (FairPairs-style: each adjacent pair of an offset pairing swaps with
    /// probability ½) or rand_pair (position 1 swaps with a uniform k in 2..=K) (default
    /// `[identifiability.randomization] design`).
    #[arg(long)]
    design: Option<ultr_core::identify::plan::Design>,
    /// Share of sessions randomized, in (0, 1] (default `[identifiability.randomization] fraction`).
    #[arg(long)]
    fraction: Option<f64>,
    /// Target half-width of θ_k − θ_1's 95% interval for every position (default
    /// `[identifiability.randomization] epsilon`).
    #[arg(long)]
    epsilon: Option<f64>,
    /// A target for one position, `K=EPSILON` (repeatable; overrides --epsilon there).
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Positions the design randomizes, 1..=K (default `[train].max_positions`, cut to the deepest
    /// position the log shows).
    #[arg(long)]
    positions: Option<usize>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SimArgs {
    /// SVMlight/LETOR or LightGBM data file(s); none = synthetic features.
    #[arg(long = "data")]
    data: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t = SimConfig::default().format)]
    format: DataFormat,
    /// LightGBM group file (default `<data>.query`).
    #[arg(long)]
    query_file: Option<PathBuf>,
    #[arg(long, default_value_t = SyntheticData::default().queries)]
    synthetic_queries: usize,
    #[arg(long, default_value_t = SyntheticData::default().docs_per_query)]
    synthetic_docs: usize,
    #[arg(long, default_value_t = SyntheticData::default().features)]
    synthetic_features: usize,
    /// labels | linear | mlp (default: labels with a data file, linear without).
    #[arg(long, value_enum)]
    relevance: Option<RelevanceKind>,
    #[arg(long, default_value_t = SimConfig::default().noise)]
    noise: f64,
    #[arg(long, default_value_t = SimConfig::default().top_n)]
    top_n: usize,
    #[arg(long, value_enum, default_value_t = PolicyConfig::default().ranker)]
    ranker: RankerKind,
    #[arg(long, default_value_t = PolicyConfig::default().alpha, allow_hyphen_values = true)]
    alpha: f64,
    #[arg(long, value_enum, default_value_t = PolicyConfig::default().sampling)]
    sampling: Sampling,
    #[arg(long, default_value_t = PolicyConfig::default().tau)]
    tau: f64,
    #[arg(long, default_value_t = PolicyConfig::default().pl_temperature)]
    pl_temperature: f64,
    #[arg(long, default_value_t = PolicyConfig::default().policy_id)]
    policy_id: String,
    #[arg(long, value_enum, default_value_t = ClickModel::default().kind)]
    click_model: ClickModelKind,
    /// Mixture weights RCM:RCTR:DCTR:PBM.
    #[arg(long, default_value_t = ClickModel::mixture_text(&ClickModel::default().mixture))]
    mixture: String,
    #[arg(long, default_value_t = ClickModel::default().eta)]
    eta: f64,
    #[arg(long, default_value_t = SimConfig::default().sessions)]
    sessions: u64,
    #[arg(long, default_value_t = SimConfig::default().seed)]
    seed: u64,
    #[arg(long, default_value_t = SimConfig::default().interval_ms)]
    interval_ms: i64,
    #[arg(long)]
    no_features: bool,
    #[arg(long)]
    log_propensity: bool,
    /// With --log-propensity: log the propensities of this τ instead of the policy's (a stale logger).
    #[arg(long)]
    logged_tau: Option<f64>,
    /// Probability that a page lists one document twice (a repeat at a later position).
    #[arg(long, default_value_t = SimConfig::default().duplicate_rate)]
    duplicate_rate: f64,
    /// Randomize a share of sessions with a swap design: adjacent_swaps or rand_pair (unset: none).
    #[arg(long)]
    randomize: Option<ultr_core::identify::plan::Design>,
    /// Share of sessions `--randomize` randomizes.
    #[arg(long, default_value_t = 0.05)]
    randomize_fraction: f64,
    /// Positions 1..=K `--randomize` randomizes.
    #[arg(long, default_value_t = 10)]
    randomize_positions: usize,
    /// First session index `--randomize` may randomize.
    #[arg(long, default_value_t = 0)]
    randomize_from: u64,
}

impl SimArgs {
    pub fn to_config(&self) -> anyhow::Result<SimConfig> {
        let defaults = SimConfig::default();
        Ok(SimConfig {
            data: self.data.clone(),
            format: self.format,
            query_file: self.query_file.clone(),
            synthetic: SyntheticData { queries: self.synthetic_queries, docs_per_query: self.synthetic_docs, features: self.synthetic_features },
            relevance: self.relevance.unwrap_or(if self.data.is_empty() { RelevanceKind::Linear } else { RelevanceKind::Labels }),
            noise: self.noise,
            top_n: self.top_n,
            policy: PolicyConfig {
                ranker: self.ranker,
                alpha: self.alpha,
                sampling: self.sampling,
                tau: self.tau,
                pl_temperature: self.pl_temperature,
                policy_id: self.policy_id.clone(),
            },
            click_model: ClickModel { kind: self.click_model, eta: self.eta, mixture: ClickModel::parse_mixture(&self.mixture)?, ..ClickModel::default() },
            sessions: self.sessions,
            seed: self.seed,
            interval_ms: self.interval_ms,
            emit_features: !self.no_features,
            log_propensity: self.log_propensity,
            logged_tau: self.logged_tau,
            duplicate_rate: self.duplicate_rate,
            randomization: self.randomize.map(|design| ultr_simulate::Randomization {
                design,
                fraction: self.randomize_fraction,
                positions: self.randomize_positions,
                from_session: self.randomize_from,
            }),
            ..defaults
        })
    }
}

#[derive(Args)]
struct SimulateArgs {
    #[command(flatten)]
    sim: SimArgs,
    #[command(flatten)]
    sink: SessionSinkArgs,
    /// Ground-truth JSON output.
    #[arg(long)]
    truth: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TimeUnit {
    /// Milliseconds (CLARA 2's time field reads as milliseconds: its 31,564 pages span 82 days).
    Ms,
    S,
}

#[derive(Args)]
struct ImportArgs {
    /// The log, plain or gzip: query lines `SessionID TimePassed Q QueryID RegionID URL…` and click
    /// lines `SessionID TimePassed C URL`, tab-separated.
    log: PathBuf,
    /// The instant the log's time 0 stands for (RFC 3339, e.g. 2026-01-01T00:00:00Z).
    #[arg(long)]
    base_time: String,
    /// The unit of the log's time field.
    #[arg(long, value_enum, default_value = "ms")]
    time_unit: TimeUnit,
    /// `policy_id` of every session (the ranker that produced the log).
    #[arg(long, default_value = "logged")]
    policy_id: String,
    #[command(flatten)]
    sink: SessionSinkArgs,
    /// Refused lines and pages, one dead letter each (the format of every other dead letter).
    #[arg(long, default_value = "import-dead-letters.jsonl")]
    dead_letter: PathBuf,
    #[arg(long)]
    json: bool,
}

fn import(args: &ImportArgs) -> anyhow::Result<()> {
    use ultr_core::sources::click_log::TimeMapping;
    let base = chrono::DateTime::parse_from_rfc3339(&args.base_time)
        .with_context(|| format!("--base-time {:?}: not RFC 3339 (e.g. 2026-01-01T00:00:00Z)", args.base_time))?;
    let time = TimeMapping {
        base_ms: base.timestamp_millis(),
        unit_ms: match args.time_unit {
            TimeUnit::Ms => 1.0,
            TimeUnit::S => 1000.0,
        },
    };
    let mut sink = args.sink.open()?;
    // A fresh file per import, like the sessions it sits beside.
    std::fs::File::create(&args.dead_letter).with_context(|| format!("creating {}", args.dead_letter.display()))?;
    let mut dead = ultr_core::sinks::dead_letter::DeadLetterSink::file(&args.dead_letter)?;
    let summary = ultr_core::import::import_click_log(&args.log, time, &args.policy_id, sink.as_mut(), &mut dead)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!("{} lines → {} sessions, {} impressions, {} clicked", summary.lines, summary.sessions, summary.impressions, summary.clicks);
        for (reason, n) in &summary.refused {
            println!("  refused {reason}: {n} (see {})", args.dead_letter.display());
        }
    }
    Ok(())
}

/// Where `simulate` and `import` send sessions: a file (`-` for stdout) or a Kafka topic,
/// created with `partitions` when missing, in the format a pipeline config's `[decode]` names.
#[derive(Args)]
struct SessionSinkArgs {
    /// Output file (`.gz` for gzip; JSON one per line, a binary format each behind its varint
    /// length); `-` for stdout.
    #[arg(long, conflicts_with = "topic")]
    out: Option<PathBuf>,
    /// Kafka topic to publish to (with --brokers), keyed by query id.
    #[arg(long, requires = "brokers")]
    topic: Option<String>,
    #[arg(long)]
    brokers: Option<String>,
    /// Partitions when the topic has to be created.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// A pipeline config whose `[decode]` format the sessions are written in (with its schema
    /// registry, where the shipped schema is registered); JSON without it.
    #[arg(long = "format-of")]
    format_of: Option<PathBuf>,
}

impl SessionSinkArgs {
    fn open(&self) -> anyhow::Result<Box<dyn SessionSink>> {
        let decode = match &self.format_of {
            Some(path) => PipelineConfig::load(path)?.decode,
            None => Default::default(),
        };
        let codec = ultr_core::session::codec::open(&decode.codec())?;
        let framing = codec.file_framing();
        let inner: Box<dyn SessionSink> = match (&self.out, &self.topic, &self.brokers) {
            (_, Some(topic), Some(brokers)) => {
                ensure_topic(brokers, topic, self.partitions)?;
                Box::new(KafkaSink::new(brokers, topic, &BTreeMap::new())?)
            }
            (Some(p), _, _) if p.as_os_str() == "-" => Box::new(JsonlSink::to_writer(Box::new(std::io::stdout())).framed(framing)),
            (Some(p), _, _) => Box::new(JsonlSink::create(p)?.framed(framing)),
            _ => anyhow::bail!("say where sessions go: --out FILE or --topic T --brokers B"),
        };
        Ok(Box::new(ultr_core::sinks::encode::Encoding::new(codec, inner)))
    }
}

#[derive(Args)]
struct DecodeArgs {
    /// Session files, plain or gzip, in the format of `--config`'s `[decode]` (JSON without it).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Dead-letter JSONL file.
    #[arg(long, default_value = "dead-letters.jsonl")]
    dead_letter: PathBuf,
    /// Pipeline config whose `[decode]` format and limits apply.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ConsumeArgs {
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    #[arg(long)]
    topic: String,
    /// Consumer group; its own default, so a one-shot consume never moves the service's offsets.
    #[arg(long, default_value = "ultr-consume")]
    group: String,
    /// librdkafka properties, `key=value`, repeatable.
    #[arg(long = "property", value_parser = parse_property)]
    properties: Vec<(String, String)>,
    /// Stop after this long without messages.
    #[arg(long, default_value_t = 5000)]
    idle_exit_ms: u64,
    #[arg(long, default_value = "dead-letters.jsonl")]
    dead_letter: PathBuf,
    #[arg(long)]
    json: bool,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("`{s}` is not key=value"))
}

pub fn main() -> ExitCode {
    // `ULTR_LOG` (or `RUST_LOG`) filters; by default warnings, plus the story `ultr run` tells
    // (target `ultr::story`: windows, verdicts, trainings). `ULTR_LOG_FORMAT=json` writes JSON lines.
    let filter = tracing_subscriber::EnvFilter::try_from_env("ULTR_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| "warn,ultr::story=info".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if std::env::var("ULTR_LOG_FORMAT").is_ok_and(|f| f == "json") {
        logs.json().init();
    } else {
        // Colour codes only for a terminal: a log file or a collector gets plain lines.
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
    }
    ultr::opt_out_of_transparent_huge_pages();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => ultr::demo::run(&args),
        Command::Simulate(args) => simulate(&args),
        Command::Decode(args) => decode(&args),
        Command::Import(args) => import(&args),
        Command::ConfigReference => {
            print!("{}", ultr::config_reference::render());
            Ok(())
        }
        Command::AlertRules { tests } => {
            print!("{}", if tests { ultr::monitor::signals::alerts_test_yaml() } else { ultr::monitor::signals::alerts_yaml() });
            Ok(())
        }
        Command::Consume(args) => consume(&args),
        Command::Ingest(args) => ingest(&args),
        Command::Identifiability(args) => match identifiability(&args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Plan(args) => match plan(&args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Train(args) => match train::train(&args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Eval(args) => train::eval(&args),
        Command::Run(args) => run_service(&args),
        Command::Compact(args) => compact(&args),
        Command::Rekey(args) => rekey(&args),
        Command::Score(args) => train::score(&args),
        Command::Models(args) => train::models(&args),
        Command::RulesTimeScale(args) => rules_time_scale(&args),
        Command::Experiment { args } => match experiment(&args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `ultr experiment ARGS`: `ultr-lab experiment ARGS`, its exit status passed on. The laboratory is a
/// binary of its own (`crates/lab`), so that this binary never links it.
fn experiment(args: &[std::ffi::OsString]) -> anyhow::Result<ExitCode> {
    let name = format!("ultr-lab{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|dir| dir.join(&name))).filter(|p| p.is_file());
    let lab = beside.unwrap_or_else(|| PathBuf::from(&name));
    let status = std::process::Command::new(&lab).arg("experiment").args(args).status().with_context(|| {
        format!("`ultr experiment` runs the `{name}` binary, found neither beside this one nor on PATH (build it: cargo build --release -p ultr-lab)")
    })?;
    Ok(ExitCode::from(status.code().map_or(2, |c| c.clamp(0, 255) as u8)))
}

fn simulate(args: &SimulateArgs) -> anyhow::Result<()> {
    let config = args.sim.to_config()?;
    let started = std::time::Instant::now();
    let sim = Simulator::new(config)?;
    if let Some(path) = &args.truth {
        sim.truth().save(path)?;
    }
    let mut sink = args.sink.open()?;
    let n = sim.run(sink.as_mut())?;
    eprintln!(
        "simulated {n} sessions over {} queries in {:.2}s ({:.0} sessions/s)",
        sim.n_queries(),
        started.elapsed().as_secs_f64(),
        n as f64 / started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn limits_from(config: &Option<PathBuf>) -> anyhow::Result<DecodeLimits> {
    Ok(match config {
        Some(path) => PipelineConfig::load(path)?.decode,
        None => DecodeLimits::default(),
    })
}

fn print_summary(summary: &IngestSummary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(summary)?);
    } else {
        print!("{}", summary.render());
    }
    Ok(())
}

fn decode(args: &DecodeArgs) -> anyhow::Result<()> {
    let limits = limits_from(&args.config)?;
    let codec = ultr_core::session::codec::open(&limits.codec())?;
    let mut dead = DeadLetterSink::file(&args.dead_letter)?;
    let mut total = IngestSummary::default();
    for file in &args.files {
        let mut ingest = Ingest::new(FileSource::open(file, 0)?.framed(codec.file_framing()), limits.clone(), 4096).codec(codec.clone());
        total.absorb(ingest.drain(&mut dead, |_| {})?);
    }
    total.dead_letters = dead.counts().clone();
    print_summary(&total, args.json)
}

fn consume(args: &ConsumeArgs) -> anyhow::Result<()> {
    let config = KafkaSourceConfig {
        brokers: args.brokers.clone(),
        group_id: args.group.clone(),
        topics: vec![args.topic.clone()],
        properties: args.properties.iter().cloned().collect(),
        idle_exit_ms: Some(args.idle_exit_ms),
    };
    // No state here: continue from the group's committed offsets (then `auto.offset.reset`).
    let source = KafkaSource::from_group_offsets(&config).context("starting Kafka source")?;
    let mut ingest = Ingest::new(source, DecodeLimits::default(), 4096);
    let mut dead = DeadLetterSink::file(&args.dead_letter)?;
    let summary = ingest.drain(&mut dead, |_| {})?;
    ingest.source().commit(ingest.resume(), true)?;
    print_summary(&summary, args.json)
}

fn ingest(args: &IngestArgs) -> anyhow::Result<()> {
    let config = PipelineConfig::load(&args.config)?;
    let state = config.state_dir(args.state.as_deref(), &args.config);
    let mut progress = IngestProgress(ultr_core::progress::bar(config.expected_records(), "records"));
    let ingested = ultr::pipeline::ingest(&config.context(), &config, &state, &mut progress)?;
    progress.0.finish_and_clear();
    if let Some(merged) = &ingested.merged_view {
        eprintln!("merged view (as of this instance's last compaction or fetch): {}", merged.display());
    }
    let report = ingested.report;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let c = &report.counters;
        println!(
            "read {} records; {} sessions, {} impressions in windows; {} late sessions; {} duplicate sessions; {} repeated items dropped; {} windows closed this run; watermark {}",
            report.records,
            c.sessions,
            c.impressions,
            c.late_sessions,
            c.duplicate_sessions,
            c.repeated_items,
            report.windows_closed_this_run,
            report.watermark_ms
        );
    }
    Ok(())
}

/// `ultr ingest`'s progress: records read, their rate, and windows closed.
struct IngestProgress(indicatif::ProgressBar);

impl ultr::pipeline::Observer for IngestProgress {
    fn on_progress(&mut self, report: &ultr::pipeline::RunReport) {
        self.0.set_position(report.records);
        self.0.set_message(format!("{} windows closed, {} dead letters", report.counters.windows_closed, report.dead_letters.values().sum::<u64>()));
    }
}

fn rekey(args: &RekeyArgs) -> anyhow::Result<()> {
    let report = ultr_core::sinks::rekey::rekey(&ultr_core::sinks::rekey::Rekey {
        brokers: &args.brokers,
        from: &args.from,
        to: &args.to,
        group_id: &args.group,
        partitions: args.partitions,
        properties: &args.properties.iter().cloned().collect(),
        idle_exit: args.idle_exit_ms.map(std::time::Duration::from_millis),
        codec: ultr_core::session::codec::open(&limits_from(&args.format_of)?.codec())?,
    })?;
    println!("re-keyed {} records by query_id ({} without one kept their key)", report.records, report.without_query_id);
    Ok(())
}

fn compact(args: &CompactArgs) -> anyhow::Result<()> {
    let config = PipelineConfig::load(&args.config)?;
    let store = config.state.object_store.as_ref().with_context(|| format!("{}: no `[state.object_store]` to compact", args.config.display()))?;
    let state = config.state_dir(args.state.as_deref(), &args.config);
    let wait = ultr_core::units::parse_duration_ms(&args.wait).map_err(|e| anyhow::anyhow!("--wait: {e}"))?;
    let wait = std::time::Duration::from_millis(wait.max(0) as u64);
    let report = ultr::scale_out::compact_holding_the_lease(&config.context(), &config.core(), store, &state, wait)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "merged {} partitions: {} windows ({} re-merged, {} partition files) in {:.2}s into {}",
            report.partitions,
            report.windows,
            report.windows_merged,
            report.partition_files,
            report.seconds,
            ultr::scale_out::merged_dir(&state).display()
        );
    }
    Ok(())
}

fn run_service(args: &RunArgs) -> anyhow::Result<()> {
    let config = PipelineConfig::load(&args.config)?;
    let state = config.state_dir(args.state.as_deref(), &args.config);
    let report =
        ultr::service::run(&config, &ultr::service::ServiceOptions { state_dir: state, listen: args.listen.clone(), exit_when_done: args.exit_when_done })?;
    let c = &report.counters;
    eprintln!(
        "ultr run: read {} records; {} sessions, {} impressions in windows; {} late; {} duplicates",
        report.records, c.sessions, c.impressions, c.late_sessions, c.duplicate_sessions
    );
    Ok(())
}

/// True when identified.
fn identifiability(args: &IdentifiabilityArgs) -> anyhow::Result<bool> {
    let config = match &args.config {
        Some(p) => PipelineConfig::load(p)?,
        // Only the identifiability and training defaults matter here.
        None => PipelineConfig::parse("source = \"simulator\"", "(defaults)")?,
    };
    let cumulative = ultr_core::state::cumulative::of_state(&config.context(), &args.state, config.state.lookback_ms())?;
    ultr_core::state::cumulative::write(&args.state, &cumulative)?;
    let report = ultr_train::identifiability(&cumulative, &config.identifiability, &config.train)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(report.identified)
}

fn plan(args: &PlanArgs) -> anyhow::Result<bool> {
    use ultr_core::identify::plan::plan_cumulative;
    let config = match &args.config {
        Some(p) => PipelineConfig::load(p)?,
        None => PipelineConfig::parse("source = \"simulator\"", "(defaults)")?,
    };
    let positions = args.positions.unwrap_or(config.train.max_positions);
    let mut request = config.identifiability.plan_request(positions);
    request.design = args.design.unwrap_or(request.design);
    request.fraction = args.fraction.unwrap_or(request.fraction);
    if let Some(e) = args.epsilon {
        request.epsilon = vec![e; positions];
    }
    for t in &args.targets {
        let (k, e) = t.split_once('=').with_context(|| format!("--target `{t}`: expected K=EPSILON, e.g. 10=0.3"))?;
        let k: usize = k.trim().parse().with_context(|| format!("--target `{t}`: position `{k}` is not a number"))?;
        let e: f64 = e.trim().parse().with_context(|| format!("--target `{t}`: half-width `{e}` is not a number"))?;
        anyhow::ensure!((2..=positions).contains(&k), "--target `{t}`: position {k} is outside 2..={positions}");
        request.epsilon[k - 1] = e;
    }
    let cumulative = ultr_core::state::cumulative::of_state(&config.context(), &args.state, config.state.lookback_ms())?;
    let plan = plan_cumulative(&cumulative, &request).map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", plan.render());
    }
    Ok(plan.sessions_needed().is_some())
}
