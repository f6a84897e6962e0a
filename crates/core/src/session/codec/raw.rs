//! The record as read, before validation (every codec builds one; serde reads JSON into it): borrowed ids, the event-time forms, clicks, features and context
//! values, each with the checks its JSON type allows. `decode` turns a `RawSession` into rows;
//! `single_pass` builds the same `RawSession` on its fast path.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::session::reason::{tagged, Reason, Rejected};

/// An identifier: a JSON string, or an integer taken as its decimal text.
pub struct Id<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Id<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for IdVisitor<'a> {
            type Value = Id<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or integer id")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Owned(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Owned(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_any(IdVisitor(std::marker::PhantomData))
    }
}

/// `event_time` as logged: RFC 3339 text or epoch milliseconds.
pub enum EventTime<'a> {
    Text(Cow<'a, str>),
    Millis(i64),
}

impl<'de: 'a, 'a> Deserialize<'de> for EventTime<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TimeVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for TimeVisitor<'a> {
            type Value = EventTime<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an RFC 3339 timestamp or epoch milliseconds")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(EventTime::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(EventTime::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v).map(EventTime::Millis).map_err(|_| tagged(Reason::BadEventTime, "epoch millis out of range"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(EventTime::Millis(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Err(tagged(Reason::BadEventTime, format_args!("epoch millis must be an integer, got {v}")))
            }
        }
        d.deserialize_any(TimeVisitor(std::marker::PhantomData))
    }
}

/// Latest accepted event time: 9999-12-31T23:59:59.999Z.
const MAX_EVENT_MILLIS: i64 = 253_402_300_799_999;

impl EventTime<'_> {
    pub fn to_millis(&self) -> Result<i64, Rejected> {
        let millis = match self {
            EventTime::Millis(m) => *m,
            EventTime::Text(t) => chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| Rejected::new(Reason::BadEventTime, format!("`{t}` is not RFC 3339: {e}")))?
                .timestamp_millis(),
        };
        if !(0..=MAX_EVENT_MILLIS).contains(&millis) {
            return Err(Rejected::new(Reason::BadEventTime, format!("event time {millis} ms is outside 1970..9999")));
        }
        Ok(millis)
    }
}

/// `clicked`: a boolean, or 0/1.
pub struct Clicked(pub bool);

impl<'de> Deserialize<'de> for Clicked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ClickVisitor;
        impl Visitor<'_> for ClickVisitor {
            type Value = Clicked;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a boolean or 0/1")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Clicked, E> {
                Ok(Clicked(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Clicked, E> {
                match v {
                    0 => Ok(Clicked(false)),
                    1 => Ok(Clicked(true)),
                    _ => Err(E::invalid_value(de::Unexpected::Unsigned(v), &self)),
                }
            }
        }
        d.deserialize_any(ClickVisitor)
    }
}

/// A dense f32 vector; refuses non-finite values (spelled as strings, null, or overflowing f32).
pub struct Features(pub Vec<f32>);

impl<'de> Deserialize<'de> for Features {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FeatureSeq;
        impl<'de> Visitor<'de> for FeatureSeq {
            type Value = Features;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of finite numbers")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Features, A::Error> {
                let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(64).min(1024));
                let mut index = 0usize;
                while let Some(v) = seq.next_element_seed(FeatureValue(index))? {
                    values.push(v);
                    index += 1;
                }
                Ok(Features(values))
            }
        }
        d.deserialize_seq(FeatureSeq)
    }
}

pub struct FeatureValue(pub usize);

impl<'de> DeserializeSeed<'de> for FeatureValue {
    type Value = f32;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<f32, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for FeatureValue {
    type Value = f32;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a finite number")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f32, E> {
        let x = v as f32;
        if x == 0.0 {
            // −0 and 0 are one feature value; one bit pattern keeps equal vectors' feature keys equal.
            Ok(0.0)
        } else if x.is_finite() {
            Ok(x)
        } else {
            Err(tagged(Reason::NonFiniteFeature, format_args!("feature {} = {v} is not a finite f32", self.0)))
        }
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f32, E> {
        Ok(v as f32)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f32, E> {
        Ok(v as f32)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<f32, E> {
        let lower = v.trim().to_ascii_lowercase();
        if matches!(lower.trim_start_matches(['+', '-']), "nan" | "inf" | "infinity") {
            Err(tagged(Reason::NonFiniteFeature, format_args!("feature {} is {v:?}", self.0)))
        } else {
            Err(E::invalid_type(de::Unexpected::Str(v), &self))
        }
    }
    fn visit_unit<E: de::Error>(self) -> Result<f32, E> {
        Err(tagged(Reason::NonFiniteFeature, format_args!("feature {} is null", self.0)))
    }
}

/// A context value: text, number or boolean, kept as text.
pub struct ContextValue(pub Option<String>);

impl<'de> Deserialize<'de> for ContextValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(ContextValue(match v {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s),
            serde_json::Value::Bool(b) => Some(b.to_string()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            other => {
                return Err(de::Error::invalid_type(
                    de::Unexpected::Other(if other.is_array() { "array" } else { "object" }),
                    &"a string, number or boolean context value",
                ))
            }
        }))
    }
}

#[derive(Deserialize)]
pub struct RawItem<'a> {
    #[serde(borrow)]
    pub doc_id: Id<'a>,
    pub position: i64,
    pub clicked: Clicked,
    #[serde(default)]
    pub features: Option<Features>,
    #[serde(default)]
    pub bias_features: Option<Features>,
    #[serde(default)]
    pub propensity: Option<f64>,
}

/// Pushes `item` onto `items`: written field by field into room the list already has (the binary
/// codecs' readers build each item from locals). `Vec::push` built it on the stack first and copied
/// it over, reloading its one-byte `clicked` as part of an eight-byte word, a store-forwarding
/// stall on every item (docs/benchmarks.md).
#[inline(always)]
pub(crate) fn push_item<'a>(items: &mut Vec<RawItem<'a>>, item: RawItem<'a>) {
    let len = items.len();
    if let Some(slot) = items.spare_capacity_mut().first_mut() {
        slot.write(item);
        // SAFETY: `slot` is the element at index `len`, inside the capacity, and is now
        // initialised; the elements before it already were.
        unsafe { items.set_len(len + 1) }
    } else {
        items.push(item)
    }
}

#[derive(Deserialize)]
pub struct RawSession<'a> {
    pub schema_version: u64,
    #[serde(borrow)]
    pub session_id: Id<'a>,
    #[serde(borrow)]
    pub query_id: Id<'a>,
    #[serde(borrow)]
    pub event_time: EventTime<'a>,
    #[serde(borrow)]
    pub policy_id: Id<'a>,
    #[serde(default, borrow)]
    pub context: Option<BTreeMap<Cow<'a, str>, ContextValue>>,
    #[serde(borrow)]
    pub items: Vec<RawItem<'a>>,
}
