//! Integer keys inside a window: `query_id`, `doc_id` and `context` become 64-bit ids when a
//! window admits its rows, so its statistics group, join, sort and partition on integers; the
//! strings come back only where a window's tables leave for Parquet (a checkpoint, a closed window).
//!
//! An id is a stable hash of the string (FNV-1a with a seed per column, finished with a 64-bit mix),
//! so every worker, every restart and every merge gives a string the same id without sharing a
//! dictionary. Each window keeps the strings its ids stand for (`Keys`), checked on every insert: two
//! strings with one id are an error, never a silent merge. The empty context is id 0, so
//! `COALESCE(context, 0)` in the SQL is the `COALESCE(context, '')` it stands for.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{DataType, Field, Schema, UInt32Type, UInt64Type};

use super::catalog::Tables;
use super::hash::{fnv, mix, FNV_OFFSET};

/// The columns that hold interned strings, in any table of a window.
pub const KEY_COLUMNS: [&str; 5] = ["query_id", "doc_id", "context", "context_a", "context_b"];

/// The ids are mixed already: the map uses them as they are.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 ids are hashed")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Which column a string comes from: each has its own seed, so a query and a document with the same
/// text get different ids.
#[derive(Clone, Copy)]
pub enum Kind {
    Query,
    Doc,
    Context,
}

impl Kind {
    fn of(column: &str) -> Option<Kind> {
        match column {
            "query_id" => Some(Kind::Query),
            "doc_id" => Some(Kind::Doc),
            "context" | "context_a" | "context_b" => Some(Kind::Context),
            _ => None,
        }
    }

    fn seed(self) -> u64 {
        match self {
            Kind::Query => 0x51_7cc1_b727_220a,
            Kind::Doc => 0x2545_f491_4f6c_dd1d,
            Kind::Context => 0x9e37_79b9_7f4a_7c15,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Query => "query_id",
            Kind::Doc => "doc_id",
            Kind::Context => "context",
        }
    }
}

/// The id of `s` in column `kind`: never 0 except for the empty context.
pub fn id(kind: Kind, s: &str) -> u64 {
    if s.is_empty() && matches!(kind, Kind::Context) {
        return 0;
    }
    mix(fnv(FNV_OFFSET ^ kind.seed(), s.bytes())).max(1)
}

/// The strings behind one window's ids.
#[derive(Default, Clone)]
pub struct Keys {
    strings: HashMap<u64, Arc<str>, BuildHasherDefault<IdHasher>>,
}

impl Keys {
    /// `s`'s id, remembered; an error when another string already has it.
    pub fn intern(&mut self, kind: Kind, s: &str) -> anyhow::Result<u64> {
        let k = id(kind, s);
        match self.strings.get(&k) {
            Some(known) if known.as_ref() == s => Ok(k),
            Some(known) => anyhow::bail!(
                "{} {s:?} and {known:?} share the 64-bit key {k:#018x}; this build cannot keep both apart in one window (report it, with the two strings)",
                kind.name()
            ),
            None => {
                self.strings.insert(k, Arc::from(s));
                Ok(k)
            }
        }
    }

    /// Ids of a string column (nulls stay null).
    pub fn intern_column(&mut self, kind: Kind, strings: &StringArray) -> anyhow::Result<UInt64Array> {
        let mut out = Vec::with_capacity(strings.len());
        // Rows of a session repeat its query and context: intern a run once.
        let mut last: Option<(&str, u64)> = None;
        for s in strings.iter() {
            out.push(match s {
                None => None,
                Some(s) => match last {
                    Some((l, k)) if l == s => Some(k),
                    _ => {
                        let k = self.intern(kind, s)?;
                        last = Some((s, k));
                        Some(k)
                    }
                },
            });
        }
        Ok(UInt64Array::from(out))
    }

    /// Every id `other` knows, checked against this window's (shards' shares of one window).
    pub fn absorb(&mut self, other: Keys) -> anyhow::Result<()> {
        if self.strings.is_empty() {
            self.strings = other.strings;
            return Ok(());
        }
        for (k, s) in other.strings {
            match self.strings.get(&k) {
                Some(known) if *known == s => {}
                Some(known) => anyhow::bail!("strings {s:?} and {known:?} share the 64-bit key {k:#018x}; this build cannot keep both apart in one window"),
                None => {
                    self.strings.insert(k, s);
                }
            }
        }
        Ok(())
    }

    /// The strings of an id column (nulls stay null).
    fn strings_of(&self, ids: &UInt64Array, column: &str) -> anyhow::Result<StringArray> {
        let mut bytes = 0;
        for k in ids.iter().flatten() {
            bytes += self.strings.get(&k).map_or(0, |s| s.len());
        }
        let mut out = datafusion::arrow::array::StringBuilder::with_capacity(ids.len(), bytes);
        for k in ids.iter() {
            match k {
                None => out.append_null(),
                // The empty context, which `COALESCE(context, 0)` makes of a missing one.
                Some(0) if matches!(Kind::of(column), Some(Kind::Context)) => out.append_value(""),
                Some(k) => match self.strings.get(&k) {
                    Some(s) => out.append_value(s.as_ref()),
                    None => anyhow::bail!("column {column}: key {k:#018x} has no string in this window (a bug: the window lost its dictionary)"),
                },
            }
        }
        Ok(out.finish())
    }

    /// `batch` with every id column (`KEY_COLUMNS`) back to strings: what Parquet and users read.
    pub fn to_strings(&self, batch: &RecordBatch) -> anyhow::Result<RecordBatch> {
        convert(batch, |name, array| match (Kind::of(name), array.data_type()) {
            (Some(_), DataType::UInt64) => Ok(Some(Arc::new(self.strings_of(array.as_primitive::<UInt64Type>(), name)?) as ArrayRef)),
            _ => Ok(None),
        })
    }

    /// `batch` with every string key column as ids, remembered here (a checkpoint's partials, or a
    /// window read back from Parquet).
    pub fn from_strings(&mut self, batch: &RecordBatch) -> anyhow::Result<RecordBatch> {
        convert(batch, |name, array| match (Kind::of(name), array.data_type()) {
            (Some(kind), DataType::Utf8) => Ok(Some(Arc::new(self.intern_column(kind, array.as_string::<i32>())?) as ArrayRef)),
            _ => Ok(None),
        })
    }

    /// Every table's batches back to strings; a table of node pairs also oriented by the strings
    /// (`catalog::Entry::pairs_ordered_by_context`, `orient_pairs`).
    pub fn tables_to_strings(&self, tables: Tables) -> anyhow::Result<Tables> {
        tables
            .into_iter()
            .map(|(name, batches)| {
                let mut out = batches.iter().map(|b| self.to_strings(b)).collect::<anyhow::Result<Vec<_>>>()?;
                if name.entry().pairs_ordered_by_context {
                    out = orient_pairs(out, name.entry().order)?;
                }
                Ok((name, out))
            })
            .collect()
    }

    /// Every table's string key columns as ids, remembered here.
    pub fn tables_from_strings(&mut self, tables: Tables) -> anyhow::Result<Tables> {
        tables.into_iter().map(|(name, batches)| Ok((name, batches.iter().map(|b| self.from_strings(b)).collect::<anyhow::Result<Vec<_>>>()?))).collect()
    }
}

/// `batch` with the columns `f` replaces (and their fields retyped).
fn convert(batch: &RecordBatch, mut f: impl FnMut(&str, &ArrayRef) -> anyhow::Result<Option<ArrayRef>>) -> anyhow::Result<RecordBatch> {
    let schema = batch.schema();
    let mut fields: Vec<Field> = Vec::with_capacity(schema.fields().len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    let mut changed = false;
    for (field, array) in schema.fields().iter().zip(batch.columns()) {
        match f(field.name(), array)? {
            Some(new) => {
                fields.push(field.as_ref().clone().with_data_type(new.data_type().clone()));
                columns.push(new);
                changed = true;
            }
            None => {
                fields.push(field.as_ref().clone());
                columns.push(array.clone());
            }
        }
    }
    if !changed {
        return Ok(batch.clone());
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())), columns)?)
}

/// A node-pair statement (the swap edges) orders the two nodes of a pair within one position by their
/// context ids; users read them ordered by the context strings (`context_a < context_b`), sorted by
/// the table's `order` (position_a, context_a, position_b, context_b) as the statement's `ORDER BY`
/// says. The table has a row per node pair, so this costs nothing next to the window.
fn orient_pairs(batches: Vec<RecordBatch>, order: &[&str]) -> anyhow::Result<Vec<RecordBatch>> {
    let Some(first) = batches.first() else { return Ok(batches) };
    let schema = first.schema();
    let all = datafusion::arrow::compute::concat_batches(&schema, &batches)?;
    let (Some(pa), Some(ca), Some(pb), Some(cb)) =
        (all.column_by_name("position_a"), all.column_by_name("context_a"), all.column_by_name("position_b"), all.column_by_name("context_b"))
    else {
        return Ok(batches);
    };
    let (pa, pb) = (pa.as_primitive::<UInt32Type>(), pb.as_primitive::<UInt32Type>());
    let (ca, cb) = (ca.as_string::<i32>(), cb.as_string::<i32>());
    let swap: Vec<bool> = (0..all.num_rows()).map(|i| pa.value(i) == pb.value(i) && ca.value(i) > cb.value(i)).collect();
    let pick = |x: &StringArray, y: &StringArray| -> StringArray { (0..x.len()).map(|i| Some(if swap[i] { y.value(i) } else { x.value(i) })).collect() };
    let (new_a, new_b) = (pick(ca, cb), pick(cb, ca));
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .zip(all.columns())
        .map(|(f, c)| match f.name().as_str() {
            "context_a" => Arc::new(new_a.clone()) as ArrayRef,
            "context_b" => Arc::new(new_b.clone()) as ArrayRef,
            _ => c.clone(),
        })
        .collect();
    let oriented = RecordBatch::try_new(schema.clone(), columns)?;
    let sort = order
        .iter()
        .map(|c| {
            let values = oriented.column_by_name(c).ok_or_else(|| anyhow::anyhow!("a node-pair table without its order column {c}"))?.clone();
            Ok(datafusion::arrow::compute::SortColumn { values, options: Some(SortOptions { descending: false, nulls_first: false }) })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let order = datafusion::arrow::compute::lexsort_to_indices(&sort, None)?;
    Ok(vec![datafusion::arrow::compute::take_record_batch(&oriented, &order)?])
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    fn batch(queries: &[&str], contexts: &[Option<&str>]) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("query_id", Arc::new(StringArray::from_iter_values(queries)) as ArrayRef),
            ("context", Arc::new(StringArray::from(contexts.to_vec())) as ArrayRef),
            ("sessions", Arc::new(UInt64Array::from_iter_values(0..queries.len() as u64)) as ArrayRef),
        ])
        .unwrap()
    }

    /// Strings to ids and back give the batch again: a missing context stays missing, the empty
    /// context is id 0, equal strings share an id and a query and a context of the same text do not.
    pub fn strings_survive_the_round_trip_through_ids() {
        let b = batch(&["q1", "q2", "q1", ""], &[None, Some(""), Some("q1"), Some("device=mobile")]);
        let mut keys = Keys::default();
        let ids = keys.from_strings(&b).unwrap();
        let (q, c) = (ids.column(0).as_primitive::<UInt64Type>(), ids.column(1).as_primitive::<UInt64Type>());
        assert_eq!(q.value(0), q.value(2));
        assert_ne!(q.value(0), q.value(1));
        assert!(c.is_null(0));
        assert_eq!(c.value(1), 0);
        assert_ne!(c.value(2), q.value(0));
        assert_eq!(keys.to_strings(&ids).unwrap(), b);
    }

    /// Two strings with one id are an error naming both, never one key for two documents: when
    /// interned, and when one shard's share of a window is absorbed into another's.
    pub fn a_second_string_for_a_known_id_is_an_error() {
        let mut keys = Keys::default();
        keys.strings.insert(id(Kind::Doc, "d1"), Arc::from("other"));
        let e = keys.intern(Kind::Doc, "d1").unwrap_err().to_string();
        assert!(e.contains("\"d1\"") && e.contains("\"other\""), "{e}");
        let mut other = Keys::default();
        other.intern(Kind::Doc, "d1").unwrap();
        let mut absorbing = Keys::default();
        absorbing.intern(Kind::Doc, "d2").unwrap();
        absorbing.strings.insert(id(Kind::Doc, "d1"), Arc::from("other"));
        assert!(absorbing.absorb(other).unwrap_err().to_string().contains("\"other\""));
    }

    /// An id without a string is an error, not an empty string.
    pub fn an_id_the_window_does_not_know_is_an_error() {
        let b = RecordBatch::try_from_iter([("doc_id", Arc::new(UInt64Array::from(vec![7u64])) as ArrayRef)]).unwrap();
        assert!(Keys::default().to_strings(&b).unwrap_err().to_string().contains("doc_id"));
    }
}
