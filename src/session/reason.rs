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
}

impl Reason {
    pub const ALL: [Reason; 20] = [
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
