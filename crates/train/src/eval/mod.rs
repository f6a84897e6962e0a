//! Evaluation of a trained model: nDCG@k of the relevance tower against labels, click
//! log-likelihood and perplexity on held-out sessions, and bias recovery against ground truth.

use std::collections::{BTreeMap, HashMap};

use burn::tensor::Device;
use serde::Serialize;

use crate::artefact::Trained;
use crate::data::Examples;

pub mod config;
pub mod judged;

/// Graded relevance per (query_id, doc_id).
pub type Labels = HashMap<(String, String), f64>;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EvalReport {
    /// Held-out rows (aggregated keys, or raw impressions) and the impressions they stand for.
    pub rows: usize,
    pub impressions: usize,
    /// nDCG@k (gain 2^rel − 1), averaged over queries with a positive label; absent without labels.
    pub ndcg: BTreeMap<usize, f64>,
    pub ndcg_queries: usize,
    /// Mean per-impression click log-likelihood (nats).
    pub log_likelihood: f64,
    /// Mean over positions of 2^(−mean log2-likelihood at that position).
    pub perplexity: f64,
    pub perplexity_by_position: Vec<(u32, f64)>,
    /// RMSE of θ_k − θ_1 against the truth over positions 1..=K.
    pub bias_rmse: Option<f64>,
    pub bias_positions: usize,
    pub theta_estimated: Vec<f64>,
    pub theta_true: Vec<f64>,
    /// The misspecification test on the held-out rows (`crate::misspecification`), when run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub misspecification: Option<crate::misspecification::MisspecificationTest>,
}

/// RMSE over positions 1..=k of normalised θ (both vectors hold θ_k − θ_1 from index 0).
pub fn bias_rmse(estimated: &[f64], truth: &[f64], k: usize) -> f64 {
    let k = k.min(estimated.len()).min(truth.len());
    ((0..k).map(|i| (estimated[i] - truth[i]).powi(2)).sum::<f64>() / k.max(1) as f64).sqrt()
}

/// nDCG@k per query, averaged; queries whose ideal DCG is 0 are skipped.
pub fn mean_ndcg(scores: &HashMap<(String, String), f64>, labels: &Labels, cutoffs: &[usize]) -> (BTreeMap<usize, f64>, usize) {
    let mut by_query: BTreeMap<&str, Vec<(&str, f64, f64)>> = BTreeMap::new();
    for ((q, d), s) in scores {
        if let Some(l) = labels.get(&(q.clone(), d.clone())) {
            by_query.entry(q.as_str()).or_default().push((d.as_str(), *s, *l));
        }
    }
    let mut sums: BTreeMap<usize, f64> = cutoffs.iter().map(|k| (*k, 0.0)).collect();
    let mut n = 0;
    for docs in by_query.values_mut() {
        let gain = |rel: f64| 2f64.powf(rel) - 1.0;
        let dcg =
            |ordered: &[(&str, f64, f64)], k: usize| -> f64 { ordered.iter().take(k).enumerate().map(|(i, d)| gain(d.2) / ((i + 2) as f64).log2()).sum() };
        docs.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(b.0)));
        let ideal: Vec<f64> = cutoffs.iter().map(|k| dcg(docs, *k)).collect();
        if ideal.iter().all(|v| *v <= 0.0) {
            continue;
        }
        docs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
        n += 1;
        for (i, k) in cutoffs.iter().enumerate() {
            if ideal[i] > 0.0 {
                *sums.get_mut(k).expect("cutoff") += dcg(docs, *k) / ideal[i];
            }
        }
    }
    (sums.into_iter().map(|(k, s)| (k, s / n.max(1) as f64)).collect(), n)
}

/// Evaluates `trained` on held-out sessions `heldout`.
pub fn evaluate(trained: &Trained, heldout: &Examples, labels: Option<&Labels>, truth_theta: Option<&[f64]>, k_bias: usize, device: &Device) -> EvalReport {
    let logits = trained.logits(heldout, device);
    let mut ll = 0f64;
    let mut by_pos: BTreeMap<u32, (f64, usize)> = BTreeMap::new();
    for (r, z) in heldout.rows.iter().zip(&logits) {
        let z = *z as f64;
        // log σ(z) and log(1 − σ(z)) without overflow.
        let log_p = -((-z).max(0.0) + (-(z.abs())).exp().ln_1p());
        let log_q = -(z.max(0.0) + (-(z.abs())).exp().ln_1p());
        let l = r.clicks as f64 * log_p + r.impressions.saturating_sub(r.clicks) as f64 * log_q;
        ll += l;
        let e = by_pos.entry(r.position).or_default();
        e.0 += l / std::f64::consts::LN_2;
        e.1 += r.impressions as usize;
    }
    let perplexity_by_position: Vec<(u32, f64)> = by_pos.iter().map(|(k, (s, n))| (*k, 2f64.powf(-s / *n as f64))).collect();
    let perplexity = perplexity_by_position.iter().map(|(_, p)| p).sum::<f64>() / perplexity_by_position.len().max(1) as f64;

    let (ndcg, ndcg_queries) = match labels {
        Some(labels) => {
            let rel = trained.relevance_of_rows(heldout, device);
            let mut scores = HashMap::new();
            for (r, s) in heldout.rows.iter().zip(rel) {
                scores.entry(heldout.qd_keys[r.qd as usize].clone()).or_insert(s as f64);
            }
            mean_ndcg(&scores, labels, &[1, 5, 10])
        }
        None => (BTreeMap::new(), 0),
    };
    let theta_estimated = trained.position_bias();
    let (bias_rmse, bias_positions, theta_true) = match truth_theta {
        Some(t) => {
            let k = k_bias.min(t.len()).min(heldout.max_position() as usize);
            (Some(self::bias_rmse(&theta_estimated, t, k)), k, t.iter().take(k).copied().collect())
        }
        None => (None, 0, Vec::new()),
    };
    EvalReport {
        rows: heldout.rows.len(),
        impressions: heldout.impressions() as usize,
        ndcg,
        ndcg_queries,
        log_likelihood: ll / heldout.impressions().max(1) as f64,
        perplexity,
        perplexity_by_position,
        bias_rmse,
        bias_positions,
        theta_estimated: theta_estimated.into_iter().take(k_bias.max(bias_positions)).collect(),
        theta_true,
        misspecification: None,
    }
}

impl EvalReport {
    pub fn render(&self) -> String {
        let mut s = format!("held-out: {} rows, {} impressions\n", self.rows, self.impressions);
        if !self.ndcg.is_empty() {
            s.push_str(&format!(
                "  nDCG {} over {} queries\n",
                self.ndcg.iter().map(|(k, v)| format!("@{k} {v:.4}")).collect::<Vec<_>>().join("  "),
                self.ndcg_queries
            ));
        }
        s.push_str(&format!("  click log-likelihood {:.5} nats/impression, perplexity {:.5}\n", self.log_likelihood, self.perplexity));
        if let Some(r) = self.bias_rmse {
            s.push_str(&format!("  bias RMSE (θ_k − θ_1, k = 1..{}) {r:.4}\n", self.bias_positions));
            s.push_str("  k  estimated   true\n");
            for (i, t) in self.theta_true.iter().enumerate() {
                s.push_str(&format!("  {:<2} {:+.4}   {:+.4}\n", i + 1, self.theta_estimated[i], t));
            }
        }
        if let Some(m) = &self.misspecification {
            match (&m.reason, m.assessable) {
                (_, true) => s.push_str(&format!(
                    "  misspecification: z = {:.2} over {} (query, document) clusters, {} position blocks (the monitor's ultr_misspecification_z; pipelines/alerts.yml alerts above its threshold)\n",
                    m.z, m.clusters, m.dof
                )),
                (Some(r), false) => s.push_str(&format!("  misspecification: not assessable: {r}\n")),
                (None, false) => s.push_str("  misspecification: not assessable\n"),
            }
        }
        s
    }
}
