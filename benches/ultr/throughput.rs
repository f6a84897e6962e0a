//! Throughput benchmarks (run with `cargo bench --bench ultr -- throughput`): decode impressions/s on one core
//! with and without 46-dim features, the single-pass reader beside serde_json alone, and simulator
//! sessions/s. Figures go in the closing notes, not tests.

use std::time::Instant;

use ultr::session::{DecodeLimits, Decoder};
use ultr::simulate::click::{ClickModel, ClickModelKind};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};

fn records(sim: &Simulator, n: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut buf = Vec::new();
            sim.session(i, &mut buf);
            buf
        })
        .collect()
}

fn bench_decode(label: &str, records: &[Vec<u8>]) {
    // Alternate the two readers run by run, so machine noise falls on both alike.
    let mut best = [f64::MAX; 2];
    let mut rows = [0usize; 2];
    for _ in 0..5 {
        for (reader, serde_only) in [false, true].into_iter().enumerate() {
            let mut decoder = Decoder::new(DecodeLimits::default());
            if serde_only {
                decoder = decoder.serde_json_only();
            }
            let t = Instant::now();
            rows[reader] = 0;
            for (i, r) in records.iter().enumerate() {
                rows[reader] += decoder.decode(r).expect("simulated sessions are valid");
                if i % 4096 == 4095 {
                    std::hint::black_box(decoder.finish());
                }
            }
            std::hint::black_box(decoder.finish());
            best[reader] = best[reader].min(t.elapsed().as_secs_f64());
        }
    }
    let bytes: usize = records.iter().map(Vec::len).sum();
    for (reader, name) in ["single pass (default)", "serde_json only"].into_iter().enumerate() {
        println!(
            "decode {label}, {name}: {} sessions, {} impressions, best of 5 {:.3}s → {:.0} impressions/s, {:.0} MB/s",
            records.len(),
            rows[reader],
            best[reader],
            rows[reader] as f64 / best[reader],
            bytes as f64 / best[reader] / 1e6
        );
    }
}

pub fn main(_args: &[String]) {
    let base = SimConfig {
        synthetic: SyntheticData { queries: 500, docs_per_query: 25, features: 46 },
        relevance: RelevanceKind::Linear,
        policy: PolicyConfig { tau: 0.5, ..PolicyConfig::default() },
        click_model: ClickModel { kind: ClickModelKind::AdditivePbm, ..ClickModel::default() },
        sessions: 50_000,
        ..SimConfig::default()
    };
    // Sessions of 10–25 items: draw the query size per query.
    let sim = Simulator::new(SimConfig { top_n: 25, ..base.clone() }).expect("simulator");
    let t = Instant::now();
    let with = records(&sim, base.sessions);
    let secs = t.elapsed().as_secs_f64();
    println!("simulate (46 features, 25 items): {:.0} sessions/s", base.sessions as f64 / secs);
    bench_decode("with 46 features, 25 items", &with);

    let small = Simulator::new(SimConfig { top_n: 10, ..base.clone() }).expect("simulator");
    bench_decode("with 46 features, 10 items", &records(&small, base.sessions));

    // Real LTR features (MQ2008, values like 0.052632) from the repository's data/.
    let mq = ultr::simulate::dataset::default_mq2008_dir().expect("MQ2008: the repository's data/ (or $ULTR_DATA_DIR)");
    let data = (1..=5).map(|i| mq.join(format!("S{i}.txt"))).collect();
    let real = Simulator::new(SimConfig { data, relevance: RelevanceKind::Labels, ..base.clone() }).expect("simulator");
    bench_decode("MQ2008 46 features, 8-25 items", &records(&real, base.sessions));

    let bare = Simulator::new(SimConfig { emit_features: false, ..base.clone() }).expect("simulator");
    let t = Instant::now();
    let without = records(&bare, base.sessions);
    println!("simulate (no features, 25 items): {:.0} sessions/s", base.sessions as f64 / t.elapsed().as_secs_f64());
    bench_decode("without features, 25 items", &without);
}
