//! Fuzzing on stable Rust: a seeded mutation fuzzer over the session decoder (corpus: the
//! malformed-record corpus plus valid simulated sessions) and over the pipeline-config parser
//! (corpus: `pipelines/*.toml`). Every input must be decoded or refused with a reason and a detail
//! (round-tripping through a dead-letter file), never panic. `ULTR_FUZZ_DECODER_EXECS` and
//! `ULTR_FUZZ_CONFIG_EXECS` set the budget (the test command's short run uses the defaults; the
//! long run in the closing note used 1,000,000+), `ULTR_FUZZ_SEED` the seed.

mod common;

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
    "{", "}", "[", "]", ",", ":", "\"", "null", "true", "false", "-0", "1e309", "-1e309", "NaN", "\"Infinity\"", "0.0", "4294967296",
    "-9223372036854775809", "18446744073709551616", "\"9999-12-31T23:59:59Z\"", "\"2026-02-30T00:00:00Z\"", "\\u0000", "\\ud800",
    "\"position\":", "\"features\":", "\"items\":", "\"event_time\":", "\"propensity\":", "\"context\":", "\"bias_features\":",
    "\"schema_version\":1", "\"clicked\":", "\"doc_id\":\"", "1.7976931348623157e308", "5e-324", "\u{feff}", "\u{10ffff}",
];

fn mutate(rng: &mut ChaCha8Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
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
                let t = TOKENS[rng.random_range(0..TOKENS.len())].as_bytes();
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

fn decoder_corpus() -> Vec<Vec<u8>> {
    let mut corpus: Vec<Vec<u8>> = common::malformed::corpus().into_iter().map(|(b, _)| b).collect();
    let sim = Simulator::new(SimConfig {
        synthetic: SyntheticData { queries: 10, docs_per_query: 6, features: 3 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.5, ..PolicyConfig::default() },
        log_propensity: true,
        sessions: 50,
        ..SimConfig::default()
    })
    .unwrap();
    for i in 0..50 {
        let mut b = Vec::new();
        sim.session(i, &mut b);
        corpus.push(b);
    }
    corpus.push(
        br#"{"schema_version":1,"session_id":"c","query_id":"q","event_time":1767225600000,"policy_id":"p","context":{"device":"mobile","n":3,"b":true},"items":[{"doc_id":"d","position":1,"clicked":1,"features":[1,2,3],"bias_features":[0.5],"propensity":0.25}]}"#.to_vec(),
    );
    corpus
}

#[test]
fn decoder_survives_mutation_fuzzing_and_every_input_is_decoded_or_dead_lettered() {
    let execs = budget("ULTR_FUZZ_DECODER_EXECS", 2_000_000);
    let mut rng = ChaCha8Rng::seed_from_u64(budget("ULTR_FUZZ_SEED", 1));
    let corpus = decoder_corpus();
    let limits = DecodeLimits { max_items: 50, max_features: 16, max_record_bytes: 1 << 16, ..DecodeLimits::default() };
    let mut decoder = Decoder::new(limits.clone());
    decoder.set_event_time_ceiling(Some(chrono::Utc::now().timestamp_millis() + 3_600_000));
    let dir = tempfile::tempdir().unwrap();
    let dead_path = dir.path().join("dead.jsonl");
    let mut dead = DeadLetterSink::file(&dead_path).unwrap();
    let (mut accepted, mut refused, mut rows) = (0u64, 0u64, 0usize);
    let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut sample_refused: Vec<Vec<u8>> = Vec::new();
    let started = std::time::Instant::now();
    for exec in 0..execs {
        let input = mutate(&mut rng, &corpus);
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
        "decoder fuzz: {execs} execs in {secs:.1} s ({:.0}/s), 0 panics, {accepted} decoded, {refused} refused; by reason {reasons:?}",
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
    for exec in 0..execs {
        let input = mutate(&mut rng, &corpus);
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
