//! The click simulator: LTR data + ground-truth relevance + a logging policy + a click model → session
//! logs in the contract's JSON, and a ground-truth file to test every later estimate against.

pub mod click;
/// The learning-to-rank files and synthetic features the simulator draws its queries from.
pub use ultr_core::letor as dataset;
pub mod policy;
pub mod relevance;
pub mod source;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use ndarray::Array2;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use click::{ClickModel, DocTruth};
use dataset::Dataset;
use policy::{RankerKind, Sampling};
use relevance::RelevanceKind;
use ultr_core::sinks::SessionSink;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    /// `label qid:Q i:v ...` (LETOR, MQ2008).
    Svmlight,
    /// SVMlight lines without qid plus a `.query` group-size file.
    Lightgbm,
}

/// Synthetic features for runs without a data file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SyntheticData {
    pub queries: usize,
    pub docs_per_query: usize,
    pub features: usize,
}

impl Default for SyntheticData {
    fn default() -> Self {
        SyntheticData { queries: 200, docs_per_query: 20, features: 46 }
    }
}

/// The logging policy (Hager Eq. 25 plus a stochastic layer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    pub ranker: RankerKind,
    /// Strength α ∈ [−1, 1]: 1 best ranking, 0 random, −1 inverse.
    pub alpha: f64,
    pub sampling: Sampling,
    /// ε-greedy temperature τ ∈ [0, 1].
    pub tau: f64,
    /// Plackett-Luce softmax temperature.
    pub pl_temperature: f64,
    /// `policy_id` written on every session.
    pub policy_id: String,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig { ranker: RankerKind::Mlp, alpha: 1.0, sampling: Sampling::EpsilonGreedy, tau: 0.0, pl_temperature: 1.0, policy_id: "logging-v1".into() }
    }
}

/// Everything that determines a simulated stream. Same config + seed → byte-identical output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Data files; empty means synthetic features.
    pub data: Vec<PathBuf>,
    pub format: DataFormat,
    /// LightGBM group file (default: `<data>.query`).
    pub query_file: Option<PathBuf>,
    pub synthetic: SyntheticData,
    pub relevance: RelevanceKind,
    /// σ of the Gaussian noise on synthetic relevance.
    pub noise: f64,
    /// Keep the N most relevant documents per query.
    pub top_n: usize,
    pub policy: PolicyConfig,
    pub click_model: ClickModel,
    pub sessions: u64,
    pub seed: u64,
    /// Event time of the first session, epoch millis.
    pub start_ms: i64,
    /// Event-time step between sessions, millis.
    pub interval_ms: i64,
    /// Write each item's dense features.
    pub emit_features: bool,
    /// Write the logging policy's propensity of each item at its position (ε-greedy only).
    pub log_propensity: bool,
    /// Log the propensity a policy with this τ would have had, while sampling with `policy.tau`: a
    /// stale logger, for testing that a wrong log is caught (unset: the true propensity).
    pub logged_tau: Option<f64>,
    /// As a pipeline source: emit at most this many sessions per wall-clock second (unset: as fast
    /// as possible). Does not change what is generated.
    pub sessions_per_second: Option<f64>,
    /// Probability that a page lists one document twice: a uniformly chosen position k ≥ 2 shows
    /// again the document of a uniformly chosen earlier position (as logs that merge result
    /// sources do). The repeat is examined and
    /// clicked like any other item. 0 draws nothing, so streams without repeats are unchanged.
    pub duplicate_rate: f64,
    /// Randomize a share of the sessions with a swap design (unset: none), as a team running the
    /// randomization planner's advice does (`ultr plan`).
    pub randomization: Option<Randomization>,
}

/// A swap design run on a share of sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Randomization {
    pub design: ultr_core::identify::plan::Design,
    /// Share of sessions randomized, in (0, 1].
    pub fraction: f64,
    /// The design randomizes positions 1..=positions.
    pub positions: usize,
    /// Sessions with a lower index are never randomized (default 0): a log that starts under the
    /// plain logging policy and turns randomization on at this session.
    #[serde(default)]
    pub from_session: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            data: Vec::new(),
            format: DataFormat::Svmlight,
            query_file: None,
            synthetic: SyntheticData::default(),
            relevance: RelevanceKind::Linear,
            noise: 0.2,
            top_n: 25,
            policy: PolicyConfig::default(),
            click_model: ClickModel::default(),
            sessions: 10_000,
            seed: 1,
            start_ms: 1_767_225_600_000, // 2026-01-01T00:00:00Z
            interval_ms: 100,
            emit_features: true,
            log_propensity: false,
            logged_tau: None,
            sessions_per_second: None,
            duplicate_rate: 0.0,
            randomization: None,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        let p = &self.policy;
        if !(-1.0..=1.0).contains(&p.alpha) {
            bail!("policy.alpha = {} must lie in [-1, 1]", p.alpha);
        }
        if let Some(t) = self.logged_tau {
            if !(0.0..=1.0).contains(&t) {
                bail!("logged_tau = {t} must lie in [0, 1]");
            }
        }
        if !(0.0..=1.0).contains(&p.tau) {
            bail!("policy.tau = {} must lie in [0, 1]", p.tau);
        }
        if !(p.pl_temperature > 0.0) {
            bail!("policy.pl_temperature = {} must be > 0", p.pl_temperature);
        }
        if !(0.0..=1.0).contains(&self.duplicate_rate) {
            bail!("duplicate_rate = {} must lie in [0, 1]", self.duplicate_rate);
        }
        if let Some(r) = &self.randomization {
            if !(r.fraction > 0.0 && r.fraction <= 1.0) {
                bail!("randomization.fraction = {} must lie in (0, 1]", r.fraction);
            }
            if r.positions < 2 {
                bail!("randomization.positions = {} must be at least 2", r.positions);
            }
            if self.log_propensity {
                bail!("log_propensity with randomization: the logged propensity would ignore the swaps");
            }
        }
        if self.top_n == 0 {
            bail!("top_n must be >= 1");
        }
        if self.data.is_empty() && (self.synthetic.queries == 0 || self.synthetic.docs_per_query == 0) {
            bail!("synthetic data needs queries >= 1 and docs_per_query >= 1");
        }
        if self.data.is_empty() && self.relevance == RelevanceKind::Labels {
            bail!("relevance = labels needs a data file with labels (synthetic features have none): use linear or mlp");
        }
        Ok(())
    }
}

/// Truth about one position.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PositionTruth {
    pub position: usize,
    /// Additive model's logit θ_k = −ln k.
    pub theta: f64,
    /// Examination probability γ_k.
    pub examination: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DocRecord {
    pub doc_id: String,
    pub label: Option<f64>,
    /// Relevance on [0, 4] used by the additive click model.
    pub relevance: f64,
    /// Attractiveness ω used by examination-style click models.
    pub omega: f64,
    /// Logging-policy score s (Eq. 25).
    pub policy_score: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryTruth {
    pub query_id: String,
    pub docs: Vec<DocRecord>,
    /// The deterministic logging ranking (indices into `docs`, position 1 first).
    pub logging_ranking: Vec<usize>,
}

/// The simulator's ground truth, written next to the sessions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroundTruth {
    pub config: SimConfig,
    pub n_features: usize,
    pub label_max: Option<f64>,
    pub positions: Vec<PositionTruth>,
    pub queries: Vec<QueryTruth>,
}

impl GroundTruth {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let f = std::fs::File::open(path).with_context(|| format!("opening ground truth {}", path.display()))?;
        serde_json::from_reader(std::io::BufReader::new(f)).with_context(|| format!("parsing ground truth {}", path.display()))
    }

    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        serde_json::to_writer(std::io::BufWriter::new(f), self)?;
        Ok(())
    }

    /// Analytic expected CTR at each position 1..=max, averaged over the queries that fill it
    /// (queries are drawn uniformly), with how many queries fill it. `None` when the click model or
    /// policy has no closed form here (CPM, mixtures, Plackett-Luce).
    pub fn expected_position_ctr(&self) -> Option<Vec<(f64, usize)>> {
        let cfg = &self.config;
        if cfg.policy.sampling != Sampling::EpsilonGreedy {
            return None;
        }
        let max = self.queries.iter().map(|q| q.docs.len()).max().unwrap_or(0);
        let mut sums = vec![(0.0, 0usize); max];
        for q in &self.queries {
            let docs: Vec<DocTruth> = q.docs.iter().map(|d| DocTruth { relevance: d.relevance, omega: d.omega }).collect();
            let ctr = cfg.click_model.expected_ctr(&docs, &q.logging_ranking, cfg.policy.tau)?;
            for (k, p) in ctr.into_iter().enumerate() {
                sums[k].0 += p;
                sums[k].1 += 1;
            }
        }
        Some(sums.into_iter().map(|(s, n)| (s / n.max(1) as f64, n)).collect())
    }
}

struct PreparedQuery {
    query_id: String,
    doc_ids: Vec<String>,
    /// Each document's features, serialised once (sessions repeat them many times).
    features: Vec<Box<RawValue>>,
    truth: Vec<DocTruth>,
    scores: Vec<f64>,
    ranking: Vec<usize>,
}

/// One drawn session (`Simulator::draw`).
#[derive(Debug, Clone, PartialEq)]
pub struct Draw {
    pub query: usize,
    pub shown: Vec<usize>,
    pub clicks: Vec<bool>,
}

/// A ready simulator: data loaded, relevance and policy fixed. Sessions are generated on demand.
pub struct Simulator {
    config: SimConfig,
    queries: Vec<PreparedQuery>,
    truth: GroundTruth,
}

#[derive(Serialize)]
struct OutItem<'a> {
    doc_id: &'a str,
    position: usize,
    clicked: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    features: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    propensity: Option<f64>,
}

#[derive(Serialize)]
struct OutSession<'a> {
    schema_version: u64,
    session_id: &'a str,
    query_id: &'a str,
    event_time: i64,
    policy_id: &'a str,
    items: Vec<OutItem<'a>>,
}

fn load_dataset(cfg: &SimConfig, rng: &mut ChaCha8Rng) -> anyhow::Result<Dataset> {
    if cfg.data.is_empty() {
        let s = &cfg.synthetic;
        return Ok(dataset::synthetic(s.queries, s.docs_per_query, s.features, rng));
    }
    match cfg.format {
        DataFormat::Svmlight => dataset::load_svmlight(&cfg.data.iter().map(PathBuf::as_path).collect::<Vec<_>>()),
        DataFormat::Lightgbm => {
            let [data] = cfg.data.as_slice() else { bail!("lightgbm format takes exactly one data file") };
            // `rank.train` and `rank.train.gz` both group by `rank.train.query`.
            let plain = data.display().to_string();
            let groups = cfg.query_file.clone().unwrap_or_else(|| PathBuf::from(format!("{}.query", plain.strip_suffix(".gz").unwrap_or(&plain))));
            dataset::load_lightgbm(data, &groups)
        }
    }
}

impl Simulator {
    pub fn new(config: SimConfig) -> anyhow::Result<Self> {
        config.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut data = load_dataset(&config, &mut rng)?;
        let label_max = data.max_label().map(f64::from);

        // Relevance for every document.
        let rows: Vec<&dataset::Doc> = data.queries.iter().flat_map(|q| &q.docs).collect();
        let x = Array2::from_shape_fn((rows.len(), data.n_features), |(i, j)| rows[i].features[j]);
        let relevance: Vec<f64> = match config.relevance {
            RelevanceKind::Labels => {
                let max = label_max.filter(|m| *m > 0.0).context("relevance = labels but every label is 0")?;
                rows.iter().map(|d| d.label.unwrap_or(0.0) as f64 * 4.0 / max).collect()
            }
            kind => relevance::rescale_to_0_4(&relevance::synthetic_raw(kind, &x, config.noise, &mut rng)),
        };
        drop(rows);

        // Truncate to the top-N by expert label (relevance when there are none); drop queries
        // without a relevant document.
        let mut offset = 0;
        let mut kept: Vec<(dataset::Query, Vec<f64>)> = Vec::new();
        for q in std::mem::take(&mut data.queries) {
            let rel = relevance[offset..offset + q.docs.len()].to_vec();
            offset += q.docs.len();
            let key = |i: usize| q.docs[i].label.map(f64::from).unwrap_or(rel[i]);
            if !(0..q.docs.len()).any(|i| key(i) > 0.0) {
                continue;
            }
            let mut order: Vec<usize> = (0..q.docs.len()).collect();
            order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
            order.truncate(config.top_n);
            order.sort_unstable(); // keep file order among the kept
            let docs = order.iter().map(|&i| q.docs[i].clone()).collect();
            kept.push((dataset::Query { query_id: q.query_id, docs }, order.iter().map(|&i| rel[i]).collect()));
        }
        if kept.is_empty() {
            bail!("no query has a relevant document");
        }

        // Logging-policy ranker f fitted on all kept documents' relevance, then Eq. 25.
        let kept_rows: Vec<&Vec<f32>> = kept.iter().flat_map(|(q, _)| q.docs.iter().map(|d| &d.features)).collect();
        let kept_x = Array2::from_shape_fn((kept_rows.len(), data.n_features), |(i, j)| kept_rows[i][j]);
        let kept_rel: Vec<f64> = kept.iter().flat_map(|(_, r)| r.iter().copied()).collect();
        let f = policy::fit_ranker(config.policy.ranker, &kept_x, &kept_rel, &mut rng);
        let scores = policy::blend_scores(&f, config.policy.alpha, &mut rng);

        let (y_max, use_labels) = match (config.relevance, label_max) {
            (RelevanceKind::Labels, Some(m)) => (m, true),
            _ => (4.0, false),
        };
        let mut queries = Vec::with_capacity(kept.len());
        let mut truth_queries = Vec::with_capacity(kept.len());
        let mut at = 0;
        for (q, rel) in kept {
            let n = q.docs.len();
            let s = scores[at..at + n].to_vec();
            at += n;
            let ranking = policy::deterministic_ranking(&s);
            let truth: Vec<DocTruth> = q
                .docs
                .iter()
                .zip(&rel)
                .map(|(d, &r)| {
                    let y = if use_labels { d.label.unwrap_or(0.0) as f64 } else { r };
                    DocTruth { relevance: r, omega: click::omega(config.click_model.epsilon, y, y_max) }
                })
                .collect();
            truth_queries.push(QueryTruth {
                query_id: q.query_id.clone(),
                docs: q
                    .docs
                    .iter()
                    .zip(&truth)
                    .zip(&s)
                    .map(|((d, t), &score)| DocRecord {
                        doc_id: d.doc_id.clone(),
                        label: d.label.map(f64::from),
                        relevance: t.relevance,
                        omega: t.omega,
                        policy_score: score,
                    })
                    .collect(),
                logging_ranking: ranking.clone(),
            });
            queries.push(PreparedQuery {
                query_id: q.query_id,
                doc_ids: q.docs.iter().map(|d| d.doc_id.clone()).collect(),
                features: q.docs.iter().map(|d| serde_json::value::to_raw_value(&d.features).expect("finite f32 values serialise")).collect(),
                truth,
                scores: s,
                ranking,
            });
        }
        let max_n = queries.iter().map(|q| q.doc_ids.len()).max().unwrap_or(0);
        let positions = (1..=max_n).map(|k| PositionTruth { position: k, theta: click::theta(k), examination: config.click_model.gamma(k) }).collect();
        let truth = GroundTruth { config: config.clone(), n_features: data.n_features, label_max, positions, queries: truth_queries };
        Ok(Simulator { config, queries, truth })
    }

    pub fn truth(&self) -> &GroundTruth {
        &self.truth
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Dense features of query `index`'s documents, in the order of `truth().queries[index].docs`
    /// (exactly the values sessions carry).
    pub fn query_features(&self, index: usize) -> Vec<Vec<f32>> {
        self.queries[index].features.iter().map(|raw| serde_json::from_str(raw.get()).expect("features were serialised from a Vec<f32>")).collect()
    }

    pub fn n_queries(&self) -> usize {
        self.queries.len()
    }

    /// Session `index` as one JSON line (no newline) and its record key: the query id, so every
    /// session of a query lands in one Kafka partition (what scale-out needs; `docs/scale-out.md`).
    /// Each session has its own RNG stream, so any session can be regenerated alone.
    pub fn session(&self, index: u64, buf: &mut Vec<u8>) -> String {
        let Draw { query, shown, clicks } = self.draw(index);
        let q = &self.queries[query];
        let p = &self.config.policy;
        let n = shown.len() as f64;
        let log_prop = self.config.log_propensity && p.sampling == Sampling::EpsilonGreedy;
        let session_id = format!("s{}-{index}", self.config.seed);
        let items = shown
            .iter()
            .enumerate()
            .map(|(k, &d)| OutItem {
                doc_id: &q.doc_ids[d],
                position: k + 1,
                clicked: clicks[k],
                features: self.config.emit_features.then(|| q.features[d].as_ref()),
                propensity: log_prop.then(|| {
                    let det = if q.ranking[k] == d { 1.0 } else { 0.0 };
                    let tau = self.config.logged_tau.unwrap_or(p.tau);
                    ((1.0 - tau) * det + tau / n).max(f64::MIN_POSITIVE)
                }),
            })
            .collect();
        let out = OutSession {
            schema_version: ultr_core::session::SCHEMA_VERSION,
            session_id: &session_id,
            query_id: &q.query_id,
            event_time: self.config.start_ms + index as i64 * self.config.interval_ms,
            policy_id: &p.policy_id,
            items,
        };
        buf.clear();
        serde_json::to_writer(&mut *buf, &out).expect("serialising to a Vec cannot fail");
        q.query_id.clone()
    }

    /// Session `index`'s query (an index into `truth().queries`), the documents shown (indices into
    /// its `docs`, position 1 first) and their clicks: what `session` writes.
    pub fn draw(&self, index: u64) -> Draw {
        let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed ^ 0x5e55_1045);
        rng.set_stream(index);
        let query = rng.random_range(0..self.queries.len());
        let q = &self.queries[query];
        let p = &self.config.policy;
        let mut shown = policy::sample_ranking(p.sampling, p.tau, p.pl_temperature, &q.scores, &q.ranking, &mut rng);
        // Drawn only when configured, so that streams without randomization are unchanged.
        if let Some(r) = self.config.randomization.as_ref().filter(|r| index >= r.from_session) {
            if rng.random_bool(r.fraction) {
                r.design.apply(&mut shown, r.positions, &mut rng);
            }
        }
        if self.config.duplicate_rate > 0.0 && shown.len() >= 2 && rng.random_bool(self.config.duplicate_rate) {
            let k = rng.random_range(1..shown.len());
            shown[k] = shown[rng.random_range(0..k)];
        }
        let docs: Vec<DocTruth> = shown.iter().map(|&i| q.truth[i]).collect();
        let clicks = self.config.click_model.clicks(&docs, &mut rng);
        Draw { query, shown, clicks }
    }

    /// Writes sessions `0..config.sessions` to `sink`; returns how many.
    pub fn run(&self, sink: &mut dyn SessionSink) -> anyhow::Result<u64> {
        let mut buf = Vec::with_capacity(16 << 10);
        for i in 0..self.config.sessions {
            let key = self.session(i, &mut buf);
            sink.send(&key, &buf)?;
        }
        sink.flush()?;
        Ok(self.config.sessions)
    }
}

/// The simulator's true relevance (what its clicks depend on) as labels.
pub fn labels_from_truth(truth: &GroundTruth) -> std::collections::HashMap<(String, String), f64> {
    truth.queries.iter().flat_map(|q| q.docs.iter().map(move |d| ((q.query_id.clone(), d.doc_id.clone()), d.relevance))).collect()
}

/// θ_k − θ_1 of the simulator's additive model, k = 1.. .
pub fn truth_theta(truth: &GroundTruth) -> Vec<f64> {
    let first = truth.positions.first().map(|p| p.theta).unwrap_or(0.0);
    truth.positions.iter().map(|p| p.theta - first).collect()
}
