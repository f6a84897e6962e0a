//! A stand-in for a Confluent schema registry, serving the REST endpoints that `ultr` and PyPI's
//! `confluent-kafka` serializers call: `GET /subjects`, `GET /schemas/ids/{id}`,
//! `POST /subjects/{subject}/versions` (register), `POST /subjects/{subject}` (look up) and
//! `GET /subjects/{subject}/versions/latest`. Why a stand-in: no Confluent-compatible registry
//! installs from the package registries here (Confluent's is Java from its own repository; PyPI has
//! no Karapace; crates.io's `crabka-schema-registry` is retired and would be a second Rust build in
//! CI). It stores schema text as given and hands out ids from 1; it checks no compatibility.
//! `go_away` closes its port (connections refused) until `come_back`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Store {
    /// id → (schema text, schemaType as the client sent it, or None for Avro).
    schemas: BTreeMap<u32, (String, Option<String>)>,
    /// subject → ids registered under it, oldest first.
    subjects: BTreeMap<String, Vec<u32>>,
}

pub struct Registry {
    pub port: u16,
    store: Arc<Mutex<Store>>,
    serving: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// `GET /schemas/ids/…` requests answered.
    pub id_lookups: Arc<AtomicU64>,
}

impl Registry {
    pub fn start() -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let r = Registry {
            port,
            store: Arc::default(),
            serving: Arc::new(AtomicBool::new(false)),
            stop: Arc::new(AtomicBool::new(false)),
            id_lookups: Arc::default(),
        };
        r.serve(listener);
        r
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Registers `text` directly (as a producer would have); returns its id.
    pub fn add(&self, subject: &str, text: &str, schema_type: Option<&str>) -> u32 {
        register(&mut self.store.lock().unwrap(), subject, text, schema_type.map(str::to_string))
    }

    fn serve(&self, listener: TcpListener) {
        self.serving.store(true, Ordering::SeqCst);
        let (store, serving, stop, lookups) = (self.store.clone(), self.serving.clone(), self.stop.clone(), self.id_lookups.clone());
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            while serving.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (store, lookups) = (store.clone(), lookups.clone());
                        std::thread::spawn(move || {
                            let _ = answer(stream, &store, &lookups);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            // The listener drops here: the port refuses connections.
        });
    }

    /// Closes the port: every request fails to connect.
    pub fn go_away(&self) {
        self.serving.store(false, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Listens again on the same port, with the same schemas.
    pub fn come_back(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => break l,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("rebinding the registry's port {}: {e}", self.port),
            }
        };
        self.serve(listener);
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn register(store: &mut Store, subject: &str, text: &str, schema_type: Option<String>) -> u32 {
    let existing = store.schemas.iter().find(|(_, (t, ty))| t == text && *ty == schema_type).map(|(id, _)| *id);
    let id = existing.unwrap_or_else(|| {
        let id = store.schemas.keys().last().map_or(1, |k| k + 1);
        store.schemas.insert(id, (text.to_string(), schema_type));
        id
    });
    let ids = store.subjects.entry(subject.to_string()).or_default();
    if !ids.contains(&id) {
        ids.push(id);
    }
    id
}

fn answer(stream: TcpStream, store: &Mutex<Store>, lookups: &AtomicU64) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut parts = request_line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            let h = header.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        let path = target.split('?').next().unwrap_or("").to_string();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (status, reply) = {
            let mut s = store.lock().unwrap();
            route(&mut s, &method, &segments, &body, lookups)
        };
        let text = reply.to_string();
        write!(
            out,
            "HTTP/1.1 {status} {}\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: {}\r\n\r\n{text}",
            if status == 200 { "OK" } else { "Error" },
            text.len()
        )?;
        out.flush()?;
    }
}

fn not_found(code: u32, message: &str) -> (u16, serde_json::Value) {
    (404, serde_json::json!({ "error_code": code, "message": message }))
}

fn route(s: &mut Store, method: &str, seg: &[&str], body: &[u8], lookups: &AtomicU64) -> (u16, serde_json::Value) {
    let schema_json = |id: u32, (text, ty): &(String, Option<String>)| {
        let mut v = serde_json::json!({ "id": id, "schema": text });
        if let Some(ty) = ty {
            v["schemaType"] = ty.clone().into();
        }
        v
    };
    match (method, seg) {
        ("GET", ["subjects"]) => (200, serde_json::json!(s.subjects.keys().collect::<Vec<_>>())),
        ("GET", ["schemas", "ids", id]) => {
            lookups.fetch_add(1, Ordering::SeqCst);
            match id.parse::<u32>().ok().and_then(|id| s.schemas.get(&id).map(|e| schema_json(id, e))) {
                Some(v) => (200, v),
                None => not_found(40403, "Schema not found"),
            }
        }
        ("POST", ["subjects", subject, "versions"]) | ("POST", ["subjects", subject]) => {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let Some(text) = v.get("schema").and_then(|t| t.as_str()) else { return (422, serde_json::json!({ "error_code": 42201, "message": "no schema" })) };
            let ty = v.get("schemaType").and_then(|t| t.as_str()).filter(|t| *t != "AVRO").map(str::to_string);
            if seg.len() == 2 {
                // Look up: the version of `text` under `subject`.
                let found = s.subjects.get(*subject).and_then(|ids| ids.iter().position(|id| s.schemas.get(id).is_some_and(|(t, tt)| t == text && *tt == ty)));
                return match found {
                    Some(i) => {
                        let id = s.subjects[*subject][i];
                        let mut v = schema_json(id, &s.schemas[&id]);
                        v["subject"] = (*subject).into();
                        v["version"] = (i + 1).into();
                        (200, v)
                    }
                    None => not_found(40403, "Schema not found"),
                };
            }
            let id = register(s, subject, text, ty);
            (200, serde_json::json!({ "id": id }))
        }
        ("GET", ["subjects", subject, "versions", "latest"]) => match s.subjects.get(*subject).and_then(|ids| ids.last().copied()) {
            Some(id) => {
                let mut v = schema_json(id, &s.schemas[&id]);
                v["subject"] = (*subject).into();
                v["version"] = s.subjects[*subject].len().into();
                (200, v)
            }
            None => not_found(40401, "Subject not found"),
        },
        _ => (404, serde_json::json!({ "error_code": 404, "message": format!("{method} /{} is not served by the stand-in", seg.join("/")) })),
    }
}
