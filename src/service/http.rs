//! The service's HTTP endpoint on axum: `GET /` (the status page), `/metrics` (Prometheus text format), `/healthz`
//! (loop progress, source reachability, checkpoint age), `/livez` (the loop turns) and `/readyz`
//! (state restored). Every connection is its own task, requests are size- and time-bounded, so a
//! slow or stuck client cannot hold up a scrape.

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tower_http::timeout::TimeoutLayer;

use crate::monitor::metrics::Metrics;
use ultr_core::sources::SourceHealth;

/// What `/healthz`, `/livez` and `/readyz` report; the ingest loop updates it.
pub struct Health {
    /// State restored and source opened.
    pub ready: AtomicBool,
    /// Shutting down.
    pub stopping: AtomicBool,
    /// Wall-clock ms of the loop's last turn.
    pub last_progress_ms: AtomicI64,
    /// Wall-clock ms of the last durable checkpoint.
    pub last_checkpoint_ms: AtomicI64,
    /// The source's connection health (Kafka), once opened.
    pub source: Mutex<Option<Arc<SourceHealth>>>,
    /// The loop counts as stuck when it has not turned for this long.
    pub max_stall_ms: i64,
    /// `/healthz` fails when records wait but nothing was checkpointed for this long.
    pub max_checkpoint_age_ms: i64,
}

impl Health {
    pub fn new(max_stall_ms: i64, max_checkpoint_age_ms: i64) -> Health {
        let now = now_ms();
        Health {
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            last_progress_ms: AtomicI64::new(now),
            last_checkpoint_ms: AtomicI64::new(now),
            source: Mutex::new(None),
            max_stall_ms,
            max_checkpoint_age_ms,
        }
    }

    /// `ultr_source_up` and `ultr_kafka_errors_total` from the source's connection health (a
    /// single instance's Kafka source, or a scale-out instance's clients); nothing for a source
    /// without a connection.
    pub fn export_source(&self, metrics: &Metrics) {
        if let Some(source) = self.source.lock().as_ref() {
            metrics.source_up.set(if source.is_up() { 1.0 } else { 0.0 });
            for (kind, n) in source.errors() {
                let c = metrics.kafka_errors.with_label_values(&[&kind]);
                c.inc_by(n.saturating_sub(c.get()));
            }
        }
    }

    /// Problems `/healthz` reports; empty when healthy.
    pub fn problems(&self) -> Vec<String> {
        let now = now_ms();
        let mut out = Vec::new();
        if self.stopping.load(Ordering::Relaxed) {
            out.push("stopping".to_string());
        }
        let stall = now - self.last_progress_ms.load(Ordering::Relaxed);
        if stall > self.max_stall_ms {
            out.push(format!("ingest loop has not turned for {} s", stall / 1000));
        }
        if let Some(source) = self.source.lock().as_ref() {
            if !source.is_up() {
                out.push(format!("source unreachable (last contact {} s ago); retrying", (now - source.last_ok_ms()) / 1000));
            }
        }
        let age = now - self.last_checkpoint_ms.load(Ordering::Relaxed);
        if age > self.max_checkpoint_age_ms {
            out.push(format!("last checkpoint {} s ago", age / 1000));
        }
        out
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub struct Server {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::watch::Sender<bool>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Binds `addr` (an error names it and the config key) and serves until dropped.
pub fn serve(addr: &str, metrics: Arc<Metrics>, health: Arc<Health>) -> anyhow::Result<Server> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr} (key `service.listen`): {e}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = ultr_core::context::Runner::with_threads("ultr-http", 1)?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let app = Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .fallback(|| async { (StatusCode::NOT_FOUND, "try /, /metrics, /healthz, /livez or /readyz\n") })
        .layer(DefaultBodyLimit::max(16 << 10))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, Duration::from_secs(10)))
        .with_state(AppState { metrics, health });
    let handle = std::thread::Builder::new().name("ultr-http".into()).spawn(move || {
        runtime.run(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!("HTTP listener: {e}");
                    return;
                }
            };
            let mut graceful = rx.clone();
            let server = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = graceful.wait_for(|stop| *stop).await;
            });
            // Graceful shutdown waits for open connections; a stuck client gets one second.
            let mut hard = rx;
            tokio::select! {
                result = server => if let Err(e) = result { tracing::error!("HTTP server: {e}") },
                _ = async move {
                    let _ = hard.wait_for(|stop| *stop).await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                } => {}
            }
        });
        // Connections still open (a stuck client) are dropped with the runtime.
        runtime.shutdown_timeout(Duration::from_millis(100));
    })?;
    Ok(Server { addr: bound, shutdown: Some(tx), handle: Some(handle) })
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    // The source's health as of this scrape, not as of the ingest loop's last turn (a loop held up
    // in a commit or a rebalance must not freeze `ultr_source_up` at 1 through an outage).
    s.health.export_source(&s.metrics);
    ([(header::CONTENT_TYPE, Metrics::content_type())], s.metrics.render())
}

async fn status_page(State(s): State<AppState>) -> impl IntoResponse {
    let page = super::status_page::render(&s.metrics.series(), &s.metrics.board.snapshot(), now_ms() as f64 / 1000.0);
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], page)
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    let problems = s.health.problems();
    if problems.is_empty() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, problems.join("\n") + "\n")
    }
}

async fn livez(State(s): State<AppState>) -> impl IntoResponse {
    let stall = now_ms() - s.health.last_progress_ms.load(Ordering::Relaxed);
    if stall <= s.health.max_stall_ms {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("ingest loop has not turned for {} s\n", stall / 1000))
    }
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if s.health.ready.load(Ordering::Relaxed) && !s.health.stopping.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "restoring state or stopping\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(true);
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
