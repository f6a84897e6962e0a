//! The binary formats (issue 88): Avro and Protobuf records of the same sessions decode to the rows
//! and state tables JSON gives; schema evolution (Avro resolution, Protobuf unknown fields); each
//! bad binary input dead-lettered with its named reason and original bytes; the schema registry's
//! cache, its absence at start and mid-run (`common::registry`, a stand-in: see there why).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{self, registry::Registry, state_tables};
use ultr::config::PipelineConfig;
use ultr::pipeline::{run_to_state, NoObserver};
use ultr::session::codec::{self, avro::Avro, avro::SESSION_AVSC, protobuf::Protobuf, Codec, SchemaRegistryConfig};
use ultr::session::{DecodeLimits, Decoder};
use ultr::simulate::policy::Sampling;
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::dead_letter::read_dead_letters;
use ultr::sinks::encode::Encoding;
use ultr::sinks::jsonl::JsonlSink;

fn simulator(sessions: u64, seed: u64) -> Simulator {
    Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 300, docs_per_query: 12, features: 5 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.3, sampling: Sampling::EpsilonGreedy, ..PolicyConfig::default() },
        log_propensity: true,
        sessions,
        seed,
        ..SimConfig::default()
    })
    .unwrap()
}

/// Simulated sessions plus hand-written ones that use every optional field and the JSON
/// contract's other spellings (integer ids, RFC 3339 time, 0/1 clicks, a context).
fn json_sessions(n: u64) -> Vec<Vec<u8>> {
    let sim = simulator(n, 3);
    let mut out: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut buf = Vec::new();
            sim.session(i, &mut buf);
            buf
        })
        .collect();
    out.push(br#"{"schema_version":1,"session_id":77,"query_id":"q-ctx","event_time":"2026-01-01T00:00:00.250Z","policy_id":"p","context":{"device":"mobile","layout":"grid"},"items":[{"doc_id":12,"position":1,"clicked":1,"features":[1,-0.0,3.5,0,1e-3],"bias_features":[0.5,2],"propensity":0.25},{"doc_id":"d2","position":2,"clicked":false}]}"#.to_vec());
    out
}

fn shipped_avro() -> Arc<dyn Codec> {
    Arc::new(Avro::with_writer_schema(SESSION_AVSC).unwrap())
}

#[test]
fn avro_and_protobuf_records_decode_to_the_rows_of_the_same_json_sessions() {
    let sessions = json_sessions(3_000);
    let mut json = Decoder::new(DecodeLimits::default());
    for s in &sessions {
        json.decode(s).unwrap();
    }
    let want = common::rows(&[json.finish()]);
    for codec in [shipped_avro(), Arc::new(Protobuf::shipped()) as Arc<dyn Codec>] {
        let mut decoder = Decoder::with_codec(DecodeLimits::default(), codec.clone());
        let mut bytes = 0usize;
        for s in &sessions {
            let mut out = Vec::new();
            codec.transcode_json(s, &mut out).unwrap();
            bytes += out.len();
            decoder.decode(&out).unwrap_or_else(|e| panic!("{}: {e}", codec.name()));
        }
        let got = common::rows(&[decoder.finish()]);
        assert_eq!(got.len(), want.len());
        assert!(got == want, "{}: the rows differ from JSON's", codec.name());
        let json_bytes: usize = sessions.iter().map(Vec::len).sum();
        eprintln!("{}: {bytes} bytes for {json_bytes} bytes of JSON", codec.name());
    }
}

fn file_config(file: &Path, decode: &str) -> PipelineConfig {
    let text = format!(
        "[source.file]\npaths = [{:?}]\n[decode]\n{decode}\n[window]\nsize = \"10m\"\nallowed_lateness = \"1m\"\n[state]\nretention = \"3650d\"\nlookback = \"3650d\"\n",
        file.display().to_string()
    );
    PipelineConfig::parse(&text, "codecs.toml").unwrap()
}

fn write_file(path: &Path, sim: &Simulator, codec: Arc<dyn Codec>) {
    let framing = codec.file_framing();
    let mut sink = Encoding::new(codec, JsonlSink::create(path).unwrap().framed(framing));
    sim.run(&mut sink).unwrap();
}

/// `ULTR_CODEC_SESSIONS` sets the count (the closing note used 200,000).
#[test]
fn the_same_sessions_as_json_avro_and_protobuf_files_give_equal_state_tables() {
    let n = std::env::var("ULTR_CODEC_SESSIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let sim = simulator(n, 11);
    let dir = tempfile::tempdir().unwrap();
    let avsc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/session.avsc");
    let formats = [
        ("json", "format = \"json\"".to_string()),
        ("avro", format!("format = \"avro\"\navro_schema = {:?}", avsc.display().to_string())),
        ("protobuf", "format = \"protobuf\"".to_string()),
    ];
    let mut states = Vec::new();
    for (name, decode) in &formats {
        let file = dir.path().join(format!("sessions.{name}"));
        let config = file_config(&file, decode);
        write_file(&file, &sim, codec::open(&config.decode.codec()).unwrap());
        let state = dir.path().join(format!("state-{name}"));
        let report = run_to_state(&config, &state, &mut NoObserver).unwrap();
        assert_eq!(report.records, n, "{name}: every record read");
        assert!(report.dead_letters.values().sum::<u64>() == 0, "{name}: {:?}", report.dead_letters);
        eprintln!("{name}: {} bytes", std::fs::metadata(&file).unwrap().len());
        states.push((name, state_tables(&state)));
    }
    let (_, (want_tables, want_counters)) = &states[0];
    assert!(want_tables.len() >= 5 * 3, "{} window tables", want_tables.len());
    for (name, (tables, counters)) in &states[1..] {
        assert_eq!(counters, want_counters, "{name}: counters differ from JSON's");
        assert_eq!(tables.len(), want_tables.len());
        for (got, want) in tables.iter().zip(want_tables) {
            assert!(got == want, "{name}: window {} table {} differs from JSON's", want.0, want.1);
        }
    }
}

// --- Avro written by hand (independently of the codec's encoder) ---------------------------------

fn zz(out: &mut Vec<u8>, v: i64) {
    let mut u = ((v << 1) ^ (v >> 63)) as u64;
    while u >= 0x80 {
        out.push((u as u8) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

fn avro_str(out: &mut Vec<u8>, s: &str) {
    zz(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

/// A writer schema one release ahead: `experiment` (optional) added to the session and to each
/// item, `context` and `propensity` removed, `items` moved before `policy_id`.
const NEWER_AVSC: &str = r#"{"type":"record","name":"Session","namespace":"ultr","fields":[
  {"name":"schema_version","type":"int"},
  {"name":"session_id","type":"string"},
  {"name":"experiment","type":["null","string"],"default":null},
  {"name":"query_id","type":"string"},
  {"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}},
  {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[
    {"name":"experiment","type":["null",{"type":"map","values":"long"}],"default":null},
    {"name":"doc_id","type":"string"},
    {"name":"position","type":"int"},
    {"name":"clicked","type":"boolean"},
    {"name":"features","type":["null",{"type":"array","items":"float"}],"default":null}]}}},
  {"name":"policy_id","type":"string"}]}"#;

fn newer_record(experiment: bool) -> Vec<u8> {
    let mut r = Vec::new();
    zz(&mut r, 1);
    avro_str(&mut r, "s-new");
    if experiment {
        zz(&mut r, 1);
        avro_str(&mut r, "exp-7");
    } else {
        zz(&mut r, 0);
    }
    avro_str(&mut r, "q-new");
    zz(&mut r, 1_767_225_600_000);
    zz(&mut r, 2);
    for (doc, pos, clicked) in [("a", 1, true), ("b", 2, false)] {
        if experiment {
            zz(&mut r, 1);
            zz(&mut r, 1);
            avro_str(&mut r, "bucket");
            zz(&mut r, 42);
            zz(&mut r, 0);
        } else {
            zz(&mut r, 0);
        }
        avro_str(&mut r, doc);
        zz(&mut r, pos);
        r.push(u8::from(clicked));
        zz(&mut r, 1);
        zz(&mut r, 2);
        r.extend_from_slice(&0.5f32.to_le_bytes());
        r.extend_from_slice(&(pos as f32).to_le_bytes());
        zz(&mut r, 0);
    }
    zz(&mut r, 0);
    avro_str(&mut r, "ranker");
    r
}

const NEWER_AS_JSON: &str = r#"{"schema_version":1,"session_id":"s-new","query_id":"q-new","event_time":1767225600000,"policy_id":"ranker","items":[{"doc_id":"a","position":1,"clicked":true,"features":[0.5,1]},{"doc_id":"b","position":2,"clicked":false,"features":[0.5,2]}]}"#;

fn rows_of(codec: Arc<dyn Codec>, records: &[Vec<u8>]) -> Vec<String> {
    let mut d = Decoder::with_codec(DecodeLimits::default(), codec);
    for r in records {
        d.decode(r).unwrap_or_else(|e| panic!("{e}"));
    }
    common::rows(&[d.finish()])
}

#[test]
fn an_avro_record_written_with_a_newer_schema_is_read_through_schema_resolution() {
    let want = rows_of(Arc::new(ultr::session::codec::json::Json::new()), &[NEWER_AS_JSON.as_bytes().to_vec()]);
    // Bare records with a local writer schema, and Confluent-framed ones with the schema by id.
    let newer: Arc<dyn Codec> = Arc::new(Avro::with_writer_schema(NEWER_AVSC).unwrap());
    assert_eq!(rows_of(newer.clone(), &[newer_record(true)]), want, "an added optional field is skipped");
    assert_eq!(rows_of(newer, &[newer_record(false)]), want, "and read when null");
    let registry = Registry::start();
    let older = registry.add("sessions-value", SESSION_AVSC, None);
    let id = registry.add("sessions-value", NEWER_AVSC, None);
    assert_ne!(older, id);
    let codec = codec::open(&registry_limits(&registry, "avro").codec()).unwrap();
    let mut framed = vec![0];
    framed.extend_from_slice(&id.to_be_bytes());
    framed.extend_from_slice(&newer_record(true));
    assert_eq!(rows_of(codec, &[framed]), want, "through the registry");
}

fn registry_limits(registry: &Registry, format: &str) -> DecodeLimits {
    DecodeLimits {
        format: format.into(),
        schema_registry: Some(SchemaRegistryConfig {
            url: registry.url(),
            subject: "sessions-value".into(),
            max_backoff: ultr::units::duration("500ms"),
            request_timeout: ultr::units::duration("2s"),
        }),
        ..DecodeLimits::default()
    }
}

// --- Protobuf written by hand --------------------------------------------------------------------

fn pb_key(out: &mut Vec<u8>, number: u64, wire: u64) {
    zz_plain(out, (number << 3) | wire);
}

fn zz_plain(out: &mut Vec<u8>, mut u: u64) {
    while u >= 0x80 {
        out.push((u as u8) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

fn pb_len(out: &mut Vec<u8>, number: u64, body: &[u8]) {
    pb_key(out, number, 2);
    zz_plain(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// `NEWER_AS_JSON` in session.proto's numbers, with fields 20–23 (one of each wire type) the reader
/// does not know, in the session and in each item.
fn protobuf_with_unknown_fields() -> Vec<u8> {
    let unknown = |out: &mut Vec<u8>| {
        pb_key(out, 20, 0);
        zz_plain(out, 300);
        pb_len(out, 21, b"from a newer producer");
        pb_key(out, 22, 5);
        out.extend_from_slice(&1.5f32.to_le_bytes());
        pb_key(out, 23, 1);
        out.extend_from_slice(&2.5f64.to_le_bytes());
    };
    let mut s = Vec::new();
    pb_key(&mut s, 1, 0);
    zz_plain(&mut s, 1);
    unknown(&mut s);
    pb_len(&mut s, 2, b"s-new");
    pb_len(&mut s, 3, b"q-new");
    let mut ts = Vec::new();
    pb_key(&mut ts, 1, 0);
    zz_plain(&mut ts, 1_767_225_600);
    pb_len(&mut s, 4, &ts);
    pb_len(&mut s, 5, b"ranker");
    for (doc, pos, clicked) in [("a", 1u64, true), ("b", 2, false)] {
        let mut item = Vec::new();
        unknown(&mut item);
        pb_len(&mut item, 1, doc.as_bytes());
        pb_key(&mut item, 2, 0);
        zz_plain(&mut item, pos);
        if clicked {
            pb_key(&mut item, 3, 0);
            zz_plain(&mut item, 1);
        }
        let mut packed = Vec::new();
        packed.extend_from_slice(&0.5f32.to_le_bytes());
        packed.extend_from_slice(&(pos as f32).to_le_bytes());
        pb_len(&mut item, 4, &packed);
        pb_len(&mut s, 7, &item);
    }
    s
}

#[test]
fn a_protobuf_record_with_fields_the_reader_does_not_know_reads_as_the_record_without_them() {
    let want = rows_of(Arc::new(ultr::session::codec::json::Json::new()), &[NEWER_AS_JSON.as_bytes().to_vec()]);
    assert_eq!(rows_of(Arc::new(Protobuf::shipped()), &[protobuf_with_unknown_fields()]), want);
}

// --- bad inputs ------------------------------------------------------------------------------------

/// The shipped schema's fields up to `context`, by hand: version 1, ids "s", "q", "p", a time.
fn avro_head() -> Vec<u8> {
    let mut r = Vec::new();
    zz(&mut r, 1);
    avro_str(&mut r, "s");
    avro_str(&mut r, "q");
    zz(&mut r, 1_767_225_600_000);
    avro_str(&mut r, "p");
    r
}

fn framed(id: u32, indexes: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    if indexes {
        out.push(0);
    }
    out.extend_from_slice(payload);
    out
}

/// The bad inputs of each binary format with the reason each must be dead-lettered with.
fn bad_inputs(format: &str, registry: &Registry) -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let good_json = json_sessions(1).remove(0);
    let (codec, protobuf): (Arc<dyn Codec>, bool) = match format {
        "avro" => (shipped_avro(), false),
        _ => (Arc::new(Protobuf::shipped()), true),
    };
    let mut payload = Vec::new();
    codec.transcode_json(&good_json, &mut payload).unwrap();
    let id =
        registry.add("sessions-value", if protobuf { ultr::session::codec::protobuf::SESSION_PROTO } else { SESSION_AVSC }, protobuf.then_some("PROTOBUF"));
    let good = framed(id, protobuf, &payload);
    let mut wrong_magic = good.clone();
    wrong_magic[0] = 1;
    // A string where the reader wants an integer.
    let mismatch = if protobuf {
        let mut s = Vec::new();
        pb_key(&mut s, 1, 0);
        zz_plain(&mut s, 1);
        pb_len(&mut s, 2, b"s");
        pb_len(&mut s, 3, b"q");
        let mut item = Vec::new();
        pb_len(&mut item, 1, b"d");
        pb_len(&mut item, 2, b"one");
        pb_len(&mut s, 7, &item);
        framed(id, true, &s)
    } else {
        let text = SESSION_AVSC.replace(r#"{"name": "position", "type": "int", "doc": "1-based"}"#, r#"{"name": "position", "type": "string"}"#);
        assert_ne!(text, SESSION_AVSC);
        let mismatch_id = registry.add("sessions-value", &text, None);
        let mut r = avro_head();
        zz(&mut r, 0);
        zz(&mut r, 1);
        avro_str(&mut r, "d");
        avro_str(&mut r, "one");
        r.push(0);
        r.extend_from_slice(&[0, 0, 0]);
        zz(&mut r, 0);
        framed(mismatch_id, false, &r)
    };
    // Ends inside a varint: the header and a lone continuation byte.
    let mut cut_varint = framed(id, protobuf, &[]);
    cut_varint.push(0x80 | 0x08);
    // A union branch (Avro) or a wire type (Protobuf) that does not exist.
    let broken = if protobuf {
        let mut s = payload.clone();
        s.extend_from_slice(&[(9 << 3) | 7, 0]);
        framed(id, true, &s)
    } else {
        let mut r = avro_head();
        zz(&mut r, 5); // `context` is a union of two branches
        framed(id, false, &r)
    };
    let mut oversize = good.clone();
    oversize.resize(70_000, 0);
    vec![
        ("a wrong magic byte", "bad_magic_byte", wrong_magic),
        ("a truncated payload", "truncated_payload", good[..good.len() - 3].to_vec()),
        ("a truncated varint", "truncated_varint", cut_varint),
        ("a type mismatch", "wrong_type", mismatch),
        ("an oversize record", "record_too_large", oversize),
        ("a broken encoding", "malformed_payload", broken),
        ("a schema id the registry does not know", "unknown_schema_id", framed(9_999, protobuf, &payload)),
        ("a good record", "", good),
    ]
}

#[test]
fn each_bad_binary_input_is_dead_lettered_with_its_named_reason_its_original_bytes_and_a_count() {
    let registry = Registry::start();
    for format in ["avro", "protobuf"] {
        let cases = bad_inputs(format, &registry);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("records.bin");
        let mut sink = JsonlSink::create(&file).unwrap().framed(ultr::session::codec::FileFraming::LengthDelimited);
        for (_, _, bytes) in &cases {
            ultr::sinks::SessionSink::send(&mut sink, "", bytes).unwrap();
        }
        drop(sink);
        let decode = format!("format = \"{format}\"\nmax_record_bytes = 65536\n[decode.schema_registry]\nurl = \"{}\"", registry.url());
        let state = dir.path().join("state");
        let report = run_to_state(&file_config(&file, &decode), &state, &mut NoObserver).unwrap();
        let letters = read_dead_letters(&state.join("dead-letters.jsonl")).unwrap();
        let bad: Vec<_> = cases.iter().filter(|c| !c.1.is_empty()).collect();
        assert_eq!(letters.len(), bad.len(), "{format}: {letters:?}");
        for ((what, reason, bytes), letter) in bad.iter().zip(&letters) {
            assert_eq!(&letter.reason, reason, "{format}, {what}: {}", letter.detail);
            assert_eq!(&letter.original_bytes().unwrap(), bytes, "{format}, {what}: the dead letter keeps the original bytes");
            assert_eq!(report.dead_letters.get(*reason).copied(), Some(1), "{format}, {what}: counted");
            eprintln!("{format} | {what} | {reason} | {}", letter.detail);
        }
        assert_eq!(report.counters.sessions, 1, "{format}: the good record is read");
    }
}

// --- the registry ------------------------------------------------------------------------------------

#[test]
fn a_schema_id_is_fetched_once_and_a_registry_gone_mid_run_holds_a_new_id_until_it_returns() {
    let registry = Registry::start();
    let codec = codec::open(&registry_limits(&registry, "avro").codec()).unwrap();
    let json = json_sessions(200);
    let id = registry.add("sessions-value", SESSION_AVSC, None);
    let records: Vec<Vec<u8>> = json
        .iter()
        .map(|j| {
            let mut p = Vec::new();
            shipped_avro().transcode_json(j, &mut p).unwrap();
            framed(id, false, &p)
        })
        .collect();
    let mut decoder = Decoder::with_codec(DecodeLimits::default(), codec.clone());
    for r in &records[..100] {
        decoder.decode(r).unwrap();
    }
    assert_eq!(registry.id_lookups.load(std::sync::atomic::Ordering::SeqCst), 1, "one schema id, one request");
    registry.go_away();
    for r in &records[100..] {
        decoder.decode(r).expect("a cached id needs no registry");
    }
    // A new id while the registry is away: the record waits, neither refused nor lost.
    let new_id = registry.add("sessions-value", NEWER_AVSC, None);
    let record = framed(new_id, false, &newer_record(true));
    let waiting = std::thread::spawn(move || {
        let mut d = Decoder::with_codec(DecodeLimits::default(), codec);
        let outcome = d.decode(&record).map(|_| ());
        (outcome, common::rows(&[d.finish()]))
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(!waiting.is_finished(), "a record with an uncached id waits while the registry is away");
    registry.come_back();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !waiting.is_finished() {
        assert!(Instant::now() < deadline, "the waiting record is read within 30 s of the registry's return");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (outcome, rows) = waiting.join().unwrap();
    outcome.unwrap();
    assert_eq!(rows, rows_of(Arc::new(ultr::session::codec::json::Json::new()), &[NEWER_AS_JSON.as_bytes().to_vec()]));
}

#[test]
fn a_registry_unreachable_at_start_stops_ingest_with_an_error_naming_its_url() {
    let port = common::free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("records.bin");
    std::fs::write(&file, b"").unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let config = file_config(&file, &format!("format = \"avro\"\n[decode.schema_registry]\nurl = \"{url}\""));
    let err = run_to_state(&config, &dir.path().join("state"), &mut NoObserver).expect_err("no registry, no run");
    let message = format!("{err:#}");
    assert!(message.contains(&url) && message.contains("decode.schema_registry.url"), "{message}");
}
