//! The one place `ultr` builds tokio runtimes, with the worker threads `[runtime]` sets.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use tokio::runtime::{Builder, Runtime};

/// Async runtimes (`[runtime]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker threads of each multi-threaded runtime (the SQL of windows, state and training data,
    /// the object store's client). Applied when the pipeline file is loaded.
    pub worker_threads: usize,
    /// Ingest workers: pipelines side by side, each assigning its share of the queries (by a hash of
    /// `query_id`) to windows on its own thread, while one reader decodes for all and merges their
    /// closed windows in memory into the state's merged view, where each is written once. Each worker
    /// holds its own open windows' partials and buffers (about `window.reduce_rows` rows), so more
    /// workers cost memory. Default 1: on 2 cores a second worker measured slower with 10-minute
    /// windows (docs/benchmarks.md, ingest). A state keeps the count it was created with.
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

    /// Ingest workers of a new state.
    pub fn ingest_workers(&self) -> usize {
        self.workers.unwrap_or(1).max(1)
    }
}

const DEFAULT_WORKER_THREADS: usize = 2;

static WORKER_THREADS: AtomicUsize = AtomicUsize::new(DEFAULT_WORKER_THREADS);

/// Makes every runtime built after it use `config`'s threads.
pub fn configure(config: &RuntimeConfig) {
    WORKER_THREADS.store(config.worker_threads.max(1), Ordering::Relaxed);
}

/// A multi-threaded runtime with the configured worker threads, its threads named `name`.
pub fn multi_thread(name: &str) -> std::io::Result<Runtime> {
    with_threads(name, WORKER_THREADS.load(Ordering::Relaxed))
}

/// A multi-threaded runtime with `threads` workers (a server that needs no more than one).
pub fn with_threads(name: &str, threads: usize) -> std::io::Result<Runtime> {
    Builder::new_multi_thread().worker_threads(threads.max(1)).thread_name(name).enable_all().build()
}

/// A runtime on the calling thread, for short blocking calls.
pub fn current_thread() -> std::io::Result<Runtime> {
    Builder::new_current_thread().enable_all().build()
}
