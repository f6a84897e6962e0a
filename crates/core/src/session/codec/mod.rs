//! How a record's bytes become a session and back: the `Codec` trait, the catalog of formats (one
//! file each: `json`, `avro`, `protobuf`) and the Confluent wire framing the binary ones share.
//!
//! A codec turns bytes into a `RawSession` (the record as read, before the decoder validates it)
//! or refuses them with a reason; the decoder, re-keying, dead letters, `ultr simulate` and
//! `ultr import` all hold a `dyn Codec` and never ask which format it is.

pub mod avro;
pub mod json;
pub mod protobuf;
pub mod registry;
pub mod wire;

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::decode::raw::RawSession;
use super::decode::DecodeLimits;
use super::reason::{Reason, Rejected};

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
        let session = json::Json::new().decode(json, 64).map_err(|e| anyhow::anyhow!("a session to re-encode is not valid JSON: {e}"))?;
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

/// One entry of the catalog: a format's name, how its codec is built from the `[decode]` config,
/// and the checks of the `[decode]` keys it reads (without I/O, when the config is parsed).
pub struct Format {
    pub name: &'static str,
    pub open: fn(&DecodeLimits) -> anyhow::Result<Arc<dyn Codec>>,
    pub validate: fn(&DecodeLimits) -> Result<(), String>,
}

/// The formats `[decode] format` can name. A format is one file in this folder plus its line here.
pub const CATALOG: &[Format] = &[json::FORMAT, avro::FORMAT, protobuf::FORMAT];

fn format_of(config: &DecodeLimits) -> Result<&'static Format, String> {
    CATALOG.iter().find(|f| f.name == config.format).ok_or_else(|| {
        format!("key `decode.format` = {:?}: the formats are {}", config.format, CATALOG.iter().map(|f| f.name).collect::<Vec<_>>().join(", "))
    })
}

/// The codec `[decode]` configures (a registry it names is asked whether it answers: an error names its URL).
pub fn open(config: &DecodeLimits) -> anyhow::Result<Arc<dyn Codec>> {
    (format_of(config).map_err(|e| anyhow::anyhow!(e))?.open)(config)
}

/// The `[decode]` keys that say which format and where its schemas come from, checked without I/O.
pub fn validate(config: &DecodeLimits) -> Result<(), String> {
    (format_of(config)?.validate)(config)
}

/// For formats without schemas: none of the schema keys may be set.
pub(crate) fn no_schema_keys(config: &DecodeLimits) -> Result<(), String> {
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

/// Where a binary format's writer schemas come from.
pub(crate) enum SchemaSource {
    /// Confluent-framed records; schemas by id from the registry.
    Registry(Arc<registry::Registry>),
    /// Bare records, all written with the one local schema (Protobuf: none, the shipped field numbers).
    Local(PathBuf),
}

impl SchemaSource {
    pub(crate) fn of(config: &DecodeLimits, local: Option<&PathBuf>) -> anyhow::Result<SchemaSource> {
        match (&config.schema_registry, local) {
            (Some(r), _) => Ok(SchemaSource::Registry(registry::Registry::connect(r)?)),
            (None, Some(path)) => Ok(SchemaSource::Local(path.clone())),
            (None, None) => Ok(SchemaSource::Local(PathBuf::new())),
        }
    }
}

/// Confluent framing: the schema id and what follows the 5-byte header.
pub(crate) fn confluent_header(bytes: &[u8]) -> Result<(u32, &[u8]), Rejected> {
    match bytes.first() {
        None => return Err(Rejected::new(Reason::TruncatedPayload, "an empty record has no Confluent header")),
        Some(0) => {}
        Some(b) => return Err(Rejected::new(Reason::BadMagicByte, format!("byte 0 is {b:#04x}; Confluent-framed records start with the magic byte 0x00"))),
    }
    if bytes.len() < 5 {
        return Err(Rejected::new(Reason::TruncatedPayload, format!("{} bytes: the Confluent header is 5 (magic byte, 4-byte schema id)", bytes.len())));
    }
    Ok((u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]), &bytes[5..]))
}

/// Appends the Confluent header for `schema_id`.
pub(crate) fn put_confluent_header(out: &mut Vec<u8>, schema_id: u32) {
    out.push(0);
    out.extend_from_slice(&schema_id.to_be_bytes());
}
