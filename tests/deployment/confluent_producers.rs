//! Producers nobody here wrote (issue 88): PyPI's `confluent-kafka` publishes simulated sessions to
//! the test broker with its own `AvroSerializer` and `ProtobufSerializer`, which register their
//! schemas with the registry (`common::registry`, a stand-in: see there why). `ultr` reads each
//! topic through the registry, and its state equals, table for table, the state of the same
//! sessions published as JSON. So does its state from a file of the same sessions in a producer's
//! own Protobuf message (other numbers, names and fields: tests/deployment/data/other_numbers.proto)
//! read by name through protoc's descriptor set.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::{registry::Registry, state_tables, OutputWithin};
use ultr::config::PipelineConfig;
use ultr::pipeline::{run_to_state, NoObserver};
use ultr::simulate::policy::Sampling;
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::jsonl::JsonlSink;
use ultr::sinks::kafka::{ensure_topic, KafkaSink};

fn brokers() -> String {
    std::env::var("ULTR_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn python() -> String {
    std::env::var("ULTR_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// `ULTR_CONFLUENT_SESSIONS` sets the count.
#[test]
fn sessions_from_confluent_kafka_serializers_and_by_a_descriptor_set_give_the_state_of_the_same_sessions_as_json() {
    let n: u64 = std::env::var("ULTR_CONFLUENT_SESSIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(5_000);
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 200, docs_per_query: 10, features: 4 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, sampling: Sampling::EpsilonGreedy, ..PolicyConfig::default() },
        log_propensity: true,
        sessions: n,
        seed: 21,
        ..SimConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("sessions.jsonl");
    sim.run(&mut JsonlSink::create(&jsonl).unwrap()).unwrap();
    let brokers = brokers();
    let registry = Registry::start();
    // One partition each: the three topics hold the sessions in one order, as the windows must see them.
    let topics: Vec<(String, &str)> = ["json", "avro", "protobuf"].iter().map(|f| (unique(&format!("ultr-confluent-{f}")), *f)).collect();
    for (topic, _) in &topics {
        ensure_topic(&brokers, topic, 1).unwrap();
    }
    sim.run(&mut KafkaSink::new(&brokers, &topics[0].0, &Default::default()).unwrap()).unwrap();

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (other, descriptor) = (dir.path().join("sessions.acme"), dir.path().join("acme.desc"));
    let out = Command::new(python())
        .arg(root.join("tests/deployment/confluent_produce.py"))
        .args(["--brokers", &brokers, "--registry", &registry.url()])
        .arg("--sessions")
        .arg(&jsonl)
        .arg("--avsc")
        .arg(root.join("schemas/session.avsc"))
        .arg("--proto")
        .arg(root.join("schemas/session.proto"))
        .args(["--avro-topic", &topics[1].0, "--protobuf-topic", &topics[2].0])
        .arg("--other-proto")
        .arg(root.join("tests/deployment/data/other_numbers.proto"))
        .arg("--other-out")
        .arg(&other)
        .arg("--other-descriptor-out")
        .arg(&descriptor)
        .output_within(Duration::from_secs(300))
        .unwrap_or_else(|e| panic!("{} (set ULTR_PYTHON to a python with confluent-kafka; scripts/test.sh installs one): {e}", python()));
    assert!(out.status.success(), "confluent-kafka producer: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("\"published\": {n}")), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(registry.id_lookups.load(std::sync::atomic::Ordering::SeqCst) == 0, "nothing was read yet");

    let mut states = Vec::new();
    for (topic, format) in &topics {
        let decode = match *format {
            "json" => String::new(),
            f => format!("format = \"{f}\"\n[decode.schema_registry]\nurl = \"{}\"\n", registry.url()),
        };
        let text = format!(
            "[source.kafka]\nbrokers = \"{brokers}\"\ngroup_id = \"{}\"\ntopics = [\"{topic}\"]\nidle_exit_ms = 5000\n[source.kafka.properties]\n\"fetch.wait.max.ms\" = \"100\"\n[decode]\n{decode}[window]\nsize = \"10m\"\nallowed_lateness = \"1m\"\n[state]\nretention = \"3650d\"\nlookback = \"3650d\"\n",
            unique("ultr-confluent")
        );
        let config = PipelineConfig::parse(&text, "confluent.toml").unwrap();
        let state = dir.path().join(format!("state-{format}"));
        let report = run_to_state(&config, &state, &mut NoObserver).unwrap();
        assert_eq!(report.records, n, "{format}: every record read");
        assert_eq!(report.dead_letters.values().sum::<u64>(), 0, "{format}: {:?}", report.dead_letters);
        states.push((*format, state_tables(&state)));
    }
    // Each format's schema was fetched once (one id each), however many records carried it.
    assert_eq!(registry.id_lookups.load(std::sync::atomic::Ordering::SeqCst), 2, "one lookup per schema id");
    let text = format!(
        "[source.file]\npaths = [{:?}]\n[decode]\nformat = \"protobuf\"\nprotobuf_descriptor_set = {:?}\nprotobuf_message = \"acme.logs.Impressions\"\n[window]\nsize = \"10m\"\nallowed_lateness = \"1m\"\n[state]\nretention = \"3650d\"\nlookback = \"3650d\"\n",
        other.display().to_string(),
        descriptor.display().to_string()
    );
    let state = dir.path().join("state-descriptor");
    let report = run_to_state(&PipelineConfig::parse(&text, "descriptor.toml").unwrap(), &state, &mut NoObserver).unwrap();
    assert_eq!(report.records, n, "descriptor set: every record read");
    assert_eq!(report.dead_letters.values().sum::<u64>(), 0, "descriptor set: {:?}", report.dead_letters);
    states.push(("protobuf by descriptor set", state_tables(&state)));
    let (_, (want_tables, want_counters)) = &states[0];
    assert!(want_tables.len() >= 3, "{} window tables", want_tables.len());
    for (format, (tables, counters)) in &states[1..] {
        assert_eq!(counters, want_counters, "{format}: counters differ from JSON's");
        assert_eq!(tables.len(), want_tables.len());
        for (got, want) in tables.iter().zip(want_tables) {
            assert!(got == want, "{format}: window {} table {} differs from JSON's", want.0, want.1);
        }
    }
}
