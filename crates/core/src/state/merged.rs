//! The merged view: every partition's closed windows merged into one state directory, window by
//! window, with the same merge SQL an open window uses for its partials (`window::merge`,
//! `window::finish`). Every statistic is a sum or a bottom-k sample, so the merge of the
//! partitions' windows equals the window one instance would have written from all the records.
//! Training, identifiability and the monitor read this directory as they read a one-instance state.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{read_window_table, Checkpoint, ClosedOutput, Manifest, StateStore};
use crate::window::keys::Keys;
use crate::window::operator::{OperatorSnapshot, WindowCounters, WindowSpec};
use crate::window::{Holdout, StateTable, Tables};

/// What the merged state is: the settings every partition's state was written with.
#[derive(Debug, Clone)]
pub struct MergeTarget {
    pub source: String,
    pub window: WindowSpec,
    pub holdout: Holdout,
    pub retention_ms: Option<i64>,
    /// The bounds every instance reduced its windows with (`[window] session_store_patterns`).
    pub bounds: crate::window::StatisticBounds,
    /// Windows merged at a time.
    pub threads: usize,
    /// What the merges run on (their SQL's memory pool and statements).
    pub context: crate::context::PipelineContext,
}

/// What one compaction did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CompactReport {
    pub partitions: usize,
    pub windows: usize,
    pub windows_merged: usize,
    pub partition_files: usize,
    /// Seconds merging (reading the partitions' window files, merge SQL, writing).
    pub merge_seconds: f64,
    /// Seconds in all, copying from the store included (set by the caller that copied).
    pub seconds: f64,
}

/// Sums the partitions' counters and offsets: the merged view's operator snapshot. Its watermark
/// is the slowest partition's (a window is complete only when every partition has passed it).
fn merged_snapshot(parts: &[(String, Manifest)]) -> OperatorSnapshot {
    let counters = WindowCounters::sum(parts.iter().map(|(_, m)| &m.operator.counters));
    let mut partitions = BTreeMap::new();
    for (_, m) in parts {
        partitions.extend(m.operator.partitions.clone());
    }
    let watermark = parts.iter().map(|(_, m)| m.operator.watermark).min().unwrap_or(i64::MIN);
    let event_watermark = parts.iter().filter_map(|(_, m)| m.operator.event_watermark).min();
    OperatorSnapshot { partitions, watermark, counters, event_watermark }
}

/// One window merged and finished from its parts' partials (`disjoint_queries`: the parts own
/// disjoint sets of queries, `window::merge_disjoint_queries`), with strings.
fn merge_window(
    start_ms: i64,
    end_ms: i64,
    partials: Vec<Tables>,
    mut keys: Keys,
    target: &MergeTarget,
    disjoint_queries: bool,
) -> anyhow::Result<ClosedOutput> {
    // Merged on the window's ids (`window::keys`): partials read from Parquet are interned here.
    let partials = partials.into_iter().map(|t| keys.tables_from_strings(t)).collect::<anyhow::Result<Vec<_>>>()?;
    let sql = target.context.statements();
    let tables = crate::context::run_here(async {
        let merged = match disjoint_queries {
            true => crate::window::merge_disjoint_queries(sql, partials, &target.bounds).await?,
            false => crate::window::merge(sql, partials, &target.bounds).await?,
        };
        crate::window::finish(sql, merged).await
    })??;
    let tables = keys.tables_to_strings(tables)?;
    Ok(ClosedOutput { start_ms, end_ms, tables, keys: None })
}

/// Merges and finishes each window's partials (`load` gives a window's bounds, its parts' partials,
/// in part order, and the strings of the ids among them), `target.threads` windows at a time (each
/// holds one window's partials); the windows come back in `todo`'s order, with strings.
fn merge_windows<T: Send>(
    todo: Vec<T>,
    target: &MergeTarget,
    load: impl Fn(T) -> anyhow::Result<(i64, i64, Vec<Tables>, Keys)> + Sync,
) -> anyhow::Result<Vec<ClosedOutput>> {
    let merge_one = |item: T| -> anyhow::Result<ClosedOutput> {
        let (start_ms, end_ms, partials, keys) = load(item)?;
        merge_window(start_ms, end_ms, partials, keys, target, false)
    };
    crate::runtime::in_threads(todo, target.threads, merge_one).into_iter().collect()
}

/// Writes windows closed by the shards of one ingest into its merged view `store`, merged in memory:
/// `closed` holds each shard's closed partials (shards in order), which no shard writes itself. The
/// view counts the windows it writes as closed; its other counters and offsets stay as they are
/// until `compact_into` reads the shards' next checkpoint. A window the view holds already is final
/// and is skipped: it was written whole before any shard's checkpoint dropped it, and after a crash
/// between the shards' checkpoints only the shards behind close it again from the replay, so their
/// merge would lack the others' shares. Returns the windows written.
pub fn write_merged(closed: Vec<Vec<ClosedOutput>>, store: &mut StateStore, target: &MergeTarget) -> anyhow::Result<usize> {
    let written: BTreeSet<(i64, i64)> = store.manifest().windows.iter().map(|w| (w.start_ms, w.end_ms)).collect();
    let mut groups: BTreeMap<(i64, i64), (Vec<Tables>, Keys)> = BTreeMap::new();
    for shard in closed {
        for w in shard.into_iter().filter(|w| !written.contains(&(w.start_ms, w.end_ms))) {
            let (partials, keys) = groups.entry((w.start_ms, w.end_ms)).or_default();
            partials.push(w.tables);
            if let Some(k) = w.keys {
                keys.absorb(k)?;
            }
        }
    }
    if groups.is_empty() {
        return Ok(0);
    }
    let n = groups.len();
    let m = store.manifest();
    let (mut operator, resume, dead_letters, decoder) = (m.operator.clone(), m.resume.clone(), m.dead_letters.clone(), m.decoder.clone());
    // Counted here, in the manifest that lists the window, so each is counted once: a shard counts
    // only the windows it saw a session of, and a replay closes again windows the view holds.
    operator.counters.windows_closed += n as u64;
    let cp = Checkpoint {
        closed: Vec::new(),
        open_partials: Vec::new(),
        admitted: Vec::new(),
        late: Vec::new(),
        operator,
        open_windows: BTreeSet::new(),
        resume,
        dead_letters,
        dead_letter_file_bytes: None,
        retention_ms: target.retention_ms,
        decoder,
    };
    // Each window merged on the thread that writes it; the shards own disjoint sets of queries
    // (`pipeline::shards::owners`).
    store.checkpoint_computing(cp, groups.into_iter().map(|(bounds, parts)| (bounds, (bounds, parts))).collect(), |((start, end), (partials, keys))| {
        merge_window(start, end, partials, keys, target, true)
    })?;
    Ok(n)
}

/// Merges the partition states in `parts` (local directories, each with its manifest) into the
/// state directory `out`, re-merging only the windows whose partition windows changed since the
/// last compaction (the manifest's `merged_from` records them).
pub fn compact(parts: &[PathBuf], out: &Path, target: &MergeTarget) -> anyhow::Result<CompactReport> {
    let mut store = StateStore::open(out, &target.source, target.window, target.holdout)?;
    compact_into(parts, &mut store, target)
}

/// `compact` into a state this process already holds open (an ingest's merged view of its shards).
pub fn compact_into(parts: &[PathBuf], store: &mut StateStore, target: &MergeTarget) -> anyhow::Result<CompactReport> {
    let started = std::time::Instant::now();
    let mut manifests: Vec<(String, Manifest)> = Vec::new();
    for dir in parts {
        let m = super::read_manifest(dir)?;
        anyhow::ensure!(
            m.window == target.window,
            "{}: key `window` is {:?} but the config says {:?}; every instance must run with the same window settings",
            dir.join(super::MANIFEST).display(),
            m.window,
            target.window
        );
        manifests.push((dir.display().to_string(), m));
    }
    // Per window, the partition windows that make it up.
    let mut groups: BTreeMap<(i64, i64), Vec<(usize, super::WindowEntry)>> = BTreeMap::new();
    let mut partition_files = 0;
    for (i, (_, m)) in manifests.iter().enumerate() {
        for w in &m.windows {
            partition_files += w.files.len();
            groups.entry((w.start_ms, w.end_ms)).or_default().push((i, w.clone()));
        }
    }
    let fingerprint = |members: &[(usize, super::WindowEntry)]| -> String {
        let mut parts: Vec<String> = members
            .iter()
            .map(|(i, w)| {
                let name = Path::new(&manifests[*i].0).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                format!("{name}/{}:{}", w.dir, w.files.values().sum::<u64>())
            })
            .collect();
        parts.sort();
        parts.join(",")
    };
    let have: BTreeSet<(i64, i64)> = store.manifest().windows.iter().map(|w| (w.start_ms, w.end_ms)).collect();
    let previous = store.manifest().merged_from.clone();
    let mut merged_from = BTreeMap::new();
    let mut todo = Vec::new();
    for ((start, end), members) in &groups {
        let key = format!("{start}-{end}");
        let print = fingerprint(members);
        if !(have.contains(&(*start, *end)) && previous.get(&key) == Some(&print)) {
            todo.push((*start, *end, members));
        }
        merged_from.insert(key, print);
    }
    let read_one = |(start, end, members): (i64, i64, &Vec<(usize, super::WindowEntry)>)| -> anyhow::Result<(i64, i64, Vec<Tables>, Keys)> {
        let key = format!("{start}-{end}");
        let mut partials: Vec<Tables> = Vec::with_capacity(members.len());
        for (i, w) in members.iter() {
            let dir = Path::new(&manifests[*i].0);
            let mut tables: Tables = Vec::new();
            for t in StateTable::partials() {
                tables.push((t, read_window_table(dir, w, t).with_context(|| format!("merging window {key}"))?));
            }
            partials.push(tables);
        }
        Ok((start, end, partials, Keys::default()))
    };
    let closed = merge_windows(todo, target, read_one)?;
    // Late sessions' side output: each part's segments not merged before, once.
    let mut late = Vec::new();
    for (dir, m) in &manifests {
        let name = Path::new(dir).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for file in m.late_segments.iter().chain(m.late.iter().map(|l| &l.file)) {
            let key = format!("late:{name}/{file}");
            if !previous.contains_key(&key) {
                late.extend(super::read_parquet(&Path::new(dir).join("late").join(file))?);
            }
            merged_from.insert(key, String::new());
        }
    }
    let windows_merged = closed.len();
    let mut snapshot = merged_snapshot(&manifests);
    // A window no single part saw whole is still one window closed; an ingest's shards keep none,
    // and the view counts the windows `write_merged` wrote.
    snapshot.counters.windows_closed = snapshot.counters.windows_closed.max(groups.len() as u64).max(store.manifest().operator.counters.windows_closed);
    let mut resume = crate::sources::ResumeOffsets::default();
    let mut dead_letters: BTreeMap<String, u64> = BTreeMap::new();
    for (_, m) in &manifests {
        resume.merge(&m.resume);
        for (reason, n) in &m.dead_letters {
            *dead_letters.entry(reason.clone()).or_default() += n;
        }
    }
    let decoder = manifests.first().map(|(_, m)| m.decoder.clone()).unwrap_or_default();
    let open_in_parts: BTreeSet<i64> = manifests.iter().flat_map(|(_, m)| m.open_window_starts()).collect();
    let changed = windows_merged > 0
        || store.manifest().open_in_parts != open_in_parts
        || !late.is_empty()
        || store.manifest().seq == 0
        || store.manifest().operator.counters != snapshot.counters
        || store.manifest().resume != resume
        || store.manifest().dead_letters != dead_letters;
    if changed {
        store.checkpoint(Checkpoint {
            closed,
            open_partials: Vec::new(),
            admitted: Vec::new(),
            late,
            operator: snapshot,
            open_windows: BTreeSet::new(),
            resume,
            dead_letters,
            dead_letter_file_bytes: None,
            retention_ms: target.retention_ms,
            decoder,
        })?;
        store.record_merged_from(merged_from, open_in_parts)?;
    }
    Ok(CompactReport {
        partitions: manifests.len(),
        windows: store.manifest().windows.len(),
        windows_merged,
        partition_files,
        merge_seconds: started.elapsed().as_secs_f64(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::window::operator::WindowCounters;

    const SPEC: WindowSpec = WindowSpec { size_ms: 600_000, slide_ms: 600_000, allowed_lateness_ms: 0, idle_timeout_ms: 60_000 };
    const HOLDOUT: Holdout = Holdout { validation: 0.1, evaluation: 0.1 };

    /// One checkpoint of a part that holds no closed window: `sessions` counted, its partition
    /// `partition` read to `offset`, `letters` dead letters, and the windows `open` open (partials
    /// without rows).
    fn part_checkpoint(store: &mut StateStore, partition: i32, sessions: u64, offset: i64, letters: u64, open: &[i64]) {
        let counters = WindowCounters { sessions, impressions: 10 * sessions, ..WindowCounters::default() };
        store
            .checkpoint(Checkpoint {
                closed: Vec::new(),
                open_partials: open.iter().map(|s| (*s, Vec::new())).collect(),
                admitted: Vec::new(),
                late: Vec::new(),
                operator: OperatorSnapshot { partitions: BTreeMap::new(), watermark: i64::MIN, counters, event_watermark: None },
                open_windows: open.iter().copied().collect(),
                resume: crate::sources::ResumeOffsets([("k".to_string(), BTreeMap::from([(partition, offset)]))].into()),
                dead_letters: if letters > 0 { BTreeMap::from([("invalid_json".to_string(), letters)]) } else { BTreeMap::new() },
                dead_letter_file_bytes: None,
                retention_ms: None,
                decoder: Default::default(),
            })
            .unwrap();
    }

    /// Compaction of two parts holding no closed window: the view's counters, offsets, dead letters
    /// and open windows follow each part's change of any one of them alone, each change is a new
    /// manifest (its sequence number grows), and a compaction with nothing changed writes none.
    pub fn compaction_follows_each_kind_of_change_in_a_part_and_writes_nothing_when_none_changed() {
        let root = tempfile::tempdir().unwrap();
        let dirs = [root.path().join("a"), root.path().join("b")];
        let mut a = StateStore::open(&dirs[0], "src", SPEC, HOLDOUT).unwrap();
        let mut b = StateStore::open(&dirs[1], "src", SPEC, HOLDOUT).unwrap();
        part_checkpoint(&mut a, 0, 3, 30, 0, &[]);
        part_checkpoint(&mut b, 1, 4, 40, 0, &[]);
        let target = MergeTarget {
            source: "src".into(),
            window: SPEC,
            holdout: HOLDOUT,
            retention_ms: None,
            bounds: Default::default(),
            threads: 1,
            context: Default::default(),
        };
        let view_dir = root.path().join("view");
        let mut view = StateStore::open(&view_dir, "src", SPEC, HOLDOUT).unwrap();
        let compact_seq = |view: &mut StateStore| {
            compact_into(&dirs, view, &target).unwrap();
            view.manifest().seq
        };
        let mut seq = compact_seq(&mut view);
        assert_eq!(view.manifest().operator.counters.sessions, 7);
        assert_eq!(compact_seq(&mut view), seq, "nothing changed: no new manifest");

        let mut step = |view: &mut StateStore, what: &str| {
            let next = compact_seq(view);
            assert!(next > seq, "{what}: the view wrote no new manifest");
            seq = next;
        };
        part_checkpoint(&mut a, 0, 3, 30, 0, &[600_000]);
        step(&mut view, "a window opened in a part");
        assert_eq!(view.manifest().open_window_starts(), BTreeSet::from([600_000]));
        part_checkpoint(&mut b, 1, 9, 40, 0, &[]);
        step(&mut view, "a part's counters moved");
        assert_eq!(view.manifest().operator.counters.sessions, 12);
        part_checkpoint(&mut b, 1, 9, 45, 0, &[]);
        step(&mut view, "a part's offsets moved");
        assert_eq!((view.manifest().resume.get("k", 0), view.manifest().resume.get("k", 1)), (Some(30), Some(45)));
        part_checkpoint(&mut a, 0, 3, 30, 2, &[600_000]);
        step(&mut view, "a part wrote dead letters");
        assert_eq!(view.manifest().dead_letters.get("invalid_json"), Some(&2));
        part_checkpoint(&mut a, 0, 3, 30, 2, &[]);
        step(&mut view, "a part's window closed with no rows");
        assert!(view.manifest().open_window_starts().is_empty());
        assert_eq!(compact_seq(&mut view), seq, "nothing changed: no new manifest");
    }
}
