//! The Avro format: records in Avro's binary encoding, read through Avro schema resolution from
//! the writer's schema (a registry id, or a local `.avsc`) to the shipped reader schema
//! (`schemas/session.avsc`): fields matched by name, fields the reader does not know skipped,
//! optional fields the writer lacks left unset, and the promotions the JSON contract allows
//! (int → long, float → double, integer ids as text).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;

use super::interface::{Codec, CodecConfig, Format};
use super::raw::{Clicked, ContextValue, EventTime, Features, Id, RawItem, RawSession};
use super::registry::SchemaSource;
use super::wire::{confluent_header, put_confluent_header};
use super::wire::{extend_f32_le, feature_value, put_varint, put_zigzag, utf8, Cursor};
use crate::session::reason::{Reason, Rejected};

/// The reader schema, shipped as `schemas/session.avsc`; also the schema `encode` writes with.
pub const SESSION_AVSC: &str = include_str!("../../../../../schemas/session.avsc");

/// Deepest nesting of a writer schema's values that is skipped (a recursive schema cannot exhaust the stack).
const MAX_DEPTH: usize = 32;

/// An Avro type of a writer schema; records and named types by index into `Schema::records`.
#[derive(Debug, Clone)]
enum Ty {
    Null,
    Boolean,
    Int,
    Long,
    /// A long in microseconds (`timestamp-micros`, `local-timestamp-micros`).
    LongMicros,
    Float,
    Double,
    Bytes,
    Str,
    Record(usize),
    Enum,
    Array(Box<Ty>),
    Map(Box<Ty>),
    Union(Vec<Ty>),
    Fixed(usize),
}

#[derive(Debug)]
struct Record {
    fields: Vec<(String, Ty)>,
}

/// A parsed writer schema.
#[derive(Debug)]
struct Schema {
    root: Ty,
    records: Vec<Record>,
}

struct Parser {
    records: Vec<Record>,
    named: HashMap<String, Ty>,
}

fn fullname(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) if !name.contains('.') && !ns.is_empty() => format!("{ns}.{name}"),
        _ => name.to_string(),
    }
}

impl Parser {
    fn ty(&mut self, v: &serde_json::Value, ns: Option<&str>) -> Result<Ty, String> {
        use serde_json::Value;
        match v {
            Value::String(name) => self.named_or_primitive(name, ns),
            Value::Array(branches) => Ok(Ty::Union(branches.iter().map(|b| self.ty(b, ns)).collect::<Result<_, _>>()?)),
            Value::Object(o) => {
                let kind = o.get("type").ok_or("a type object without `type`")?;
                let Value::String(kind) = kind else { return self.ty(kind, ns) };
                let logical = o.get("logicalType").and_then(|l| l.as_str());
                let name = || o.get("name").and_then(|n| n.as_str()).ok_or_else(|| format!("a {kind} without a name"));
                let namespace = o.get("namespace").and_then(|n| n.as_str()).or(ns);
                match kind.as_str() {
                    "record" | "error" => {
                        let full = fullname(name()?, namespace);
                        let own_ns = full.rsplit_once('.').map(|(ns, _)| ns.to_string());
                        let index = self.records.len();
                        self.records.push(Record { fields: Vec::new() });
                        self.named.insert(full, Ty::Record(index));
                        let mut fields = Vec::new();
                        for f in o.get("fields").and_then(|f| f.as_array()).ok_or("a record without `fields`")? {
                            let fname = f.get("name").and_then(|n| n.as_str()).ok_or("a field without a name")?;
                            fields.push((fname.to_string(), self.ty(f.get("type").ok_or("a field without a type")?, own_ns.as_deref())?));
                        }
                        self.records[index].fields = fields;
                        Ok(Ty::Record(index))
                    }
                    "enum" => {
                        o.get("symbols").and_then(|s| s.as_array()).ok_or("an enum without symbols")?;
                        self.named.insert(fullname(name()?, namespace), Ty::Enum);
                        Ok(Ty::Enum)
                    }
                    "fixed" => {
                        let size = o.get("size").and_then(|s| s.as_u64()).ok_or("a fixed without a size")? as usize;
                        self.named.insert(fullname(name()?, namespace), Ty::Fixed(size));
                        Ok(Ty::Fixed(size))
                    }
                    "array" => Ok(Ty::Array(Box::new(self.ty(o.get("items").ok_or("an array without `items`")?, ns)?))),
                    "map" => Ok(Ty::Map(Box::new(self.ty(o.get("values").ok_or("a map without `values`")?, ns)?))),
                    "long" if matches!(logical, Some("timestamp-micros" | "local-timestamp-micros")) => Ok(Ty::LongMicros),
                    primitive => self.named_or_primitive(primitive, ns),
                }
            }
            other => Err(format!("{other} is not an Avro type")),
        }
    }

    fn named_or_primitive(&self, name: &str, ns: Option<&str>) -> Result<Ty, String> {
        Ok(match name {
            "null" => Ty::Null,
            "boolean" => Ty::Boolean,
            "int" => Ty::Int,
            "long" => Ty::Long,
            "float" => Ty::Float,
            "double" => Ty::Double,
            "bytes" => Ty::Bytes,
            "string" => Ty::Str,
            _ => self.named.get(&fullname(name, ns)).or_else(|| self.named.get(name)).cloned().ok_or_else(|| format!("unknown type {name:?}"))?,
        })
    }
}

fn parse_schema(text: &str) -> Result<Schema, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let mut p = Parser { records: Vec::new(), named: HashMap::new() };
    let root = p.ty(&v, None)?;
    Ok(Schema { root, records: p.records })
}

/// What a writer's session field feeds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum SessionField {
    SchemaVersion,
    SessionId,
    QueryId,
    EventTime,
    PolicyId,
    Context,
    Items,
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ItemField {
    DocId,
    Position,
    Clicked,
    Features,
    BiasFeatures,
    Propensity,
    Skip,
}

/// The resolution of one writer schema against the reader schema.
#[derive(Debug)]
struct Plan {
    schema: Schema,
    session: Vec<(SessionField, Ty)>,
    /// The writer's item record and its fields' roles.
    item_record: usize,
    item: Vec<(ItemField, Ty)>,
    /// The writer has no `schema_version` (the reader's default, 1, applies).
    default_version: bool,
}

/// The record type inside `ty` (through arrays and unions).
fn record_in(ty: &Ty) -> Option<usize> {
    match ty {
        Ty::Record(r) => Some(*r),
        Ty::Array(t) => record_in(t),
        Ty::Union(b) => b.iter().find_map(record_in),
        _ => None,
    }
}

fn resolve(schema: Schema) -> Result<Plan, Rejected> {
    let missing =
        |what: &str| Rejected::new(Reason::MissingField, format!("the writer schema has no field `{what}`, which the reader schema needs (it has no default)"));
    let Ty::Record(root) = schema.root else {
        return Err(Rejected::new(Reason::WrongType, "the writer schema's top level is not a record"));
    };
    let session: Vec<(SessionField, Ty)> = schema.records[root]
        .fields
        .iter()
        .map(|(name, ty)| {
            let role = match name.as_str() {
                "schema_version" => SessionField::SchemaVersion,
                "session_id" => SessionField::SessionId,
                "query_id" => SessionField::QueryId,
                "event_time" => SessionField::EventTime,
                "policy_id" => SessionField::PolicyId,
                "context" => SessionField::Context,
                "items" => SessionField::Items,
                _ => SessionField::Skip,
            };
            (role, ty.clone())
        })
        .collect();
    for (role, name) in [
        (SessionField::SessionId, "session_id"),
        (SessionField::QueryId, "query_id"),
        (SessionField::EventTime, "event_time"),
        (SessionField::PolicyId, "policy_id"),
        (SessionField::Items, "items"),
    ] {
        if !session.iter().any(|(r, _)| *r == role) {
            return Err(missing(name));
        }
    }
    let items_ty = &session.iter().find(|(r, _)| *r == SessionField::Items).expect("checked above").1;
    let item_record = record_in(items_ty).ok_or_else(|| Rejected::new(Reason::WrongType, "the writer's `items` is not an array of records"))?;
    let item: Vec<(ItemField, Ty)> = schema.records[item_record]
        .fields
        .iter()
        .map(|(name, ty)| {
            let role = match name.as_str() {
                "doc_id" => ItemField::DocId,
                "position" => ItemField::Position,
                "clicked" => ItemField::Clicked,
                "features" => ItemField::Features,
                "bias_features" => ItemField::BiasFeatures,
                "propensity" => ItemField::Propensity,
                _ => ItemField::Skip,
            };
            (role, ty.clone())
        })
        .collect();
    for (role, name) in [(ItemField::DocId, "items[].doc_id"), (ItemField::Position, "items[].position"), (ItemField::Clicked, "items[].clicked")] {
        if !item.iter().any(|(r, _)| *r == role) {
            return Err(missing(name));
        }
    }
    let default_version = !session.iter().any(|(r, _)| *r == SessionField::SchemaVersion);
    Ok(Plan { schema, session, item_record, item, default_version })
}

#[cold]
fn wrong(what: &str, ty: &Ty) -> Rejected {
    Rejected::new(Reason::WrongType, format!("{what}: the writer's {} cannot be read as the reader's type", kind(ty)))
}

fn kind(ty: &Ty) -> &'static str {
    match ty {
        Ty::Null => "null",
        Ty::Boolean => "boolean",
        Ty::Int => "int",
        Ty::Long | Ty::LongMicros => "long",
        Ty::Float => "float",
        Ty::Double => "double",
        Ty::Bytes => "bytes",
        Ty::Str => "string",
        Ty::Record(_) => "record",
        Ty::Enum => "enum",
        Ty::Array(_) => "array",
        Ty::Map(_) => "map",
        Ty::Union(_) => "union",
        Ty::Fixed(_) => "fixed",
    }
}

/// A value's type with a union's branch chosen by the record.
#[inline(always)]
fn branch<'t>(c: &mut Cursor, ty: &'t Ty, what: &str) -> Result<&'t Ty, Rejected> {
    match ty {
        Ty::Union(branches) => {
            let i = c.zigzag(what)?;
            branches
                .get(usize::try_from(i).unwrap_or(usize::MAX))
                .ok_or_else(|| Rejected::new(Reason::MalformedPayload, format!("{what}: union branch {i} of {} branches", branches.len())))
        }
        other => Ok(other),
    }
}

#[inline(always)]
fn int(c: &mut Cursor, ty: &Ty, what: &str) -> Result<Option<i64>, Rejected> {
    match branch(c, ty, what)? {
        Ty::Int | Ty::Long | Ty::LongMicros => Ok(Some(c.zigzag(what)?)),
        Ty::Null => Ok(None),
        other => Err(wrong(what, other)),
    }
}

#[inline(always)]
fn text<'a>(c: &mut Cursor<'a>, ty: &Ty, what: &str) -> Result<Option<Cow<'a, str>>, Rejected> {
    match branch(c, ty, what)? {
        Ty::Str | Ty::Bytes => {
            let n = length(c, what)?;
            Ok(Some(Cow::Borrowed(utf8(c.take(n, what)?, what)?)))
        }
        Ty::Int | Ty::Long => Ok(Some(Cow::Owned(c.zigzag(what)?.to_string()))),
        Ty::Null => Ok(None),
        other => Err(wrong(what, other)),
    }
}

#[inline(always)]
fn id<'a>(c: &mut Cursor<'a>, ty: &Ty, what: &str) -> Result<Id<'a>, Rejected> {
    text(c, ty, what)?.map(Id).ok_or_else(|| Rejected::new(Reason::WrongType, format!("{what} is null")))
}

#[inline(always)]
fn length(c: &mut Cursor, what: &str) -> Result<usize, Rejected> {
    let n = c.zigzag(what)?;
    usize::try_from(n).map_err(|_| Rejected::new(Reason::MalformedPayload, format!("{what}: negative length {n}")))
}

#[inline(always)]
fn float(c: &mut Cursor, ty: &Ty, what: &str) -> Result<Option<f64>, Rejected> {
    match branch(c, ty, what)? {
        Ty::Float => Ok(Some(f64::from(c.f32_le(what)?))),
        Ty::Double => Ok(Some(c.f64_le(what)?)),
        Ty::Int | Ty::Long => Ok(Some(c.zigzag(what)? as f64)),
        Ty::Null => Ok(None),
        other => Err(wrong(what, other)),
    }
}

/// Calls `each` once per element of an array or map (its blocks walked), returns the count.
fn blocks<'a>(c: &mut Cursor<'a>, what: &str, mut each: impl FnMut(&mut Cursor<'a>) -> Result<(), Rejected>) -> Result<usize, Rejected> {
    let mut total = 0usize;
    loop {
        let mut count = c.zigzag(what)?;
        if count == 0 {
            return Ok(total);
        }
        if count < 0 {
            count = count.checked_neg().ok_or_else(|| Rejected::new(Reason::MalformedPayload, format!("{what}: block count {count}")))?;
            length(c, what)?; // the block's byte size, for readers that skip
        }
        // Every element takes at least one byte except nulls; a count beyond the bytes left is a lie.
        if count as u64 > c.remaining() as u64 + 1 {
            return Err(Rejected::new(Reason::TruncatedPayload, format!("{what}: a block of {count} elements in {} bytes", c.remaining())));
        }
        for _ in 0..count {
            each(c)?;
        }
        total += count as usize;
    }
}

fn features(c: &mut Cursor, ty: &Ty, what: &str, capacity: usize) -> Result<Option<Features>, Rejected> {
    let elements = match branch(c, ty, what)? {
        Ty::Null => return Ok(None),
        Ty::Array(e) => e,
        other => return Err(wrong(what, other)),
    };
    let mut values = Vec::with_capacity(capacity.min(1024));
    match **elements {
        // The usual case: each block's floats read in one run, without a per-value dispatch.
        Ty::Float => loop {
            let mut count = c.zigzag(what)?;
            if count == 0 {
                break;
            }
            if count < 0 {
                count = count.checked_neg().ok_or_else(|| Rejected::new(Reason::MalformedPayload, format!("{what}: block count {count}")))?;
                length(c, what)?;
            }
            let n = usize::try_from(count)
                .ok()
                .and_then(|n| n.checked_mul(4))
                .ok_or_else(|| Rejected::new(Reason::TruncatedPayload, format!("{what}: a block of {count} floats")))?;
            extend_f32_le(&mut values, c.take(n, what)?, what)?;
        },
        ref e @ (Ty::Double | Ty::Int | Ty::Long) => {
            blocks(c, what, |c| {
                let x = float(c, e, what)?.expect("not a union") as f32;
                values.push(feature_value(x, values.len(), what)?);
                Ok(())
            })?;
        }
        ref other => return Err(wrong(what, other)),
    }
    Ok(Some(Features(values)))
}

fn skip(c: &mut Cursor, plan: &Plan, ty: &Ty, depth: usize) -> Result<(), Rejected> {
    const WHAT: &str = "a field the reader skips";
    if depth > MAX_DEPTH {
        return Err(Rejected::new(Reason::MalformedPayload, format!("values nested deeper than {MAX_DEPTH}")));
    }
    match branch(c, ty, WHAT)? {
        Ty::Null => {}
        Ty::Boolean => {
            c.take(1, WHAT)?;
        }
        Ty::Int | Ty::Long | Ty::LongMicros | Ty::Enum => {
            c.varint(WHAT)?;
        }
        Ty::Float => {
            c.take(4, WHAT)?;
        }
        Ty::Double => {
            c.take(8, WHAT)?;
        }
        Ty::Bytes | Ty::Str => {
            let n = length(c, WHAT)?;
            c.take(n, WHAT)?;
        }
        Ty::Fixed(n) => {
            c.take(*n, WHAT)?;
        }
        Ty::Record(r) => {
            for (_, t) in &plan.schema.records[*r].fields {
                skip(c, plan, t, depth + 1)?;
            }
        }
        Ty::Array(e) => {
            blocks(c, WHAT, |c| skip(c, plan, e, depth + 1))?;
        }
        Ty::Map(v) => {
            blocks(c, WHAT, |c| {
                let n = length(c, WHAT)?;
                c.take(n, WHAT)?;
                skip(c, plan, v, depth + 1)
            })?;
        }
        Ty::Union(_) => return Err(Rejected::new(Reason::MalformedPayload, "a union directly inside a union")),
    }
    Ok(())
}

/// One item's fields as read so far.
struct ItemFields<'a> {
    doc_id: Id<'a>,
    position: i64,
    clicked: bool,
    features: Option<Features>,
    bias_features: Option<Features>,
    propensity: Option<f64>,
}

/// Reads one item and pushes it onto `items`. Each field is read into a local and the item is
/// written once, whole: a blank item pushed and then filled, or an item returned through a
/// `Result`, costs stores and reloads of its 104 bytes (docs/benchmarks.md). The plan
/// (`resolve`) has a doc_id, a position and a clicked. A writer whose item fields come in the
/// shipped schema's order (most) has them read in that order without a dispatch on each role.
#[inline(always)]
fn read_item<'a>(c: &mut Cursor<'a>, plan: &Plan, capacity: usize, items: &mut Vec<RawItem<'a>>) -> Result<(), Rejected> {
    let mut f = ItemFields { doc_id: Id(Cow::Borrowed("")), position: 0, clicked: false, features: None, bias_features: None, propensity: None };
    match plan.item.as_slice() {
        [(ItemField::DocId, a), (ItemField::Position, b), (ItemField::Clicked, d), (ItemField::Features, e), (ItemField::BiasFeatures, g), (ItemField::Propensity, h)] =>
        {
            item_field(c, plan, ItemField::DocId, a, capacity, &mut f)?;
            item_field(c, plan, ItemField::Position, b, capacity, &mut f)?;
            item_field(c, plan, ItemField::Clicked, d, capacity, &mut f)?;
            item_field(c, plan, ItemField::Features, e, capacity, &mut f)?;
            item_field(c, plan, ItemField::BiasFeatures, g, capacity, &mut f)?;
            item_field(c, plan, ItemField::Propensity, h, capacity, &mut f)?;
        }
        fields => {
            for (role, ty) in fields {
                item_field(c, plan, *role, ty, capacity, &mut f)?;
            }
        }
    }
    let ItemFields { doc_id, position, clicked, features, bias_features, propensity } = f;
    super::raw::push_item(items, RawItem { doc_id, position, clicked: Clicked(clicked), features, bias_features, propensity });
    Ok(())
}

/// Reads the item field `role`, written as `ty`, into `f`.
#[inline(always)]
fn item_field<'a>(c: &mut Cursor<'a>, plan: &Plan, role: ItemField, ty: &Ty, capacity: usize, f: &mut ItemFields<'a>) -> Result<(), Rejected> {
    // The shipped schema's types first, each read directly; any other type the general way below.
    match (role, ty) {
        (ItemField::DocId, Ty::Str) => {
            let n = length(c, "items[].doc_id")?;
            f.doc_id = Id(Cow::Borrowed(utf8(c.take(n, "items[].doc_id")?, "items[].doc_id")?));
            return Ok(());
        }
        (ItemField::Position, Ty::Int | Ty::Long) => {
            f.position = c.zigzag("items[].position")?;
            return Ok(());
        }
        (ItemField::Clicked, Ty::Boolean) if matches!(c.buf.get(c.at), Some(0 | 1)) => {
            f.clicked = c.buf[c.at] == 1;
            c.at += 1;
            return Ok(());
        }
        // A union's branch 0 (one byte, 0) when that branch is null: the optional fields' usual value.
        (ItemField::Features | ItemField::BiasFeatures | ItemField::Propensity, Ty::Union(branches))
            if matches!(branches.first(), Some(Ty::Null)) && c.buf.get(c.at) == Some(&0) =>
        {
            c.at += 1;
            return Ok(());
        }
        _ => {}
    }
    match role {
        ItemField::DocId => f.doc_id = id(c, ty, "items[].doc_id")?,
        ItemField::Position => f.position = int(c, ty, "items[].position")?.ok_or_else(|| Rejected::new(Reason::WrongType, "items[].position is null"))?,
        ItemField::Clicked => {
            f.clicked = match branch(c, ty, "items[].clicked")? {
                Ty::Boolean => match c.take(1, "items[].clicked")?[0] {
                    0 => false,
                    1 => true,
                    b => return Err(Rejected::new(Reason::MalformedPayload, format!("items[].clicked: boolean byte {b}"))),
                },
                t @ (Ty::Int | Ty::Long) => match int(c, t, "items[].clicked")? {
                    Some(0) => false,
                    Some(1) => true,
                    v => return Err(Rejected::new(Reason::WrongType, format!("items[].clicked = {v:?}; a boolean or 0/1"))),
                },
                other => return Err(wrong("items[].clicked", other)),
            }
        }
        ItemField::Features => f.features = self::features(c, ty, "items[].features", capacity)?,
        ItemField::BiasFeatures => f.bias_features = self::features(c, ty, "items[].bias_features", capacity)?,
        ItemField::Propensity => f.propensity = float(c, ty, "items[].propensity")?,
        ItemField::Skip => skip(c, plan, ty, 1)?,
    }
    Ok(())
}

fn read_session<'a>(bytes: &'a [u8], plan: &Plan, capacity: usize) -> Result<RawSession<'a>, Rejected> {
    let mut c = Cursor::new(bytes);
    let mut version = plan.default_version.then_some(1u64);
    let (mut session_id, mut query_id, mut policy_id, mut event_time) = (None, None, None, None);
    let mut context = None;
    // As the JSON reader: most pages fit 32 items without a reallocation.
    let mut items = Vec::with_capacity(32);
    for (role, ty) in &plan.session {
        match role {
            SessionField::SchemaVersion => {
                let v = int(&mut c, ty, "schema_version")?.ok_or_else(|| Rejected::new(Reason::WrongType, "schema_version is null"))?;
                version = Some(u64::try_from(v).map_err(|_| Rejected::new(Reason::UnsupportedSchemaVersion, format!("schema_version {v}")))?);
            }
            SessionField::SessionId => session_id = Some(id(&mut c, ty, "session_id")?),
            SessionField::QueryId => query_id = Some(id(&mut c, ty, "query_id")?),
            SessionField::PolicyId => policy_id = Some(id(&mut c, ty, "policy_id")?),
            SessionField::EventTime => {
                event_time = Some(match branch(&mut c, ty, "event_time")? {
                    Ty::Long | Ty::Int => EventTime::Millis(c.zigzag("event_time")?),
                    Ty::LongMicros => EventTime::Millis(c.zigzag("event_time")?.div_euclid(1000)),
                    t @ Ty::Str => EventTime::Text(text(&mut c, t, "event_time")?.expect("a string")),
                    other => return Err(wrong("event_time", other)),
                })
            }
            SessionField::Context => {
                context = match branch(&mut c, ty, "context")? {
                    Ty::Null => None,
                    Ty::Map(values) => {
                        let mut map = BTreeMap::new();
                        blocks(&mut c, "context", |c| {
                            let n = length(c, "context key")?;
                            let key = utf8(c.take(n, "context key")?, "context key")?;
                            let value = match branch(c, values, "context value")? {
                                Ty::Null => None,
                                Ty::Str | Ty::Bytes => {
                                    let n = length(c, "context value")?;
                                    Some(utf8(c.take(n, "context value")?, "context value")?.to_string())
                                }
                                Ty::Boolean => Some((c.take(1, "context value")?[0] != 0).to_string()),
                                Ty::Int | Ty::Long | Ty::LongMicros => Some(c.zigzag("context value")?.to_string()),
                                Ty::Float => Some(c.f32_le("context value")?.to_string()),
                                Ty::Double => Some(c.f64_le("context value")?.to_string()),
                                other => return Err(wrong("context value", other)),
                            };
                            map.insert(Cow::Borrowed(key), ContextValue(value));
                            Ok(())
                        })?;
                        Some(map)
                    }
                    other => return Err(wrong("context", other)),
                }
            }
            SessionField::Items => match branch(&mut c, ty, "items")? {
                Ty::Array(e) if record_in(e) == Some(plan.item_record) => {
                    blocks(&mut c, "items", |c| read_item(c, plan, capacity, &mut items))?;
                }
                Ty::Null => return Err(Rejected::new(Reason::WrongType, "items is null")),
                other => return Err(wrong("items", other)),
            },
            SessionField::Skip => skip(&mut c, plan, ty, 1)?,
        }
    }
    if !c.is_empty() {
        return Err(Rejected::new(Reason::MalformedPayload, format!("{} bytes after the end of the record", c.remaining())));
    }
    Ok(RawSession {
        schema_version: version.expect("set or defaulted"),
        session_id: session_id.expect("the plan has it"),
        query_id: query_id.expect("the plan has it"),
        event_time: event_time.expect("the plan has it"),
        policy_id: policy_id.expect("the plan has it"),
        context,
        items,
    })
}

/// Avro records, bare (a local writer schema) or Confluent-framed (the registry's).
pub struct Avro {
    source: SchemaSource,
    /// A local writer schema's plan, made at open: every record is read with it, without a lookup.
    local: Option<Plan>,
    /// The registry's plans by schema id; a writer schema that cannot be resolved is kept as its
    /// refusal.
    plans: RwLock<HashMap<u32, Result<Arc<Plan>, Rejected>>>,
}

pub(super) const FORMAT: Format = Format { name: "avro", open, validate };

fn validate(config: &CodecConfig) -> Result<(), String> {
    if config.protobuf_descriptor_set.is_some() || config.protobuf_message.is_some() {
        return Err("keys `decode.protobuf_descriptor_set` and `decode.protobuf_message` are for `decode.format` = \"protobuf\"".into());
    }
    if config.schema_registry.is_some() == config.avro_schema.is_some() {
        return Err("`decode.format` = \"avro\" needs exactly one of `decode.schema_registry.url` and `decode.avro_schema` (a writer schema, .avsc)".into());
    }
    Ok(())
}

fn open(config: &CodecConfig) -> anyhow::Result<Arc<dyn Codec>> {
    let source = SchemaSource::of(config, config.avro_schema.as_ref())?;
    let mut local = None;
    if let SchemaSource::Local(path) = &source {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("key `decode.avro_schema`: cannot read {}: {e}", path.display()))?;
        let schema = parse_schema(&text).map_err(|e| anyhow::anyhow!("key `decode.avro_schema`: {} is not an Avro schema: {e}", path.display()))?;
        let plan = resolve(schema).map_err(|e| anyhow::anyhow!("key `decode.avro_schema`: {} cannot be read as a session: {e}", path.display()))?;
        local = Some(plan);
    }
    Ok(Arc::new(Avro { source, local, plans: RwLock::default() }))
}

impl Avro {
    /// A codec reading bare records written with `writer_schema` (Avro JSON).
    pub fn with_writer_schema(writer_schema: &str) -> Result<Avro, Rejected> {
        let schema = parse_schema(writer_schema).map_err(|e| Rejected::new(Reason::MalformedPayload, e))?;
        let plan = resolve(schema)?;
        Ok(Avro { source: SchemaSource::Local(Default::default()), local: Some(plan), plans: RwLock::default() })
    }

    fn plan(&self, id: u32) -> Result<Arc<Plan>, Rejected> {
        if let Some(p) = self.plans.read().get(&id) {
            return p.clone();
        }
        let SchemaSource::Registry(registry) = &self.source else { unreachable!("a local schema's plan is `local`, made at open") };
        let schema = registry.schema(id)?;
        let plan = if schema.schema_type != "AVRO" {
            Err(Rejected::new(Reason::WrongType, format!("schema id {id} is a {} schema; `decode.format` is avro", schema.schema_type)))
        } else {
            parse_schema(&schema.text)
                .map_err(|e| Rejected::new(Reason::WrongType, format!("schema id {id} is not an Avro schema: {e}")))
                .and_then(resolve)
                .map(Arc::new)
                .map_err(|e| Rejected::new(e.reason, format!("schema id {id}: {}", e.detail)))
        };
        self.plans.write().insert(id, plan.clone());
        plan
    }
}

impl Codec for Avro {
    fn name(&self) -> &'static str {
        "avro"
    }

    fn decode<'a>(&self, bytes: &'a [u8], feature_capacity: usize) -> Result<RawSession<'a>, Rejected> {
        if let Some(plan) = &self.local {
            return read_session(bytes, plan, feature_capacity);
        }
        let (id, payload) = confluent_header(bytes)?;
        let plan = self.plan(id)?;
        read_session(payload, &plan, feature_capacity)
    }

    fn encode(&self, s: &RawSession<'_>, out: &mut Vec<u8>) -> anyhow::Result<()> {
        if let SchemaSource::Registry(registry) = &self.source {
            put_confluent_header(out, registry.writer_id("AVRO", SESSION_AVSC)?);
        }
        let put_str = |out: &mut Vec<u8>, s: &str| {
            put_zigzag(out, s.len() as i64);
            out.extend_from_slice(s.as_bytes());
        };
        let put_floats = |out: &mut Vec<u8>, f: &Option<Features>| match f {
            None => put_zigzag(out, 0),
            Some(f) => {
                put_zigzag(out, 1);
                if !f.0.is_empty() {
                    put_zigzag(out, f.0.len() as i64);
                    for x in &f.0 {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                }
                put_zigzag(out, 0);
            }
        };
        put_zigzag(out, i64::try_from(s.schema_version)?);
        put_str(out, &s.session_id.0);
        put_str(out, &s.query_id.0);
        put_zigzag(out, s.event_time.to_millis().map_err(|e| anyhow::anyhow!("{e}"))?);
        put_str(out, &s.policy_id.0);
        match &s.context {
            Some(map) if map.values().any(|v| v.0.is_some()) => {
                put_zigzag(out, 1);
                let present: Vec<_> = map.iter().filter_map(|(k, v)| v.0.as_deref().map(|v| (k, v))).collect();
                put_zigzag(out, present.len() as i64);
                for (k, v) in present {
                    put_str(out, k);
                    put_str(out, v);
                }
                put_zigzag(out, 0);
            }
            _ => put_zigzag(out, 0),
        }
        if !s.items.is_empty() {
            put_zigzag(out, s.items.len() as i64);
            for item in &s.items {
                put_str(out, &item.doc_id.0);
                put_zigzag(out, i64::from(i32::try_from(item.position)?));
                out.push(u8::from(item.clicked.0));
                put_floats(out, &item.features);
                put_floats(out, &item.bias_features);
                match item.propensity {
                    None => put_zigzag(out, 0),
                    Some(p) => {
                        put_zigzag(out, 1);
                        out.extend_from_slice(&p.to_le_bytes());
                    }
                }
            }
        }
        put_varint(out, 0);
        Ok(())
    }
}
