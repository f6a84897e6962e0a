//! The simulator against its own ground truth: empirical CTR per position equals the analytic
//! expectation computed from the ground-truth file, within 3 standard errors.

use crate::common;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{Int64Type, UInt32Type};
use ultr::ingest::Ingest;
use ultr::session::DecodeLimits;
use ultr::simulate::click::{ClickModel, ClickModelKind};
use ultr::simulate::policy::{RankerKind, Sampling};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::source::SimulatorSource;
use ultr::simulate::{DataFormat, GroundTruth, PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::dead_letter::DeadLetterSink;
use ultr::window::position_ctr;

/// Simulates, decodes, runs sql/position_ctr.sql, and compares every position with the expectation
/// read back from the saved ground-truth file. Returns the largest |z|.
fn check_ctr_matches_truth(config: SimConfig) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let sim = std::sync::Arc::new(Simulator::new(config).unwrap());
    let truth_path = dir.path().join("truth.json");
    sim.truth().save(&truth_path).unwrap();
    let truth = GroundTruth::load(&truth_path).unwrap();

    let mut ingest = Ingest::new(SimulatorSource::new(sim.clone(), 0), DecodeLimits::default(), 8192);
    let mut dead = DeadLetterSink::discard();
    let batches = common::collect(&mut ingest, &mut dead);
    assert_eq!(dead.counts().total(), 0);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let ctr = rt.block_on(position_ctr(ultr::context::PipelineContext::default().statements(), batches)).unwrap();
    let expected = truth.expected_position_ctr().expect("closed form exists");
    let mut worst: f64 = 0.0;
    let mut positions = 0;
    for b in &ctr {
        let pos = b.column(0).as_primitive::<UInt32Type>();
        let imp = b.column(1).as_primitive::<Int64Type>();
        let clicks = b.column(2).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let k = pos.value(i) as usize;
            let n = imp.value(i) as f64;
            if n < 1000.0 {
                continue; // too few impressions for a normal approximation
            }
            let (p, _) = expected[k - 1];
            let se = (p * (1.0 - p) / n).sqrt();
            let z = (clicks.value(i) as f64 / n - p) / se;
            assert!(z.abs() < 3.0, "position {k}: ctr {:.5} vs expected {p:.5} (n = {n}, z = {z:.2})", clicks.value(i) as f64 / n);
            worst = worst.max(z.abs());
            positions += 1;
        }
    }
    assert!(positions >= 8, "only {positions} positions had enough impressions");
    worst
}

fn mq2008(click_model: ClickModelKind, tau: f64, sessions: u64) -> SimConfig {
    SimConfig {
        data: common::mq2008_files(),
        relevance: RelevanceKind::Labels,
        policy: PolicyConfig { ranker: RankerKind::Linear, tau, ..PolicyConfig::default() },
        click_model: ClickModel { kind: click_model, ..ClickModel::default() },
        sessions,
        seed: 2026,
        emit_features: false,
        ..SimConfig::default()
    }
}

#[test]
fn pbm_ctr_on_mq2008_matches_ground_truth() {
    let worst = check_ctr_matches_truth(mq2008(ClickModelKind::AdditivePbm, 0.0, 200_000));
    eprintln!("additive PBM, deterministic policy: max |z| = {worst:.2}");
}

#[test]
fn dcm_ctr_under_uniform_random_policy_matches_ground_truth() {
    let worst = check_ctr_matches_truth(mq2008(ClickModelKind::Dcm, 1.0, 200_000));
    eprintln!("DCM, uniform policy: max |z| = {worst:.2}");
}

#[test]
fn examination_pbm_and_mixture_with_partial_randomization_match_ground_truth() {
    check_ctr_matches_truth(mq2008(ClickModelKind::ExaminationPbm, 0.3, 100_000));
    check_ctr_matches_truth(mq2008(ClickModelKind::Mixture, 0.3, 100_000));
    check_ctr_matches_truth(mq2008(ClickModelKind::Dcm, 0.5, 100_000));
}

#[test]
fn mq2008_is_loaded_truncated_and_filtered_as_documented() {
    let sim = Simulator::new(mq2008(ClickModelKind::AdditivePbm, 0.0, 1)).unwrap();
    let t = sim.truth();
    assert_eq!(t.n_features, 46);
    assert_eq!(t.label_max, Some(2.0));
    // 564 of the 784 queries have a relevant document.
    assert_eq!(t.queries.len(), 564);
    assert!(t.queries.iter().all(|q| q.docs.len() <= 25 && q.docs.iter().any(|d| d.label.unwrap() > 0.0)));
    assert!(t.queries.iter().all(|q| {
        let mut r = q.logging_ranking.clone();
        r.sort_unstable();
        r == (0..q.docs.len()).collect::<Vec<_>>()
    }));
    // A strong policy puts more relevant documents first: mean relevance at rank 1 beats rank 8.
    let mean_at = |k: usize| {
        let qs: Vec<_> = t.queries.iter().filter(|q| q.docs.len() > k).collect();
        qs.iter().map(|q| q.docs[q.logging_ranking[k]].relevance).sum::<f64>() / qs.len() as f64
    };
    assert!(mean_at(0) > mean_at(7) + 0.5, "rank 1 {:.2} vs rank 8 {:.2}", mean_at(0), mean_at(7));
}

#[test]
fn lightgbm_format_with_query_file_loads() {
    let dir = common::data_dir().join("lightgbm-rank");
    let sim = Simulator::new(SimConfig {
        data: vec![dir.join("rank.train")],
        format: DataFormat::Lightgbm,
        relevance: RelevanceKind::Labels,
        policy: PolicyConfig { ranker: RankerKind::Linear, ..PolicyConfig::default() },
        sessions: 10,
        ..SimConfig::default()
    })
    .unwrap();
    let t = sim.truth();
    assert_eq!(t.label_max, Some(4.0));
    assert!(t.n_features >= 250 && t.n_features <= 300, "{}", t.n_features);
    assert!(t.queries.len() <= 201 && t.queries.len() > 150);
    let mut buf = Vec::new();
    sim.session(0, &mut buf);
    assert!(ultr::session::Decoder::new(DecodeLimits::default()).decode(&buf).is_ok());
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let config = SimConfig {
        synthetic: SyntheticData { queries: 50, docs_per_query: 10, features: 5 },
        relevance: RelevanceKind::Mlp,
        policy: PolicyConfig { sampling: Sampling::PlackettLuce, ..PolicyConfig::default() },
        click_model: ClickModel { kind: ClickModelKind::Cpm, ..ClickModel::default() },
        sessions: 200,
        ..SimConfig::default()
    };
    let render = |c: &SimConfig| {
        let sim = Simulator::new(c.clone()).unwrap();
        (0..200)
            .map(|i| {
                let mut b = Vec::new();
                sim.session(i, &mut b);
                b
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(render(&config), render(&config));
    assert_ne!(render(&config), render(&SimConfig { seed: 2, ..config.clone() }));
}

/// `duplicate_rate = 0.1`: every page lists at most one document twice, the repeat after its first
/// listing, and the share of pages with a repeat is within 4 binomial standard deviations of 0.1
/// (n = 4,000: ±0.019); at the default rate 0 no page repeats a document.
#[test]
fn duplicate_rate_repeats_one_document_on_that_share_of_pages() {
    let pages_with_repeats = |rate: f64| {
        let sim = Simulator::new(SimConfig {
            synthetic: SyntheticData { queries: 50, docs_per_query: 10, features: 2 },
            top_n: 10,
            emit_features: false,
            duplicate_rate: rate,
            ..SimConfig::default()
        })
        .unwrap();
        let mut repeated = 0u64;
        let mut buf = Vec::new();
        for i in 0..4000 {
            sim.session(i, &mut buf);
            let page: serde_json::Value = serde_json::from_slice(&buf).unwrap();
            let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|it| it["doc_id"].as_str().unwrap()).collect();
            let distinct: std::collections::HashSet<&str> = ids.iter().copied().collect();
            assert!(ids.len() - distinct.len() <= 1, "session {i} repeats more than one document: {ids:?}");
            repeated += (ids.len() - distinct.len()) as u64;
        }
        repeated as f64 / 4000.0
    };
    assert_eq!(pages_with_repeats(0.0), 0.0);
    let share = pages_with_repeats(0.1);
    let sd = (0.1f64 * 0.9 / 4000.0).sqrt();
    assert!((share - 0.1).abs() < 4.0 * sd, "{share:.4} of pages repeat a document, expected 0.1 ± {:.4}", 4.0 * sd);
}

#[test]
fn synthetic_relevance_is_rescaled_to_0_4_by_percentiles() {
    for kind in [RelevanceKind::Linear, RelevanceKind::Mlp] {
        let sim = Simulator::new(SimConfig {
            synthetic: SyntheticData { queries: 400, docs_per_query: 25, features: 46 },
            relevance: kind,
            sessions: 1,
            ..SimConfig::default()
        })
        .unwrap();
        let mut rel: Vec<f64> = sim.truth().queries.iter().flat_map(|q| q.docs.iter().map(|d| d.relevance)).collect();
        rel.sort_by(f64::total_cmp);
        let pct = |p: f64| rel[(p * (rel.len() - 1) as f64) as usize];
        // 5th and 95th percentiles land on 0 and 4; the tails are not clipped (a clip would make
        // "linear" relevance non-linear).
        assert!(pct(0.05).abs() < 0.05 && (pct(0.95) - 4.0).abs() < 0.05, "{kind:?}: p5 {} p95 {}", pct(0.05), pct(0.95));
        assert!(rel.iter().any(|r| *r < 0.0) && rel.iter().any(|r| *r > 4.0));
        assert!((pct(0.5) - 2.0).abs() < 0.6, "{kind:?}: median {}", pct(0.5));
    }
}

#[test]
fn logged_propensities_match_epsilon_greedy() {
    let tau = 0.4;
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 20, docs_per_query: 8, features: 4 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau, ..PolicyConfig::default() },
        log_propensity: true,
        sessions: 50,
        ..SimConfig::default()
    })
    .unwrap();
    let mut buf = Vec::new();
    for i in 0..50 {
        sim.session(i, &mut buf);
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        for item in v["items"].as_array().unwrap() {
            let p = item["propensity"].as_f64().unwrap();
            let uniform = tau / 8.0;
            assert!((p - uniform).abs() < 1e-12 || (p - (1.0 - tau + uniform)).abs() < 1e-12, "{p}");
        }
    }
}

/// `ultr simulate` with only `--sessions` simulates `SimConfig::default()` with that many sessions:
/// its flags' defaults are read from the simulator's, and the ground truth it writes records the
/// config it ran, which equals the library's default field for field.
#[test]
fn ultr_simulate_without_flags_runs_the_simulators_default_config() {
    use crate::common::OutputWithin;

    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("truth.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["simulate", "--sessions", "20", "--out"])
        .arg(dir.path().join("sessions.jsonl"))
        .arg("--truth")
        .arg(&truth)
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(GroundTruth::load(&truth).unwrap().config, SimConfig { sessions: 20, ..SimConfig::default() });
}
