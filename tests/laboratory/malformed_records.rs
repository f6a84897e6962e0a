//! Acceptance: a corpus of malformed records mixed into a valid stream — no panic, every bad record
//! dead-lettered with the right reason and its original bytes, valid impressions identical to a clean run.

use crate::common;

use common::malformed::{corpus, item, session};

use std::io::Write;

use rand::{Rng, SeedableRng};
use ultr::ingest::Ingest;
use ultr::session::{DecodeLimits, Decoder, Reason};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::dead_letter::{read_dead_letters, DeadLetterSink};
use ultr::sources::file::FileSource;

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

/// A page listing one `doc_id` three times (90 of CLARA 2's 31,564 pages list one twice) keeps the
/// first occurrence and the rest of the page by default, in positions 1 and 2 with `n_items` 2, and
/// reports the two repeats; with `duplicate_doc_id = "refuse_session"` it is refused whole and adds
/// no row.
#[test]
fn a_repeated_doc_id_drops_the_repeats_and_keeps_the_page_unless_refusal_is_configured() {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::UInt32Type;
    let page = session("", &[item("a", "1", ""), item("b", "2", ""), item("a", "3", ""), item("a", "4", "")].join(",")).into_bytes();
    let mut decoder = Decoder::new(limits());
    assert_eq!(decoder.decode(&page).unwrap(), 2);
    assert_eq!(decoder.last_repeats(), 2);
    let batch = decoder.finish();
    let docs: Vec<&str> = batch.column_by_name("doc_id").unwrap().as_string::<i32>().iter().flatten().collect();
    let positions: Vec<u32> = batch.column_by_name("position").unwrap().as_primitive::<UInt32Type>().values().to_vec();
    let n_items: Vec<u32> = batch.column_by_name("n_items").unwrap().as_primitive::<UInt32Type>().values().to_vec();
    assert_eq!((docs, positions, n_items), (vec!["a", "b"], vec![1, 2], vec![2, 2]));
    let mut refusing = Decoder::new(DecodeLimits { duplicate_doc_id: ultr::session::DuplicateDocId::RefuseSession, ..limits() });
    assert_eq!(refusing.decode(&page).unwrap_err().reason, Reason::DuplicateDocument);
    assert_eq!(refusing.rows(), 0);
}

/// The decoder's duplicate checks (a bit set of positions below 512, a hash table of `doc_id`s)
/// against a brute-force reference written here, on 3,000 random pages of 1–40 items whose ids come
/// from a small alphabet (so most pages repeat one) and whose positions are drawn below 600 (so some
/// pages repeat a position and some pass 512, the sorted path): each page is refused as
/// `duplicate_position` naming the smallest repeated position exactly when the reference finds
/// one; otherwise it keeps, in order, the items whose id no earlier item has (the repeats counted),
/// or under `refuse_session` is refused naming the smallest repeated id.
#[test]
fn duplicate_positions_and_doc_ids_match_a_brute_force_reference() {
    use datafusion::arrow::array::AsArray;
    let mut rng = rand::rngs::StdRng::seed_from_u64(90);
    let wide = DecodeLimits { max_items: 64, ..DecodeLimits::default() };
    let mut keeping = Decoder::new(wide.clone());
    let mut refusing = Decoder::new(DecodeLimits { duplicate_doc_id: ultr::session::DuplicateDocId::RefuseSession, ..wide });
    let (mut kept_pages, mut position_refusals, mut id_refusals) = (0, 0, 0);
    for _ in 0..3_000 {
        let n = rng.random_range(1..=40usize);
        let alphabet = rng.random_range(1..=60u32);
        let top = if rng.random_bool(0.2) { 600 } else { 2 * n as u32 + 1 };
        let ids: Vec<String> = (0..n).map(|_| format!("d{}", rng.random_range(0..alphabet))).collect();
        let positions: Vec<u32> = (0..n).map(|_| rng.random_range(1..=top)).collect();
        let items: Vec<String> = ids.iter().zip(&positions).map(|(d, p)| item(d, &p.to_string(), "")).collect();
        let page = session("", &items.join(",")).into_bytes();
        // The reference: quadratic scans.
        let repeated_position = (0..n).filter(|&i| (0..n).any(|j| j != i && positions[j] == positions[i])).map(|i| positions[i]).min();
        let repeat: Vec<bool> = (0..n).map(|i| (0..i).any(|j| ids[j] == ids[i])).collect();
        let smallest_repeated_id = (0..n).filter(|&i| repeat[i]).map(|i| ids[i].clone()).min();
        let got = keeping.decode(&page);
        let refused = refusing.decode(&page);
        if let Some(p) = repeated_position {
            for r in [&got.as_ref().map(|_| ()), &refused.as_ref().map(|_| ())] {
                let e = r.as_ref().unwrap_err();
                assert_eq!((e.reason, e.detail.clone()), (Reason::DuplicatePosition, format!("position {p} appears twice")));
            }
            position_refusals += 1;
            continue;
        }
        let kept: Vec<String> = (0..n).filter(|&i| !repeat[i]).map(|i| ids[i].clone()).collect();
        assert_eq!(got.unwrap(), kept.len());
        assert_eq!(keeping.last_repeats() as usize, n - kept.len());
        let batch = keeping.finish();
        let docs: Vec<&str> = batch.column_by_name("doc_id").unwrap().as_string::<i32>().iter().flatten().collect();
        assert_eq!(docs, kept);
        match smallest_repeated_id {
            Some(id) => {
                let e = refused.unwrap_err();
                assert_eq!(e.reason, Reason::DuplicateDocument);
                assert!(e.detail.starts_with(&format!("doc_id {id:?} appears twice")), "{} against {id}", e.detail);
                id_refusals += 1;
            }
            None => {
                assert_eq!(refused.unwrap(), n);
                refusing.finish();
                kept_pages += 1;
            }
        }
    }
    // Each branch was met often enough to mean something.
    assert!(kept_pages > 100 && position_refusals > 100 && id_refusals > 100, "{kept_pages} {position_refusals} {id_refusals}");
}

#[test]
fn every_corpus_record_is_refused_with_its_reason() {
    let mut corpus = corpus();
    corpus.extend(common::malformed::live_only());
    assert!(corpus.len() >= 30);
    let mut decoder = Decoder::new(DecodeLimits { feature_dim: Some(3), ..limits() });
    // What the ingest loop sets for a live stream: the wall clock plus the default skew.
    decoder.set_event_time_ceiling(Some(chrono::Utc::now().timestamp_millis() + 3_600_000));
    // And a live floor (wall clock − decode.max_event_age); fixed here, so the corpus's 2026 dates stay inside it.
    decoder.set_event_time_floor(Some(946_684_800_000)); // 2000-01-01
    for (bytes, expected) in &corpus {
        let got = decoder.decode(bytes);
        assert_eq!(got.as_ref().err().map(|r| r.reason), Some(*expected), "record {:?} gave {:?}", String::from_utf8_lossy(bytes), got);
    }
    assert_eq!(decoder.rows(), 0, "refused records must add no rows");
    // Every reason the contract names is exercised (`duplicate_doc_id` under its setting, above;
    // the binary formats' own reasons, which no JSON record can meet, by
    // `codecs::each_bad_binary_input_is_dead_lettered_with_its_named_reason_its_original_bytes_and_a_count`).
    let mut seen: std::collections::BTreeSet<Reason> = corpus.iter().map(|(_, r)| *r).collect();
    seen.insert(Reason::DuplicateDocument);
    seen.extend([Reason::BadMagicByte, Reason::TruncatedPayload, Reason::TruncatedVarint, Reason::MalformedPayload, Reason::UnknownSchemaId]);
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

/// −0 and 0 are one feature value: stored with one bit pattern, so the training rows' feature keys
/// (hashes of the bits) of equal vectors agree.
#[test]
fn negative_zero_features_are_stored_as_zero() {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Float32Type;
    let mut decoder = Decoder::new(DecodeLimits::default());
    let record = session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[-0,-0.0,0]}"#);
    decoder.decode(record.as_bytes()).unwrap();
    let batch = decoder.finish();
    let features = batch.column_by_name("features").unwrap().as_list::<i32>().value(0);
    let bits: Vec<u32> = features.as_primitive::<Float32Type>().values().iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, vec![0, 0, 0]);
}

/// 10,000 items under the default `decode.max_items` (1,000): refused whole, nothing appended.
#[test]
fn ten_thousand_items_at_the_default_limit_are_too_many() {
    let items: Vec<String> = (1..=10_000).map(|k| item(&format!("d{k}"), &k.to_string(), "")).collect();
    let record = session("", &items.join(","));
    let mut decoder = Decoder::new(DecodeLimits::default());
    assert_eq!(decoder.decode(record.as_bytes()).err().map(|r| r.reason), Some(Reason::TooManyItems));
    assert_eq!(decoder.rows(), 0);
}
