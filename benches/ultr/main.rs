//! ultr's benchmarks, one binary so that they link the library once: `cargo bench --bench ultr --
//! NAME [ARGS]` runs one (each module's head says what it measures and takes). The test command
//! builds it (`scripts/test.sh`), so a bench that stops compiling fails CI. Figures go to
//! docs/benchmarks.md, never to tests.

mod aggregated_training;
mod cost_per_key;
mod scale_out;
mod throughput;
mod training;
mod windowing;

type Bench = fn(&[String]);

const BENCHES: [(&str, Bench, &str); 6] = [
    ("throughput", throughput::main, "decode impressions/s on one core, the simulator's sessions/s"),
    ("windowing", windowing::main, "ingest throughput, windows, state and peak RSS"),
    ("training", training::main, "training impressions/s per tower and backend [SESSIONS EPOCHS]"),
    ("aggregated_training", aggregated_training::main, "aggregated against raw training rows [SESSIONS EPOCHS BATCH_ROWS MODE]"),
    ("cost_per_key", cost_per_key::main, "peak RSS by window length [SESSIONS]"),
    ("scale_out", scale_out::main, "instances against a Kafka topic (SCALE_* environment variables)"),
];

fn main() {
    // `cargo bench` adds `--bench`; the bench's own arguments follow its name.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    match args.first().and_then(|name| BENCHES.iter().find(|(n, _, _)| n == name)) {
        Some((_, run, _)) => run(&args[1..]),
        None => {
            eprintln!("usage: cargo bench --bench ultr -- NAME [ARGS]");
            for (name, _, what) in BENCHES {
                eprintln!("  {name:<20} {what}");
            }
            if !args.is_empty() {
                std::process::exit(2);
            }
        }
    }
}
