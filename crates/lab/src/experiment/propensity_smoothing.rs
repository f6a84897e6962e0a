//! `ultr experiment propensity-smoothing`: how far counted π(d,k|q) lies from the logging policy's
//! true π, by how many sessions the query had, with and without shrinkage (`train.ips.prior_sessions`,
//! `sql/ips_propensity.sql`). A simulated ε-greedy log with many tail queries goes through the real
//! pipeline; its logged propensities are the simulator's exact π (every (q, d, k) cell's), so each
//! counted cell is compared with the truth.

use std::collections::HashMap;
use std::path::PathBuf;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, UInt32Type};
use serde::Serialize;

use crate::simulate::SimConfig;
use ultr_train::config::{IpsConfig, PropensitySource};

#[derive(Debug, Clone)]
pub struct Options {
    pub out: PathBuf,
    pub sessions: u64,
    /// Synthetic queries (sessions pick one uniformly, so sessions/queries is the mean per query).
    pub queries: usize,
    pub docs_per_query: usize,
    pub tau: f64,
    pub priors: Vec<f64>,
    pub seeds: Vec<u64>,
}

/// Sessions-per-query buckets the errors are reported by.
pub const BUCKETS: [(i64, i64); 4] = [(1, 1), (2, 3), (4, 9), (10, i64::MAX)];

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub prior_sessions: f64,
    /// "1", "2-3", …
    pub sessions: String,
    pub cells: u64,
    pub impressions: u64,
    /// Impression-weighted mean |ln(π̂ / π)| and mean ln(π̂ / π) (bias).
    pub mean_abs_log_error: f64,
    pub mean_log_error: f64,
    /// Impression-weighted mean |π/π̂ − 1|: the relative error of each impression's IPS weight.
    pub mean_weight_error: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub rows: Vec<Row>,
    pub sessions: u64,
    pub queries: usize,
    pub tau: f64,
    pub seeds: Vec<u64>,
}

fn bucket_name(b: (i64, i64)) -> String {
    match b {
        (a, z) if a == z => a.to_string(),
        (a, i64::MAX) => format!("{a}+"),
        (a, z) => format!("{a}-{z}"),
    }
}

fn col(b: &RecordBatch, name: &str, t: &DataType) -> anyhow::Result<datafusion::arrow::array::ArrayRef> {
    Ok(cast(b.column_by_name(name).ok_or_else(|| anyhow::anyhow!("no column {name}"))?, t)?)
}

type Key = (String, String, u32);

/// (q, d, k) → (true π from the log, impressions), in one pass over the per-policy table.
fn truth(policy_propensity: &[RecordBatch]) -> anyhow::Result<HashMap<Key, (f64, i64)>> {
    let mut out: HashMap<Key, (f64, i64)> = HashMap::new();
    for b in policy_propensity {
        let (q, d, k) = (col(b, "query_id", &DataType::Utf8)?, col(b, "doc_id", &DataType::Utf8)?, col(b, "position", &DataType::UInt32)?);
        let (p, n) = (col(b, "logged_propensity", &DataType::Float64)?, col(b, "impressions", &DataType::Int64)?);
        let (q, d, k) = (q.as_string::<i32>(), d.as_string::<i32>(), k.as_primitive::<UInt32Type>());
        let (p, n) = (p.as_primitive::<Float64Type>(), n.as_primitive::<Int64Type>());
        for i in 0..b.num_rows() {
            anyhow::ensure!(!p.is_null(i), "a cell without a logged propensity: the experiment needs log_propensity");
            let e = out.entry((q.value(i).to_string(), d.value(i).to_string(), k.value(i))).or_insert((p.value(i), 0));
            e.1 += n.value(i);
        }
    }
    Ok(out)
}

/// Per bucket: (cells, impressions, Σ n|ln|, Σ n ln, Σ n |w err|).
type Acc = [(u64, u64, f64, f64, f64); BUCKETS.len()];

fn accumulate(acc: &mut Acc, estimated: &[RecordBatch], truth: &HashMap<Key, (f64, i64)>) -> anyhow::Result<()> {
    for b in estimated {
        let (q, d, k) = (col(b, "query_id", &DataType::Utf8)?, col(b, "doc_id", &DataType::Utf8)?, col(b, "position", &DataType::UInt32)?);
        let (s, p) = (col(b, "sessions", &DataType::Int64)?, col(b, "propensity", &DataType::Float64)?);
        let (q, d, k) = (q.as_string::<i32>(), d.as_string::<i32>(), k.as_primitive::<UInt32Type>());
        let (s, p) = (s.as_primitive::<Int64Type>(), p.as_primitive::<Float64Type>());
        for i in 0..b.num_rows() {
            let key = (q.value(i).to_string(), d.value(i).to_string(), k.value(i));
            let Some(&(t, n)) = truth.get(&key) else { continue };
            let Some(j) = BUCKETS.iter().position(|(lo, hi)| (*lo..=*hi).contains(&s.value(i))) else { continue };
            let (e, n) = ((p.value(i) / t).ln(), n as f64);
            let a = &mut acc[j];
            a.0 += 1;
            a.1 += n as u64;
            a.2 += n * e.abs();
            a.3 += n * e;
            a.4 += n * (t / p.value(i) - 1.0).abs();
        }
    }
    Ok(())
}

pub fn run(opts: &Options) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(&opts.out)?;
    let scratch = tempfile::tempdir()?;
    let mut accs: Vec<Acc> = vec![Default::default(); opts.priors.len()];
    for &seed in &opts.seeds {
        let mut sim = SimConfig { seed, sessions: opts.sessions, log_propensity: true, ..SimConfig::default() };
        sim.synthetic.queries = opts.queries;
        sim.synthetic.docs_per_query = opts.docs_per_query;
        sim.top_n = opts.docs_per_query;
        sim.policy.tau = opts.tau;
        let dir = scratch.path().join(format!("seed-{seed}"));
        let mut config = super::simulator_core_config(&sim);
        config.state.checkpoint_every_records = 1_000_000;
        let context = ultr_core::context::PipelineContext::default();
        crate::simulate::source::run_to_state(&context, &sim, &config, &dir, &mut ultr_core::pipeline::NoObserver)?;
        let manifest = ultr_core::state::read_manifest(&dir)?;
        let rt = context.runner("ultr-lab")?;
        let cumulative = rt.run(ultr_core::state::cumulative::compute(&context, &dir, &manifest, i64::MAX / 4))?;
        let truth = truth(&cumulative.policy_propensity)?;
        for (m, acc) in opts.priors.iter().zip(accs.iter_mut()) {
            let cfg = IpsConfig { source: PropensitySource::Empirical, prior_sessions: *m, ..IpsConfig::default() };
            let estimated = rt.run(ultr_train::ips_propensity::ips_propensity(&context, cumulative.policy_propensity.clone(), &cfg))?;
            accumulate(acc, &estimated, &truth)?;
        }
        std::fs::remove_dir_all(&dir).ok();
        eprintln!("seed {seed}: {} cells", truth.len());
    }
    let mut rows = Vec::new();
    for (m, acc) in opts.priors.iter().zip(&accs) {
        for (b, a) in BUCKETS.iter().zip(acc.iter()) {
            let n = a.1.max(1) as f64;
            rows.push(Row {
                prior_sessions: *m,
                sessions: bucket_name(*b),
                cells: a.0,
                impressions: a.1,
                mean_abs_log_error: a.2 / n,
                mean_log_error: a.3 / n,
                mean_weight_error: a.4 / n,
            });
        }
    }
    let summary = Summary { rows, sessions: opts.sessions, queries: opts.queries, tau: opts.tau, seeds: opts.seeds.clone() };
    write_outputs(opts, &summary)?;
    Ok(summary)
}

fn write_outputs(opts: &Options, s: &Summary) -> anyhow::Result<()> {
    let mut md = format!(
        "# Counted π against the simulator's true π, with shrinkage\n\n{} sessions over {} synthetic queries ({} docs each, ε-greedy τ = {}), seeds {:?}. \
         Impression-weighted errors of π̂(d,k|q) per (q, d, k) cell, by the query's sessions in the horizon; \
         m = `train.ips.prior_sessions` (0: plain counting).\n\n\
         | m | sessions of q | cells | mean abs ln(π̂/π) | mean ln(π̂/π) | mean abs IPS-weight error |\n|---|---|---|---|---|---|\n",
        s.sessions, s.queries, opts.docs_per_query, s.tau, s.seeds
    );
    for r in &s.rows {
        md.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:+.3} | {:.3} |\n",
            r.prior_sessions, r.sessions, r.cells, r.mean_abs_log_error, r.mean_log_error, r.mean_weight_error
        ));
    }
    super::write_csv(
        &opts.out.join("results.csv"),
        &super::header("prior_sessions,sessions_per_query,cells,impressions,mean_abs_log_error,mean_log_error,mean_weight_error"),
        s.rows.iter().map(|r| {
            vec![
                r.prior_sessions.to_string(),
                r.sessions.to_string(),
                r.cells.to_string(),
                r.impressions.to_string(),
                format!("{:.6}", r.mean_abs_log_error),
                format!("{:.6}", r.mean_log_error),
                format!("{:.6}", r.mean_weight_error),
            ]
        }),
    )?;
    std::fs::write(opts.out.join("summary.md"), md)?;
    std::fs::write(opts.out.join("summary.json"), serde_json::to_string_pretty(s)?)?;
    Ok(())
}
