//! Fuzzing on stable Rust: a seeded mutation fuzzer over the session decoder in each format (corpus:
//! the malformed-record corpus plus valid simulated sessions; for Avro and Protobuf, those that
//! encode) and over the pipeline-config parser (corpus: `pipelines/*.toml`). Every input must be
//! decoded or refused with a reason and a detail (round-tripping through a dead-letter file), never
//! panic. `ULTR_FUZZ_DECODER_EXECS`, `ULTR_FUZZ_BINARY_EXECS` (per binary format) and
//! `ULTR_FUZZ_CONFIG_EXECS` set the budget (the test command's short run uses the defaults; the
//! long run in the closing note used 1,000,000+), `ULTR_FUZZ_SEED` the seed.

use crate::common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ultr::config::PipelineConfig;
use ultr::session::{DecodeLimits, Decoder};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::dead_letter::{read_dead_letters, DeadLetter, DeadLetterSink};
use ultr::sources::SourcePosition;

fn budget(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Tokens that steer mutations into the grammar's corners.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "false",
    "-0",
    "1e309",
    "-1e309",
    "NaN",
    "\"Infinity\"",
    "0.0",
    "4294967296",
    "-9223372036854775809",
    "18446744073709551616",
    "\"9999-12-31T23:59:59Z\"",
    "\"2026-02-30T00:00:00Z\"",
    "\\u0000",
    "\\ud800",
    "\"position\":",
    "\"features\":",
    "\"items\":",
    "\"event_time\":",
    "\"propensity\":",
    "\"context\":",
    "\"bias_features\":",
    "\"schema_version\":1",
    "\"clicked\":",
    "\"doc_id\":\"",
    "1.7976931348623157e308",
    "5e-324",
    "\u{feff}",
    "\u{10ffff}",
];

fn mutate(rng: &mut ChaCha8Rng, corpus: &[Vec<u8>], tokens: &[&[u8]]) -> Vec<u8> {
    let mut input = corpus[rng.random_range(0..corpus.len())].clone();
    for _ in 0..rng.random_range(1..=4) {
        let len = input.len();
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                input[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                input[i] = rng.random();
            }
            2 => {
                let i = rng.random_range(0..=len);
                let t = tokens[rng.random_range(0..tokens.len())];
                input.splice(i..i, t.iter().copied());
            }
            3 if len > 0 => {
                let a = rng.random_range(0..len);
                let b = rng.random_range(a..=len.min(a + 64));
                input.drain(a..b);
            }
            4 if len > 0 => {
                input.truncate(rng.random_range(0..len));
            }
            5 => {
                // Splice the tail of another corpus entry.
                let other = &corpus[rng.random_range(0..corpus.len())];
                let at = rng.random_range(0..=input.len());
                let from = rng.random_range(0..=other.len());
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => {
                // Duplicate a chunk (repeated keys, nested arrays).
                let a = rng.random_range(0..len);
                let b = rng.random_range(a..=len.min(a + 32));
                let chunk = input[a..b].to_vec();
                input.splice(b..b, chunk);
            }
            _ => {
                // Replace a digit run with a boundary number.
                if let Some(i) = input.iter().position(|c| c.is_ascii_digit()) {
                    let t = TOKENS[rng.random_range(11..19)].as_bytes();
                    input.splice(i..i + 1, t.iter().copied());
                }
            }
        }
    }
    input
}

/// The `config.sessions` sessions the simulator writes for `config`, one JSON record each.
fn simulated_sessions(config: SimConfig) -> Vec<Vec<u8>> {
    let sessions = config.sessions;
    let sim = Simulator::new(config).unwrap();
    (0..sessions)
        .map(|i| {
            let mut b = Vec::new();
            sim.session(i, &mut b);
            b
        })
        .collect()
}

fn decoder_corpus() -> Vec<Vec<u8>> {
    let mut corpus: Vec<Vec<u8>> = common::malformed::corpus().into_iter().map(|(b, _)| b).collect();
    corpus.extend(simulated_sessions(SimConfig {
        synthetic: SyntheticData { queries: 10, docs_per_query: 6, features: 3 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.5, ..PolicyConfig::default() },
        log_propensity: true,
        sessions: 50,
        ..SimConfig::default()
    }));
    corpus.push(
        br#"{"schema_version":1,"session_id":"c","query_id":"q","event_time":1767225600000,"policy_id":"p","context":{"device":"mobile","n":3,"b":true},"items":[{"doc_id":"d","position":1,"clicked":1,"features":[1,2,3],"bias_features":[0.5],"propensity":0.25}]}"#.to_vec(),
    );
    corpus
}

#[test]
fn decoder_survives_mutation_fuzzing_and_every_input_is_decoded_or_dead_lettered() {
    let tokens: Vec<&[u8]> = TOKENS.iter().map(|t| t.as_bytes()).collect();
    fuzz_decoder(Decoder::new, &decoder_corpus(), &tokens, budget("ULTR_FUZZ_DECODER_EXECS", 2_000_000), "JSON");
}

/// Bytes that steer mutations of binary records into varint, length and framing corners.
const BINARY_TOKENS: &[&[u8]] = &[
    &[0x00],
    &[0x01],
    &[0x02],
    &[0x7f],
    &[0x80],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[0xff, 0xff, 0xff, 0xff, 0x0f],
    &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80],
    &[0x00, 0x00, 0x00, 0x00, 0x01],
    &[0x00, 0x00, 0xc0, 0x7f],
    &[0x00, 0x00, 0x80, 0x7f],
    &[0x3a, 0x04, 0x0a, 0x02],
    &[0x0b],
    &[0x0c],
    &[0x1d],
];

/// Valid simulated sessions (features and logged propensities) plus one with every optional
/// field, each in `codec`'s encoding.
fn binary_corpus(codec: &dyn ultr::session::Codec) -> Vec<Vec<u8>> {
    decoder_corpus()
        .iter()
        .filter_map(|json| {
            let mut out = Vec::new();
            codec.transcode_json(json, &mut out).ok().map(|_| out)
        })
        .collect()
}

#[test]
fn avro_and_protobuf_decoders_survive_mutation_fuzzing_and_every_input_is_decoded_or_dead_lettered() {
    use ultr::session::codec::{avro::Avro, protobuf::Protobuf};
    let execs = budget("ULTR_FUZZ_BINARY_EXECS", 1_000_000);
    let codecs: [std::sync::Arc<dyn ultr::session::Codec>; 2] =
        [std::sync::Arc::new(Avro::with_writer_schema(ultr::session::codec::avro::SESSION_AVSC).unwrap()), std::sync::Arc::new(Protobuf::shipped())];
    for codec in codecs {
        let corpus = binary_corpus(codec.as_ref());
        assert!(corpus.len() > 10, "the corpus encodes");
        let name = codec.name();
        fuzz_decoder(|limits| Decoder::with_codec(limits, codec.clone()), &corpus, BINARY_TOKENS, execs, name);
    }
}

/// Mutates `corpus` `execs` times (with `tokens` among the insertions) into a decoder from
/// `decoder`: every input is decoded or refused with a reason and a detail, never a panic; refused
/// inputs round-trip through a dead-letter file with their original bytes.
fn fuzz_decoder(decoder: impl Fn(DecodeLimits) -> Decoder, corpus: &[Vec<u8>], tokens: &[&[u8]], execs: u64, label: &str) {
    let mut rng = ChaCha8Rng::seed_from_u64(budget("ULTR_FUZZ_SEED", 1));
    let limits = DecodeLimits { max_items: 50, max_features: 16, max_record_bytes: 1 << 16, ..DecodeLimits::default() };
    let mut decoder = decoder(limits);
    decoder.set_event_time_ceiling(Some(chrono::Utc::now().timestamp_millis() + 3_600_000));
    let dir = tempfile::tempdir().unwrap();
    let dead_path = dir.path().join("dead.jsonl");
    let mut dead = DeadLetterSink::file(&dead_path).unwrap();
    let (mut accepted, mut refused, mut rows) = (0u64, 0u64, 0usize);
    let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut sample_refused: Vec<Vec<u8>> = Vec::new();
    let started = std::time::Instant::now();
    for exec in 0..execs {
        let input = mutate(&mut rng, corpus, tokens);
        let before = decoder.rows();
        let outcome = catch_unwind(AssertUnwindSafe(|| decoder.decode(&input)));
        let Ok(outcome) = outcome else {
            panic!("decoder panicked on input #{exec}: {:?}", String::from_utf8_lossy(&input));
        };
        match outcome {
            Ok(n) => {
                assert!(n > 0, "an accepted session has items");
                assert_eq!(decoder.rows(), before + n, "accepted rows are appended exactly");
                accepted += 1;
                rows += n;
            }
            Err(rejected) => {
                assert_eq!(decoder.rows(), before, "a refused record adds no rows");
                assert!(!rejected.detail.is_empty(), "a refusal says why: {:?}", rejected.reason);
                *reasons.entry(rejected.reason.as_str()).or_default() += 1;
                refused += 1;
                if sample_refused.len() < 2_000 && exec % 7 == 0 {
                    let letter = DeadLetter {
                        reason: rejected.reason,
                        detail: rejected.detail,
                        payload: input.clone(),
                        position: SourcePosition { stream: "fuzz".into(), partition: 0, offset: exec as i64 },
                    };
                    dead.write(&letter).unwrap();
                    sample_refused.push(input);
                }
            }
        }
        if decoder.rows() > 100_000 {
            let batch = decoder.finish();
            assert_eq!(batch.num_rows(), rows);
            rows = 0;
        }
    }
    let batch = decoder.finish();
    assert_eq!(batch.num_rows(), rows, "the Arrow batch holds exactly the accepted rows");
    dead.flush().unwrap();
    let letters = read_dead_letters(&dead_path).unwrap();
    assert_eq!(letters.len(), sample_refused.len());
    for (letter, input) in letters.iter().zip(&sample_refused) {
        assert_eq!(&letter.original_bytes().unwrap(), input, "a dead letter keeps the original bytes");
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{label} decoder fuzz: {execs} execs in {secs:.1} s ({:.0}/s), 0 panics, {accepted} decoded, {refused} refused; by reason {reasons:?}",
        execs as f64 / secs
    );
    assert!(accepted > 0 && refused > 0, "the fuzzer reaches both outcomes");
}

#[test]
fn config_parser_survives_mutation_fuzzing() {
    let execs = budget("ULTR_FUZZ_CONFIG_EXECS", 200_000);
    let mut rng = ChaCha8Rng::seed_from_u64(budget("ULTR_FUZZ_SEED", 1));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
    let corpus: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    assert!(corpus.len() >= 3);
    let (mut ok, mut refused) = (0u64, 0u64);
    let tokens: Vec<&[u8]> = TOKENS.iter().map(|t| t.as_bytes()).collect();
    for exec in 0..execs {
        let input = mutate(&mut rng, &corpus, &tokens);
        let text = String::from_utf8_lossy(&input).into_owned();
        match catch_unwind(|| PipelineConfig::parse(&text, "fuzz.toml")) {
            Err(_) => panic!("config parser panicked on input #{exec}: {text:?}"),
            Ok(Ok(_)) => ok += 1,
            Ok(Err(e)) => {
                let message = e.to_string();
                assert!(message.contains("fuzz.toml"), "a config error names the file: {message}");
                refused += 1;
            }
        }
    }
    eprintln!("config fuzz: {execs} execs, 0 panics, {ok} parsed, {refused} refused");
    assert!(ok > 0 && refused > 0);
}

/// The decoder's single-pass reader against serde_json alone (`Decoder::serde_json_only`): on every
/// mutated input both accept the same rows or refuse with the same reason and detail, and the
/// batches they build are equal bit for bit (features and propensities compared as bit patterns).
/// `ULTR_FUZZ_DIFFERENTIAL_EXECS` sets the budget.
#[test]
fn single_pass_reader_decodes_every_mutated_input_like_serde_json() {
    use datafusion::arrow::array::{Array, AsArray, RecordBatch};
    use datafusion::arrow::datatypes::{Float32Type, Float64Type};

    let execs = budget("ULTR_FUZZ_DIFFERENTIAL_EXECS", 500_000);
    let mut rng = ChaCha8Rng::seed_from_u64(budget("ULTR_FUZZ_SEED", 1));
    let mut corpus = decoder_corpus();
    // Long feature vectors (the eight-digit steps) and every number spelling the reader takes or declines.
    corpus.extend(simulated_sessions(SimConfig {
        synthetic: SyntheticData { queries: 5, docs_per_query: 4, features: 46 },
        relevance: RelevanceKind::Linear,
        sessions: 10,
        ..SimConfig::default()
    }));
    corpus.push(
        br#" { "schema_version" : 1 , "session_id" : 17 , "query_id" : "q\u0031" , "event_time" : "2026-01-01T00:00:00Z" , "policy_id" : "p" ,
        "context" : { "a" : -3 , "b" : 1.5 , "a" : null , "c" : false } , "extra" : [1, {"x": 2}] ,
        "items" : [ { "doc_id" : "d1" , "position" : 1 , "clicked" : 0 , "features" : [ -0 , 1E+2 , 2.5e-3 , 12345678901234567890 , 0.1234567890123456789 , 1e-30 , -7 ] ,
        "propensity" : 1 , "bias_features" : null , "note" : "x" } ] }
        "#
        .to_vec(),
    );
    let limits = DecodeLimits { max_items: 50, max_features: 64, max_record_bytes: 1 << 16, ..DecodeLimits::default() };
    let ceiling = Some(chrono::Utc::now().timestamp_millis() + 3_600_000);
    let mut single = Decoder::new(limits.clone());
    let mut reference = Decoder::new(limits).serde_json_only();
    single.set_event_time_ceiling(ceiling);
    reference.set_event_time_ceiling(ceiling);

    fn same_batches(a: &RecordBatch, b: &RecordBatch) {
        assert_eq!(a, b, "same columns");
        let bits32 = |batch: &RecordBatch, name: &str| -> Vec<u32> {
            let list = batch.column_by_name(name).unwrap().as_list::<i32>();
            list.values().as_primitive::<Float32Type>().values().iter().map(|v| v.to_bits()).collect()
        };
        for name in ["features", "bias_features"] {
            assert_eq!(bits32(a, name), bits32(b, name), "{name}, bit for bit");
        }
        let bits64 = |batch: &RecordBatch| -> Vec<Option<u64>> {
            let p = batch.column_by_name("propensity").unwrap().as_primitive::<Float64Type>();
            (0..p.len()).map(|i| p.is_valid(i).then(|| p.value(i).to_bits())).collect()
        };
        assert_eq!(bits64(a), bits64(b), "propensity, bit for bit");
    }

    let (mut accepted, mut refused) = (0u64, 0u64);
    let tokens: Vec<&[u8]> = TOKENS.iter().map(|t| t.as_bytes()).collect();
    for exec in 0..execs {
        let input = mutate(&mut rng, &corpus, &tokens);
        let ours = single.decode(&input);
        let theirs = reference.decode(&input);
        assert_eq!(ours, theirs, "input #{exec}: {:?}", String::from_utf8_lossy(&input));
        if ours.is_ok() {
            accepted += 1;
        } else {
            refused += 1;
        }
        if single.rows() > 50_000 {
            same_batches(&single.finish(), &reference.finish());
        }
    }
    same_batches(&single.finish(), &reference.finish());
    eprintln!("differential decode: {execs} inputs, {accepted} accepted and {refused} refused alike");
    assert!(accepted > execs / 200 && refused > execs / 200, "both outcomes are exercised: {accepted} / {refused}");
}
