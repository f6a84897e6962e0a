//! `ultr::monitor::board`: The status board's counters and rates.

use ultr::monitor::board::*;

#[test]
fn rate_uses_the_samples_inside_the_span_and_needs_two() {
    let s = |t: f64, n: u64| CounterSample { unix_s: t, records: n, sessions: n / 2, bad_records: 0 };
    let mut state = BoardState::default();
    assert_eq!(state.rate(60.0, |c| c.records), None);
    state.samples.push_back(s(0.0, 0));
    assert_eq!(state.rate(60.0, |c| c.records), None);
    state.samples.push_back(s(100.0, 1000));
    state.samples.push_back(s(110.0, 1500));
    // Only 100 s and 110 s lie within 60 s of the newest sample.
    assert_eq!(state.rate(60.0, |c| c.records), Some(50.0));
    assert_eq!(state.rate(200.0, |c| c.sessions), Some(750.0 / 110.0));
}

#[test]
fn trainings_keep_the_newest() {
    let board = Board::default();
    for i in 0..TRAININGS_KEPT + 3 {
        board.push_training(TrainingCard {
            finished_unix_s: i as f64,
            id: Some(format!("m{i}")),
            result: "promoted".into(),
            reason: String::new(),
            theta: vec![],
            seconds: 1.0,
            warm_start: false,
            combination: None,
        });
    }
    let s = board.snapshot();
    assert_eq!(s.trainings.len(), TRAININGS_KEPT);
    assert_eq!(s.trainings.back().unwrap().id.as_deref(), Some(format!("m{}", TRAININGS_KEPT + 2).as_str()));
    assert_eq!(s.trainings.front().unwrap().id.as_deref(), Some("m3"));
}
