//! Against a real Kafka-protocol broker (the README's test command starts tansu on 127.0.0.1:9092,
//! or set ULTR_KAFKA_BROKERS): ≥ 100,000 simulated sessions go simulator → broker → Kafka source,
//! every session arrives exactly once, and the impressions equal the file path's.

use crate::common;
use crate::common::OutputWithin;

use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

use datafusion::arrow::array::AsArray;
use ultr::ingest::{Ingest, Next};
use ultr::session::DecodeLimits;
use ultr::simulate::click::{ClickModel, ClickModelKind};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::dead_letter::DeadLetterSink;
use ultr::sinks::jsonl::JsonlSink;
use ultr::sinks::kafka::{ensure_topic, KafkaSink};
use ultr::sources::file::FileSource;
use ultr::sources::kafka::{KafkaSource, KafkaSourceConfig};

fn brokers() -> String {
    std::env::var("ULTR_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

#[test]
fn hundred_thousand_sessions_round_trip_exactly_once() {
    const SESSIONS: u64 = 100_000;
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 300, docs_per_query: 10, features: 8 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.2, ..PolicyConfig::default() },
        click_model: ClickModel { kind: ClickModelKind::Dcm, ..ClickModel::default() },
        sessions: SESSIONS,
        seed: 99,
        ..SimConfig::default()
    })
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sessions.jsonl.gz");
    sim.run(&mut JsonlSink::create(&file).unwrap()).unwrap();

    let topic = unique("ultr-roundtrip");
    let brokers = brokers();
    ensure_topic(&brokers, &topic, 4).unwrap_or_else(|e| panic!("broker at {brokers} unreachable ({e:#}); run the README's test command, which starts one"));
    let mut sink = KafkaSink::new(&brokers, &topic, &Default::default()).unwrap();
    sim.run(&mut sink).unwrap();
    assert_eq!(sink.delivered(), SESSIONS);

    let config = KafkaSourceConfig {
        brokers: brokers.clone(),
        group_id: unique("ultr-test"),
        topics: vec![topic.clone()],
        properties: [("fetch.wait.max.ms".to_string(), "100".to_string())].into(),
        idle_exit_ms: Some(10_000),
    };
    let mut ingest = Ingest::new(KafkaSource::new(&config, Default::default()).unwrap(), DecodeLimits::default(), 4096);
    let mut kafka_batches = Vec::new();
    let mut records = 0;
    let mut partitions = HashSet::new();
    loop {
        match ingest.next().unwrap() {
            Next::Batch(b) => {
                assert!(b.dead_letters.is_empty(), "{:?}", b.dead_letters.first().map(|d| &d.detail));
                records += b.records;
                for (stream, parts) in &b.resume.0 {
                    assert_eq!(stream, &format!("kafka:{topic}"));
                    partitions.extend(parts.keys().copied());
                }
                kafka_batches.push(b.impressions);
            }
            Next::Idle => continue,
            Next::End => break,
        }
    }
    assert_eq!(records as u64, SESSIONS, "every message read once");
    assert!(partitions.len() > 1, "sessions spread over partitions: {partitions:?}");

    // Exactly once: each session id appears once (its rows are contiguous in one message).
    let mut ids = HashSet::new();
    for b in &kafka_batches {
        let sid = b.column(0).as_string::<i32>();
        let pos = b.column(6).as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
        for i in 0..b.num_rows() {
            if pos.value(i) == 1 {
                assert!(ids.insert(sid.value(i).to_string()), "session {} twice", sid.value(i));
            }
        }
    }
    assert_eq!(ids.len() as u64, SESSIONS);

    // Same impressions as the file path (Kafka interleaves partitions, so compare as sorted rows).
    let mut dead = DeadLetterSink::discard();
    let mut file_ingest = Ingest::new(FileSource::open(&file, 0).unwrap(), DecodeLimits::default(), 4096);
    let mut file_rows = common::rows(&common::collect(&mut file_ingest, &mut dead));
    let mut kafka_rows = common::rows(&kafka_batches);
    file_rows.sort_unstable();
    kafka_rows.sort_unstable();
    assert_eq!(kafka_rows.len(), file_rows.len());
    assert!(kafka_rows == file_rows, "Kafka and file impressions differ");

    // Committed offsets leave no lag.
    ingest.source().commit(ingest.resume(), true).unwrap();
    let lag = ingest.source().lag(ingest.resume());
    assert!(!lag.is_empty());
    assert!(lag.values().all(|&l| l == 0), "lag after full read: {lag:?}");
}

/// A restart from saved resume offsets reads only what came after them.
#[test]
fn restart_from_resume_offsets_skips_what_was_read() {
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 20, docs_per_query: 5, features: 2 },
        relevance: RelevanceKind::Linear,
        sessions: 2_000,
        seed: 5,
        ..SimConfig::default()
    })
    .unwrap();
    let brokers = brokers();
    let topic = unique("ultr-resume");
    ensure_topic(&brokers, &topic, 2).unwrap();
    // One record per batch: tansu 0.6 serves a fetch only from a record-batch boundary (a fetch
    // from inside a batch returns the batches after it), and the resume point here is mid-stream.
    let mut sink = KafkaSink::new(&brokers, &topic, &[("batch.num.messages".to_string(), "1".to_string())].into()).unwrap();
    sim.run(&mut sink).unwrap();

    let config = |group: &str| KafkaSourceConfig {
        brokers: brokers.clone(),
        group_id: group.to_string(),
        topics: vec![topic.clone()],
        properties: Default::default(),
        idle_exit_ms: Some(5_000),
    };
    // First reader stops after one batch and keeps its resume offsets.
    let mut first = Ingest::new(KafkaSource::new(&config(&unique("g1")), Default::default()).unwrap(), DecodeLimits::default(), 300);
    let first_sessions = loop {
        if let Next::Batch(b) = first.next().unwrap() {
            break b.sessions;
        }
    };
    let saved = first.resume().clone();
    drop(first);
    // A fresh group resumes from the saved offsets (the manifest is the truth, not the group).
    let mut second = Ingest::new(KafkaSource::new(&config(&unique("g2")), saved).unwrap(), DecodeLimits::default(), 1000);
    let mut rest = 0;
    loop {
        match second.next().unwrap() {
            Next::Batch(b) => rest += b.sessions,
            Next::Idle => continue,
            Next::End => break,
        }
    }
    assert_eq!(first_sessions + rest, 2_000);
}

/// A dead-letter topic on a broker that is down never stops ingest: the run finishes and counts
/// every valid session; undeliverable letters are counted, not retried forever.
#[test]
fn an_unreachable_dead_letter_topic_does_not_block_ingest() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 20, docs_per_query: 5, features: 2 },
        relevance: RelevanceKind::Linear,
        sessions: 3_000,
        seed: 8,
        ..SimConfig::default()
    })
    .unwrap();
    let file = dir.path().join("s.jsonl");
    sim.run(&mut JsonlSink::create(&file).unwrap()).unwrap();
    let mut lines: Vec<String> = std::fs::read_to_string(&file).unwrap().lines().map(str::to_string).collect();
    for i in 0..50 {
        lines.insert(i * 50 + 1, "{\"broken\":".to_string());
    }
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(); // closed again at once
    let config = ultr::config::PipelineConfig::parse(
        &format!(
            "batch_records = 500\n[source.file]\npaths = [{:?}]\n[dead_letter.kafka]\nbrokers = \"127.0.0.1:{dead_port}\"\ntopic = \"dlq\"\n\
             [dead_letter.kafka.properties]\n\"message.timeout.ms\" = \"2000\"\n[window]\nsize = \"1m\"\n[state]\ncheckpoint_every_records = 1000\n",
            file.display().to_string()
        ),
        "dlq-down.toml",
    )
    .unwrap();
    let started = std::time::Instant::now();
    let report = ultr::pipeline::run_to_state(&config, &dir.path().join("state"), &mut ultr::pipeline::NoObserver).unwrap();
    assert_eq!(report.counters.sessions, 3_000);
    assert_eq!(report.dead_letters.values().sum::<u64>(), 50);
    assert!(report.dead_letter_failures > 0, "undelivered letters are counted");
    eprintln!("ingest with an unreachable dead-letter broker finished in {:?}", started.elapsed());
}

/// Dead letters to a Kafka topic keep the original bytes and carry the reason in headers.
#[test]
fn dead_letters_to_kafka_carry_bytes_and_reason() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    use ultr::session::Reason;
    use ultr::sinks::dead_letter::DeadLetter;
    use ultr::sources::SourcePosition;

    let brokers = brokers();
    let topic = unique("ultr-dlq");
    ensure_topic(&brokers, &topic, 1).unwrap();
    let mut dead = DeadLetterSink::kafka(KafkaSink::new(&brokers, &topic, &Default::default()).unwrap());
    // The third is a 4 MiB record: Kafka's ~1 MB message limit used to make its letter fail
    // forever (and the replay hit it again); now it travels cut to the cap, hash and length kept.
    let huge = format!("{{\"session_id\": \"{}", "y".repeat(4 << 20)).into_bytes();
    let letters = [(vec![0xff, 0x00, 0x7b], Reason::NotUtf8), (b"{\"schema_version\":1".to_vec(), Reason::InvalidJson), (huge.clone(), Reason::InvalidJson)];
    for (i, (bytes, reason)) in letters.iter().enumerate() {
        dead.write(&DeadLetter {
            reason: *reason,
            detail: format!("detail {i}"),
            payload: bytes.clone(),
            position: SourcePosition { stream: "file:x".into(), partition: 0, offset: i as i64 * 10 },
        })
        .unwrap();
    }
    dead.flush().unwrap();
    assert_eq!(dead.counts().total(), 3);
    assert_eq!(dead.failed(), 0, "every letter delivered");

    let consumer: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", unique("dlq-reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut huge_headers = None;
    while got.len() < 3 && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(std::time::Duration::from_millis(200)) {
            let headers = m.headers().unwrap();
            let header = |key: &str| {
                (0..headers.count()).map(|i| headers.get(i)).find(|h| h.key == key).and_then(|h| h.value).map(|v| String::from_utf8_lossy(v).into_owned())
            };
            if got.len() == 2 {
                huge_headers = Some((header("ultr.payload_bytes"), header("ultr.payload_sha256"), header("ultr.truncated")));
            }
            got.push((m.payload().unwrap().to_vec(), header("ultr.reason").unwrap()));
        }
    }
    assert_eq!(got.len(), 3);
    for ((bytes, reason), (got_bytes, got_reason)) in letters.iter().zip(&got).take(2) {
        assert_eq!(bytes, got_bytes);
        assert_eq!(reason.as_str(), got_reason);
    }
    let (cut, _) = &got[2];
    assert!(cut.len() <= ultr::sinks::dead_letter::DEFAULT_MAX_PAYLOAD_BYTES && huge.starts_with(cut));
    let (length, sha, truncated) = huge_headers.unwrap();
    assert_eq!(length.as_deref(), Some(huge.len().to_string().as_str()));
    assert_eq!(sha, Some(ultr::sinks::dead_letter::sha256_hex(&huge)));
    assert_eq!(truncated.as_deref(), Some("true"));
}

/// `ultr import --topic`: a released click log's pages arrive on the broker as contract sessions
/// keyed by query id, the same records (as sorted impressions) as `ultr import --out`.
#[test]
fn imported_click_log_reaches_the_topic_as_the_file_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("search.log");
    let mut lines = Vec::new();
    for s in 0..400u32 {
        let q = 100 + s % 17;
        let urls: Vec<String> = (0..5).map(|k| format!("{}", 7_000 + (q * 31 + k * 7 + s % 3) % 60)).collect();
        lines.push(format!("{s}\t{}\tQ\t{q}\t0.0\t{}", s * 1000, urls.join("\t")));
        lines.push(format!("{s}\t{}\tC\t{}", s * 1000 + 300, urls[(s % 5) as usize]));
    }
    lines.push("400\tnot-a-time\tQ\t1\t0.0\t5".to_string());
    std::fs::write(&log, lines.join("\n")).unwrap();
    let ultr = env!("CARGO_BIN_EXE_ultr");
    // A day ago: a live source refuses event times older than `decode.max_event_age`.
    let base = (chrono::Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    let topic = unique("ultr-import");
    let brokers = brokers();
    let import = |args: &[&str]| {
        let out = std::process::Command::new(ultr)
            .arg("import")
            .arg(&log)
            .args(["--base-time", &base, "--json", "--dead-letter"])
            .arg(dir.path().join("dead.jsonl"))
            .args(args)
            .output_within(crate::common::CHILD_DEADLINE)
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let file = dir.path().join("sessions.jsonl");
    let to_file = import(&["--out", file.to_str().unwrap()]);
    let to_topic = import(&["--topic", topic.as_str(), "--brokers", brokers.as_str(), "--partitions", "3"]);
    assert_eq!(to_file, to_topic);
    assert_eq!(to_topic["sessions"], 400);
    assert_eq!(to_topic["refused"]["malformed_log_line"], 1);

    let config = KafkaSourceConfig {
        brokers: brokers.clone(),
        group_id: unique("ultr-import-group"),
        topics: vec![topic.clone()],
        properties: [("fetch.wait.max.ms".to_string(), "100".to_string())].into(),
        idle_exit_ms: Some(5_000),
    };
    let mut ingest = Ingest::new(KafkaSource::new(&config, Default::default()).unwrap(), DecodeLimits::default(), 4096);
    let mut batches = Vec::new();
    loop {
        match ingest.next().unwrap() {
            Next::Batch(b) => {
                assert!(b.dead_letters.is_empty(), "{:?}", b.dead_letters.first().map(|d| &d.detail));
                batches.push(b.impressions);
            }
            Next::Idle => continue,
            Next::End => break,
        }
    }
    let mut dead = DeadLetterSink::discard();
    let mut file_ingest = Ingest::new(FileSource::open(&file, 0).unwrap(), DecodeLimits::default(), 4096);
    let mut file_rows = common::rows(&common::collect(&mut file_ingest, &mut dead));
    let mut kafka_rows = common::rows(&batches);
    file_rows.sort_unstable();
    kafka_rows.sort_unstable();
    assert_eq!(kafka_rows.len(), 2000);
    assert!(kafka_rows == file_rows, "the topic and the file differ");
}

/// Regression (CI, 2026-11-29: a replay's reference run ended at 783,420 of ~1M impressions): a read
/// with `idle_exit_ms` does not end while its broker stalls with records still below the high
/// watermark. A private broker holds 3,000 records; the consumer fetches a few KiB at a time; after
/// the first records arrive the broker is SIGSTOPped for three idle periods (2 s each), then resumed.
/// The read must end with all 3,000 records, each once.
#[test]
fn an_idle_exit_waits_out_a_stalled_broker_below_the_high_watermark() {
    use std::time::{Duration, Instant};
    use ultr::sinks::SessionSink;
    use ultr::sources::{Poll, RecordSource};

    const RECORDS: usize = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let broker = common::brokers::tansu(dir.path(), "stall", port, port, "memory://tansu/", false);
    let brokers = format!("127.0.0.1:{port}");
    let topic = unique("ultr-stall");
    ensure_topic(&brokers, &topic, 1).unwrap();
    // Record batches of 10 (a fetch returns at least one whole batch, whatever its byte limit).
    let mut sink = KafkaSink::new(&brokers, &topic, &[("batch.num.messages".to_string(), "10".to_string())].into()).unwrap();
    let payload = vec![b'x'; 1_000];
    for i in 0..RECORDS {
        sink.send(&i.to_string(), &payload).unwrap();
    }
    sink.flush().unwrap();

    // Small fetches and a small prefetch queue: most records are still on the broker when it stops.
    let properties = [("fetch.message.max.bytes", "4096"), ("queued.max.messages.kbytes", "8")];
    let config = KafkaSourceConfig {
        brokers: brokers.clone(),
        group_id: unique("ultr-stall"),
        topics: vec![topic.clone()],
        properties: properties.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        idle_exit_ms: Some(2_000),
    };
    let mut source = KafkaSource::new(&config, Default::default()).unwrap();
    let pid = broker.0.id().to_string();
    let signal = |name: &str| assert!(std::process::Command::new("kill").args([name, &pid]).output_within(common::CHILD_DEADLINE).unwrap().status.success());
    let (mut offsets, mut stopped_at, mut stopped_once) = (Vec::new(), None::<Instant>, false);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "the read did not end within 120 s ({} records)", offsets.len());
        if stopped_at.is_some_and(|at| at.elapsed() >= Duration::from_secs(6)) {
            signal("-CONT");
            stopped_at = None;
        }
        match source.poll(50).unwrap() {
            Poll::Records(records) => offsets.extend(records.iter().map(|r| r.position.offset)),
            Poll::Idle => {}
            Poll::End => break,
        }
        if !stopped_once && !offsets.is_empty() && offsets.len() < RECORDS {
            signal("-STOP");
            (stopped_at, stopped_once) = (Some(Instant::now()), true);
        }
    }
    if stopped_at.is_some() {
        signal("-CONT");
    }
    assert!(stopped_once, "the broker was never stopped (everything arrived in the first poll)");
    let read = offsets.len();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!((read, offsets.len()), (RECORDS, RECORDS), "(records read, distinct offsets) after the stall");
}

/// `partitions_behind` (what keeps a partition the broker serves late from going idle) names exactly
/// the fetched partitions with records not yet returned. A two-partition topic holds 2,000 records;
/// the source returns at most 40 per poll through small fetches. After each poll, the reference is
/// computed apart from the source: the broker's high watermark per partition (asked by a consumer of
/// the test's own) against the highest offset returned so far. For every partition that has returned
/// a record (so librdkafka holds its watermark), the source's answer must match the reference; at
/// some poll a partition must be behind; after the last record, none.
#[test]
fn partitions_behind_names_the_partitions_with_unread_records() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};
    use ultr::sinks::SessionSink;
    use ultr::sources::{Poll, RecordSource};

    const RECORDS: usize = 2_000;
    let topic = unique("ultr-behind");
    ensure_topic(&brokers(), &topic, 2).unwrap();
    let mut sink = KafkaSink::new(&brokers(), &topic, &[("batch.num.messages".to_string(), "10".to_string())].into()).unwrap();
    let payload = vec![b'x'; 500];
    for i in 0..RECORDS {
        sink.send(&i.to_string(), &payload).unwrap();
    }
    sink.flush().unwrap();
    let probe: BaseConsumer = rdkafka::ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let high: BTreeMap<i32, i64> = (0..2).map(|p| (p, probe.fetch_watermarks(&topic, p, Duration::from_secs(10)).unwrap().1)).collect();
    assert!(high.values().all(|h| *h > 0), "both partitions hold records: {high:?}");

    let properties = [("fetch.message.max.bytes", "4096"), ("queued.max.messages.kbytes", "8")];
    let config = KafkaSourceConfig {
        brokers: brokers(),
        group_id: unique("ultr-behind"),
        topics: vec![topic.clone()],
        properties: properties.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        idle_exit_ms: Some(2_000),
    };
    let mut source = KafkaSource::new(&config, Default::default()).unwrap();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let (mut read, mut polls_with_one_behind) = (0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "the read did not end within 120 s ({read} records)");
        match source.poll(40).unwrap() {
            Poll::Records(records) => {
                read += records.len();
                for r in &records {
                    let n = next.entry(r.position.partition).or_insert(0);
                    *n = (*n).max(r.position.offset + 1);
                }
            }
            Poll::Idle => continue,
            Poll::End => break,
        }
        let reported: Vec<String> = source.partitions_behind();
        for (p, n) in &next {
            let key = format!("kafka:{topic}[{p}]");
            let behind = *n < high[p];
            assert_eq!(reported.contains(&key), behind, "partition {p}: returned up to offset {n}, high watermark {}, reported {reported:?}", high[p]);
        }
        polls_with_one_behind += usize::from(!reported.is_empty());
    }
    assert_eq!(read, RECORDS);
    assert!(polls_with_one_behind > 0, "no poll found a partition behind: the check never ran");
    assert!(source.partitions_behind().is_empty(), "after the last record: {:?}", source.partitions_behind());
}
