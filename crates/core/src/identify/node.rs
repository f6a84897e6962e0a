//! The nodes of the identifiability graphs: one per position, each a parameter θ_k.

use serde::Serialize;

/// A graph node: a bias configuration of the model, i.e. a position k with its θ_k. Session context is
/// not a parameter of the additive model (its optional bias tower b(z) is a smooth function of the bias
/// features, shared by every position), so a rare context value never becomes a node of its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Node {
    pub position: u32,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.position)
    }
}
