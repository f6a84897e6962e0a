//! Acceptance: a corpus of malformed records mixed into a valid stream — no panic, every bad record
//! dead-lettered with the right reason and its original bytes, valid impressions identical to a clean run.

mod common;

use std::io::Write;

use rand::{Rng, SeedableRng};
use ultr::ingest::Ingest;
use ultr::session::{DecodeLimits, Decoder, Reason};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::dead_letter::{read_dead_letters, DeadLetterSink};
use ultr::sources::file::FileSource;

fn item(doc: &str, pos: &str, extra: &str) -> String {
    format!(r#"{{"doc_id":"{doc}","position":{pos},"clicked":false,"features":[0.1,0.2,0.3]{extra}}}"#)
}

fn session(fields: &str, items: &str) -> String {
    format!(r#"{{"schema_version":1,"session_id":"bad","query_id":"q1","event_time":"2026-01-01T00:00:00Z","policy_id":"p"{fields},"items":[{items}]}}"#)
}

/// (record bytes, expected reason): every kind of bad input the contract names, and then some.
fn corpus() -> Vec<(Vec<u8>, Reason)> {
    use Reason::*;
    let ok_items = format!("{},{}", item("a", "1", ""), item("b", "2", ""));
    let mut c: Vec<(Vec<u8>, Reason)> = vec![
        (br#"{"schema_version":1,"session_id":"#.to_vec(), InvalidJson),
        (b"not json at all".to_vec(), InvalidJson),
        (b"{\"schema_version\":1,,}".to_vec(), InvalidJson),
        (b"[1,2,3]".to_vec(), WrongType),
        (vec![0xff, 0xfe, 0x7b, 0x7d], NotUtf8),
        ([br#"{"schema_version":1,"session_id":""#.as_slice(), &[0xc3, 0x28], br#""}"#].concat(), NotUtf8),
        (b"{}".to_vec(), MissingField),
        (br#"{"schema_version":1,"query_id":"q","event_time":0,"policy_id":"p","items":[]}"#.to_vec(), MissingField),
        (br#"{"schema_version":1,"session_id":"s","query_id":"q","event_time":0,"policy_id":"p"}"#.to_vec(), MissingField),
        (session("", r#"{"position":1,"clicked":true}"#).into_bytes(), MissingField),
        (session("", r#"{"doc_id":"a","clicked":true}"#).into_bytes(), MissingField),
        (session("", r#"{"doc_id":"a","position":1}"#).into_bytes(), MissingField),
        (session("", &item("a", "\"1\"", "")).into_bytes(), WrongType),
        (session("", r#"{"doc_id":"a","position":1,"clicked":"yes"}"#).into_bytes(), WrongType),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":"abc"}"#).into_bytes(), WrongType),
        (session("", r#"{"doc_id":"a","position":1.5,"clicked":true}"#).into_bytes(), WrongType),
        (session("", &format!("{},{}", item("a", "1", ""), item("a", "1", ",\"position\":3"))).into_bytes(), WrongType),
        (session_with("session_id", r#"{"x":1}"#, &ok_items), WrongType),
        (session_with("schema_version", "2", &ok_items), UnsupportedSchemaVersion),
        (session_with("schema_version", "\"1\"", &ok_items), WrongType),
        (session_with("event_time", "\"yesterday\"", &ok_items), BadEventTime),
        (session_with("event_time", "-5", &ok_items), BadEventTime),
        (session_with("event_time", "1.5", &ok_items), BadEventTime),
        (session("", "").into_bytes(), NoItems),
        (session("", &(1..=6).map(|k| item(&format!("d{k}"), &k.to_string(), "")).collect::<Vec<_>>().join(",")).into_bytes(), TooManyItems),
        (session("", &item("a", "0", "")).into_bytes(), NonPositivePosition),
        (session("", &item("a", "-3", "")).into_bytes(), NonPositivePosition),
        (session("", &format!("{},{}", item("a", "2", ""), item("b", "2", ""))).into_bytes(), DuplicatePosition),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,"NaN",0.3]}"#).into_bytes(), NonFiniteFeature),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,"-Infinity",0.3]}"#).into_bytes(), NonFiniteFeature),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,1e39,0.3]}"#).into_bytes(), NonFiniteFeature),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,null,0.3]}"#).into_bytes(), NonFiniteFeature),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,0.2]}"#).into_bytes(), FeatureLengthMismatch),
        (session("", &format!("{},{}", item("a", "1", ""), r#"{"doc_id":"b","position":2,"clicked":true,"features":[1,2,3,4]}"#)).into_bytes(), FeatureLengthMismatch),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[1,2,3,4,5,6,7,8,9]}"#).into_bytes(), TooManyFeatures),
        (session("", &item("a", "1", ",\"propensity\":0")).into_bytes(), BadPropensity),
        (session("", &item("a", "1", ",\"propensity\":1.5")).into_bytes(), BadPropensity),
        (session_with("session_id", "\"\"", &ok_items), EmptyId),
        (session("", &item("", "1", "")).into_bytes(), EmptyId),
        (session(&format!(r#","context":{{"pad":"{}"}}"#, "x".repeat(5000)), &ok_items).into_bytes(), RecordTooLarge),
    ];
    // A bad record must not be confused with a good one carrying the same id.
    c.push((session("", &format!("{},{}", item("a", "1", ""), item("b", "1", ""))).into_bytes(), DuplicatePosition));
    c
}

fn session_with(key: &str, value: &str, items: &str) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_str(&session("", items)).unwrap();
    let raw = format!(r#"{{"{key}":{value}}}"#);
    let patch: serde_json::Value = serde_json::from_str(&raw).unwrap();
    v[key] = patch[key].clone();
    serde_json::to_vec(&v).unwrap()
}

fn limits() -> DecodeLimits {
    DecodeLimits { max_items: 5, max_features: 8, max_record_bytes: 4096, ..DecodeLimits::default() }
}

fn valid_sessions() -> Vec<Vec<u8>> {
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 30, docs_per_query: 5, features: 3 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.5, ..PolicyConfig::default() },
        log_propensity: true,
        sessions: 2_000,
        ..SimConfig::default()
    })
    .unwrap();
    (0..2_000)
        .map(|i| {
            let mut b = Vec::new();
            sim.session(i, &mut b);
            b
        })
        .collect()
}

#[test]
fn every_corpus_record_is_refused_with_its_reason() {
    let corpus = corpus();
    assert!(corpus.len() >= 30);
    let mut decoder = Decoder::new(DecodeLimits { feature_dim: Some(3), ..limits() });
    for (bytes, expected) in &corpus {
        let got = decoder.decode(bytes);
        assert_eq!(
            got.as_ref().err().map(|r| r.reason),
            Some(*expected),
            "record {:?} gave {:?}",
            String::from_utf8_lossy(bytes),
            got
        );
    }
    assert_eq!(decoder.rows(), 0, "refused records must add no rows");
    // Every reason the contract names is exercised.
    let seen: std::collections::BTreeSet<Reason> = corpus.iter().map(|(_, r)| *r).collect();
    assert_eq!(seen.len(), Reason::ALL.len(), "missing reasons: {:?}", Reason::ALL.iter().filter(|r| !seen.contains(r)).collect::<Vec<_>>());
}

#[test]
fn mixed_stream_dead_letters_bad_records_and_keeps_good_ones_identical() {
    let dir = tempfile::tempdir().unwrap();
    let valid = valid_sessions();
    let corpus = corpus();

    let clean = dir.path().join("clean.jsonl");
    let mut f = std::fs::File::create(&clean).unwrap();
    for v in &valid {
        f.write_all(v).unwrap();
        f.write_all(b"\n").unwrap();
    }
    drop(f);

    // Bad records interleaved at random places (never first, so the stream's feature dimension comes
    // from a valid record). Record their byte offsets to check the dead letters' positions.
    let mixed = dir.path().join("mixed.jsonl");
    let mut f = std::fs::File::create(&mixed).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let mut slots: Vec<usize> = (0..corpus.len()).map(|_| rng.random_range(1..valid.len())).collect();
    slots.sort_unstable();
    let mut expected = Vec::new();
    let mut offset = 0u64;
    let mut next_bad = 0;
    for (i, v) in valid.iter().enumerate() {
        while next_bad < corpus.len() && slots[next_bad] == i {
            let (bytes, reason) = &corpus[next_bad];
            expected.push((bytes.clone(), *reason, offset));
            f.write_all(bytes).unwrap();
            f.write_all(b"\n").unwrap();
            offset += bytes.len() as u64 + 1;
            next_bad += 1;
        }
        f.write_all(v).unwrap();
        f.write_all(b"\n").unwrap();
        offset += v.len() as u64 + 1;
    }
    drop(f);

    let run = |path: &std::path::Path, dead_path: &std::path::Path| {
        let mut dead = DeadLetterSink::file(dead_path).unwrap();
        let mut ingest = Ingest::new(FileSource::open(path, 0).unwrap(), limits(), 97);
        let batches = common::collect(&mut ingest, &mut dead);
        (common::rows(&batches), dead.counts().clone())
    };
    let (clean_rows, clean_counts) = run(&clean, &dir.path().join("clean-dead.jsonl"));
    let dead_path = dir.path().join("mixed-dead.jsonl");
    let (mixed_rows, counts) = run(&mixed, &dead_path);

    assert_eq!(clean_counts.total(), 0);
    assert!(clean_rows.len() > 5_000);
    assert_eq!(mixed_rows, clean_rows, "valid records' impressions must be identical to the clean run");

    let letters = read_dead_letters(&dead_path).unwrap();
    assert_eq!(letters.len(), corpus.len());
    for (letter, (bytes, reason, off)) in letters.iter().zip(&expected) {
        assert_eq!(letter.reason, reason.as_str(), "detail: {}", letter.detail);
        assert_eq!(&letter.original_bytes().unwrap(), bytes);
        assert_eq!(letter.offset, *off as i64);
        assert!(!letter.detail.is_empty());
    }
    for (bytes, reason) in &corpus {
        let _ = bytes;
        assert!(counts.get(*reason) >= 1);
    }
    assert_eq!(counts.total(), corpus.len() as u64);
}

/// Random byte damage to valid records: the decoder answers every time (no panic), and whatever it
/// accepts is still a well-formed session.
#[test]
fn damaged_records_never_panic() {
    let valid = valid_sessions();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut decoder = Decoder::new(limits());
    let mut refused = 0;
    for round in 0..20_000 {
        let mut bytes = valid[round % valid.len()].clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..bytes.len());
            match rng.random_range(0..3) {
                0 => bytes[i] = rng.random(),
                1 => {
                    bytes.remove(i);
                }
                _ => bytes.insert(i, b"{}[],:\"-0e9"[rng.random_range(0..11)]),
            }
        }
        if decoder.decode(&bytes).is_err() {
            refused += 1;
        }
        if round % 1000 == 0 {
            decoder.finish();
        }
    }
    assert!(refused > 10_000, "most damaged records should be refused, got {refused}");
}

#[test]
fn feature_dimension_is_fixed_only_by_an_accepted_record() {
    let mut decoder = Decoder::new(limits());
    // A refused record with 2 features must not fix the stream to 2.
    let bad = session("", r#"{"doc_id":"a","position":0,"clicked":true,"features":[1,2]}"#);
    assert_eq!(decoder.decode(bad.as_bytes()).unwrap_err().reason, Reason::NonPositivePosition);
    let good = session("", &item("a", "1", ""));
    assert_eq!(decoder.decode(good.as_bytes()).unwrap(), 1);
    assert_eq!(decoder.feature_dim(), Some(3));
    let other = session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[1,2]}"#);
    assert_eq!(decoder.decode(other.as_bytes()).unwrap_err().reason, Reason::FeatureLengthMismatch);
}

#[test]
fn event_time_forms_agree_and_context_is_canonical() {
    let mut decoder = Decoder::new(DecodeLimits::default());
    let a = r#"{"schema_version":1,"session_id":"s1","query_id":7,"event_time":"2026-01-01T01:00:00+01:00","policy_id":"p","context":{"device":"mobile","app":"ios","x":null},"items":[{"doc_id":"d","position":3,"clicked":1}]}"#;
    let b = r#"{"schema_version":1,"session_id":"s1","query_id":"7","event_time":1767225600000,"policy_id":"p","context":{"app":"ios","device":"mobile"},"items":[{"doc_id":"d","position":3,"clicked":true}]}"#;
    decoder.decode(a.as_bytes()).unwrap();
    decoder.decode(b.as_bytes()).unwrap();
    let rows = common::rows(&[decoder.finish()]);
    assert_eq!(rows[0], rows[1]);
    assert!(rows[0].contains("app=ios;device=mobile"), "{}", rows[0]);
    assert!(rows[0].contains("|1767225600000|"), "{}", rows[0]);
}
