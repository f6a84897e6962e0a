//! Reproductions of published experiments, one file each: Hager 2025 through the real pipeline,
//! Zhang 2023, Yan 2022 and Zhuang 2021 on simulated logs through the shared fit loop.

use serde::Serialize;

pub mod hager2025;
pub mod plot;
pub mod population;
pub mod yan2022;
pub mod zhang2023;
pub mod zhuang2021;

/// Runs `work` on every cell with `jobs` cells at a time. `work` hands each result to `emit`, which
/// collects it and shows it to `progress` with its 1-based count; the first error empties the queue
/// and is returned.
pub fn run_cells<C: Send, R: Send>(
    cells: Vec<C>,
    jobs: usize,
    work: impl Fn(C, &dyn Fn(R)) -> anyhow::Result<()> + Sync,
    progress: impl Fn(usize, &R) + Sync,
) -> anyhow::Result<Vec<R>> {
    let queue = std::sync::Mutex::new(std::collections::VecDeque::from(cells));
    let results: std::sync::Mutex<Vec<R>> = std::sync::Mutex::new(Vec::new());
    let failure: std::sync::Mutex<Option<anyhow::Error>> = std::sync::Mutex::new(None);
    let emit = |r: R| {
        let mut all = results.lock().expect("results");
        progress(all.len() + 1, &r);
        all.push(r);
    };
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let Some(cell) = queue.lock().expect("queue").pop_front() else { break };
                if let Err(e) = work(cell, &emit) {
                    *failure.lock().expect("failure") = Some(e);
                    queue.lock().expect("queue").clear();
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().expect("failure") {
        return Err(e);
    }
    Ok(results.into_inner().expect("results"))
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
