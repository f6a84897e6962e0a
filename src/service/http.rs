//! The service's HTTP endpoint: `GET /metrics` (Prometheus text format) and `GET /healthz`. A plain
//! HTTP/1.1 responder on a thread; a scrape is one short request.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::monitor::metrics::Metrics;

pub struct Server {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// Binds `addr` (an error names it) and serves until dropped.
pub fn serve(addr: &str, metrics: Arc<Metrics>, healthy: Arc<AtomicBool>) -> anyhow::Result<Server> {
    let listener = TcpListener::bind(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr} (key `service.listen`): {e}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    let handle = std::thread::Builder::new().name("ultr-http".into()).spawn(move || {
        while !stop_flag.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = respond(stream, &metrics, &healthy);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    })?;
    Ok(Server { addr: bound, stop, handle: Some(handle) })
}

fn respond(stream: TcpStream, metrics: &Metrics, healthy: &AtomicBool) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (status, content_type, body) = match path.split('?').next().unwrap_or("/") {
        "/metrics" => ("200 OK", Metrics::content_type(), metrics.render()),
        "/healthz" if healthy.load(Ordering::Relaxed) => ("200 OK", "text/plain", "ok\n".to_string()),
        "/healthz" => ("503 Service Unavailable", "text/plain", "stopping\n".to_string()),
        _ => ("404 Not Found", "text/plain", "try /metrics or /healthz\n".to_string()),
    };
    let mut out = stream;
    write!(out, "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())?;
    out.flush()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
