//! Scale-out figures against the real broker and object store (both as scripts/test.sh starts
//! them): records/s with 1, 2 and 3 `ultr ingest` instances of one group on a 6-partition topic,
//! each instance's CPU time per record, and the merged view's compaction and query time as the
//! number of partition window files grows. With SCALE_WORKERS (e.g. "1,2"), instead: one instance
//! with a local state and that many ingest workers (`[runtime] workers`) on a 6-partition topic.
//!
//! `cargo bench --bench ultr -- scale_out` (env: ULTR_KAFKA_BROKERS, ULTR_S3_ENDPOINT, SCALE_SESSIONS,
//! SCALE_INSTANCES, SCALE_WORKERS).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::kafka::{ensure_topic, KafkaSink};
use ultr::sinks::SessionSink;
use ultr::state::remote::{ObjectStoreConfig, Remote};

const PARTITIONS: i32 = 6;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos())
}

fn store(prefix: &str) -> ObjectStoreConfig {
    ObjectStoreConfig {
        url: format!("s3://ultr-test/{prefix}"),
        options: [
            ("aws_endpoint", env("ULTR_S3_ENDPOINT", "http://127.0.0.1:9911")),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "ultr".into()),
            ("aws_secret_access_key", "ultr".into()),
            ("aws_region", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        compact_interval: "5s".parse().unwrap(),
        lease_ttl: "30s".parse().unwrap(),
    }
}

fn config(topic: &str, group: &str, s: &ObjectStoreConfig, window: &str, idle_exit_ms: u64) -> String {
    let mut text = format!(
        "batch_records = 4096\n[source.kafka]\nbrokers = {:?}\ngroup_id = {group:?}\ntopics = [{topic:?}]\nidle_exit_ms = {idle_exit_ms}\n\
         [source.kafka.properties]\n\"fetch.wait.max.ms\" = \"100\"\n\"session.timeout.ms\" = \"90000\"\n\"heartbeat.interval.ms\" = \"3000\"\n\
         [window]\nsize = {window:?}\nallowed_lateness = \"1d\"\n[state]\ncheckpoint_every_records = 50000\ncheckpoint_interval = \"2s\"\n\
         [state.object_store]\nurl = {:?}\ncompact_interval = {:?}\nlease_ttl = {:?}\n[state.object_store.options]\n",
        env("ULTR_KAFKA_BROKERS", "127.0.0.1:9092"),
        s.url,
        s.compact_interval.text(),
        s.lease_ttl.text()
    );
    for (k, v) in &s.options {
        text.push_str(&format!("{k} = {v:?}\n"));
    }
    text
}

fn publish(topic: &str, sessions: u64) -> i64 {
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 600, docs_per_query: 10, features: 8 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
        sessions,
        seed: 5,
        ..SimConfig::default()
    })
    .unwrap();
    ensure_topic(&env("ULTR_KAFKA_BROKERS", "127.0.0.1:9092"), topic, PARTITIONS).unwrap();
    // One record per batch: tansu 0.6 serves fetches from batch boundaries only (tests/deployment/scale_out.rs).
    // SCALE_BATCH_RECORDS raises it where nothing resumes mid-topic (SCALE_WORKERS: one run from offset 0).
    let one_per_batch = [("batch.num.messages".to_string(), env("SCALE_BATCH_RECORDS", "1"))].into_iter().collect();
    let mut sink = KafkaSink::new(&env("ULTR_KAFKA_BROKERS", "127.0.0.1:9092"), topic, &one_per_batch).unwrap();
    let mut buf = Vec::new();
    for i in 0..sessions {
        let key = sim.session(i, &mut buf);
        sink.send(&key, &buf).unwrap();
    }
    sink.flush().unwrap();
    sessions as i64
}

/// Offsets the partition manifests in the store account for.
fn stored(remote: &Remote) -> i64 {
    ultr::scale_out::partition_prefixes(remote)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| remote.manifest(p).ok().flatten())
        .map(|m| m.resume.0.values().flat_map(|p| p.values()).sum::<i64>())
        .sum()
}

/// User + system CPU seconds of a live process.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // utime, stime (fields 14, 15 of stat) at 100 Hz
}

/// Partitions the instances hold now, from their logs (a partition is held from "partition state
/// ready" to "partition task ended" or "partition released", which a revocation logs both of), and
/// how many such events there were.
fn held(logs: &[std::path::PathBuf]) -> (usize, usize) {
    let mut held = 0;
    let mut events = 0;
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let mut mine = std::collections::BTreeSet::new();
        for line in text.lines() {
            let line = strip_ansi(line);
            let line = line.as_str();
            let Some(partition) =
                line.rsplit("partition=").next().and_then(|p| p.split_whitespace().next()).map(|p| p.trim_matches(|c: char| !c.is_ascii_digit()).to_string())
            else {
                continue;
            };
            if line.contains("partition state ready") {
                mine.insert(partition);
                events += 1;
            } else if line.contains("partition released") || line.contains("partition task ended") || line.contains("revoked") {
                mine.remove(&partition);
                events += 1;
            }
        }
        held += mine.len();
    }
    (held, events)
}

/// The text of a log line without its terminal colour codes.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn signal(pids: &[u32], sig: &str) {
    for pid in pids {
        let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
    }
}

/// `n` instances join an empty topic and settle (every partition held, no rebalance for 3 s);
/// they are paused (SIGSTOP) while the records are published, then resumed: the clock runs from
/// the resume to the moment the store accounts for every offset.
fn run_instances(n: usize, sessions: u64, dir: &std::path::Path) {
    let topic = unique("bench-scale");
    ensure_topic(&env("ULTR_KAFKA_BROKERS", "127.0.0.1:9092"), &topic, PARTITIONS).unwrap();
    let s = store(&unique("bench"));
    let remote = Remote::open(&s, &Default::default()).unwrap();
    let cfg = dir.join(format!("scale-{n}.toml"));
    std::fs::write(&cfg, config(&topic, &unique("bench-group"), &s, "1h", 300_000)).unwrap();
    let logs: Vec<_> = (0..n).map(|i| dir.join(format!("i{n}-{i}.log"))).collect();
    let mut children: Vec<Child> = (0..n)
        .map(|i| {
            Command::new(env!("CARGO_BIN_EXE_ultr"))
                .args(["ingest", "--config"])
                .arg(&cfg)
                .arg("--state")
                .arg(dir.join(format!("i{n}-{i}")))
                .env("ULTR_LOG", "ultr=info")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&logs[i]).unwrap())
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut last_events, mut stable_since) = (usize::MAX, Instant::now());
    loop {
        let (h, events) = held(&logs);
        if events != last_events {
            (last_events, stable_since) = (events, Instant::now());
        }
        if h == PARTITIONS as usize && stable_since.elapsed() >= Duration::from_secs(3) {
            break;
        }
        assert!(Instant::now() < deadline, "{n} instances did not settle; logs in {}", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(&pids, "-STOP");
    let records = publish(&topic, sessions);
    let cpu_before: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let started = Instant::now();
    signal(&pids, "-CONT");
    let mut cpu = cpu_before.clone();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        for (i, p) in pids.iter().enumerate() {
            cpu[i] = cpu_seconds(*p).max(cpu[i]);
        }
        if stored(&remote) >= records || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let secs = started.elapsed().as_secs_f64();
    let read = stored(&remote);
    assert!(read >= records, "{n} instance(s): only {read} of {records} offsets reached the store; logs in {}", dir.display());
    let used: Vec<f64> = cpu.iter().zip(&cpu_before).map(|(a, b)| a - b).collect();
    let total_cpu: f64 = used.iter().sum();
    println!(
        "{n} instance(s): {records} records in the store {secs:.1} s after resuming = {:.0} records/s; CPU per instance {:?} s = {:?} µs per record it read; all instances {:.1} µs CPU per record",
        records as f64 / secs,
        used.iter().map(|c| (c * 10.0).round() / 10.0).collect::<Vec<_>>(),
        used.iter().map(|c| (c / (records as f64 / n as f64) * 1e6).round()).collect::<Vec<_>>(),
        total_cpu / records as f64 * 1e6
    );
    signal(&pids, "-TERM");
    for c in &mut children {
        let _ = c.wait();
    }
}

/// Compaction and merged-view query time against the number of partition window files: one
/// topic, windows of `window`, compacted once by `ultr compact` after a one-instance run.
fn merged_view(window: &str, sessions: u64, dir: &std::path::Path) {
    let topic = unique("bench-merge");
    let records = publish(&topic, sessions);
    let s = store(&unique("merge"));
    let cfg = dir.join(format!("merge-{window}.toml"));
    std::fs::write(&cfg, config(&topic, &unique("merge-group"), &s, window, 8000)).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["ingest", "--config"])
        .arg(&cfg)
        .arg("--state")
        .arg(dir.join(format!("m-{window}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let root = dir.join(format!("c-{window}"));
    let out = Command::new(env!("CARGO_BIN_EXE_ultr")).args(["compact", "--json", "--config"]).arg(&cfg).arg("--state").arg(&root).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let merged = ultr::scale_out::merged_dir(&root);
    let manifest = ultr::state::read_manifest(&merged).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = Instant::now();
    let c = rt.block_on(ultr::state::cumulative::compute(&ultr::context::PipelineContext::default(), &merged, &manifest, i64::MAX / 4)).unwrap();
    let query = t.elapsed().as_secs_f64();
    println!(
        "windows of {window}: {records} sessions, {} partition window files -> {} merged windows; compaction (fresh, from the store) {:.2} s; cumulative π + swap graph query {:.3} s ({} π rows)",
        report["partition_files"],
        report["windows"],
        report["seconds"].as_f64().unwrap_or(0.0),
        query,
        c.propensity.iter().map(|b| b.num_rows()).sum::<usize>()
    );
}

/// One instance with a local state and `workers` ingest workers on a 6-partition topic. It joins
/// the empty topic and settles (every partition assigned, nothing new logged for 3 s), is paused
/// (SIGSTOP) while the records are published, then resumed; the clock runs from the resume to the
/// first checkpoint whose offsets account for every record. Checkpoints are at most 1 s apart, so
/// the time is late by up to 1 s plus the 100 ms poll.
fn run_workers(workers: usize, sessions: u64, dir: &std::path::Path) {
    let brokers = env("ULTR_KAFKA_BROKERS", "127.0.0.1:9092");
    let topic = unique("bench-workers");
    ensure_topic(&brokers, &topic, PARTITIONS).unwrap();
    let cfg = dir.join(format!("workers-{workers}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "batch_records = 4096\n[runtime]\nworkers = {workers}\n[source.kafka]\nbrokers = {brokers:?}\ngroup_id = {:?}\ntopics = [{topic:?}]\n\
             [source.kafka.properties]\n{}[window]\nsize = \"1h\"\nallowed_lateness = \"1d\"\n\
             [state]\ncheckpoint_every_records = 50000\ncheckpoint_interval = \"1s\"\n",
            unique("bench-group"),
            // librdkafka properties, "key=value,key=value"; fetch.wait.max.ms is 100 unless given.
            ["fetch.wait.max.ms=100", &env("SCALE_KAFKA_PROPERTIES", "")]
                .join(",")
                .split(',')
                .filter(|kv| kv.contains('='))
                .map(|kv| kv.split_once('=').unwrap())
                .collect::<std::collections::BTreeMap<_, _>>()
                .into_iter()
                .map(|(k, v)| { format!("{k:?} = {v:?}\n") })
                .collect::<String>()
        ),
    )
    .unwrap();
    let state = dir.join(format!("w{workers}"));
    let log = dir.join(format!("w{workers}.log"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["ingest", "--config"])
        .arg(&cfg)
        .arg("--state")
        .arg(&state)
        .env("ULTR_LOG", "ultr=info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let assigned = || std::fs::read_to_string(&log).unwrap_or_default().lines().filter(|l| strip_ansi(l).contains("assigned; reading")).count();
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut last, mut stable_since) = (usize::MAX, Instant::now());
    loop {
        let n = assigned();
        if n != last {
            (last, stable_since) = (n, Instant::now());
        }
        if n >= PARTITIONS as usize && stable_since.elapsed() >= Duration::from_secs(3) {
            break;
        }
        assert!(Instant::now() < deadline, "the instance did not settle; log {}", log.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(&[pid], "-STOP");
    let records = publish(&topic, sessions);
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    signal(&[pid], "-CONT");
    // Every shard checkpoints at the same record, so shard 0's offsets are the instance's.
    let manifest_dir = if workers > 1 { state.join("shards").join("0") } else { state.clone() };
    let read = || ultr::state::read_manifest(&manifest_dir).map(|m| m.resume.0.values().flat_map(|p| p.values()).sum::<i64>()).unwrap_or(0);
    let (mut cpu, deadline) = (cpu_before, Instant::now() + Duration::from_secs(600));
    while read() < records && Instant::now() < deadline {
        cpu = cpu_seconds(pid).max(cpu);
        std::thread::sleep(Duration::from_millis(100));
    }
    let secs = started.elapsed().as_secs_f64();
    cpu = cpu_seconds(pid).max(cpu);
    assert!(read() >= records, "{workers} worker(s): only {} of {records} records checkpointed; log {}", read(), log.display());
    println!(
        "1 instance, {workers} worker(s): {records} records checkpointed {secs:.1} s after resuming = {:.0} records/s; {:.1} s CPU = {:.1} µs CPU per record",
        records as f64 / secs,
        cpu - cpu_before,
        (cpu - cpu_before) / records as f64 * 1e6
    );
    signal(&[pid], "-TERM");
    let _ = child.wait();
}

pub fn main(_args: &[String]) {
    let sessions: u64 = env("SCALE_SESSIONS", "200000").parse().unwrap();
    // Kept after the run: the instances' logs are there.
    let dir = std::env::temp_dir().join(unique("ultr-bench-scale"));
    std::fs::create_dir_all(&dir).unwrap();
    println!("work folder {}", dir.display());
    let workers: Vec<usize> = env("SCALE_WORKERS", "").split(',').filter_map(|n| n.trim().parse().ok()).collect();
    if !workers.is_empty() {
        for n in workers {
            run_workers(n, sessions, &dir);
        }
        return;
    }
    // SCALE_INSTANCES="1,2,3" (default); "" skips to the merged-view figures.
    for n in env("SCALE_INSTANCES", "1,2,3").split(',').filter_map(|n| n.trim().parse::<usize>().ok()) {
        run_instances(n, sessions, &dir);
    }
    for window in ["1h", "10m", "1m"] {
        merged_view(window, sessions / 4, &dir);
    }
}
