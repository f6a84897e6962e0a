//! A nullable column builder that counts a run of nulls and appends it in one call, when a value
//! follows or the batch is finished: most pages carry no vectors, context or propensity.

use datafusion::arrow::array::{Float32Builder, Float64Builder, ListBuilder, StringBuilder};

/// A builder that appends `n` nulls in one call.
pub(crate) trait AppendNulls {
    fn append_nulls(&mut self, n: usize);
}

impl AppendNulls for StringBuilder {
    fn append_nulls(&mut self, n: usize) {
        StringBuilder::append_nulls(self, n)
    }
}

impl AppendNulls for Float64Builder {
    fn append_nulls(&mut self, n: usize) {
        Float64Builder::append_nulls(self, n)
    }
}

impl AppendNulls for ListBuilder<Float32Builder> {
    fn append_nulls(&mut self, n: usize) {
        ListBuilder::append_nulls(self, n)
    }
}

/// `builder`, less the `nulls` still to append after its last row.
pub(crate) struct NullRun<B> {
    builder: B,
    nulls: usize,
}

impl<B: AppendNulls> NullRun<B> {
    pub(crate) fn new(builder: B) -> Self {
        NullRun { builder, nulls: 0 }
    }

    /// `n` more null rows.
    #[inline]
    pub(crate) fn nulls(&mut self, n: usize) {
        self.nulls += n;
    }

    /// The builder with every null row so far appended: for values, or to finish the column.
    #[inline]
    pub(crate) fn rows(&mut self) -> &mut B {
        if self.nulls > 0 {
            self.builder.append_nulls(std::mem::take(&mut self.nulls));
        }
        &mut self.builder
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use datafusion::arrow::array::Array;

    /// Random runs of null rows and values (0–30 rows each), across finishes, give the same
    /// column as Arrow's own `Float64Builder` fed one row at a time, nulls and values alike.
    pub fn null_runs_give_the_array_of_rows_appended_one_at_a_time() {
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let (mut ours, mut reference) = (NullRun::new(Float64Builder::new()), Float64Builder::new());
        for round in 0..3_000 {
            let n = (next() % 31) as usize;
            if next().is_multiple_of(2) {
                ours.nulls(n);
                for _ in 0..n {
                    reference.append_null();
                }
            } else {
                let values: Vec<f64> = (0..n).map(|_| (next() % 1000) as f64).collect();
                ours.rows().append_slice(&values);
                for v in values {
                    reference.append_value(v);
                }
            }
            if round % 700 == 699 {
                let (a, b) = (ours.rows().finish(), reference.finish());
                assert_eq!(a, b, "round {round}");
                assert_eq!(a.null_count(), b.null_count());
            }
        }
        let (a, b) = (ours.rows().finish(), reference.finish());
        assert_eq!(a, b, "the last rows");
    }
}
