//! The HTTP endpoint under bad clients: connections that send half a request and stall, or a huge
//! body, must not delay a Prometheus scrape; health endpoints report what they should.

use crate::common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http_get;
use ultr::monitor::metrics::Metrics;
use ultr::service::http::{serve, Health};
use ultr::sources::SourceHealth;

#[test]
fn stalled_clients_do_not_block_scrapes() {
    let metrics = Arc::new(Metrics::new());
    metrics.records.inc_by(42);
    let health = Arc::new(Health::new(60_000, 600_000));
    let server = serve("127.0.0.1:0", metrics, health).unwrap();
    let addr = server.addr.to_string();
    // 40 clients open a request and never finish it (slowloris).
    let mut stalled = Vec::new();
    for _ in 0..40 {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
        stalled.push(s);
    }
    // One client starts a 1 GB upload it never sends.
    let mut upload = TcpStream::connect(&addr).unwrap();
    upload.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\nabc").unwrap();
    for _ in 0..5 {
        let started = Instant::now();
        let (code, body) = http_get(&addr, "/metrics").unwrap();
        let took = started.elapsed();
        assert_eq!(code, 200);
        assert!(body.contains("ultr_records_total 42"), "{body}");
        // The hand-written server served one connection at a time: each stalled client held the
        // scrape for its 5 s read timeout. Concurrent connections answer at once.
        assert!(took < Duration::from_secs(3), "a scrape waited {took:?} behind stalled clients");
    }
    drop(stalled);
    drop(upload);
}

#[test]
fn health_reports_an_unreachable_source_and_readiness_follows_restore() {
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(60_000, 600_000));
    let server = serve("127.0.0.1:0", metrics, health.clone()).unwrap();
    let addr = server.addr.to_string();
    assert_eq!(http_get(&addr, "/readyz").unwrap().0, 503, "not ready before the state is restored");
    assert_eq!(http_get(&addr, "/healthz").unwrap().0, 200);
    let source = Arc::new(SourceHealth::default());
    *health.source.lock() = Some(source.clone());
    health.ready.store(true, Ordering::SeqCst);
    assert_eq!(http_get(&addr, "/readyz").unwrap().0, 200);
    source.error("all_brokers_down", true);
    let (code, body) = http_get(&addr, "/healthz").unwrap();
    assert_eq!(code, 503);
    assert!(body.contains("source unreachable"), "{body}");
    assert_eq!(http_get(&addr, "/livez").unwrap().0, 200, "the loop still turns during an outage");
    source.ok();
    assert_eq!(http_get(&addr, "/healthz").unwrap().0, 200);
    health.last_progress_ms.store(chrono::Utc::now().timestamp_millis() - 120_000, Ordering::SeqCst);
    assert_eq!(http_get(&addr, "/livez").unwrap().0, 503);
}
