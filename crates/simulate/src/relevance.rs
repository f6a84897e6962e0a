//! Ground-truth relevance (Hager §7): expert labels, or synthetic linear / 2-layer tanh MLP labels
//! with Gaussian noise, rescaled so the 5th–95th percentile maps to [0, 4].

use ndarray::{Array1, Array2, Axis};
use rand::Rng;
use rand_distr::{Distribution, Normal, StandardNormal};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RelevanceKind {
    /// The dataset's expert labels, scaled to [0, 4].
    Labels,
    /// w·x + ξ.
    Linear,
    /// W2·tanh(W1·x) + ξ with 16 hidden units (zero biases).
    Mlp,
}

/// Column-standardised copy of `x` (zero mean, unit variance; constant columns stay 0), so random
/// weights give pre-activations of order one whatever the dataset's feature scale.
pub fn standardize(x: &Array2<f32>) -> Array2<f32> {
    let mean = x.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(x.ncols()));
    let std = x.std_axis(Axis(0), 0.0).mapv(|s| if s > 1e-8 { s } else { 1.0 });
    (x - &mean) / &std
}

/// Synthetic relevance for every row of `x` (rows are documents), before rescaling.
pub fn synthetic_raw(kind: RelevanceKind, x: &Array2<f32>, noise_sigma: f64, rng: &mut impl Rng) -> Vec<f64> {
    let z = standardize(x);
    let d = z.ncols();
    let normal = |rng: &mut dyn rand::RngCore, scale: f64| -> f32 { (rng.sample::<f64, _>(StandardNormal) * scale) as f32 };
    let clean: Array1<f32> = match kind {
        RelevanceKind::Labels => unreachable!("labels are not synthetic"),
        RelevanceKind::Linear => {
            let w = Array1::from_shape_fn(d, |_| normal(rng, 1.0 / (d as f64).sqrt()));
            z.dot(&w)
        }
        RelevanceKind::Mlp => {
            let hidden = 16;
            let w1 = Array2::from_shape_fn((d, hidden), |_| normal(rng, 1.0 / (d as f64).sqrt()));
            let b1 = Array1::<f32>::zeros(hidden); // Flax's default bias initialisation, as in Hager's code
            let w2 = Array1::from_shape_fn(hidden, |_| normal(rng, 1.0 / (hidden as f64).sqrt()));
            let h = (z.dot(&w1) + &b1).mapv(f32::tanh);
            h.dot(&w2)
        }
    };
    let noise = Normal::new(0.0, noise_sigma).expect("noise sigma is finite and >= 0");
    clean.iter().map(|&c| c as f64 + noise.sample(rng)).collect()
}

/// Linear map sending the 5th and 95th percentiles to 0 and 4 (Hager §7). The tails are not
/// clipped: a clip would make "linear" relevance non-linear and misspecify the linear tower.
pub fn rescale_to_0_4(values: &[f64]) -> Vec<f64> {
    if values.is_empty() {
        return Vec::new();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| sorted[((p * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)];
    let (lo, hi) = (pct(0.05), pct(0.95));
    let span = if hi - lo > 1e-12 { hi - lo } else { 1.0 };
    values.iter().map(|v| 4.0 * (v - lo) / span).collect()
}
