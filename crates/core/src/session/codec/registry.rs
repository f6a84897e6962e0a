//! A Confluent-compatible schema registry client: schemas fetched by id once and kept, a start-up
//! check that names the URL, waiting with backoff (never dropping a record) while the registry is
//! away, and registration for the writers (`ultr simulate`, `ultr import`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::interface::{CodecConfig, SchemaRegistryConfig};
use crate::session::reason::{Reason, Rejected};

/// A schema as the registry serves it.
#[derive(Debug)]
pub struct Schema {
    /// The schema text (Avro JSON; a `.proto` file, or a base64 file descriptor, for Protobuf).
    pub text: String,
    /// `AVRO` (the registry's default when it names none), `PROTOBUF` or `JSON`.
    pub schema_type: String,
}

/// How long an id the registry denied stays denied before it is asked again.
const UNKNOWN_TTL: Duration = Duration::from_secs(60);

pub struct Registry {
    config: SchemaRegistryConfig,
    known: RwLock<HashMap<u32, Arc<Schema>>>,
    unknown: Mutex<HashMap<u32, Instant>>,
    fetching: Mutex<()>,
    /// Ids the writers' schemas were registered under, by schema text.
    registered: Mutex<HashMap<String, u32>>,
    /// Requests sent (for the cache's test and the log).
    requests: std::sync::atomic::AtomicU64,
}

/// A transport failure or a server error: the registry may answer later.
struct Away(String);

impl Registry {
    /// A client for `config.url`, after the registry answered once (`GET /subjects`).
    pub fn connect(config: &SchemaRegistryConfig) -> anyhow::Result<Arc<Registry>> {
        let registry = Registry {
            config: config.clone(),
            known: RwLock::default(),
            unknown: Mutex::default(),
            fetching: Mutex::new(()),
            registered: Mutex::default(),
            requests: Default::default(),
        };
        match registry.request("GET", "/subjects", None) {
            Ok((status, _)) if status < 500 => Ok(Arc::new(registry)),
            Ok((status, body)) => anyhow::bail!("the schema registry at {} (key `decode.schema_registry.url`) answered {status}: {body}", config.url),
            Err(Away(e)) => anyhow::bail!("the schema registry at {} (key `decode.schema_registry.url`) is unreachable: {e}", config.url),
        }
    }

    pub fn url(&self) -> &str {
        &self.config.url
    }

    /// HTTP requests sent so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Schema `id`: from the cache, else fetched (and kept). While the registry does not answer,
    /// this waits with backoff up to `max_backoff` between tries, so the record is neither lost nor
    /// dead-lettered; an id the registry denies is `unknown_schema_id`.
    pub fn schema(&self, id: u32) -> Result<Arc<Schema>, Rejected> {
        if let Some(s) = self.known.read().get(&id) {
            return Ok(s.clone());
        }
        let denied = |id| Rejected::new(Reason::UnknownSchemaId, format!("schema id {id} is not in the registry at {}", self.config.url));
        if self.unknown.lock().get(&id).is_some_and(|t| t.elapsed() < UNKNOWN_TTL) {
            return Err(denied(id));
        }
        // One fetch at a time: decoders side by side that miss the same id ask once.
        let _fetching = self.fetching.lock();
        if let Some(s) = self.known.read().get(&id) {
            return Ok(s.clone());
        }
        let mut backoff = Duration::from_millis(200);
        let max_backoff = Duration::from_millis(self.config.max_backoff.ms().max(1) as u64);
        loop {
            match self.request("GET", &format!("/schemas/ids/{id}"), None) {
                Ok((200, body)) => {
                    let schema = parse_schema(&body)
                        .map_err(|e| Rejected::new(Reason::UnknownSchemaId, format!("schema id {id}: the registry's answer is unreadable: {e}")))?;
                    let schema = Arc::new(schema);
                    self.known.write().insert(id, schema.clone());
                    return Ok(schema);
                }
                Ok((404, _)) | Ok((422, _)) => {
                    self.unknown.lock().insert(id, Instant::now());
                    return Err(denied(id));
                }
                Ok((status, body)) if status < 500 => {
                    // A 4xx other than "not found" (auth, a bad request) will not heal by waiting.
                    return Err(Rejected::new(
                        Reason::UnknownSchemaId,
                        format!("schema id {id}: the registry at {} answered {status}: {body}", self.config.url),
                    ));
                }
                Ok((status, body)) => {
                    tracing::warn!("schema registry {} answered {status} for schema id {id} ({body}); retrying in {backoff:?}", self.config.url)
                }
                Err(Away(e)) => {
                    tracing::warn!("schema registry {} is unreachable ({e}); a record with schema id {id} waits, retrying in {backoff:?}", self.config.url)
                }
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(max_backoff);
        }
    }

    /// The id a writer frames its records with: `text` registered under the configured subject once.
    pub fn writer_id(&self, schema_type: &str, text: &str) -> anyhow::Result<u32> {
        let mut registered = self.registered.lock();
        if let Some(&id) = registered.get(text) {
            return Ok(id);
        }
        let id = self.register(&self.config.subject, schema_type, text)?;
        registered.insert(text.to_string(), id);
        Ok(id)
    }

    /// Registers `text` under `subject` (or finds it there); returns its id.
    pub fn register(&self, subject: &str, schema_type: &str, text: &str) -> anyhow::Result<u32> {
        let mut body = serde_json::json!({ "schema": text });
        if schema_type != "AVRO" {
            body["schemaType"] = schema_type.into();
        }
        let (status, answer) = self
            .request("POST", &format!("/subjects/{subject}/versions"), Some(body.to_string()))
            .map_err(|Away(e)| anyhow::anyhow!("the schema registry at {} is unreachable: {e}", self.config.url))?;
        anyhow::ensure!(status == 200, "registering subject {subject} at {}: {status} {answer}", self.config.url);
        let id = serde_json::from_str::<serde_json::Value>(&answer)?.get("id").and_then(|v| v.as_u64()).ok_or_else(|| anyhow::anyhow!("no id in {answer}"))?;
        Ok(u32::try_from(id)?)
    }

    /// One request on a thread of its own (callers may sit inside or outside an async runtime).
    fn request(&self, method: &str, path: &str, body: Option<String>) -> Result<(u16, String), Away> {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let url = format!("{}{path}", self.config.url.trim_end_matches('/'));
        let timeout = Duration::from_millis(self.config.request_timeout.ms().max(1) as u64);
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a valid method");
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    crate::context::run_here(async move {
                        let client = reqwest::Client::builder().timeout(timeout).build().map_err(|e| Away(e.to_string()))?;
                        let mut req = client.request(method, &url).header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
                        if let Some(body) = body {
                            req = req.header("Content-Type", "application/vnd.schemaregistry.v1+json").body(body);
                        }
                        let resp = req.send().await.map_err(|e| Away(format!("{url}: {e}")))?;
                        let status = resp.status().as_u16();
                        let text = resp.text().await.map_err(|e| Away(format!("{url}: {e}")))?;
                        Ok((status, text))
                    })
                    .map_err(|e| Away(e.to_string()))?
                })
                .join()
                .unwrap_or_else(|_| Err(Away("the request thread panicked".into())))
        })
    }
}

fn parse_schema(body: &str) -> Result<Schema, String> {
    let v: serde_json::Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let text = v.get("schema").and_then(|s| s.as_str()).ok_or("no `schema` string")?.to_string();
    let schema_type = v.get("schemaType").and_then(|s| s.as_str()).unwrap_or("AVRO").to_string();
    Ok(Schema { text, schema_type })
}

/// Where a binary format's writer schemas come from.
pub(crate) enum SchemaSource {
    /// Confluent-framed records; schemas by id from the registry.
    Registry(Arc<Registry>),
    /// Bare records, all written with the one local schema (Protobuf: none, the shipped field numbers).
    Local(PathBuf),
}

impl SchemaSource {
    pub(crate) fn of(config: &CodecConfig, local: Option<&PathBuf>) -> anyhow::Result<SchemaSource> {
        match (&config.schema_registry, local) {
            (Some(r), _) => Ok(SchemaSource::Registry(Registry::connect(r)?)),
            (None, Some(path)) => Ok(SchemaSource::Local(path.clone())),
            (None, None) => Ok(SchemaSource::Local(PathBuf::new())),
        }
    }
}
