//! Cost per key (issue 11): peak RSS and state bytes of `ultr ingest` on the same simulated MQ2008
//! stream (46 features, a fixed key set) with 10-minute, 100-minute and 10-hour windows, and at 10×
//! the stream length. Each run is a fresh `ultr ingest` process measured by GNU time.
//!
//! `cargo bench --bench ultr -- cost_per_key` (optionally followed by `SESSIONS`; default 200,000 and 10× that).
//! COST_WORKERS (e.g. "1,2"; default "1") repeats every run with that many ingest workers.

use std::path::Path;
use std::process::Command;

use datafusion::arrow::array::RecordBatch;

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

fn dir_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let m = e.metadata().unwrap();
                    if m.is_dir() {
                        dir_bytes(&e.path())
                    } else {
                        m.len()
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn run(sessions: u64, window: &str, workers: usize, data: &Path, work: &Path) -> String {
    let config = work.join(format!("{sessions}-{window}-{workers}.toml"));
    let state = work.join(format!("state-{sessions}-{window}-{workers}"));
    let _ = std::fs::remove_dir_all(&state);
    let files: Vec<String> = (1..=5).map(|i| format!("{:?}", data.join(format!("S{i}.txt")).display().to_string())).collect();
    std::fs::write(
        &config,
        format!(
            "source = \"simulator\"\n[runtime]\nworkers = {workers}\n[window]\nsize = \"{window}\"\nallowed_lateness = \"1m\"\n[state]\nretention = \"3650d\"\nlookback = \"3650d\"\n\
             [simulator]\ndata = [{}]\nsessions = {sessions}\nseed = 3\n[simulator.policy]\ntau = 0.3\n",
            files.join(", ")
        ),
    )
    .unwrap();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%e %M", env!("CARGO_BIN_EXE_ultr"), "ingest", "--config"])
        .arg(&config)
        .arg("--state")
        .arg(&state)
        .output()
        .expect("GNU time at /usr/bin/time (Debian package `time`)");
    assert!(out.status.success(), "ultr ingest failed: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default().to_string();
    let mut it = last.split_whitespace();
    let seconds: f64 = it.next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
    let rss_mb = it.next().and_then(|s| s.parse::<f64>().ok()).unwrap_or(f64::NAN) / 1024.0;
    let manifest = ultr::state::read_manifest(&state).unwrap();
    let mut keys = 0;
    let mut training_rows = 0;
    for w in &manifest.windows {
        keys += rows(&ultr::state::read_window_table(&state, w, ultr::window::StateTable::PropensityCounts).unwrap());
        training_rows += rows(&ultr::state::read_window_table(&state, w, ultr::window::StateTable::TrainingRows).unwrap());
    }
    let bytes = dir_bytes(&state);
    let c = &manifest.operator.counters;
    let line = format!(
        "| {sessions} | {window} | {workers} | {} | {} | {seconds:.1} | {:.0} | {rss_mb:.0} | {:.1} | {keys} | {training_rows} | {:.0} | {:.1} |",
        manifest.windows.len(),
        c.impressions,
        c.impressions as f64 / seconds,
        bytes as f64 / 1e6,
        bytes as f64 / keys.max(1) as f64,
        bytes as f64 / c.sessions.max(1) as f64,
    );
    let _ = std::fs::remove_dir_all(&state);
    line
}

pub fn main(args: &[String]) {
    let sessions: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let data = ultr::simulate::dataset::default_mq2008_dir().expect("MQ2008 (set ULTR_DATA_DIR)");
    let work = tempfile::tempdir().unwrap();
    let workers: Vec<usize> = std::env::var("COST_WORKERS").unwrap_or_else(|_| "1".into()).split(',').filter_map(|n| n.trim().parse().ok()).collect();
    println!("| sessions | window | workers | windows | impressions | s | impressions/s | peak RSS MB | state MB | (window,q,d,k,ctx) keys | training rows | state B/key | state B/session |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (n, window) in [(sessions, "10m"), (sessions, "100m"), (sessions, "10h"), (sessions * 10, "10m"), (sessions * 10, "10h")] {
        for &w in &workers {
            println!("{}", run(n, window, w, &data, work.path()));
        }
    }
}
