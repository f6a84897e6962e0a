//! Feature overlap between bias configurations (Hager Thm 4.1, §4.5): a positivity score in the spirit
//! of D'Amour et al. 2021 — fit a logistic regression (linfa) telling node a's samples from node b's,
//! and take the fraction of samples whose predicted probability lies in [η, 1 − η] — plus an RBF MMD².

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Float32Type, UInt32Type};
use linfa::prelude::*;
use linfa_logistic::LogisticRegression;
use ndarray::{concatenate, Array1, Array2, Axis};
use serde::Serialize;

use super::Node;
use crate::config::IdentifiabilityConfig;

/// Overlap of one pair of nodes.
#[derive(Debug, Clone, Serialize)]
pub struct PairScore {
    pub a: Node,
    pub b: Node,
    /// Fraction of both nodes' samples with predicted probability in [η, 1 − η]: 1 means the
    /// classifier cannot tell the nodes apart, 0 means it always can.
    pub positivity: f64,
    /// Squared maximum mean discrepancy, Gaussian kernel with the median-distance bandwidth.
    pub mmd2: f64,
}

/// Feature samples per node from the overlap-sample table.
pub fn samples_by_node(sample: &[RecordBatch], max_position: u32) -> BTreeMap<Node, Array2<f64>> {
    let mut rows: BTreeMap<Node, Vec<Vec<f64>>> = BTreeMap::new();
    for b in sample {
        let pos = b.column_by_name("position").expect("overlap sample has position").as_primitive::<UInt32Type>();
        let ctx = b.column_by_name("context").expect("overlap sample has context").as_string::<i32>();
        let feats = b.column_by_name("features").expect("overlap sample has features").as_list::<i32>();
        for i in 0..b.num_rows() {
            if pos.value(i) > max_position || feats.is_null(i) {
                continue;
            }
            let v = feats.value(i);
            let v = v.as_primitive::<Float32Type>();
            let node = Node { position: pos.value(i), context: if ctx.is_null(i) { String::new() } else { ctx.value(i).to_string() } };
            rows.entry(node).or_default().push(v.values().iter().map(|x| *x as f64).collect());
        }
    }
    rows.into_iter()
        .filter_map(|(n, r)| {
            let d = r.first()?.len();
            if d == 0 || r.iter().any(|x| x.len() != d) {
                return None;
            }
            let flat: Vec<f64> = r.iter().flatten().copied().collect();
            Array2::from_shape_vec((r.len(), d), flat).ok().map(|a| (n, a))
        })
        .collect()
}

/// Scores every pair of nodes that both have at least `min_samples` samples.
pub fn pair_scores(samples: &BTreeMap<Node, Array2<f64>>, config: &IdentifiabilityConfig) -> anyhow::Result<Vec<PairScore>> {
    let nodes: Vec<(&Node, &Array2<f64>)> = samples.iter().filter(|(_, x)| x.nrows() >= config.min_samples).collect();
    let mut out = Vec::new();
    for (i, (a, xa)) in nodes.iter().enumerate() {
        for (b, xb) in &nodes[i + 1..] {
            out.push(PairScore { a: (*a).clone(), b: (*b).clone(), positivity: positivity(xa, xb, config.eta)?, mmd2: mmd2(xa, xb) });
        }
    }
    Ok(out)
}

fn standardize(x: &Array2<f64>) -> Array2<f64> {
    let mean = x.mean_axis(Axis(0)).expect("non-empty");
    let std = x.std_axis(Axis(0), 0.0).mapv(|s| if s > 1e-9 { s } else { 1.0 });
    (x - &mean) / &std
}

/// Positivity score of two samples.
pub fn positivity(xa: &Array2<f64>, xb: &Array2<f64>, eta: f64) -> anyhow::Result<f64> {
    let x = standardize(&concatenate(Axis(0), &[xa.view(), xb.view()])?);
    let y: Array1<usize> = (0..x.nrows()).map(|i| usize::from(i >= xa.nrows())).collect();
    let data = Dataset::new(x.clone(), y);
    let p = match LogisticRegression::default().alpha(1.0).max_iterations(200).fit(&data) {
        Ok(model) => model.predict_probabilities(&x),
        // No usable signal (e.g. constant features): the best classifier is the class prior.
        Err(e) => {
            tracing::debug!(error = %e, "logistic fit failed; using the class prior");
            Array1::from_elem(x.nrows(), xb.nrows() as f64 / x.nrows() as f64)
        }
    };
    let inside = p.iter().filter(|&&q| q >= eta && q <= 1.0 - eta).count();
    Ok(inside as f64 / p.len() as f64)
}

/// Biased MMD² estimate with a Gaussian kernel; at most 64 samples per side keep it cheap.
pub fn mmd2(xa: &Array2<f64>, xb: &Array2<f64>) -> f64 {
    let xa = xa.slice(ndarray::s![..xa.nrows().min(64), ..]);
    let xb = xb.slice(ndarray::s![..xb.nrows().min(64), ..]);
    let all = concatenate(Axis(0), &[xa.view(), xb.view()]).expect("same width");
    let z = standardize(&all);
    let n = z.nrows();
    let mut d2 = Array2::<f64>::zeros((n, n));
    for i in 0..n {
        for j in i + 1..n {
            let v: f64 = z.row(i).iter().zip(z.row(j).iter()).map(|(a, b)| (a - b) * (a - b)).sum();
            d2[(i, j)] = v;
            d2[(j, i)] = v;
        }
    }
    let mut off: Vec<f64> = (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))).map(|(i, j)| d2[(i, j)]).collect();
    off.sort_by(f64::total_cmp);
    let bandwidth = off.get(off.len() / 2).copied().filter(|m| *m > 1e-12).unwrap_or(1.0);
    let k = d2.mapv(|v| (-v / bandwidth).exp());
    let na = xa.nrows();
    let mean = |r: std::ops::Range<usize>, c: std::ops::Range<usize>| {
        let (nr, nc) = (r.len(), c.len());
        k.slice(ndarray::s![r, c]).sum() / (nr * nc) as f64
    };
    mean(0..na, 0..na) + mean(na..n, na..n) - 2.0 * mean(0..na, na..n)
}
