//! `ultr::service::status_page`: The status page: exposition parsing, the conditions it judges, its markup.

use std::collections::BTreeMap;
use ultr::monitor::board::BoardState;
use ultr::monitor::metrics::Metrics;
use ultr::service::status_page::*;

#[test]
fn exposition_lines_parse_with_escaped_labels() {
    let text = "# HELP x y\n# TYPE x gauge\nultr_theta{position=\"2\"} -0.625\nultr_bad_records_total{reason=\"a \\\"b\\\" \\\\ c\\nd\"} 3\nultr_misspecification_z{model=\"mlp\"} NaN\nultr_records_total 12\n";
    let s = parse_exposition(text);
    assert_eq!(s.len(), 4);
    assert_eq!(s[0].name, "ultr_theta");
    assert_eq!(s[0].labels["position"], "2");
    assert_eq!(s[0].value, -0.625);
    assert_eq!(s[1].labels["reason"], "a \"b\" \\ c\nd");
    assert!(s[2].value.is_nan());
    assert_eq!((s[3].name.as_str(), s[3].labels.len(), s[3].value), ("ultr_records_total", 0, 12.0));
}

/// The page reads the registry's own exposition: every series `Metrics` writes parses back to
/// the value it holds.
#[test]
fn the_registrys_exposition_parses_back_to_its_values() {
    let m = Metrics::new();
    m.set_theta(&[0.0, -0.5, -1.25]);
    m.bad_records.with_label_values(&["bad \"json\" <x>"]).inc_by(7);
    m.set_theta_intervals(Some(([0.0, -0.7, -1.5].as_slice(), [0.0, -0.3, -1.0].as_slice())));
    let series = Series::new(parse_exposition(&m.render()));
    assert_eq!(series.by_position("ultr_theta", &[]), BTreeMap::from([(1, 0.0), (2, -0.5), (3, -1.25)]));
    assert_eq!(series.get("ultr_bad_records_total", &[("reason", "bad \"json\" <x>")]), Some(7.0));
    assert_eq!(series.get("ultr_theta_interval", &[("position", "3"), ("bound", "lower")]), Some(-1.5));
    m.set_theta_intervals(None);
    assert_eq!(Series::new(parse_exposition(&m.render())).all("ultr_theta_interval").count(), 0);
}

/// The typed series the page judges (`Metrics::series`, read from the registry's metric
/// families) are exactly the samples of the text `/metrics` serves, read back by the exposition
/// parser: the same names, labels and values (NaN included), a histogram's buckets, sum and count.
#[test]
fn the_typed_series_are_the_text_expositions_samples() {
    let m = Metrics::new();
    m.set_theta(&[0.0, -0.5, -1.25]);
    m.bad_records.with_label_values(&["bad \"json\" <x>"]).inc_by(7);
    m.window_close_seconds.observe(0.3);
    m.window_close_seconds.observe(42.0);
    m.misspecification_z.with_label_values(&["mlp"]).set(f64::NAN);
    let key = |s: &Sample| (s.name.clone(), s.labels.clone(), s.value.to_bits());
    let mut typed: Vec<_> = m.series().samples().iter().map(key).collect();
    let mut text: Vec<_> = parse_exposition(&m.render()).iter().map(key).collect();
    typed.sort();
    text.sort();
    assert_eq!(typed, text);
    assert!(typed.iter().any(|(n, l, _)| n == "ultr_window_close_seconds_bucket" && l.get("le").map(String::as_str) == Some("+Inf")));
    assert_eq!(m.series().get("ultr_window_close_seconds_count", &[]), Some(2.0));
}

#[test]
fn escape_leaves_no_markup() {
    let hostile = "<script>alert('x')</script>\"&";
    let e = escape(hostile);
    assert_eq!(e, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;");
    assert!(!e.contains(['<', '>', '"', '\'']));
}

/// Each condition holds on values past its threshold and not on values short of it.
#[test]
fn conditions_follow_the_rules_thresholds() {
    let now = 2.0e9;
    let page = |text: &str| conditions(&Series::new(parse_exposition(text)), &BoardState::default(), now).into_iter().map(|c| c.alert).collect::<Vec<_>>();
    let healthy = format!(
        "ultr_identified{{model=\"mlp\"}} 1\nultr_overlap_bottleneck 0.3\nultr_misspecification_z{{model=\"mlp\"}} 3.9\nultr_misspecification_assessable{{model=\"mlp\"}} 1\n\
         ultr_logged_propensity_disagrees 0\nultr_residual_psi 0.19\nultr_residual_page_hinkley 0.4\nultr_current_model_created_timestamp_seconds {}\n\
         ultr_kafka_consumer_lag_messages{{topic=\"t\",partition=\"0\"}} 100000\nultr_source_up 1\nultr_monitor_last_success_timestamp_seconds {}\nultr_monitor_errors_total 2\nultr_monitor_last_error_timestamp_seconds {}\n\
         ultr_judged_ndcg_difference{{model=\"mlp\",baseline=\"logged\",k=\"10\",bound=\"upper\"}} 0.001\n\
         ultr_judged_ndcg_difference{{model=\"mlp\",baseline=\"logged\",k=\"10\",bound=\"estimate\"}} -0.01\n\
         ultr_judged_ndcg_difference{{model=\"mlp\",baseline=\"logged\",k=\"1\",bound=\"upper\"}} -0.01\n",
        now - 25.0 * 3600.0,
        now - 1801.0,
        now - 1801.0
    );
    // The monitor has not passed for 30 min but its last error is older than increase()'s 30 min.
    assert!(page(&healthy).is_empty(), "{:?}", page(&healthy));
    let sick = format!(
        "ultr_identified{{model=\"mlp\"}} 0\nultr_overlap_bottleneck 0.2\nultr_misspecification_z{{model=\"mlp\"}} 4.1\nultr_misspecification_assessable{{model=\"mlp\"}} 0\n\
         ultr_logged_propensity_disagrees 1\nultr_residual_psi 0.21\nultr_residual_page_hinkley 0.4\nultr_current_model_created_timestamp_seconds {}\n\
         ultr_kafka_consumer_lag_messages{{topic=\"t\",partition=\"0\"}} 100001\nultr_source_up 0\nultr_monitor_last_success_timestamp_seconds {}\nultr_monitor_errors_total 2\nultr_monitor_last_error_timestamp_seconds {}\n\
         ultr_judged_ndcg_difference{{model=\"mlp\",baseline=\"naive_ctr\",k=\"10\",bound=\"upper\"}} -0.001\n",
        now - 27.0 * 3600.0,
        now - 1801.0,
        now - 60.0
    );
    let mut fired = page(&sick);
    fired.sort();
    // A model exists, so ModelMissing cannot hold beside TrainingStale; IngestErrorsHigh reads the
    // board (below). Every other rule this fixture was written for holds.
    let mut expected = vec![
        "ConsumerLagHigh",
        "FeatureOverlapLow",
        "IdentifiabilityLost",
        "JudgedRankingBelowBaseline",
        "KafkaSourceDown",
        "LoggedPropensityMismatch",
        "MisspecificationSuspected",
        "MisspecificationUnassessable",
        "MonitorFailing",
        "ResidualDrift",
        "TrainingStale",
    ];
    expected.sort();
    assert_eq!(fired, expected);
    // No model: nothing a day after start, ModelMissing (not TrainingStale) after 26 h.
    let no_model = |hours: f64| page(&format!("ultr_start_timestamp_seconds {}\n", now - hours * 3600.0));
    // Connected but imprecise is the identifiability alert too.
    assert_eq!(page("ultr_identified{model=\"embedding\"} 1\nultr_weakly_identified{model=\"embedding\"} 1\n"), vec!["IdentifiabilityLost"]);
    assert!(page("ultr_identified{model=\"embedding\"} 1\nultr_weakly_identified{model=\"embedding\"} 0\n").is_empty());
    assert!(no_model(25.0).is_empty());
    assert_eq!(no_model(27.0), vec!["ModelMissing"]);
    // The dead-letter share: 2% of records over the samples' 5 minutes fires, 0.5% does not.
    let mut board = BoardState::default();
    let s = |t: f64, records: u64, bad: u64| ultr::monitor::board::CounterSample { unix_s: t, records, sessions: records, bad_records: bad };
    board.samples.extend([s(now - 200.0, 1000, 0), s(now, 2000, 20)]);
    assert_eq!(conditions(&Series::new(vec![]), &board, now)[0].alert, "IngestErrorsHigh");
    board.samples = [s(now - 200.0, 1000, 0), s(now, 2000, 5)].into();
    assert!(conditions(&Series::new(vec![]), &board, now).is_empty());
}

/// Wherever a rule's promtool scenario (the generated `pipelines/alerts.test.yml`) has it firing,
/// the page lists it with its severity on the same values at the same time; 27 h into the fresh
/// start it lists on each instance exactly the rules the catalog says fire there. So each rule's
/// PromQL and the page's verdict agree on every case promtool runs, a new rule's included.
#[test]
fn the_page_lists_each_alert_where_its_promtool_scenario_fires_and_only_those_on_a_fresh_start() {
    use super::scenario_values::{exported, minutes};
    use ultr::monitor::signals::{alert_rules, fresh_start_inputs, FRESH_START_CHECKS};
    for rule in alert_rules() {
        let firing: Vec<_> = rule.scenarios.iter().flat_map(|s| s.checks.iter().filter_map(move |(at, f)| Some((s, *at, f.as_ref()?)))).collect();
        assert!(!firing.is_empty() || rule.fresh_start.is_some(), "{} has no case in which it fires", rule.name);
        for (scenario, at, fired) in firing {
            let instance = fired.labels.iter().find(|(k, _)| *k == "instance").map(|(_, v)| *v).unwrap();
            let (series, board) = exported(&scenario.series, instance, minutes(at));
            let listed = conditions(&series, &board, minutes(at) as f64 * 60.0);
            assert!(
                listed.iter().any(|c| c.alert == rule.name && c.severity == rule.severity.as_str()),
                "{} fires at {at} in promtool's scenario; the page lists {listed:?}",
                rule.name
            );
        }
    }
    let later = minutes(FRESH_START_CHECKS[1]);
    for instance in ["fresh", "trained"] {
        let (series, board) = exported(&fresh_start_inputs(), instance, later);
        let mut listed: Vec<&str> = conditions(&series, &board, later as f64 * 60.0).into_iter().map(|c| c.alert).collect();
        let mut expected: Vec<&str> =
            alert_rules().iter().filter(|r| r.fresh_start.as_ref().is_some_and(|f| f.labels.contains(&("instance", instance)))).map(|r| r.name).collect();
        listed.sort();
        expected.sort();
        assert_eq!(listed, expected, "the fresh start's {instance} instance");
    }
}

/// The page judges at the signals catalog's thresholds, from which `pipelines/alerts.yml` is
/// generated: a series just past a threshold fires its alert with the catalog's severity, one
/// just short of it does not; MonitorFailing needs an error within its span.
#[test]
fn the_page_fires_at_the_catalogs_thresholds_and_not_short_of_them() {
    use ultr::monitor::signals::threshold;
    let now = 2.0e9;
    let judged = |text: String| {
        conditions(&Series::new(parse_exposition(&text)), &BoardState::default(), now).into_iter().map(|c| (c.alert, c.severity)).collect::<Vec<_>>()
    };
    let (b, z) = (threshold::OVERLAP_BOTTLENECK, threshold::MISSPECIFICATION_Z);
    let text = |b: f64, z: f64| format!("ultr_overlap_bottleneck {b}\nultr_misspecification_z{{model=\"m\"}} {z}\n");
    assert_eq!(judged(text(b - 0.01, z + 0.01)), vec![("FeatureOverlapLow", "info".to_string()), ("MisspecificationSuspected", "warning".to_string())]);
    assert!(judged(text(b + 0.01, z - 0.01)).is_empty());
    let span = f64::from(threshold::MONITOR_FAILING_MINUTES) * 60.0;
    let failing = |error_ago: f64| {
        judged(format!("ultr_monitor_last_success_timestamp_seconds {}\nultr_monitor_last_error_timestamp_seconds {}\n", now - 2.0 * span, now - error_ago))
            .len()
    };
    assert_eq!((failing(span + 60.0), failing(span - 60.0)), (0, 1), "an error outside the span, then inside it");
}

#[test]
fn the_page_escapes_log_strings_and_shows_exported_theta() {
    let m = Metrics::new();
    m.set_theta(&[0.0, -0.69]);
    m.identified.with_label_values(&["mlp"]).set(1);
    m.bad_records.with_label_values(&["<b>reason</b>"]).inc();
    let dir = tempfile::tempdir().unwrap();
    let letters = dir.path().join("dead.jsonl");
    let line = ultr_core::sinks::dead_letter::DeadLetterLine {
        reason: "duplicate_position".into(),
        detail: "<img src=x>".into(),
        source: "f".into(),
        partition: 0,
        offset: 3,
        payload: Some(r#"{"query_id":"<script>alert(1)</script>","session_id":"s"}"#.into()),
        payload_base64: None,
        payload_bytes: 10,
        payload_sha256: String::new(),
        truncated: false,
    };
    std::fs::write(&letters, serde_json::to_string(&line).unwrap() + "\n").unwrap();
    let board = BoardState { dead_letter_file: Some(letters), ..Default::default() };
    let page = render(&m.series(), &board, 2.0e9);
    assert!(!page.contains("<script>") && !page.contains("<img") && !page.contains("<b>reason"));
    assert!(page.contains("<td class=\"query-id\">&lt;script&gt;alert(1)&lt;/script&gt;</td>"));
    assert!(page.contains("data-position=\"2\" data-value=\"-0.69\""));
    assert!(page.contains("id=\"theta-plot\""));
    assert!(!page.contains("id=\"swap-graph\""), "no graph is drawn before a window closed");
    assert!(page.contains("id=\"verdict-identified\" data-value=\"1\""));
}

/// The last training's combination of the logged order with the clicks shows as a table: the
/// weight chosen, one row per non-empty click-volume bucket with its queries and shares, and a
/// held-out gain whose interval lies below 0 marked as a warning.
#[test]
fn the_page_shows_where_the_clicks_move_the_logged_order() {
    use ultr_train::logged_order_combination::{Combination, VolumeBucket, Weight};
    let bucket = |low: u64, high: Option<u64>, queries: usize, gain: f64| VolumeBucket {
        clicks_low: low,
        clicks_high: high,
        queries,
        moved_share: 0.5,
        discordant_share: 0.125,
        heldout_impressions: if queries > 0 { 100.0 } else { 0.0 },
        heldout_gain: gain,
        heldout_gain_se: 0.001,
    };
    let combination = Combination {
        chosen: Weight::Kappa(10.0),
        most_likely: Weight::Kappa(1.0),
        candidates: Vec::new(),
        prior_by_rank: Vec::new(),
        pairs: 42,
        by_click_volume: vec![bucket(0, Some(1), 0, 0.0), bucket(1, Some(10), 7, 0.004), bucket(10, Some(100), 3, -0.01)],
    };
    let board = ultr::monitor::board::Board::default();
    board.push_training(ultr::monitor::board::TrainingCard {
        finished_unix_s: 2.0e9,
        id: Some("m1".into()),
        result: "promoted".into(),
        reason: "first model".into(),
        theta: vec![0.0, -0.5],
        seconds: 1.0,
        warm_start: false,
        combination: Some(combination),
    });
    let page = render(&Metrics::new().series(), &board.snapshot(), 2.0e9);
    assert!(page.contains("id=\"combination\"") && page.contains("κ = 10 chosen by held-out clicks (most likely: κ = 1), 42 pairs"), "{page}");
    assert!(page.contains("<tr><td>1–9</td><td>7</td><td>50.0%</td><td>12.5%</td><td class=\"ok\">+0.00400 ± 0.00100</td></tr>"), "{page}");
    assert!(page.contains("<td class=\"warn\">-0.01000 ± 0.00100</td>"), "{page}");
    assert!(!page.contains("<tr><td>0–0</td>"), "an empty bucket has no row");
}

/// At 20 positions the heat map draws one cell per position pair (400), a pair's swap count in
/// its cell's title, the pair never swapped at the palest shade, and one interval-width bar per
/// position with a width.
#[test]
fn the_swap_heat_map_shows_every_position_pair_and_each_interval_width() {
    let mut text = String::new();
    for a in 1..=20u32 {
        for b in a + 1..=20 {
            if (a, b) != (19, 20) {
                text.push_str(&format!("ultr_swap_pairs{{position_a=\"{a}\",position_b=\"{b}\"}} {}\n", 1000 / (b - a)));
            }
        }
        text.push_str(&format!("ultr_theta_interval_width{{position=\"{a}\"}} {}\n", 0.1 * a as f64));
    }
    let page = render(&Series::new(parse_exposition(&text)), &BoardState::default(), 2.0e9);
    assert_eq!(page.matches("class=\"swap-cell\"").count(), 400);
    assert!(page.contains("<title>1–2: 1000 swap pairs</title>"), "{page}");
    assert!(page.contains("fill=\"rgba(9,105,218,0.04)\"><title>19–20: 0 swap pairs</title>"));
    assert_eq!(page.matches("class=\"interval-width\"").count(), 20);
    assert!(page.contains("<title>θ20: 95% interval width 2.00</title>"));
}
