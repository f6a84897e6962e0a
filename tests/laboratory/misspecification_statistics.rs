//! The misspecification test's statistics (`ultr_train::misspecification`) on simulated held-out
//! windows with known truth: z's null distribution, its power, and the model's own estimation noise
//! that must not count as policy dependence.

use rand::{Rng, SeedableRng};
use ultr::train::data::Row;
use ultr::train::misspecification::*;
use ultr_core::math::sigmoid;

/// A held-out window of an ε-greedy policy: per (query, document) one on-policy position (π high)
/// and random other positions (π low). `leak` adds a policy-dependent term to the true logit.
fn window(seed: u64, docs: usize, leak: f64, overdispersion: f64) -> (Vec<Row>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut rows, mut logits) = (Vec::new(), Vec::new());
    for qd in 0..docs as u32 {
        let home = 1 + (qd % 10);
        let r = rng.random_range(-1.0..1.0);
        let xi: f64 = overdispersion * rng.random_range(-1.0..1.0f64);
        for k in 1..=10u32 {
            let pi = if k == home { 0.7 } else { 0.03 };
            let n = if k == home { 70 } else { 3 };
            let model = -(k as f64).ln() + r;
            let truth = model + xi + leak * pi;
            let clicks = (0..n).filter(|_| rng.random_bool(sigmoid(truth))).count() as u32;
            rows.push(Row { doc: qd, qd, position: k, impressions: n, clicks, propensity: pi });
            logits.push(model as f32);
        }
    }
    (rows, logits)
}

#[test]
fn z_is_standard_normal_for_a_well_specified_model_and_large_when_the_policy_leaks() {
    for overdispersion in [0.0, 1.0] {
        let zs: Vec<f64> = (0..200)
            .map(|s| {
                let (rows, logits) = window(s, 400, 0.0, overdispersion);
                score_test(&rows, &logits, |_| true, 0.01, Nuisance::PositionLogit).z
            })
            .collect();
        let mean = zs.iter().sum::<f64>() / zs.len() as f64;
        let sd = (zs.iter().map(|z| (z - mean).powi(2)).sum::<f64>() / (zs.len() - 1) as f64).sqrt();
        let over = zs.iter().filter(|z| **z > 2.0).count();
        eprintln!("overdispersion {overdispersion}: mean z {mean:.3}, sd {sd:.3}, {over}/200 above 2");
        assert!(mean.abs() < 0.3 && (0.75..1.3).contains(&sd), "null z not standard normal: mean {mean:.3}, sd {sd:.3}");
        assert!(over <= 12, "{over}/200 null windows above z = 2 (expected about 5)");
    }
    // Power: a policy leak of 1.5 logits on three streams (seeds 7, 8, 9), each far above z = 6.
    for seed in 7..=9 {
        let (rows, logits) = window(seed, 400, 1.5, 1.0);
        let t = score_test(&rows, &logits, |_| true, 0.01, Nuisance::PositionLogit);
        eprintln!("seed {seed}: leak 1.5, z {:.2}", t.z);
        assert!(t.assessable && t.z > 6.0, "seed {seed}: {t:?}");
    }
}

fn normal(rng: &mut impl Rng) -> f64 {
    let (u, v): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// The production ranker of a simulated window: each query's documents (`relevance` holds
/// `docs` per query) sorted by relevance + N(0, noise²).
fn noisy_rankings(relevance: &[f64], docs: usize, noise: f64, rng: &mut rand::rngs::StdRng) -> Vec<Vec<usize>> {
    relevance
        .chunks(docs)
        .map(|of_query| {
            let score: Vec<f64> = of_query.iter().map(|r| r + noise * normal(rng)).collect();
            let mut order: Vec<usize> = (0..docs).collect();
            order.sort_by(|a, b| score[*b].total_cmp(&score[*a]));
            order
        })
        .collect()
}

/// One session's list: the ranking, or with probability τ a uniform shuffle (ε-greedy).
fn explored(ranking: &[usize], tau: f64, rng: &mut rand::rngs::StdRng) -> Vec<usize> {
    let mut shown = ranking.to_vec();
    if rng.random_bool(tau) {
        for i in (1..shown.len()).rev() {
            shown.swap(i, rng.random_range(0..=i));
        }
    }
    shown
}

/// The shown cells (cell, query, document, position) of a count table indexed (q·docs + d)·positions + k.
fn shown_cells(impressions: &[u32], docs: usize, positions: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> + '_ {
    (0..impressions.len())
        .filter(move |&cell| impressions[cell] > 0)
        .map(move |cell| (cell, cell / (docs * positions), cell / positions % docs, cell % positions))
}

/// A per-document model as training leaves it: 400 queries × 15 documents, 10 positions, a
/// noisy production ranker explored with τ = 1/3 (π exact), clicks σ(θ_k + γ_qd + leak·π). Each
/// γ̂_qd is fitted by maximum likelihood (θ known, ridge 0.01) on 16,000 training sessions; the
/// held-out window is 4,000 further sessions. Documents the ranker keeps below the page are shown
/// only when exploring, so their γ̂ rest on a handful of impressions.
fn per_document_model_window(seed: u64, leak: f64) -> (Vec<Row>, Vec<f32>) {
    const Q: usize = 400;
    const D: usize = 15;
    const K: usize = 10;
    let tau = 1.0 / 3.0;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let theta: Vec<f64> = (1..=K).map(|k| -(k as f64).ln()).collect();
    let gamma: Vec<f64> = (0..Q * D).map(|_| -1.0 + normal(&mut rng)).collect();
    let ranking = noisy_rankings(&gamma, D, 1.0, &mut rng);
    let propensity = |q: usize, d: usize, k: usize| (1.0 - tau) * (ranking[q][k] == d) as u8 as f64 + tau / D as f64;
    let simulate = |sessions: usize, rng: &mut rand::rngs::StdRng| {
        let (mut n, mut c) = (vec![0u32; Q * D * K], vec![0u32; Q * D * K]);
        for _ in 0..sessions {
            let q = rng.random_range(0..Q);
            let shown = explored(&ranking[q], tau, rng);
            for (k, &d) in shown.iter().take(K).enumerate() {
                let p = sigmoid(theta[k] + gamma[q * D + d] + leak * propensity(q, d, k));
                let cell = (q * D + d) * K + k;
                n[cell] += 1;
                c[cell] += rng.random_bool(p) as u32;
            }
        }
        (n, c)
    };
    let (n_train, c_train) = simulate(16_000, &mut rng);
    let (n_test, c_test) = simulate(4_000, &mut rng);
    let mut gamma_hat = vec![0f64; Q * D];
    for (qd, g) in gamma_hat.iter_mut().enumerate() {
        for _ in 0..50 {
            let (mut gradient, mut curvature) = (-0.01 * *g, 0.01);
            for k in 0..K {
                let (n, c) = (n_train[qd * K + k] as f64, c_train[qd * K + k] as f64);
                let p = sigmoid(theta[k] + *g);
                gradient += c - n * p;
                curvature += n * p * (1.0 - p);
            }
            *g += (gradient / curvature).clamp(-2.0, 2.0);
        }
    }
    let (mut rows, mut logits) = (Vec::new(), Vec::new());
    for (cell, q, d, k) in shown_cells(&n_test, D, K) {
        let qd = (q * D + d) as u32;
        rows.push(Row { doc: qd, qd, position: k as u32 + 1, impressions: n_test[cell], clicks: c_test[cell], propensity: propensity(q, d, k) });
        logits.push((theta[k] + gamma_hat[q * D + d]) as f32);
    }
    (rows, logits)
}

/// Regression test for the embedding tower's false alarm (z ≈ 9–11 on a stream it fits exactly):
/// the per-document γ̂'s own noise is largest for rarely shown, low-π documents, so the
/// position-level test fires; taking the per-document levels out keeps the null and still sees a
/// policy that leaks into the clicks.
#[test]
fn a_per_document_model_s_own_estimation_noise_is_not_policy_dependence() {
    for seed in 1..=3 {
        let (rows, logits) = per_document_model_window(seed, 0.0);
        let position_level = score_test(&rows, &logits, |_| true, 0.01, Nuisance::PositionLogit);
        let per_document = score_test(&rows, &logits, |_| true, 0.01, Nuisance::PerDocument);
        eprintln!("seed {seed}: position-level z {:.2}, per-document z {:.2}", position_level.z, per_document.z);
        assert!(position_level.z > 3.0, "the setup should show the false alarm: {position_level:?}");
        assert!(per_document.assessable && per_document.z < 3.0, "{per_document:?}");
        let (rows, logits) = per_document_model_window(seed, 2.0);
        let leaking = score_test(&rows, &logits, |_| true, 0.01, Nuisance::PerDocument);
        eprintln!("seed {seed}: leak 2.0, per-document z {:.2}", leaking.z);
        assert!(leaking.z > 4.0, "{leaking:?}");
    }
}

/// A held-out window of Yan's 0:1:1:0 mixture (Yan 2022 §4.1.2): each session is RCTR (click
/// 0.5·γ_k, γ_k = 1/k) or DCTR (click 0.5·ω_qd, ω = 0.1 + 0.9·(2^y − 1)/3, y ∈ {0, 1, 2}) with
/// probability ½, so the clicks of a session move together. 400 queries × 15 documents, 10
/// positions, a noisy production ranker explored with τ = 1/3 (π exact). Returns the rows, the
/// logits of the mixture's exact marginal ¼γ_k + ¼ω_qd (what MixEM at its optimum serves), and
/// the logits −ln k (no document term: the per-document test's refit makes it the additive
/// model's best fit to these very rows).
fn mixture_window(seed: u64, sessions: usize) -> (Vec<Row>, Vec<f32>, Vec<f32>) {
    let mut stream = MixtureStream::new(seed);
    let (n, c) = stream.simulate(sessions);
    let (mut rows, mut marginal, mut additive) = (Vec::new(), Vec::new(), Vec::new());
    for (cell, q, d, k) in shown_cells(&n, MixtureStream::D, MixtureStream::K) {
        rows.push(stream.row(cell, q, d, k, &n, &c));
        let p = 0.25 / (k + 1) as f64 + 0.25 * stream.omega[q * MixtureStream::D + d];
        marginal.push((p / (1.0 - p)).ln() as f32);
        additive.push(-((k + 1) as f64).ln() as f32);
    }
    (rows, marginal, additive)
}

/// The 0:1:1:0 stream of `mixture_window`: documents' ω, the noisy ranker, and its random stream.
struct MixtureStream {
    omega: Vec<f64>,
    ranking: Vec<Vec<usize>>,
    rng: rand::rngs::StdRng,
}

impl MixtureStream {
    const Q: usize = 400;
    const D: usize = 15;
    const K: usize = 10;
    const TAU: f64 = 1.0 / 3.0;

    fn new(seed: u64) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let omega: Vec<f64> = (0..Self::Q * Self::D).map(|_| 0.1 + 0.9 * ((1u32 << rng.random_range(0..3u32)) - 1) as f64 / 3.0).collect();
        let ranking = noisy_rankings(&omega, Self::D, 0.3, &mut rng);
        MixtureStream { omega, ranking, rng }
    }

    fn propensity(&self, q: usize, d: usize, k: usize) -> f64 {
        (1.0 - Self::TAU) * (self.ranking[q][k] == d) as u8 as f64 + Self::TAU / Self::D as f64
    }

    /// Impressions and clicks per cell ((q·D + d)·K + k) of `sessions` sessions.
    fn simulate(&mut self, sessions: usize) -> (Vec<u32>, Vec<u32>) {
        let (mut n, mut c) = (vec![0u32; Self::Q * Self::D * Self::K], vec![0u32; Self::Q * Self::D * Self::K]);
        for _ in 0..sessions {
            let q = self.rng.random_range(0..Self::Q);
            let shown = explored(&self.ranking[q], Self::TAU, &mut self.rng);
            let position_driven = self.rng.random_bool(0.5);
            for (k, &d) in shown.iter().take(Self::K).enumerate() {
                let p = if position_driven { 0.5 / (k + 1) as f64 } else { 0.5 * self.omega[q * Self::D + d] };
                let cell = (q * Self::D + d) * Self::K + k;
                n[cell] += 1;
                c[cell] += self.rng.random_bool(p) as u32;
            }
        }
        (n, c)
    }

    fn row(&self, cell: usize, q: usize, d: usize, k: usize, n: &[u32], c: &[u32]) -> Row {
        let qd = (q * Self::D + d) as u32;
        Row { doc: qd, qd, position: k as u32 + 1, impressions: n[cell], clicks: c[cell], propensity: self.propensity(q, d, k) }
    }
}

/// MixEM as training would leave it at its optimum on the 0:1:1:0 stream: the true components and
/// mixing weights (RCTR 0.5/k and DCTR σ(r̂_qd), ½ each), with each document's DCTR relevance r̂_qd
/// fitted by maximum likelihood of the mixture's marginal (ridge 0.01 toward the mean) on `train`
/// sessions, scored on `test` further sessions. Documents the ranker keeps below the page are
/// shown only when exploring, so their r̂ rest on a handful of impressions. Returns the held-out
/// rows and the fitted marginal's logits.
fn fitted_mixture_window(seed: u64, train: usize, test: usize) -> (Vec<Row>, Vec<f32>) {
    const D: usize = MixtureStream::D;
    const K: usize = MixtureStream::K;
    let mut stream = MixtureStream::new(seed);
    let (n_train, c_train) = stream.simulate(train);
    let (n_test, c_test) = stream.simulate(test);
    let marginal = |k: usize, r: f64| 0.25 / (k + 1) as f64 + 0.5 * sigmoid(r);
    let prior = (0.25f64 / 0.75).ln();
    let mut relevance = vec![prior; stream.omega.len()];
    for (qd, r) in relevance.iter_mut().enumerate() {
        for _ in 0..50 {
            let (mut score, mut information) = (-0.01 * (*r - prior), 0.01);
            let s = sigmoid(*r);
            let slope = 0.5 * s * (1.0 - s);
            for k in 0..K {
                let (n, c) = (n_train[qd * K + k] as f64, c_train[qd * K + k] as f64);
                let p = marginal(k, *r);
                score += (c - n * p) * slope / (p * (1.0 - p));
                information += n * slope * slope / (p * (1.0 - p));
            }
            *r += (score / information).clamp(-2.0, 2.0);
        }
    }
    let (mut rows, mut logits) = (Vec::new(), Vec::new());
    for (cell, q, d, k) in shown_cells(&n_test, D, K) {
        rows.push(stream.row(cell, q, d, k, &n_test, &c_test));
        let p = marginal(k, relevance[q * D + d]);
        logits.push((p / (1.0 - p)).ln() as f32);
    }
    (rows, logits)
}

/// The per-document test on a mixture whose per-document relevance is an estimate, not the
/// truth: the r̂'s own finite-sample error (which a logit offset of the marginal takes out only
/// approximately) does not fire it, so a MixEM at its optimum would stay at the null. Issue 14:
/// the pipeline's MixEM fires because its fit is elsewhere (README, "The 0:1:1:0 mixture").
#[test]
fn a_fitted_mixture_s_estimation_noise_is_not_policy_dependence() {
    let mut null = Vec::new();
    for seed in 1..=3 {
        let (rows, logits) = fitted_mixture_window(seed, 60_000, 60_000);
        null.push(score_test(&rows, &logits, |_| true, 0.01, Nuisance::PerDocument).z);
    }
    for seed in 10..30 {
        let (rows, logits) = fitted_mixture_window(seed, 20_000, 20_000);
        null.push(score_test(&rows, &logits, |_| true, 0.01, Nuisance::PerDocument).z);
    }
    let mean = null.iter().sum::<f64>() / null.len() as f64;
    let above = null.iter().filter(|z| **z > 2.0).count();
    eprintln!("fitted mixture over {} windows: z {null:.2?}; mean {mean:.2}, {above} above 2", null.len());
    assert!(null.iter().all(|z| *z < 4.0) && mean.abs() < 0.6 && above <= 3, "{null:.2?}");
}

/// Issue 14's story on the test's side: on a 0:1:1:0 mixture the best additive (q,d) + k logit
/// leaves residuals that fall with π within documents, and the per-document test fires; the
/// mixture's exact marginal — the model that fits — stays at the null, although the mixture
/// correlates the clicks of a session across documents (the clusters are (q, d)).
#[test]
fn a_mixture_fires_for_the_additive_fit_and_not_for_its_exact_marginal() {
    let mut null = Vec::new();
    for seed in 1..=3 {
        let (rows, marginal, additive) = mixture_window(seed, 240_000);
        let exact = score_test(&rows, &marginal, |_| true, 0.01, Nuisance::PerDocument);
        let fitted = score_test(&rows, &additive, |_| true, 0.01, Nuisance::PerDocument);
        eprintln!("seed {seed}: exact marginal z {:.2} {:?}; additive fit z {:.2} {:?}", exact.z, exact.per_block, fitted.z, fitted.per_block);
        assert!(exact.assessable && exact.z < 3.0, "{exact:?}");
        assert!(fitted.z > 4.0, "{fitted:?}");
        null.push(exact.z);
    }
    // Many windows of the exact marginal: the false-alarm rate at the alert's threshold.
    for seed in 10..40 {
        let (rows, marginal, _) = mixture_window(seed, 20_000);
        null.push(score_test(&rows, &marginal, |_| true, 0.01, Nuisance::PerDocument).z);
    }
    let mean = null.iter().sum::<f64>() / null.len() as f64;
    let above = null.iter().filter(|z| **z > 2.0).count();
    eprintln!("exact marginal over {} windows: mean z {mean:.2}, {above} above 2, max {:.2}", null.len(), null.iter().cloned().fold(f64::MIN, f64::max));
    assert!(mean.abs() < 0.5 && above <= 4, "the mixture's own session correlation inflates z: {null:.2?}");
}

#[test]
fn a_level_error_of_the_logit_is_not_policy_dependence() {
    // On three streams (seeds 3, 4, 5): a logit 0.3 too high everywhere stays below z = 3.
    for seed in 3..=5 {
        let (rows, logits) = window(seed, 400, 0.0, 0.0);
        let shifted: Vec<f32> = logits.iter().map(|z| z + 0.3).collect();
        let t = score_test(&rows, &shifted, |_| true, 0.01, Nuisance::PositionLogit);
        eprintln!("seed {seed}: level error 0.3, z {:.2}", t.z);
        assert!(t.z < 3.0, "seed {seed}: {t:?}");
    }
}

#[test]
fn a_deterministic_policy_is_reported_blind_not_healthy() {
    let (mut rows, logits) = window(1, 400, 1.5, 0.0);
    for r in &mut rows {
        r.propensity = 1.0;
    }
    let t = score_test(&rows, &logits, |_| true, 0.01, Nuisance::PositionLogit);
    assert!(!t.assessable && t.z.is_nan() && t.reason.as_deref().is_some_and(|r| r.contains("cannot be assessed")), "{t:?}");
    assert_eq!(t.policy_variation, 0.0);
}

#[test]
fn z_matches_tabulated_chi2_quantiles() {
    // χ²_10 upper 1% point 23.209, χ²_1 upper 5% point 3.841, χ²_30 upper 0.1% point 59.703,
    // χ²_10 lower 5% point 3.940 (printed tables, 3 decimals).
    assert!((chi2_to_z(23.209, 10) - 2.326).abs() < 1e-3);
    assert!((chi2_to_z(3.841, 1) - 1.645).abs() < 1e-3);
    assert!((chi2_to_z(59.703, 30) - 3.090).abs() < 1e-3);
    assert!((chi2_to_z(3.940, 10) + 1.645).abs() < 1e-3);
    // Far past the tail f64 holds, the cube-root transform takes over and stays monotone.
    assert!(chi2_to_z(5_000.0, 10) > chi2_to_z(2_000.0, 10) && chi2_to_z(2_000.0, 10) > 37.0);
}
