//! Identifiability analysis (Hager et al. 2025 §4): the swap graph and the feature-overlap graph over
//! bias configurations, their connected components, and the smallest randomization that connects them.

pub mod overlap;

use petgraph::unionfind::UnionFind;
use std::collections::{BTreeMap, BTreeSet};

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Int64Type, UInt32Type};
use serde::Serialize;

use crate::config::{IdentifiabilityConfig, IdentifiedBy};

/// A graph node: a bias configuration, i.e. a position and the session context (`""` without one).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Node {
    pub position: u32,
    pub context: String,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.context.is_empty() {
            write!(f, "{}", self.position)
        } else {
            write!(f, "{}@{}", self.position, self.context)
        }
    }
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
        let with_first: BTreeSet<&Node> = comps
            .iter()
            .find(|c| c.iter().any(|n| n.position == 1))
            .map(|c| c.iter().collect())
            .unwrap_or_default();
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
    pub swap_graph: GraphReport,
    pub overlap_graph: Option<GraphReport>,
    /// Per node pair: positivity score and MMD².
    pub overlap_scores: Vec<overlap::PairScore>,
    pub min_overlap_score: Option<f64>,
    pub identified_by: IdentifiedBy,
    pub identified: bool,
}

/// Swap-graph nodes and edges from the cumulative propensity and swap-edge tables.
pub fn swap_graph(propensity: &[RecordBatch], swap_edges: &[RecordBatch], max_position: u32) -> (BTreeSet<Node>, Vec<(Node, Node)>) {
    let mut nodes = BTreeSet::new();
    for b in propensity {
        let pos = b.column_by_name("position").expect("propensity has position").as_primitive::<UInt32Type>();
        let ctx = b.column_by_name("context").expect("propensity has context").as_string::<i32>();
        for i in 0..b.num_rows() {
            if pos.value(i) <= max_position {
                nodes.insert(Node { position: pos.value(i), context: if ctx.is_null(i) { String::new() } else { ctx.value(i).to_string() } });
            }
        }
    }
    let mut edges = Vec::new();
    for b in swap_edges {
        let pa = b.column(0).as_primitive::<UInt32Type>();
        let ca = b.column(1).as_string::<i32>();
        let pb = b.column(2).as_primitive::<UInt32Type>();
        let cb = b.column(3).as_string::<i32>();
        let pairs = b.column(4).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            if pairs.value(i) > 0 && pa.value(i) <= max_position && pb.value(i) <= max_position {
                edges.push((
                    Node { position: pa.value(i), context: ca.value(i).to_string() },
                    Node { position: pb.value(i), context: cb.value(i).to_string() },
                ));
            }
        }
    }
    (nodes, edges)
}

/// Runs the whole analysis on cumulative tables.
pub fn analyse(c: &crate::state::cumulative::Cumulative, config: &IdentifiabilityConfig) -> anyhow::Result<IdentifiabilityReport> {
    let (nodes, edges) = swap_graph(&c.propensity, &c.swap_edges, config.max_position);
    let swap = GraphReport::build(&nodes, &edges);
    let samples = overlap::samples_by_node(&c.overlap_sample, config.max_position);
    let (overlap_graph, scores) = if samples.is_empty() {
        (None, Vec::new())
    } else {
        let scores = overlap::pair_scores(&samples, config)?;
        let onodes: BTreeSet<Node> = samples.keys().cloned().collect();
        let oedges: Vec<(Node, Node)> =
            scores.iter().filter(|s| s.positivity >= config.min_overlap_score).map(|s| (s.a.clone(), s.b.clone())).collect();
        (Some(GraphReport::build(&onodes, &oedges)), scores)
    };
    let min_overlap_score = scores.iter().map(|s| s.positivity).reduce(f64::min);
    let identified = match config.identified_by {
        IdentifiedBy::Swaps => swap.connected,
        IdentifiedBy::Features => swap.connected || overlap_graph.as_ref().is_some_and(|g| g.connected),
    };
    Ok(IdentifiabilityReport {
        windows: c.windows.len(),
        impressions: c.windows.iter().map(|w| w.impressions).sum(),
        swap_graph: swap,
        overlap_graph,
        overlap_scores: scores,
        min_overlap_score,
        identified_by: config.identified_by,
        identified,
    })
}

impl IdentifiabilityReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "identifiability over {} window(s), {} impressions: {}\n",
            self.windows,
            self.impressions,
            if self.identified { "IDENTIFIED" } else { "NOT IDENTIFIED" }
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
        match &self.overlap_graph {
            Some(g) => {
                graph("feature-overlap graph", g, &mut s);
                if let Some(m) = self.min_overlap_score {
                    s.push_str(&format!("  minimum pairwise positivity score: {m:.3}\n"));
                }
            }
            None => s.push_str("\nfeature-overlap graph: no features in the stream\n"),
        }
        s
    }
}
