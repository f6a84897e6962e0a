//! The Protobuf format: records in Protobuf's wire encoding, read by field number, with the
//! numbers of the shipped `schemas/session.proto` or those a local descriptor set (`protoc
//! --descriptor_set_out`) gives the configured message's fields by name. Fields the reader does not
//! know are skipped, as Protobuf's evolution rules want.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::interface::{Codec, CodecConfig, Format};
use super::raw::{Clicked, ContextValue, EventTime, Features, Id, RawItem, RawSession};
use super::registry::SchemaSource;
use super::wire::{confluent_header, put_confluent_header};
use super::wire::{extend_f32_le, feature_value, put_varint, put_zigzag, utf8, Cursor};
use crate::session::reason::{Reason, Rejected};

/// The shipped schema; also what `encode` registers.
pub const SESSION_PROTO: &str = include_str!("../../../../../schemas/session.proto");

/// Where each field of the contract sits in the writer's messages.
#[derive(Debug, Clone, PartialEq)]
struct Numbers {
    /// schema_version, session_id, query_id, event_time, policy_id, context, items.
    session: [u32; 7],
    /// doc_id, position, clicked, features, bias_features, propensity.
    item: [u32; 6],
    /// `event_time` is a `google.protobuf.Timestamp` (else int64 epoch milliseconds).
    timestamp_message: bool,
    /// `features` and `bias_features` as doubles (else floats).
    double_features: [bool; 2],
    /// `propensity` as a float (else a double).
    float_propensity: bool,
}

const SHIPPED: Numbers =
    Numbers { session: [1, 2, 3, 4, 5, 6, 7], item: [1, 2, 3, 4, 5, 6], timestamp_message: true, double_features: [false, false], float_propensity: false };

const SESSION_FIELDS: [&str; 7] = ["schema_version", "session_id", "query_id", "event_time", "policy_id", "context", "items"];
const ITEM_FIELDS: [&str; 6] = ["doc_id", "position", "clicked", "features", "bias_features", "propensity"];

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

#[cold]
fn wrong_wire(what: &str, wire: u8) -> Rejected {
    let name = match wire {
        VARINT => "a varint",
        I64 => "a 64-bit value",
        LEN => "a length-delimited value",
        I32 => "a 32-bit value",
        _ => "a group",
    };
    Rejected::new(Reason::WrongType, format!("{what} arrived as {name}, which its type is not"))
}

#[inline(always)]
fn expect(what: &str, wire: u8, want: u8) -> Result<(), Rejected> {
    if wire == want {
        Ok(())
    } else {
        Err(wrong_wire(what, wire))
    }
}

#[inline(always)]
fn bytes<'a>(c: &mut Cursor<'a>, what: &str) -> Result<&'a [u8], Rejected> {
    let n = c.varint(what)?;
    let n = usize::try_from(n).map_err(|_| Rejected::new(Reason::TruncatedPayload, format!("{what}: length {n}")))?;
    c.take(n, what)
}

fn skip(c: &mut Cursor, wire: u8) -> Result<(), Rejected> {
    const WHAT: &str = "a field the reader skips";
    match wire {
        VARINT => {
            c.varint(WHAT)?;
        }
        I64 => {
            c.take(8, WHAT)?;
        }
        LEN => {
            bytes(c, WHAT)?;
        }
        I32 => {
            c.take(4, WHAT)?;
        }
        other => return Err(Rejected::new(Reason::MalformedPayload, format!("wire type {other} (groups are not read) at byte {}", c.at))),
    }
    Ok(())
}

#[inline(always)]
fn tag(c: &mut Cursor) -> Result<(u32, u8), Rejected> {
    let t = c.varint("a field tag")?;
    let number = u32::try_from(t >> 3).map_err(|_| Rejected::new(Reason::MalformedPayload, format!("field number {} out of range", t >> 3)))?;
    if number == 0 {
        return Err(Rejected::new(Reason::MalformedPayload, format!("field number 0 at byte {}", c.at)));
    }
    Ok((number, (t & 7) as u8))
}

#[inline(always)]
fn text<'a>(c: &mut Cursor<'a>, wire: u8, what: &str) -> Result<Cow<'a, str>, Rejected> {
    expect(what, wire, LEN)?;
    Ok(Cow::Borrowed(utf8(bytes(c, what)?, what)?))
}

/// Packed (one length-delimited run) or one value per tag, as the wire format allows both.
fn floats(c: &mut Cursor, wire: u8, double: bool, into: &mut Vec<f32>, what: &str) -> Result<(), Rejected> {
    let width = if double { 8 } else { 4 };
    let push = |c: &mut Cursor, into: &mut Vec<f32>| -> Result<(), Rejected> {
        let x = if double { c.f64_le(what)? as f32 } else { c.f32_le(what)? };
        let v = feature_value(x, into.len(), what)?;
        into.push(v);
        Ok(())
    };
    match wire {
        LEN => {
            let run = bytes(c, what)?;
            if run.len() % width != 0 {
                return Err(Rejected::new(Reason::MalformedPayload, format!("{what}: a packed run of {} bytes is not a multiple of {width}", run.len())));
            }
            if !double {
                return extend_f32_le(into, run, what);
            }
            let mut inner = Cursor::new(run);
            into.reserve(run.len() / width);
            while !inner.is_empty() {
                push(&mut inner, into)?;
            }
            Ok(())
        }
        w if w == if double { I64 } else { I32 } => push(c, into),
        w => Err(wrong_wire(what, w)),
    }
}

/// Reads one item and pushes it onto `items`. Each field is read into a local and the item is
/// written once, whole: a blank item pushed and then filled, or an item returned through a
/// `Result`, costs stores and reloads of its 104 bytes (docs/benchmarks.md).
#[inline(always)]
fn read_item<'a>(bytes: &'a [u8], n: &Numbers, capacity: usize, items: &mut Vec<RawItem<'a>>) -> Result<(), Rejected> {
    let mut c = Cursor::new(bytes);
    let (mut doc_id, mut position, mut clicked, mut propensity) = ("", 0i64, false, None);
    let (mut features, mut bias_features): (Option<Features>, Option<Features>) = (None, None);
    while !c.is_empty() {
        let (number, wire) = tag(&mut c)?;
        match n.item.iter().position(|&x| x == number) {
            Some(0) => {
                expect("items[].doc_id", wire, LEN)?;
                doc_id = utf8(self::bytes(&mut c, "items[].doc_id")?, "items[].doc_id")?;
            }
            Some(1) => {
                expect("items[].position", wire, VARINT)?;
                // int32/int64 negatives are sign-extended to 64 bits on the wire.
                position = c.varint("items[].position")? as i64;
            }
            Some(2) => {
                expect("items[].clicked", wire, VARINT)?;
                clicked = match c.varint("items[].clicked")? {
                    0 => false,
                    1 => true,
                    v => return Err(Rejected::new(Reason::WrongType, format!("items[].clicked = {v}; a bool is 0 or 1"))),
                };
            }
            Some(k @ (3 | 4)) => {
                let (slot, what) = if k == 3 { (&mut features, "items[].features") } else { (&mut bias_features, "items[].bias_features") };
                let values = slot.get_or_insert_with(|| Features(Vec::with_capacity(capacity.min(1024))));
                floats(&mut c, wire, n.double_features[k - 3], &mut values.0, what)?;
            }
            Some(5) => {
                propensity = Some(if n.float_propensity {
                    expect("items[].propensity", wire, I32)?;
                    f64::from(c.f32_le("items[].propensity")?)
                } else {
                    expect("items[].propensity", wire, I64)?;
                    c.f64_le("items[].propensity")?
                });
            }
            _ => skip(&mut c, wire)?,
        }
    }
    // A field the record lacks stays empty (or 0), and validation refuses it.
    super::raw::push_item(items, RawItem { doc_id: Id(Cow::Borrowed(doc_id)), position, clicked: Clicked(clicked), features, bias_features, propensity });
    Ok(())
}

fn read_timestamp(bytes: &[u8]) -> Result<i64, Rejected> {
    let mut c = Cursor::new(bytes);
    let (mut seconds, mut nanos) = (0i64, 0i64);
    while !c.is_empty() {
        let (number, wire) = tag(&mut c)?;
        match number {
            1 => {
                expect("event_time.seconds", wire, VARINT)?;
                seconds = c.varint("event_time.seconds")? as i64;
            }
            2 => {
                expect("event_time.nanos", wire, VARINT)?;
                nanos = c.varint("event_time.nanos")? as i64;
            }
            _ => skip(&mut c, wire)?,
        }
    }
    seconds
        .checked_mul(1000)
        .and_then(|ms| ms.checked_add(nanos.div_euclid(1_000_000)))
        .ok_or_else(|| Rejected::new(Reason::BadEventTime, format!("event_time {seconds} s {nanos} ns is out of range")))
}

fn read_session<'a>(record: &'a [u8], n: &Numbers, capacity: usize) -> Result<RawSession<'a>, Rejected> {
    let mut c = Cursor::new(record);
    let empty = || Id(Cow::Borrowed(""));
    let mut s = RawSession {
        schema_version: 0,
        session_id: empty(),
        query_id: empty(),
        event_time: EventTime::Millis(0),
        policy_id: empty(),
        context: None,
        // As the JSON reader: most pages fit 32 items without a reallocation.
        items: Vec::with_capacity(32),
    };
    let mut has_time = false;
    while !c.is_empty() {
        let (number, wire) = tag(&mut c)?;
        match n.session.iter().position(|&x| x == number) {
            Some(0) => {
                expect("schema_version", wire, VARINT)?;
                s.schema_version = c.varint("schema_version")?;
            }
            Some(1) => s.session_id = Id(text(&mut c, wire, "session_id")?),
            Some(2) => s.query_id = Id(text(&mut c, wire, "query_id")?),
            Some(3) => {
                has_time = true;
                s.event_time = EventTime::Millis(if n.timestamp_message {
                    expect("event_time", wire, LEN)?;
                    read_timestamp(bytes(&mut c, "event_time")?)?
                } else {
                    expect("event_time", wire, VARINT)?;
                    c.varint("event_time")? as i64
                });
            }
            Some(4) => s.policy_id = Id(text(&mut c, wire, "policy_id")?),
            Some(5) => {
                expect("context", wire, LEN)?;
                let mut entry = Cursor::new(bytes(&mut c, "context")?);
                let (mut key, mut value) = (Cow::Borrowed(""), None);
                while !entry.is_empty() {
                    let (number, wire) = tag(&mut entry)?;
                    match number {
                        1 => key = text(&mut entry, wire, "context key")?,
                        2 => value = Some(text(&mut entry, wire, "context value")?.into_owned()),
                        _ => skip(&mut entry, wire)?,
                    }
                }
                s.context.get_or_insert_with(BTreeMap::new).insert(key, ContextValue(Some(value.unwrap_or_default())));
            }
            Some(6) => {
                expect("items", wire, LEN)?;
                let body = bytes(&mut c, "items")?;
                read_item(body, n, capacity, &mut s.items)?;
            }
            _ => skip(&mut c, wire)?,
        }
    }
    if !has_time {
        return Err(Rejected::new(Reason::MissingField, "event_time is absent"));
    }
    Ok(s)
}

// --- descriptor sets (`protoc --descriptor_set_out`), read with the same cursor -----------------

#[derive(Debug, Default)]
struct Field {
    name: String,
    number: u32,
    ty: u64,
    type_name: String,
}

/// Every message of a FileDescriptorSet by full name (without the leading dot).
fn messages(set: &[u8]) -> Result<HashMap<String, Vec<Field>>, Rejected> {
    let mut out = HashMap::new();
    let mut c = Cursor::new(set);
    while !c.is_empty() {
        let (number, wire) = tag(&mut c)?;
        if number != 1 || wire != LEN {
            skip(&mut c, wire)?;
            continue;
        }
        let mut file = Cursor::new(bytes(&mut c, "file")?);
        let mut package = String::new();
        let mut bodies = Vec::new();
        while !file.is_empty() {
            let (number, wire) = tag(&mut file)?;
            match (number, wire) {
                (2, LEN) => package = utf8(bytes(&mut file, "package")?, "package")?.to_string(),
                (4, LEN) => bodies.push(bytes(&mut file, "message_type")?),
                _ => skip(&mut file, wire)?,
            }
        }
        for body in bodies {
            message(body, &package, &mut out)?;
        }
    }
    Ok(out)
}

fn message(body: &[u8], scope: &str, out: &mut HashMap<String, Vec<Field>>) -> Result<(), Rejected> {
    let mut c = Cursor::new(body);
    let (mut name, mut fields, mut nested) = (String::new(), Vec::new(), Vec::new());
    while !c.is_empty() {
        let (number, wire) = tag(&mut c)?;
        match (number, wire) {
            (1, LEN) => name = utf8(bytes(&mut c, "name")?, "name")?.to_string(),
            (2, LEN) => {
                let mut f = Cursor::new(bytes(&mut c, "field")?);
                let mut field = Field::default();
                while !f.is_empty() {
                    let (number, wire) = tag(&mut f)?;
                    match (number, wire) {
                        (1, LEN) => field.name = utf8(bytes(&mut f, "field name")?, "field name")?.to_string(),
                        (3, VARINT) => field.number = f.varint("field number")? as u32,
                        (5, VARINT) => field.ty = f.varint("field type")?,
                        (6, LEN) => field.type_name = utf8(bytes(&mut f, "type name")?, "type name")?.trim_start_matches('.').to_string(),
                        _ => skip(&mut f, wire)?,
                    }
                }
                fields.push(field);
            }
            (3, LEN) => nested.push(bytes(&mut c, "nested_type")?),
            _ => skip(&mut c, wire)?,
        }
    }
    let full = if scope.is_empty() { name } else { format!("{scope}.{name}") };
    for body in nested {
        message(body, &full, out)?;
    }
    out.insert(full, fields);
    Ok(())
}

// FieldDescriptorProto.Type values.
const T_DOUBLE: u64 = 1;
const T_FLOAT: u64 = 2;
const T_INT64: u64 = 3;
const T_UINT64: u64 = 4;
const T_INT32: u64 = 5;
const T_BOOL: u64 = 8;
const T_STRING: u64 = 9;
const T_MESSAGE: u64 = 11;
const T_BYTES: u64 = 12;
const T_UINT32: u64 = 13;

/// The field numbers of `message` (and of its `items`' message) in a descriptor set.
fn numbers_from(set: &[u8], message: &str) -> Result<Numbers, String> {
    let all = messages(set).map_err(|e| format!("not a descriptor set: {e}"))?;
    let message = message.trim_start_matches('.');
    let session = all.get(message).ok_or_else(|| format!("no message {message:?} in it (it has {})", all.keys().cloned().collect::<Vec<_>>().join(", ")))?;
    let find = |fields: &[Field], name: &str, types: &[u64]| -> Result<Option<(u32, u64, String)>, String> {
        match fields.iter().find(|f| f.name == name) {
            None => Ok(None),
            Some(f) if types.contains(&f.ty) => Ok(Some((f.number, f.ty, f.type_name.clone()))),
            Some(f) => Err(format!("field `{name}` has type {} (descriptor type code), which ultr does not read as {name}", f.ty)),
        }
    };
    const INTS: &[u64] = &[T_INT32, T_INT64, T_UINT32, T_UINT64];
    const TEXT: &[u64] = &[T_STRING, T_BYTES];
    let mut n = Numbers { session: [0; 7], item: [0; 6], ..SHIPPED };
    let session_types: [&[u64]; 7] = [INTS, TEXT, TEXT, &[T_MESSAGE, T_INT64], TEXT, &[T_MESSAGE], &[T_MESSAGE]];
    let mut items_type = String::new();
    for (i, (name, types)) in SESSION_FIELDS.iter().zip(session_types).enumerate() {
        match find(session, name, types)? {
            Some((number, ty, type_name)) => {
                n.session[i] = number;
                if *name == "event_time" {
                    n.timestamp_message = ty == T_MESSAGE;
                    if ty == T_MESSAGE && type_name != "google.protobuf.Timestamp" {
                        return Err(format!("`event_time` is a {type_name}; ultr reads google.protobuf.Timestamp or int64 epoch milliseconds"));
                    }
                }
                if *name == "items" {
                    items_type = type_name;
                }
            }
            None if matches!(*name, "context") => {}
            None => return Err(format!("message {message} has no field `{name}`")),
        }
    }
    let item = all.get(&items_type).ok_or_else(|| format!("the message of `items`, {items_type:?}, is not in the descriptor set"))?;
    let item_types: [&[u64]; 6] = [TEXT, INTS, &[T_BOOL], &[T_FLOAT, T_DOUBLE], &[T_FLOAT, T_DOUBLE], &[T_DOUBLE, T_FLOAT]];
    for (i, (name, types)) in ITEM_FIELDS.iter().zip(item_types).enumerate() {
        match find(item, name, types)? {
            Some((number, ty, _)) => {
                n.item[i] = number;
                match *name {
                    "features" => n.double_features[0] = ty == T_DOUBLE,
                    "bias_features" => n.double_features[1] = ty == T_DOUBLE,
                    "propensity" => n.float_propensity = ty == T_FLOAT,
                    _ => {}
                }
            }
            None if i >= 3 => {}
            None => return Err(format!("message {items_type} has no field `{name}`")),
        }
    }
    Ok(n)
}

/// Protobuf records, bare (a local descriptor set) or Confluent-framed (registry ids checked and kept).
pub struct Protobuf {
    source: SchemaSource,
    numbers: Numbers,
}

pub(super) const FORMAT: Format = Format { name: "protobuf", open, validate };

fn validate(config: &CodecConfig) -> Result<(), String> {
    if config.avro_schema.is_some() {
        return Err("key `decode.avro_schema` is for `decode.format` = \"avro\"".into());
    }
    if config.schema_registry.is_some() && config.protobuf_descriptor_set.is_some() {
        return Err("`decode.format` = \"protobuf\" takes one of `decode.schema_registry.url` and `decode.protobuf_descriptor_set`, not both".into());
    }
    if config.protobuf_descriptor_set.is_some() != config.protobuf_message.is_some() {
        return Err("keys `decode.protobuf_descriptor_set` (from `protoc --include_imports --descriptor_set_out`) and `decode.protobuf_message` (e.g. \"ultr.Session\") go together".into());
    }
    Ok(())
}

fn open(config: &CodecConfig) -> anyhow::Result<Arc<dyn Codec>> {
    let source = SchemaSource::of(config, config.protobuf_descriptor_set.as_ref())?;
    let numbers = match &source {
        SchemaSource::Local(path) if config.protobuf_descriptor_set.is_some() => {
            let set = std::fs::read(path).map_err(|e| anyhow::anyhow!("key `decode.protobuf_descriptor_set`: cannot read {}: {e}", path.display()))?;
            let message = config.protobuf_message.as_deref().unwrap_or("ultr.Session");
            numbers_from(&set, message).map_err(|e| anyhow::anyhow!("key `decode.protobuf_descriptor_set` ({}), message {message:?}: {e}", path.display()))?
        }
        SchemaSource::Local(_) | SchemaSource::Registry(_) => SHIPPED,
    };
    Ok(Arc::new(Protobuf { source, numbers }))
}

impl Protobuf {
    /// Bare records with the shipped field numbers.
    pub fn shipped() -> Protobuf {
        Protobuf { source: SchemaSource::Local(Default::default()), numbers: SHIPPED }
    }
}

/// Skips the Confluent message indexes (a zigzag count, then that many indexes; a count of 0 is [0]).
fn message_indexes(payload: &[u8]) -> Result<&[u8], Rejected> {
    let mut c = Cursor::new(payload);
    let count = c.zigzag("the message-index count")?;
    if !(0..=64).contains(&count) {
        return Err(Rejected::new(Reason::MalformedPayload, format!("{count} message indexes")));
    }
    for _ in 0..count {
        c.zigzag("a message index")?;
    }
    Ok(&payload[c.at..])
}

impl Codec for Protobuf {
    fn name(&self) -> &'static str {
        "protobuf"
    }

    fn decode<'a>(&self, bytes: &'a [u8], feature_capacity: usize) -> Result<RawSession<'a>, Rejected> {
        let payload = match &self.source {
            SchemaSource::Registry(registry) => {
                let (id, rest) = confluent_header(bytes)?;
                let schema = registry.schema(id)?;
                if schema.schema_type != "PROTOBUF" {
                    return Err(Rejected::new(Reason::WrongType, format!("schema id {id} is a {} schema; `decode.format` is protobuf", schema.schema_type)));
                }
                message_indexes(rest)?
            }
            SchemaSource::Local(_) => bytes,
        };
        read_session(payload, &self.numbers, feature_capacity)
    }

    fn encode(&self, s: &RawSession<'_>, out: &mut Vec<u8>) -> anyhow::Result<()> {
        if let SchemaSource::Registry(registry) = &self.source {
            put_confluent_header(out, registry.writer_id("PROTOBUF", SESSION_PROTO)?);
            put_zigzag(out, 0); // message indexes [0]: the first message, Session
        }
        let n = &self.numbers;
        let key = |out: &mut Vec<u8>, number: u32, wire: u8| put_varint(out, (u64::from(number) << 3) | u64::from(wire));
        let len_field = |out: &mut Vec<u8>, number: u32, body: &[u8]| {
            key(out, number, LEN);
            put_varint(out, body.len() as u64);
            out.extend_from_slice(body);
        };
        key(out, n.session[0], VARINT);
        put_varint(out, s.schema_version);
        len_field(out, n.session[1], s.session_id.0.as_bytes());
        len_field(out, n.session[2], s.query_id.0.as_bytes());
        let ms = s.event_time.to_millis().map_err(|e| anyhow::anyhow!("{e}"))?;
        if n.timestamp_message {
            let mut ts = Vec::new();
            key(&mut ts, 1, VARINT);
            put_varint(&mut ts, ms.div_euclid(1000) as u64);
            let nanos = ms.rem_euclid(1000) * 1_000_000;
            if nanos != 0 {
                key(&mut ts, 2, VARINT);
                put_varint(&mut ts, nanos as u64);
            }
            len_field(out, n.session[3], &ts);
        } else {
            key(out, n.session[3], VARINT);
            put_varint(out, ms as u64);
        }
        len_field(out, n.session[4], s.policy_id.0.as_bytes());
        for (k, v) in s.context.iter().flatten() {
            if let Some(v) = &v.0 {
                let mut entry = Vec::new();
                len_field(&mut entry, 1, k.as_bytes());
                len_field(&mut entry, 2, v.as_bytes());
                len_field(out, n.session[5], &entry);
            }
        }
        let mut body = Vec::new();
        for item in &s.items {
            body.clear();
            len_field(&mut body, n.item[0], item.doc_id.0.as_bytes());
            key(&mut body, n.item[1], VARINT);
            put_varint(&mut body, item.position as u64);
            if item.clicked.0 {
                key(&mut body, n.item[2], VARINT);
                body.push(1);
            }
            for (k, f) in [&item.features, &item.bias_features].into_iter().enumerate() {
                if let Some(f) = f {
                    let mut run = Vec::with_capacity(f.0.len() * 8);
                    for x in &f.0 {
                        if n.double_features[k] {
                            run.extend_from_slice(&f64::from(*x).to_le_bytes());
                        } else {
                            run.extend_from_slice(&x.to_le_bytes());
                        }
                    }
                    len_field(&mut body, n.item[3 + k], &run);
                }
            }
            if let Some(p) = item.propensity {
                if n.float_propensity {
                    key(&mut body, n.item[5], I32);
                    body.extend_from_slice(&(p as f32).to_le_bytes());
                } else {
                    key(&mut body, n.item[5], I64);
                    body.extend_from_slice(&p.to_le_bytes());
                }
            }
            len_field(out, n.session[6], &body);
        }
        Ok(())
    }
}
