//! Training on aggregated rows vs raw impressions (issue 11): a 28-window horizon of simulated MQ2008
//! sessions (MLP tower), ingested into a state; the aggregated path loads the state's training rows,
//! the raw path re-simulates the same stream and packs every impression (with the same π(d,k|q) and
//! the same hold-out split). Reports seconds per epoch, epochs to early stopping, θ of both, and the
//! process's peak RSS after each stage.
//!
//! `cargo bench --bench ultr -- aggregated_training` (optionally followed by `SESSIONS EPOCHS BATCH_ROWS [aggregated]`;
//! default 2,000,000 3 512; `aggregated` skips the raw path, for profiling; `chunked [VISITS]` compares the
//! aggregated path in memory with the same streamed in chunks of an eighth of its size; `converged`
//! trains the raw path and both kinds of aggregated epoch to early stopping, EPOCHS the cap, and
//! reports the wall time of each fit). Otherwise both paths run the same number of epochs (the same
//! number of optimizer steps) so θ is compared like for like.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, AsArray, Float64Array, RecordBatch};
use datafusion::arrow::datatypes::UInt32Type;
use ultr::config::{PipelineConfig, SourceConfig};
use ultr::ingest::{Ingest, Next};
use ultr::session::DecodeLimits;
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::source::SimulatorSource;
use ultr::simulate::{SimConfig, Simulator};
use ultr::train::chunks::load_training_data;
use ultr::train::config::{AggregatedEpoch, TrainConfig};
use ultr::train::data::{load_from_state, ExamplesBuilder, Horizon};
use ultr::train::fit::{fit, fit_chunks, FitReport};

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(f64::NAN) / 1024.0
}

fn per_epoch(r: &FitReport) -> f64 {
    r.epochs.iter().map(|e| e.seconds).sum::<f64>() / r.epochs.len().max(1) as f64
}

pub fn main(args: &[String]) {
    let sessions: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(2_000_000);
    let epochs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let batch_rows: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(TrainConfig::default().batch_rows);
    let data = ultr::simulate::dataset::default_mq2008_dir().expect("MQ2008 (set ULTR_DATA_DIR)");
    let dir = tempfile::tempdir().unwrap();
    let mut config = PipelineConfig::parse("source = \"simulator\"\n[window]\nsize = \"2h\"\n", "bench").unwrap();
    config.source = SourceConfig::Simulator;
    config.simulator =
        SimConfig { data: (1..=5).map(|i| data.join(format!("S{i}.txt"))).collect(), relevance: RelevanceKind::Mlp, sessions, ..SimConfig::default() };
    config.simulator.policy.tau = 0.3;
    // A horizon of 28 windows: the stream's event time spans sessions × interval.
    let span_ms = sessions as i64 * config.simulator.interval_ms;
    config.window.size = format!("{}ms", (span_ms / 28).max(1)).parse().expect("a duration");
    let t = Instant::now();
    ultr::pipeline::run_to_state(&config, dir.path(), &mut ultr::pipeline::NoObserver).unwrap();
    let ingest_s = t.elapsed().as_secs_f64();
    let manifest = ultr::state::read_manifest(dir.path()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lookback = config.state.lookback_ms();
    let t = Instant::now();
    let agg = rt
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
    let load_agg_s = t.elapsed().as_secs_f64();
    let rss_after_agg = peak_rss_mb();
    println!(
        "{sessions} sessions in {} windows, ingested in {ingest_s:.1}s; aggregated: {} rows for {} impressions, loaded in {load_agg_s:.1}s (peak RSS {rss_after_agg:.0} MB)",
        manifest.windows.len(),
        agg.rows.len(),
        agg.impressions()
    );

    let cfg = TrainConfig { max_epochs: epochs, patience: epochs + 1, batch_rows, ..TrainConfig::default() };
    if args.get(3).is_some_and(|a| a == "chunked") {
        // The aggregated path in memory vs streamed in chunks of an eighth of the examples
        // (`[train] memory_budget`); peak RSS is reset before each (Linux clear_refs).
        let reset_peak = || std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak RSS");
        let budget = agg.approx_bytes() / 8;
        let cfg = TrainConfig { chunk_visits: args.get(4).and_then(|a| a.parse().ok()).unwrap_or(cfg.chunk_visits), ..cfg };
        println!("chunk_visits = {}", cfg.chunk_visits);
        drop(agg);
        let mut figures = Vec::new();
        for limit in [usize::MAX, budget] {
            reset_peak();
            let t = Instant::now();
            let spill = dir.path().join("spill");
            let data = rt
                .block_on(load_training_data(
                    &ultr::context::PipelineContext::default(),
                    dir.path(),
                    &manifest,
                    lookback,
                    Horizon::Lookback(lookback),
                    50,
                    &Default::default(),
                    limit,
                    &spill,
                ))
                .unwrap();
            let load_s = t.elapsed().as_secs_f64();
            let (model, r) = fit_chunks(data.chunks(), &cfg, None, false, None).unwrap();
            figures.push((limit, r.train_chunks, load_s, per_epoch(&r), r.best_validation_loss, peak_rss_mb(), model.position_bias()));
        }
        println!("\n| memory budget | training chunks | load s | s/epoch | best val loss | peak RSS of load + fit, MB |");
        println!("|---|---|---|---|---|---|");
        for (limit, chunks, load_s, epoch_s, loss, rss, _) in &figures {
            let limit = if *limit == usize::MAX { "unlimited".to_string() } else { format!("{:.1} MB", *limit as f64 / 1e6) };
            println!("| {limit} | {chunks} | {load_s:.1} | {epoch_s:.2} | {loss:.5} | {rss:.0} |");
        }
        let (ta, tb) = (&figures[0].6, &figures[1].6);
        println!("max |Δθ| over k ≤ 10, chunked vs in memory: {:.4}", ta[..10].iter().zip(&tb[..10]).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max));
        return;
    }
    if args.get(3).is_some_and(|a| a == "aggregated") {
        let (_, r) = fit(&agg, &cfg, None, false).unwrap();
        println!("aggregated only: {:.2} s/epoch over {} epochs, best val loss {:.5}", per_epoch(&r), r.epochs.len(), r.best_validation_loss);
        return;
    }

    // The raw path: every impression, with the state's π and the same split.
    let pi: HashMap<(String, String, u32), f64> =
        agg.rows.iter().map(|r| ((agg.qd_keys[r.qd as usize].0.clone(), agg.qd_keys[r.qd as usize].1.clone(), r.position), r.propensity)).collect();
    let t = Instant::now();
    let sim = Arc::new(Simulator::new(config.simulator.clone()).unwrap());
    let mut ingest = Ingest::new(SimulatorSource::new(sim, 0), DecodeLimits::default(), 4096);
    let mut builder = ExamplesBuilder::new(50);
    loop {
        match ingest.next().unwrap() {
            Next::Batch(b) => builder.add(&with_propensity(&b.impressions, &pi)).unwrap(),
            Next::Idle => {}
            Next::End => break,
        }
    }
    let raw = builder.finish().unwrap();
    let rss_after_raw = peak_rss_mb();
    println!(
        "raw: {} rows for {} impressions in {} sessions, built in {:.1}s (peak RSS {rss_after_raw:.0} MB)",
        raw.rows.len(),
        raw.impressions(),
        raw.sessions.len(),
        t.elapsed().as_secs_f64()
    );

    if args.get(3).is_some_and(|a| a == "converged") {
        // Each path trained to early stopping (patience as the default config, EPOCHS the cap): the
        // raw impressions, the aggregated rows drawn ∝ impressions (the raw path's steps per epoch)
        // and the aggregated rows walked once per epoch, count-weighted (`aggregated_epoch = "rows"`).
        let cfg = TrainConfig { max_epochs: epochs, patience: TrainConfig::default().patience, batch_rows, ..TrainConfig::default() };
        let rows = TrainConfig { aggregated_epoch: AggregatedEpoch::Rows, ..cfg.clone() };
        let mut figures = Vec::new();
        for (name, ex, c) in [("raw", &raw, &cfg), ("aggregated, drawn ∝ impressions", &agg, &cfg), ("aggregated, every row once", &agg, &rows)] {
            let t = Instant::now();
            let (model, r) = fit(ex, c, None, false).unwrap();
            figures.push((name, r, t.elapsed().as_secs_f64(), model.position_bias()));
        }
        println!("\n| path | s/epoch | epochs (best) | fit wall s | best val loss | max |Δθ| vs raw, k ≤ 10 |");
        println!("|---|---|---|---|---|---|");
        for (name, r, wall, theta) in &figures {
            let d = figures[0].3[..10].iter().zip(&theta[..10]).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
            println!(
                "| {name} | {:.2} | {} ({}, {:?}) | {wall:.1} | {:.5} | {d:.4} |",
                per_epoch(r),
                r.epochs.len(),
                r.best_epoch,
                r.stop,
                r.best_validation_loss
            );
        }
        for (name, _, _, theta) in &figures {
            println!("θ_k − θ_1, k = 1..10, {name}: {:.3?}", &theta[..10]);
        }
        return;
    }
    let (raw_model, raw_report) = fit(&raw, &cfg, None, false).unwrap();
    let (agg_model, agg_report) = fit(&agg, &cfg, None, false).unwrap();
    let (tr, ta) = (raw_model.position_bias(), agg_model.position_bias());
    println!("\n| path | rows | s/epoch | epochs | total s | best val loss |");
    println!("|---|---|---|---|---|---|");
    for (name, ex, r) in [("raw", &raw, &raw_report), ("aggregated", &agg, &agg_report)] {
        println!("| {name} | {} | {:.2} | {} ({:?}) | {:.1} | {:.5} |", ex.rows.len(), per_epoch(r), r.epochs.len(), r.stop, r.seconds, r.best_validation_loss);
    }
    println!("\nper-epoch speed-up: {:.0}×", per_epoch(&raw_report) / per_epoch(&agg_report));
    println!("θ_k − θ_1, k = 1..10, raw:        {:.3?}", &tr[..10]);
    println!("θ_k − θ_1, k = 1..10, aggregated: {:.3?}", &ta[..10]);
    println!("max |Δθ| over k ≤ 10: {:.4}", tr[..10].iter().zip(&ta[..10]).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max));
}

/// The batch with its `propensity` column replaced by the state's cumulative π(d,k|q).
fn with_propensity(batch: &RecordBatch, pi: &HashMap<(String, String, u32), f64>) -> RecordBatch {
    let q = batch.column_by_name("query_id").unwrap().as_string::<i32>();
    let d = batch.column_by_name("doc_id").unwrap().as_string::<i32>();
    let k = batch.column_by_name("position").unwrap().as_primitive::<UInt32Type>();
    let values: Float64Array = (0..batch.num_rows()).map(|i| pi.get(&(q.value(i).to_string(), d.value(i).to_string(), k.value(i))).copied()).collect();
    let idx = batch.schema().index_of("propensity").unwrap();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[idx] = Arc::new(values);
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}
