//! How a record's bytes become a session and back: the `Codec` trait, the catalog of formats (one
//! file each: `json`, `avro`, `protobuf`) and the Confluent wire framing the binary ones share.
//!
//! A codec turns bytes into a `RawSession` (`raw.rs`: the record as read, before the decoder
//! validates it) or refuses them with a reason; the decoder, re-keying, dead letters, `ultr
//! simulate` and `ultr import` all hold a `dyn Codec` and never ask which format it is. The trait
//! and the catalog's entry type are in `interface.rs`, so that the formats depend on it and this
//! file on them, never the other way round.

pub mod avro;
pub mod interface;
pub mod json;
pub mod protobuf;
pub mod raw;
pub mod registry;
pub(crate) mod single_pass;
/// The single-pass reader's unit tests, run by `tests/laboratory/units.rs` (the module stays crate-private).
#[cfg(feature = "unit-tests")]
pub use single_pass::tests as single_pass_tests;
/// The wire helpers' unit tests, run by `tests/laboratory/units.rs`.
#[cfg(feature = "unit-tests")]
pub use wire::tests as wire_tests;
pub mod wire;

use std::sync::Arc;

pub use interface::{Codec, CodecConfig, FileFraming, Format, SchemaRegistryConfig};

/// The formats `[decode] format` can name. A format is one file in this folder plus its line here.
pub const CATALOG: &[Format] = &[json::FORMAT, avro::FORMAT, protobuf::FORMAT];

fn format_of(config: &CodecConfig) -> Result<&'static Format, String> {
    CATALOG
        .iter()
        .find(|f| f.name == config.format)
        .ok_or_else(|| format!("key `decode.format` = {:?}: the formats are {}", config.format, CATALOG.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")))
}

/// The codec `[decode]` configures (a registry it names is asked whether it answers: an error names its URL).
pub fn open(config: &CodecConfig) -> anyhow::Result<Arc<dyn Codec>> {
    (format_of(config).map_err(|e| anyhow::anyhow!(e))?.open)(config)
}

/// The `[decode]` keys that say which format and where its schemas come from, checked without I/O.
pub fn validate(config: &CodecConfig) -> Result<(), String> {
    (format_of(config)?.validate)(config)
}
