//! The service's own settings (`[service]`).

use serde::{Deserialize, Serialize};

/// `[service]`: the HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// Address for `/metrics` and `/healthz`.
    pub listen: String,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig { listen: "127.0.0.1:9898".into() }
    }
}
