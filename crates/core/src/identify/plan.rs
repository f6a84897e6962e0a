//! The randomization planner: how many sessions, under a swap design run on a share of traffic,
//! until the 95% interval of θ_k − θ_1 is within ±ε — predicted from the profile information the
//! design's swaps are expected to add to the per-document position-based model of `precision.rs`.
//!
//! The derivation is in `docs/identifiability.md` ("Planning the randomization"). In short: after N
//! more sessions, of which a share f is randomized, a (query, document) shown n_j times at position
//! j is expected to have n_j + (N/S)·((1 − f)·n_j + f·Σ_i n_i·M_ij) impressions there (S: the
//! horizon's sessions, M: the design's move probabilities), each with weight v_j = p_j(1 − p_j) at
//! p_j = σ(γ̂ + θ̂_j). The profile information is the swap graph's Laplacian with those weights
//! (w_a·w_b / W per pair); the variance of θ_k − θ_1 is the (k, k) entry of its inverse with
//! position 1 removed, scaled by the clicks' dispersion: the effective resistance between 1 and k.
//! For one adjacent chain it is the sum of the links' inverse informations, and for one link the
//! delta-method variance of the difference of two logits, 1/(n_a·v_a) + 1/(n_b·v_b).

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::precision::{self, Cells, ThetaPrecision, Z95};
use crate::math::{invert, sigmoid};

/// Which positions trade places in a randomized session (positions 1..=K of the page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Design {
    /// FairPairs-style adjacent swaps: an offset o ∈ {0, 1}, drawn uniformly, pairs positions
    /// (1 + o, 2 + o), (3 + o, 4 + o), … within 1..=K, and each pair swaps with probability ½. An
    /// item moves one position up or down, each with probability ¼.
    AdjacentSwaps,
    /// RandPair: position 1 swaps with one position k drawn uniformly from 2..=K.
    RandPair,
}

impl std::str::FromStr for Design {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "adjacent_swaps" | "adjacent-swaps" | "adjacent" => Ok(Design::AdjacentSwaps),
            "rand_pair" | "rand-pair" | "randpair" => Ok(Design::RandPair),
            other => Err(format!("unknown randomization design `{other}`: adjacent_swaps or rand_pair")),
        }
    }
}

impl std::fmt::Display for Design {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Design::AdjacentSwaps => "adjacent_swaps",
            Design::RandPair => "rand_pair",
        })
    }
}

impl Design {
    /// The probability that the item at position index `from` (0-based) is shown at index `to ≠ from`
    /// in a randomized session that randomizes the first `k` positions.
    pub fn move_probability(self, from: usize, to: usize, k: usize) -> f64 {
        if from == to || from >= k || to >= k || k < 2 {
            return 0.0;
        }
        match self {
            Design::AdjacentSwaps if from.abs_diff(to) == 1 => 0.25,
            Design::AdjacentSwaps => 0.0,
            Design::RandPair if from == 0 || to == 0 => 1.0 / (k - 1) as f64,
            Design::RandPair => 0.0,
        }
    }

    /// The position pairs (a < b, 1-based) the design swaps when it randomizes the first `k`.
    pub fn edges(self, k: usize) -> Vec<(u32, u32)> {
        match self {
            Design::AdjacentSwaps => (1..k as u32).map(|a| (a, a + 1)).collect(),
            Design::RandPair => (2..=k as u32).map(|b| (1, b)).collect(),
        }
    }

    /// Randomizes a displayed ranking in place, over its first `k` items (fewer when the page is
    /// shorter), drawing from `rng`: what a randomized session shows.
    pub fn apply<T>(self, shown: &mut [T], k: usize, rng: &mut impl Rng) {
        let k = k.min(shown.len());
        if k < 2 {
            return;
        }
        match self {
            Design::AdjacentSwaps => {
                let mut a = rng.random_range(0..2usize);
                while a + 1 < k {
                    if rng.random_bool(0.5) {
                        shown.swap(a, a + 1);
                    }
                    a += 2;
                }
            }
            Design::RandPair => {
                let b = rng.random_range(1..k);
                shown.swap(0, b);
            }
        }
    }
}

/// What the team asks: a design, the share of traffic it randomizes, and the precision it wants.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanRequest {
    pub design: Design,
    /// Share of sessions randomized, in (0, 1].
    pub fraction: f64,
    /// Positions 1..=K the design randomizes and the plan covers.
    pub positions: usize,
    /// Target half-width of the 95% interval of θ_k − θ_1, per position 1..=K (index 0, position 1,
    /// is unused).
    pub epsilon: Vec<f64>,
}

impl PlanRequest {
    /// One target half-width for every position.
    pub fn uniform(design: Design, fraction: f64, positions: usize, epsilon: f64) -> Self {
        PlanRequest { design, fraction, positions, epsilon: vec![epsilon; positions] }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err(format!("fraction = {} must lie in (0, 1]", self.fraction));
        }
        if self.positions < 2 {
            return Err(format!("positions = {} must be at least 2", self.positions));
        }
        if self.epsilon.len() != self.positions {
            return Err(format!("{} target half-widths for {} positions", self.epsilon.len(), self.positions));
        }
        if let Some(e) = self.epsilon.iter().skip(1).find(|e| !(**e > 0.0 && e.is_finite())) {
            return Err(format!("a target half-width ε = {e} must be a positive number"));
        }
        Ok(())
    }
}

/// The plan for one position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PositionPlan {
    pub position: u32,
    pub epsilon: f64,
    /// Half-width of θ_k − θ_1's 95% interval now (infinite where no informative swap path reaches
    /// position 1).
    pub half_width_now: f64,
    /// Sessions (all traffic, a share `fraction` of them randomized) until the half-width is
    /// expected to be within ε: 0 when it already is; `None` when the design never gets it there.
    pub sessions_needed: Option<f64>,
    /// Of those, the randomized sessions.
    pub randomized_sessions: Option<f64>,
    /// Impressions the design is expected to show away from their logged position in those sessions.
    pub swapped_impressions: Option<f64>,
    /// `sessions_needed` at the stream's session rate over the horizon (`None` without a rate).
    pub eta_seconds: Option<f64>,
}

/// Why a swap is on the list.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SwapReason {
    /// It joins a position to position 1's component: without it (or another path) θ there is not
    /// identified at all.
    Connects,
    /// It shrinks the variances still above target: Σ_k (G·u)_k² / ε_k² over those positions, the
    /// first-order decrease per unit of information on the link (G: the inverse profile information,
    /// u = e_a − e_b).
    Precision { score: f64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Swap {
    pub a: u32,
    pub b: u32,
    #[serde(flatten)]
    pub reason: SwapReason,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub request: PlanRequest,
    /// Sessions in the horizon the plan starts from, and the stream's session rate over it.
    pub sessions_in_horizon: f64,
    pub sessions_per_second: Option<f64>,
    /// The clicks' dispersion the variances are scaled by (precision.rs), at least 1.
    pub dispersion: f64,
    /// Positions 2..=K.
    pub positions: Vec<PositionPlan>,
    /// The design's swaps to run first: the connecting ones, then by precision.
    pub swaps: Vec<Swap>,
}

impl Plan {
    /// The most sessions any position needs (`None` when some position is out of the design's reach).
    pub fn sessions_needed(&self) -> Option<f64> {
        self.positions.iter().try_fold(0.0f64, |m, p| p.sessions_needed.map(|n| m.max(n)))
    }

    /// A few lines for a person.
    pub fn render(&self) -> String {
        let r = &self.request;
        let mut s = format!(
            "randomization plan: {} over positions 1..={}, {:.1}% of sessions randomized, from {:.0} sessions in the horizon{}\n",
            r.design,
            r.positions,
            100.0 * r.fraction,
            self.sessions_in_horizon,
            self.sessions_per_second
                .map(|x| if x >= 1.0 { format!(" ({x:.1} sessions/s)") } else { format!(" ({:.1} sessions/day)", x * 86400.0) })
                .unwrap_or_default()
        );
        for p in &self.positions {
            let now = if p.half_width_now.is_finite() { format!("±{:.3}", p.half_width_now) } else { "not determined".into() };
            let need = match (p.sessions_needed, p.randomized_sessions, p.swapped_impressions) {
                (Some(0.0), _, _) => "already within target".to_string(),
                (Some(n), Some(r), Some(i)) => format!(
                    "{n:.0} sessions ({r:.0} randomized, {i:.0} swapped impressions){}",
                    p.eta_seconds.map(|t| format!(", {}", duration(t))).unwrap_or_default()
                ),
                _ => "out of this design's reach".to_string(),
            };
            s.push_str(&format!("  θ{} − θ1: {now} now, target ±{:.3}: {need}\n", p.position, p.epsilon));
        }
        if !self.swaps.is_empty() {
            let list: Vec<String> = self
                .swaps
                .iter()
                .map(|w| match w.reason {
                    SwapReason::Connects => format!("{}↔{} (connects)", w.a, w.b),
                    SwapReason::Precision { .. } => format!("{}↔{}", w.a, w.b),
                })
                .collect();
            s.push_str(&format!("  swaps first: {}\n", list.join(", ")));
        }
        s
    }
}

fn duration(seconds: f64) -> String {
    match seconds {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 2.0 * 3600.0 => format!("{:.0} min", s / 60.0),
        s if s < 2.0 * 86400.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} days", s / 86400.0),
    }
}

/// Plans from a horizon's cumulative tables: their cells, the windows' sessions and the event time
/// the windows span. The request's positions are cut to the deepest position the log shows: the
/// design cannot move items to positions no page has.
pub fn plan_cumulative(c: &crate::state::cumulative::Cumulative, request: &PlanRequest) -> Result<Plan, String> {
    let pairs = precision::cells_of(&c.propensity, request.positions as u32);
    let deepest = pairs.iter().flatten().map(|x| x.0 + 1).max().unwrap_or(0);
    let mut request = request.clone();
    if deepest < request.positions {
        request.positions = deepest.max(2);
        request.epsilon.truncate(request.positions);
    }
    let sessions: f64 = c.windows.iter().map(|w| w.sessions as f64).sum();
    let span = match (c.windows.iter().map(|w| w.start_ms).min(), c.windows.iter().map(|w| w.end_ms).max()) {
        (Some(start), Some(end)) if end > start => (end - start) as f64 / 1000.0,
        _ => 0.0,
    };
    plan(&pairs, sessions, span, &request)
}

/// One (query, document)'s expected weights after N more sessions: w_j = a_j + (N/S)·b_j.
struct Projected {
    terms: Vec<(usize, f64, f64)>,
}

/// Plans the randomization from the horizon's cells (`precision::cells_of`), its `sessions` and the
/// seconds of event time they span (0: no rate known).
pub fn plan(pairs: &[Cells], sessions: f64, seconds: f64, request: &PlanRequest) -> Result<Plan, String> {
    request.validate()?;
    if !(sessions > 0.0) {
        return Err("the horizon holds no sessions to plan from".into());
    }
    let k = request.positions;
    // Only positions 1..=K take part.
    let kept: Vec<Cells> = pairs.iter().map(|c| c.iter().copied().filter(|x| x.0 < k).collect::<Cells>()).filter(|c| !c.is_empty()).collect();
    let pairs = kept.as_slice();
    let now = precision::theta_precision(pairs, k);
    let theta = planning_theta(pairs, &now, k);
    let projected = project(pairs, &theta, request);
    let information = |n: f64| information_at(&projected, k, n / sessions);
    let variances = |n: f64| reduced_variances(&information(n), k, now.dispersion);

    // Per position the smallest N with Z95·√var ≤ ε: doubling from a hundredth of the horizon, then
    // bisection to 0.5%. The variance falls monotonically in N (information only grows).
    let start = (sessions / 100.0).max(1.0);
    let cap = sessions * 1e6;
    let met = |var: &[f64], j: usize| Z95 * var[j].sqrt() <= request.epsilon[j];
    let mut needed: Vec<Option<f64>> = vec![None; k];
    let mut bracket: Vec<Option<(f64, f64)>> = vec![None; k];
    let mut open: Vec<usize> = (1..k).filter(|&j| !(Z95 * now.standard_error[j] <= request.epsilon[j])).collect();
    for (j, n) in needed.iter_mut().enumerate().skip(1) {
        if !open.contains(&j) {
            *n = Some(0.0);
        }
    }
    let (mut low, mut n) = (0.0, start);
    while !open.is_empty() && n <= cap {
        let var = variances(n);
        open.retain(|&j| {
            if met(&var, j) {
                bracket[j] = Some((low, n));
                false
            } else {
                true
            }
        });
        low = n;
        n *= 2.0;
    }
    for j in 1..k {
        if let Some((mut lo, mut hi)) = bracket[j] {
            while hi - lo > 0.005 * hi {
                let mid = 0.5 * (lo + hi);
                if met(&variances(mid), j) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            needed[j] = Some(hi.ceil());
        }
    }

    let moved_per_session: f64 = projected_moves(pairs, request) / sessions;
    let rate = (seconds > 0.0).then(|| sessions / seconds);
    let positions = (1..k)
        .map(|j| {
            let n = needed[j];
            PositionPlan {
                position: j as u32 + 1,
                epsilon: request.epsilon[j],
                half_width_now: Z95 * now.standard_error[j],
                sessions_needed: n,
                randomized_sessions: n.map(|n| n * request.fraction),
                swapped_impressions: n.map(|n| n * moved_per_session),
                eta_seconds: n.and_then(|n| rate.map(|r| n / r)),
            }
        })
        .collect::<Vec<_>>();
    let unmet: Vec<usize> = (1..k).filter(|&j| needed[j] != Some(0.0)).collect();
    let swaps = order_swaps(&now, request, &unmet, &information(start), now.dispersion);
    Ok(Plan { request: request.clone(), sessions_in_horizon: sessions, sessions_per_second: rate, dispersion: now.dispersion, positions, swaps })
}

/// θ̂_j − θ̂_1 where swaps determine it (the fit's); elsewhere a guess from the pooled click rates,
/// logit(CTR_j) − logit(CTR_1), which also carries the logging policy's relevance ordering: it only
/// sets the click rates the plan expects at positions no swap has measured yet.
fn planning_theta(pairs: &[Cells], now: &ThetaPrecision, k: usize) -> Vec<f64> {
    let ctr = pooled_ctr(pairs, k);
    let logit = |p: f64| (p / (1.0 - p)).ln();
    (0..k).map(|j| if now.standard_error[j].is_finite() { now.theta[j] } else { logit(ctr[j]) - logit(ctr[0]) }).collect()
}

/// Clicks over impressions per position, over every pair, kept inside [0.001, 0.999].
fn pooled_ctr(pairs: &[Cells], k: usize) -> Vec<f64> {
    let mut sums = vec![(0.0, 0.0); k];
    for &(j, c, n) in pairs.iter().flatten() {
        sums[j].0 += c;
        sums[j].1 += n;
    }
    let overall = sums.iter().map(|s| s.0).sum::<f64>() / sums.iter().map(|s| s.1).sum::<f64>().max(1.0);
    sums.iter().map(|&(c, n)| (if n > 0.0 { c / n } else { overall }).clamp(0.001, 0.999)).collect()
}

/// γ̂ of one (query, document) at the planning θ: the maximum-likelihood γ with one pseudo-impression
/// at its most-shown position clicked at that position's pooled rate, so that a document without
/// clicks (or with only clicks) keeps a finite γ̂ and expected information.
fn gamma_of(cells: &Cells, theta: &[f64], ctr: &[f64]) -> f64 {
    let Some(&(m, _, _)) = cells.iter().max_by(|a, b| a.2.total_cmp(&b.2)) else { return 0.0 };
    let (c, n) = cells.iter().fold((ctr[m], 1.0), |(c, n), &(_, ci, ni)| (c + ci, n + ni));
    let mut g = ((c / n) / (1.0 - c / n)).ln() - theta[m];
    for _ in 0..50 {
        let (mut r, mut w) = (ctr[m] - sigmoid(g + theta[m]), sigmoid(g + theta[m]) * (1.0 - sigmoid(g + theta[m])));
        for &(j, cj, nj) in cells {
            let p = sigmoid(g + theta[j]);
            r += cj - nj * p;
            w += nj * p * (1.0 - p);
        }
        let step = (r / w.max(1e-12)).clamp(-2.0, 2.0);
        g += step;
        if step.abs() < 1e-10 {
            break;
        }
    }
    g
}

/// Per pair: w_j(s) = n_j·v_j + s·flow_j·v_j, flow_j = (1 − f)·n_j + f·Σ_i n_i·M_ij, for the
/// positions where either is positive; pairs that can never be at two positions are left out.
fn project(pairs: &[Cells], theta: &[f64], request: &PlanRequest) -> Vec<Projected> {
    let k = request.positions;
    let ctr = pooled_ctr(pairs, k);
    let f = request.fraction;
    pairs
        .iter()
        .filter_map(|cells| {
            let gamma = gamma_of(cells, theta, &ctr);
            let mut n = vec![0.0; k];
            for &(j, _, nj) in cells {
                n[j] += nj;
            }
            let terms: Vec<(usize, f64, f64)> = (0..k)
                .filter_map(|j| {
                    let moved_in: f64 = (0..k).map(|i| n[i] * request.design.move_probability(i, j, k)).sum();
                    let moved_out: f64 = n[j] * (0..k).map(|t| request.design.move_probability(j, t, k)).sum::<f64>();
                    let flow = n[j] + f * (moved_in - moved_out);
                    let p = sigmoid(gamma + theta[j]);
                    let v = p * (1.0 - p);
                    (n[j] > 0.0 || flow > 0.0).then_some((j, n[j] * v, flow * v))
                })
                .collect();
            (terms.len() >= 2).then_some(Projected { terms })
        })
        .collect()
}

/// Expected impressions shown away from their logged position per horizon's worth of sessions.
fn projected_moves(pairs: &[Cells], request: &PlanRequest) -> f64 {
    let k = request.positions;
    pairs.iter().flatten().map(|&(i, _, n)| n * request.fraction * (0..k).map(|t| request.design.move_probability(i, t, k)).sum::<f64>()).sum()
}

/// The profile information (k × k) after s horizons' worth of sessions.
fn information_at(projected: &[Projected], k: usize, s: f64) -> Vec<f64> {
    let mut information = vec![0.0; k * k];
    for p in projected {
        let total: f64 = p.terms.iter().map(|t| t.1 + s * t.2).sum();
        if total <= 0.0 {
            continue;
        }
        for &(a, a0, a1) in &p.terms {
            let wa = a0 + s * a1;
            information[a * k + a] += wa;
            for &(b, b0, b1) in &p.terms {
                information[a * k + b] -= wa * (b0 + s * b1) / total;
            }
        }
    }
    information
}

/// Positions linked to position 1 through links carrying information.
fn linked(information: &[f64], k: usize) -> Vec<bool> {
    let scale = (0..k).map(|j| information[j * k + j]).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
    let mut linked = vec![false; k];
    linked[0] = true;
    let mut grew = true;
    while grew {
        grew = false;
        for a in 0..k {
            for b in 0..k {
                if linked[a] && !linked[b] && -information[a * k + b] > 1e-9 * scale {
                    linked[b] = true;
                    grew = true;
                }
            }
        }
    }
    linked
}

/// The inverse of the information over the positions linked to 1 (position 1 removed), as a k × k
/// matrix with zeros elsewhere, and which positions are linked.
fn reduced_inverse(information: &[f64], k: usize) -> (Vec<f64>, Vec<bool>) {
    let linked = linked(information, k);
    let free: Vec<usize> = (1..k).filter(|&j| linked[j]).collect();
    let m = free.len();
    let mut sub: Vec<f64> = free.iter().flat_map(|&r| free.iter().map(move |&c| information[r * k + c])).collect();
    let mut g = vec![0.0; k * k];
    match invert(&mut sub, m) {
        Some(inverse) => {
            for (x, &r) in free.iter().enumerate() {
                for (y, &c) in free.iter().enumerate() {
                    g[r * k + c] = inverse[x * m + y];
                }
            }
            (g, linked)
        }
        None => (g, (0..k).map(|j| j == 0).collect()),
    }
}

/// Var(θ_j − θ_1) for every j (0 at j = 0, infinite where unlinked), scaled by the dispersion.
fn reduced_variances(information: &[f64], k: usize, dispersion: f64) -> Vec<f64> {
    let (g, linked) = reduced_inverse(information, k);
    (0..k)
        .map(|j| {
            if j == 0 {
                0.0
            } else if linked[j] {
                g[j * k + j].max(0.0) * dispersion
            } else {
                f64::INFINITY
            }
        })
        .collect()
}

/// The design's swaps in the order to run them: first those that join a position to position 1's
/// component (a union-find over the current informative links, the design's edges in their order),
/// then the rest by their precision score at the information after the plan's first step, dropping
/// swaps that help no position still above target.
fn order_swaps(now: &ThetaPrecision, request: &PlanRequest, unmet: &[usize], information: &[f64], dispersion: f64) -> Vec<Swap> {
    let k = request.positions;
    let mut component: Vec<usize> = (0..k).collect();
    fn root(c: &mut [usize], mut x: usize) -> usize {
        while c[x] != x {
            c[x] = c[c[x]];
            x = c[x];
        }
        x
    }
    for e in &now.edges {
        let (a, b) = (root(&mut component, e.a as usize - 1), root(&mut component, e.b as usize - 1));
        component[a] = b;
    }
    let mut swaps = Vec::new();
    let mut rest = Vec::new();
    for (a, b) in request.design.edges(k) {
        let (ra, rb) = (root(&mut component, a as usize - 1), root(&mut component, b as usize - 1));
        if ra != rb {
            component[ra] = rb;
            swaps.push(Swap { a, b, reason: SwapReason::Connects });
        } else {
            rest.push((a, b));
        }
    }
    let (g, linked) = reduced_inverse(information, k);
    let mut scored: Vec<Swap> = rest
        .into_iter()
        .filter_map(|(a, b)| {
            let (a0, b0) = (a as usize - 1, b as usize - 1);
            let score: f64 = unmet
                .iter()
                .filter(|&&j| linked[j])
                .map(|&j| {
                    let gu = g[j * k + a0] - g[j * k + b0];
                    dispersion * gu * gu / request.epsilon[j].powi(2)
                })
                .sum();
            (score > 0.0).then_some(Swap { a, b, reason: SwapReason::Precision { score } })
        })
        .collect();
    let score = |s: &Swap| match s.reason {
        SwapReason::Precision { score } => score,
        SwapReason::Connects => f64::INFINITY,
    };
    scored.sort_by(|x, y| score(y).total_cmp(&score(x)));
    swaps.extend(scored);
    swaps
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The move probabilities the planner assumes are the frequencies `apply` produces: over 200,000
    /// draws on a 6-position page, every (from, to) frequency within 4 binomial sd of the probability.
    pub fn move_probabilities_match_the_frequencies_of_applied_randomizations() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let (k, draws) = (6usize, 200_000usize);
        for design in [Design::AdjacentSwaps, Design::RandPair] {
            let mut counts = vec![0usize; k * k];
            for _ in 0..draws {
                let mut shown: Vec<usize> = (0..k).collect();
                design.apply(&mut shown, k, &mut rng);
                for (to, &from) in shown.iter().enumerate() {
                    counts[from * k + to] += 1;
                }
            }
            for from in 0..k {
                for to in 0..k {
                    if from == to {
                        continue;
                    }
                    let p = design.move_probability(from, to, k);
                    let freq = counts[from * k + to] as f64 / draws as f64;
                    let sd = (p * (1.0 - p) / draws as f64).sqrt().max(1.0 / draws as f64);
                    assert!((freq - p).abs() <= 4.0 * sd, "{design}: {from}→{to} frequency {freq}, probability {p}");
                }
            }
        }
    }

    /// For a chain of positions each linked to the next by documents shown at both, the planned
    /// variance of θ_K − θ_1 is the sum over the links of 1 / (Σ_pairs w_a·w_b / (w_a + w_b)), the
    /// series formula, computed here from the cells and the true θ by hand (no swaps added: s = 0).
    pub fn a_chain_variance_is_the_sum_of_its_links_inverse_informations() {
        let theta = [0.0, -0.6, -1.0, -1.3];
        let mut pairs: Vec<Cells> = Vec::new();
        for link in 0..3 {
            for d in 0..20 {
                let gamma = -1.0 + 0.05 * d as f64;
                let (na, nb) = (30.0 + d as f64, 10.0 + 2.0 * link as f64);
                let (pa, pb) = (sigmoid(gamma + theta[link]), sigmoid(gamma + theta[link + 1]));
                pairs.push(vec![(link, (na * pa).round(), na), (link + 1, (nb * pb).round(), nb)]);
            }
        }
        let request = PlanRequest::uniform(Design::AdjacentSwaps, 0.1, 4, 0.1);
        let projected = project(&pairs, &theta, &request);
        let var = reduced_variances(&information_at(&projected, 4, 0.0), 4, 1.0);
        // By hand: each pair's weights at its γ̂ (the planner's own γ̂ per pair, so only the algebra is
        // checked here), per link the sum of w_a·w_b / (w_a + w_b), then the series sum.
        let ctr = pooled_ctr(&pairs, 4);
        let mut link_information = [0.0; 3];
        for cells in &pairs {
            let g = gamma_of(cells, &theta, &ctr);
            let w: Vec<f64> = cells.iter().map(|&(j, _, n)| n * sigmoid(g + theta[j]) * (1.0 - sigmoid(g + theta[j]))).collect();
            link_information[cells[0].0] += w[0] * w[1] / (w[0] + w[1]);
        }
        let mut series = 0.0;
        for j in 1..4 {
            series += 1.0 / link_information[j - 1];
            assert!((var[j] / series - 1.0).abs() < 1e-9, "θ{}: planned variance {}, series sum {series}", j + 1, var[j]);
        }
    }

    /// One link, no logged swaps: the planned sessions are the delta-method count solved by hand.
    /// RandPair over 2 positions moves each item with probability 1, so after N sessions at share f
    /// the documents of position 1 have f·N·n₁/S impressions at position 2 and vice versa; with many
    /// impressions at the logged position the link's information tends to Σ f·(N/S)·n·v at the moved
    /// position, and N is solved from Z95² / information = ε².
    pub fn one_link_needs_the_sessions_the_delta_method_gives() {
        let theta = [0.0, -0.7];
        // 50 documents at position 1 and 50 at position 2, each shown 10,000 times over S = 10,000
        // sessions (one query per document pair), with clicks at their rates.
        let mut pairs: Vec<Cells> = Vec::new();
        for d in 0..100 {
            let j = if d < 50 { 0 } else { 1 };
            let gamma = -1.5 + 0.02 * d as f64;
            let n = 10_000.0;
            pairs.push(vec![(j, (n * sigmoid(gamma + theta[j])).round(), n)]);
        }
        // θ is not identified (no swaps): the planner guesses it from the pooled click rates, and
        // predicts click rates at the moved position with that guess and its γ̂; the check takes
        // both from the planner and tests the information's assembly and the search.
        let request = PlanRequest::uniform(Design::RandPair, 0.2, 2, 0.05);
        let plan = plan(&pairs, 10_000.0, 0.0, &request).unwrap();
        let guess = planning_theta(&pairs, &precision::theta_precision(&pairs, 2), 2);
        let ctr = pooled_ctr(&pairs, 2);
        let mut moved_information = 0.0;
        for cells in &pairs {
            let (j, _, n) = cells[0];
            let g = gamma_of(cells, &guess, &ctr);
            let p = sigmoid(g + guess[1 - j]);
            moved_information += n * p * (1.0 - p);
        }
        // Solve Z95²·(1/I) = ε² for the moved information I = f·(N/S)·Σ n·v. The planner's per-pair
        // w_a·w_b / (w_a + w_b) is smaller by the share w_b / (w_a + w_b), under 3% here.
        let n_hand = Z95 * Z95 / (0.05f64 * 0.05) / (0.2 * moved_information / 10_000.0);
        let planned = plan.positions[0].sessions_needed.unwrap();
        assert!(planned >= n_hand && planned / n_hand - 1.0 < 0.03, "planned {planned}, by hand {n_hand}");
        assert_eq!(plan.swaps, vec![Swap { a: 1, b: 2, reason: SwapReason::Connects }]);
    }

    /// A position already within its target needs 0; a position the design cannot reach (RandPair
    /// over 3 positions, the page's position 4 never swapped and never logged elsewhere) needs None.
    pub fn a_precise_position_needs_nothing_and_an_unreachable_one_is_none() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let theta = [0.0, -0.5, -0.9, -1.2];
        let mut pairs: Vec<Cells> = Vec::new();
        for d in 0..400 {
            let gamma: f64 = rng.random_range(-1.5..0.5);
            let mut cells = Vec::new();
            // Positions 1–3 swapped among themselves; position 4 holds its own documents.
            let shown: &[usize] = if d % 4 == 3 { &[3] } else { &[0, 1, 2] };
            for &j in shown {
                let n = 200.0;
                let c = (0..200).filter(|_| rng.random::<f64>() < sigmoid(gamma + theta[j])).count() as f64;
                cells.push((j, c, n));
            }
            pairs.push(cells);
        }
        let mut request = PlanRequest::uniform(Design::RandPair, 0.1, 4, 0.2);
        request.epsilon[1] = 10.0; // θ2 is far more precise than ±10 already
        let mut three = request.clone();
        three.positions = 3;
        three.epsilon.truncate(3);
        let plan4 = plan(&pairs, 80_000.0, 3600.0, &request).unwrap();
        assert_eq!(plan4.positions[0].sessions_needed, Some(0.0));
        assert!(plan4.positions[2].sessions_needed.unwrap() > 0.0, "{:?}", plan4.positions[2]);
        assert!(plan4.swaps.contains(&Swap { a: 1, b: 4, reason: SwapReason::Connects }), "{:?}", plan4.swaps);
        // With the design over 3 positions, position 4's documents never move: the 3-position plan
        // has no position 4, and a 4-position adjacent plan reaches it only through 3↔4.
        assert_eq!(plan(&pairs, 80_000.0, 3600.0, &three).unwrap().positions.len(), 2);
        let adjacent = PlanRequest { design: Design::AdjacentSwaps, ..request.clone() };
        let plan_adjacent = plan(&pairs, 80_000.0, 3600.0, &adjacent).unwrap();
        assert_eq!(plan_adjacent.swaps.iter().filter(|s| s.reason == SwapReason::Connects).map(|s| (s.a, s.b)).collect::<Vec<_>>(), vec![(3, 4)]);
        let eta = plan4.positions[2].eta_seconds.unwrap();
        assert!((eta - plan4.positions[2].sessions_needed.unwrap() / (80_000.0 / 3600.0)).abs() < 1e-6 * eta);
    }

    /// Bad requests are refused with the field named.
    pub fn bad_requests_name_the_field() {
        let pairs: Vec<Cells> = vec![vec![(0, 1.0, 10.0), (1, 1.0, 10.0)]];
        let mut r = PlanRequest::uniform(Design::RandPair, 0.0, 2, 0.1);
        assert!(plan(&pairs, 10.0, 0.0, &r).unwrap_err().contains("fraction"));
        r.fraction = 0.1;
        r.epsilon[1] = -1.0;
        assert!(plan(&pairs, 10.0, 0.0, &r).unwrap_err().contains("half-width"));
        r.epsilon[1] = 0.1;
        assert!(plan(&pairs, 0.0, 0.0, &r).unwrap_err().contains("no sessions"));
    }
}
