//! Training examples: the horizon's kept impressions joined with π(d,k|q) by
//! `sql/training_examples.sql`, packed into whole sessions with de-duplicated feature rows.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Float64Type, Schema, UInt32Type};
use datafusion::prelude::SessionContext;
use std::sync::Arc;

use crate::state::cumulative;
use crate::state::{read_window_table, Manifest, WindowEntry};
use crate::window::{register, run_sql, TRAINING_EXAMPLES};

/// One impression.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// Index into `Examples::docs` (a distinct (q, d, features)).
    pub doc: u32,
    /// Index into `Examples::qd_keys`.
    pub qd: u32,
    /// 1-based.
    pub position: u32,
    pub clicked: bool,
    /// π(d,k|q) over the horizon; NaN when the state had none.
    pub propensity: f64,
}

/// A session's rows: `rows[start .. start + len]`.
#[derive(Debug, Clone, Copy)]
pub struct SessionSpan {
    pub start: usize,
    pub len: usize,
    /// Stable hash of the session id: decides the validation split.
    pub hash: u64,
}

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
}

impl Examples {
    pub fn n_docs(&self) -> usize {
        if self.n_features == 0 {
            self.docs.len()
        } else {
            self.docs.len() / self.n_features
        }
    }

    pub fn doc_features(&self, doc: u32) -> &[f32] {
        let f = self.n_features;
        &self.docs[doc as usize * f..(doc as usize + 1) * f]
    }

    pub fn max_position(&self) -> u32 {
        self.rows.iter().map(|r| r.position).max().unwrap_or(0)
    }

    /// Packs rows of the `training_examples` schema (session_id, query_id, doc_id, position,
    /// clicked, features, bias_features, propensity), sorted by session then position.
    pub fn from_batches(batches: &[RecordBatch], max_positions: usize) -> anyhow::Result<Examples> {
        let mut b = Builder::new(max_positions);
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
        };
        for s in self.sessions.iter().filter(|s| keep(s)) {
            let start = out.rows.len();
            out.rows.extend_from_slice(&self.rows[s.start..s.start + s.len]);
            let z = self.n_bias_features;
            out.bias.extend_from_slice(&self.bias[s.start * z..(s.start + s.len) * z]);
            out.sessions.push(SessionSpan { start, len: s.len, hash: s.hash });
        }
        out
    }
}

/// Whether a session belongs to the validation slice (by hash, so stable across runs and restarts).
pub fn is_validation(span: &SessionSpan, fraction: f64) -> bool {
    (span.hash % 1_000_000) < (fraction * 1_000_000.0) as u64
}

struct Builder {
    max_positions: usize,
    out: Examples,
    qd_index: HashMap<(String, String), u32>,
    /// (qd, hash of the feature bits) → doc rows with that key.
    doc_index: HashMap<(u32, u64), Vec<u32>>,
    current: Option<String>,
    current_positions: Vec<u32>,
    features_seen: Option<bool>,
}

fn strings(batch: &RecordBatch, name: &str) -> anyhow::Result<Arc<dyn Array>> {
    let col = batch.column_by_name(name).with_context(|| format!("training rows have no column `{name}`"))?;
    Ok(cast(col, &DataType::Utf8)?)
}

fn feature_hash(values: &[f32]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3))
}

impl Builder {
    fn new(max_positions: usize) -> Self {
        Builder {
            max_positions,
            out: Examples::default(),
            qd_index: HashMap::new(),
            doc_index: HashMap::new(),
            current: None,
            current_positions: Vec::new(),
            features_seen: None,
        }
    }

    fn add(&mut self, batch: &RecordBatch) -> anyhow::Result<()> {
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
            let has_features = !features.is_null(i);
            match self.features_seen {
                None => self.features_seen = Some(has_features),
                Some(seen) if seen != has_features => {
                    bail!("session {session}: some impressions carry features and others do not; a tower needs one or the other")
                }
                _ => {}
            }
            let values: Vec<f32> = if has_features {
                features.value(i).as_primitive::<Float32Type>().values().to_vec()
            } else {
                Vec::new()
            };
            if self.out.rows.is_empty() && self.out.docs.is_empty() {
                self.out.n_features = values.len();
            } else if values.len() != self.out.n_features {
                bail!("session {session}: {} features where earlier rows had {}", values.len(), self.out.n_features);
            }
            let z: Vec<f32> = match bias {
                Some(b) if !b.is_null(i) => b.value(i).as_primitive::<Float32Type>().values().to_vec(),
                _ => Vec::new(),
            };
            if self.out.rows.is_empty() {
                self.out.n_bias_features = z.len();
            } else if z.len() != self.out.n_bias_features {
                bail!("session {session}: {} bias features where earlier rows had {}", z.len(), self.out.n_bias_features);
            }
            let key = (queries.value(i).to_string(), docs.value(i).to_string());
            let next_qd = self.qd_index.len() as u32;
            let qd = *self.qd_index.entry(key.clone()).or_insert_with(|| {
                self.out.qd_keys.push(key);
                next_qd
            });
            let doc = self.doc_for(qd, &values);
            let p = if propensity.is_null(i) { f64::NAN } else { propensity.value(i) };
            self.out.rows.push(Row { doc, qd, position, clicked: clicked.value(i), propensity: p });
            self.out.bias.extend_from_slice(&z);
        }
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
        let d = if f == 0 { qd } else { (self.out.docs.len() / f) as u32 };
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
                self.out.sessions.push(SessionSpan { start, len, hash: crate::window::sample_key(&id, 0) });
            }
        }
        self.current_positions.clear();
    }

    fn finish(mut self) -> anyhow::Result<Examples> {
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

/// Loads examples from a state directory: π over the lookback horizon, rows from `horizon`'s windows.
pub async fn load_from_state(dir: &Path, manifest: &Manifest, lookback_ms: i64, horizon: Horizon, max_positions: usize) -> anyhow::Result<Examples> {
    let cumulative = cumulative::compute(dir, manifest, lookback_ms).await?;
    let windows: Vec<WindowEntry> = match horizon {
        Horizon::Lookback(_) => cumulative.windows.clone(),
        Horizon::After(t) => cumulative.windows.iter().filter(|w| w.end_ms > t).cloned().collect(),
    };
    if windows.is_empty() {
        bail!("{}: no closed windows in the training horizon ({horizon:?})", dir.display());
    }
    examples_for_windows(dir, &windows, cumulative.propensity, max_positions).await
}

/// Examples of the given closed windows, with π from `propensity` (the cumulative table).
pub async fn examples_for_windows(dir: &Path, windows: &[WindowEntry], propensity: Vec<RecordBatch>, max_positions: usize) -> anyhow::Result<Examples> {
    let mut rows = Vec::new();
    for w in windows {
        let path = dir.join("windows").join(&w.dir).join("training_impressions.parquet");
        if w.files.is_empty() && !path.exists() && w.impressions > 0 {
            bail!("{}: missing; the window was written by a build that kept no training rows — re-ingest", path.display());
        }
        rows.extend(read_window_table(dir, w, "training_impressions")?);
    }
    let ctx = SessionContext::new();
    register(&ctx, "training_impressions", training_impressions_schema(), rows)?;
    register(&ctx, "propensity", propensity_schema(), propensity)?;
    let joined = run_sql(&ctx, &TRAINING_EXAMPLES).await?;
    let mut examples = Examples::from_batches(&joined, max_positions)?;
    examples.data_range_ms = Some((windows.iter().map(|w| w.start_ms).min().unwrap_or(0), windows.iter().map(|w| w.end_ms).max().unwrap_or(0)));
    Ok(examples)
}

fn training_impressions_schema() -> Arc<Schema> {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    Arc::new(Schema::new(vec![
        Field::new("session_id", DataType::Utf8, false),
        Field::new("query_id", DataType::Utf8, false),
        Field::new("event_time", DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Millisecond, Some("UTC".into())), false),
        Field::new("context", DataType::Utf8, true),
        Field::new("doc_id", DataType::Utf8, false),
        Field::new("position", DataType::UInt32, false),
        Field::new("clicked", DataType::Boolean, false),
        Field::new("features", DataType::List(item.clone()), true),
        Field::new("bias_features", DataType::List(item), true),
    ]))
}

fn propensity_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("query_id", DataType::Utf8, false),
        Field::new("doc_id", DataType::Utf8, false),
        Field::new("position", DataType::UInt32, false),
        Field::new("context", DataType::Utf8, true),
        Field::new("impressions", DataType::Int64, false),
        Field::new("clicks", DataType::Int64, false),
        Field::new("sessions", DataType::Int64, false),
        Field::new("propensity", DataType::Float64, false),
    ]))
}
