//! The population optimum (`ultr_lab::experiment::population`) against the truth it must reach: the
//! linear tower's exact θ where it is well specified, and IPS removing the policy from a misspecified one.

use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{SimConfig, Simulator};
use ultr_lab::experiment::population::{fit_linear, PopulationSpec};

fn sim(relevance: RelevanceKind, noise: f64) -> Simulator {
    let mut c = SimConfig { relevance, noise, seed: 5, ..SimConfig::default() };
    c.synthetic.queries = 60;
    c.synthetic.docs_per_query = 10;
    c.synthetic.features = 8;
    Simulator::new(c).unwrap()
}

/// Exactly linear relevance (no noise) makes the linear tower well specified: the optimum is
/// the truth at any τ, including the deterministic policy, where only features identify θ.
#[test]
fn a_well_specified_model_recovers_the_true_theta_at_every_tau() {
    let s = sim(RelevanceKind::Linear, 0.0);
    for tau in [0.0, 0.5, 1.0] {
        let fit = fit_linear(&s, PopulationSpec { tau, feature_limit: None, ips: false, ips_clip: 100.0 }).unwrap();
        assert!(fit.gradient_max < 1e-6, "τ={tau}: not converged, |g| {}", fit.gradient_max);
        for (k, t) in fit.theta.iter().enumerate() {
            let truth = -((k + 1) as f64).ln();
            assert!((t - truth).abs() < 1e-5, "τ={tau} k={}: {t} vs {truth}", k + 1);
        }
    }
}

/// A misspecified tower moves θ with the policy; with IPS, every τ > 0 weights all (d, k)
/// pairs alike, so θ no longer depends on τ.
#[test]
fn ips_makes_the_misspecified_optimum_policy_independent() {
    let s = sim(RelevanceKind::Linear, 0.0);
    let at = |tau: f64, ips| fit_linear(&s, PopulationSpec { tau, feature_limit: Some(4), ips, ips_clip: 1e9 }).unwrap().theta;
    let gap = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    let (plain_low, plain_high) = (at(0.3, false), at(0.7, false));
    let (ips_low, ips_high) = (at(0.3, true), at(0.7, true));
    assert!(gap(&plain_low, &plain_high) > 0.02, "the policy should move a misspecified θ: {}", gap(&plain_low, &plain_high));
    assert!(gap(&ips_low, &ips_high) < 1e-6, "IPS θ depends on τ: {}", gap(&ips_low, &ips_high));
}
