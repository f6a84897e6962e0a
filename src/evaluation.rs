//! A trained model's evaluation on a state, assembled from the pipeline file: the model (named, or
//! the current one) checked against the stream's feature schema, the lookback horizon's rows, and
//! the labels and θ a simulated log's ground truth knows — what `ultr eval` prints.

use std::path::{Path, PathBuf};

use anyhow::Context;

use ultr_simulate::{dataset, labels_from_truth, truth_theta, GroundTruth};
use ultr_train::artefact::Trained;
use ultr_train::checkpoint::ModelStore;
use ultr_train::data::{load_from_state, split_of, Examples, Horizon, Split};
use ultr_train::eval::judged::{JudgedReport, Qrels, Ranking, Unjudged};
use ultr_train::eval::{EvalReport, Labels};
use ultr_train::models_dir;

use crate::config::PipelineConfig;

/// The model under evaluation and the rows it is scored on.
pub struct Subject {
    /// The checkpoint's id.
    pub id: String,
    pub trained: Trained,
    /// Every row of the state's lookback horizon.
    pub rows: Examples,
}

/// The model `model` (or the current one) checked against the stream's feature schema, and every
/// row of the state's lookback horizon, checked against the model.
pub fn subject(config: &PipelineConfig, state: &Path, model: Option<&str>) -> anyhow::Result<Subject> {
    let store = ModelStore::open(&models_dir(&config.train, state))?;
    let id = match model {
        Some(id) => id.to_string(),
        None => store.current_id()?.with_context(|| format!("{}: no current model (train one first)", store.dir().display()))?,
    };
    let trained = store.load(&id, &config.train.backend.device()?)?;
    trained.check_feature_schema(config.decode.feature_schema.as_ref()).with_context(|| format!("model {id}"))?;
    let manifest = ultr_core::state::read_manifest(state)?;
    let context = config.context();
    let lookback = config.state.lookback_ms();
    let load = load_from_state(&context, state, &manifest, lookback, Horizon::Lookback(lookback), trained.meta.architecture.max_positions, &config.train.ips);
    let rows = context.run("ultr-eval", load)??;
    trained.check_compatible(&rows)?;
    Ok(Subject { id, trained, rows })
}

/// What the held-out clicks are scored against besides the clicks themselves.
#[derive(Debug, Clone, Default)]
pub struct References {
    /// A ground-truth file (`ultr simulate --truth-out`); else the simulated source's own truth.
    pub truth: Option<PathBuf>,
    /// LETOR (SVMlight) files whose labels grade the documents, in place of the truth's.
    pub labels: Vec<PathBuf>,
    /// Positions whose θ is compared with the truth.
    pub positions: usize,
}

/// `ultr eval`: the model on the evaluation slice (sessions its optimizer, early stopping and
/// promotion gate never chose by), with relevance and θ against the references where known, and
/// the misspecification test.
pub fn on_held_out_clicks(config: &PipelineConfig, state: &Path, model: Option<&str>, refs: &References) -> anyhow::Result<(String, EvalReport)> {
    let Subject { id, trained, rows } = subject(config, state, model)?;
    let device = config.train.backend.device()?;
    let heldout = rows.filter_sessions(|s| split_of(s, config.train.holdout()) == Split::Evaluation);
    let truth = match &refs.truth {
        Some(file) => Some(GroundTruth::load(file)?),
        None => config.ground_truth()?,
    };
    let labels = if refs.labels.is_empty() { truth.as_ref().map(labels_from_truth) } else { Some(labels_from_svmlight(&refs.labels)?) };
    let theta = truth.as_ref().map(truth_theta);
    let mut report = ultr_train::eval::evaluate(&trained, &heldout, labels.as_ref(), theta.as_deref(), refs.positions, &device);
    report.misspecification = Some(ultr_train::misspecification::of_model(&trained, &heldout, config.identifiability.min_policy_variation, &device));
    Ok((id, report))
}

fn labels_from_svmlight(files: &[PathBuf]) -> anyhow::Result<Labels> {
    let data = dataset::load_svmlight(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
    Ok(data.queries.iter().flat_map(|q| q.docs.iter().filter_map(move |d| d.label.map(|l| ((q.query_id.clone(), d.doc_id.clone()), l as f64)))).collect())
}

/// A judged evaluation: the report, and every ranking it scored (for a run file).
pub struct Judged {
    pub id: String,
    pub report: JudgedReport,
    pub rankings: Vec<Ranking>,
}

/// `ultr eval --qrels`: the model's ranking, the logged order, naive click-through, a biased model
/// trained on the same rows and the logged-order combination, all from the same state, scored
/// against editors' labels with paired bootstrap intervals.
pub fn on_editors_labels(
    config: &PipelineConfig,
    state: &Path,
    model: Option<&str>,
    qrels: &Qrels,
    unjudged: Unjudged,
    bootstrap: usize,
    seed: u64,
) -> anyhow::Result<Judged> {
    let Subject { id, trained, rows } = subject(config, state, model)?;
    tracing::info!(target: "ultr::story", "eval: training the biased model on the same {} rows", rows.rows.len());
    let rankings = ultr_train::eval::judged::standard_rankings(&rows, &trained, &config.train)?;
    let report = ultr_train::eval::judged::evaluate(qrels, &rankings, unjudged, bootstrap, seed)?;
    Ok(Judged { id, report, rankings })
}
