//! Regression tests for production-shaped inputs on file sources: a far-future event time, an
//! outlier within the skew, a missing or truncated state file, a restart whose first record has
//! another feature dimension, two writers on one state, and dead letters that are capped and rotated.

use crate::common;

use std::path::{Path, PathBuf};

use common::final_counts;
use ultr::config::PipelineConfig;
use ultr::pipeline::{run_to_state, NoObserver};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::dead_letter::{read_dead_letters, sha256_hex};
use ultr::sinks::jsonl::JsonlSink;
use ultr::state::read_manifest;

const FAR_FUTURE: &str = r#"{"schema_version":1,"session_id":"from-the-future","query_id":"q0","event_time":"9999-12-31T00:00:00Z","policy_id":"p","items":[{"doc_id":"d0","position":1,"clicked":false,"features":[0.1,0.2,0.3]}]}"#;

/// 6,000 simulated sessions (100 ms apart, 3 features) as JSONL lines.
fn session_lines(dir: &Path) -> Vec<String> {
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 60, docs_per_query: 12, features: 3 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
        sessions: 6_000,
        seed: 23,
        ..SimConfig::default()
    })
    .unwrap();
    let path = dir.join("base.jsonl");
    sim.run(&mut JsonlSink::create(&path).unwrap()).unwrap();
    std::fs::read_to_string(&path).unwrap().lines().map(str::to_string).collect()
}

/// A session of query `q0` at `time` (RFC 3339): d0 clicked at position 1, d1 not at position 2.
fn two_item_session(id: &str, time: &str) -> String {
    format!(
        r#"{{"schema_version":1,"session_id":"{id}","query_id":"q0","event_time":"{time}","policy_id":"p","items":[{{"doc_id":"d0","position":1,"clicked":true,"features":[0.1,0.2,0.3]}},{{"doc_id":"d1","position":2,"clicked":false,"features":[0.3,0.2,0.1]}}]}}"#
    )
}

fn write_lines(path: &Path, lines: &[String]) -> PathBuf {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
    path.to_path_buf()
}

fn config(file: &Path, window_extra: &str, extra: &str) -> PipelineConfig {
    let text = format!(
        "batch_records = 200\n[source.file]\npaths = [{:?}]\n[window]\nsize = \"1m\"\nallowed_lateness = \"10s\"\n{window_extra}\n[state]\ncheckpoint_every_records = 1000\n{extra}",
        file.display().to_string()
    );
    PipelineConfig::parse(&text, "test.toml").unwrap()
}

/// The 6,000-session stream, and the same with a year-9999 session in the middle.
fn clean_and_spoiled(dir: &Path) -> (PathBuf, PathBuf) {
    let lines = session_lines(dir);
    let clean = write_lines(&dir.join("clean.jsonl"), &lines);
    let mut spoiled_lines = lines;
    spoiled_lines.insert(3_000, FAR_FUTURE.to_string());
    (clean, write_lines(&dir.join("spoiled.jsonl"), &spoiled_lines))
}

fn ingest(config: &PipelineConfig, state: &Path) -> ultr::pipeline::RunReport {
    run_to_state(config, state, &mut NoObserver).unwrap()
}

#[test]
fn a_far_future_event_time_is_refused_and_destroys_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (clean, spoiled) = clean_and_spoiled(dir.path());

    let clean_state = dir.path().join("clean-state");
    let spoiled_state = dir.path().join("spoiled-state");
    let clean_report = ingest(&config(&clean, "", ""), &clean_state);
    let report = ingest(&config(&spoiled, "", ""), &spoiled_state);

    assert_eq!(report.dead_letters.get("future_event_time"), Some(&1), "{:?}", report.dead_letters);
    assert_eq!(report.counters.late_sessions, 0, "no valid session may be declared late");
    assert_eq!(report.counters.sessions, clean_report.counters.sessions);
    let letters = read_dead_letters(&spoiled_state.join("dead-letters.jsonl")).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, "future_event_time");
    assert_eq!(letters[0].original_bytes().unwrap(), FAR_FUTURE.as_bytes());
    let manifest = read_manifest(&spoiled_state).unwrap();
    assert!(manifest.windows.len() >= 10, "every regular window is kept, got {}", manifest.windows.len());
    let (want_rows, _) = final_counts(&clean_state);
    let (got_rows, _) = final_counts(&spoiled_state);
    assert_eq!(got_rows, want_rows, "cumulative π equals the stream without the bad record");
}

/// Regression (issue 55): a file replay's future-time guard was the newest event time accepted
/// from the file, so a past log with gaps of days was refused after its first session (31,473 of
/// 31,474 CLARA 2 sessions). Four past sessions 10 to 100 days apart are all accepted at the default
/// `max_clock_skew`, and a year-9999 session behind them is still refused. (Issue 55 too: a page
/// listing one `doc_id` twice keeps its page, less the repeat, which is counted.)
#[test]
fn a_past_log_with_gaps_of_days_replays_whole_at_the_default_skew() {
    let dir = tempfile::tempdir().unwrap();
    let at = two_item_session;
    let lines = vec![
        at("s1", "2025-01-01T00:00:00Z"),
        at("s2", "2025-01-11T00:00:00Z"),
        at("s3", "2025-02-20T00:00:00Z"),
        at("s4", "2025-06-01T00:00:00Z"),
        FAR_FUTURE.to_string(),
        // A page listing d0 twice: kept, less the repeat, and the repeat counted.
        r#"{"schema_version":1,"session_id":"s5","query_id":"q0","event_time":"2025-06-01T00:00:01Z","policy_id":"p","items":[{"doc_id":"d0","position":1,"clicked":false,"features":[0.1,0.2,0.3]},{"doc_id":"d1","position":2,"clicked":false,"features":[0.3,0.2,0.1]},{"doc_id":"d0","position":3,"clicked":true,"features":[0.1,0.2,0.3]}]}"#.to_string(),
    ];
    let file = write_lines(&dir.path().join("past.jsonl"), &lines);
    let report = ingest(&config(&file, "", ""), &dir.path().join("state"));
    assert_eq!(report.counters.sessions, 5, "{:?}", report.dead_letters);
    assert_eq!((report.counters.impressions, report.counters.repeated_items), (10, 1));
    assert_eq!(report.dead_letters.get("future_event_time"), Some(&1), "{:?}", report.dead_letters);
    assert_eq!(report.dead_letters.values().sum::<u64>(), 1, "{:?}", report.dead_letters);
}

/// A replay that runs ahead of the wall clock (a simulated log) is judged against its own newest
/// event time: eleven sessions climbing from now to now + 5 h in 30-minute steps are all accepted at
/// the default `max_clock_skew` (1 h), and one 3 h past the last of them is refused as
/// `future_event_time`. Regression test for a mutant cargo-mutants found surviving (the decoder's
/// last accepted event time answered `None`, so the replay's clock never moved and every session
/// past now + 1 h was refused).
#[test]
fn a_replay_ahead_of_the_wall_clock_moves_its_own_reference_by_at_most_the_skew() {
    let dir = tempfile::tempdir().unwrap();
    let now = chrono::Utc::now();
    let at = |id: &str, minutes: i64| two_item_session(id, &(now + chrono::Duration::minutes(minutes)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let mut lines: Vec<String> = (0..=10).map(|i| at(&format!("s{i}"), 30 * i)).collect();
    lines.push(at("jump", 300 + 180));
    let file = write_lines(&dir.path().join("ahead.jsonl"), &lines);
    let report = ingest(&config(&file, "", ""), &dir.path().join("state"));
    assert_eq!(report.counters.sessions, 11, "{:?}", report.dead_letters);
    assert_eq!(report.dead_letters.get("future_event_time"), Some(&1), "{:?}", report.dead_letters);
    assert_eq!(report.dead_letters.values().sum::<u64>(), 1, "{:?}", report.dead_letters);
}

#[test]
fn an_outlier_within_the_skew_moves_the_watermark_by_at_most_the_jump_and_retention_keeps_the_windows() {
    let dir = tempfile::tempdir().unwrap();
    let (clean, spoiled) = clean_and_spoiled(dir.path());
    // The decoder's guard is opened wide, so only the operator's jump bound and watermark-based
    // retention stand between the outlier and the state.
    let extra = "[decode]\nmax_clock_skew = \"3660000d\"\n";
    let jump = "max_partition_clock_jump = \"1m\"";
    let clean_state = dir.path().join("clean-state");
    let spoiled_state = dir.path().join("spoiled-state");
    let clean_report = ingest(&config(&clean, jump, extra), &clean_state);
    let report = ingest(&config(&spoiled, jump, extra), &spoiled_state);
    assert_eq!(clean_report.counters.late_sessions, 0);
    // One minute of jump closes at most the current window early: at most two windows' sessions
    // (600 each) turn late, instead of all 3,000 after the outlier.
    assert!(report.counters.late_sessions <= 1_200, "late sessions {}", report.counters.late_sessions);
    let regular =
        |state: &Path| -> Vec<i64> { read_manifest(state).unwrap().windows.iter().filter(|w| w.end_ms < 100_000_000_000_000).map(|w| w.start_ms).collect() };
    assert_eq!(regular(&spoiled_state), regular(&clean_state), "retention keeps every regular window");
    let manifest = read_manifest(&spoiled_state).unwrap();
    let in_horizon = ultr::state::cumulative::windows_in_horizon(&manifest, 28 * 86_400_000);
    assert!(in_horizon.len() >= regular(&clean_state).len(), "the lookback horizon still holds the regular windows");
}

#[test]
fn a_missing_or_truncated_state_file_is_an_error_naming_it_not_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let lines = session_lines(dir.path());
    let file = write_lines(&dir.path().join("s.jsonl"), &lines);
    let state = dir.path().join("state");
    ingest(&config(&file, "", ""), &state);
    let manifest = read_manifest(&state).unwrap();
    let w = &manifest.windows[2];
    let victim = state.join("windows").join(&w.dir).join("propensity_counts.parquet");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(ultr::state::cumulative::compute(&ultr::context::PipelineContext::default(), &state, &manifest, i64::MAX / 4)).expect("intact state reads");

    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() / 2]).unwrap();
    let err = format!(
        "{:#}",
        rt.block_on(ultr::state::cumulative::compute(&ultr::context::PipelineContext::default(), &state, &manifest, i64::MAX / 4)).err().expect("an error")
    );
    assert!(err.contains("propensity_counts.parquet") && err.contains("truncated"), "{err}");

    std::fs::remove_file(&victim).unwrap();
    let err = format!(
        "{:#}",
        rt.block_on(ultr::state::cumulative::compute(&ultr::context::PipelineContext::default(), &state, &manifest, i64::MAX / 4)).err().expect("an error")
    );
    assert!(err.contains("propensity_counts.parquet") && err.contains("missing"), "{err}");
}

#[test]
fn a_restart_keeps_the_feature_dimension_the_state_locked() {
    let dir = tempfile::tempdir().unwrap();
    let lines = session_lines(dir.path());
    let file = dir.path().join("s.jsonl");
    write_lines(&file, &lines[..2_000]);
    let state = dir.path().join("state");
    ingest(&config(&file, "", ""), &state);
    assert_eq!(read_manifest(&state).unwrap().decoder.feature_dim, Some(3));
    // The producer changes its feature vector: appended sessions carry 4 features.
    let wider: Vec<String> = lines[2_000..2_100].iter().map(|l| l.replace("\"features\":[", "\"features\":[0.5,")).collect();
    let mut all = lines[..2_000].to_vec();
    all.extend(wider);
    write_lines(&file, &all);
    let report = ingest(&config(&file, "", ""), &state);
    assert_eq!(report.dead_letters.get("feature_length_mismatch"), Some(&100), "{:?}", report.dead_letters);
    assert_eq!(read_manifest(&state).unwrap().decoder.feature_dim, Some(3));
}

#[test]
fn a_second_writer_on_one_state_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lines = session_lines(dir.path());
    let file = write_lines(&dir.path().join("s.jsonl"), &lines[..500]);
    let state = dir.path().join("state");
    let cfg = config(&file, "", "");
    ingest(&cfg, &state);
    let held = ultr::state::StateStore::open(&state, &cfg.source_identity(), cfg.window.spec().unwrap(), cfg.train.holdout()).unwrap();
    let err = format!("{:#}", run_to_state(&cfg, &state, &mut NoObserver).unwrap_err());
    assert!(err.contains("in use by another ultr process"), "{err}");
    drop(held);
    ingest(&cfg, &state);
}

#[test]
fn dead_letters_are_capped_hashed_stored_once_and_rotated() {
    let dir = tempfile::tempdir().unwrap();
    let lines = session_lines(dir.path());
    let mut spoiled = lines[..3_000].to_vec();
    // A 2 MiB refused record (invalid JSON), and 400 small ones spread through the stream.
    let huge = format!("{{\"session_id\": \"{}", "x".repeat(2 << 20));
    spoiled.insert(10, huge.clone());
    for i in 0..400 {
        spoiled.insert(20 + i * 7, format!("{{\"broken\": {i}"));
    }
    let file = write_lines(&dir.path().join("s.jsonl"), &spoiled);
    let dead = dir.path().join("dead").join("letters.jsonl");
    let extra = format!("[dead_letter.file]\npath = {:?}\nmax_file_bytes = 20000\nkeep_files = 100\nmax_payload_bytes = 65536\n", dead.display().to_string());
    let report = ingest(&config(&file, "", &extra), &dir.path().join("state"));
    assert_eq!(report.dead_letters.values().sum::<u64>(), 401);

    let mut letters = read_dead_letters(&dead).unwrap();
    let mut rotated = 0;
    for i in 1..=100 {
        let p = PathBuf::from(format!("{}.{i}", dead.display()));
        if p.exists() {
            rotated += 1;
            letters.extend(read_dead_letters(&p).unwrap());
        }
    }
    let listing: Vec<_> = std::fs::read_dir(dead.parent().unwrap()).unwrap().flatten().map(|e| (e.file_name(), e.metadata().unwrap().len())).collect();
    assert!(rotated >= 2, "a 20 kB bound over ~90 kB of letters rotates: {listing:?}");
    assert_eq!(letters.len(), 401, "every refused record listed exactly once across the rotated files");
    let big = letters.iter().find(|l| l.payload_bytes == huge.len() as u64).expect("the huge record's letter");
    assert!(big.truncated);
    assert_eq!(big.payload_sha256, sha256_hex(huge.as_bytes()));
    let kept = big.original_bytes().unwrap();
    assert!(kept.len() <= 65_536 && huge.as_bytes().starts_with(&kept));
    for l in &letters {
        assert!(l.payload.is_some() != l.payload_base64.is_some(), "payload stored once");
    }
}

#[test]
fn late_segments_are_dropped_by_retention_like_windows() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = session_lines(dir.path());
    // Sessions from the first 10 s arrive 5 minutes late: the watermark has passed their window.
    let stragglers: Vec<String> = lines.drain(..100).collect();
    let at = 3_000;
    for (i, l) in stragglers.into_iter().enumerate() {
        lines.insert(at + i, l);
    }
    let file = write_lines(&dir.path().join("s.jsonl"), &lines);
    let state = dir.path().join("state");
    // A long horizon keeps the late side output …
    let report = ingest(&config(&file, "", "lookback = \"1d\"\n"), &state);
    assert_eq!(report.counters.late_sessions, 100);
    assert!(!read_manifest(&state).unwrap().late.is_empty());
    // … a 2-minute one drops it with the windows it belongs to.
    let short = dir.path().join("short");
    let report = ingest(&config(&file, "", "lookback = \"2m\"\n"), &short);
    assert_eq!(report.counters.late_sessions, 100);
    let manifest = read_manifest(&short).unwrap();
    assert!(manifest.late.is_empty(), "late segments older than the horizon are dropped: {:?}", manifest.late);
    assert_eq!(std::fs::read_dir(short.join("late")).unwrap().count(), 0, "and their files deleted");
}
