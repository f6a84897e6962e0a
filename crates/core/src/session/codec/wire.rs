//! A bounds-checked cursor over a binary record: varints, lengths and little-endian floats, each
//! failure named (`truncated_varint`, `truncated_payload`, `malformed_payload`); the Confluent header.

use crate::session::reason::{Reason, Rejected};

pub(crate) struct Cursor<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, at: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.at >= self.buf.len()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }

    /// An unsigned LEB128 varint of at most 10 bytes. Inlined with a one-byte fast path (tags,
    /// lengths and small values, most of a record's varints); longer ones take `varint_long`.
    #[inline(always)]
    pub(crate) fn varint(&mut self, what: &str) -> Result<u64, Rejected> {
        match self.buf.get(self.at) {
            Some(&byte) if byte < 0x80 => {
                self.at += 1;
                Ok(u64::from(byte))
            }
            _ => self.varint_long(what),
        }
    }

    #[inline(never)]
    fn varint_long(&mut self, what: &str) -> Result<u64, Rejected> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.at) else {
                return Err(Rejected::new(Reason::TruncatedVarint, format!("the record ends inside the varint of {what} at byte {}", self.at)));
            };
            self.at += 1;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Rejected::new(Reason::MalformedPayload, format!("the varint of {what} runs past 10 bytes (byte {})", self.at)))
    }

    /// A zigzag-encoded signed varint (Avro's int and long, Confluent's message indexes).
    #[inline(always)]
    pub(crate) fn zigzag(&mut self, what: &str) -> Result<i64, Rejected> {
        let v = self.varint(what)?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// The next `n` bytes.
    #[inline(always)]
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Rejected> {
        if n > self.remaining() {
            return Err(self.short(n, what));
        }
        let out = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    #[cold]
    fn short(&self, n: usize, what: &str) -> Rejected {
        Rejected::new(Reason::TruncatedPayload, format!("{what} needs {n} bytes at byte {} but {} remain", self.at, self.remaining()))
    }

    pub(crate) fn f32_le(&mut self, what: &str) -> Result<f32, Rejected> {
        let b = self.take(4, what)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn f64_le(&mut self, what: &str) -> Result<f64, Rejected> {
        let b = self.take(8, what)?;
        Ok(f64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

/// Text that must be UTF-8 (`not_utf8` otherwise), borrowed from the record.
#[inline(always)]
pub(crate) fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, Rejected> {
    match ascii(bytes) {
        Some(text) => Ok(text),
        None => not_ascii(bytes, what),
    }
}

/// `utf8`'s general case, out of line: text with a non-ASCII byte.
#[inline(never)]
fn not_ascii<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, Rejected> {
    std::str::from_utf8(bytes).map_err(|e| Rejected::new(Reason::NotUtf8, format!("{what}: {e}")))
}

/// `bytes` as text when every byte is ASCII, which ids nearly always are: `is_ascii` reads a word
/// at a time, where the general UTF-8 validation (`str::from_utf8`) costs a call and a byte-wise
/// loop per short id. `None` says: validate it as UTF-8.
#[inline(always)]
pub(crate) fn ascii(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: every byte is below 0x80, and a run of ASCII bytes is valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        None
    }
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Little-endian f32s (`bytes.len()` a multiple of 4) appended as the JSON reader keeps features:
/// −0 folded into 0, non-finite refused (named by its index in the vector).
pub(crate) fn extend_f32_le(into: &mut Vec<f32>, bytes: &[u8], name: &str) -> Result<(), Rejected> {
    let start = into.len();
    // `x + 0.0` is x for every x but −0, which it turns into +0: one branch-free pass the compiler
    // vectorises, then one check of the whole run.
    into.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) + 0.0));
    if into[start..].iter().all(|x| x.is_finite()) {
        return Ok(());
    }
    let bad = into[start..].iter().position(|x| !x.is_finite()).expect("one is not finite");
    let (index, x) = (start + bad, into[start + bad]);
    into.truncate(start);
    Err(Rejected::new(Reason::NonFiniteFeature, format!("{name} value {index} = {x} is not a finite f32")))
}

/// A feature value as the JSON reader keeps it: −0 folded into 0, non-finite refused.
pub(crate) fn feature_value(x: f32, index: usize, name: &str) -> Result<f32, Rejected> {
    if x == 0.0 {
        Ok(0.0)
    } else if x.is_finite() {
        Ok(x)
    } else {
        Err(Rejected::new(Reason::NonFiniteFeature, format!("{name} value {index} = {x} is not a finite f32")))
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

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    /// `utf8` (an ASCII fast path, then `str::from_utf8`) accepts and refuses exactly the byte
    /// strings `str::from_utf8` alone does, and returns the same text: random strings of 0–40 bytes
    /// drawn from ASCII, the lead and continuation bytes of 2–4-byte UTF-8, and bytes UTF-8 never has.
    pub fn utf8_accepts_exactly_what_str_from_utf8_accepts() {
        let mut next = crate::testing::xorshift(0x2545_F491_4F6C_DD1D);
        let pieces: [&[u8]; 8] = [b"d", b"q_7", "é".as_bytes(), "日".as_bytes(), "😀".as_bytes(), b"\xff", b"\xc3", b"\x80"];
        let (mut ascii_seen, mut other_ok, mut refused) = (0, 0, 0);
        for _ in 0..200_000 {
            let mut bytes = Vec::new();
            let len = next() % 41;
            while (bytes.len() as u64) < len {
                let r = next();
                // Mostly ASCII, as ids are; a third of the strings get other pieces too.
                let piece = if r.is_multiple_of(3) { pieces[(r >> 8) as usize % pieces.len()] } else { pieces[(r >> 8) as usize % 2] };
                bytes.extend_from_slice(piece);
            }
            let want = std::str::from_utf8(&bytes).ok();
            let got = utf8(&bytes, "a test string").ok();
            assert_eq!(got, want, "{bytes:?}");
            match (want, bytes.is_ascii()) {
                (Some(_), true) => ascii_seen += 1,
                (Some(_), false) => other_ok += 1,
                (None, _) => refused += 1,
            }
        }
        // Each path was taken, so the comparison covered all three.
        assert!(ascii_seen > 1000 && other_ok > 1000 && refused > 1000, "{ascii_seen} {other_ok} {refused}");
    }
}
