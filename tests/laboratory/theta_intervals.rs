//! θ_k with uncertainty: `ultr train --theta-intervals` reports θ and bootstrap intervals
//! (checkpoint.json, JSON, an SVG), and over 20 simulated seeds the 95 % intervals cover the
//! simulator's true θ_k = −ln k at least as often as the 1 % quantile of Binomial(180, 0.95): the
//! shipped default's (the swap-pair estimate, 50 replicates) in a dense and a sparse regime, and the
//! paper replications' converged estimate (20 replicates) in the dense one.

use crate::common::OutputWithin;
use std::path::PathBuf;
use std::process::Command;

use ultr::simulate::relevance::RelevanceKind;
use ultr::train::config::TowerKind;
use ultr::train::uncertainty::UncertaintyConfig;
use ultr_lab::experiment::theta_coverage;

fn ultr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ultr"))
}

/// On three seeds (5, 6, 7), each its own test, at the default `position_bias` (`swap_pairs`).
fn train_reports_theta_intervals_that_hold_the_truth(seed: u64) {
    intervals_hold_the_truth(seed, "swap_pairs");
}

/// The same checks with `position_bias = "joint"` (θ trained with the tower, then refit; the
/// interval is the gradient fit's converged estimate's), on seed 5: the CI test of that interval,
/// whose 20-seed coverage test runs on demand (below).
#[test]
fn train_reports_joint_theta_intervals_that_hold_the_truth() {
    intervals_hold_the_truth(5, "joint");
}

/// `ultr ingest` then `ultr train --theta-intervals` (20 replicates) on 20,000 simulated sessions
/// (linear relevance, linear tower, τ 0.3) with `[train] position_bias = position_bias`: the
/// intervals are ordered, narrower than 0.5, hold the truth at all but at most two of θ_2..θ_10 and
/// hold the shipped θ, which is what `train` reports; the checkpoint records them and draws them.
fn intervals_hold_the_truth(seed: u64, position_bias: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pipeline.toml");
    std::fs::write(
        &config,
        format!(
            "source = \"simulator\"\n[simulator]\nrelevance = \"linear\"\nsessions = 20000\nseed = {seed}\ninterval_ms = 1000\n[simulator.policy]\ntau = 0.3\n\
         [simulator.synthetic]\nqueries = 60\ndocs_per_query = 10\nfeatures = 8\n[window]\nsize = \"1h\"\n[train]\ntower = \"linear\"\nposition_bias = \"{position_bias}\"\n\
         [train.uncertainty]\nreplicates = 20\n"
        ),
    )
    .unwrap();
    let state = dir.path().join("state");
    let out = ultr().args(["ingest", "--config"]).arg(&config).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = ultr()
        .args(["train", "--json", "--theta-intervals", "--config"])
        .arg(&config)
        .arg("--state")
        .arg(&state)
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.code().is_some_and(|c| c <= 1), "{}", String::from_utf8_lossy(&out.stderr));
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &outcome["theta_intervals"];
    let v = |key: &str| -> Vec<f64> { t[key].as_array().unwrap_or_else(|| panic!("{key} in {t}")).iter().map(|x| x.as_f64().unwrap()).collect() };
    let (converged, lower, upper, early, shipped) = (v("converged"), v("lower"), v("upper"), v("early_stopped"), v("shipped"));
    assert_eq!(t["replicates"], 20);
    assert!(converged.len() >= 8, "{converged:?}");
    let mut covered = 0;
    for k in 1..converged.len() {
        assert!(lower[k] < upper[k], "k = {}: [{}, {}]", k + 1, lower[k], upper[k]);
        assert!(upper[k] - lower[k] < 0.5, "k = {}: an interval this wide says nothing", k + 1);
        let truth = -((k + 1) as f64).ln();
        covered += (lower[k] <= truth && truth <= upper[k]) as usize;
        assert!((early[k] - truth).abs() < 0.3, "k = {}: early-stopped {} vs truth {truth}", k + 1, early[k]);
    }
    // 95 % intervals, 9 positions: all but at most two hold the truth (P(≥ 3 misses) < 1 % if calibrated).
    assert!(covered + 2 >= converged.len() - 1, "covered {covered} of {}: {lower:?} {upper:?}", converged.len() - 1);
    // The θ that ships is inside the interval at every position (with θ from the swap pairs, the
    // default here, it is the interval's centre), and what `train` reports as θ.
    for k in 1..converged.len() {
        assert!(lower[k] <= shipped[k] && shipped[k] <= upper[k], "k = {}: shipped {} outside [{}, {}]", k + 1, shipped[k], lower[k], upper[k]);
        assert!((outcome["theta"][k].as_f64().unwrap() - shipped[k]).abs() < 1e-9);
    }
    let checkpoint = state.join("models").join(outcome["id"].as_str().unwrap());
    let info: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(checkpoint.join("checkpoint.json")).unwrap()).unwrap();
    assert_eq!(info["theta_intervals"]["converged"], t["converged"]);
    let svg = std::fs::read_to_string(checkpoint.join("theta_intervals.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("truth (line)"));
}

crate::seeded_tests!(train_reports_theta_intervals_that_hold_the_truth => train_reports_theta_intervals_that_hold_the_truth; seed_5 = 5, seed_6 = 6, seed_7 = 7);

/// `ultr experiment theta-coverage --defaults paper-replication` (θ trained with the tower, then
/// refit; the interval is the gradient fit's converged estimate's) on 20 seeds of 20,000 sessions,
/// with 20 query-bootstrap replicates (50 cost half again the time). The 95 % intervals of
/// θ_2..θ_10 cover the truth in at least as many of the 180 (seed, position) pairs as the 1 % quantile
/// of Binomial(180, 0.95): 164, computed here. Measured (2026-11-28): 171/180 on these logs with 20
/// replicates, 163/180 with 50; with 50 replicates on 60 further logs (seeds 21–80) 510/540, and
/// over all 80 logs 673/720 = 93.5 % against that floor's 670 (results/theta_coverage/seeds-21-80,
/// docs/models.md). The pairs of one seed share θ̂_1's error, so the binomial bound is a guide, not
/// an exact test.
/// The converged estimate is unbiased where the early-stopped one is flattened; the shipped θ
/// (early-stopped, then refit with the relevance tower frozen) lies inside the converged interval at
/// 180 of 180 pairs (measured at 20 and at 50 replicates) and is unbiased to 0.028.
/// On demand, not in the test command (`cargo nextest run --release --run-ignored only -E
/// 'test(/over_twenty_seeds/)'`, 75 s on two threads): it tests `position_bias = "joint"`, which is
/// not the default since issue 87, and costs 170 CPU-s; `train_reports_joint_theta_intervals_…`
/// tests that interval in CI, and the shipped default's coverage is tested below.
#[test]
#[ignore = "the paper replication's 20-seed coverage (position_bias = \"joint\"), 170 CPU-s: run on demand"]
fn bootstrap_intervals_cover_at_the_binomial_floor_of_95_percent_over_twenty_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let opts = coverage_options(
        dir.path(),
        20_000,
        UncertaintyConfig { enabled: true, replicates: 20, ..UncertaintyConfig::default() },
        theta_coverage::Defaults::PaperReplication,
    );
    let s = theta_coverage::run(&opts).unwrap();
    eprintln!("{}", std::fs::read_to_string(opts.out.join("summary.md")).unwrap());
    assert_eq!((s.seeds.len(), s.coverage.len()), (20, 9));
    let pairs = s.seeds.len() * s.coverage.len();
    let floor = binomial_quantile(pairs as u64, 0.95, 0.01);
    let covered = (s.pooled_coverage * pairs as f64).round() as u64;
    assert!(covered >= floor, "covered {covered} of {pairs}, under the 1 % quantile of Binomial({pairs}, 0.95), {floor}: per position {:?}", s.coverage);
    assert!(s.converged_bias.iter().all(|b| b.abs() < 0.05), "converged bias {:?}", s.converged_bias);
    // Early stopping flattens θ: from k = 6 on its bias exceeds 0.15 (θ too close to 0).
    assert!(s.early_stopped_bias[4..].iter().all(|b| *b > 0.15), "early-stopped bias {:?}", s.early_stopped_bias);
    // The refit undoes it. The mean over 20 seeds of a θ̂ with se ≈ 0.055 (the intervals' mean
    // width 0.2 ÷ 2t) has se ≈ 0.012: |bias| < 0.06 is five of them.
    assert!(s.shipped_bias.iter().all(|b| b.abs() < 0.06), "shipped bias {:?}", s.shipped_bias);
    assert!(s.shipped_within >= 0.95, "shipped θ within the converged interval at {:.3} of the pairs", s.shipped_within);
}

/// At the shipped default — `TrainConfig::default()` (θ from the swap pairs, the pairwise
/// conditional estimate) and `[train.uncertainty]` as `UncertaintyConfig::default()` (50
/// query-bootstrap replicates of that estimate) — on 20 seeds of `sessions` sessions: the 95 %
/// intervals of θ_2..θ_10 cover the truth in at least the 1 % quantile of Binomial(180, 0.95), 164,
/// of the (seed, position) pairs, the interval is centred on the θ that ships (to 0.001: the centre is
/// re-estimated in f32), and that θ's mean
/// error over the seeds is under `bias` at every position.
fn shipped_default_covers(sessions: u64, bias: f64) {
    let dir = tempfile::tempdir().unwrap();
    let opts = coverage_options(dir.path(), sessions, UncertaintyConfig { enabled: true, ..UncertaintyConfig::default() }, theta_coverage::Defaults::Shipped);
    let s = theta_coverage::run(&opts).unwrap();
    eprintln!("{}", std::fs::read_to_string(opts.out.join("summary.md")).unwrap());
    assert_eq!(UncertaintyConfig::default().replicates, 50, "the shipped default this test is about");
    assert_eq!((s.seeds.len(), s.coverage.len()), (20, 9));
    assert!(s.seeds[0].intervals.method.starts_with("swap-pair estimate"), "{}", s.seeds[0].intervals.method);
    let pairs = s.seeds.len() * s.coverage.len();
    let floor = binomial_quantile(pairs as u64, 0.95, 0.01);
    let covered = (s.pooled_coverage * pairs as f64).round() as u64;
    assert!(covered >= floor, "covered {covered} of {pairs}, under the 1 % quantile of Binomial({pairs}, 0.95), {floor}: per position {:?}", s.coverage);
    for r in &s.seeds {
        let apart = r.shipped.iter().zip(&r.intervals.converged).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(apart < 1e-3, "seed {}: the interval's centre {:?} is not the shipped θ {:?}", r.seed, r.intervals.converged, r.shipped);
    }
    assert!(s.shipped_bias.iter().all(|b| b.abs() < bias), "shipped bias {:?}", s.shipped_bias);
}

/// `shipped_default_covers` in a dense regime, 20 seeds of 20,000 sessions. Measured (2026-12-07):
/// 165/180 covered on seeds 1–20, 521/540 on seeds 21–80 (686/720 = 95.3 % over 80 logs, floor
/// 670; results/theta_coverage/shipped-default); mean error −0.006 … +0.013 (a mean of 20 θ̂ with
/// se ≈ 0.045 has se ≈ 0.01, so |bias| < 0.05 is five of them). The estimate before it (a random
/// effect per pair) was 0.04–0.09 too steep here and covered 114/180.
#[test]
fn bootstrap_intervals_at_the_shipped_default_cover_at_the_binomial_floor_in_a_dense_regime() {
    shipped_default_covers(20_000, 0.05);
}

/// `shipped_default_covers` in a sparse regime, 20 seeds of 3,000 sessions. Measured (2026-12-07):
/// 170/180, mean error −0.005 … +0.054 (se ≈ 0.12 per log, ≈ 0.027 for a mean of 20: |bias| < 0.12
/// is four and a half of them).
#[test]
fn bootstrap_intervals_at_the_shipped_default_cover_at_the_binomial_floor_in_a_sparse_regime() {
    shipped_default_covers(3_000, 0.12);
}

/// The coverage experiment's settings for every test above: 20 seeds of `sessions` sessions, linear
/// relevance without noise, a linear tower, τ = 0.3, 10 positions.
fn coverage_options(dir: &std::path::Path, sessions: u64, uncertainty: UncertaintyConfig, defaults: theta_coverage::Defaults) -> theta_coverage::Options {
    theta_coverage::Options {
        out: dir.join("coverage"),
        data: Vec::<PathBuf>::new(),
        sessions,
        seeds: (1..=20).collect(),
        tau: 0.3,
        relevance: RelevanceKind::Linear,
        noise: 0.0,
        tower: TowerKind::Linear,
        defaults,
        positions: 10,
        max_epochs: 50,
        uncertainty,
        jobs: 2,
    }
}

/// The smallest k with P(X ≤ k) ≥ q for X ~ Binomial(n, p), summing the mass function in log space.
fn binomial_quantile(n: u64, p: f64, q: f64) -> u64 {
    let ln_choose = |k: u64| (1..=k).map(|i| ((n - k + i) as f64).ln() - (i as f64).ln()).sum::<f64>();
    let mut cdf = 0.0;
    for k in 0..=n {
        cdf += (ln_choose(k) + k as f64 * p.ln() + (n - k) as f64 * (1.0 - p).ln()).exp();
        if cdf >= q {
            return k;
        }
    }
    n
}

/// The quantile against values computed independently (exact rational sums with Python's math.comb).
#[test]
fn binomial_quantile_matches_reference_values() {
    assert_eq!(binomial_quantile(180, 0.95, 0.01), 164);
    assert_eq!(binomial_quantile(720, 0.95, 0.01), 670);
    assert_eq!(binomial_quantile(10, 0.5, 0.5), 5);
}

/// `ultr experiment theta-coverage …` runs the laboratory's own binary (`ultr-lab`, which the `ultr`
/// binary does not link) with the same arguments: on one seed of 2,000 sessions with 10 replicates
/// it exits 0, prints the experiment's summary and writes its files where `--out` says.
#[test]
fn ultr_experiment_runs_the_lab_binary_with_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("coverage");
    let args = ["experiment", "theta-coverage", "--sessions", "2000", "--seeds", "1", "--replicates", "10", "--jobs", "1", "--out"];
    let run = ultr().args(args).arg(&out).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stdout).contains("Pooled coverage"), "{}", String::from_utf8_lossy(&run.stdout));
    for file in ["results.csv", "summary.md", "summary.json", "intervals.svg"] {
        assert!(out.join(file).is_file(), "{file} not written");
    }
}
