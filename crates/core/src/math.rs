//! Numeric helpers the layers above share.

/// The logistic function σ(x) = 1 / (1 + e^(−x)).
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Gauss–Jordan inverse with partial pivoting; None when singular.
pub fn invert(a: &mut [f64], m: usize) -> Option<Vec<f64>> {
    let mut inv = vec![0.0; m * m];
    for i in 0..m {
        inv[i * m + i] = 1.0;
    }
    let scale = (0..m).map(|i| a[i * m + i].abs()).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
    for col in 0..m {
        let pivot = (col..m).max_by(|&x, &y| a[x * m + col].abs().total_cmp(&a[y * m + col].abs()))?;
        if a[pivot * m + col].abs() <= 1e-13 * scale {
            return None;
        }
        for j in 0..m {
            a.swap(col * m + j, pivot * m + j);
            inv.swap(col * m + j, pivot * m + j);
        }
        let d = a[col * m + col];
        for j in 0..m {
            a[col * m + j] /= d;
            inv[col * m + j] /= d;
        }
        for r in 0..m {
            if r != col {
                let f = a[r * m + col];
                if f != 0.0 {
                    for j in 0..m {
                        a[r * m + j] -= f * a[col * m + j];
                        inv[r * m + j] -= f * inv[col * m + j];
                    }
                }
            }
        }
    }
    Some(inv)
}
