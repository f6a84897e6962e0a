//! A single-pass reader for session records of the usual shape; it builds the `RawSession` that serde_json would, and gives up on anything else so serde_json reads (and words the refusal of) the rest.
//!
//! Why: with 46 full-precision features per item, serde_json's per-number visitor calls dominate
//! decode time. This reader walks the bytes once with a tight number loop. It matches serde_json
//! bit for bit by construction: every number it takes is computed with serde_json's own operations
//! (`significand as f64` then one `*` or `/` by an exact power of ten, |exp| ≤ 22), except that an
//! f32 feature may use a multiplication where it provably rounds to the same f32 (`Decimal::to_f32`);
//! every input it is unsure of (escapes, unknown or repeated keys, long or odd numbers, other value
//! types) returns `None`. `tests/laboratory/fuzz.rs` checks it against serde_json on mutated inputs.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::raw::{Clicked, ContextValue, EventTime, Features, Id, RawItem, RawSession};

/// Reads `bytes` whole, or `None` when serde_json should read it instead. Only the strings are
/// checked for UTF-8: every byte outside them must be ASCII JSON syntax here, and any other record
/// goes to the serde path, which checks the whole record first.
pub(crate) fn read(bytes: &[u8], feature_capacity: usize) -> Option<RawSession<'_>> {
    let mut reader = Reader { bytes, at: 0, feature_capacity };
    let session = reader.session()?;
    reader.skip_whitespace();
    (reader.at == reader.bytes.len()).then_some(session)
}

/// Exact powers of ten: serde_json's table agrees with these up to 1e22.
const POW10: [f64; 23] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22];

/// Reciprocals 10⁻ᵏ, each correctly rounded (a float literal is).
const INV_POW10: [f64; 23] =
    [1e0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12, 1e-13, 1e-14, 1e-15, 1e-16, 1e-17, 1e-18, 1e-19, 1e-20, 1e-21, 1e-22];

/// A JSON number as serde_json hands it to a visitor.
#[derive(Clone, Copy, Debug)]
enum Number {
    Unsigned(u64),
    Signed(i64),
    /// serde_json's f64, kept as its parts until a caller asks for f64 or f32.
    Float(Decimal),
}

/// `±significand × 10^exponent` with |exponent| ≤ 22.
#[derive(Clone, Copy, Debug)]
struct Decimal {
    negative: bool,
    significand: u64,
    exponent: i32,
}

impl Decimal {
    /// Exactly serde_json's value: `significand as f64`, then one `*` or `/` by 10^|exponent|.
    /// (Never infinite: at most 10¹⁹ × 10²².)
    fn to_f64(self) -> f64 {
        let mut f = u64_to_f64(self.significand);
        if self.exponent >= 0 {
            f *= POW10[self.exponent as usize];
        } else {
            f /= POW10[self.exponent.unsigned_abs() as usize];
        }
        if self.negative {
            -f
        } else {
            f
        }
    }

    /// `self.to_f64() as f32`, bit for bit, mostly without the division: `significand × 10⁻ᵏ` is
    /// within 2.5 f64 ulps of the quotient, so both round to the same f32 unless an f32 rounding
    /// boundary (the f64 bit pattern whose low 29 bits are 0x1000_0000) lies within a few ulps,
    /// or the value is an f32 subnormal; those few take the division.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        if self.significand == 0 {
            return if self.negative { -0.0 } else { 0.0 };
        }
        if self.exponent < 0 {
            let product = u64_to_f64(self.significand) * INV_POW10[self.exponent.unsigned_abs() as usize];
            let dropped = product.to_bits() & 0x1FFF_FFFF;
            if dropped.abs_diff(0x1000_0000) > 8 && product >= 2.0 * f32::MIN_POSITIVE as f64 {
                let x = product as f32;
                return if self.negative { -x } else { x };
            }
        }
        self.to_f64() as f32
    }
}

/// `v as f64`, through the one-instruction signed conversion when the top bit is clear (the same value).
#[inline(always)]
fn u64_to_f64(v: u64) -> f64 {
    if (v as i64) >= 0 {
        v as i64 as f64
    } else {
        v as f64
    }
}

/// `significand` followed by the digits at `bytes[*at..]`, read eight bytes at a time: one load
/// finds how many leading bytes are digits and their value, without a branch per digit.
/// Wrapping: the caller refuses numbers of more than 19 digits, which are the only ones that can
/// overflow (serde_json leaves its fast cases for those too).
#[inline(always)]
fn accumulate_digits(mut significand: u64, bytes: &[u8], at: &mut usize) -> u64 {
    while let Some(chunk) = bytes.get(*at..*at + 8) {
        let (count, value) = leading_digits(u64::from_le_bytes(chunk.try_into().expect("eight bytes")));
        significand = significand.wrapping_mul(POW10_U64[count]).wrapping_add(value);
        *at += count;
        if count < 8 {
            return significand;
        }
    }
    // The record's last few bytes.
    while let Some(&c @ b'0'..=b'9') = bytes.get(*at) {
        significand = significand.wrapping_mul(10).wrapping_add((c - b'0') as u64);
        *at += 1;
    }
    significand
}

/// Most digits a significand may have here: 10¹⁹ − 1 < u64::MAX.
const MAX_DIGITS: usize = 19;

const POW10_U64: [u64; 9] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];

/// How many of the eight bytes packed little-endian in `word` (the first in the low byte) are ASCII
/// digits before the first other byte, and the value of those digits.
#[inline(always)]
fn leading_digits(word: u64) -> (usize, u64) {
    const HIGH: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    // A byte is a digit when its high nibble is 3 and adding 6 keeps it so (low nibble ≤ 9). A byte
    // of 0xFA or more carries into the next one, but only bytes after a non-digit are affected.
    let off = ((word & HIGH) ^ ZEROS) | ((word.wrapping_add(0x0606_0606_0606_0606) & HIGH) ^ ZEROS);
    // High bit of each byte: set where `off` is non-zero (no carry leaves a byte: 0x7F + 0x7F < 0x100).
    let non_digit = (((off & 0x7F7F_7F7F_7F7F_7F7F) + 0x7F7F_7F7F_7F7F_7F7F) | off) & 0x8080_8080_8080_8080;
    let count = (non_digit.trailing_zeros() / 8) as usize;
    // Keep the `count` digits in the high bytes and pad the low bytes with '0': leading zeros.
    let digits = word.checked_shl(8 * (8 - count) as u32).unwrap_or(0) | ZEROS.checked_shr(8 * count as u32).unwrap_or(0);
    let d = digits & 0x0F0F_0F0F_0F0F_0F0F;
    // Pairs of digits, then quadruples, then the eight: each step folds neighbours with ×10ⁿ.
    let pairs = (d * 10 + (d >> 8)) & 0x00FF_00FF_00FF_00FF;
    let quads = (pairs * 100 + (pairs >> 16)) & 0x0000_FFFF_0000_FFFF;
    (count, (quads * 10_000 + (quads >> 32)) & 0xFFFF_FFFF)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    feature_capacity: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// The next non-whitespace byte, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.bytes.get(self.at).copied()
    }

    #[inline]
    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.skip_whitespace();
        self.bytes[self.at..].starts_with(word).then(|| self.at += word.len())
    }

    /// A string without escapes or control bytes (serde_json borrows exactly these).
    fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.at;
        loop {
            match *self.bytes.get(self.at)? {
                b'"' => break,
                b'\\' | 0..=0x1f => return None,
                _ => self.at += 1,
            }
        }
        let raw = &self.bytes[start..self.at];
        let s = match super::wire::ascii(raw) {
            Some(s) => s,
            None => std::str::from_utf8(raw).ok()?,
        };
        self.at += 1;
        Some(s)
    }

    /// After a value inside `{…}` or `[…]`: `true` at a comma, `false` at the closing byte.
    #[inline]
    fn more(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.at += 1;
                Some(true)
            }
            c if c == close => {
                self.at += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// serde_json's number grammar and arithmetic, for numbers that fit its fast cases.
    #[inline(always)]
    fn number(&mut self) -> Option<Number> {
        self.skip_whitespace();
        let bytes = self.bytes;
        let mut at = self.at;
        let negative = bytes.get(at) == Some(&b'-');
        at += negative as usize;
        let mut significand: u64 = match *bytes.get(at)? {
            b'0' => {
                at += 1;
                if bytes.get(at).is_some_and(u8::is_ascii_digit) {
                    return None;
                }
                0
            }
            c @ b'1'..=b'9' => {
                at += 1;
                accumulate_digits((c - b'0') as u64, bytes, &mut at)
            }
            _ => return None,
        };
        let integer_digits = at - self.at - negative as usize;
        let mut exponent: i32 = 0;
        let mut is_float = false;
        if bytes.get(at) == Some(&b'.') {
            at += 1;
            is_float = true;
            let digits_from = at;
            significand = accumulate_digits(significand, bytes, &mut at);
            let fraction_digits = at - digits_from;
            if fraction_digits == 0 || integer_digits + fraction_digits > MAX_DIGITS {
                return None;
            }
            exponent = -(fraction_digits as i32);
        } else if integer_digits > MAX_DIGITS {
            return None;
        }
        if let Some(b'e' | b'E') = bytes.get(at) {
            at += 1;
            is_float = true;
            let negative_exp = match bytes.get(at) {
                Some(b'-') => {
                    at += 1;
                    true
                }
                Some(b'+') => {
                    at += 1;
                    false
                }
                _ => false,
            };
            let digits_from = at;
            let mut exp: i32 = 0;
            while let Some(&c @ b'0'..=b'9') = bytes.get(at) {
                exp = exp.checked_mul(10)?.checked_add((c - b'0') as i32)?;
                at += 1;
            }
            if at == digits_from {
                return None;
            }
            exponent = if negative_exp { exponent.checked_sub(exp)? } else { exponent.checked_add(exp)? };
        }
        self.at = at;
        if !is_float {
            return Some(if !negative {
                Number::Unsigned(significand)
            } else {
                let n = (significand as i64).wrapping_neg();
                // serde_json turns `-0` and integers below i64::MIN into floats.
                if n >= 0 {
                    Number::Float(Decimal { negative, significand, exponent: 0 })
                } else {
                    Number::Signed(n)
                }
            });
        }
        if exponent.unsigned_abs() as usize >= POW10.len() {
            return None;
        }
        Some(Number::Float(Decimal { negative, significand, exponent }))
    }

    /// A non-negative integer (serde_json's `u64`).
    fn unsigned(&mut self) -> Option<u64> {
        match self.number()? {
            Number::Unsigned(v) => Some(v),
            _ => None,
        }
    }

    fn id(&mut self) -> Option<Id<'a>> {
        if self.peek()? == b'"' {
            return self.string().map(|s| Id(Cow::Borrowed(s)));
        }
        match self.number()? {
            Number::Unsigned(v) => Some(Id(Cow::Owned(v.to_string()))),
            Number::Signed(v) => Some(Id(Cow::Owned(v.to_string()))),
            Number::Float(_) => None,
        }
    }

    fn event_time(&mut self) -> Option<EventTime<'a>> {
        if self.peek()? == b'"' {
            return self.string().map(|s| EventTime::Text(Cow::Borrowed(s)));
        }
        match self.number()? {
            Number::Unsigned(v) => i64::try_from(v).ok().map(EventTime::Millis),
            Number::Signed(v) => Some(EventTime::Millis(v)),
            Number::Float(_) => None,
        }
    }

    fn features(&mut self) -> Option<Option<Features>> {
        match self.peek()? {
            b'n' => return self.literal(b"null").map(|_| None),
            b'[' => self.at += 1,
            _ => return None,
        }
        let mut values = Vec::with_capacity(self.feature_capacity);
        if self.peek()? == b']' {
            self.at += 1;
            return Some(Some(Features(values)));
        }
        loop {
            let value = match self.number()? {
                Number::Float(v) => {
                    // The serde path's `FeatureValue::visit_f64`; non-finite values are its refusal.
                    let x = v.to_f32();
                    if x == 0.0 {
                        0.0
                    } else if x.is_finite() {
                        x
                    } else {
                        return None;
                    }
                }
                Number::Unsigned(v) => v as f32,
                Number::Signed(v) => v as f32,
            };
            values.push(value);
            if !self.more(b']')? {
                return Some(Some(Features(values)));
            }
        }
    }

    fn context(&mut self) -> Option<Option<BTreeMap<Cow<'a, str>, ContextValue>>> {
        match self.peek()? {
            b'n' => return self.literal(b"null").map(|_| None),
            b'{' => self.at += 1,
            _ => return None,
        }
        let mut map = BTreeMap::new();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(Some(map));
        }
        loop {
            let key = self.string()?;
            self.expect(b':')?;
            let value = match self.peek()? {
                b'"' => Some(self.string()?.to_owned()),
                b'n' => self.literal(b"null").map(|_| None)?,
                b't' => self.literal(b"true").map(|_| Some("true".to_owned()))?,
                b'f' => self.literal(b"false").map(|_| Some("false".to_owned()))?,
                _ => match self.number()? {
                    Number::Unsigned(v) => Some(v.to_string()),
                    Number::Signed(v) => Some(v.to_string()),
                    Number::Float(_) => return None,
                },
            };
            // A repeated key keeps its last value, as serde's map does.
            map.insert(Cow::Borrowed(key), ContextValue(value));
            if !self.more(b'}')? {
                return Some(Some(map));
            }
        }
    }

    fn item(&mut self) -> Option<RawItem<'a>> {
        self.expect(b'{')?;
        let (mut doc_id, mut position, mut clicked) = (None, None, None);
        let (mut features, mut bias_features, mut propensity) = (None, None, None);
        if self.peek()? != b'}' {
            loop {
                let key = self.string()?;
                self.expect(b':')?;
                match key {
                    "doc_id" if doc_id.is_none() => doc_id = Some(self.id()?),
                    "position" if position.is_none() => {
                        position = Some(match self.number()? {
                            Number::Unsigned(v) => i64::try_from(v).ok()?,
                            Number::Signed(v) => v,
                            Number::Float(_) => return None,
                        })
                    }
                    "clicked" if clicked.is_none() => {
                        clicked = Some(match self.peek()? {
                            b't' => self.literal(b"true").map(|_| Clicked(true))?,
                            b'f' => self.literal(b"false").map(|_| Clicked(false))?,
                            _ => match self.number()? {
                                Number::Unsigned(0) => Clicked(false),
                                Number::Unsigned(1) => Clicked(true),
                                _ => return None,
                            },
                        })
                    }
                    "features" if features.is_none() => features = Some(self.features()?),
                    "bias_features" if bias_features.is_none() => bias_features = Some(self.features()?),
                    "propensity" if propensity.is_none() => {
                        propensity = Some(if self.peek()? == b'n' {
                            self.literal(b"null").map(|_| None)?
                        } else {
                            Some(match self.number()? {
                                Number::Unsigned(v) => v as f64,
                                Number::Signed(v) => v as f64,
                                Number::Float(v) => v.to_f64(),
                            })
                        })
                    }
                    // Unknown or repeated keys: serde_json's rules (skip, refuse) apply.
                    _ => return None,
                }
                if !self.more(b'}')? {
                    break;
                }
            }
        } else {
            self.at += 1;
        }
        Some(RawItem {
            doc_id: doc_id?,
            position: position?,
            clicked: clicked?,
            features: features.flatten(),
            bias_features: bias_features.flatten(),
            propensity: propensity.flatten(),
        })
    }

    fn items(&mut self) -> Option<Vec<RawItem<'a>>> {
        self.expect(b'[')?;
        let mut items = Vec::with_capacity(32);
        if self.peek()? == b']' {
            self.at += 1;
            return Some(items);
        }
        loop {
            items.push(self.item()?);
            if !self.more(b']')? {
                return Some(items);
            }
        }
    }

    fn session(&mut self) -> Option<RawSession<'a>> {
        self.expect(b'{')?;
        let (mut schema_version, mut session_id, mut query_id, mut event_time) = (None, None, None, None);
        let (mut policy_id, mut context, mut items) = (None, None, None);
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            let key = self.string()?;
            self.expect(b':')?;
            match key {
                "schema_version" if schema_version.is_none() => schema_version = Some(self.unsigned()?),
                "session_id" if session_id.is_none() => session_id = Some(self.id()?),
                "query_id" if query_id.is_none() => query_id = Some(self.id()?),
                "event_time" if event_time.is_none() => event_time = Some(self.event_time()?),
                "policy_id" if policy_id.is_none() => policy_id = Some(self.id()?),
                "context" if context.is_none() => context = Some(self.context()?),
                "items" if items.is_none() => items = Some(self.items()?),
                _ => return None,
            }
            if !self.more(b'}')? {
                break;
            }
        }
        Some(RawSession {
            schema_version: schema_version?,
            session_id: session_id?,
            query_id: query_id?,
            event_time: event_time?,
            policy_id: policy_id?,
            context: context.flatten(),
            items: items?,
        })
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    /// Records of the usual shape are read here, not handed to serde_json: ids as strings or
    /// numbers, event time as text or epoch milliseconds, a context, features, clicks as booleans or
    /// 0/1. Giving up is always correct (serde_json decodes the same rows), so only this test tells a
    /// reader that gives up on everything from one that works. Regression test for a mutant
    /// cargo-mutants found surviving (`schema_version`'s integer never accepted).
    pub fn records_of_the_usual_shape_take_the_single_pass() {
        let records = [
            r#"{"schema_version":1,"session_id":"s1","query_id":"q7","event_time":"2026-01-01T01:00:00+01:00","policy_id":"p","items":[{"doc_id":"d0","position":1,"clicked":true,"features":[0.1,-2.5e-3,3]},{"doc_id":"d1","position":2,"clicked":false,"features":[0.0,1.0,0.25]}]}"#,
            r#"{"schema_version":1,"session_id":17,"query_id":7,"event_time":1767225600000,"policy_id":"p","context":{"device":"mobile","app":"ios"},"items":[{"doc_id":3,"position":3,"clicked":1}]}"#,
        ];
        for record in records {
            let session = read(record.as_bytes(), 3).unwrap_or_else(|| panic!("left to serde_json: {record}"));
            assert_eq!(session.schema_version, 1);
            assert!(!session.items.is_empty());
        }
    }

    pub fn leading_digits_counts_and_reads_the_digit_run_of_any_eight_bytes() {
        let mut next = crate::testing::xorshift(0x9E37_79B9_7F4A_7C15);
        let alphabet = b"0123456789012345678901234567890123456789.,-+eE]} \x00\xff\xfa\xb9\x3a\x2f";
        for _ in 0..500_000 {
            let mut bytes = [0u8; 8];
            for b in &mut bytes {
                let rng = next();
                *b = if rng.is_multiple_of(5) { (rng >> 32) as u8 } else { alphabet[(rng >> 40) as usize % alphabet.len()] };
            }
            let count = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
            let value = bytes[..count].iter().fold(0u64, |v, b| v * 10 + (b - b'0') as u64);
            assert_eq!(leading_digits(u64::from_le_bytes(bytes)), (count, value), "{bytes:?}");
        }
    }

    pub fn numbers_match_serde_json_or_are_left_to_it() {
        let spellings = [
            "0",
            "-0",
            "7",
            "-7",
            "0.5",
            "-0.0",
            "1e5",
            "1E+2",
            "2.5e-3",
            "123456789012345678",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "0.12345678",
            "0.123456789012",
            "12345678.87654321",
            "1e22",
            "1e23",
            "1.5e-22",
            "1.5e-23",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "1e+",
            "--1",
            "9e307",
        ];
        for text in spellings {
            let mut reader = Reader { bytes: text.as_bytes(), at: 0, feature_capacity: 0 };
            let ours = reader.number().filter(|_| reader.at == text.len());
            let theirs: Result<serde_json::Value, _> = serde_json::from_str(text);
            match (ours, theirs) {
                (None, _) => {}
                (Some(_), Err(e)) => panic!("{text}: taken here, refused by serde_json ({e})"),
                (Some(Number::Unsigned(a)), Ok(v)) => assert_eq!(Some(a), v.as_u64(), "{text}"),
                (Some(Number::Signed(a)), Ok(v)) => assert_eq!(Some(a), v.as_i64().filter(|_| !v.is_u64()), "{text}"),
                (Some(Number::Float(a)), Ok(v)) => {
                    assert!(v.is_f64(), "{text}");
                    assert_eq!(a.to_f64().to_bits(), v.as_f64().unwrap().to_bits(), "{text}");
                    assert_eq!(a.to_f32().to_bits(), (v.as_f64().unwrap() as f32).to_bits(), "{text}");
                }
            }
        }
    }

    /// The reciprocal shortcut against the division, where it can differ: values next to an f32
    /// rounding boundary (spelled with 17 significant digits), ryu's shortest f32 spellings, and
    /// random significands of every length with every exponent.
    pub fn to_f32_equals_the_division_rounded_to_f32() {
        let mut next = crate::testing::xorshift(0x2545_F491_4F6C_DD1D);
        let mut checked = 0u64;
        let mut check = |text: &str| {
            let mut reader = Reader { bytes: text.as_bytes(), at: 0, feature_capacity: 0 };
            if let Some(Number::Float(d)) = reader.number().filter(|_| reader.at == text.len()) {
                let reference: f64 = serde_json::from_str(text).unwrap();
                assert_eq!(d.to_f64().to_bits(), reference.to_bits(), "{text}");
                assert_eq!(d.to_f32().to_bits(), (reference as f32).to_bits(), "{text}");
                checked += 1;
            }
        };
        for _ in 0..300_000 {
            let x = f32::from_bits(next() as u32 & 0x7F7F_FFFF);
            if !x.is_finite() {
                continue;
            }
            // The midpoint between x and the next f32 up, exact in f64, and its neighbours.
            let mid = (x as f64 + f32::from_bits(x.to_bits() + 1) as f64) / 2.0;
            check(&format!("{mid:.16e}"));
            check(&format!("{:.16e}", f64::from_bits(mid.to_bits() + 1)));
            check(&format!("{:.16e}", f64::from_bits(mid.to_bits() - 1)));
            check(&serde_json::to_string(&x).unwrap());
            let digits = 1 + next() % 19;
            let significand = next() % 10u64.pow(digits as u32);
            let exponent = next() % 23;
            check(&format!("{significand}e-{exponent}"));
        }
        assert!(checked > 800_000, "most spellings take the fast path: {checked}");
    }
}
