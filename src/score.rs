//! `ultr score`: a checkpoint's r(x) for every (query, document) of an SVMlight/LETOR file or of
//! contract sessions (JSONL, plain or gzip), written as TSV.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use ultr_train::checkpoint::ModelStore;
use ultr_train::data::Examples;
use ultr_train::device::BackendKind;

/// The checkpoint `model` names: a models directory (its CURRENT), or one checkpoint's directory.
/// Returns the models directory and the checkpoint id.
pub fn resolve_checkpoint(model: &Path) -> anyhow::Result<(PathBuf, String)> {
    if model.join(ultr_train::checkpoint::CURRENT).exists() {
        let id = ModelStore::open(model)?.current_id()?.with_context(|| format!("{}: no current model", model.display()))?;
        return Ok((model.to_path_buf(), id));
    }
    let id = model.file_name().with_context(|| format!("{}: names no checkpoint", model.display()))?.to_string_lossy().into_owned();
    Ok((model.parent().map(Path::to_path_buf).unwrap_or_default(), id))
}

/// Writes `query_id<TAB>doc_id<TAB>score` for every item of `input`, after a header line; contract
/// sessions that fail to decode go to `<input>.score-dead-letters.jsonl`.
pub fn score(model: &Path, input: &Path, backend: BackendKind, out: &mut dyn Write) -> anyhow::Result<()> {
    let device = backend.device()?;
    let (store_dir, id) = resolve_checkpoint(model)?;
    let trained = ModelStore::open(&store_dir)?.load(&id, &device)?;
    let ex = scoring_examples(input, trained.meta.n_features)?;
    let scores = trained.relevance_of_rows(&ex, &device);
    writeln!(out, "query_id\tdoc_id\tscore")?;
    for (r, s) in ex.rows.iter().zip(scores) {
        let (q, d) = &ex.qd_keys[r.qd as usize];
        writeln!(out, "{q}\t{d}\t{s:.6}")?;
    }
    Ok(())
}

/// Items to score, as examples with one pseudo-session per query (positions do not matter for r(x)).
fn scoring_examples(input: &Path, n_features: usize) -> anyhow::Result<Examples> {
    use ultr_train::data::{Row, SessionSpan};
    let mut ex = Examples { n_features, ..Examples::default() };
    let add_query = |ex: &mut Examples, query: &str, docs: Vec<(String, Vec<f32>)>| -> anyhow::Result<()> {
        let start = ex.rows.len();
        for (doc, features) in docs {
            if features.len() < n_features {
                anyhow::bail!("{}: query {query} doc {doc} has {} features, the model reads {n_features}", input.display(), features.len());
            }
            let qd = ex.qd_keys.len() as u32;
            ex.qd_keys.push((query.to_string(), doc));
            ex.docs.extend_from_slice(&features[..n_features]);
            let d = ex.docs.len().checked_div(n_features).map_or(qd, |n| (n - 1) as u32);
            ex.rows.push(Row { doc: d, qd, position: 1, impressions: 1, clicks: 0, propensity: 1.0 });
        }
        ex.sessions.push(SessionSpan { start, len: ex.rows.len() - start, hash: 0, split: None });
        Ok(())
    };
    let is_jsonl = input.extension().is_some_and(|e| e == "jsonl" || e == "gz");
    if is_jsonl {
        let mut ingest = ultr_core::ingest::Ingest::new(ultr_core::sources::file::FileSource::open(input, 0)?, Default::default(), 4096);
        let dead_path = input.with_extension("score-dead-letters.jsonl");
        let mut dead = ultr_core::sinks::dead_letter::DeadLetterSink::file(&dead_path)?;
        let mut batches = Vec::new();
        ingest.drain(&mut dead, |b| batches.push(b.impressions.clone()))?;
        for batch in batches {
            use datafusion::arrow::array::{Array, AsArray};
            let q = batch.column_by_name("query_id").context("query_id")?.as_string::<i32>().clone();
            let d = batch.column_by_name("doc_id").context("doc_id")?.as_string::<i32>().clone();
            let f = batch.column_by_name("features").context("features")?.as_list::<i32>().clone();
            let mut i = 0;
            while i < batch.num_rows() {
                let mut j = i;
                let mut docs = Vec::new();
                while j < batch.num_rows() && q.value(j) == q.value(i) {
                    let values =
                        if f.is_null(j) { Vec::new() } else { f.value(j).as_primitive::<datafusion::arrow::datatypes::Float32Type>().values().to_vec() };
                    docs.push((d.value(j).to_string(), values));
                    j += 1;
                }
                add_query(&mut ex, q.value(i), docs)?;
                i = j;
            }
        }
    } else {
        let data = ultr_core::letor::load_svmlight(&[input])?;
        for q in data.queries {
            add_query(&mut ex, &q.query_id, q.docs.into_iter().map(|d| (d.doc_id, d.features)).collect())?;
        }
    }
    Ok(ex)
}
