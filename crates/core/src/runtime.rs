//! `[runtime]`: the worker threads of a pipeline context's runtimes (`crate::context`), the ingest
//! workers, and the long-lived thread pools CPU work is spread over.

use serde::{Deserialize, Serialize};

/// Async runtimes (`[runtime]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker threads of each multi-threaded runtime (the SQL of windows, state and training data,
    /// the object store's client): the pipeline context's (`PipelineConfig::context`).
    pub worker_threads: usize,
    /// Ingest workers: pipelines side by side, each assigning its share of the queries (by a hash of
    /// `query_id`) to windows on its own thread, while one reader reads for all, each poll is decoded
    /// in one stretch per worker side by side, and their closed windows are merged in memory into the
    /// state's merged view, where each is written once (a window per worker at a time). Each worker
    /// holds its own open windows' partials and buffers (about `window.reduce_rows` rows), so more
    /// workers cost memory. Default: the cores this process may use, at most 2 — the most measured
    /// faster than one fewer (docs/benchmarks.md); set more to try. A state keeps the count
    /// it was created with.
    pub workers: Option<usize>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig { worker_threads: DEFAULT_WORKER_THREADS, workers: None }
    }
}

impl RuntimeConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.worker_threads == 0 {
            return Err("key `runtime.worker_threads` must be >= 1".into());
        }
        if self.workers == Some(0) {
            return Err("key `runtime.workers` must be >= 1".into());
        }
        Ok(())
    }

    /// Ingest workers of a new state: `workers`, or the default (see there).
    pub fn ingest_workers(&self) -> usize {
        self.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(MEASURED_WORKERS)).max(1)
    }
}

const DEFAULT_WORKER_THREADS: usize = crate::context::DEFAULT_WORKER_THREADS;

/// The most ingest workers measured faster than one fewer, each on as many cores: 2 beat 1 on 2
/// cores, 1 beat 2 on 1 (docs/benchmarks.md).
const MEASURED_WORKERS: usize = 2;

/// `f` over `items` on `threads` long-lived threads (`ultr-work-<i>`, one pool per count, kept for
/// the process), results in `items`' order; 1 thread or 1 item: in order on the caller's thread.
/// Long-lived, so each thread's allocator heap is reused rather than abandoned at every call (threads
/// started per call held more memory: docs/benchmarks.md).
pub fn in_threads<T: Send, R: Send>(items: Vec<T>, threads: usize, f: impl Fn(T) -> R + Sync + Send) -> Vec<R> {
    use rayon::prelude::*;
    if threads <= 1 || items.len() <= 1 {
        return items.into_iter().map(f).collect();
    }
    match pool(threads) {
        Some(pool) => pool.install(|| items.into_par_iter().map(f).collect()),
        None => items.into_iter().map(f).collect(),
    }
}

/// The pool of `threads` threads; `None` where threads cannot be started (the work runs in order).
fn pool(threads: usize) -> Option<std::sync::Arc<rayon::ThreadPool>> {
    static POOLS: std::sync::OnceLock<parking_lot::Mutex<std::collections::HashMap<usize, std::sync::Arc<rayon::ThreadPool>>>> = std::sync::OnceLock::new();
    let mut pools = POOLS.get_or_init(Default::default).lock();
    if let Some(pool) = pools.get(&threads) {
        return Some(pool.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("ultr-work-{i}")).build();
    match pool {
        Ok(pool) => Some(pools.entry(threads).or_insert(std::sync::Arc::new(pool)).clone()),
        Err(e) => {
            tracing::warn!("starting {threads} work threads: {e}; working on one");
            None
        }
    }
}
