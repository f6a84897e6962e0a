//! Identifiability analysis (Hager et al. 2025 §4): the swap graph and the feature-overlap graph over
//! the model's bias configurations, their union, their connected components, whether they identify the
//! model actually trained, and the smallest randomization that connects them.

pub mod config;
pub mod logged;
pub mod node;
pub mod overlap;
pub mod plan;
pub mod policy;
pub mod precision;

use petgraph::unionfind::UnionFind;
use std::collections::{BTreeMap, BTreeSet};

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Int64Type, UInt32Type};
use serde::Serialize;

use config::IdentifiabilityConfig;
pub use node::Node;

/// What identifies θ for a model family (Hager §4): the one definition the CLI, the metrics and the
/// alerts use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Identification {
    /// A per-document relevance (γ_{q,d}, the embedding tower): only swaps of the same (q, d) between
    /// positions relate θ_k to θ_k' (Thm 3.1); the swap graph must be connected.
    Swaps,
    /// A relevance function of features (linear, MLP towers): positions are related by swaps and by
    /// overlapping feature distributions (Thm 4.1; a swap is exact overlap); the union graph must be
    /// connected.
    SwapsOrFeatureOverlap,
    /// A model without position parameters (the biased single tower): nothing to identify.
    Nothing,
}

/// Components of an undirected graph, by petgraph's union-find. Components are sorted, the one
/// holding the smallest node first.
pub fn components(nodes: &BTreeSet<Node>, edges: &[(Node, Node)]) -> Vec<Vec<Node>> {
    let index: BTreeMap<&Node, usize> = nodes.iter().enumerate().map(|(i, n)| (n, i)).collect();
    let mut sets = UnionFind::<usize>::new(nodes.len());
    for (a, b) in edges {
        if let (Some(&i), Some(&j)) = (index.get(a), index.get(b)) {
            sets.union(i, j);
        }
    }
    // Keyed by each component's smallest node index, so the order is the nodes' order.
    let mut groups: BTreeMap<usize, Vec<Node>> = BTreeMap::new();
    let mut first_of_root: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let first = *first_of_root.entry(sets.find_mut(i)).or_insert(i);
        groups.entry(first).or_default().push(n.clone());
    }
    groups.into_values().collect()
}

/// Randomization advice: the fewest node pairs (c − 1 for c components) whose swapping connects the
/// graph, choosing the closest positions (the cheapest exploration) by Kruskal over component pairs.
pub fn randomization_advice(components: &[Vec<Node>]) -> Vec<(Node, Node)> {
    let comp_of: BTreeMap<&Node, usize> = components.iter().enumerate().flat_map(|(c, ns)| ns.iter().map(move |n| (n, c))).collect();
    let mut candidates: Vec<(u32, &Node, &Node)> = Vec::new();
    let all: Vec<&Node> = comp_of.keys().copied().collect();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if comp_of[a] != comp_of[b] {
                candidates.push((a.position.abs_diff(b.position), a, b));
            }
        }
    }
    candidates.sort();
    let mut sets = UnionFind::<usize>::new(components.len());
    let mut out = Vec::new();
    for (_, a, b) in candidates {
        if sets.union(comp_of[a], comp_of[b]) {
            out.push(((*a).clone(), (*b).clone()));
            if out.len() + 1 == components.len() {
                break;
            }
        }
    }
    out
}

/// One graph's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct GraphReport {
    pub nodes: usize,
    pub edges: usize,
    pub components: Vec<Vec<Node>>,
    /// Nodes not in the component of position 1.
    pub cut_off_from_position_1: Vec<Node>,
    pub connected: bool,
    pub randomization_advice: Vec<(Node, Node)>,
}

impl GraphReport {
    pub fn build(nodes: &BTreeSet<Node>, edges: &[(Node, Node)]) -> Self {
        let comps = components(nodes, edges);
        let with_first: BTreeSet<&Node> = comps.iter().find(|c| c.iter().any(|n| n.position == 1)).map(|c| c.iter().collect()).unwrap_or_default();
        let cut_off = nodes.iter().filter(|n| !with_first.contains(n)).cloned().collect();
        GraphReport {
            nodes: nodes.len(),
            edges: edges.len(),
            connected: comps.len() <= 1,
            randomization_advice: randomization_advice(&comps),
            components: comps,
            cut_off_from_position_1: cut_off,
        }
    }
}

/// The full analysis.
#[derive(Debug, Clone, Serialize)]
pub struct IdentifiabilityReport {
    pub windows: usize,
    pub impressions: u64,
    /// The model the verdict is for (its tower) and what identifies it.
    pub model: String,
    pub identification: Identification,
    pub swap_graph: GraphReport,
    pub overlap_graph: Option<GraphReport>,
    /// Swap edges and overlap edges together: what identifies a feature tower.
    pub union_graph: GraphReport,
    /// Cross-fitted overlap of each pair of adjacent positions.
    pub overlap_scores: Vec<overlap::PairScore>,
    /// The weakest link of the best-connected union graph: the largest s such that swap edges (score 1)
    /// and overlap edges scoring ≥ s connect every position (the bottleneck of the maximum spanning tree);
    /// `None` when no spanning structure exists at all.
    pub overlap_bottleneck: Option<f64>,
    pub identified: bool,
    /// How precisely the swap pairs determine θ_k − θ_1 (`precision.rs`), positions 1..=K.
    pub theta_precision: precision::ThetaPrecision,
    /// Identified, yet some θ_k's 95% interval from the swap pairs' information is wider than
    /// `[identifiability] max_theta_interval` (per-document relevance only: a feature tower also
    /// learns θ from features, which this precision does not count).
    pub weakly_identified: bool,
    /// Impression-weighted within-position sd of π(d,k|q) over the horizon: 0 under a deterministic
    /// policy, whose data cannot show misspecification through the policy.
    pub policy_variation: f64,
    /// Why misspecification cannot be assessed from this data, when it cannot.
    pub misspecification_blind: Option<String>,
    /// Per policy that logged propensities: do they agree with its counted π?
    pub logged_propensity: Vec<logged::LoggedPropensityCheck>,
}

/// Swap-graph nodes (positions up to `max_position`) and edges from the cumulative propensity and
/// swap-edge tables; the tables' per-context rows are merged into positions.
pub fn swap_graph(propensity: &[RecordBatch], swap_edges: &[RecordBatch], max_position: u32) -> (BTreeSet<Node>, Vec<(Node, Node)>) {
    let mut nodes = BTreeSet::new();
    for b in propensity {
        let pos = b.column_by_name("position").expect("propensity has position").as_primitive::<UInt32Type>();
        for i in 0..b.num_rows() {
            if pos.value(i) <= max_position {
                nodes.insert(Node { position: pos.value(i) });
            }
        }
    }
    let edges = swap_pair_counts(swap_edges, max_position).into_keys().map(|(a, b)| (Node { position: a }, Node { position: b })).collect();
    (nodes, edges)
}

/// The swap graph's edge weights: (query, document) pairs shown at both positions, per position pair
/// (a < b, both ≤ `max_position`), summed over the table's rows (contexts, windows).
pub fn swap_pair_counts(swap_edges: &[RecordBatch], max_position: u32) -> BTreeMap<(u32, u32), i64> {
    let mut out = BTreeMap::new();
    for b in swap_edges {
        let pa = b.column(0).as_primitive::<UInt32Type>();
        let pb = b.column(2).as_primitive::<UInt32Type>();
        let pairs = b.column(4).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let (a, z) = (pa.value(i), pb.value(i));
            if pairs.value(i) > 0 && a != z && a <= max_position && z <= max_position {
                *out.entry((a.min(z), a.max(z))).or_insert(0) += pairs.value(i);
            }
        }
    }
    out
}

/// Runs the whole analysis on cumulative tables for a model with θ_1..θ_`max_position`, named `model`
/// and identified as `identification` says.
pub fn analyse(
    c: &crate::state::cumulative::Cumulative,
    config: &IdentifiabilityConfig,
    model: &str,
    identification: Identification,
    max_position: u32,
) -> anyhow::Result<IdentifiabilityReport> {
    let (nodes, edges) = swap_graph(&c.propensity, &c.swap_edges, max_position);
    let swap = GraphReport::build(&nodes, &edges);
    let samples = overlap::samples_by_node(&c.overlap_sample, max_position);
    let scores = if samples.is_empty() { Vec::new() } else { overlap::pair_scores(&samples, config)? };
    let overlap_graph = (!samples.is_empty()).then(|| {
        let onodes: BTreeSet<Node> = samples.keys().cloned().collect();
        let oedges: Vec<(Node, Node)> = scores.iter().filter(|s| s.overlap >= config.min_overlap_score).map(|s| (s.a.clone(), s.b.clone())).collect();
        GraphReport::build(&onodes, &oedges)
    });
    let mut union_edges = edges.clone();
    union_edges.extend(scores.iter().filter(|s| s.overlap >= config.min_overlap_score).map(|s| (s.a.clone(), s.b.clone())));
    let union = GraphReport::build(&nodes, &union_edges);
    let mut weighted: Vec<(f64, &Node, &Node)> = edges.iter().map(|(a, b)| (1.0, a, b)).collect();
    weighted.extend(scores.iter().map(|s| (s.overlap, &s.a, &s.b)));
    let overlap_bottleneck = spanning_bottleneck(&nodes, &weighted);
    let identified = match identification {
        Identification::Swaps => swap.connected,
        Identification::SwapsOrFeatureOverlap => union.connected,
        Identification::Nothing => true,
    };
    let policy_variation = policy::policy_variation_of(&c.propensity, max_position);
    let positions = nodes.iter().map(|n| n.position).max().unwrap_or(1).min(max_position) as usize;
    let theta_precision = precision::theta_precision(&precision::cells_of(&c.propensity, max_position), positions.max(1));
    let weakly_identified =
        identified && identification == Identification::Swaps && theta_precision.widest().is_some_and(|(_, width)| width > config.max_theta_interval);
    Ok(IdentifiabilityReport {
        windows: c.windows.len(),
        impressions: c.windows.iter().map(|w| w.impressions).sum(),
        model: model.to_string(),
        identification,
        swap_graph: swap,
        overlap_graph,
        union_graph: union,
        overlap_scores: scores,
        overlap_bottleneck,
        identified,
        theta_precision,
        weakly_identified,
        policy_variation,
        misspecification_blind: policy::blind_reason(policy_variation, config.min_policy_variation),
        logged_propensity: logged::check(&c.policy_propensity, config.max_logged_propensity_dispersion),
    })
}

/// The smallest edge weight of a maximum spanning tree (Kruskal, heaviest edges first): the largest
/// threshold at which the edges still connect every node. `None` when even all edges leave the nodes
/// apart (or there are fewer than two nodes).
pub fn spanning_bottleneck(nodes: &BTreeSet<Node>, edges: &[(f64, &Node, &Node)]) -> Option<f64> {
    if nodes.len() < 2 {
        return None;
    }
    let index: BTreeMap<&Node, usize> = nodes.iter().enumerate().map(|(i, n)| (n, i)).collect();
    let mut sorted: Vec<&(f64, &Node, &Node)> = edges.iter().collect();
    sorted.sort_by(|x, y| y.0.total_cmp(&x.0));
    let mut sets = UnionFind::<usize>::new(nodes.len());
    let (mut joined, mut weakest) = (0, f64::INFINITY);
    for (w, a, b) in sorted {
        if let (Some(&i), Some(&j)) = (index.get(a), index.get(b)) {
            if sets.union(i, j) {
                joined += 1;
                weakest = weakest.min(*w);
            }
        }
    }
    (joined + 1 == nodes.len()).then_some(weakest)
}

impl IdentifiabilityReport {
    /// IDENTIFIED, WEAKLY IDENTIFIED (connected, yet some θ_k's interval is too wide) or NOT IDENTIFIED.
    pub fn verdict(&self) -> &'static str {
        match (self.identified, self.weakly_identified) {
            (false, _) => "NOT IDENTIFIED",
            (true, true) => "WEAKLY IDENTIFIED",
            (true, false) => "IDENTIFIED",
        }
    }

    /// θ_k − θ_1 with its 95% interval from the swap pairs' information, and each link's pairs.
    fn render_precision(&self) -> String {
        let p = &self.theta_precision;
        let mut s = format!(
            "  precision from the {} (query, document) pairs shown at two positions or more (per-document model, profile information, clicks' dispersion {:.2}):\n",
            p.swapped_pairs, p.dispersion
        );
        for (k, (t, se)) in p.theta.iter().zip(&p.standard_error).enumerate().skip(1) {
            if se.is_finite() {
                s.push_str(&format!("    θ{} − θ1 = {t:+.3} ± {:.3} (95% interval width {:.3})\n", k + 1, precision::Z95 * se, p.interval_width(k)));
            } else {
                s.push_str(&format!("    θ{} − θ1: not determined (no informative swap path to position 1)\n", k + 1));
            }
        }
        let mut thin: Vec<&precision::EdgeInformation> = p.edges.iter().filter(|e| e.effective_pairs < 5.0).collect();
        thin.sort_by(|x, y| x.information.total_cmp(&y.information));
        if !thin.is_empty() {
            let shown: Vec<String> =
                thin.iter().take(8).map(|e| format!("{}-{} ({:.1} pairs, information {:.2})", e.a, e.b, e.effective_pairs, e.information)).collect();
            let more = if thin.len() > 8 { format!(" and {} more", thin.len() - 8) } else { String::new() };
            s.push_str(&format!("  links resting on fewer than 5 effective pairs, least informative first: {}{more}\n", shown.join(", ")));
        }
        if self.weakly_identified {
            let (k, width) = p.widest().unwrap_or((0, f64::NAN));
            s.push_str(&format!(
                "  WEAKLY IDENTIFIED: θ{k}'s interval is {width:.2} wide, more than `[identifiability] max_theta_interval`; randomise (swap) the thin links for a share of traffic\n"
            ));
        }
        s
    }

    pub fn render(&self) -> String {
        let needs = match self.identification {
            Identification::Swaps => "a connected swap graph (per-document relevance)",
            Identification::SwapsOrFeatureOverlap => "a connected union of swap and feature-overlap edges (feature tower)",
            Identification::Nothing => "nothing (the model has no position parameters)",
        };
        let mut s = format!(
            "identifiability over {} window(s), {} impressions: {} for the {} model, which needs {needs}\n",
            self.windows,
            self.impressions,
            self.verdict(),
            self.model,
        );
        let graph = |name: &str, g: &GraphReport, s: &mut String| {
            s.push_str(&format!("\n{name}: {} nodes, {} edges, {} component(s)\n", g.nodes, g.edges, g.components.len()));
            for (i, c) in g.components.iter().enumerate() {
                let names: Vec<String> = c.iter().map(|n| n.to_string()).collect();
                s.push_str(&format!("  component {}: {}\n", i + 1, names.join(" ")));
            }
            if !g.cut_off_from_position_1.is_empty() {
                let names: Vec<String> = g.cut_off_from_position_1.iter().map(|n| n.to_string()).collect();
                s.push_str(&format!("  cut off from position 1: {}\n", names.join(" ")));
            }
            if !g.randomization_advice.is_empty() {
                let pairs: Vec<String> = g.randomization_advice.iter().map(|(a, b)| format!("{a}<->{b}")).collect();
                s.push_str(&format!("  randomize (swap) these pairs to connect it: {}\n", pairs.join(", ")));
            }
        };
        graph("swap graph", &self.swap_graph, &mut s);
        s.push_str(&self.render_precision());
        match &self.overlap_graph {
            Some(g) => {
                graph("feature-overlap graph (adjacent positions)", g, &mut s);
                for p in &self.overlap_scores {
                    s.push_str(&format!("  overlap {}-{}: {:.3} (± {:.3} by chance)\n", p.a, p.b, p.overlap, p.noise));
                }
            }
            None => s.push_str("\nfeature-overlap graph: no features in the stream\n"),
        }
        graph("union graph (swaps and overlap)", &self.union_graph, &mut s);
        if let Some(b) = self.overlap_bottleneck {
            s.push_str(&format!("  weakest link of the best spanning tree: {b:.3}\n"));
        }
        match &self.misspecification_blind {
            Some(reason) => s.push_str(&format!("\nmisspecification: CANNOT BE ASSESSED — {reason}\n")),
            None => s.push_str(&format!(
                "\nmisspecification: assessable (π varies within positions, sd {:.3}); `ultr run` tests each window's held-out residuals against π (ultr_misspecification_z)\n",
                self.policy_variation
            )),
        }
        if self.logged_propensity.is_empty() {
            s.push_str("\nlogged propensities: none in the stream (IPS uses counted π)\n");
        } else {
            s.push_str("\nlogged propensities against counted π (per policy):\n");
            for c in &self.logged_propensity {
                s.push_str(&c.render());
            }
        }
        s
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    /// Edge weights sum the pairs of every context row of a position pair; a pair within one position
    /// (two contexts), a position past the model's and an empty row are not edges.
    pub fn swap_pair_counts_sum_contexts_and_skip_what_is_no_edge() {
        use datafusion::arrow::array::{Int64Array, StringArray, UInt32Array};
        use std::sync::Arc;
        let rows: [(u32, &str, u32, &str, i64); 6] =
            [(1, "", 2, "", 5), (1, "m", 2, "d", 3), (2, "", 1, "m", 1), (2, "d", 2, "m", 9), (3, "", 11, "", 4), (1, "", 3, "", 0)];
        let batch = RecordBatch::try_from_iter([
            ("position_a", Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.0))) as _),
            ("context_a", Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))) as _),
            ("position_b", Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.2))) as _),
            ("context_b", Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3))) as _),
            ("pairs", Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.4))) as _),
        ])
        .unwrap();
        assert_eq!(swap_pair_counts(std::slice::from_ref(&batch), 10), BTreeMap::from([((1, 2), 9)]));
        assert_eq!(swap_pair_counts(&[batch], 11), BTreeMap::from([((1, 2), 9), ((3, 11), 4)]));
    }

    /// The bottleneck equals a brute-force answer: the largest edge weight w such that the edges of
    /// weight ≥ w connect every node.
    pub fn spanning_bottleneck_is_the_largest_threshold_that_still_connects() {
        let nodes: BTreeSet<Node> = (1..=6).map(|position| Node { position }).collect();
        let n = |position| Node { position };
        let (n1, n2, n3, n4, n5, n6) = (n(1), n(2), n(3), n(4), n(5), n(6));
        let edges = vec![(1.0, &n1, &n2), (0.3, &n2, &n3), (0.7, &n3, &n4), (0.2, &n1, &n3), (0.9, &n4, &n5), (0.4, &n5, &n6), (0.35, &n2, &n6)];
        let brute = edges
            .iter()
            .map(|e| e.0)
            .filter(|w| {
                let kept: Vec<(Node, Node)> = edges.iter().filter(|e| e.0 >= *w).map(|e| (e.1.clone(), e.2.clone())).collect();
                components(&nodes, &kept).len() == 1
            })
            .fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(spanning_bottleneck(&nodes, &edges), Some(brute));
        assert_eq!(brute, 0.35);
        // Without the 5–6 and 2–6 edges node 6 is cut off: no spanning structure at all.
        assert_eq!(spanning_bottleneck(&nodes, &edges[..5]), None);
    }

    /// Two positions (a two-slot carousel) have a bottleneck: their one edge's weight. One node has
    /// none. Regression test for a mutant that cargo-mutants found surviving (`< 2` → `<= 2`).
    pub fn two_positions_have_their_edge_as_bottleneck_and_one_has_none() {
        let (n1, n2) = (Node { position: 1 }, Node { position: 2 });
        let two: BTreeSet<Node> = [n1.clone(), n2.clone()].into();
        assert_eq!(spanning_bottleneck(&two, &[(0.7, &n1, &n2)]), Some(0.7));
        assert_eq!(spanning_bottleneck(&two, &[]), None);
        let one: BTreeSet<Node> = [n1.clone()].into();
        assert_eq!(spanning_bottleneck(&one, &[(0.7, &n1, &n1)]), None);
    }
}
