//! Open windows as partial aggregates: rows a window admits are buffered up to a bound, reduced by
//! the `sql/` statistics, and the partials merged (also by `sql/`) when they pile up, at checkpoints
//! and at close. An open window therefore costs its distinct keys plus one bounded buffer, whatever
//! its length; no raw impression outlives its micro-batch. Inside a window, queries, documents and
//! contexts are ids (`keys`); what leaves it (a checkpoint's partials, a closed window) has strings.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;

use super::keys::Keys;
use super::prepared::Statements;
use super::{finish, merge, reduce, with_window_keys, StatisticBounds, Tables};

/// Partials a window may hold before they are merged into one.
const MERGE_AT_PARTIALS: usize = 4;

#[derive(Default)]
struct OpenWindow {
    /// Keyed impressions not yet reduced.
    buffer: Vec<RecordBatch>,
    buffered_rows: usize,
    /// Reduced (and merged) partial aggregates.
    partials: Vec<Tables>,
    /// Changed since the last checkpoint.
    dirty: bool,
    /// The strings behind the ids of `buffer` and `partials`.
    keys: Keys,
}

/// Every open window's partial aggregates.
pub struct OpenWindows {
    windows: BTreeMap<i64, OpenWindow>,
    /// Buffered rows per window that trigger a reduction.
    reduce_rows: usize,
    holdout: super::Holdout,
    bounds: StatisticBounds,
    /// The statistics' statements (a pipeline context's).
    sql: Arc<Statements>,
}

impl OpenWindows {
    pub fn new(sql: Arc<Statements>, reduce_rows: usize, holdout: super::Holdout, bounds: StatisticBounds) -> Self {
        OpenWindows { windows: BTreeMap::new(), reduce_rows: reduce_rows.max(1), holdout, bounds, sql }
    }

    /// Continues from checkpointed partials (one merged partial per window, with strings).
    pub fn restore(mut self, partials: Vec<(i64, Tables)>) -> anyhow::Result<Self> {
        for (start, tables) in partials {
            let w = self.windows.entry(start).or_default();
            let tables = w.keys.tables_from_strings(tables)?;
            w.partials.push(tables);
        }
        Ok(self)
    }

    /// Adds rows window `start` admitted (whole sessions).
    pub async fn add(&mut self, start: i64, rows: &RecordBatch) -> anyhow::Result<()> {
        if rows.num_rows() == 0 {
            return Ok(());
        }
        let w = self.windows.entry(start).or_default();
        let keyed = with_window_keys(rows, self.holdout, &mut w.keys)?;
        w.buffered_rows += keyed.num_rows();
        w.buffer.push(keyed);
        w.dirty = true;
        if w.buffered_rows >= self.reduce_rows {
            reduce_buffer(&self.sql, w, &self.bounds).await?;
        }
        if w.partials.len() >= MERGE_AT_PARTIALS {
            merge_partials(&self.sql, w, &self.bounds).await?;
        }
        Ok(())
    }

    /// Reduces and merges every window changed since the last call; returns their merged partials,
    /// with strings (what a checkpoint persists in place of raw rows).
    pub async fn checkpoint(&mut self) -> anyhow::Result<Vec<(i64, Tables)>> {
        let mut out = Vec::new();
        for (start, w) in self.windows.iter_mut().filter(|(_, w)| w.dirty) {
            reduce_buffer(&self.sql, w, &self.bounds).await?;
            merge_partials(&self.sql, w, &self.bounds).await?;
            w.dirty = false;
            out.push((*start, w.keys.tables_to_strings(w.partials[0].clone())?));
        }
        Ok(out)
    }

    /// Removes window `start` and returns its finished statistics (every `StateTable`, in catalog order), with
    /// strings.
    pub async fn close(&mut self, start: i64) -> anyhow::Result<Tables> {
        let (merged, keys) = self.remove(start).await?;
        keys.tables_to_strings(finish(&self.sql, merged).await?)
    }

    /// Removes window `start` and returns its one merged partial, unfinished, with its ids and their
    /// strings: a shard's share, which the merged view merges with the other shards' and finishes once.
    pub async fn close_partial(&mut self, start: i64) -> anyhow::Result<(Tables, Keys)> {
        self.remove(start).await
    }

    async fn remove(&mut self, start: i64) -> anyhow::Result<(Tables, Keys)> {
        let mut w = self.windows.remove(&start).unwrap_or_default();
        reduce_buffer(&self.sql, &mut w, &self.bounds).await?;
        Ok((merge(&self.sql, std::mem::take(&mut w.partials), &self.bounds).await?, w.keys))
    }

    pub fn starts(&self) -> impl Iterator<Item = i64> + '_ {
        self.windows.keys().copied()
    }

    /// Arrow bytes held (buffers and partials), for the memory figures.
    pub fn memory_bytes(&self) -> usize {
        self.windows
            .values()
            .map(|w| {
                w.buffer.iter().map(|b| b.get_array_memory_size()).sum::<usize>()
                    + w.partials.iter().flat_map(|t| t.iter().flat_map(|(_, b)| b.iter())).map(|b| b.get_array_memory_size()).sum::<usize>()
            })
            .sum()
    }
}

async fn reduce_buffer(sql: &Statements, w: &mut OpenWindow, bounds: &StatisticBounds) -> anyhow::Result<()> {
    if !w.buffer.is_empty() {
        let partial = reduce(sql, std::mem::take(&mut w.buffer), bounds).await?;
        w.partials.push(partial);
        w.buffered_rows = 0;
    }
    Ok(())
}

async fn merge_partials(sql: &Statements, w: &mut OpenWindow, bounds: &StatisticBounds) -> anyhow::Result<()> {
    if w.partials.len() > 1 || w.partials.first().is_some_and(|p| p.iter().any(|(_, b)| b.len() > 1)) {
        let merged = merge(sql, std::mem::take(&mut w.partials), bounds).await?;
        w.partials.push(merged);
    } else if w.partials.is_empty() {
        w.partials.push(merge(sql, Vec::new(), bounds).await?);
    }
    Ok(())
}
