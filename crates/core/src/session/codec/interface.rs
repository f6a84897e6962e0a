//! What a record format is: the `Codec` trait, a catalog entry (`Format`), the `[decode]` keys a
//! codec is opened with (`CodecConfig`, `[decode.schema_registry]`) and how files hold its records.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::raw::RawSession;
use crate::session::reason::{classify, Rejected};

/// One record format.
pub trait Codec: Send + Sync {
    /// The name `[decode] format` selects it by.
    fn name(&self) -> &'static str;

    /// One record's bytes as a session, or the reason they are refused. `feature_capacity` is the
    /// stream's feature dimension as known so far (a capacity hint).
    fn decode<'a>(&self, bytes: &'a [u8], feature_capacity: usize) -> Result<RawSession<'a>, Rejected>;

    /// `session` in this format, framed as this codec's reader expects it (appended to `out`).
    fn encode(&self, session: &RawSession<'_>, out: &mut Vec<u8>) -> anyhow::Result<()>;

    /// A JSON session (what the simulator and the click-log importer build) in this format.
    fn transcode_json(&self, json: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()> {
        let session: RawSession = serde_json::from_slice(json).map_err(|e| anyhow::anyhow!("a session to re-encode is not valid JSON: {}", classify(e)))?;
        self.encode(&session, out)
    }

    /// The `query_id` of a record (re-keying), or `None` where it has no readable one.
    fn query_id(&self, bytes: &[u8]) -> Option<String> {
        self.decode(bytes, 64).ok().map(|s| s.query_id.0.into_owned())
    }

    /// How records of this format lie in a file: one per line (text), or each behind its length.
    fn file_framing(&self) -> FileFraming {
        FileFraming::LengthDelimited
    }
}

/// How a file holds a format's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFraming {
    /// One record per line (JSONL).
    Lines,
    /// Each record behind its byte length as an unsigned varint (Protobuf's delimited form), so
    /// binary records may contain any byte.
    LengthDelimited,
}

/// The `[decode]` keys a codec is opened with (`DecodeLimits::codec`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CodecConfig {
    pub format: String,
    pub schema_registry: Option<SchemaRegistryConfig>,
    pub avro_schema: Option<PathBuf>,
    pub protobuf_descriptor_set: Option<PathBuf>,
    pub protobuf_message: Option<String>,
}

/// One entry of the catalog: a format's name, how its codec is built from the `[decode]` config,
/// and the checks of the `[decode]` keys it reads (without I/O, when the config is parsed).
pub struct Format {
    pub name: &'static str,
    pub open: fn(&CodecConfig) -> anyhow::Result<Arc<dyn Codec>>,
    pub validate: fn(&CodecConfig) -> Result<(), String>,
}

/// For formats without schemas: none of the schema keys may be set.
pub(crate) fn no_schema_keys(config: &CodecConfig) -> Result<(), String> {
    if config.schema_registry.is_some() || config.avro_schema.is_some() || config.protobuf_descriptor_set.is_some() || config.protobuf_message.is_some() {
        return Err(format!(
            "keys `decode.schema_registry`, `decode.avro_schema`, `decode.protobuf_descriptor_set` and `decode.protobuf_message` are not read by `decode.format` = {:?}",
            config.format
        ));
    }
    Ok(())
}

/// `[decode.schema_registry]`: a Confluent-compatible schema registry. Records are then framed
/// the Confluent way (magic byte 0, a 4-byte big-endian schema id, for Protobuf the message
/// indexes, then the payload); each schema id is fetched once and kept.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    /// The registry's base URL, e.g. `http://schema-registry:8081`.
    pub url: String,
    /// The subject `ultr simulate` and `ultr import` register the shipped schema under when they
    /// write this format (a topic's value subject is `<topic>-value`). Default `ultr-sessions-value`.
    #[serde(default = "default_subject")]
    pub subject: String,
    /// The longest wait between two tries while the registry does not answer mid-run (a record
    /// whose schema id is not cached yet waits; cached ids keep flowing). Default 30 s.
    #[serde(default = "default_max_backoff")]
    pub max_backoff: crate::units::ConfigDuration,
    /// How long one request may take. Default 10 s.
    #[serde(default = "default_request_timeout")]
    pub request_timeout: crate::units::ConfigDuration,
}

fn default_subject() -> String {
    "ultr-sessions-value".into()
}

fn default_max_backoff() -> crate::units::ConfigDuration {
    crate::units::duration("30s")
}

fn default_request_timeout() -> crate::units::ConfigDuration {
    crate::units::duration("10s")
}
