//! Training throughput (impressions/s per epoch) per tower and burn backend, on MQ2008 sessions
//! streamed through the pipeline. Threads: run with `RAYON_NUM_THREADS=1` and `=2`.
//!
//! `cargo bench --bench ultr --features ndarray-backend -- training` (optionally followed by `SESSIONS EPOCHS`);
//! without the feature only burn-flex is measured.

use std::time::Instant;

use ultr::config::{PipelineConfig, SourceConfig};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::SimConfig;
use ultr::train::config::{TowerKind, TrainConfig};
use ultr::train::data::{load_from_state, Horizon};
use ultr::train::device::BackendKind;
use ultr::train::fit::fit;

pub fn main(args: &[String]) {
    let sessions: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(50_000);
    let epochs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let data = ultr::simulate::dataset::default_mq2008_dir().expect("MQ2008 (set ULTR_DATA_DIR)");
    let dir = tempfile::tempdir().unwrap();
    let mut config = PipelineConfig::parse("source = \"simulator\"\n", "bench").unwrap();
    config.source = SourceConfig::Simulator;
    config.simulator =
        SimConfig { data: (1..=5).map(|i| data.join(format!("S{i}.txt"))).collect(), relevance: RelevanceKind::Mlp, sessions, ..SimConfig::default() };
    config.simulator.policy.tau = 0.3;
    let t = Instant::now();
    ultr::pipeline::run_to_state(&config, dir.path(), &mut ultr::pipeline::NoObserver).unwrap();
    let manifest = ultr::state::read_manifest(dir.path()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lookback = config.state.lookback_ms();
    let ex = rt
        .block_on(load_from_state(
            &ultr::context::PipelineContext::default(),
            dir.path(),
            &manifest,
            lookback,
            Horizon::Lookback(lookback),
            50,
            &Default::default(),
        ))
        .unwrap();
    println!(
        "{} sessions, {} impressions, {} distinct feature rows ({:.1}s to simulate, window and load); RAYON_NUM_THREADS={}",
        ex.sessions.len(),
        ex.rows.len(),
        ex.n_docs(),
        t.elapsed().as_secs_f64(),
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset".into())
    );
    println!("{:<10} {:<8} {:>14} {:>10}", "tower", "backend", "impressions/s", "s/epoch");
    let mut backends = vec![BackendKind::Flex];
    if cfg!(feature = "ndarray-backend") {
        backends.push(BackendKind::Ndarray);
    }
    for tower in [TowerKind::Embedding, TowerKind::Linear, TowerKind::Mlp] {
        for &backend in &backends {
            let cfg = TrainConfig { tower, backend, max_epochs: epochs, patience: epochs + 1, ..TrainConfig::default() };
            let (_, report) = fit(&ex, &cfg, None, false).unwrap();
            let per_epoch = report.epochs.iter().map(|e| e.impressions_per_second).sum::<f64>() / report.epochs.len() as f64;
            let secs = report.epochs.iter().map(|e| e.seconds).sum::<f64>() / report.epochs.len() as f64;
            println!("{:<10} {:<8} {:>14.0} {:>10.2}", format!("{tower:?}"), format!("{backend:?}"), per_epoch, secs);
        }
    }
}
