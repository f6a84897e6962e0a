//! Why a record was refused: a closed set of reasons, each a stable label for counters and dead letters.

use std::fmt;

/// Every way a record can fail the contract. The label (`as_str`) is what dead letters and metrics carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    NotUtf8,
    RecordTooLarge,
    InvalidJson,
    MissingField,
    WrongType,
    EmptyId,
    UnsupportedSchemaVersion,
    BadEventTime,
    NoItems,
    TooManyItems,
    NonPositivePosition,
    DuplicatePosition,
    /// One session lists the same `doc_id` at two positions.
    DuplicateDocument,
    /// An id longer than `decode.max_id_bytes`.
    IdTooLong,
    TooManyFeatures,
    NonFiniteFeature,
    FeatureLengthMismatch,
    BadPropensity,
    /// `event_time` beyond the reference clock plus `decode.max_clock_skew` (a broken producer clock).
    FutureEventTime,
    /// `event_time` older than the wall clock minus `decode.max_event_age` on a live stream.
    StaleEventTime,
    /// A Confluent-framed record whose first byte is not the magic byte 0.
    BadMagicByte,
    /// A binary record that ends inside a field, a length or its framing header.
    TruncatedPayload,
    /// A binary record that ends inside a varint.
    TruncatedVarint,
    /// A binary record that breaks its format's encoding (a bad union index or wire type, a negative length).
    MalformedPayload,
    /// A schema id the schema registry does not know.
    UnknownSchemaId,
}

impl Reason {
    pub const ALL: [Reason; 25] = [
        Reason::NotUtf8,
        Reason::RecordTooLarge,
        Reason::InvalidJson,
        Reason::MissingField,
        Reason::WrongType,
        Reason::EmptyId,
        Reason::UnsupportedSchemaVersion,
        Reason::BadEventTime,
        Reason::NoItems,
        Reason::TooManyItems,
        Reason::NonPositivePosition,
        Reason::DuplicatePosition,
        Reason::DuplicateDocument,
        Reason::IdTooLong,
        Reason::TooManyFeatures,
        Reason::NonFiniteFeature,
        Reason::FeatureLengthMismatch,
        Reason::BadPropensity,
        Reason::FutureEventTime,
        Reason::StaleEventTime,
        Reason::BadMagicByte,
        Reason::TruncatedPayload,
        Reason::TruncatedVarint,
        Reason::MalformedPayload,
        Reason::UnknownSchemaId,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotUtf8 => "not_utf8",
            Reason::RecordTooLarge => "record_too_large",
            Reason::InvalidJson => "invalid_json",
            Reason::MissingField => "missing_field",
            Reason::WrongType => "wrong_type",
            Reason::EmptyId => "empty_id",
            Reason::UnsupportedSchemaVersion => "unsupported_schema_version",
            Reason::BadEventTime => "bad_event_time",
            Reason::NoItems => "no_items",
            Reason::TooManyItems => "too_many_items",
            Reason::NonPositivePosition => "non_positive_position",
            Reason::DuplicatePosition => "duplicate_position",
            Reason::DuplicateDocument => "duplicate_doc_id",
            Reason::IdTooLong => "id_too_long",
            Reason::TooManyFeatures => "too_many_features",
            Reason::NonFiniteFeature => "non_finite_feature",
            Reason::FeatureLengthMismatch => "feature_length_mismatch",
            Reason::BadPropensity => "bad_propensity",
            Reason::FutureEventTime => "future_event_time",
            Reason::StaleEventTime => "stale_event_time",
            Reason::BadMagicByte => "bad_magic_byte",
            Reason::TruncatedPayload => "truncated_payload",
            Reason::TruncatedVarint => "truncated_varint",
            Reason::MalformedPayload => "malformed_payload",
            Reason::UnknownSchemaId => "unknown_schema_id",
        }
    }

    pub fn parse(label: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == label)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused record: the reason label plus a human-readable detail.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub reason: Reason,
    pub detail: String,
}

impl Rejected {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Rejected { reason, detail: detail.into() }
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

/// Custom serde errors carry their reason as a `ultr:<label>:` prefix so `classify` can recover it.
pub(crate) fn tagged<E: serde::de::Error>(reason: Reason, detail: impl fmt::Display) -> E {
    E::custom(format_args!("ultr:{}: {}", reason.as_str(), detail))
}

/// The reason and detail of a record serde_json refused.
pub(crate) fn classify(err: serde_json::Error) -> Rejected {
    use serde_json::error::Category;
    let message = err.to_string();
    let reason = match err.classify() {
        Category::Syntax | Category::Eof | Category::Io => Reason::InvalidJson,
        Category::Data => {
            if let Some(rest) = message.strip_prefix("ultr:") {
                let label = rest.split(':').next().unwrap_or("");
                Reason::parse(label).unwrap_or(Reason::WrongType)
            } else if message.starts_with("missing field") {
                Reason::MissingField
            } else {
                Reason::WrongType
            }
        }
    };
    let detail = message.strip_prefix("ultr:").and_then(|rest| rest.split_once(": ")).map(|(_, d)| d.to_string()).unwrap_or(message);
    Rejected { reason, detail }
}
