//! `ultr run`: the always-on service. The streaming loop (source → decode → windows → state) with a
//! monitor after every checkpoint, `/metrics` and `/healthz` over HTTP, scheduled retraining, and a
//! graceful stop on SIGTERM/SIGINT (checkpoint, commit, exit 0).

pub mod http;
pub mod schedule;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::PipelineConfig;
use crate::monitor::metrics::Metrics;
use crate::monitor::Monitor;
use crate::pipeline::{run_to_state, Observer, RunReport};
use crate::state::StateStore;

/// `[service]`: the HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// Address for `/metrics` and `/healthz`.
    pub listen: String,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig { listen: "127.0.0.1:9898".into() }
    }
}

pub struct ServiceOptions {
    pub state_dir: PathBuf,
    /// Overrides `[service] listen`.
    pub listen: Option<String>,
    /// Exit when a bounded source ends instead of serving until SIGTERM.
    pub exit_when_done: bool,
}

/// A flag set by SIGTERM or SIGINT. The handlers are installed before this returns, so a signal
/// sent once the service reports it is listening is never lost.
pub fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int) = {
        let _guard = rt.enter();
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?)
    };
    let flag = stop.clone();
    std::thread::Builder::new().name("ultr-signals".into()).spawn(move || {
        rt.block_on(async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        });
        flag.store(true, Ordering::SeqCst);
    })?;
    Ok(stop)
}

struct ServiceObserver<'a> {
    monitor: &'a mut Monitor,
    stop: Arc<AtomicBool>,
}

impl Observer for ServiceObserver<'_> {
    fn after_checkpoint(&mut self, store: &StateStore, report: &RunReport) {
        if let Err(e) = self.monitor.observe(store, report) {
            tracing::warn!("monitoring after checkpoint: {e:#}");
        }
    }

    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Runs the service until SIGTERM (or the end of a bounded source with `exit_when_done`).
pub fn run(config: &PipelineConfig, opts: &ServiceOptions) -> anyhow::Result<RunReport> {
    let stop = stop_on_signals()?;
    let metrics = Arc::new(Metrics::new());
    let healthy = Arc::new(AtomicBool::new(true));
    let listen = opts.listen.clone().unwrap_or_else(|| config.service.listen.clone());
    let server = http::serve(&listen, metrics.clone(), healthy.clone())?;
    eprintln!("ultr run: metrics at http://{}/metrics, health at http://{}/healthz; state in {}", server.addr, server.addr, opts.state_dir.display());
    let scheduler = schedule::Scheduler::start(config, opts.state_dir.clone(), metrics.clone())?;
    if let Some(s) = &config.train.schedule {
        eprintln!("ultr run: retraining on schedule {s:?} (models in {})", crate::train::models_dir(config, &opts.state_dir).display());
    }
    let mut monitor = Monitor::new(metrics.clone(), config, &opts.state_dir);
    let report = run_to_state(config, &opts.state_dir, &mut ServiceObserver { monitor: &mut monitor, stop: stop.clone() })?;
    if !stop.load(Ordering::SeqCst) && !opts.exit_when_done {
        eprintln!("ultr run: the source ended; serving metrics and the schedule until SIGTERM");
        let store_dir: &Path = &opts.state_dir;
        let mut last_models = None;
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
            // Keep residuals current when a scheduled training promotes a new model.
            let current = crate::train::checkpoint::ModelStore::open(&crate::train::models_dir(config, store_dir)).ok().and_then(|s| s.current_id().ok().flatten());
            if current != last_models {
                last_models = current;
                if let Ok(store) = StateStore::open(store_dir, &crate::pipeline::source_identity(config), config.window_spec().map_err(anyhow::Error::msg)?) {
                    if let Err(e) = monitor.observe(&store, &report) {
                        tracing::warn!("monitoring: {e:#}");
                    }
                }
            }
        }
    }
    healthy.store(false, Ordering::SeqCst);
    drop(scheduler); // cancels a training in progress and waits for it
    eprintln!("ultr run: stopped; state is durable and offsets are committed");
    Ok(report)
}
