//! The fixed Arrow schema of decoded impressions: one row per shown item.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// The only contract version this build reads. A producer bumps it on an incompatible change.
pub const SCHEMA_VERSION: u64 = 1;

/// Column names, so later stages never spell them twice.
pub mod col {
    pub const SESSION_ID: &str = "session_id";
    pub const QUERY_ID: &str = "query_id";
    pub const EVENT_TIME: &str = "event_time";
    pub const POLICY_ID: &str = "policy_id";
    pub const CONTEXT: &str = "context";
    pub const DOC_ID: &str = "doc_id";
    pub const POSITION: &str = "position";
    pub const CLICKED: &str = "clicked";
    pub const N_ITEMS: &str = "n_items";
    pub const FEATURES: &str = "features";
    pub const BIAS_FEATURES: &str = "bias_features";
    pub const PROPENSITY: &str = "propensity";
}

/// The impressions schema (documented in `docs/session-contract.md`):
///
/// | column | type | null |
/// |---|---|---|
/// | session_id | Utf8 | no |
/// | query_id | Utf8 | no |
/// | event_time | Timestamp(ms, UTC) | no |
/// | policy_id | Utf8 | no |
/// | context | Utf8 (`k=v` pairs sorted by key, `;`-joined) | yes |
/// | doc_id | Utf8 | no |
/// | position | UInt32 (1-based) | no |
/// | clicked | Boolean | no |
/// | n_items | UInt32 (items in the session) | no |
/// | features | List(Float32) | yes |
/// | bias_features | List(Float32) | yes |
/// | propensity | Float64 | yes |
pub fn impressions_schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let item = Arc::new(Field::new("item", DataType::Float32, false));
            Arc::new(Schema::new(vec![
                Field::new(col::SESSION_ID, DataType::Utf8, false),
                Field::new(col::QUERY_ID, DataType::Utf8, false),
                Field::new(col::EVENT_TIME, DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
                Field::new(col::POLICY_ID, DataType::Utf8, false),
                Field::new(col::CONTEXT, DataType::Utf8, true),
                Field::new(col::DOC_ID, DataType::Utf8, false),
                Field::new(col::POSITION, DataType::UInt32, false),
                Field::new(col::CLICKED, DataType::Boolean, false),
                Field::new(col::N_ITEMS, DataType::UInt32, false),
                Field::new(col::FEATURES, DataType::List(item.clone()), true),
                Field::new(col::BIAS_FEATURES, DataType::List(item), true),
                Field::new(col::PROPENSITY, DataType::Float64, true),
            ]))
        })
        .clone()
}
