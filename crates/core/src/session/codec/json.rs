//! The JSON format (docs/session-contract.md): the single-pass reader for records of the usual
//! shape, serde_json for the rest and for the wording of every refusal; one record per line in files.

use std::sync::Arc;

use serde::ser::{SerializeMap, Serializer};

use super::interface::{no_schema_keys, Codec, CodecConfig, FileFraming, Format};
use super::raw::{EventTime, RawSession};
use super::single_pass;
use crate::session::reason::{classify, Reason, Rejected};

pub struct Json {
    /// Read every record with serde_json alone (the reference the single-pass reader is tested against).
    serde_only: bool,
}

impl Json {
    pub fn new() -> Self {
        Json { serde_only: false }
    }

    /// serde_json alone, skipping the single-pass reader.
    pub fn serde_only() -> Self {
        Json { serde_only: true }
    }
}

impl Default for Json {
    fn default() -> Self {
        Json::new()
    }
}

pub(super) const FORMAT: Format = Format { name: "json", open, validate: no_schema_keys };

fn open(_: &CodecConfig) -> anyhow::Result<Arc<dyn Codec>> {
    Ok(Arc::new(Json::new()))
}

impl Codec for Json {
    fn name(&self) -> &'static str {
        "json"
    }

    fn decode<'a>(&self, bytes: &'a [u8], feature_capacity: usize) -> Result<RawSession<'a>, Rejected> {
        if !self.serde_only {
            if let Some(raw) = single_pass::read(bytes, feature_capacity) {
                return Ok(raw);
            }
        }
        let text = std::str::from_utf8(bytes).map_err(|e| Rejected::new(Reason::NotUtf8, e.to_string()))?;
        serde_json::from_str(text).map_err(classify)
    }

    fn encode(&self, session: &RawSession<'_>, out: &mut Vec<u8>) -> anyhow::Result<()> {
        let mut ser = serde_json::Serializer::new(&mut *out);
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("schema_version", &session.schema_version)?;
        m.serialize_entry("session_id", &*session.session_id.0)?;
        m.serialize_entry("query_id", &*session.query_id.0)?;
        match &session.event_time {
            EventTime::Millis(ms) => m.serialize_entry("event_time", ms)?,
            EventTime::Text(t) => m.serialize_entry("event_time", &**t)?,
        }
        m.serialize_entry("policy_id", &*session.policy_id.0)?;
        if let Some(context) = &session.context {
            let values: std::collections::BTreeMap<&str, Option<&str>> = context.iter().map(|(k, v)| (&**k, v.0.as_deref())).collect();
            m.serialize_entry("context", &values)?;
        }
        let items: Vec<serde_json::Value> = session
            .items
            .iter()
            .map(|item| {
                let mut v = serde_json::json!({ "doc_id": &*item.doc_id.0, "position": item.position, "clicked": item.clicked.0 });
                if let Some(f) = &item.features {
                    v["features"] = serde_json::json!(f.0);
                }
                if let Some(f) = &item.bias_features {
                    v["bias_features"] = serde_json::json!(f.0);
                }
                if let Some(p) = item.propensity {
                    v["propensity"] = serde_json::json!(p);
                }
                v
            })
            .collect();
        m.serialize_entry("items", &items)?;
        m.end()?;
        Ok(())
    }

    fn transcode_json(&self, json: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()> {
        out.extend_from_slice(json);
        Ok(())
    }

    fn query_id(&self, bytes: &[u8]) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Probe {
            query_id: String,
        }
        serde_json::from_slice::<Probe>(bytes).ok().map(|p| p.query_id)
    }

    fn file_framing(&self) -> FileFraming {
        FileFraming::Lines
    }
}
