//! The pipeline context: what a pipeline's work runs on — its async runtimes and their worker
//! threads, and the memory pool and prepared statements of its SQL — built once from the settings
//! (`[runtime] worker_threads`, `[state] query_memory_limit`) and handed to the work. Nothing here is
//! process-global: two pipelines in one process each run with their own settings. Every runtime of
//! the library is built here and every future it blocks on is run here (`PipelineContext::run`,
//! `Runner::run`, `run_here`).

use std::future::Future;
use std::sync::Arc;

use datafusion::prelude::SessionContext;
use tokio::runtime::{Builder, Runtime};

use crate::window::prepared::Statements;
use crate::window::sql::{query_session, sql_env, DEFAULT_QUERY_MEMORY_LIMIT};

/// Worker threads of a context's runtimes when not set.
pub const DEFAULT_WORKER_THREADS: usize = 2;

/// A pipeline's runtimes and SQL engine; cheap to clone (clones share the memory pool and the
/// prepared statements).
#[derive(Clone)]
pub struct PipelineContext {
    worker_threads: usize,
    query_memory_limit: usize,
    statements: Arc<Statements>,
}

impl std::fmt::Debug for PipelineContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineContext").field("worker_threads", &self.worker_threads).field("query_memory_limit", &self.query_memory_limit).finish()
    }
}

impl Default for PipelineContext {
    fn default() -> Self {
        PipelineContext::new(DEFAULT_WORKER_THREADS, DEFAULT_QUERY_MEMORY_LIMIT)
    }
}

impl PipelineContext {
    /// Runtimes of `worker_threads` workers; queries that share a pool of `query_memory_limit` bytes
    /// and spill to the OS temp directory beyond it.
    pub fn new(worker_threads: usize, query_memory_limit: usize) -> PipelineContext {
        PipelineContext { worker_threads: worker_threads.max(1), query_memory_limit, statements: Arc::new(Statements::new(sql_env(query_memory_limit))) }
    }

    pub fn worker_threads(&self) -> usize {
        self.worker_threads
    }

    pub fn query_memory_limit(&self) -> usize {
        self.query_memory_limit
    }

    /// The window statistics' prepared statements, on this context's memory pool.
    pub fn statements(&self) -> &Arc<Statements> {
        &self.statements
    }

    /// A query session on this context's memory pool (the cumulative views, training data).
    pub fn query_session(&self) -> SessionContext {
        query_session(self.statements.env())
    }

    /// A runtime with this context's worker threads, its threads named `name`, for an owner that
    /// runs many steps on it (a pipeline shard, an object store client).
    pub fn runner(&self, name: &str) -> std::io::Result<Runner> {
        Runner::with_threads(name, self.worker_threads)
    }

    /// A runtime on the calling thread, for an owner whose steps are small and many (the monitor's
    /// looks): no worker threads to start or to compete with the pipeline's.
    pub fn runner_here(&self) -> std::io::Result<Runner> {
        Ok(Runner(Builder::new_current_thread().enable_all().build()?))
    }

    /// Runs `work` to completion on a runtime of this context's (threads named `name`): a one-shot
    /// step of synchronous code.
    pub fn run<F: Future>(&self, name: &str, work: F) -> std::io::Result<F::Output> {
        Ok(self.runner(name)?.run(work))
    }
}

/// A runtime kept by its owner for many steps: a context's (`PipelineContext::runner`, with the
/// context's threads) or a server's (`Runner::with_threads`). Runtimes are built nowhere else.
pub struct Runner(Runtime);

impl Runner {
    /// A runtime of `threads` workers named `name`: a context's, or a server's outside the
    /// pipeline's work (the HTTP endpoints need one).
    pub fn with_threads(name: &str, threads: usize) -> std::io::Result<Runner> {
        Ok(Runner(Builder::new_multi_thread().worker_threads(threads.max(1)).thread_name(name).enable_all().build()?))
    }

    /// Runs `work` to completion on this runtime, blocking the calling thread.
    pub fn run<F: Future>(&self, work: F) -> F::Output {
        self.0.block_on(work)
    }

    /// Shuts the runtime down, waiting at most `timeout` for its tasks.
    pub fn shutdown_timeout(self, timeout: std::time::Duration) {
        self.0.shutdown_timeout(timeout)
    }
}

/// Runs `work` on a runtime on the calling thread: a short client call (an admin request, a schema
/// registry lookup) outside any pipeline's work.
pub fn run_here<F: Future>(work: F) -> std::io::Result<F::Output> {
    Ok(Builder::new_current_thread().enable_all().build()?.block_on(work))
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use datafusion::execution::memory_pool::MemoryLimit;

    /// Two contexts in one process keep their own settings: each one's query sessions and window
    /// statements are bounded by its own memory limit, and its runtimes have its own worker count
    /// (a process-global setting kept only the first one).
    pub fn two_contexts_in_one_process_keep_their_own_memory_limits_and_threads() {
        let (small, large) = (PipelineContext::new(1, 1 << 20), PipelineContext::new(3, 1 << 30));
        for (context, bytes, threads) in [(&small, 1usize << 20, 1usize), (&large, 1 << 30, 3)] {
            let pools =
                [context.query_session().runtime_env().memory_pool.memory_limit(), context.statements().session().runtime_env().memory_pool.memory_limit()];
            for pool in pools {
                let limit = match pool {
                    MemoryLimit::Finite(n) => Some(n),
                    _ => None,
                };
                assert_eq!(limit, Some(bytes));
            }
            assert_eq!(context.runner("ultr-test").unwrap().0.metrics().num_workers(), threads);
        }
    }
}
