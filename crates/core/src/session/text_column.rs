//! A non-null Arrow string column built as the decoder appends rows: a session's ids once per item
//! (copied by doubling, a few copies per page instead of one per row), each item's own id once.

use std::mem::MaybeUninit;

use datafusion::arrow::array::StringArray;
use datafusion::arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};

/// The values and offsets of a `Utf8` column without nulls, every value appended from a `&str`.
pub(crate) struct TextColumn {
    values: Vec<u8>,
    /// `offsets[0] = 0`, then the end of each value.
    offsets: Vec<i32>,
}

impl TextColumn {
    pub(crate) fn new() -> Self {
        TextColumn { values: Vec::new(), offsets: vec![0] }
    }

    /// The end offset of `extra` more bytes; a batch holds under 2 GiB of one column's text, as
    /// Arrow's own builder requires (it panics the same way).
    fn end_after(&self, extra: usize) -> i32 {
        self.values.len().checked_add(extra).and_then(|end| i32::try_from(end).ok()).expect("byte array offset overflow")
    }

    /// One value.
    #[inline]
    pub(crate) fn push(&mut self, text: &str) {
        let end = self.end_after(text.len());
        self.values.extend_from_slice(text.as_bytes());
        self.offsets.push(end);
    }

    /// `text` as the next `n` values.
    pub(crate) fn push_n(&mut self, text: &str, n: usize) {
        let bytes = text.as_bytes();
        let total = bytes.len().checked_mul(n).expect("byte array offset overflow");
        let end = self.end_after(total);
        let start = self.values.len();
        if (1..=16).contains(&bytes.len()) {
            // A short id (nearly all): one 16-byte copy per value, each starting where the last
            // value ends, into room for 16 bytes past the end; a call to `memcpy` each cost more.
            let mut pattern = [MaybeUninit::new(0u8); 16];
            for (to, &from) in pattern.iter_mut().zip(bytes) {
                *to = MaybeUninit::new(from);
            }
            self.values.reserve(total + 16);
            let room = &mut self.values.spare_capacity_mut()[..total + 16];
            for at in (0..total).step_by(bytes.len()) {
                room[at..at + 16].copy_from_slice(&pattern);
            }
            // SAFETY: the loop wrote every byte of `room[..total]` (values at 0, len, 2·len, … each
            // 16 ≥ len bytes long), so the first `start + total` bytes are initialised; they are
            // `n` copies of `text`, UTF-8.
            unsafe { self.values.set_len(start + total) };
        } else if total > 0 {
            self.values.reserve(total);
            // Copy what is written so far onto its end: ⌈log₂ n⌉ + 1 copies for n values.
            self.values.extend_from_slice(bytes);
            let mut have = bytes.len();
            while have < total {
                let take = have.min(total - have);
                self.values.extend_from_within(start..start + take);
                have += take;
            }
        }
        let first = *self.offsets.last().expect("offsets start with 0");
        let len = bytes.len() as i32; // ≤ `end`, an i32
        let n = i32::try_from(n).expect("byte array offset overflow");
        self.offsets.extend((1..=n).map(|i| first + len * i));
        debug_assert_eq!(*self.offsets.last().expect("offsets start with 0"), end);
    }

    /// The column so far, and a new empty one (sized as this one was) to go on with.
    pub(crate) fn finish(&mut self) -> StringArray {
        let (bytes, rows) = (self.values.len(), self.offsets.len());
        let values = std::mem::replace(&mut self.values, Vec::with_capacity(bytes));
        let offsets = std::mem::replace(&mut self.offsets, Vec::with_capacity(rows));
        self.offsets.push(0);
        // `OffsetBuffer::new` checks that the offsets start at 0 and never fall.
        let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
        // SAFETY: every value was appended whole from a `&str`, so `values` is UTF-8 and each offset
        // lies on the boundary between two appended strings (or at an end); the offsets were
        // checked to be non-decreasing from 0 and their last is `values.len()` (each push and
        // push_n records the end after its bytes).
        unsafe { StringArray::new_unchecked(offsets, Buffer::from_vec(values), None) }
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, StringBuilder};

    /// Random runs of `push` and `push_n` (n from 0 to 40, texts of 0–20 bytes, some multi-byte)
    /// give the same array as Arrow's own `StringBuilder` fed one value at a time, across finishes.
    pub fn pushes_give_the_array_arrows_builder_gives_one_value_at_a_time() {
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
        let alphabet = ["a", "b", "é", "日", "0", "_"];
        let (mut ours, mut reference) = (TextColumn::new(), StringBuilder::new());
        for round in 0..2_000 {
            let len = (next() % 21) as usize;
            let text: String = (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect();
            if next().is_multiple_of(2) {
                ours.push(&text);
                reference.append_value(&text);
            } else {
                let n = (next() % 41) as usize;
                ours.push_n(&text, n);
                for _ in 0..n {
                    reference.append_value(&text);
                }
            }
            if round % 500 == 499 {
                let (a, b) = (ours.finish(), reference.finish());
                assert_eq!(a, b, "round {round}");
                assert_eq!(a.null_count(), 0);
            }
        }
    }
}
