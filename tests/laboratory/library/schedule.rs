//! `ultr::service::schedule`: When a scheduled training runs or is skipped.

use ultr::config::PipelineConfig;
use ultr::monitor::metrics::Metrics;
use ultr::service::schedule::*;
use ultr::train::{train_from_state, TrainRequest};

/// Regression: the demo's first scheduled training fired 3 s after start, on ~6,000 sessions, and
/// promoted a model whose held-out residuals followed the policy (misspecification z ≈ 3 per window,
/// above 4 on 3 windows) until the next training a minute later.
#[test]
fn a_first_model_waits_for_min_sessions_and_a_warm_start_for_new_windows() {
    let few = ClosedData { newest_end_ms: Some(1_000), sessions: 6_000 };
    let enough = ClosedData { newest_end_ms: Some(1_000), sessions: 100_000 };
    let none = ClosedData { newest_end_ms: None, sessions: 0 };
    assert!(skip_reason(&none, None, false, 0).unwrap().contains("no closed windows"));
    let why = skip_reason(&few, None, true, 100_000).expect("a first model on 6,000 sessions waits");
    assert!(why.contains("6000 sessions") && why.contains("train.min_sessions"), "{why}");
    assert_eq!(skip_reason(&enough, None, true, 100_000), None);
    assert_eq!(skip_reason(&few, None, true, 0), None, "0 trains on any closed window");
    // With a current model the gate is passed; a warm start needs a newer window.
    assert_eq!(skip_reason(&few, Some(500), true, 100_000), None);
    assert!(skip_reason(&few, Some(1_000), true, 0).unwrap().contains("no window newer"));
    assert_eq!(skip_reason(&few, Some(1_000), false, 0), None, "a cold retraining always runs");
}

/// The count `min_sessions` is judged on, from a real ingest: 1,000 simulated sessions 100 ms
/// apart from a minute boundary (minutes 0 and 1 of 1-minute windows) and one 10 minutes later;
/// a file source closes every window at its end. The manifest's closed windows hold the 1,001
/// sessions of the file written here, the newest ending at minute 12, so `min_sessions` 1,002
/// skips a first model and 1,001 trains it; with no manifest nothing is closed.
#[test]
fn min_sessions_is_judged_on_the_closed_windows_of_a_real_ingest() {
    use ultr_simulate::{SimConfig, Simulator, SyntheticData};
    let dir = tempfile::tempdir().unwrap();
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 20, docs_per_query: 5, features: 2 },
        top_n: 5,
        sessions: 1_000,
        emit_features: false,
        ..SimConfig::default()
    })
    .unwrap();
    let (start, step) = (sim.config().start_ms, sim.config().interval_ms);
    assert_eq!(start % 60_000, 0, "the stream starts on a minute boundary");
    let mut lines = Vec::new();
    let mut buf = Vec::new();
    for i in 0..1_000 {
        sim.session(i, &mut buf);
        lines.push(String::from_utf8(buf.clone()).unwrap());
    }
    let mut last: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    last["session_id"] = "closer".into();
    last["event_time"] = (start + 999 * step + 10 * 60_000).into();
    lines.push(last.to_string());
    let in_file = lines.len();
    let data = dir.path().join("sessions.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let config = PipelineConfig::parse(&format!("[source.file]\npaths = [{data:?}]\n[window]\nsize = \"1m\"\n"), "test").unwrap();
    let state = dir.path().join("state");
    assert_eq!(ClosedData::of(None).sessions, 0);
    ultr::pipeline::run_to_state(&config, &state, &mut ultr::pipeline::NoObserver).unwrap();
    let manifest = ultr_core::state::read_manifest(&state).unwrap();
    let closed = ClosedData::of(Some(&manifest));
    assert_eq!(closed.sessions, in_file as u64, "closed windows: {:?}", manifest.windows.iter().map(|w| (w.start_ms, w.sessions)).collect::<Vec<_>>());
    assert_eq!(closed.newest_end_ms, Some(start + 12 * 60_000));
    assert!(skip_reason(&closed, None, false, 1_002).is_some_and(|why| why.contains("1001 sessions")));
    assert_eq!(skip_reason(&closed, None, false, 1_001), None);
}

/// Regression: θ has one writer, the monitor. On a promotion the schedule used to set the new
/// model's seen positions in `ultr_theta` while the others kept the old model's values until the
/// monitor loaded CURRENT (the status-page test read θ in that gap under load). Here a real
/// promoted outcome (6,000 simulated sessions ingested, a linear tower trained) is recorded over θ the
/// "monitor" set for 50 positions: the promotion is counted and every θ is left as it was.
#[test]
fn recording_a_promotion_counts_it_leaves_theta_to_the_monitor_and_a_judged_refusal_counts_below_logged_order() {
    use ultr_simulate::relevance::RelevanceKind;
    use ultr_simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
    let dir = tempfile::tempdir().unwrap();
    // The status-page test's stream (linear relevance, τ = 0.3): a linear tower beats position alone.
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 40, docs_per_query: 8, features: 4 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
        sessions: 6_000,
        seed: 31,
        ..SimConfig::default()
    })
    .unwrap();
    let data = dir.path().join("sessions.jsonl");
    sim.run(&mut ultr_core::sinks::jsonl::JsonlSink::create(&data).unwrap()).unwrap();
    let config =
        PipelineConfig::parse(&format!("[source.file]\npaths = [{data:?}]\n[window]\nsize = \"5m\"\n[train]\ntower = \"linear\"\nmax_epochs = 30\n"), "test")
            .unwrap();
    let state = dir.path().join("state");
    ultr::pipeline::run_to_state(&config, &state, &mut ultr::pipeline::NoObserver).unwrap();
    let outcome = train_from_state(&TrainRequest {
        state_dir: &state,
        core: &config.core(),
        config: &config.train,
        warm_start: false,
        compare_cold: false,
        force: true,
        progress: false,
        cancel: None,
        judged: None,
        truth_theta: None,
        context: &config.context(),
    })
    .unwrap();
    assert!(outcome.decision.promoted && !outcome.theta.is_empty(), "{:?}", outcome.decision);
    let metrics = Metrics::new();
    let monitors: Vec<f64> = (0..50).map(|k| -0.01 * k as f64).collect();
    metrics.set_theta(&monitors);
    let mut refused = outcome.clone();
    record_outcome(&metrics, &Ok(outcome));
    assert_eq!(metrics.trainings.with_label_values(&["promoted"]).get(), 1);
    let theta: Vec<f64> = (1..=50).map(|k| metrics.theta.with_label_values(&[&k.to_string()]).get()).collect();
    assert_eq!(theta, monitors, "θ is the monitor's, not the new model's seen positions");
    // The same candidate as the judged gate would record a refusal (`gate::team_ranking_checks`).
    assert_eq!(metrics.refused_below_logged_order.with_label_values(&["judged"]).get(), 0);
    refused.decision.promoted = false;
    refused.decision.judged = Some(ultr_train::checkpoint::JudgedGate {
        ranker: "combined".into(),
        queries: 10,
        ndcg10: 0.7,
        logged_ndcg10: 0.8,
        minus_logged: -0.1,
        minus_logged_low: -0.15,
        minus_logged_high: -0.05,
        refused: true,
    });
    record_outcome(&metrics, &Ok(refused));
    assert_eq!(metrics.refused_below_logged_order.with_label_values(&["judged"]).get(), 1);
    assert_eq!(metrics.refused_below_logged_order.with_label_values(&["clicks"]).get(), 0);
    assert_eq!(metrics.trainings.with_label_values(&["rejected"]).get(), 1);
    let text = metrics.render();
    assert!(text.contains("ultr_gate_judged_minus_logged_ndcg10 -0.1"), "{text}");
}
