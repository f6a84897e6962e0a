//! Against the real broker: the state, not the consumer group, decides where reading starts. A
//! restored backup re-reads what it lacks even though the group committed further; a group whose
//! committed offset is behind the state double-counts nothing; a partition added mid-run is read.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::copy_dir;
use ultr::config::PipelineConfig;
use ultr::pipeline::{run_to_state, NoObserver};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::kafka::{ensure_topic, KafkaSink};
use ultr::sinks::SessionSink;
use ultr::state::read_manifest;

fn brokers() -> String {
    std::env::var("ULTR_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// The simulated stream every test here publishes from (session i is the same in every call).
fn simulator(sessions: u64) -> Simulator {
    Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 50, docs_per_query: 10, features: 3 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
        sessions,
        seed: 31,
        ..SimConfig::default()
    })
    .unwrap()
}

/// Publishes sessions [from, from + n) of one simulated stream.
fn publish(topic: &str, from: u64, n: u64) {
    let sim = simulator(from + n);
    let mut sink = KafkaSink::new(&brokers(), topic, &Default::default()).unwrap();
    let mut buf = Vec::new();
    for i in from..from + n {
        let key = sim.session(i, &mut buf);
        sink.send(&key, &buf).unwrap();
    }
    sink.flush().unwrap();
}

fn config(topic: &str, group: &str) -> PipelineConfig {
    let text = format!(
        "[source.kafka]\nbrokers = {:?}\ngroup_id = {group:?}\ntopics = [{topic:?}]\nidle_exit_ms = 4000\n\
         [source.kafka.properties]\n\"fetch.wait.max.ms\" = \"100\"\n\"topic.metadata.refresh.interval.ms\" = \"1000\"\n\
         [window]\nsize = \"1m\"\nallowed_lateness = \"10s\"\n[state]\ncheckpoint_every_records = 2000\n",
        brokers()
    );
    PipelineConfig::parse(&text, "kafka-resume.toml").unwrap()
}

fn sessions_in(state: &Path) -> u64 {
    let c = read_manifest(state).unwrap().operator.counters;
    c.sessions + c.late_sessions + c.duplicate_sessions
}

#[test]
fn a_restored_state_rereads_what_it_lacks_although_the_group_committed_further() {
    let topic = unique("ultr-restore");
    ensure_topic(&brokers(), &topic, 3).expect("broker reachable (the README's test command starts one)");
    let group = unique("ultr-restore-group");
    let cfg = config(&topic, &group);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let backup = dir.path().join("backup");

    publish(&topic, 0, 10_000);
    run_to_state(&cfg, &state, &mut NoObserver).unwrap();
    assert_eq!(sessions_in(&state), 10_000);
    copy_dir(&state, &backup);

    publish(&topic, 10_000, 10_000);
    run_to_state(&cfg, &state, &mut NoObserver).unwrap(); // the group commits 20,000
    assert_eq!(sessions_in(&state), 20_000);

    std::fs::remove_dir_all(&state).unwrap();
    copy_dir(&backup, &state);
    run_to_state(&cfg, &state, &mut NoObserver).unwrap();
    assert_eq!(sessions_in(&state), 20_000, "the restored state must read the 10,000 sessions it lacks");
    let counters = read_manifest(&state).unwrap().operator.counters;
    assert_eq!(counters.duplicate_sessions, 0);
}

#[test]
fn a_group_behind_the_state_double_counts_nothing() {
    let topic = unique("ultr-behind");
    ensure_topic(&brokers(), &topic, 2).expect("broker reachable");
    let group = unique("ultr-behind-group");
    let cfg = config(&topic, &group);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    publish(&topic, 0, 6_000);
    run_to_state(&cfg, &state, &mut NoObserver).unwrap();
    assert_eq!(sessions_in(&state), 6_000);

    // Rewind the group to the beginning behind the state's back.
    {
        use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
        use rdkafka::{Offset, TopicPartitionList};
        let c: BaseConsumer = rdkafka::ClientConfig::new().set("bootstrap.servers", brokers()).set("group.id", &group).create().unwrap();
        let mut list = TopicPartitionList::new();
        for p in 0..2 {
            list.add_partition_offset(&topic, p, Offset::Offset(0)).unwrap();
        }
        c.commit(&list, CommitMode::Sync).unwrap();
    }
    publish(&topic, 6_000, 4_000);
    run_to_state(&cfg, &state, &mut NoObserver).unwrap();
    assert_eq!(sessions_in(&state), 10_000, "every session once: the state's offsets win over the group's");
}

/// Publishes sessions [from, from + n) round-robin to `partitions`.
fn publish_to(topic: &str, from: u64, n: u64, partitions: &[i32]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let sim = simulator(from + n);
    let producer: BaseProducer = rdkafka::ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let mut buf = Vec::new();
    for i in from..from + n {
        let key = sim.session(i, &mut buf);
        let p = partitions[(i % partitions.len() as u64) as usize];
        loop {
            match producer.send(BaseRecord::to(topic).key(&key).payload(&buf).partition(p)) {
                Ok(()) => break,
                Err(_) => {
                    producer.poll(Duration::from_millis(50));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// What a partition added to the topic looks like to a state: one it has never read. tansu 0.6 and
/// librdkafka's mock cluster both answer CreatePartitions with UnsupportedFeature, so the growth
/// itself cannot be staged here; this stages its effect, with the group already committed on the
/// new partitions (the worst case: the old code started there and skipped their head).
#[test]
fn a_partition_the_state_never_read_starts_at_its_beginning_not_at_the_group_offset() {
    let topic = unique("ultr-new-partition");
    ensure_topic(&brokers(), &topic, 3).expect("broker reachable");
    let group = unique("ultr-new-partition-group");
    let cfg = config(&topic, &group);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    publish_to(&topic, 0, 3_000, &[0]);
    run_to_state(&cfg, &state, &mut NoObserver).unwrap();
    let known: Vec<i32> = read_manifest(&state).unwrap().resume.0.values().flat_map(|p| p.keys().copied()).collect();
    assert_eq!(known, vec![0], "the state has read partition 0 only");

    publish_to(&topic, 3_000, 3_000, &[1, 2]);
    {
        use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
        use rdkafka::{Offset, TopicPartitionList};
        let c: BaseConsumer = rdkafka::ClientConfig::new().set("bootstrap.servers", brokers()).set("group.id", &group).create().unwrap();
        let mut list = TopicPartitionList::new();
        for p in [1, 2] {
            list.add_partition_offset(&topic, p, Offset::Offset(500)).unwrap();
        }
        c.commit(&list, CommitMode::Sync).unwrap();
    }
    run_to_state(&cfg, &state, &mut NoObserver).unwrap();
    let manifest = read_manifest(&state).unwrap();
    assert_eq!(manifest.resume.get(&format!("kafka:{topic}"), 1), Some(1_500));
    assert_eq!(manifest.resume.get(&format!("kafka:{topic}"), 2), Some(1_500));
    assert_eq!(sessions_in(&state), 6_000, "the new partitions are read from offset 0");
}
