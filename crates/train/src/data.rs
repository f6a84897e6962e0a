//! Training examples: the horizon's aggregated training rows joined with π(d,k|q) by
//! `sql/training_examples.sql` (or raw sessions, for the raw path and for tests), with de-duplicated
//! feature rows. A row is (impressions, clicks) of one key; a raw impression is a row of count 1.

use std::collections::HashMap;
use std::path::Path;
use ultr_core::context::PipelineContext;

use anyhow::{bail, Context};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type, Schema, UInt32Type, UInt8Type};
use std::sync::Arc;

use super::config::IpsConfig;
use ultr_core::state::cumulative;
use ultr_core::state::{window_table_path, Manifest, WindowEntry};
use ultr_core::window::{register, StateTable, TRAINING_EXAMPLES};
pub use ultr_core::window::{Holdout, Split};

/// Impressions that share (query, document, feature row, position, bias features, split): their
/// binomial loss is that of (impressions, clicks). A raw impression has impressions = 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// Index into `Examples::docs` (a distinct (q, d, features)).
    pub doc: u32,
    /// Index into `Examples::qd_keys`.
    pub qd: u32,
    /// 1-based.
    pub position: u32,
    pub impressions: u32,
    pub clicks: u32,
    /// π(d,k|q) over the horizon; NaN when the state had none.
    pub propensity: f64,
}

/// A session's rows, `rows[start .. start + len]` (raw), or a run of aggregated rows of one split.
#[derive(Debug, Clone, Copy)]
pub struct SessionSpan {
    pub start: usize,
    pub len: usize,
    /// Stable hash of the session id: decides its split.
    pub hash: u64,
    /// The split, when it was decided before aggregation (then `hash` is not used).
    pub split: Option<Split>,
}

/// Aggregated rows form spans of this many rows. One: the trainer draws aggregated rows one by one,
/// ∝ their impressions (`train.batch_rows` per step).
pub const AGGREGATED_SPAN_ROWS: usize = 1;

/// The examples a training run sees.
#[derive(Debug, Default, Clone)]
pub struct Examples {
    pub n_features: usize,
    pub n_bias_features: usize,
    /// Distinct feature rows, `docs.len() / n_features` of them.
    pub docs: Vec<f32>,
    /// Query-document pairs, in first-seen order (the embedding tower's vocabulary).
    pub qd_keys: Vec<(String, String)>,
    pub rows: Vec<Row>,
    /// `rows.len() × n_bias_features`.
    pub bias: Vec<f32>,
    pub sessions: Vec<SessionSpan>,
    /// Impressions beyond `max_positions`, left out.
    pub deeper_than_max: u64,
    /// Event-time range of the windows the rows come from.
    pub data_range_ms: Option<(i64, i64)>,
    /// A relevance label ÷ its maximum per feature row, where a simulation knows it (empty
    /// otherwise): the `true_label` adversary of gradient reversal (Zhang Table 4).
    pub doc_labels: Vec<f32>,
}

/// Bytes a fit holds per example row besides features: the row, its span, its IPS weight, and the
/// fit's index, shuffled order, cumulative impressions and span impressions.
const BYTES_PER_ROW: usize = std::mem::size_of::<Row>() + std::mem::size_of::<SessionSpan>() + 4 + 4 * 8;
/// Per distinct feature row besides its values: the builder's de-duplication index entry.
const BYTES_PER_DOC: usize = 48;
/// Per query-document pair besides the ids' characters: two `String`s, the index entry and its key.
const BYTES_PER_PAIR: usize = 4 * 24 + 32;

/// What `[train] memory_budget` counts for examples of this shape: rows, feature rows (stored, and
/// standardised once more for the tower), query-document ids.
fn approx_bytes(rows: usize, bias_features: usize, feature_values: usize, docs: usize, pairs: usize, id_chars: usize) -> usize {
    rows * (BYTES_PER_ROW + 4 * bias_features) + feature_values * 4 * 2 + docs * BYTES_PER_DOC + pairs * BYTES_PER_PAIR + id_chars * 2
}

impl Examples {
    /// Memory these examples take in a fit (what `[train] memory_budget` bounds), estimated.
    pub fn approx_bytes(&self) -> usize {
        let id_chars = self.qd_keys.iter().map(|(q, d)| q.len() + d.len()).sum();
        approx_bytes(self.rows.len(), self.n_bias_features, self.docs.len(), self.n_docs(), self.qd_keys.len(), id_chars)
    }

    pub fn n_docs(&self) -> usize {
        self.docs.len().checked_div(self.n_features).unwrap_or(self.docs.len())
    }

    pub fn doc_features(&self, doc: u32) -> &[f32] {
        let f = self.n_features;
        &self.docs[doc as usize * f..(doc as usize + 1) * f]
    }

    pub fn max_position(&self) -> u32 {
        self.rows.iter().map(|r| r.position).max().unwrap_or(0)
    }

    /// Impressions the rows stand for.
    pub fn impressions(&self) -> u64 {
        self.rows.iter().map(|r| r.impressions as u64).sum()
    }

    pub fn clicks(&self) -> u64 {
        self.rows.iter().map(|r| r.clicks as u64).sum()
    }

    /// The exact compression of raw examples: rows that share (document row, query-document pair,
    /// position, bias features, split) become one row with summed counts (π is a function of the key).
    /// What the state stores, computed in memory (tests and benchmarks compare both paths with it).
    pub fn aggregate(&self, holdout: Holdout) -> Examples {
        let z = self.n_bias_features;
        let mut index: HashMap<(u32, u32, u32, Split, Vec<u32>), usize> = HashMap::new();
        let mut groups: [Vec<(Row, Vec<f32>)>; 3] = Default::default();
        for s in &self.sessions {
            let split = split_of(s, holdout);
            for i in s.start..s.start + s.len {
                let r = self.rows[i];
                let bias = &self.bias[i * z..(i + 1) * z];
                let key = (r.doc, r.qd, r.position, split, bias.iter().map(|b| b.to_bits()).collect::<Vec<_>>());
                let g = &mut groups[split as usize];
                match index.get(&key) {
                    Some(&j) => {
                        g[j].0.impressions += r.impressions;
                        g[j].0.clicks += r.clicks;
                    }
                    None => {
                        index.insert(key, g.len());
                        g.push((r, bias.to_vec()));
                    }
                }
            }
        }
        let mut out = Examples { rows: Vec::new(), bias: Vec::new(), sessions: Vec::new(), ..self.clone() };
        for (split, rows) in Split::ALL.into_iter().zip(groups) {
            for chunk in rows.chunks(AGGREGATED_SPAN_ROWS) {
                out.sessions.push(SessionSpan { start: out.rows.len(), len: chunk.len(), hash: 0, split: Some(split) });
                for (r, b) in chunk {
                    out.rows.push(*r);
                    out.bias.extend_from_slice(b);
                }
            }
        }
        out
    }

    /// Packs rows of the `training_examples` schema (session_id, query_id, doc_id, position,
    /// clicked, features, bias_features, propensity), sorted by session then position.
    pub fn from_batches(batches: &[RecordBatch], max_positions: usize) -> anyhow::Result<Examples> {
        let mut b = ExamplesBuilder::new(max_positions);
        for batch in batches {
            b.add(batch)?;
        }
        b.finish()
    }

    /// Keeps the sessions for which `keep(hash)` holds (for splits).
    pub fn filter_sessions(&self, keep: impl Fn(&SessionSpan) -> bool) -> Examples {
        // Feature rows and the vocabulary are shared by index, so they are copied; rows are chosen.
        let mut out = Examples {
            n_features: self.n_features,
            n_bias_features: self.n_bias_features,
            docs: self.docs.clone(),
            qd_keys: self.qd_keys.clone(),
            rows: Vec::new(),
            bias: Vec::new(),
            sessions: Vec::new(),
            deeper_than_max: self.deeper_than_max,
            data_range_ms: self.data_range_ms,
            doc_labels: self.doc_labels.clone(),
        };
        for s in self.sessions.iter().filter(|s| keep(s)) {
            let start = out.rows.len();
            out.rows.extend_from_slice(&self.rows[s.start..s.start + s.len]);
            let z = self.n_bias_features;
            out.bias.extend_from_slice(&self.bias[s.start * z..(s.start + s.len) * z]);
            out.sessions.push(SessionSpan { start, len: s.len, ..*s });
        }
        out
    }
}

impl Examples {
    /// Moves the fit's validation slice from sessions to queries (`[train] validation = "queries"`):
    /// every span outside the evaluation slice becomes training or validation by its query's hash,
    /// with the share of validation among them `holdout`'s validation over (1 − evaluation), so early
    /// stopping scores queries the tower never trained on, as serving a new query does. The
    /// evaluation slice (the gate, `ultr eval`, the monitor) is left as it was.
    pub fn validate_on_queries(&mut self, holdout: Holdout) {
        let by_query = Holdout { validation: holdout.validation / (1.0 - holdout.evaluation), evaluation: 0.0 };
        let mut cache: HashMap<u32, Split> = HashMap::new();
        for i in 0..self.sessions.len() {
            let span = &self.sessions[i];
            if span.len == 0 || split_of(span, holdout) == Split::Evaluation {
                continue;
            }
            let qd = self.rows[span.start].qd;
            let split = *cache.entry(qd).or_insert_with(|| by_query.split(ultr_core::window::session_key(&self.qd_keys[qd as usize].0)));
            self.sessions[i].split = Some(split);
        }
    }
}

/// The slice a session belongs to: the split made before aggregation, or the session's hash
/// (stable across runs and restarts; the same rule as the window rows').
pub fn split_of(span: &SessionSpan, holdout: Holdout) -> Split {
    span.split.unwrap_or_else(|| holdout.split(span.hash))
}

/// Packs training rows batch by batch (so a caller can stream them): raw sessions (the
/// `training_examples` schema of raw impressions) or aggregated rows.
pub struct ExamplesBuilder {
    max_positions: usize,
    out: Examples,
    qd_index: HashMap<(String, String), u32>,
    /// (qd, hash of the feature bits) → doc rows with that key.
    doc_index: HashMap<(u32, u64), Vec<u32>>,
    current: Option<String>,
    current_positions: Vec<u32>,
    features_seen: Option<bool>,
    /// Characters of the query-document ids held.
    id_chars: usize,
}

fn strings(batch: &RecordBatch, name: &str) -> anyhow::Result<Arc<dyn Array>> {
    let col = batch.column_by_name(name).with_context(|| format!("training rows have no column `{name}`"))?;
    Ok(cast(col, &DataType::Utf8)?)
}

fn feature_hash(values: &[f32]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3))
}

impl ExamplesBuilder {
    pub fn new(max_positions: usize) -> Self {
        ExamplesBuilder {
            max_positions,
            out: Examples::default(),
            qd_index: HashMap::new(),
            doc_index: HashMap::new(),
            current: None,
            current_positions: Vec::new(),
            features_seen: None,
            id_chars: 0,
        }
    }

    /// `Examples::approx_bytes` of what has been added so far (kept up to date, O(1)).
    pub fn approx_bytes(&self) -> usize {
        let o = &self.out;
        approx_bytes(o.rows.len(), o.n_bias_features, o.docs.len(), o.n_docs(), o.qd_keys.len(), self.id_chars)
    }

    pub fn add(&mut self, batch: &RecordBatch) -> anyhow::Result<()> {
        if batch.column_by_name("split").is_some() {
            return self.add_aggregated(batch);
        }
        let sessions = strings(batch, "session_id")?;
        let sessions = sessions.as_string::<i32>();
        let queries = strings(batch, "query_id")?;
        let queries = queries.as_string::<i32>();
        let docs = strings(batch, "doc_id")?;
        let docs = docs.as_string::<i32>();
        let positions = batch.column_by_name("position").context("training rows have no `position`")?.as_primitive::<UInt32Type>();
        let clicked = batch.column_by_name("clicked").context("training rows have no `clicked`")?.as_boolean();
        let features = batch.column_by_name("features").context("training rows have no `features`")?.as_list::<i32>();
        let bias = batch.column_by_name("bias_features").map(|c| c.as_list::<i32>());
        let propensity = batch.column_by_name("propensity").context("training rows have no `propensity`")?.as_primitive::<Float64Type>();
        for i in 0..batch.num_rows() {
            let session = sessions.value(i);
            if self.current.as_deref() != Some(session) {
                self.close_session();
                self.current = Some(session.to_string());
            }
            let position = positions.value(i);
            if self.current_positions.contains(&position) {
                continue; // the same session from an overlapping (hopping) window
            }
            self.current_positions.push(position);
            if position as usize > self.max_positions {
                self.out.deeper_than_max += 1;
                continue;
            }
            let p = if propensity.is_null(i) { f64::NAN } else { propensity.value(i) };
            let counts = (1, clicked.value(i) as u32);
            self.push_row(&format!("session {session}"), queries.value(i), docs.value(i), position, features, bias, i, counts, p)?;
        }
        Ok(())
    }

    /// Rows of `sql/training_examples.sql` over aggregated training rows (sorted by split).
    fn add_aggregated(&mut self, batch: &RecordBatch) -> anyhow::Result<()> {
        let queries = strings(batch, "query_id")?;
        let queries = queries.as_string::<i32>();
        let docs = strings(batch, "doc_id")?;
        let docs = docs.as_string::<i32>();
        let positions = batch.column_by_name("position").context("training rows have no `position`")?.as_primitive::<UInt32Type>();
        let splits = batch.column_by_name("split").context("training rows have no `split`")?.as_primitive::<UInt8Type>();
        let impressions = cast(batch.column_by_name("impressions").context("training rows have no `impressions`")?, &DataType::UInt32)?;
        let impressions = impressions.as_primitive::<UInt32Type>();
        let clicks = cast(batch.column_by_name("clicks").context("training rows have no `clicks`")?, &DataType::UInt32)?;
        let clicks = clicks.as_primitive::<UInt32Type>();
        let features = batch.column_by_name("features").context("training rows have no `features`")?.as_list::<i32>();
        let bias = batch.column_by_name("bias_features").map(|c| c.as_list::<i32>());
        let propensity = batch.column_by_name("propensity").context("training rows have no `propensity`")?.as_primitive::<Float64Type>();
        for i in 0..batch.num_rows() {
            let position = positions.value(i);
            if position as usize > self.max_positions {
                self.out.deeper_than_max += impressions.value(i) as u64;
                continue;
            }
            let split = Split::from_u8(splits.value(i)).with_context(|| format!("training rows: split {} is not 0, 1 or 2", splits.value(i)))?;
            let p = if propensity.is_null(i) { f64::NAN } else { propensity.value(i) };
            let what = format!("query {} doc {}", queries.value(i), docs.value(i));
            self.push_row(&what, queries.value(i), docs.value(i), position, features, bias, i, (impressions.value(i), clicks.value(i)), p)?;
            match self.out.sessions.last_mut() {
                Some(span) if span.split == Some(split) && span.len < AGGREGATED_SPAN_ROWS && span.start + span.len + 1 == self.out.rows.len() => span.len += 1,
                _ => self.out.sessions.push(SessionSpan { start: self.out.rows.len() - 1, len: 1, hash: 0, split: Some(split) }),
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments, reason = "one row's columns, each from its own source table")]
    fn push_row(
        &mut self,
        what: &str,
        query: &str,
        doc_id: &str,
        position: u32,
        features: &datafusion::arrow::array::ListArray,
        bias: Option<&datafusion::arrow::array::ListArray>,
        i: usize,
        (impressions, clicks): (u32, u32),
        propensity: f64,
    ) -> anyhow::Result<()> {
        let has_features = !features.is_null(i);
        match self.features_seen {
            None => self.features_seen = Some(has_features),
            Some(seen) if seen != has_features => {
                bail!("{what}: some impressions carry features and others do not; a tower needs one or the other")
            }
            _ => {}
        }
        let values: Vec<f32> = if has_features { features.value(i).as_primitive::<Float32Type>().values().to_vec() } else { Vec::new() };
        if self.out.rows.is_empty() && self.out.docs.is_empty() {
            self.out.n_features = values.len();
        } else if values.len() != self.out.n_features {
            bail!("{what}: {} features where earlier rows had {}", values.len(), self.out.n_features);
        }
        let z: Vec<f32> = match bias {
            Some(b) if !b.is_null(i) => b.value(i).as_primitive::<Float32Type>().values().to_vec(),
            _ => Vec::new(),
        };
        if self.out.rows.is_empty() {
            self.out.n_bias_features = z.len();
        } else if z.len() != self.out.n_bias_features {
            bail!("{what}: {} bias features where earlier rows had {}", z.len(), self.out.n_bias_features);
        }
        let key = (query.to_string(), doc_id.to_string());
        let next_qd = self.qd_index.len() as u32;
        let mut added = 0;
        let qd = *self.qd_index.entry(key.clone()).or_insert_with(|| {
            added = key.0.len() + key.1.len();
            self.out.qd_keys.push(key);
            next_qd
        });
        self.id_chars += added;
        let doc = self.doc_for(qd, &values);
        self.out.rows.push(Row { doc, qd, position, impressions, clicks, propensity });
        self.out.bias.extend_from_slice(&z);
        Ok(())
    }

    fn doc_for(&mut self, qd: u32, values: &[f32]) -> u32 {
        let f = self.out.n_features;
        let candidates = self.doc_index.entry((qd, feature_hash(values))).or_default();
        for &d in candidates.iter() {
            if &self.out.docs[d as usize * f..(d as usize + 1) * f] == values {
                return d;
            }
        }
        let d = self.out.docs.len().checked_div(f).map_or(qd, |n| n as u32);
        if f > 0 {
            self.out.docs.extend_from_slice(values);
            candidates.push(d);
        }
        d
    }

    fn close_session(&mut self) {
        if let Some(id) = self.current.take() {
            let start = self.out.sessions.last().map(|s| s.start + s.len).unwrap_or(0);
            let len = self.out.rows.len() - start;
            if len > 0 {
                self.out.sessions.push(SessionSpan { start, len, hash: ultr_core::window::session_key(&id), split: None });
            }
        }
        self.current_positions.clear();
    }

    pub fn finish(mut self) -> anyhow::Result<Examples> {
        self.close_session();
        Ok(self.out)
    }
}

/// Which closed windows a training run reads.
#[derive(Debug, Clone, Copy)]
pub enum Horizon {
    /// Windows ending within this many ms of the newest window's end.
    Lookback(i64),
    /// Windows ending after this time (a warm start's "not seen yet").
    After(i64),
}

/// Loads examples from a state directory: π over the lookback horizon (as `ips` chooses it), rows
/// from `horizon`'s windows.
pub async fn load_from_state(
    context: &PipelineContext,
    dir: &Path,
    manifest: &Manifest,
    lookback_ms: i64,
    horizon: Horizon,
    max_positions: usize,
    ips: &IpsConfig,
) -> anyhow::Result<Examples> {
    let (windows, propensity) = horizon_windows(context, dir, manifest, lookback_ms, horizon, ips).await?;
    examples_for_windows(context, dir, &windows, propensity, max_positions).await
}

/// The disjoint closed windows a training run reads for `horizon`, and the IPS π table over the
/// lookback (`sql/ips_propensity.sql`, as `ips` chooses).
pub async fn horizon_windows(
    context: &PipelineContext,
    dir: &Path,
    manifest: &Manifest,
    lookback_ms: i64,
    horizon: Horizon,
    ips: &IpsConfig,
) -> anyhow::Result<(Vec<WindowEntry>, Vec<RecordBatch>)> {
    let cumulative = cumulative::compute(context, dir, manifest, lookback_ms).await?;
    let propensity = super::ips_propensity::ips_propensity(context, cumulative.policy_propensity.clone(), ips).await?;
    let windows: Vec<WindowEntry> = match horizon {
        Horizon::Lookback(_) => cumulative.windows.clone(),
        Horizon::After(t) => cumulative.windows.iter().filter(|w| w.end_ms > t).cloned().collect(),
    };
    // Hopping windows overlap; windows `size` apart partition time, so each session is counted once.
    let windows = non_overlapping(windows, manifest.window.size_ms);
    if windows.is_empty() {
        bail!("{}: no closed windows in the training horizon ({horizon:?})", dir.display());
    }
    Ok((windows, propensity))
}

/// Column `name` of a batch read from `path`, cast to `t`; a missing column is an error naming both.
fn column_as(b: &RecordBatch, name: &str, t: &DataType, path: &Path) -> anyhow::Result<Arc<dyn Array>> {
    Ok(cast(b.column_by_name(name).with_context(|| format!("{}: no `{name}` column", path.display()))?, t)?)
}

/// Adds each (query, document) of a window's `training_features` file not seen before: its feature
/// row to `ex.docs`, its key to `ex.qd_keys`, its index to `doc_of`.
fn add_feature_rows(path: &Path, doc_of: &mut HashMap<(String, String), u32>, n_features: &mut Option<usize>, ex: &mut Examples) -> anyhow::Result<()> {
    for b in ultr_core::state::read_parquet(path)? {
        let (q, d) = (column_as(&b, "query_id", &DataType::Utf8, path)?, column_as(&b, "doc_id", &DataType::Utf8, path)?);
        let (q, d) = (q.as_string::<i32>(), d.as_string::<i32>());
        let features = b.column_by_name("features").with_context(|| format!("{}: no `features`", path.display()))?.as_list::<i32>();
        for i in 0..b.num_rows() {
            let key = (q.value(i).to_string(), d.value(i).to_string());
            if doc_of.contains_key(&key) {
                continue;
            }
            let values: Vec<f32> = if features.is_null(i) { Vec::new() } else { features.value(i).as_primitive::<Float32Type>().values().to_vec() };
            match *n_features {
                Some(n) if n != values.len() => bail!("{}: a feature row of {} values where others have {n}", path.display(), values.len()),
                _ => *n_features = Some(values.len()),
            }
            doc_of.insert(key.clone(), ex.qd_keys.len() as u32);
            ex.docs.extend_from_slice(&values);
            ex.qd_keys.push(key);
        }
    }
    Ok(())
}

/// Whole sessions for session models (DLA, MixEM, XPA), from the horizon's session stores
/// (`sql/session_store.sql`: per window a bounded sample of the distinct sessions, each with its
/// count): one list per stored pattern, its items at their positions with clicks = the pattern's
/// session count when clicked, and each (query, document)'s first feature row of the windows'
/// training features. A pattern's split is its content hash's: its sessions are identical, so they
/// cannot be split apart. Bias features are not read (no session model has a bias tower).
pub async fn load_session_lists(
    context: &PipelineContext,
    dir: &Path,
    manifest: &Manifest,
    lookback_ms: i64,
    horizon: Horizon,
    max_positions: usize,
    holdout: Holdout,
) -> anyhow::Result<Examples> {
    let (windows, _) = horizon_windows(context, dir, manifest, lookback_ms, horizon, &IpsConfig::default()).await?;
    let mut ex = Examples::default();
    // Sessions the stores hold, against the windows' sessions: a store at its bound is a sample.
    let mut stored_sessions = 0u64;
    let mut doc_of: HashMap<(String, String), u32> = HashMap::new();
    let mut n_features: Option<usize> = None;
    for w in &windows {
        if let Some(path) = window_table_path(dir, w, StateTable::TrainingFeatures)? {
            add_feature_rows(&path, &mut doc_of, &mut n_features, &mut ex)?;
        }
        if let Some(path) = window_table_path(dir, w, StateTable::SessionStore)? {
            for b in ultr_core::state::read_parquet(&path)? {
                let column = |name: &str, t: &DataType| column_as(&b, name, t, &path);
                let (q, d) = (column("query_id", &DataType::Utf8)?, column("doc_id", &DataType::Utf8)?);
                let (q, d) = (q.as_string::<i32>(), d.as_string::<i32>());
                let pattern = column("pattern_key", &DataType::UInt64)?;
                let pattern = pattern.as_primitive::<datafusion::arrow::datatypes::UInt64Type>();
                let position = column("position", &DataType::UInt32)?;
                let position = position.as_primitive::<UInt32Type>();
                let sessions = column("sessions", &DataType::UInt32)?;
                let sessions = sessions.as_primitive::<UInt32Type>();
                let clicked = column("clicked", &DataType::Boolean)?;
                let clicked = clicked.as_boolean();
                let mut open: Option<u64> = None;
                for i in 0..b.num_rows() {
                    if open != Some(pattern.value(i)) {
                        open = Some(pattern.value(i));
                        stored_sessions += sessions.value(i) as u64;
                        ex.sessions.push(SessionSpan { start: ex.rows.len(), len: 0, hash: pattern.value(i), split: Some(holdout.split(pattern.value(i))) });
                    }
                    let k = position.value(i);
                    if k as usize > max_positions {
                        ex.deeper_than_max += sessions.value(i) as u64;
                        continue;
                    }
                    let Some(&doc) = doc_of.get(&(q.value(i).to_string(), d.value(i).to_string())) else {
                        bail!("{}: ({}, {}) has no feature row in its window's training features", path.display(), q.value(i), d.value(i));
                    };
                    let n = sessions.value(i);
                    ex.rows.push(Row { doc, qd: doc, position: k, impressions: n, clicks: if clicked.value(i) { n } else { 0 }, propensity: 1.0 });
                    ex.sessions.last_mut().expect("a pattern's span").len += 1;
                }
            }
        }
    }
    ex.sessions.retain(|s| s.len > 0);
    let window_sessions: u64 = windows.iter().map(|w| w.sessions).sum();
    if stored_sessions < window_sessions {
        tracing::warn!(
            "session models train on {stored_sessions} of the horizon's {window_sessions} sessions: the windows' session stores keep a sample of \
             `[window] session_store_patterns` distinct sessions each; raise it to at least a window's sessions to train on all of them"
        );
    }
    ex.n_features = n_features.unwrap_or(0);
    ex.data_range_ms = windows.iter().map(|w| w.start_ms).min().zip(windows.iter().map(|w| w.end_ms).max());
    Ok(ex)
}

/// Of (possibly hopping) windows, those whose starts lie a multiple of `size_ms` before the newest
/// start: disjoint windows that cover every session once.
pub fn non_overlapping(windows: Vec<WindowEntry>, size_ms: i64) -> Vec<WindowEntry> {
    let Some(newest) = windows.iter().map(|w| w.start_ms).max() else { return windows };
    windows.into_iter().filter(|w| (newest - w.start_ms).rem_euclid(size_ms.max(1)) == 0).collect()
}

/// Examples of the given closed windows (disjoint), with π from `propensity` (the IPS π table,
/// `super::ips_propensity`), all in memory (see `chunks::load_training_data` for a horizon beyond a memory budget).
pub async fn examples_for_windows(
    context: &PipelineContext,
    dir: &Path,
    windows: &[WindowEntry],
    propensity: Vec<RecordBatch>,
    max_positions: usize,
) -> anyhow::Result<Examples> {
    use futures::StreamExt;
    let mut stream = training_example_stream(context, dir, windows, propensity).await?;
    let mut b = ExamplesBuilder::new(max_positions);
    while let Some(batch) = stream.next().await {
        b.add(&batch.map_err(|e| anyhow::anyhow!("sql/training_examples.sql: {e}"))?)?;
    }
    let mut examples = b.finish()?;
    examples.data_range_ms = data_range(windows);
    Ok(examples)
}

/// Event-time range of `windows`.
pub fn data_range(windows: &[WindowEntry]) -> Option<(i64, i64)> {
    Some((windows.iter().map(|w| w.start_ms).min().unwrap_or(0), windows.iter().map(|w| w.end_ms).max().unwrap_or(0)))
}

/// The rows of `sql/training_examples.sql` over the given closed windows, streamed in its order
/// (split, query, document, position). The windows' tables are read from their Parquet files by the
/// query itself, which merges them by key and spills past `[state] query_memory_limit`, so neither
/// the input nor the output is ever held whole here.
pub async fn training_example_stream(
    context: &PipelineContext,
    dir: &Path,
    windows: &[WindowEntry],
    propensity: Vec<RecordBatch>,
) -> anyhow::Result<datafusion::physical_plan::SendableRecordBatchStream> {
    let mut rows = Vec::new();
    let mut vectors = Vec::new();
    for w in windows {
        if !w.files.contains_key(StateTable::TrainingRows.name()) && w.impressions > 0 {
            bail!("{}: window {} has no training_rows table; it was written by a build that kept raw impressions — re-ingest", dir.display(), w.dir);
        }
        rows.extend(window_table_path(dir, w, StateTable::TrainingRows)?);
        vectors.extend(window_table_path(dir, w, StateTable::TrainingFeatures)?);
    }
    let ctx = context.query_session();
    register_files(&ctx, StateTable::TrainingRows, &rows).await?;
    register_files(&ctx, StateTable::TrainingFeatures, &vectors).await?;
    register(&ctx, "ips_propensity", super::ips_propensity::ips_propensity_schema(), propensity)?;
    let df = ctx.sql(TRAINING_EXAMPLES.sql).await.map_err(|e| anyhow::anyhow!("sql/training_examples.sql: {e}"))?;
    df.execute_stream().await.map_err(|e| anyhow::anyhow!("sql/training_examples.sql: {e}"))
}

/// Registers windows' Parquet `files` of `table` (one schema, the first file's) under the table's
/// name; the catalog's planned schema (`StateTable::schema`) when there are none.
async fn register_files(ctx: &datafusion::prelude::SessionContext, table: StateTable, files: &[std::path::PathBuf]) -> anyhow::Result<()> {
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
    let name = table.name();
    let Some(first) = files.first() else { return register(ctx, name, table.schema().await?, Vec::new()) };
    let file_schema = ultr_core::state::parquet_schema(first)?;
    let schema = Arc::new(Schema::new(file_schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect::<Vec<_>>()));
    let urls = files
        .iter()
        .map(|p| {
            let p = std::fs::canonicalize(p).with_context(|| format!("state file {}", p.display()))?;
            ListingTableUrl::parse(p.to_string_lossy()).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let config = ListingTableConfig::new_with_multi_paths(urls).with_listing_options(options).with_schema(schema);
    ctx.register_table(name, Arc::new(ListingTable::try_new(config)?))?;
    Ok(())
}
