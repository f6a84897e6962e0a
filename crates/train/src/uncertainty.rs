//! θ_k with uncertainty, for click logs without ground truth: the converged estimate (no early
//! stopping, no weight decay — both shrink θ towards 0) beside the early-stopped one, and intervals
//! from a Poisson bootstrap that refits the converged estimator on resampled data: θ̂ ± t·se with the
//! replicates' standard error (t from Student's t with B − 1 degrees of freedom), and the percentile
//! interval beside it. With tens of replicates the percentile interval runs between the extreme
//! replicates and covers less than its level (a new draw falls between the i-th and j-th of B
//! order statistics with probability (j − i)/(B + 1)); the t interval does not have that problem.
//!
//! The bootstrap resamples queries by default: every query's rows are scaled by one Poisson(1)
//! multiplicity, so the replicates vary which queries the log holds as well as their clicks —
//! queries are the independent units of a search log. `unit = "impression"` draws every impression
//! on its own instead (exact and cheap on aggregated rows: (n, c) becomes (c′ + u′, c′) with
//! c′ ~ Poisson(c), u′ ~ Poisson(n − c)); it keeps only the click noise given the queries and, on the
//! simulator, its intervals cover too rarely (`ultr experiment theta-coverage --unit impression`).
//! π (the IPS weights) is held at the full data's estimate. Each replicate starts from the converged
//! model, trains `epochs` epochs and is annealed as the converged fit is (a warm start: the
//! replicate's optimum lies near the full data's).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Poisson};
use serde::{Deserialize, Serialize};

use super::artefact::Trained;
use super::config::TrainConfig;
use super::data::Examples;
use super::fit::fit;

pub use super::config::{ResampleUnit, UncertaintyConfig};

/// θ_k − θ_1 per position k = 1..=K, three ways, and the interval of the converged estimator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThetaIntervals {
    /// The model trained as configured (early stopping on the validation loss, weight decay),
    /// before the θ refit (`[train] refit_position_bias`).
    pub early_stopped: Vec<f64>,
    /// The model that ships: early-stopped, then θ refit (the same as `early_stopped` without the
    /// refit). Absent (empty) in checkpoints written before the refit.
    #[serde(default)]
    pub shipped: Vec<f64>,
    /// The estimate the interval is centred on: trained without early stopping or weight decay until
    /// θ stops moving (or `converged_epochs`); with θ from the swap pairs (the default), that
    /// estimate, which is also the θ that ships (`converged_after_epochs` 0).
    pub converged: Vec<f64>,
    /// Epochs the converged fit took, and whether θ settled within them.
    pub converged_after_epochs: usize,
    pub settled: bool,
    /// converged ± t·standard_error: the interval reported.
    pub lower: Vec<f64>,
    pub upper: Vec<f64>,
    /// The replicates' (α/2, 1 − α/2) quantiles.
    pub percentile_lower: Vec<f64>,
    pub percentile_upper: Vec<f64>,
    /// The replicates' standard deviation per position.
    pub standard_error: Vec<f64>,
    pub level: f64,
    pub replicates: usize,
    pub method: String,
}

/// Epochs per block of the converged fit (one full-batch step each, see `converged_config`).
const BLOCK_EPOCHS: usize = 50;

/// The configuration of the converged estimator: no early stopping, no weight decay, one step per
/// epoch on the exact gradient of all training rows (`full_batch`) at 10× the learning rate.
/// Minibatch SGD's jitter of θ was as large as θ's standard error, so the "converged" estimate
/// depended on the seed; the full gradient does not.
pub fn converged_config(cfg: &TrainConfig) -> TrainConfig {
    TrainConfig {
        early_stopping: false,
        refit_position_bias: false,
        logged_order_prior: Vec::new(),
        logged_order_combination: Vec::new(),
        weight_decay: 0.0,
        max_epochs: BLOCK_EPOCHS,
        batch_impressions: usize::MAX / 4,
        learning_rate: cfg.learning_rate * 10.0,
        ..cfg.clone()
    }
}

/// `ex` with the rows of each split in one span, so the fit takes whole spans (the raw-session
/// path) and, with `converged_config`'s batch size, every training row in every step: the exact,
/// count-weighted gradient. Raw sessions (no split decided) are kept as they are.
pub fn full_batch(ex: &Examples) -> Examples {
    use super::data::{SessionSpan, Split};
    let z = ex.n_bias_features;
    let mut out = Examples { rows: Vec::with_capacity(ex.rows.len()), bias: Vec::with_capacity(ex.bias.len()), sessions: Vec::new(), ..ex.clone() };
    for split in [Some(Split::Training), Some(Split::Validation), Some(Split::Evaluation), None] {
        let start = out.rows.len();
        for span in ex.sessions.iter().filter(|s| s.split == split) {
            let first = out.rows.len();
            out.rows.extend_from_slice(&ex.rows[span.start..span.start + span.len]);
            out.bias.extend_from_slice(&ex.bias[span.start * z..(span.start + span.len) * z]);
            if split.is_none() {
                out.sessions.push(SessionSpan { start: first, ..*span });
            }
        }
        if split.is_some() && out.rows.len() > start {
            out.sessions.push(SessionSpan { start, len: out.rows.len() - start, hash: 0, split });
        }
    }
    out
}

/// Epochs of each annealing block (learning rate ÷ 10, then ÷ 100).
const ANNEAL_EPOCHS: usize = 25;

/// The largest |Δθ_k| over k ≤ `positions` between two models.
fn moved(a: &Trained, b: &Trained, positions: usize) -> f64 {
    a.position_bias().iter().zip(b.position_bias()).take(positions).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// Continues `model` for `ANNEAL_EPOCHS` at the learning rate ÷ 10 and then ÷ 100, so the final
/// iterate sits at the optimum instead of jittering around it with the step size; returns it and
/// how far θ moved in the last block.
fn anneal(ex: &Examples, block: &TrainConfig, model: Trained, positions: usize) -> anyhow::Result<(Trained, f64)> {
    let mut model = model;
    let mut last = f64::INFINITY;
    for (i, divisor) in [10.0, 100.0].into_iter().enumerate() {
        let cfg = TrainConfig {
            learning_rate: block.learning_rate / divisor,
            max_epochs: ANNEAL_EPOCHS,
            seed: block.seed.wrapping_add(1000 + i as u64),
            ..block.clone()
        };
        let (next, _) = fit(ex, &cfg, Some(&model), false)?;
        last = moved(&next, &model, positions);
        model = next;
    }
    Ok((model, last))
}

/// Trains the converged estimator: blocks of `BLOCK_EPOCHS` epochs, each continuing the last, until
/// a block moves no θ_k (k ≤ `positions`) by more than `tolerance` or `converged_epochs` ran out;
/// then anneals. Returns the model, the epochs taken, and whether θ settled before the cap.
pub fn converge(ex: &Examples, cfg: &TrainConfig, u: &UncertaintyConfig, positions: usize) -> anyhow::Result<(Trained, usize, bool)> {
    let ex = &full_batch(ex);
    let block = converged_config(cfg);
    let (mut model, _) = fit(ex, &block, None, false)?;
    if profiled(cfg) {
        // θ is the profiled refit's, which does not depend on how far gradient training took γ.
        let settled = super::refit::refit_position_bias(&mut model, ex, cfg)?.is_none_or(|r| r.iterations < super::refit::MAX_ROUNDS);
        return Ok((model, BLOCK_EPOCHS, settled));
    }
    let mut epochs = BLOCK_EPOCHS;
    let mut settled = false;
    while epochs < u.converged_epochs && !settled {
        let cfg_b = TrainConfig { seed: cfg.seed.wrapping_add(epochs as u64), ..block.clone() };
        let (next, _) = fit(ex, &cfg_b, Some(&model), false)?;
        epochs += BLOCK_EPOCHS;
        settled = moved(&next, &model, positions) <= u.tolerance;
        model = next;
    }
    let (model, _) = anneal(ex, &block, model, positions)?;
    Ok((model, epochs + 2 * ANNEAL_EPOCHS, settled))
}

/// Whether θ's converged estimate is the profiled refit under its priors (`refit.rs`), as the
/// shipped θ of the embedding tower is, rather than a gradient fit run to convergence. Without the
/// priors a position whose swap pairs carry no click has no maximum and the gradient fit runs θ as
/// far as its epochs let it (−9 to −17 on a real log, intervals 6.7 wide), and the shipped θ falls
/// outside the interval of a different estimator. Feature towers keep the gradient fit (their
/// refit holds r(x) fixed, a different problem).
fn profiled(cfg: &TrainConfig) -> bool {
    cfg.tower.pair_embedding() && !cfg.model.input_shape().lists()
}

/// `ex` with every row's (impressions, clicks) replaced by `draw`'s (rows drawn empty are dropped;
/// spans follow their rows).
fn resample(ex: &Examples, mut draw: impl FnMut(&super::data::Row, &str) -> (u32, u32)) -> Examples {
    let mut out = Examples { rows: Vec::with_capacity(ex.rows.len()), bias: Vec::new(), sessions: Vec::with_capacity(ex.sessions.len()), ..ex.clone() };
    let z = ex.n_bias_features;
    for span in &ex.sessions {
        let start = out.rows.len();
        for i in span.start..span.start + span.len {
            let r = ex.rows[i];
            let query = ex.qd_keys.get(r.qd as usize).map_or("", |(q, _)| q.as_str());
            let (impressions, clicks) = draw(&r, query);
            if impressions == 0 {
                continue;
            }
            out.rows.push(super::data::Row { impressions, clicks, ..r });
            out.bias.extend_from_slice(&ex.bias[i * z..(i + 1) * z]);
        }
        if out.rows.len() > start {
            out.sessions.push(super::data::SessionSpan { start, len: out.rows.len() - start, ..*span });
        }
    }
    out
}

/// `ex` with every query's rows scaled by one Poisson(1) multiplicity.
pub fn query_resample(ex: &Examples, rng: &mut ChaCha8Rng) -> Examples {
    let poisson = Poisson::new(1.0).expect("λ = 1");
    let mut by_query: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
    resample(ex, |r, query| {
        let m = *by_query.entry(query.to_string()).or_insert_with(|| poisson.sample(rng) as u32);
        (r.impressions * m, r.clicks * m)
    })
}

/// `ex` with every impression's multiplicity drawn from Poisson(1): clicks′ ~ Poisson(clicks),
/// non-clicks′ ~ Poisson(impressions − clicks).
pub fn poisson_resample(ex: &Examples, rng: &mut ChaCha8Rng) -> Examples {
    let mut draw = |mean: u32| -> u32 {
        if mean == 0 {
            0
        } else {
            Poisson::new(mean as f64).map(|p| p.sample(rng) as u32).unwrap_or(0)
        }
    };
    resample(ex, |r, _| {
        let clicks = draw(r.clicks);
        (clicks + draw(r.impressions - r.clicks.min(r.impressions)), clicks)
    })
}

/// The p-quantile of Student's t with ν degrees of freedom (statrs; ν = ∞ is the normal).
pub fn student_t_quantile(p: f64, nu: f64) -> f64 {
    use statrs::distribution::{ContinuousCDF, StudentsT};
    StudentsT::new(0.0, 1.0, nu).expect("ν > 0: at least two replicates").inverse_cdf(p)
}

/// The q-quantile of sorted values (linear interpolation).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let h = q * (sorted.len() - 1) as f64;
    let (i, f) = (h.floor() as usize, h - h.floor());
    if i + 1 < sorted.len() {
        sorted[i] * (1.0 - f) + sorted[i + 1] * f
    } else {
        sorted[i]
    }
}

/// The converged estimate and its bootstrap interval, for a model already trained as configured
/// (`early`: the model that ships, its θ before the refit taken from `before_refit` when it ran).
/// `positions` limits the report to the positions seen in training.
pub fn theta_intervals(
    ex: &Examples,
    cfg: &TrainConfig,
    u: &UncertaintyConfig,
    early: &Trained,
    before_refit: Option<&[f64]>,
    positions: usize,
) -> anyhow::Result<ThetaIntervals> {
    anyhow::ensure!(
        !cfg.model.input_shape().lists(),
        "θ intervals resample aggregated rows; the session model `{}` trains on whole sessions",
        cfg.model.name()
    );
    if let Some(intervals) = swap_pair_intervals(ex, cfg, u, early, positions)? {
        return Ok(intervals);
    }
    let (converged, converged_after_epochs, settled) = converge(ex, cfg, u, positions)?;
    let replicate_cfg = TrainConfig { max_epochs: u.epochs, ..converged_config(cfg) };
    let draws = bootstrap(ex, u, |b, resampled| {
        let resampled = full_batch(&resampled);
        let cfg_b = TrainConfig { seed: cfg.seed.wrapping_add(1 + b as u64), ..replicate_cfg.clone() };
        let t = if profiled(cfg) {
            let mut t = converged.clone();
            super::refit::refit_position_bias(&mut t, &resampled, cfg)?;
            t
        } else {
            let (t, _) = fit(&resampled, &cfg_b, Some(&converged), false)?;
            anneal(&resampled, &cfg_b, t, positions)?.0
        };
        Ok(t.position_bias())
    })?;
    let k = positions.min(converged.position_bias().len());
    let centre: Vec<f64> = converged.position_bias().into_iter().take(k).collect();
    let early_stopped = before_refit.map_or_else(|| early.position_bias(), <[f64]>::to_vec).into_iter().take(k).collect();
    let shipped = early.position_bias().into_iter().take(k).collect();
    let alpha = (1.0 - u.level) / 2.0;
    Ok(ThetaIntervals {
        converged_after_epochs,
        settled,
        method: format!(
            "converged estimate ({}) ± t({}, {:.4})·se, se over {} Poisson(1) bootstrap replicates of the {}, each {}",
            if profiled(cfg) {
                format!("θ profiled under the refit's priors, γ per pair a random effect{}", if settled { "" } else { ", NOT settled" })
            } else {
                format!(
                    "{converged_after_epochs} epochs{}, no early stopping, no weight decay, annealed",
                    if settled { "" } else { ", NOT settled: raise converged_epochs" }
                )
            },
            u.replicates - 1,
            1.0 - alpha,
            u.replicates,
            unit_name(u.unit),
            if profiled(cfg) { "refit the same way".to_string() } else { format!("warm-started, trained {} epochs and annealed", u.epochs) }
        ),
        ..ThetaIntervals::around(centre, &draws, u, early_stopped, shipped)
    })
}

/// θ of `u.replicates` bootstrap replicates of `ex`, drawn by `u.unit` from `u.seed` (replicate b
/// draws the same multiplicities whatever the count), `estimate(b, resampled)` giving replicate b's.
fn bootstrap(ex: &Examples, u: &UncertaintyConfig, mut estimate: impl FnMut(usize, Examples) -> anyhow::Result<Vec<f64>>) -> anyhow::Result<Vec<Vec<f64>>> {
    let mut rng = ChaCha8Rng::seed_from_u64(u.seed);
    (0..u.replicates)
        .map(|b| {
            let resampled = match u.unit {
                ResampleUnit::Query => query_resample(ex, &mut rng),
                ResampleUnit::Impression => poisson_resample(ex, &mut rng),
            };
            estimate(b, resampled)
        })
        .collect()
}

/// What a replicate resamples, as the method line names it.
fn unit_name(unit: ResampleUnit) -> &'static str {
    match unit {
        ResampleUnit::Query => "queries",
        ResampleUnit::Impression => "impressions",
    }
}

/// The interval of the θ a feature tower ships under `[train] position_bias = "swap_pairs"` (the
/// default): the swap-pair estimate of `refit.rs` (the pairwise conditional likelihood),
/// bootstrapped by re-estimating it on every replicate (the shipped tower held: only the common
/// level reads it). The gradient fit's converged θ is another estimator (θ trained with the tower),
/// so its interval would not be the shipped θ's; and each replicate here is one Bradley–Terry fit,
/// no training. None where the shipped θ is not the swap pairs' (another source, or positions the swap
/// pairs cannot estimate, where training fell back to the joint fit).
fn swap_pair_intervals(ex: &Examples, cfg: &TrainConfig, u: &UncertaintyConfig, shipped: &Trained, positions: usize) -> anyhow::Result<Option<ThetaIntervals>> {
    use super::config::PositionBiasSource;
    use super::refit::{refit_position_bias, RefitMethod, MAX_ROUNDS};
    if !(cfg.position_bias == PositionBiasSource::SwapPairs && cfg.refit_position_bias && cfg.tower.reads_features()) {
        return Ok(None);
    }
    // The full data's estimate again, from the shipped model (its θ_k − θ_1 is this estimate
    // already: the pairwise conditional likelihood does not read where θ starts).
    let mut centre = shipped.clone();
    let Some(report) = refit_position_bias(&mut centre, ex, cfg)?.filter(|r| r.method == RefitMethod::SwapPairs) else { return Ok(None) };
    let draws = bootstrap(ex, u, |_, resampled| {
        // A replicate that leaves a position without a clicked and a skipped swap couple falls
        // back as training would (`refit.rs`); its θ is then the tower-offset refit's.
        let mut t = shipped.clone();
        refit_position_bias(&mut t, &resampled, cfg)?;
        Ok(t.position_bias())
    })?;
    let k = positions.min(centre.position_bias().len());
    let theta: Vec<f64> = centre.position_bias().into_iter().take(k).collect();
    let alpha = (1.0 - u.level) / 2.0;
    let settled = report.iterations < MAX_ROUNDS;
    Ok(Some(ThetaIntervals {
        converged_after_epochs: 0,
        settled,
        method: format!(
            "swap-pair estimate (θ by the pairwise conditional likelihood, each (query, document)'s relevance cancelling{}) ± t({}, {:.4})·se, se over {} Poisson(1) bootstrap replicates of the {}, each re-estimated the same way",
            if settled { "" } else { ", NOT settled" },
            u.replicates - 1,
            1.0 - alpha,
            u.replicates,
            unit_name(u.unit),
        ),
        ..ThetaIntervals::around(theta.clone(), &draws, u, theta.clone(), shipped.position_bias().into_iter().take(k).collect())
    }))
}

impl ThetaIntervals {
    /// The intervals around `centre` from the replicates' θ (`draws`, one vector per replicate):
    /// centre ± t(B − 1)·se and the percentile interval; the estimator's own fields (epochs, method)
    /// are the caller's.
    fn around(centre: Vec<f64>, draws: &[Vec<f64>], u: &UncertaintyConfig, early_stopped: Vec<f64>, shipped: Vec<f64>) -> ThetaIntervals {
        let k = centre.len();
        let alpha = (1.0 - u.level) / 2.0;
        let t = student_t_quantile(1.0 - alpha, (u.replicates - 1) as f64);
        let (mut percentile_lower, mut percentile_upper, mut standard_error) = (Vec::with_capacity(k), Vec::with_capacity(k), Vec::with_capacity(k));
        for j in 0..k {
            let mut v: Vec<f64> = draws.iter().map(|d| d[j]).collect();
            v.sort_by(f64::total_cmp);
            percentile_lower.push(quantile(&v, alpha));
            percentile_upper.push(quantile(&v, 1.0 - alpha));
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            standard_error.push((v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1).max(1) as f64).sqrt());
        }
        ThetaIntervals {
            early_stopped,
            shipped,
            lower: centre.iter().zip(&standard_error).map(|(c, s)| c - t * s).collect(),
            upper: centre.iter().zip(&standard_error).map(|(c, s)| c + t * s).collect(),
            converged: centre,
            converged_after_epochs: 0,
            settled: true,
            percentile_lower,
            percentile_upper,
            standard_error,
            level: u.level,
            replicates: u.replicates,
            method: String::new(),
        }
    }

    /// An SVG of θ_k − θ_1 with intervals: the converged estimate (dots) and its interval (bars), the shipped
    /// estimate (crosses), the early-stopped one before the θ refit (grey rings, where it differs), and
    /// the truth where a simulation knows it (a line).
    pub fn svg(&self, title: &str, truth: Option<&[f64]>) -> String {
        use std::fmt::Write as _;
        let t = self;
        let escape = |t: &str| t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let (w, h, pad) = (560.0, 320.0, 44.0);
        let k = t.converged.len().max(2);
        let truth: Vec<f64> = truth.map(|v| v.iter().take(k).copied().collect()).unwrap_or_default();
        let all = t.lower.iter().chain(&t.upper).chain(&t.early_stopped).chain(&t.shipped).chain(&t.converged).chain(&truth).copied().filter(|v| v.is_finite());
        let (lo, hi) = all.fold((0f64, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let (lo, hi) = (lo - 0.1, hi + 0.1);
        let x = |j: usize| pad + (j as f64 + 0.5) * (w - pad - 12.0) / k as f64;
        let y = |v: f64| 30.0 + (hi - v) / (hi - lo) * (h - 30.0 - pad);
        let mut s = String::new();
        let _ = write!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#);
        let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = write!(
            s,
            r##"<text x="8" y="16" font-size="13">{}: θ_k − θ_1, converged (dot) with {:.0}% interval, shipped (×), early-stopped before the refit (○){}</text>"##,
            escape(title),
            100.0 * t.level,
            if truth.is_empty() { "" } else { ", truth (line)" }
        );
        let _ = write!(s, r##"<rect x="{pad}" y="30" width="{}" height="{}" fill="none" stroke="#bbb"/>"##, w - pad - 12.0, h - 30.0 - pad);
        let mut tick = hi.floor();
        while tick >= lo {
            let _ = write!(s, r##"<text x="{}" y="{:.1}" text-anchor="end" fill="#666">{tick}</text>"##, pad - 4.0, y(tick) + 4.0);
            let _ = write!(s, r##"<line x1="{pad}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#eee"/>"##, w - 12.0, y(tick), y(tick));
            tick -= 0.5;
        }
        for j in 0..t.converged.len() {
            let _ = write!(s, r##"<text x="{:.1}" y="{}" text-anchor="middle" fill="#666">{}</text>"##, x(j), h - pad + 14.0, j + 1);
            let _ = write!(
                s,
                r##"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#1f77b4" stroke-width="2"/>"##,
                x(j),
                x(j),
                y(t.lower[j]),
                y(t.upper[j])
            );
            let _ = write!(s, r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#1f77b4"/>"##, x(j), y(t.converged[j]));
            let _ = write!(s, r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="none" stroke="#999"/>"##, x(j) - 7.0, y(t.early_stopped[j]));
            let (cx, cy) = (x(j) + 7.0, y(t.shipped.get(j).copied().unwrap_or(t.early_stopped[j])));
            let _ = write!(s, r##"<path d="M{:.1},{:.1}l6,6m0,-6l-6,6" stroke="#d62728" stroke-width="1.5"/>"##, cx - 3.0, cy - 3.0);
        }
        if !truth.is_empty() {
            let line = truth.iter().enumerate().map(|(j, v)| format!("{:.1},{:.1}", x(j), y(*v))).collect::<Vec<_>>().join(" ");
            let _ = write!(s, r##"<polyline points="{line}" fill="none" stroke="#000" stroke-width="1" stroke-dasharray="4,3"/>"##);
        }
        let _ = write!(s, r##"<text x="{}" y="{}" text-anchor="middle" fill="#666">position k</text>"##, pad + (w - pad) / 2.0, h - 8.0);
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use crate::data::{Row, SessionSpan};

    /// Poisson(1) multiplicities keep every row's expected impressions and clicks.
    pub fn poisson_resampling_is_unbiased_per_row() {
        let mut ex = Examples { n_features: 1, docs: vec![0.0], ..Examples::default() };
        for (i, (n, c)) in [(1000u32, 100u32), (50, 0), (7, 7)].into_iter().enumerate() {
            ex.rows.push(Row { doc: 0, qd: 0, position: i as u32 + 1, impressions: n, clicks: c, propensity: 1.0 });
            ex.sessions.push(SessionSpan { start: i, len: 1, hash: i as u64, split: None });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut sums = [(0f64, 0f64); 3];
        let draws = 2000;
        for _ in 0..draws {
            let r = poisson_resample(&ex, &mut rng);
            for row in &r.rows {
                assert!(row.clicks <= row.impressions);
                let s = &mut sums[row.position as usize - 1];
                s.0 += row.impressions as f64;
                s.1 += row.clicks as f64;
            }
            assert_eq!(r.rows.len(), r.sessions.len());
        }
        for (i, (n, c)) in [(1000.0, 100.0), (50.0, 0.0), (7.0, 7.0)].into_iter().enumerate() {
            let (mn, mc) = (sums[i].0 / draws as f64, sums[i].1 / draws as f64);
            assert!((mn - n).abs() < 4.0 * (n / draws as f64).sqrt() + 1e-9, "row {i}: mean impressions {mn} vs {n}");
            assert!((mc - c).abs() < 4.0 * (c / draws as f64).sqrt() + 1e-9, "row {i}: mean clicks {mc} vs {c}");
        }
    }

    /// Student's t against tabulated values.
    pub fn t_quantiles_match_tables() {
        assert!((student_t_quantile(0.975, 19.0) - 2.093024).abs() < 1e-5);
        assert!((student_t_quantile(0.975, 49.0) - 2.009575).abs() < 1e-5);
        assert!((student_t_quantile(0.95, 9.0) - 1.833113).abs() < 1e-5);
        assert!((student_t_quantile(0.975, 1000.0) - 1.962339).abs() < 1e-5);
    }

    pub fn quantiles_interpolate() {
        let v = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 0.125), 0.5);
        assert_eq!(quantile(&v, 1.0), 4.0);
    }
}
