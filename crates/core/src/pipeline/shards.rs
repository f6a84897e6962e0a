//! How a state is split among ingest workers: the layout a state keeps (`shards/layout.json`), which
//! shard owns a session (a hash of its `query_id`, so π(d,k|q) of a query is one shard's), and how the
//! shards' positions combine when a run restarts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use datafusion::arrow::array::AsArray;
use serde::{Deserialize, Serialize};

use crate::ingest::{DecodedBatch, DecoderState};
use crate::session::schema::col;
use crate::sources::ResumeOffsets;

const SHARDS: &str = "shards";
const LAYOUT: &str = "layout.json";

/// Salt of the shard hash, apart from the per-session sampling hashes.
const SHARD_SALT: u32 = 0x5348_4152;

/// The split a state was created with.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Layout {
    shards: usize,
    /// The column whose hash picks the shard.
    key: String,
}

/// Shard `index`'s state directory.
pub fn dir(state_dir: &Path, index: usize) -> PathBuf {
    state_dir.join(SHARDS).join(index.to_string())
}

/// The shards of the state in `state_dir`: its recorded layout; 1 for a state written by one worker;
/// `workers` for a new state (recorded before anything is written, so a crash cannot change it).
pub fn layout(state_dir: &Path, workers: usize) -> anyhow::Result<usize> {
    let path = state_dir.join(SHARDS).join(LAYOUT);
    if path.exists() {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let layout: Layout = serde_json::from_str(&text).with_context(|| format!("{}: not a shard layout", path.display()))?;
        anyhow::ensure!(layout.shards >= 1 && layout.key == col::QUERY_ID, "{}: key `shards` must be >= 1 and `key` \"query_id\"", path.display());
        if layout.shards != workers {
            tracing::info!("{}: this state has {} ingest workers; key `runtime.workers` ({workers}) applies to new states", path.display(), layout.shards);
        }
        return Ok(layout.shards);
    }
    if state_dir.join(crate::state::MANIFEST).exists() || workers <= 1 {
        if workers > 1 {
            tracing::info!("{}: written by one ingest worker; it continues with one (a new state directory uses {workers})", state_dir.display());
        }
        return Ok(1);
    }
    let shards_dir = state_dir.join(SHARDS);
    std::fs::create_dir_all(&shards_dir).with_context(|| format!("creating {}", shards_dir.display()))?;
    let tmp = shards_dir.join(".tmp-layout.json");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&Layout { shards: workers, key: col::QUERY_ID.into() })?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    crate::state::sync_dir(&shards_dir)?;
    Ok(workers)
}

/// The shard of each session of `batch`, in `origins` order.
pub fn owners(batch: &DecodedBatch, shards: usize) -> Vec<u16> {
    if shards <= 1 {
        return vec![0; batch.origins.len()];
    }
    let queries = batch.impressions.column_by_name(col::QUERY_ID).expect("impressions schema").as_string::<i32>();
    let mut row = 0;
    batch
        .origins
        .iter()
        .map(|o| {
            let shard = shard_of(queries.value(row), shards);
            row += o.rows;
            shard
        })
        .collect()
}

/// The shard that owns `query_id` among `shards`.
pub fn shard_of(query_id: &str, shards: usize) -> u16 {
    (crate::window::sample_key(query_id, SHARD_SALT) % shards as u64) as u16
}

/// Where the reader resumes: per (stream, partition), the earliest shard's offset; a partition some
/// shard has not read yet is read from its start.
pub fn earliest<'a>(mut resumes: impl Iterator<Item = &'a ResumeOffsets>) -> ResumeOffsets {
    let Some(first) = resumes.next() else { return ResumeOffsets::default() };
    let mut out = first.clone();
    for r in resumes {
        for (stream, parts) in out.0.iter_mut() {
            parts.retain(|p, offset| match r.get(stream, *p) {
                Some(o) => {
                    *offset = (*offset).min(o);
                    true
                }
                None => false,
            });
        }
        out.0.retain(|_, parts| !parts.is_empty());
    }
    out
}

/// The shard whose checkpoint is earliest: the fewest records read, summed over its offsets (every
/// shard checkpoints at the same record, so one shard is behind or level with every other); the
/// lowest index among equals.
pub fn earliest_shard<'a>(resumes: impl Iterator<Item = &'a ResumeOffsets>) -> usize {
    let read = |r: &ResumeOffsets| -> i128 { r.0.values().flat_map(|parts| parts.values()).map(|&o| i128::from(o)).sum() };
    resumes.enumerate().min_by_key(|(i, r)| (read(r), *i)).map_or(0, |(i, _)| i)
}

/// The decoder state to resume with: the locked dimensions (every shard's agree), and each stream's
/// clock at the earliest shard, so a re-read record is judged as it was the first time.
pub fn earliest_decoder<'a>(mut states: impl Iterator<Item = &'a DecoderState>) -> DecoderState {
    let Some(first) = states.next() else { return DecoderState::default() };
    let mut out = first.clone();
    for s in states {
        out.feature_dim = out.feature_dim.or(s.feature_dim);
        out.bias_feature_dim = out.bias_feature_dim.or(s.bias_feature_dim);
        let clocks: BTreeMap<String, i64> = out.stream_clocks.iter().filter_map(|(k, v)| s.stream_clocks.get(k).map(|o| (k.clone(), (*v).min(*o)))).collect();
        out.stream_clocks = clocks;
    }
    out
}

/// The offsets a shard's restored state already covered: records below them were counted before
/// the crash and are skipped when the reader, gone back to the earliest shard's position, sends
/// them again.
#[derive(Debug, Default)]
pub struct Covered(ResumeOffsets);

impl Covered {
    pub fn new(resume: ResumeOffsets) -> Covered {
        Covered(resume)
    }

    /// Whether `(stream, partition, offset)` was covered; a lookup that changes nothing, so it may
    /// be asked in any order (a batch's dead letters are checked before its sessions).
    pub fn holds(&self, stream: &str, partition: i32, offset: i64) -> bool {
        self.0 .0.get(stream).and_then(|parts| parts.get(&partition)).is_some_and(|&upto| offset < upto)
    }

    /// The same for a batch's sessions, asked in offset order within each partition: the first
    /// offset at or above a partition's bound ends that partition's skipping (offsets only grow
    /// within a partition), so a run past its crash point no longer looks anything up.
    pub fn skip(&mut self, stream: &str, partition: i32, offset: i64) -> bool {
        // Looked up by the borrowed name: this runs per session while anything is covered.
        let Some(parts) = self.0 .0.get_mut(stream) else { return false };
        match parts.get(&partition) {
            Some(&upto) if offset < upto => true,
            Some(_) => {
                parts.remove(&partition);
                if parts.is_empty() {
                    self.0 .0.remove(stream);
                }
                false
            }
            None => false,
        }
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn the_reader_resumes_at_the_earliest_shard_and_reads_a_partition_one_shard_lacks_from_its_start() {
        let a = ResumeOffsets([("f".to_string(), BTreeMap::from([(0, 500)])), ("k".to_string(), BTreeMap::from([(0, 7), (1, 9)]))].into());
        let b = ResumeOffsets([("f".to_string(), BTreeMap::from([(0, 300)])), ("k".to_string(), BTreeMap::from([(0, 8)]))].into());
        let e = earliest([&a, &b].into_iter());
        assert_eq!(e.get("f", 0), Some(300));
        assert_eq!(e.get("k", 0), Some(7));
        assert_eq!(e.get("k", 1), None, "shard b never read k[1]");
    }

    pub fn the_earliest_shard_has_read_the_fewest_records_and_the_first_among_equals_wins() {
        let at = |a: i64, b: i64| ResumeOffsets([("k".to_string(), BTreeMap::from([(0, a), (1, b)]))].into());
        assert_eq!(earliest_shard([at(10, 7), at(9, 3), at(10, 7)].iter()), 1);
        assert_eq!(earliest_shard([at(5, 5), at(5, 5)].iter()), 0);
        assert_eq!(earliest_shard([at(5, 5), ResumeOffsets::default()].iter()), 1, "a shard that never checkpointed is the earliest");
    }

    pub fn every_shard_gets_a_share_of_the_queries() {
        let mut counts = [0usize; 3];
        for q in 0..3000 {
            counts[shard_of(&format!("q{q}"), 3) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (850..1150).contains(&c)), "{counts:?}");
    }

    /// A restored shard covered partition 0 up to offset 100. A batch from 95 to 104 holds a
    /// malformed record at 102: its dead letter is checked first (`holds`: not covered, so it is
    /// written), and the sessions 95–99 are still skipped after it, 100–104 are not. Before the fix
    /// the letter's check ended the skipping, and 95–99 counted again as duplicate sessions.
    pub fn a_dead_letter_past_the_crash_point_does_not_uncover_the_sessions_before_it() {
        let mut covered = Covered::new(ResumeOffsets([("k".to_string(), BTreeMap::from([(0, 100)]))].into()));
        assert!(!covered.holds("k", 0, 102), "the letter at 102 is new");
        assert!(covered.holds("k", 0, 97), "a letter at 97 was written before the crash");
        let skipped: Vec<bool> = (95..105).map(|offset| covered.skip("k", 0, offset)).collect();
        assert_eq!(skipped, [true, true, true, true, true, false, false, false, false, false]);
        assert!(!covered.skip("k", 1, 3), "a partition the state never read is not covered");
    }
}
