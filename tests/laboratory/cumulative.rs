//! The monitor's incremental cumulative views (`state::cumulative::Incremental`) against the views
//! computed from every window (`state::cumulative::compute`), on a state as it grows window by
//! window, with a horizon that slides and with one that holds everything.

use crate::common::{sorted_rows, OutputWithin};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Float64Type;
use std::process::Command;

use ultr::state::cumulative::{compute, Cumulative, Incremental};

/// policy_propensity's rows, sorted: the key and integer columns as text, the two columns computed
/// from summed logged 1/π (`logged_inverse_sum`, `logged_propensity`) as numbers, since a sum's
/// last bits depend on the order its terms were added in.
fn policy_rows(batches: &[RecordBatch]) -> Vec<(String, Option<f64>, Option<f64>)> {
    let mut rows = Vec::new();
    for b in batches {
        let text = |name: &str, i: usize| datafusion::arrow::util::display::array_value_to_string(b.column_by_name(name).unwrap(), i).unwrap();
        let float = |name: &str, i: usize| {
            let c = b.column_by_name(name).unwrap().as_primitive::<Float64Type>();
            (!c.is_null(i)).then(|| c.value(i))
        };
        let ints = ["impressions", "logged_impressions", "policy_sessions", "sessions"];
        for i in 0..b.num_rows() {
            let key = ["query_id", "doc_id", "position", "policy_id", "empirical_propensity"]
                .iter()
                .chain(ints.iter())
                .map(|n| text(n, i))
                .collect::<Vec<_>>()
                .join("|");
            rows.push((key, float("logged_inverse_sum", i), float("logged_propensity", i)));
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows
}

fn assert_same_views(n: usize, horizon: &str, got: &Cumulative, want: &Cumulative) {
    assert_eq!(got.windows, want.windows, "{n} windows, {horizon}: the windows in the horizon");
    assert!(!want.propensity.is_empty(), "{n} windows, {horizon}: the reference has rows");
    assert_eq!(sorted_rows(&got.propensity), sorted_rows(&want.propensity), "{n} windows, {horizon}: propensity");
    assert_eq!(sorted_rows(&got.swap_edges), sorted_rows(&want.swap_edges), "{n} windows, {horizon}: swap edges");
    assert_eq!(sorted_rows(&got.overlap_sample), sorted_rows(&want.overlap_sample), "{n} windows, {horizon}: overlap sample");
    let (g, w) = (policy_rows(&got.policy_propensity), policy_rows(&want.policy_propensity));
    assert_eq!(g.len(), w.len(), "{n} windows, {horizon}: policy propensity rows");
    let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        (None, None) => true,
        _ => false,
    };
    for (a, b) in g.iter().zip(&w) {
        assert_eq!(a.0, b.0, "{n} windows, {horizon}: policy propensity keys and counts");
        assert!(close(a.1, b.1) && close(a.2, b.2), "{n} windows, {horizon}: {a:?} against {b:?}");
    }
}

/// A simulated state of 24 closed 5-minute windows, then its manifest cut to its first n windows
/// for n = 1..24 (the state as the monitor saw it grow). At each n, one `Incremental` over a
/// 50-minute horizon (ten windows, so it slides from n = 11 on) and one over the whole state give
/// the same rows as `compute`: propensity, swap edges and overlap sample equal row for row,
/// policy propensities with equal keys and counts and their logged-1/π sums within 1e-9. The
/// sliding one reads at most 4 windows per call after its first (the new window, and the three
/// left in the oldest block of four when the horizon leaves one), where `compute` reads ten; the
/// growing one reads at most twice the 24 windows over the 24 calls (each window once, and every
/// window again when its blocks regroup), where `compute` reads 300.
#[test]
fn incremental_views_equal_the_views_of_every_window_as_the_state_grows() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sim.toml");
    std::fs::write(
        &config,
        "source = \"simulator\"\nbatch_records = 2000\n[window]\nsize = \"5m\"\nallowed_lateness = \"0s\"\n\
         [simulator]\nrelevance = \"linear\"\nsessions = 7200\ninterval_ms = 1000\nseed = 21\n\
         [simulator.synthetic]\nqueries = 60\ndocs_per_query = 10\nfeatures = 6\n[simulator.policy]\nranker = \"linear\"\ntau = 0.3\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    let out = Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["ingest", "--config"])
        .arg(&config)
        .arg("--state")
        .arg(&state)
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let full = ultr::state::read_manifest(&state).unwrap();
    let mut windows = full.windows.clone();
    windows.sort_by_key(|w| w.end_ms);
    assert_eq!(windows.len(), 24, "7,200 sessions a second apart in 5-minute windows");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let horizon_ms = 50 * 60 * 1000;
    let (mut sliding, mut growing) = (Incremental::default(), Incremental::default());
    let mut sliding_before = 0;
    for n in 1..=windows.len() {
        let mut manifest = full.clone();
        manifest.windows = windows[..n].to_vec();
        manifest.operator.event_watermark = None;
        let want = rt.block_on(compute(&ultr::context::PipelineContext::default(), &state, &manifest, horizon_ms)).unwrap();
        let got = rt.block_on(sliding.update(&ultr::context::PipelineContext::default(), &state, &manifest, horizon_ms)).unwrap();
        assert_same_views(n, "50-minute horizon", &got, &want);
        assert_eq!(want.windows.len(), n.min(10));
        if n > 1 {
            assert!(sliding.windows_read() - sliding_before <= 4, "{n} windows: read {}", sliding.windows_read() - sliding_before);
        }
        sliding_before = sliding.windows_read();

        let want = rt.block_on(compute(&ultr::context::PipelineContext::default(), &state, &manifest, i64::MAX / 4)).unwrap();
        let got = rt.block_on(growing.update(&ultr::context::PipelineContext::default(), &state, &manifest, i64::MAX / 4)).unwrap();
        assert_same_views(n, "whole state", &got, &want);
    }
    assert!(growing.windows_read() <= 2 * windows.len() as u64, "read {} windows", growing.windows_read());
}
