//! Throughput benchmarks (run with `cargo bench --bench ultr -- throughput`): decode impressions/s on one core
//! with and without 46-dim features, in each format (JSON's single-pass reader beside serde_json
//! alone, Avro, Protobuf), each codec alone and the rows' floor they share, and simulator sessions/s. `ULTR_BENCH_DUMP=PREFIX` also writes the
//! JSON records. An argument (`throughput bare`, `throughput mq2008`, `throughput 10`) runs only the
//! record kinds whose label contains it. Figures go in the closing notes, not tests.

use std::sync::Arc;
use std::time::Instant;

use ultr::session::codec::avro::{Avro, SESSION_AVSC};
use ultr::session::codec::json::Json;
use ultr::session::codec::protobuf::Protobuf;
use ultr::session::{Codec, DecodeLimits, Decoder};
use ultr::simulate::click::{ClickModel, ClickModelKind};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};

/// Runs per reader; each figure is the best, as this 2-vCPU machine's neighbours add noise that
/// only ever slows a run.
const REPS: usize = 9;

fn records(sim: &Simulator, n: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut buf = Vec::new();
            sim.session(i, &mut buf);
            buf
        })
        .collect()
}

/// The readers compared, run in turn: JSON's single-pass reader (the default), serde_json alone,
/// and the binary formats' codecs on the same sessions (bare records, as from a local schema).
fn readers() -> Vec<(&'static str, Arc<dyn Codec>)> {
    vec![
        ("JSON, single pass (default)", Arc::new(Json::new())),
        ("JSON, serde_json only", Arc::new(Json::serde_only())),
        ("Avro", Arc::new(Avro::with_writer_schema(SESSION_AVSC).expect("the shipped schema"))),
        ("Protobuf", Arc::new(Protobuf::shipped())),
    ]
}

fn bench_decode(label: &str, json: &[Vec<u8>]) {
    if let Ok(path) = std::env::var("ULTR_BENCH_DUMP") {
        // The records as JSONL, for parsers measured outside this build (docs/benchmarks.md).
        let mut text = Vec::new();
        for r in json {
            text.extend_from_slice(r);
            text.push(b'\n');
        }
        std::fs::write(format!("{path}.{}.jsonl", label.replace([' ', ','], "_")), text).expect("writing the dump");
    }
    let readers = readers();
    let inputs: Vec<Vec<Vec<u8>>> = readers
        .iter()
        .map(|(_, codec)| {
            json.iter()
                .map(|r| {
                    let mut out = Vec::new();
                    codec.transcode_json(r, &mut out).expect("simulated sessions encode");
                    out
                })
                .collect()
        })
        .collect();
    // Alternate the readers run by run, so machine noise falls on all alike.
    let mut best = vec![f64::MAX; readers.len()];
    let mut rows = vec![0usize; readers.len()];
    for _ in 0..REPS {
        for (k, (_, codec)) in readers.iter().enumerate() {
            let mut decoder = Decoder::with_codec(DecodeLimits::default(), codec.clone());
            let t = Instant::now();
            rows[k] = 0;
            for (i, r) in inputs[k].iter().enumerate() {
                rows[k] += decoder.decode(r).expect("simulated sessions are valid");
                if i % 4096 == 4095 {
                    std::hint::black_box(decoder.finish());
                }
            }
            std::hint::black_box(decoder.finish());
            best[k] = best[k].min(t.elapsed().as_secs_f64());
        }
    }
    // The floor every format shares: validation and the Arrow rows alone, from sessions already
    // read (by the Protobuf codec, before the clock starts). No codec can decode faster than this.
    let pb = readers.iter().position(|(name, _)| *name == "Protobuf").expect("the Protobuf reader");
    let protobuf = &readers[pb].1;
    let read: Vec<_> = inputs[pb].iter().map(|r| protobuf.decode(r, 64).expect("simulated sessions decode")).collect();
    let mut rows_alone = f64::MAX;
    for _ in 0..REPS {
        let mut decoder = Decoder::with_codec(DecodeLimits::default(), protobuf.clone());
        let t = Instant::now();
        for (i, raw) in read.iter().enumerate() {
            std::hint::black_box(decoder.accept(raw).expect("simulated sessions are valid"));
            if i % 4096 == 4095 {
                std::hint::black_box(decoder.finish());
            }
        }
        std::hint::black_box(decoder.finish());
        rows_alone = rows_alone.min(t.elapsed().as_secs_f64());
    }
    println!(
        "decode {label}, validation and Arrow rows alone (sessions read beforehand): best of {REPS} {rows_alone:.3}s → {:.0} impressions/s; JSON's single pass ÷ this floor: {:.2}× (the most any codec could reach)",
        rows[pb] as f64 / rows_alone,
        best[0] / rows_alone
    );
    // Each codec alone: reading every record into a session and dropping it, without validation
    // or rows. The whole decoder's time is about this plus the floor.
    let mut alone = vec![f64::MAX; readers.len()];
    for _ in 0..REPS {
        for (k, (_, codec)) in readers.iter().enumerate() {
            let t = Instant::now();
            for r in &inputs[k] {
                std::hint::black_box(codec.decode(r, 64).expect("simulated sessions decode"));
            }
            alone[k] = alone[k].min(t.elapsed().as_secs_f64());
        }
    }
    for (k, (name, _)) in readers.iter().enumerate() {
        println!(
            "decode {label}, {name}, the codec alone (no validation, no rows): best of {REPS} {:.3}s → {:.1} ns per impression",
            alone[k],
            alone[k] * 1e9 / rows[k] as f64
        );
    }
    println!("decode {label}, the floor: {:.1} ns per impression", rows_alone * 1e9 / rows[pb] as f64);
    for (k, (name, _)) in readers.iter().enumerate() {
        let bytes: usize = inputs[k].iter().map(Vec::len).sum();
        println!(
            "decode {label}, {name}: {} sessions, {} impressions, best of {REPS} {:.3}s → {:.0} impressions/s, {:.0} MB/s, {:.2}× JSON's single pass",
            inputs[k].len(),
            rows[k],
            best[k],
            rows[k] as f64 / best[k],
            bytes as f64 / best[k] / 1e6,
            best[0] / best[k]
        );
    }
}

pub fn main(args: &[String]) {
    let wanted = |label: &str| args.first().is_none_or(|f| label.contains(f.as_str()));
    let base = SimConfig {
        synthetic: SyntheticData { queries: 500, docs_per_query: 25, features: 46 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.5, ..PolicyConfig::default() },
        click_model: ClickModel { kind: ClickModelKind::AdditivePbm, ..ClickModel::default() },
        sessions: 50_000,
        ..SimConfig::default()
    };
    // Sessions of 10–25 items: draw the query size per query.
    if wanted("with 46 features, 25 items") {
        let sim = Simulator::new(SimConfig { top_n: 25, ..base.clone() }).expect("simulator");
        let t = Instant::now();
        let with = records(&sim, base.sessions);
        let secs = t.elapsed().as_secs_f64();
        println!("simulate (46 features, 25 items): {:.0} sessions/s", base.sessions as f64 / secs);
        bench_decode("with 46 features, 25 items", &with);
    }
    if wanted("with 46 features, 10 items") {
        let small = Simulator::new(SimConfig { top_n: 10, ..base.clone() }).expect("simulator");
        bench_decode("with 46 features, 10 items", &records(&small, base.sessions));
    }
    if wanted("MQ2008 46 features, 8-25 items (mq2008)") {
        // Real LTR features (MQ2008, values like 0.052632) from the repository's data/.
        let mq = ultr::simulate::dataset::default_mq2008_dir().expect("MQ2008: the repository's data/ (or $ULTR_DATA_DIR)");
        let data = (1..=5).map(|i| mq.join(format!("S{i}.txt"))).collect();
        let real = Simulator::new(SimConfig { data, relevance: RelevanceKind::Labels, ..base.clone() }).expect("simulator");
        bench_decode("MQ2008 46 features, 8-25 items", &records(&real, base.sessions));
    }
    if wanted("without features, 25 items (bare)") {
        let bare = Simulator::new(SimConfig { emit_features: false, ..base.clone() }).expect("simulator");
        let t = Instant::now();
        let without = records(&bare, base.sessions);
        println!("simulate (no features, 25 items): {:.0} sessions/s", base.sessions as f64 / t.elapsed().as_secs_f64());
        bench_decode("without features, 25 items", &without);
    }
}
