//! Secured and compressed Kafka, for real: SASL/SCRAM-SHA-512 over TLS (`SASL_SSL`, the README's
//! production example) against a tansu broker with authentication behind a stunnel TLS listener,
//! with the password read from a file; and a zstd-compressed topic on the test broker.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::brokers::{certificates, create_scram_user, stunnel, tansu};
use common::free_port;
use ultr::config::PipelineConfig;
use ultr::pipeline::{run_to_state, NoObserver};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::kafka::{ensure_topic_with, KafkaSink};
use ultr::sinks::SessionSink;
use ultr::sources::kafka::{KafkaSource, KafkaSourceConfig};
use ultr::sources::{Poll, RecordSource};
use ultr::state::read_manifest;

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn publish(brokers: &str, topic: &str, properties: &BTreeMap<String, String>, n: u64) {
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 40, docs_per_query: 8, features: 3 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
        sessions: n,
        seed: 77,
        ..SimConfig::default()
    })
    .unwrap();
    let mut sink = KafkaSink::new(brokers, topic, properties).unwrap();
    sim.run(&mut sink).unwrap();
    sink.flush().unwrap();
    assert_eq!(sink.delivered(), n);
}

fn properties_toml(properties: &BTreeMap<String, String>) -> String {
    properties.iter().map(|(k, v)| format!("{k:?} = {v:?}\n")).collect()
}

#[test]
fn sasl_scram_over_tls_with_a_password_file() {
    let dir = tempfile::tempdir().unwrap();
    let (inner, tls) = (free_port(), free_port());
    let storage = "sqlite://tansu.db".to_string();
    // Users live in the broker's storage: create one on an open broker, then restart it with
    // authentication required, advertised at the TLS listener.
    {
        let _open = tansu(dir.path(), "tansu-open", inner, inner, &storage, false);
        create_scram_user(inner, "ultr", "correct horse");
    }
    let _broker = tansu(dir.path(), "tansu-auth", inner, tls, &storage, true);
    let (ca, cert, key) = certificates(dir.path());
    let _tls = stunnel(dir.path(), tls, inner, &cert, &key);
    let password = dir.path().join("kafka-password");
    std::fs::write(&password, "correct horse\n").unwrap();

    let brokers = format!("127.0.0.1:{tls}");
    let props: BTreeMap<String, String> = [
        ("security.protocol", "SASL_SSL".to_string()),
        ("sasl.mechanism", "SCRAM-SHA-512".to_string()),
        ("sasl.username", "ultr".to_string()),
        ("sasl.password", format!("file:{}", password.display())),
        ("ssl.ca.location", ca.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let topic = unique("ultr-sasl-ssl");
    ensure_topic_with(&brokers, &topic, 2, &props).unwrap();
    publish(&brokers, &topic, &props, 3_000);

    let config = PipelineConfig::parse(
        &format!(
            "[source.kafka]\nbrokers = {brokers:?}\ngroup_id = \"ultr-sasl\"\ntopics = [{topic:?}]\nidle_exit_ms = 5000\n[source.kafka.properties]\n{}[window]\nsize = \"1m\"\n",
            properties_toml(&props)
        ),
        "sasl.toml",
    )
    .unwrap();
    let state = dir.path().join("state");
    run_to_state(&config, &state, &mut NoObserver).unwrap();
    assert_eq!(read_manifest(&state).unwrap().operator.counters.sessions, 3_000);

    // A wrong password reads nothing, ends at the idle deadline and counts a source error, not a crash
    // (its kind is the broker's answer to the failed login: not asserted).
    std::fs::write(&password, "wrong\n").unwrap();
    let source_config = KafkaSourceConfig {
        brokers: brokers.clone(),
        group_id: "ultr-sasl-wrong".into(),
        topics: vec![topic.clone()],
        properties: props.clone(),
        idle_exit_ms: Some(4_000),
    };
    let mut source = KafkaSource::new(&source_config, Default::default()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match source.poll(1000).unwrap() {
            Poll::Records(r) => panic!("read {} records with a wrong password", r.len()),
            Poll::End => break,
            Poll::Idle => assert!(std::time::Instant::now() < deadline),
        }
    }
    let errors = source.health().unwrap().errors();
    assert!(!errors.is_empty(), "the failed login is counted: {errors:?}");
}

#[test]
fn a_zstd_compressed_topic_reads_every_session() {
    let brokers = std::env::var("ULTR_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let topic = unique("ultr-zstd");
    ensure_topic_with(&brokers, &topic, 2, &BTreeMap::new()).expect("broker reachable (the README's test command starts one)");
    for codec in ["zstd", "lz4", "snappy"] {
        let topic = format!("{topic}-{codec}");
        ensure_topic_with(&brokers, &topic, 2, &BTreeMap::new()).unwrap();
        let props: BTreeMap<String, String> = [("compression.type".to_string(), codec.to_string())].into();
        publish(&brokers, &topic, &props, 2_000);
        let dir = tempfile::tempdir().unwrap();
        let config = PipelineConfig::parse(
            &format!(
                "[source.kafka]\nbrokers = {brokers:?}\ngroup_id = {:?}\ntopics = [{topic:?}]\nidle_exit_ms = 4000\n[window]\nsize = \"1m\"\n",
                unique("g")
            ),
            "zstd.toml",
        )
        .unwrap();
        let report = run_to_state(&config, dir.path(), &mut NoObserver).unwrap();
        assert_eq!(report.records, 2_000, "{codec}");
        assert!(report.dead_letters.is_empty(), "{codec}: {:?}", report.dead_letters);
        assert_eq!(read_manifest(dir.path()).unwrap().operator.counters.sessions, 2_000, "{codec}");
    }
}
