//! Scale-out against the real broker and a real S3-compatible server (moto, started by
//! scripts/test.sh): three `ultr run` instances in one consumer group over a 6-partition topic keyed
//! by query_id; one is SIGKILLed mid-stream and one joins later. The merged view must equal a
//! single-instance run over the same records row for row — cumulative π, swap graph, counters, dead
//! letters — with every record read once. And a bounded instance does not leave while another
//! member of its group still holds unread partitions.
//!
//! `SCALE_OUT_HISTORY=1` keeps the instances' logs (their folder is printed), adds librdkafka's
//! group-protocol lines (`debug = "cgrp"`) to them and prints every instance's partition history.

use crate::common;
use crate::common::OutputWithin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::brokers::Guard;
use common::sorted_rows;
use ultr::config::PipelineConfig;
use ultr::pipeline::{run_to_state, NoObserver};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::kafka::{ensure_topic, KafkaSink};
use ultr::sinks::SessionSink;
use ultr::state::remote::{ObjectStoreConfig, Remote};

const PARTITIONS: i32 = 6;
const SESSIONS: u64 = 30_000;
/// The members' session timeout. tansu 0.6 refreshes a member's last contact only on a heartbeat
/// that it answers without error, so a rebalance that keeps a member from such a heartbeat for
/// longer than this (its revocation checkpoints and copies every partition it owned, then the join
/// and sync) drops the member; it comes back under a new member id, which opens a new generation,
/// and the others rebalance again. With 6 s, two instances chased each other's generations this way
/// for minutes in a CI run (README, "Which broker the tests use").
const SESSION_TIMEOUT_MS: &str = "20000";

fn brokers() -> String {
    std::env::var("ULTR_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn s3_endpoint() -> String {
    std::env::var("ULTR_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:9911".into())
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn store_config(prefix: &str) -> ObjectStoreConfig {
    ObjectStoreConfig {
        url: format!("s3://ultr-test/{prefix}"),
        options: [
            ("aws_endpoint", s3_endpoint()),
            ("aws_allow_http", "true".to_string()),
            ("aws_access_key_id", "ultr".to_string()),
            ("aws_secret_access_key", "ultr".to_string()),
            ("aws_region", "us-east-1".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        compact_interval: "1s".parse().unwrap(),
        lease_ttl: "4s".parse().unwrap(),
    }
}

/// The pipeline config both runs share; the scale-out one adds the object store.
fn config_text(topic: &str, group: &str, store: Option<&ObjectStoreConfig>) -> String {
    let mut text = format!(
        "batch_records = 500\n[source.kafka]\nbrokers = {:?}\ngroup_id = {group:?}\ntopics = [{topic:?}]\nidle_exit_ms = 12000\n\
         [source.kafka.properties]\n\"fetch.wait.max.ms\" = \"100\"\n\"session.timeout.ms\" = {SESSION_TIMEOUT_MS:?}\n\
         \"heartbeat.interval.ms\" = \"1000\"\n\"topic.metadata.refresh.interval.ms\" = \"1000\"\n\
         [window]\nsize = \"1m\"\nallowed_lateness = \"1d\"\n[state]\ncheckpoint_every_records = 400\n",
        brokers()
    );
    if keep_history() {
        text = text.replace("[source.kafka.properties]\n", "[source.kafka.properties]\n\"debug\" = \"cgrp\"\n");
    }
    if let Some(s) = store {
        text.push_str(&format!(
            "[state.object_store]\nurl = {:?}\ncompact_interval = {:?}\nlease_ttl = {:?}\n[state.object_store.options]\n",
            s.url,
            s.compact_interval.text(),
            s.lease_ttl.text()
        ));
        for (k, v) in &s.options {
            text.push_str(&format!("{k} = {v:?}\n"));
        }
    }
    text
}

/// Publishes the stream keyed by query_id, with a malformed record every 1000 sessions.
fn publish(topic: &str) -> u64 {
    publish_sessions(topic, SESSIONS)
}

fn publish_sessions(topic: &str, sessions: u64) -> u64 {
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 60, docs_per_query: 8, features: 3 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
        sessions,
        seed: 57,
        ..SimConfig::default()
    })
    .unwrap();
    // One record per producer batch: tansu 0.6's fetch returns only batches that start at or after
    // the fetch offset (its dynostore `fetch` splits the batch index at the offset), so a restored
    // partition seeking into the middle of a batch would skip that batch's tail. Kafka returns the
    // batch holding the offset; ultr seeks to exact offsets and relies on that.
    let one_per_batch = [("batch.num.messages".to_string(), "1".to_string())].into_iter().collect();
    let mut sink = KafkaSink::new(&brokers(), topic, &one_per_batch).unwrap();
    let mut buf = Vec::new();
    let mut records = 0;
    for i in 0..sessions {
        let key = sim.session(i, &mut buf);
        sink.send(&key, &buf).unwrap();
        records += 1;
        if i % 1000 == 999 {
            sink.send(&format!("q{}", i % 7), br#"{"session_id": truncated"#).unwrap();
            records += 1;
        }
    }
    sink.flush().unwrap();
    records
}

/// Whether to keep the instances' logs with librdkafka's group-protocol lines (`SCALE_OUT_HISTORY`).
fn keep_history() -> bool {
    std::env::var("SCALE_OUT_HISTORY").is_ok()
}

/// A running `ultr run`, killed when dropped: a failing assertion must not leave instances reading
/// and compacting behind the next test (they slow the shared broker and object store down).
fn spawn_instance(config: &Path, state: &Path, log: &Path) -> Guard {
    let child = Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["run"])
        .arg(config)
        .arg("--state")
        .arg(state)
        .args(["--listen", &format!("127.0.0.1:{}", common::free_port()), "--exit-when-done"])
        .env("ULTR_LOG", if keep_history() { "ultr=info,ultr::librdkafka=debug" } else { "ultr=info" })
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("starting ultr run");
    Guard(child)
}

/// The last 40 lines of an instance's log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The partitions an instance owns now, by its log's assignment and revocation lines (incremental
/// under cooperative-sticky, every partition under an eager protocol: both add up the same way).
fn owned(log: &Path) -> std::collections::BTreeSet<i32> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut owned = std::collections::BTreeSet::new();
    for line in text.lines() {
        let partition = line.rsplit_once("partition=").and_then(|(_, p)| p.trim().parse::<i32>().ok());
        match partition {
            Some(p) if line.contains("::scale_out: assigned ") => _ = owned.insert(p),
            Some(p) if line.contains("::scale_out: revoked ") => _ = owned.remove(&p),
            _ => {}
        }
    }
    owned
}

/// Waits (90 s at most) until the instance logging to `log` owns at least `count` partitions.
fn wait_for_partitions(log: &Path, count: usize, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while owned(log).len() < count {
        assert!(Instant::now() < deadline, "instance {name} was not assigned {count} partitions within 90 s:\n{}", tail(log));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What each instance did with each partition (for a failing comparison: the group's decisions
/// are not reproducible, so the history is printed when it matters).
fn print_partition_history(logs: &[PathBuf]) {
    let events = ["assigned", "revoked", "partition task ended", "fenced", "state ready", "not finished", "running it to its end"];
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        eprintln!("--- {}", log.display());
        for line in text.lines().filter(|l| events.iter().any(|e| l.contains(e))) {
            eprintln!("{}", line.chars().take(220).collect::<String>());
        }
    }
}

/// Sum of the next offsets every partition manifest in the store records, and how many exist.
fn stored_progress(remote: &Remote) -> (i64, usize) {
    let mut total = 0;
    let prefixes = ultr::scale_out::partition_prefixes(remote).unwrap_or_default();
    for p in &prefixes {
        if let Ok(Some(m)) = remote.manifest(p) {
            total += m.resume.0.values().flat_map(|parts| parts.values()).sum::<i64>();
        }
    }
    (total, prefixes.len())
}

/// What must be equal: π rows, swap edges, counters (without `windows_closed`, which counts
/// per-partition closes), per-window totals, dead letters, offsets read.
fn snapshot(state: &Path) -> (Vec<String>, Vec<String>, String, String, String) {
    let manifest = ultr::state::read_manifest(state).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = rt.block_on(ultr::state::cumulative::compute(&ultr::context::PipelineContext::default(), state, &manifest, i64::MAX / 4)).unwrap();
    let k = &manifest.operator.counters;
    let counters =
        format!("sessions {} impressions {} late {}/{} duplicates {}", k.sessions, k.impressions, k.late_sessions, k.late_impressions, k.duplicate_sessions);
    let windows: Vec<_> = manifest.windows.iter().map(|w| (w.start_ms, w.end_ms, w.sessions, w.impressions)).collect();
    (
        sorted_rows(&c.propensity),
        sorted_rows(&c.swap_edges),
        counters,
        format!("{windows:?}"),
        format!("dead letters {:?}; offsets {:?}", manifest.dead_letters, manifest.resume),
    )
}

#[test]
fn three_instances_with_a_kill_and_a_late_joiner_equal_one_instance_row_for_row() {
    let t0 = Instant::now();
    let topic = unique("scale-out");
    ensure_topic(&brokers(), &topic, PARTITIONS).unwrap();
    let records = publish(&topic);
    eprintln!("[{:5.1}s] published {records} records ({SESSIONS} sessions) to {PARTITIONS} partitions", t0.elapsed().as_secs_f64());

    // The reference: one instance, local state.
    let mut work = tempfile::tempdir().unwrap();
    if keep_history() {
        work.disable_cleanup(true);
        eprintln!("logs in {}", work.path().display());
    }
    let reference = work.path().join("reference");
    // Checkpoint frequency does not change what is counted; the reference checkpoints rarely.
    let single_text = config_text(&topic, &unique("single"), None).replace("checkpoint_every_records = 400", "checkpoint_every_records = 1000000");
    let single = PipelineConfig::parse(&single_text, "single.toml").unwrap();
    let report = run_to_state(&single, &reference, &mut NoObserver).unwrap();
    assert_eq!(report.records, records, "the single instance read every record once");
    eprintln!("[{:5.1}s] single instance: {} records, {} sessions", t0.elapsed().as_secs_f64(), report.records, report.counters.sessions);

    // Three instances of one group over the object store.
    let store = store_config(&unique("scale"));
    let remote = Remote::open(&store, &Default::default()).unwrap();
    let config = work.path().join("scaled.toml");
    std::fs::write(&config, config_text(&topic, &unique("group"), Some(&store))).unwrap();
    PipelineConfig::load(&config).unwrap();
    let logs: Vec<_> = ["a", "b", "c"].iter().map(|n| work.path().join(format!("{n}.log"))).collect();
    // B joins first and so leads the group: tansu keeps a member that missed its heartbeats as the
    // leader, and then nobody computes an assignment, so the instance killed below must not lead.
    let mut b = spawn_instance(&config, &work.path().join("b"), &logs[1]);
    wait_for_partitions(&logs[1], 1, "B");
    let mut a = spawn_instance(&config, &work.path().join("a"), &logs[0]);
    wait_for_partitions(&logs[0], 1, "A");
    // Kill A once the store has moved on by a tenth of the records since A took its partitions,
    // well before the end.
    let (at_assignment, _) = stored_progress(&remote);
    let deadline = Instant::now() + Duration::from_secs(120);
    let (at_kill, stored_partitions) = loop {
        let (progress, partitions) = stored_progress(&remote);
        if partitions >= 4 && progress >= at_assignment + records as i64 / 10 {
            break (progress, partitions);
        }
        assert!(Instant::now() < deadline, "no progress in the object store: {progress} offsets over {partitions} partitions");
        std::thread::sleep(Duration::from_millis(50));
    };
    a.0.kill().unwrap(); // SIGKILL: no checkpoint, no goodbye to the group
    common::wait_within(&mut a.0, Duration::from_secs(30)).expect("instance A exits within 30 s of SIGKILL");
    eprintln!(
        "[{:5.1}s] SIGKILLed instance A; the store then held {at_kill} of {records} offsets over {stored_partitions} partitions",
        t0.elapsed().as_secs_f64()
    );
    assert!(at_kill < records as i64, "A was killed mid-stream");
    // C joins once the group has handed A's partitions to B (after `session.timeout.ms`).
    wait_for_partitions(&logs[1], PARTITIONS as usize, "B");
    eprintln!("[{:5.1}s] B took A's partitions over", t0.elapsed().as_secs_f64());
    let mut c = spawn_instance(&config, &work.path().join("c"), &logs[2]);
    eprintln!("[{:5.1}s] started instance C", t0.elapsed().as_secs_f64());
    for (name, child) in [("B", &mut b), ("C", &mut c)] {
        let deadline = Instant::now() + Duration::from_secs(240);
        let status = loop {
            if let Some(s) = child.0.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.0.kill();
                // The temporary directory goes with the panic: print what the logs say instead.
                print_partition_history(&logs);
                panic!("instance {name} did not finish; the last lines of B's log:\n{}\nand of C's:\n{}", tail(&logs[1]), tail(&logs[2]));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = std::fs::read_to_string(&logs[if name == "B" { 1 } else { 2 }]).unwrap();
        assert!(status.success(), "instance {name} failed:\n{log}");
        let tasks = log.matches("partition task started").count();
        eprintln!("[{:5.1}s] instance {name} exited; it ran {tasks} partition tasks", t0.elapsed().as_secs_f64());
        if name == "C" && tasks == 0 {
            print_partition_history(&logs);
            panic!("the late joiner took no partition over; its log:\n{log}");
        }
    }

    // The merged view, compacted on demand (waits for a lease a killed instance may still hold).
    let merged_root = work.path().join("merged-root");
    let out = Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["compact", "--config"])
        .arg(&config)
        .arg("--state")
        .arg(&merged_root)
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.success(), "ultr compact: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("[{:5.1}s] {}", t0.elapsed().as_secs_f64(), String::from_utf8_lossy(&out.stdout).trim());

    if keep_history() {
        print_partition_history(&logs);
    }
    let merged = ultr::scale_out::merged_dir(&merged_root);
    let (want_pi, want_swaps, want_counters, want_windows, want_rest) = snapshot(&reference);
    let (got_pi, got_swaps, got_counters, got_windows, got_rest) = snapshot(&merged);
    assert!(want_pi.len() > 100 && want_swaps.len() > 10, "a non-trivial reference: {} π rows, {} swap edges", want_pi.len(), want_swaps.len());
    if (&got_counters, &got_windows, &got_rest) != (&want_counters, &want_windows, &want_rest) {
        print_partition_history(&logs);
    }
    assert_eq!(got_counters, want_counters);
    assert_eq!(got_windows, want_windows);
    assert_eq!(got_rest, want_rest, "dead letters and offsets read");
    assert_eq!(got_pi.len(), want_pi.len());
    for (g, w) in got_pi.iter().zip(&want_pi) {
        assert_eq!(g, w, "cumulative π row");
    }
    assert_eq!(got_swaps, want_swaps, "swap graph");
    let end: BTreeMap<i32, i64> = ultr::state::read_manifest(&merged).unwrap().resume.0.values().flat_map(|p| p.clone()).collect();
    assert_eq!(end.len(), PARTITIONS as usize);
    assert_eq!(end.values().sum::<i64>(), records as i64, "every record read once");
    eprintln!(
        "[{:5.1}s] merged view equals the single instance: {} π rows, {} swap edges, {want_counters}, {want_rest}",
        t0.elapsed().as_secs_f64(),
        got_pi.len(),
        got_swaps.len()
    );
}

/// Regression test (an instance exited with a third of the topic unread when a killed member's
/// partitions had not yet been reassigned): with `idle_exit_ms`, an instance whose own partitions
/// are done waits while a stalled group member holds the others, then reads them when that member
/// leaves, and exits with every record stored.
#[test]
fn a_bounded_instance_waits_for_partitions_a_stalled_member_holds() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let t0 = Instant::now();
    let topic = unique("stalled");
    ensure_topic(&brokers(), &topic, PARTITIONS).unwrap();
    let records = publish_sessions(&topic, 3_000);
    let group = unique("group");
    let store = store_config(&unique("stalled"));
    let remote = Remote::open(&store, &Default::default()).unwrap();
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("scaled.toml");
    std::fs::write(&config, config_text(&topic, &group, Some(&store))).unwrap();

    // The stalled member: joins the group first, takes partitions, never reads or commits them.
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicUsize::new(0));
    let member = {
        let (stop, held, topic, group) = (stop.clone(), held.clone(), topic.clone(), group.clone());
        std::thread::spawn(move || {
            let consumer: BaseConsumer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .set("group.id", &group)
                .set("enable.auto.commit", "false")
                .set("partition.assignment.strategy", "cooperative-sticky")
                .set("session.timeout.ms", SESSION_TIMEOUT_MS)
                .set("heartbeat.interval.ms", "1000")
                .create()
                .unwrap();
            consumer.subscribe(&[&topic]).unwrap();
            while !stop.load(Ordering::SeqCst) {
                let _ = consumer.poll(Duration::from_millis(100));
                held.store(consumer.assignment().map(|a| a.count()).unwrap_or(0), Ordering::SeqCst);
            }
            consumer.unsubscribe();
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while held.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the stalled member never got partitions");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = work.path().join("b.log");
    let mut b = spawn_instance(&config, &work.path().join("b"), &log);
    eprintln!("[{:5.1}s] the stalled member holds {} partitions; started instance B", t0.elapsed().as_secs_f64(), held.load(Ordering::SeqCst));

    // B gets its share, reads it, and then has nothing to do for longer than idle_exit_ms (12 s).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (progress, partitions) = stored_progress(&remote);
        if partitions > 0 && progress > 0 {
            break;
        }
        assert!(b.0.try_wait().unwrap().is_none(), "B exited before storing anything:\n{}", std::fs::read_to_string(&log).unwrap());
        assert!(Instant::now() < deadline, "B stored nothing");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(25));
    let still_held = held.load(Ordering::SeqCst);
    let (progress, _) = stored_progress(&remote);
    eprintln!("[{:5.1}s] B has stored {progress} of {records} offsets; the stalled member holds {still_held} partitions", t0.elapsed().as_secs_f64());
    assert!(still_held > 0 && progress < records as i64, "the stalled member must still hold unread partitions for this test to mean anything");
    assert!(b.0.try_wait().unwrap().is_none(), "B left with {} of {records} offsets stored:\n{}", progress, std::fs::read_to_string(&log).unwrap());

    // The stalled member leaves; B takes its partitions over and finishes the topic.
    stop.store(true, Ordering::SeqCst);
    member.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = b.0.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = b.0.kill();
            panic!("B did not finish after the stalled member left:\n{}", std::fs::read_to_string(&log).unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{}", std::fs::read_to_string(&log).unwrap());
    let (progress, partitions) = stored_progress(&remote);
    eprintln!("[{:5.1}s] B exited; the store holds {progress} of {records} offsets over {partitions} partitions", t0.elapsed().as_secs_f64());
    assert_eq!((progress, partitions), (records as i64, PARTITIONS as usize), "every partition stored to its end");
}
