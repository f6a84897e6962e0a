//! Helpers shared by the integration tests: locating the shared LTR data and collecting batches.
// Both test binaries compile this module and each uses only some of its helpers.
#![allow(dead_code)]

pub mod brokers;
pub mod malformed;
pub mod registry;

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float32Type, Float64Type, TimestampMillisecondType, UInt32Type};
use datafusion::arrow::record_batch::RecordBatch;
use ultr::ingest::Ingest;
use ultr::sinks::dead_letter::DeadLetterSink;
use ultr::sources::RecordSource;

/// The repository's `data/` (gzipped MQ2008 and LightGBM rank data), or `$ULTR_DATA_DIR`.
pub fn data_dir() -> PathBuf {
    ultr::simulate::dataset::data_dir().expect("LTR data: the repository's data/ (or $ULTR_DATA_DIR with mq2008/ and lightgbm-rank/)")
}

pub fn mq2008_files() -> Vec<PathBuf> {
    (1..=5).map(|i| data_dir().join(format!("mq2008/S{i}.txt"))).collect()
}

/// Drains an ingest, returning its impression batches; dead letters go to `dead`.
pub fn collect<S: RecordSource>(ingest: &mut Ingest<S>, dead: &mut DeadLetterSink) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    ingest.drain(dead, |b| out.push(b.impressions)).expect("ingest");
    out
}

/// One impression row as comparable text, every column included.
pub fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let s = |i: usize| b.column(i).as_string::<i32>();
        let (sid, qid, pid, ctx, doc) = (s(0), s(1), s(3), s(4), s(5));
        let time = b.column(2).as_primitive::<TimestampMillisecondType>();
        let pos = b.column(6).as_primitive::<UInt32Type>();
        let clicked = b.column(7).as_boolean();
        let n = b.column(8).as_primitive::<UInt32Type>();
        let feats = b.column(9).as_list::<i32>();
        let bias = b.column(10).as_list::<i32>();
        let prop = b.column(11).as_primitive::<Float64Type>();
        let list = |l: &datafusion::arrow::array::ListArray, i: usize| -> String {
            if l.is_null(i) {
                return "null".into();
            }
            let v = l.value(i);
            let v = v.as_primitive::<Float32Type>();
            v.values().iter().map(|x| x.to_bits().to_string()).collect::<Vec<_>>().join(",")
        };
        for i in 0..b.num_rows() {
            out.push(format!(
                "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
                sid.value(i),
                qid.value(i),
                time.value(i),
                pid.value(i),
                if ctx.is_null(i) { "null" } else { ctx.value(i) },
                doc.value(i),
                pos.value(i),
                clicked.value(i),
                n.value(i),
                list(feats, i),
                list(bias, i),
                if prop.is_null(i) { "null".to_string() } else { prop.value(i).to_string() },
            ));
        }
    }
    out
}

/// Sorted rows of the cumulative propensity table plus the counters and windows, for comparing two
/// states built from the same stream.
pub fn final_counts(state: &std::path::Path) -> (Vec<String>, String) {
    let manifest = ultr::state::read_manifest(state).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = rt.block_on(ultr::state::cumulative::compute(&ultr::context::PipelineContext::default(), state, &manifest, i64::MAX / 4)).unwrap();
    let rows = sorted_rows(&c.propensity);
    let windows: Vec<_> = manifest.windows.iter().map(|w| (w.start_ms, w.sessions, w.impressions)).collect();
    (rows, format!("{:?} {:?}", manifest.operator.counters, windows))
}

/// Every window's tables (sorted rows) and the counters of a state: the state as a user reads it,
/// without the source's offsets (which differ between formats and transports).
pub fn state_tables(state: &std::path::Path) -> (Vec<(i64, ultr::window::StateTable, Vec<String>)>, String) {
    let m = ultr::state::read_manifest(state).unwrap();
    let mut tables = Vec::new();
    for w in &m.windows {
        for &table in ultr::window::StateTable::ALL {
            tables.push((w.start_ms, table, sorted_rows(&ultr::state::read_window_table(state, w, table).unwrap())));
        }
    }
    (tables, format!("{:?}", m.operator.counters))
}

/// Copies a state directory (or any folder) recursively, leaving out a running writer's `.lock`.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else if e.file_name() != ".lock" {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// Every row of `batches` as printed (cells without padding, no header), sorted: tables compared row
/// for row whatever their order and batches.
pub fn sorted_rows(batches: &[datafusion::arrow::array::RecordBatch]) -> Vec<String> {
    let mut rows = Vec::new();
    for b in batches {
        let text = datafusion::arrow::util::pretty::pretty_format_batches(std::slice::from_ref(b)).unwrap().to_string();
        // Each batch's table pads its cells to its own widths and repeats the header: a row is its
        // cells, padding dropped, so the rows do not depend on how a file splits them into batches.
        rows.extend(text.lines().filter(|l| l.starts_with("| ")).skip(1).map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")));
    }
    rows.sort();
    rows
}

/// `GET http://addr/path` → (status code, body). Plain HTTP/1.1, for metrics and Prometheus's API.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    // Prometheus answers chunked; strip chunk sizes when present.
    if text.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body.as_str();
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        return Ok((code, out));
    }
    Ok((code, body))
}

/// A TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The value of a sample line `name{labels} value` (the sum over lines starting with `prefix`).
pub fn metric_sum(exposition: &str, prefix: &str) -> Option<f64> {
    let values: Vec<f64> = exposition
        .lines()
        .filter(|l| !l.starts_with('#') && (l.starts_with(&format!("{prefix} ")) || l.starts_with(&format!("{prefix}{{"))))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()))
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Writes a fitted model as a checkpoint in `dir` (a models directory) the way training does, with
/// the gate's decision for a first model; returns its id.
pub fn store_checkpoint(
    dir: &std::path::Path,
    trained: &ultr::train::artefact::Trained,
    report: &ultr::train::fit::FitReport,
    cfg: &ultr::train::config::TrainConfig,
) -> String {
    let store = ultr::train::checkpoint::ModelStore::open(dir).unwrap();
    let decision = ultr::train::checkpoint::decide(report.stop, report.best_validation_loss, None, None, 0.0, false);
    let info = ultr::train::checkpoint::CheckpointInfo {
        id: String::new(),
        created_at: String::new(),
        config: cfg.clone(),
        data_range_ms: None,
        parent: None,
        theta: trained.position_bias(),
        fit: serde_json::Value::Null,
        decision,
        theta_intervals: None,
    };
    store.write(trained, info).unwrap()
}

/// How long a child process a test starts (`ultr`, promtool, openssl, a Python check) may run
/// before the test kills it and fails: far above any command's measured time (the longest, an
/// `ultr train` with θ intervals, took under two minutes on the 2-core machine), far below nextest's
/// per-test deadline (.config/nextest.toml).
pub const CHILD_DEADLINE: Duration = Duration::from_secs(480);

/// `Command::output` with a deadline: past `limit` the child is killed and the test fails, naming
/// the command and quoting its stderr so far, instead of hanging the suite.
pub trait OutputWithin {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output> {
        use std::io::Read;
        let mut child = self.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let (mut out, mut err) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
        let out = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = out.read_to_end(&mut v);
            v
        });
        let err = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = err.read_to_end(&mut v);
            v
        });
        let Some(status) = wait_within(&mut child, limit) else {
            let stderr = err.join().unwrap_or_default();
            panic!("{self:?} ran past its {limit:?} deadline and was killed; its stderr:\n{}", String::from_utf8_lossy(&stderr))
        };
        Ok(Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() })
    }
}

/// Waits for `child` at most `limit`: its exit status, or None after killing it (SIGKILL) and
/// reaping it when the deadline passed.
pub fn wait_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One test per seed of a statistical claim, so nextest spreads them:
/// `seeded_tests!(module => check; seed_11 = 11, seed_31 = 31)` makes `mod module` with a test
/// `seed_11` calling `super::check(11)`, and so on. Seeds after `on_demand` are ignored tests: the
/// test command leaves them out (the CI budget, docs/testing.md), `cargo nextest run --release
/// --run-ignored all` runs them.
#[macro_export]
macro_rules! seeded_tests {
    ($module:ident => $check:ident; $($test:ident = $seed:expr),+ $(; on_demand $($itest:ident = $iseed:expr),+)? $(,)?) => {
        mod $module {
            $(
                #[test]
                fn $test() {
                    super::$check($seed);
                }
            )+
            $($(
                #[test]
                #[ignore = "a further seed of this claim, run on demand (docs/testing.md, the CI budget)"]
                fn $itest() {
                    super::$check($iseed);
                }
            )+)?
        }
    };
}

/// An observer that stops a run once it has handed out `.0` records (`.1`: handed out so far). The
/// stop is seen after the next batch is handed out, so a run reads one batch more.
pub struct StopAfter(pub u64, pub u64);

impl ultr::pipeline::Observer for StopAfter {
    fn on_progress(&mut self, r: &ultr::pipeline::RunReport) {
        self.1 = r.records;
    }
    fn should_stop(&self) -> bool {
        self.1 >= self.0
    }
}

/// The simulator's true relevance of `config`'s pipeline as graded editors' labels, written to
/// `out` as qrels: grades 0–4 by the relevance's quintiles over every (query, document).
pub fn write_truth_qrels(config: &std::path::Path, out: &std::path::Path) {
    let c = ultr::config::PipelineConfig::parse(&std::fs::read_to_string(config).unwrap(), "truth qrels").unwrap();
    let sim = ultr::simulate::Simulator::new(c.simulator.clone()).unwrap();
    let mut all: Vec<f64> = sim.truth().queries.iter().flat_map(|q| q.docs.iter().map(|d| d.relevance)).collect();
    all.sort_by(f64::total_cmp);
    let cuts: Vec<f64> = [0.2, 0.4, 0.6, 0.8].iter().map(|p| all[((all.len() - 1) as f64 * p) as usize]).collect();
    let mut qrels = String::new();
    for q in &sim.truth().queries {
        for d in &q.docs {
            qrels.push_str(&format!("{} 0 {} {}\n", q.query_id, d.doc_id, cuts.iter().filter(|c| d.relevance > **c).count()));
        }
    }
    std::fs::write(out, qrels).unwrap();
}

/// Runs `ultr ingest --config CONFIG --state STATE` to its end; fails the test with its stderr if it
/// fails.
pub fn ultr_ingest(config: &std::path::Path, state: &std::path::Path) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_ultr")).args(["ingest", "--config"]).arg(config).arg("--state").arg(state).output_within(CHILD_DEADLINE).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
