//! Windowing benchmarks (`cargo bench --bench ultr -- windowing`): impressions/s through decode + windows +
//! every `sql/` statistic + Parquet state; the cost of closing one 1M-impression window; state bytes
//! per unique (q,d,k); and peak RSS of `ultr ingest` over a 1× and a 10× longer stream with a fixed key set.

use std::path::Path;
use std::time::{Duration, Instant};

use ultr::config::PipelineConfig;
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::jsonl::JsonlSink;
use ultr::sources::file::FileSource;

fn simulate(path: &Path, sessions: u64, features: usize) {
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 500, docs_per_query: 20, features },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
        sessions,
        seed: 5,
        ..SimConfig::default()
    })
    .unwrap();
    sim.run(&mut JsonlSink::create(path).unwrap()).unwrap();
}

fn config(data: &Path) -> PipelineConfig {
    PipelineConfig::parse(
        &format!("batch_records = 4096\n[source.file]\npaths = [{:?}]\n[window]\nsize = \"1h\"\nallowed_lateness = \"1m\"\n", data.display().to_string()),
        "bench",
    )
    .unwrap()
}

fn dir_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| rd.flatten().map(|e| if e.path().is_dir() { dir_bytes(&e.path()) } else { e.metadata().map(|m| m.len()).unwrap_or(0) }).sum())
        .unwrap_or(0)
}

fn peak_rss_kib(config: &Path, state: &Path) -> (u64, f64) {
    let t = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["ingest", "--config"])
        .arg(config)
        .arg("--state")
        .arg(state)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{}/status", child.id())) {
            for line in s.lines().filter(|l| l.starts_with("VmHWM:")) {
                peak = peak.max(line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (peak, t.elapsed().as_secs_f64())
}

pub fn main(_args: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    for features in [0usize, 46] {
        let data = dir.path().join(format!("s{features}.jsonl"));
        simulate(&data, 60_000, features); // 1.2M impressions, 100 ms apart → 2 windows of 1 h
        let state = dir.path().join(format!("state{features}"));
        let t = Instant::now();
        let report = ultr::pipeline::run_to_state(&config(&data), &state, &mut ultr::pipeline::NoObserver).unwrap();
        let secs = t.elapsed().as_secs_f64();
        let imps = report.counters.impressions;
        println!(
            "windowing ({features} features): {imps} impressions in {secs:.2}s → {:.0} impressions/s (decode + window + SQL + Parquet)",
            imps as f64 / secs
        );
        let manifest = ultr::state::read_manifest(&state).unwrap();
        let keys: u64 = manifest
            .windows
            .iter()
            .map(|w| {
                ultr::state::read_window_table(&state, w, ultr::window::StateTable::PropensityCounts).unwrap().iter().map(|b| b.num_rows() as u64).sum::<u64>()
            })
            .sum();
        let bytes = dir_bytes(&state.join("windows"));
        println!(
            "  state: {bytes} bytes in windows/ for {keys} (window, q, d, k) rows → {:.1} bytes per unique (q,d,k) per window",
            bytes as f64 / keys as f64
        );
    }

    // Closing one window of 1M impressions: window statistics alone.
    let data = dir.path().join("s46.jsonl");
    let mut ingest = ultr::ingest::Ingest::new(FileSource::open(&data, 0).unwrap(), Default::default(), 8192);
    let mut batches = Vec::new();
    let mut rows = 0;
    while rows < 1_000_000 {
        match ingest.next().unwrap() {
            ultr::ingest::Next::Batch(b) => {
                rows += b.impressions.num_rows();
                batches.push(b.impressions);
            }
            _ => break,
        }
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = Instant::now();
    let tables = rt
        .block_on(ultr::window::window_statistics(
            ultr::context::PipelineContext::default().statements(),
            &batches,
            ultr::train::config::TrainConfig::default().holdout(),
            &Default::default(),
        ))
        .unwrap();
    println!("closing one window of {rows} impressions (all sql/ statistics, 46 features): {:.2}s", t.elapsed().as_secs_f64());
    drop(tables);

    // Peak RSS: the same key set, a 10× longer stream.
    for (label, sessions) in [("1x", 60_000u64), ("10x", 600_000)] {
        let data = dir.path().join(format!("rss-{label}.jsonl"));
        simulate(&data, sessions, 8);
        let cfg = dir.path().join(format!("rss-{label}.toml"));
        // 10-minute windows: 6,000 sessions each, so the 10× stream has 10× the windows, not bigger ones.
        std::fs::write(&cfg, format!("[source.file]\npaths = [{:?}]\n[window]\nsize = \"10m\"\n", data.display().to_string())).unwrap();
        let (kib, secs) = peak_rss_kib(&cfg, &dir.path().join(format!("rss-state-{label}")));
        println!("peak RSS, {label} stream ({} impressions): {} MiB ({secs:.1}s)", sessions * 20, kib / 1024);
    }
}
