//! Exact compression of pointwise training data: a model's loss and gradients on aggregated rows
//! (impressions, clicks per key; count-weighted BCE) equal those on the raw impressions, and a model
//! trained on either path recovers the same θ and nDCG within seed noise. Also the duplicate-session
//! filter: what the 64-bit keys promise and that they survive a checkpoint.

use crate::common;

use std::sync::Arc;

use burn::module::Module;

use ultr::eval::evaluate;
use ultr::ingest::Ingest;
use ultr::session::DecodeLimits;
use ultr::simulate::source::SimulatorSource;
use ultr::simulate::{labels_from_truth, truth_theta};
use ultr::simulate::{SimConfig, Simulator};
use ultr::sinks::dead_letter::DeadLetterSink;
use ultr::train::config::{AggregatedEpoch, IpsConfig, PositionBiasSource, TowerKind, TrainConfig};
use ultr::train::data::Examples;
use ultr::train::fit::{fit, make_batch};
use ultr::train::models::AnyModel;
use ultr::train::weights::ips_weights;

const HOLDOUT: ultr::window::Holdout = ultr::window::Holdout { validation: 0.1, evaluation: 0.1 };

fn raw_examples(sessions: u64, seed: u64) -> (Examples, Arc<Simulator>) {
    let mut c = SimConfig { sessions, seed, log_propensity: true, ..SimConfig::default() };
    c.policy.tau = 0.3;
    let sim = Arc::new(Simulator::new(c).unwrap());
    let mut ingest = Ingest::new(SimulatorSource::new(sim.clone(), 0), DecodeLimits::default(), 4096);
    let batches = common::collect(&mut ingest, &mut DeadLetterSink::discard());
    (Examples::from_batches(&batches, 50).unwrap(), sim)
}

fn config(seed: u64) -> TrainConfig {
    TrainConfig {
        tower: TowerKind::Linear,
        max_epochs: 40,
        patience: 3,
        // θ trained with the tower: these tests compare θ's gradients and estimates on both paths.
        position_bias: PositionBiasSource::Joint,
        // IPS weights on: the raw and aggregated paths must weigh alike.
        ips: IpsConfig { enabled: true, ..IpsConfig::default() },
        seed,
        validation_fraction: HOLDOUT.validation,
        evaluation_fraction: HOLDOUT.evaluation,
        ..TrainConfig::default()
    }
}

#[test]
fn loss_and_gradients_on_aggregated_rows_equal_the_raw_impressions() {
    let (raw, _) = raw_examples(3_000, 11);
    let agg = raw.aggregate(HOLDOUT);
    assert_eq!(agg.impressions(), raw.impressions());
    assert_eq!(agg.clicks(), raw.clicks());
    assert!(agg.rows.len() * 2 < raw.rows.len(), "aggregation must compress: {} rows from {}", agg.rows.len(), raw.rows.len());

    // A model that is not at any optimum: one epoch from a cold start.
    let cfg = TrainConfig { max_epochs: 1, ..config(1) };
    let (trained, _) = fit(&raw, &cfg, None, false).unwrap();
    let device = cfg.backend.device().unwrap();
    for self_normalize in [false, true] {
        let (w_raw, _) = ips_weights(&raw.rows, &cfg.ips).unwrap();
        let (w_agg, _) = ips_weights(&agg.rows, &cfg.ips).unwrap();
        let (l_raw, l_agg) = (trained.loss(&raw, &w_raw, self_normalize, &device), trained.loss(&agg, &w_agg, self_normalize, &device));
        assert!((l_raw - l_agg).abs() <= 1e-5 * l_raw.abs(), "loss raw {l_raw} vs aggregated {l_agg} (self-normalised: {self_normalize})");
    }

    // Gradients of the whole-data loss with respect to θ and the tower's weights.
    let grads = |ex: &Examples| -> (Vec<f32>, Vec<f32>) {
        let (w, _) = ips_weights(&ex.rows, &cfg.ips).unwrap();
        let ad = cfg.backend.autodiff_device().unwrap();
        let model = trained.model.clone().train();
        let all: Vec<usize> = (0..ex.sessions.len()).collect();
        let (b, n) = make_batch(ex, &all, &w, &trained.qd_map(ex), &trained.meta, &ad);
        let loss = model.objective(&b, n as f64, &cfg.sections);
        let g = loss.backward();
        let AnyModel::Additive(model) = model else { panic!("the default model is additive") };
        let theta = model.theta.val().grad(&g).unwrap().into_data().try_to_vec::<f32>().unwrap();
        let tower = model.relevance.as_ref().unwrap();
        let weights = tower.layers[0].weight.val().grad(&g).unwrap().into_data().try_to_vec::<f32>().unwrap();
        (theta, weights)
    };
    let (theta_raw, w_raw) = grads(&raw);
    let (theta_agg, w_agg) = grads(&agg);
    let scale = theta_raw.iter().chain(&w_raw).map(|v| v.abs()).fold(0f32, f32::max);
    assert!(scale > 1e-4, "a gradient to compare");
    for (a, b) in theta_raw.iter().zip(&theta_agg).chain(w_raw.iter().zip(&w_agg)) {
        assert!((a - b).abs() <= 1e-4 * scale + 1e-7, "gradient raw {a} vs aggregated {b} (scale {scale})");
    }
}

/// On three simulated streams (data seeds 12, 14 and 16), aggregated rows train to the raw rows' θ
/// and nDCG@10 within seed noise, for both epoch kinds. The noise is measured on each stream: the
/// largest θ gap among three optimizer seeds on the raw rows and a resample of the same simulator
/// config (the stream's seed + 1); nDCG's, the largest gap among the three optimizer seeds.
#[test]
fn a_model_trained_on_aggregated_rows_matches_the_raw_path_within_seed_noise() {
    for data_seed in [12, 14, 16] {
        aggregated_matches_raw_within_seed_noise(data_seed);
    }
}

fn aggregated_matches_raw_within_seed_noise(data_seed: u64) {
    let (raw, sim) = raw_examples(20_000, data_seed);
    let agg = raw.aggregate(HOLDOUT);
    let device = TrainConfig::default().backend.device().unwrap();
    let labels = labels_from_truth(sim.truth());
    let truth = truth_theta(sim.truth());
    let heldout = raw.filter_sessions(|s| ultr::train::data::split_of(s, HOLDOUT) == ultr::window::Split::Evaluation);
    let run_with = |ex: &Examples, cfg: &TrainConfig| {
        let (t, _) = fit(ex, cfg, None, false).unwrap();
        let r = evaluate(&t, &heldout, Some(&labels), Some(&truth), 10, &device);
        (t.position_bias()[..10].to_vec(), r.ndcg[&10])
    };
    let run = |ex: &Examples, seed: u64| run_with(ex, &config(seed));
    let raw_runs: Vec<(Vec<f64>, f64)> = (1..=3).map(|seed| run(&raw, seed)).collect();
    let (theta_a, ndcg_a) = raw_runs[0].clone();
    let (theta_g, ndcg_g) = run(&agg, 1);
    // Seed noise: how far θ moves when the optimizer's seed changes, or when the same simulator
    // config draws another sample of sessions (what a rerun of the experiment would see).
    let (resample, _) = raw_examples(20_000, data_seed + 1);
    let (theta_c, _) = {
        let (t, _) = fit(&resample, &config(1), None, false).unwrap();
        (t.position_bias()[..10].to_vec(), ())
    };
    let diff = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
    let mut thetas: Vec<&[f64]> = raw_runs.iter().map(|(t, _)| t.as_slice()).collect();
    thetas.push(&theta_c);
    let pairs = |n: usize| (0..n).flat_map(move |i| (i + 1..n).map(move |j| (i, j)));
    let noise = pairs(thetas.len()).map(|(i, j)| diff(thetas[i], thetas[j])).fold(0f64, f64::max);
    let ndcg_noise = pairs(raw_runs.len()).map(|(i, j)| (raw_runs[i].1 - raw_runs[j].1).abs()).fold(0f64, f64::max);
    eprintln!("data seed {data_seed}: θ truth {:.3?}", &truth[..10]);
    eprintln!(
        "θ raw, optimizer seeds 1–3 {:.3?}\nθ raw resample {theta_c:.3?}\nθ aggregated {theta_g:.3?}",
        raw_runs.iter().map(|(t, _)| t).collect::<Vec<_>>()
    );
    eprintln!(
        "nDCG@10 raw {:.4?}, aggregated {ndcg_g:.4}; seed noise in θ {noise:.4}, in nDCG {ndcg_noise:.4}",
        raw_runs.iter().map(|(_, n)| n).collect::<Vec<_>>()
    );
    assert!(diff(&theta_a, &theta_g) <= noise, "data seed {data_seed}: θ aggregated vs raw {:.4} beyond seed noise {noise:.4}", diff(&theta_a, &theta_g));
    assert!((ndcg_a - ndcg_g).abs() <= (3.0 * ndcg_noise).max(0.01), "data seed {data_seed}: nDCG@10 raw {ndcg_a} vs aggregated {ndcg_g}");

    // `aggregated_epoch = "rows"`: every aggregated row once per epoch, count-weighted, so an epoch
    // costs the unique keys; fewer steps per epoch, hence the higher cap.
    let rows = TrainConfig { aggregated_epoch: AggregatedEpoch::Rows, max_epochs: 400, ..config(1) };
    let (theta_r, ndcg_r) = run_with(&agg, &rows);
    eprintln!("θ aggregated, every row once {theta_r:.3?}; nDCG@10 {ndcg_r:.4}");
    assert!(
        diff(&theta_a, &theta_r) <= noise,
        "data seed {data_seed}: θ aggregated (rows per epoch) vs raw {:.4} beyond seed noise {noise:.4}",
        diff(&theta_a, &theta_r)
    );
    assert!((ndcg_a - ndcg_r).abs() <= (3.0 * ndcg_noise).max(0.01), "data seed {data_seed}: nDCG@10 raw {ndcg_a} vs aggregated (rows per epoch) {ndcg_r}");
}

#[test]
fn the_duplicate_filter_keeps_distinct_sessions_apart_and_survives_a_checkpoint() {
    use std::collections::HashSet;
    use ultr::window::session_key;
    // 2·10⁶ distinct ids: with 64-bit keys the expected number of colliding pairs is n²/2⁶⁵ ≈ 1.1·10⁻⁷.
    let n = 2_000_000;
    let keys: HashSet<u64> = (0..n).map(|i| session_key(&format!("s{i}"))).collect();
    assert_eq!(keys.len(), n, "no two of {n} session ids share a key");

    // A checkpointed filter refuses a re-sent session after a restart, as the in-memory one did.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    let line = |id: &str, t: i64| {
        format!(
            r#"{{"schema_version":1,"session_id":"{id}","query_id":"q","event_time":{t},"policy_id":"p","items":[{{"doc_id":"a","position":1,"clicked":true}},{{"doc_id":"b","position":2,"clicked":false}}]}}"#
        )
    };
    let t0 = 1_767_225_600_000i64;
    let first: Vec<String> = (0..300).map(|i| line(&format!("s{i}"), t0 + i)).collect();
    std::fs::write(&path, first.join("\n") + "\n").unwrap();
    let config = |p: &std::path::Path| {
        let text = format!("source = {{ file = {{ paths = [{:?}] }} }}\n[window]\nsize = \"10h\"\n", p.display().to_string());
        ultr::config::PipelineConfig::parse(&text, "test").unwrap()
    };
    let state = dir.path().join("state");
    // Stop inside the window, before the file's end flushes it: the run stops one batch after 200
    // records and checkpoints.
    let mut cfg = config(&path);
    cfg.batch_records = 100;
    ultr::pipeline::run_to_state(&cfg, &state, &mut crate::common::StopAfter(200, 0)).unwrap();
    let manifest = ultr::state::read_manifest(&state).unwrap();
    assert_eq!(manifest.open_window_starts().len(), 1, "the window is still open");
    // Re-send 100 of the same sessions (at other times within the window), then 50 new ones.
    let mut more = first.clone();
    more.extend((0..100).map(|i| line(&format!("s{i}"), t0 + 1_000 + i)));
    more.extend((300..350).map(|i| line(&format!("s{i}"), t0 + 2_000 + i)));
    std::fs::write(&path, more.join("\n") + "\n").unwrap();
    let report = ultr::pipeline::run_to_state(&cfg, &state, &mut ultr::pipeline::NoObserver).unwrap();
    assert_eq!(report.counters.duplicate_sessions, 100);
    assert_eq!(report.counters.sessions, 350);
    let manifest = ultr::state::read_manifest(&state).unwrap();
    assert_eq!(manifest.windows.iter().map(|w| w.sessions).sum::<u64>(), 350);
}

/// Regression (issue 37): the train summary called aggregated rows "sessions" ("51237 sessions"
/// for a log of 31,474 sessions).
#[test]
fn the_train_summary_names_aggregated_rows_as_rows() {
    let (raw, _) = raw_examples(2_000, 3);
    let agg = raw.aggregate(HOLDOUT);
    let cfg = TrainConfig { max_epochs: 2, ..config(1) };
    let (_, raw_report) = fit(&raw, &cfg, None, false).unwrap();
    let (_, agg_report) = fit(&agg, &cfg, None, false).unwrap();
    assert!(!raw_report.aggregated_rows && agg_report.aggregated_rows);
    let (raw_line, agg_line) = (raw_report.trained_line(), agg_report.trained_line());
    assert!(raw_line.contains(&format!("{} sessions / ", raw_report.train_sessions)), "{raw_line}");
    assert!(agg_line.contains(&format!("{} aggregated rows / ", agg_report.train_sessions)) && !agg_line.contains("sessions"), "{agg_line}");
}
