//! Drift statistics of the residual distribution: the population stability index (PSI) of the
//! current window's residual histogram against a reference window's, and a Page-Hinkley test on the
//! per-window mean absolute residual. PSI < 0.1 is stable, > 0.2 a shift (the usual reading);
//! Page-Hinkley rises when the mean absolute residual drifts upward by more than `delta` per window.

use serde::{Deserialize, Serialize};

use super::residuals::BINS;

/// PSI = Σ (c − r) · ln(c / r) over bins, with empty bins smoothed to 1e-4.
pub fn psi(reference: &[f64; BINS], current: &[f64; BINS]) -> f64 {
    reference
        .iter()
        .zip(current)
        .map(|(r, c)| {
            let (r, c) = (r.max(1e-4), c.max(1e-4));
            (c - r) * (c / r).ln()
        })
        .sum()
}

/// Page-Hinkley for an upward shift of a per-window statistic.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PageHinkley {
    pub n: u64,
    pub mean: f64,
    pub cumulative: f64,
    pub minimum: f64,
    /// Tolerated drift per observation.
    pub delta: f64,
}

impl PageHinkley {
    pub fn new(delta: f64) -> Self {
        PageHinkley { delta, ..Default::default() }
    }

    /// Adds an observation and returns the statistic m_t − min m.
    pub fn update(&mut self, x: f64) -> f64 {
        self.n += 1;
        self.mean += (x - self.mean) / self.n as f64;
        self.cumulative += x - self.mean - self.delta;
        self.minimum = self.minimum.min(self.cumulative);
        self.cumulative - self.minimum
    }

    pub fn reset(&mut self) {
        *self = PageHinkley::new(self.delta);
    }
}
