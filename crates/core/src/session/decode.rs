//! Decode (through the configured codec) and validate sessions into rows of the impressions batch; a record is taken whole or
//! refused whole, except a repeated `doc_id`, whose repeat alone is dropped (`[decode] duplicate_doc_id`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, BooleanBufferBuilder, Float32Builder, Float64Builder, ListBuilder, StringBuilder, TimestampMillisecondBuilder, UInt32Array,
    UInt32Builder,
};
use datafusion::arrow::record_batch::RecordBatch;
use serde::Deserialize;

use super::codec::interface::{Codec, CodecConfig, SchemaRegistryConfig};
use super::codec::json::Json;
use super::null_run::NullRun;
use super::reason::{Reason, Rejected};
use super::schema::{impressions_schema, SCHEMA_VERSION};
use super::text_column::TextColumn;

use super::codec::raw::{ContextValue, Features, RawItem, RawSession};
use crate::window::hash;

/// Limits that keep one absurd record from costing the pipeline memory or time.
/// Lives under `[decode]` in a pipeline config.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DecodeLimits {
    /// The records' format: `"json"` (docs/session-contract.md), `"avro"` or `"protobuf"`
    /// (`schemas/session.avsc`, `schemas/session.proto`). A binary format needs its writer schemas:
    /// `[decode.schema_registry]` (Confluent-framed records), or a local schema file (bare records).
    pub format: String,
    /// A Confluent-compatible schema registry the binary formats' schema ids are fetched from.
    pub schema_registry: Option<SchemaRegistryConfig>,
    /// `format = "avro"` without a registry: the writer schema (`.avsc`) every record was written with.
    pub avro_schema: Option<std::path::PathBuf>,
    /// `format = "protobuf"` without a registry: a descriptor set (`protoc --include_imports
    /// --descriptor_set_out=…`) whose `protobuf_message` gives the field numbers by name. Without
    /// it (and without a registry), bare records with `schemas/session.proto`'s numbers.
    pub protobuf_descriptor_set: Option<std::path::PathBuf>,
    /// The session message's full name in `protobuf_descriptor_set`, e.g. `"ultr.Session"`.
    pub protobuf_message: Option<String>,
    /// Most items one session may carry.
    pub max_items: usize,
    /// Most dense features one item may carry.
    pub max_features: usize,
    /// Largest accepted record, in bytes, checked before parsing.
    pub max_record_bytes: usize,
    /// Longest accepted id (`session_id`, `query_id`, `policy_id`, `doc_id`), in bytes: ids are
    /// keys of every statistic, held in memory per window and in the state, so one megabyte-long id
    /// within a record that fits `max_record_bytes` is refused (`id_too_long`).
    pub max_id_bytes: usize,
    /// The stream's feature dimension. Unset: the first accepted record with features fixes it.
    pub feature_dim: Option<usize>,
    /// The stream's bias-feature dimension, fixed the same way when unset.
    pub bias_feature_dim: Option<usize>,
    /// A session whose `event_time` lies further than this beyond the reference clock is refused
    /// (`future_event_time`). The reference is the wall clock for Kafka and the simulator; for file
    /// replays it is the later of the wall clock and the newest event time accepted so far from that
    /// file, so an old log replays whole, gaps of days included, while a corrupt year-9999 timestamp
    /// is still refused (an outlier inside the log is bounded by `window.max_partition_clock_jump`).
    pub max_clock_skew: crate::units::ConfigDuration,
    /// On a live stream (Kafka), a session whose `event_time` lies further than this before the
    /// wall clock is refused (`stale_event_time`). A 1970 timestamp from a broken producer, read
    /// first on a partition, would set that partition's clock decades behind: the clock moves at
    /// most `window.max_partition_clock_jump` per session, so every window would stay open while it
    /// crawled forward. Replays (files, the simulator) are not judged by the wall clock. Raise it to
    /// re-read an older topic.
    pub max_event_age: crate::units::ConfigDuration,
    /// The names and version of the stream's feature vectors (`[decode.feature_schema]`). A model
    /// trained on the stream records it and exports it; a model whose schema differs is refused
    /// before it scores, warm-starts or competes at the gate. It also fixes the feature dimensions.
    pub feature_schema: Option<FeatureSchema>,
    /// A page that lists one `doc_id` twice: `"drop_repeats"` keeps the first occurrence and the
    /// rest of the page and drops the later ones (counted as `ultr_dropped_items_total{reason =
    /// "duplicate_doc_id"}`); `"refuse_session"` refuses the whole page as `duplicate_doc_id`. A
    /// repeat kept would be its own swap pair and make Σ_k π(d,k|q) exceed 1.
    pub duplicate_doc_id: DuplicateDocId,
}

/// What the decoder does with a repeated `doc_id` in one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DuplicateDocId {
    /// Keep the first occurrence and the rest of the page; drop the repeats.
    #[default]
    DropRepeats,
    /// Refuse the whole session as `duplicate_doc_id`.
    RefuseSession,
}

/// `[decode.feature_schema]`: what `items[].features` and `items[].bias_features` mean, in order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FeatureSchema {
    /// The schema's name, e.g. the feature store's feature-set name.
    pub name: String,
    /// Bumped whenever a feature's meaning, order or scale changes.
    pub version: u32,
    /// `items[].features`, in order.
    pub features: Vec<String>,
    /// `items[].bias_features`, in order.
    #[serde(default)]
    pub bias_features: Vec<String>,
}

impl FeatureSchema {
    /// `name@version`.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// Names non-empty and unique, counts matching the configured dimensions.
    pub fn validate(&self, feature_dim: Option<usize>, bias_feature_dim: Option<usize>) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("key `decode.feature_schema.name` must not be empty".into());
        }
        for (key, names, dim) in [("features", &self.features, feature_dim), ("bias_features", &self.bias_features, bias_feature_dim)] {
            let mut seen = std::collections::HashSet::new();
            if let Some(dup) = names.iter().find(|n| n.trim().is_empty() || !seen.insert(n.as_str())) {
                return Err(format!("key `decode.feature_schema.{key}`: name {dup:?} is empty or repeated"));
            }
            if let Some(d) = dim.filter(|d| *d != names.len()) {
                return Err(format!(
                    "key `decode.feature_schema.{key}` names {} features but `decode.{}` is {d}",
                    names.len(),
                    if key == "features" { "feature_dim" } else { "bias_feature_dim" }
                ));
            }
        }
        if self.features.is_empty() {
            return Err("key `decode.feature_schema.features` must name at least one feature".into());
        }
        Ok(())
    }

    /// Whether a model trained on `trained` may score a stream of `stream`: both absent, or equal.
    pub fn check_compatible(trained: Option<&FeatureSchema>, stream: Option<&FeatureSchema>) -> Result<(), String> {
        let label =
            |s: Option<&FeatureSchema>| s.map_or("none (positional features)".to_string(), |s| format!("{} ({} features)", s.label(), s.features.len()));
        if trained == stream {
            return Ok(());
        }
        let detail = match (trained, stream) {
            (Some(a), Some(b)) if a.name == b.name && a.version == b.version => {
                " (same name and version, different feature names: bump the version)".to_string()
            }
            _ => String::new(),
        };
        Err(format!("the model was trained on feature schema {} but the stream's is {}{detail} (key `decode.feature_schema`)", label(trained), label(stream)))
    }
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            format: "json".into(),
            schema_registry: None,
            avro_schema: None,
            protobuf_descriptor_set: None,
            protobuf_message: None,
            max_items: 1_000,
            max_features: 10_000,
            max_record_bytes: 16 << 20,
            max_id_bytes: 1024,
            feature_dim: None,
            bias_feature_dim: None,
            feature_schema: None,
            max_clock_skew: crate::units::duration("1h"),
            max_event_age: crate::units::duration("365d"),
            duplicate_doc_id: DuplicateDocId::DropRepeats,
        }
    }
}

impl DecodeLimits {
    /// The keys the codec is opened with (`session::codec::open`).
    pub fn codec(&self) -> CodecConfig {
        CodecConfig {
            format: self.format.clone(),
            schema_registry: self.schema_registry.clone(),
            avro_schema: self.avro_schema.clone(),
            protobuf_descriptor_set: self.protobuf_descriptor_set.clone(),
            protobuf_message: self.protobuf_message.clone(),
        }
    }

    /// `max_event_age` in milliseconds (always set: the live-stream floor is always on).
    pub fn max_event_age_ms(&self) -> Option<i64> {
        Some(self.max_event_age.ms())
    }

    /// `max_clock_skew` in milliseconds (always set).
    pub fn max_clock_skew_ms(&self) -> Option<i64> {
        Some(self.max_clock_skew.ms())
    }
}

/// Accumulates accepted sessions as impression rows and hands them out as Arrow batches.
pub struct Decoder {
    limits: DecodeLimits,
    feature_dim: Option<usize>,
    bias_feature_dim: Option<usize>,
    rows: usize,
    session_id: TextColumn,
    query_id: TextColumn,
    event_time: TimestampMillisecondBuilder,
    policy_id: TextColumn,
    context: NullRun<StringBuilder>,
    doc_id: TextColumn,
    /// Positions and clicks have no nulls: plain values, no validity bit per row.
    position: Vec<u32>,
    clicked: BooleanBufferBuilder,
    n_items: UInt32Builder,
    features: NullRun<ListBuilder<Float32Builder>>,
    bias_features: NullRun<ListBuilder<Float32Builder>>,
    propensity: NullRun<Float64Builder>,
    positions_scratch: Vec<u32>,
    /// Per item of the record being decoded: whether it repeats an earlier item's `doc_id`.
    repeat_scratch: Vec<bool>,
    /// The duplicate check's open-addressing table: an item's index + 1 (0: empty), twice the
    /// record's items rounded up to a power of two.
    doc_slots_scratch: Vec<u32>,
    /// The duplicate check's hash of each item's `doc_id`.
    doc_hash_scratch: Vec<u64>,
    /// Items the last accepted record dropped as repeats.
    last_repeats: u32,
    /// Sessions with a later event time are refused (`future_event_time`); set by the ingest loop.
    event_time_ceiling: Option<i64>,
    event_time_floor: Option<i64>,
    /// Event time of the last accepted session.
    last_event_ms: Option<i64>,
    /// The own dimensions of the last accepted session's vectors (`None` where it had none).
    last_dims: (Option<usize>, Option<usize>),
    /// The event time of the last record that came as far as the future-time check, accepted or not.
    judged_event_ms: Option<i64>,
    /// Bytes in, a `RawSession` or a refusal out.
    codec: Arc<dyn Codec>,
}

impl Decoder {
    /// A decoder of JSON records (`with_codec` for the others: `codec::open` builds the configured one).
    pub fn new(limits: DecodeLimits) -> Self {
        Decoder::with_codec(limits, Arc::new(Json::new()))
    }

    /// A decoder reading records with `codec`.
    pub fn with_codec(limits: DecodeLimits, codec: Arc<dyn Codec>) -> Self {
        let item = || {
            ListBuilder::new(Float32Builder::new()).with_field(Arc::new(datafusion::arrow::datatypes::Field::new(
                "item",
                datafusion::arrow::datatypes::DataType::Float32,
                false,
            )))
        };
        Decoder {
            feature_dim: limits.feature_dim.or(limits.feature_schema.as_ref().map(|s| s.features.len())),
            bias_feature_dim: limits.bias_feature_dim.or(limits.feature_schema.as_ref().filter(|s| !s.bias_features.is_empty()).map(|s| s.bias_features.len())),
            limits,
            rows: 0,
            session_id: TextColumn::new(),
            query_id: TextColumn::new(),
            event_time: TimestampMillisecondBuilder::new().with_timezone("UTC"),
            policy_id: TextColumn::new(),
            context: NullRun::new(StringBuilder::new()),
            doc_id: TextColumn::new(),
            position: Vec::new(),
            clicked: BooleanBufferBuilder::new(0),
            n_items: UInt32Builder::new(),
            features: NullRun::new(item()),
            bias_features: NullRun::new(item()),
            propensity: NullRun::new(Float64Builder::new()),
            positions_scratch: Vec::new(),
            repeat_scratch: Vec::new(),
            doc_slots_scratch: Vec::new(),
            doc_hash_scratch: Vec::new(),
            last_repeats: 0,
            event_time_ceiling: None,
            event_time_floor: None,
            last_event_ms: None,
            last_dims: (None, None),
            judged_event_ms: None,
            codec,
        }
    }

    /// A decoder that reads every record with serde_json alone: the reference the single-pass
    /// reader must match (same rows, same refusals), used by the differential tests and benches.
    pub fn serde_json_only(mut self) -> Self {
        self.codec = Arc::new(Json::serde_only());
        self
    }

    /// The codec records are read with.
    pub fn codec(&self) -> &Arc<dyn Codec> {
        &self.codec
    }

    /// Refuse sessions whose event time exceeds `ceiling` (epoch ms); `None` accepts any time.
    pub fn set_event_time_ceiling(&mut self, ceiling: Option<i64>) {
        self.event_time_ceiling = ceiling;
    }

    /// Sessions older than this (epoch ms) are refused as `stale_event_time`; `None` accepts any age.
    pub fn set_event_time_floor(&mut self, floor: Option<i64>) {
        self.event_time_floor = floor;
    }

    /// Event time of the last accepted session.
    pub fn last_event_ms(&self) -> Option<i64> {
        self.last_event_ms
    }

    /// The last decoded record's event time if its decoding came as far as the future-time check
    /// (`set_event_time_ceiling`): a refusal found after that check would have been
    /// `future_event_time` under a lower ceiling.
    pub fn judged_event_ms(&self) -> Option<i64> {
        self.judged_event_ms
    }

    /// The last accepted record's own feature and bias-feature dimensions (`None`: no vectors).
    pub fn last_dims(&self) -> (Option<usize>, Option<usize>) {
        self.last_dims
    }

    /// A decoder with the same limits and reader and no rows, its dimensions locked as this one's.
    pub fn sibling(&self) -> Decoder {
        let mut d = Decoder::with_codec(self.limits.clone(), self.codec.clone());
        d.set_dims(self.feature_dim, self.bias_feature_dim);
        d
    }

    /// Sets the locked dimensions as they are, unlocked ones included (a sibling decoding a stretch
    /// of the stream starts where the stream's decoder stands).
    pub fn set_dims(&mut self, feature_dim: Option<usize>, bias_feature_dim: Option<usize>) {
        self.feature_dim = feature_dim;
        self.bias_feature_dim = bias_feature_dim;
    }

    /// Items the last accepted session dropped because their `doc_id` repeated an earlier item's.
    pub fn last_repeats(&self) -> u32 {
        self.last_repeats
    }

    /// Locks the dimensions a previous run of this state already fixed (from its manifest), so a
    /// restart whose first record differs cannot lock another dimension.
    pub fn lock_dims(&mut self, feature_dim: Option<usize>, bias_feature_dim: Option<usize>) {
        self.feature_dim = self.feature_dim.or(feature_dim);
        self.bias_feature_dim = self.bias_feature_dim.or(bias_feature_dim);
    }

    /// The bias-feature dimension the stream is locked to, once known.
    pub fn bias_feature_dim(&self) -> Option<usize> {
        self.bias_feature_dim
    }

    pub fn limits(&self) -> &DecodeLimits {
        &self.limits
    }

    /// The feature dimension the stream is locked to, once known.
    pub fn feature_dim(&self) -> Option<usize> {
        self.feature_dim
    }

    /// Impression rows buffered since the last `finish`.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Validates one record; on success appends its items as rows, on failure appends nothing.
    /// Returns the number of impressions added.
    pub fn decode(&mut self, bytes: &[u8]) -> Result<usize, Rejected> {
        self.judged_event_ms = None;
        if bytes.len() > self.limits.max_record_bytes {
            return Err(Rejected::new(Reason::RecordTooLarge, format!("{} bytes > max_record_bytes {}", bytes.len(), self.limits.max_record_bytes)));
        }
        let raw: RawSession = self.codec.decode(bytes, self.feature_dim.unwrap_or(64))?;
        self.accept(&raw)
    }

    /// Validates one session a codec has read; on success appends its items as rows, on failure
    /// appends nothing (the second half of `decode`). Returns the number of impressions added.
    pub fn accept(&mut self, raw: &RawSession) -> Result<usize, Rejected> {
        self.judged_event_ms = None;
        let checked = self.validate(raw)?;
        Ok(self.append(raw, checked))
    }

    fn validate(&mut self, raw: &RawSession) -> Result<Checked, Rejected> {
        if raw.schema_version != SCHEMA_VERSION {
            return Err(Rejected::new(Reason::UnsupportedSchemaVersion, format!("schema_version {} (this build reads {SCHEMA_VERSION})", raw.schema_version)));
        }
        for (name, id) in [("session_id", &raw.session_id), ("query_id", &raw.query_id), ("policy_id", &raw.policy_id)] {
            if id.0.is_empty() {
                return Err(Rejected::new(Reason::EmptyId, format!("{name} is empty")));
            }
            if id.0.len() > self.limits.max_id_bytes {
                return Err(Rejected::new(Reason::IdTooLong, format!("{name} is {} bytes > decode.max_id_bytes {}", id.0.len(), self.limits.max_id_bytes)));
            }
        }
        let event_millis = raw.event_time.to_millis()?;
        if let Some(floor) = self.event_time_floor {
            if event_millis < floor {
                return Err(Rejected::new(
                    Reason::StaleEventTime,
                    format!("event_time {event_millis} ms is older than the wall clock − decode.max_event_age ({floor} ms)"),
                ));
            }
        }
        self.judged_event_ms = Some(event_millis);
        if let Some(ceiling) = self.event_time_ceiling {
            if event_millis > ceiling {
                return Err(future_event_time(event_millis, ceiling));
            }
        }
        let n = raw.items.len();
        if n == 0 {
            return Err(Rejected::new(Reason::NoItems, "items is empty"));
        }
        if n > self.limits.max_items {
            return Err(Rejected::new(Reason::TooManyItems, format!("{n} items > max_items {}", self.limits.max_items)));
        }
        // Positions seen, for pages within the first 512 positions (nearly all): a bit each.
        let mut seen = [0u64; 8];
        let mut small = true;
        // The smallest repeated position (the refusal names it, as the sorted check below does).
        let mut repeated: Option<u32> = None;
        // Whether any item carries a vector (pages without any skip the dimension checks), and each
        // `doc_id`'s hash for the duplicate check below, gathered in this one pass over the items.
        let mut any_vectors = false;
        self.doc_hash_scratch.clear();
        for (i, item) in raw.items.iter().enumerate() {
            any_vectors |= item.features.is_some() | item.bias_features.is_some();
            self.doc_hash_scratch.push(hash::words(item.doc_id.0.as_bytes()));
            if item.doc_id.0.is_empty() {
                return Err(Rejected::new(Reason::EmptyId, format!("items[{i}].doc_id is empty")));
            }
            if item.doc_id.0.len() > self.limits.max_id_bytes {
                return Err(Rejected::new(
                    Reason::IdTooLong,
                    format!("items[{i}].doc_id is {} bytes > decode.max_id_bytes {}", item.doc_id.0.len(), self.limits.max_id_bytes),
                ));
            }
            if item.position <= 0 {
                return Err(Rejected::new(Reason::NonPositivePosition, format!("items[{i}].position = {} (positions are 1-based)", item.position)));
            }
            let position =
                u32::try_from(item.position).map_err(|_| Rejected::new(Reason::WrongType, format!("items[{i}].position {} overflows u32", item.position)))?;
            if small && position < 512 {
                let (word, bit) = ((position / 64) as usize, 1u64 << (position % 64));
                if seen[word] & bit != 0 {
                    repeated = Some(repeated.map_or(position, |r| r.min(position)));
                }
                seen[word] |= bit;
            } else {
                small = false;
            }
            if let Some(p) = item.propensity {
                if !(p > 0.0 && p <= 1.0) {
                    return Err(Rejected::new(Reason::BadPropensity, format!("items[{i}].propensity = {p} is outside (0, 1]")));
                }
            }
        }
        if !small {
            // Every position is validated by now: the sorted check, for pages past position 511.
            self.positions_scratch.clear();
            self.positions_scratch.extend(raw.items.iter().map(|item| item.position as u32));
            self.positions_scratch.sort_unstable();
            repeated = self.positions_scratch.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
        }
        if let Some(position) = repeated {
            return Err(Rejected::new(Reason::DuplicatePosition, format!("position {position} appears twice")));
        }
        // One page showing one document twice would be its own swap pair (the same (q, d) at two
        // positions of one session) and make Σ_k π(d,k|q) exceed 1: the repeats are dropped (the
        // first occurrence in the record's order kept), or the page refused (`duplicate_doc_id`).
        // The ids go into an open-addressing table keyed by their hash, in the record's order; only
        // ids with equal hashes are compared as text, so a collision costs a comparison.
        let slots = (2 * n).next_power_of_two();
        self.doc_slots_scratch.clear();
        self.doc_slots_scratch.resize(slots, 0);
        self.repeat_scratch.clear();
        self.repeat_scratch.resize(n, false);
        let mut repeats = 0u32;
        // Under `refuse_session`, the smallest repeated id (the refusal names it).
        let mut refused: Option<&str> = None;
        for (i, item) in raw.items.iter().enumerate() {
            let hash = self.doc_hash_scratch[i];
            let mut slot = hash as usize & (slots - 1);
            loop {
                let earlier = self.doc_slots_scratch[slot] as usize;
                if earlier == 0 {
                    self.doc_slots_scratch[slot] = i as u32 + 1;
                    break;
                }
                let id = item.doc_id.0.as_ref();
                if self.doc_hash_scratch[earlier - 1] == hash && raw.items[earlier - 1].doc_id.0 == id {
                    // The first occurrence is in the table: this item repeats it.
                    refused = Some(refused.map_or(id, |r| r.min(id)));
                    self.repeat_scratch[i] = true;
                    repeats += 1;
                    break;
                }
                slot = (slot + 1) & (slots - 1);
            }
        }
        if let Some(id) = refused.filter(|_| self.limits.duplicate_doc_id == DuplicateDocId::RefuseSession) {
            let shown: String = id.chars().take(80).collect();
            return Err(Rejected::new(
                Reason::DuplicateDocument,
                format!("doc_id {shown:?} appears twice in one session (decode.duplicate_doc_id = \"refuse_session\")"),
            ));
        }
        let (feature_dim, bias_dim) = if any_vectors {
            (
                check_dims(raw.items.iter().map(|i| i.features.as_ref()), self.feature_dim, self.limits.max_features, "features")?,
                check_dims(raw.items.iter().map(|i| i.bias_features.as_ref()), self.bias_feature_dim, self.limits.max_features, "bias_features")?,
            )
        } else {
            (None, None)
        };
        Ok(Checked { event_millis, feature_dim, bias_dim, repeats })
    }

    /// Appends the accepted record's items, less repeats; returns the rows added.
    fn append(&mut self, raw: &RawSession, checked: Checked) -> usize {
        // The record is accepted: lock dimensions the stream had not fixed yet.
        self.feature_dim = self.feature_dim.or(checked.feature_dim);
        self.bias_feature_dim = self.bias_feature_dim.or(checked.bias_dim);
        self.last_event_ms = Some(checked.event_millis);
        self.last_dims = (checked.feature_dim, checked.bias_dim);
        self.last_repeats = checked.repeats;
        let context = raw.context.as_ref().and_then(canonical_context);
        let n = raw.items.len() as u32 - checked.repeats;
        let rows = n as usize;
        // Column by column: the session's own values n times, then each item column in one loop.
        self.session_id.push_n(&raw.session_id.0, rows);
        self.query_id.push_n(&raw.query_id.0, rows);
        self.policy_id.push_n(&raw.policy_id.0, rows);
        self.event_time.append_value_n(checked.event_millis, rows);
        self.n_items.append_value_n(n, rows);
        match context.as_deref() {
            Some(c) => self.context.rows().append_value_n(c, rows),
            None => self.context.nulls(rows),
        }
        if checked.repeats == 0 {
            // Nearly every page: no repeat to skip, so each column is one plain loop.
            self.append_items(raw.items.iter(), checked, rows);
        } else {
            let repeat = &self.repeat_scratch;
            let kept: Vec<&RawItem> = raw.items.iter().zip(repeat).filter(|(_, r)| !**r).map(|(item, _)| item).collect();
            self.append_items(kept.into_iter(), checked, rows);
        }
        self.rows += rows;
        rows
    }

    /// The item columns of `rows` kept items.
    fn append_items<'r, 'a: 'r>(&mut self, kept: impl Iterator<Item = &'r RawItem<'a>> + Clone, checked: Checked, rows: usize) {
        for item in kept.clone() {
            self.doc_id.push(&item.doc_id.0);
        }
        // Validation checked that every position fits a u32.
        self.position.extend(kept.clone().map(|item| item.position as u32));
        // The clicks packed 64 to a word and appended a word at a time.
        let mut clicked = kept.clone().map(|item| item.clicked.0).peekable();
        while clicked.peek().is_some() {
            let (mut word, mut bits) = (0u64, 0usize);
            for click in clicked.by_ref().take(64) {
                word |= u64::from(click) << bits;
                bits += 1;
            }
            self.clicked.append_packed_range(0..bits, &word.to_le_bytes());
        }
        // Pages without vectors (`check_dims` returned no dimension) take their nulls in one call.
        match checked.feature_dim {
            None => self.features.nulls(rows),
            Some(_) => {
                let features = self.features.rows();
                kept.clone().for_each(|item| append_list(features, item.features.as_ref()))
            }
        }
        match checked.bias_dim {
            None => self.bias_features.nulls(rows),
            Some(_) => {
                let bias_features = self.bias_features.rows();
                kept.clone().for_each(|item| append_list(bias_features, item.bias_features.as_ref()))
            }
        }
        if kept.clone().all(|item| item.propensity.is_none()) {
            self.propensity.nulls(rows);
        } else {
            self.propensity.rows().extend(kept.map(|item| item.propensity));
        }
    }

    /// Hands out the buffered rows as one batch (possibly empty) and starts a new one.
    pub fn finish(&mut self) -> RecordBatch {
        let rows = self.position.len();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.session_id.finish()),
            Arc::new(self.query_id.finish()),
            Arc::new(self.event_time.finish()),
            Arc::new(self.policy_id.finish()),
            Arc::new(self.context.rows().finish()),
            Arc::new(self.doc_id.finish()),
            Arc::new(UInt32Array::new(std::mem::replace(&mut self.position, Vec::with_capacity(rows)).into(), None)),
            Arc::new(BooleanArray::new(self.clicked.finish(), None)),
            Arc::new(self.n_items.finish()),
            Arc::new(self.features.rows().finish()),
            Arc::new(self.bias_features.rows().finish()),
            Arc::new(self.propensity.rows().finish()),
        ];
        self.rows = 0;
        RecordBatch::try_new(impressions_schema(), columns).expect("decoder builds columns that match the impressions schema")
    }
}

/// The refusal of a session whose event time lies beyond the reference clock + `max_clock_skew`.
pub fn future_event_time(event_millis: i64, ceiling: i64) -> Rejected {
    Rejected::new(Reason::FutureEventTime, format!("event_time {event_millis} ms is beyond the reference clock + decode.max_clock_skew ({ceiling} ms)"))
}

struct Checked {
    event_millis: i64,
    feature_dim: Option<usize>,
    bias_dim: Option<usize>,
    /// Items dropped as repeats of an earlier `doc_id`.
    repeats: u32,
}

/// All present vectors must share one length, agree with the stream's, and stay under the limit.
fn check_dims<'a>(vectors: impl Iterator<Item = Option<&'a Features>>, stream_dim: Option<usize>, max: usize, name: &str) -> Result<Option<usize>, Rejected> {
    let mut seen: Option<usize> = None;
    for (i, v) in vectors.enumerate() {
        let Some(v) = v else { continue };
        let len = v.0.len();
        if len > max {
            return Err(Rejected::new(Reason::TooManyFeatures, format!("items[{i}].{name} has {len} values > max_features {max}")));
        }
        if let Some(expected) = seen.or(stream_dim) {
            if len != expected {
                return Err(Rejected::new(Reason::FeatureLengthMismatch, format!("items[{i}].{name} has {len} values, the stream has {expected}")));
            }
        }
        seen = Some(len);
    }
    Ok(seen)
}

fn append_list(builder: &mut ListBuilder<Float32Builder>, values: Option<&Features>) {
    match values {
        Some(v) => {
            builder.values().append_slice(&v.0);
            builder.append(true);
        }
        None => builder.append(false),
    }
}

/// `k=v` pairs sorted by key and joined with `;` — one comparable string per bias configuration.
fn canonical_context(map: &BTreeMap<Cow<'_, str>, ContextValue>) -> Option<String> {
    let mut out = String::new();
    for (k, v) in map {
        let Some(v) = &v.0 else { continue };
        if !out.is_empty() {
            out.push(';');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    (!out.is_empty()).then_some(out)
}
