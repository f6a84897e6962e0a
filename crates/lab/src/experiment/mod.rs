//! Reproductions of published experiments, one file each: Hager 2025 through the real pipeline,
//! Zhang 2023, Yan 2022 and Zhuang 2021 on simulated logs through the shared fit loop.

use serde::Serialize;

pub mod hager2025;
pub mod plot;
pub mod population;
pub mod propensity_smoothing;
pub mod theta_coverage;
pub mod yan2022;
pub mod zhang2023;
pub mod zhuang2021;

/// Writes a CSV table: the header, then rows whose fields the caller formats (fixed decimals, as the
/// summaries print them); csv quotes any field that needs it.
/// MQ2008's directory (named, else found where the data is kept) and LightGBM's rank directory
/// (named; `none` for none; else found beside MQ2008's, if there).
pub fn data_dirs(
    mq2008: Option<&std::path::Path>,
    lightgbm_rank: Option<&std::path::Path>,
) -> anyhow::Result<(std::path::PathBuf, Option<std::path::PathBuf>)> {
    use anyhow::Context;
    let mq = match mq2008 {
        Some(d) => d.to_path_buf(),
        None => crate::simulate::dataset::default_mq2008_dir().context("MQ2008 not found: pass its directory (with S1.txt … S5.txt)")?,
    };
    let rank = match lightgbm_rank {
        Some(d) if d.as_os_str() == "none" => None,
        Some(d) => Some(d.to_path_buf()),
        None => mq.parent().map(|p| p.join("lightgbm-rank")).filter(|d| crate::simulate::dataset::data_file_exists(&d.join("rank.train"))),
    };
    Ok((mq, rank))
}

/// MQ2008's five folds S1.txt … S5.txt in `dir` (else where the data is kept), each checked to exist.
pub fn mq2008_folds(dir: Option<&std::path::Path>) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let (dir, _) = data_dirs(dir, Some(std::path::Path::new("none")))?;
    let folds: Vec<std::path::PathBuf> = (1..=5).map(|i| dir.join(format!("S{i}.txt"))).collect();
    for f in &folds {
        anyhow::ensure!(crate::simulate::dataset::data_file_exists(f), "{} does not exist (nor gzipped)", f.display());
    }
    Ok(folds)
}

pub fn write_csv(path: &std::path::Path, header: &[String], rows: impl IntoIterator<Item = Vec<String>>) -> anyhow::Result<()> {
    let mut out = csv::Writer::from_path(path)?;
    out.write_record(header)?;
    for row in rows {
        out.write_record(&row)?;
    }
    out.flush()?;
    Ok(())
}

/// Turns a header written as one comma-separated line into its fields.
pub fn header(line: &str) -> Vec<String> {
    line.split(',').map(str::to_string).collect()
}

/// Runs `work` on every cell with `jobs` cells at a time. `work` hands each result to `emit`, which
/// collects it and shows it to `progress` with its 1-based count; the first error empties the queue
/// and is returned.
pub fn run_cells<C: Send, R: Send>(
    cells: Vec<C>,
    jobs: usize,
    work: impl Fn(C, &dyn Fn(R)) -> anyhow::Result<()> + Sync,
    progress: impl Fn(usize, &R) + Sync,
) -> anyhow::Result<Vec<R>> {
    let bar = ultr_core::progress::bar(Some(cells.len() as u64), "cells");
    let queue = parking_lot::Mutex::new(std::collections::VecDeque::from(cells));
    let results: parking_lot::Mutex<Vec<R>> = parking_lot::Mutex::new(Vec::new());
    let failure: parking_lot::Mutex<Option<anyhow::Error>> = parking_lot::Mutex::new(None);
    let emit = |r: R| {
        let mut all = results.lock();
        bar.suspend(|| progress(all.len() + 1, &r));
        all.push(r);
    };
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let Some(cell) = queue.lock().pop_front() else { break };
                if let Err(e) = work(cell, &emit) {
                    *failure.lock() = Some(e);
                    queue.lock().clear();
                }
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    Ok(results.into_inner())
}

/// The streaming core's settings an experiment runs with: every `[window]`, `[state]` and `[decode]`
/// default, and `[train]`'s default holdout.
pub fn simulator_core_config(sim: &crate::simulate::SimConfig) -> ultr_core::config::CoreConfig {
    ultr_core::config::CoreConfig::defaults(crate::simulate::source::source_identity(sim), ultr_train::config::TrainConfig::default().holdout())
}

/// Streams one simulated log through the real pipeline (simulator → windows → state) in the scratch
/// directory `dir` and loads its training examples, with the simulator's ground truth.
pub fn examples_through_pipeline(
    sim: crate::simulate::SimConfig,
    dir: &std::path::Path,
    max_positions: usize,
    ips: &ultr_train::config::IpsConfig,
) -> anyhow::Result<(ultr_train::data::Examples, crate::simulate::GroundTruth)> {
    use ultr_train::data::{load_from_state, Horizon};
    let truth = crate::simulate::Simulator::new(sim.clone())?.truth().clone();
    let mut config = simulator_core_config(&sim);
    config.state.checkpoint_every_records = 1_000_000;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let context = ultr_core::context::PipelineContext::default();
    crate::simulate::source::run_to_state(&context, &sim, &config, dir, &mut ultr_core::pipeline::NoObserver)?;
    let manifest = ultr_core::state::read_manifest(dir)?;
    let lookback = config.state.lookback_ms();
    let ex = context.run("ultr-lab", load_from_state(&context, dir, &manifest, lookback, Horizon::Lookback(lookback), max_positions, ips))??;
    std::fs::remove_dir_all(dir).ok(); // the examples are in memory; the state is scratch
    Ok((ex, truth))
}

/// A paper's claim checked on one dataset's runs.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub dataset: String,
    pub claim: u8,
    pub statement: String,
    pub holds: bool,
    pub detail: String,
}

impl Check {
    /// The summary.md line: dataset, claim, verdict and the numbers behind it.
    pub fn markdown_line(&self) -> String {
        format!("- {} claim {}: {} — **{}** ({})\n", self.dataset, self.claim, self.statement, if self.holds { "holds" } else { "does not hold" }, self.detail)
    }
}
