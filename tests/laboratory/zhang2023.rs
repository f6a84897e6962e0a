//! `ultr experiment zhang2023` at a small scale (MQ2008 fold 1, 50,000 training sessions per cell, 3
//! seeds, the Random policy, the cells the assertions read): the claim of Zhang et al. 2023 that
//! reproduces robustly on MQ2008 at this scale is asserted (docs/experiments.md has the full-scale
//! table, with the claims that need the Oracle policy and the adversarial methods), and DLA's
//! propensity model recovers the simulated examination P(E|k) = 1/k.

use crate::common;

use ultr::train::config::TowerKind;
use ultr::train::device::BackendKind;
use ultr_lab::experiment::zhang2023::{self as z, Method, Options};

fn options(out: &std::path::Path) -> Options {
    Options {
        out: out.to_path_buf(),
        train_sessions: 50_000,
        seeds: vec![1, 2, 3],
        max_epochs: 20,
        jobs: 1, // runs in parallel share burn's device generator: one at a time is reproducible
        backend: BackendKind::Flex,
        tower: TowerKind::Mlp,
        max_positions: 50,
        // Claim 4 reads Biased and PAL at Random, the propensity check DLA at Random; the other
        // cells are reported by the full run only (they were printed here, never asserted).
        policies: vec![0.0],
        methods: Method::table().into_iter().filter(|m| ["Biased", "PAL", "DLA"].contains(&m.name.as_str())).collect(),
        eta_sweep: Vec::new(),
        dropout_sweep: Vec::new(),
        progress: false,
    }
}

#[test]
fn zhang2023_claim_4_and_the_dla_position_bias_on_mq2008() {
    let dir = tempfile::tempdir().unwrap();
    let data = z::mq2008(common::mq2008_files()[0].parent().unwrap()).unwrap();
    let opts = options(dir.path());
    let summary = z::run(&opts, std::slice::from_ref(&data)).unwrap();
    for f in ["results.csv", "summary.md", "summary.json", "ndcg.svg"] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
    let table = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    eprintln!("{table}");
    assert_eq!(summary.runs.len(), 3 * 3);
    assert!(summary.runs.iter().all(|r| r.train_sessions == 50_000 && r.test_queries > 100));
    let claim = |n: u8| summary.checks.iter().find(|c| c.claim == n).unwrap();
    eprintln!("claim 4: {}", claim(4).detail);
    // What reproduces robustly on MQ2008 at this scale (docs/experiments.md "Zhang 2023"): Biased is
    // below PAL at Random (claim 4) beyond the paired seed noise. Claims 1–3 are not asserted: at this
    // size GradRev − PAL at Oracle ranged from +0.013 to +0.007 over two runs, within noise; at full
    // scale claim 2 holds on MQ2008 (docs/experiments.md).
    assert!(claim(4).holds, "claim 4: {}", claim(4).detail);
    // DLA's propensity model at Random: φ_k − φ_1 = log P(E|k)/P(E|1) = −ln k, decreasing in k on
    // every seed. Measured (seeds 1–3, k = 2..5, 2026-12-06): the estimate falls short of the truth
    // by 0.13 on average (−0.02 to +0.26; sd 0.09 over the twelve). Asserted on each k's three-seed
    // mean: within 0.25 of −ln k, the mean shortfall plus two standard errors of a three-seed mean
    // (2 × 0.09 / √3 = 0.10), rounded up.
    let dla: Vec<_> = summary.runs.iter().filter(|r| r.method == "DLA" && r.w == 0.0).collect();
    assert_eq!(dla.len(), 3);
    for r in &dla {
        eprintln!("DLA seed {}: φ_k − φ_1 = {:.3?}", r.seed, &r.position_bias[..5]);
        for k in 2..=5 {
            assert!(r.position_bias[k - 1] < r.position_bias[k - 2], "seed {}: φ_{k} − φ_1 = {:.3} is not below φ_{}", r.seed, r.position_bias[k - 1], k - 1);
        }
    }
    for k in 2..=5 {
        let mean = dla.iter().map(|r| r.position_bias[k - 1]).sum::<f64>() / dla.len() as f64;
        let truth = -(k as f64).ln();
        assert!((mean - truth).abs() < 0.25, "φ_{k} − φ_1 over three seeds: {mean:.3}, truth {truth:.3}");
    }
}

/// Hand-computed: differences 0.1, 0.2, 0.3 (mean 0.2, sd 0.1, se 0.1/√3 = 0.057735) against
/// t(0.95, 2) = 2.919986, a bound of 0.168585: beyond noise. Differences 0.0, 0.2, 0.4 (sd 0.2, bound
/// 0.337171) are not. A seed present in one run only is not paired; one paired seed decides nothing.
#[test]
fn beyond_noise_is_a_one_sided_paired_t_test_with_n_minus_1_degrees_of_freedom() {
    let b = [(1, 0.4), (2, 0.4), (3, 0.4)];
    let (holds, mean, bound) = z::beyond_noise(&[(1, 0.5), (2, 0.6), (3, 0.7), (9, 5.0)], &b);
    assert!(holds && (mean - 0.2).abs() < 1e-12 && (bound - 0.168585).abs() < 1e-6, "{mean} {bound}");
    let (holds, mean, bound) = z::beyond_noise(&[(1, 0.4), (2, 0.6), (3, 0.8)], &b);
    assert!(!holds && (mean - 0.2).abs() < 1e-12 && (bound - 0.337171).abs() < 1e-6, "{mean} {bound}");
    let (holds, mean, _) = z::beyond_noise(&[(1, 9.0)], &b);
    assert!(!holds && mean.is_nan());
}

/// The same differences 0.0, 0.2, 0.4: the lower bound 0.2 − 0.337171 = −0.137171 is not above
/// −0.1 but is above −0.2; differences all equal to −0.05 (sd 0) are not worse by 0.06, but are
/// worse by 0.05 (the bound must lie strictly above −margin).
#[test]
fn not_worse_by_compares_the_paired_lower_bound_with_minus_the_margin() {
    let b = [(1, 0.4), (2, 0.4), (3, 0.4)];
    let a = [(1, 0.4), (2, 0.6), (3, 0.8)];
    assert!(!z::not_worse_by(&a, &b, 0.1).0);
    assert!(z::not_worse_by(&a, &b, 0.2).0);
    let worse = [(1, 0.35), (2, 0.35), (3, 0.35)];
    assert!(z::not_worse_by(&worse, &b, 0.06).0);
    assert!(!z::not_worse_by(&worse, &b, 0.05).0);
    assert!(!z::not_worse_by(&[(1, 0.4)], &b, 1.0).0, "one seed decides nothing");
}
