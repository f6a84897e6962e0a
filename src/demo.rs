//! `ultr demo`: the embedded default run — simulate a stream with known truth, decode it, compute the
//! per-position CTR in DataFusion SQL, and compare with the simulator's analytic expectation.

use std::path::PathBuf;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{Float64Type, Int64Type, UInt32Type};

use crate::config::{DeadLetterConfig, PipelineConfig};
use ultr_core::ingest::Ingest;
use ultr_core::session::DecodeLimits;
use ultr_core::sinks::dead_letter::DeadLetterSink;
use ultr_core::window::position_ctr;
use ultr_simulate::click::{ClickModel, ClickModelKind};
use ultr_simulate::relevance::RelevanceKind;
use ultr_simulate::source::SimulatorSource;
use ultr_simulate::{PolicyConfig, SimConfig};

#[derive(clap::Args)]
pub struct DemoArgs {
    #[arg(long, default_value_t = 20_000)]
    sessions: u64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Where the demo writes its dead letters.
    #[arg(long, default_value = "ultr-demo")]
    out: PathBuf,
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let config = SimConfig {
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
        click_model: ClickModel { kind: ClickModelKind::AdditivePbm, ..ClickModel::default() },
        sessions: args.sessions,
        seed: args.seed,
        ..SimConfig::default()
    };
    println!("ultr demo: {} simulated sessions (synthetic features, additive PBM, ε-greedy τ = 0.3)", args.sessions);
    let sim = std::sync::Arc::new(ultr_simulate::Simulator::new(config)?);
    let started = std::time::Instant::now();
    let mut ingest = Ingest::new(SimulatorSource::new(sim.clone(), 0), DecodeLimits::default(), 4096);
    std::fs::create_dir_all(&args.out)?;
    let dead_path = args.out.join("dead-letters.jsonl");
    let mut dead = DeadLetterSink::file(&dead_path)?;
    let mut batches = Vec::new();
    let summary = ingest.drain(&mut dead, |b| batches.push(b.impressions))?;
    let elapsed = started.elapsed().as_secs_f64();
    print!("{}", summary.render());
    println!("simulate + decode: {:.2}s ({:.0} impressions/s)", elapsed, summary.impressions as f64 / elapsed);

    let context = ultr_core::context::PipelineContext::default();
    let ctr = context.run("ultr-demo", position_ctr(context.statements(), batches))??;
    let expected = sim.truth().expected_position_ctr().unwrap_or_default();
    println!("\nposition  impressions   ctr     expected  z");
    for b in &ctr {
        let pos = b.column(0).as_primitive::<UInt32Type>();
        let imp = b.column(1).as_primitive::<Int64Type>();
        let rate = b.column(3).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            let k = pos.value(i) as usize;
            let (p, _) = expected.get(k - 1).copied().unwrap_or((f64::NAN, 0));
            let se = (p * (1.0 - p) / imp.value(i) as f64).sqrt();
            println!("{k:>8}  {:>11}  {:.4}  {p:.4}    {:+.2}", imp.value(i), rate.value(i), (rate.value(i) - p) / se);
        }
    }

    // The same stream through windows (10 min), Parquet state and the identifiability analysis.
    let state = args.out.join("state");
    if state.exists() {
        std::fs::remove_dir_all(&state)?; // the demo starts clean each time
    }
    let mut pipeline = PipelineConfig::parse("source = \"simulator\"\n[window]\nsize = \"10m\"\n", "demo")?;
    pipeline.simulator = sim.config().clone();
    pipeline.dead_letter = Some(DeadLetterConfig::file(dead_path.clone()));
    let report = crate::pipeline::run_to_state(&pipeline, &state, &mut crate::pipeline::NoObserver)?;
    println!(
        "\nwindows: {} closed, {} sessions, {} late, {} duplicates → state in {}",
        report.counters.windows_closed,
        report.counters.sessions,
        report.counters.late_sessions,
        report.counters.duplicate_sessions,
        state.display()
    );
    let cumulative = ultr_core::state::cumulative::of_state(&context, &state, pipeline.state.lookback_ms())?;
    ultr_core::state::cumulative::write(&state, &cumulative)?;
    let analysis = ultr_train::identifiability(&cumulative, &pipeline.identifiability, &pipeline.train)?;
    print!("\n{}", analysis.render());
    println!("\ndead letters: {}", dead_path.display());
    Ok(())
}
