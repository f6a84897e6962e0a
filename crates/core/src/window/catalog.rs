//! The statistics catalog: every table a window writes, as one typed entry — its name (its file
//! `<name>.parquet` and the enum `StateTable`), the SQL that computes it and merges or finishes it,
//! the order its rows are written in, and what its rows add to the window's manifest entry. Its
//! schema is planned from that SQL (`StateTable::schema`, in `window`), never typed again. The windows' reduce,
//! merge and finish steps, the state's readers and the cumulative views all iterate this catalog,
//! so a new statistic is its SQL file plus one entry here (and its consumer and test).
//!
//! The views over a horizon's windows (`VIEWS`) are statements too, but no window writes them.

use datafusion::arrow::array::RecordBatch;

use super::sql::Statistic;

/// The statistics of one window (or of a cumulative view), by table.
pub type Tables = Vec<(StateTable, Vec<RecordBatch>)>;

/// The batches of `t` (empty when absent).
pub fn table(tables: &Tables, t: StateTable) -> &[RecordBatch] {
    tables.iter().find(|(n, _)| *n == t).map(|(_, b)| b.as_slice()).unwrap_or(&[])
}

/// A statement compiled in from `sql/<name>.sql`.
macro_rules! sql {
    ($name:literal) => {
        Statistic { name: $name, sql: include_str!(concat!("../../../../sql/", $name, ".sql")) }
    };
}

/// How a window computes a table.
pub enum Computed {
    /// Kept while the window is open, as partial aggregates: `reduce` turns a micro-batch of window
    /// rows (table `impressions`, `super::window_schema`) into a partial; `merge` turns a union of
    /// partials (registered as table `merge_input`) into one.
    Partial {
        reduce: Statistic,
        merge: Statistic,
        merge_input: &'static str,
        /// Every key holds `query_id`: partials of disjoint sets of queries (the shards of one
        /// ingest, `pipeline::shards`) merge by putting their rows together.
        keyed_by_query: bool,
    },
    /// Finished when the window closes, by `sql` on the merged table `from` (registered as `input`).
    Finished { sql: Statistic, from: StateTable, input: &'static str },
}

impl Computed {
    /// The statement that computes the table from its input: a partial's reduce, or the finishing SQL.
    pub fn statement(&self) -> &Statistic {
        match self {
            Computed::Partial { reduce, .. } => reduce,
            Computed::Finished { sql, .. } => sql,
        }
    }

    /// A partial's merge statement and the table it reads; None for a finished table.
    pub fn merge(&self) -> Option<(&Statistic, &'static str)> {
        match self {
            Computed::Partial { merge, merge_input, .. } => Some((merge, merge_input)),
            Computed::Finished { .. } => None,
        }
    }

    /// The table that statement reads: the window's rows (`impressions`), or the finished-from table's
    /// name in the finishing SQL.
    pub fn input(&self) -> &'static str {
        match self {
            Computed::Partial { .. } => "impressions",
            Computed::Finished { input, .. } => input,
        }
    }
}

/// A count a window's manifest entry records (`state::WindowEntry`): the sum of one column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowTotal {
    Sessions(&'static str),
    Impressions(&'static str),
}

/// One statistic a window writes.
pub struct Entry {
    /// Its file stem and its name in the SQL that reads it.
    pub name: &'static str,
    pub computed: Computed,
    /// The columns its rows ascend by (NULLs last), as its SQL's `ORDER BY` writes them: a merge
    /// reads sorted partials as sorted runs and streams.
    pub order: &'static [&'static str],
    /// What its rows add to the window's manifest entry.
    pub total: Option<WindowTotal>,
    /// Its rows are pairs of nodes (`position_a`, `context_a`; `position_b`, `context_b`) whose two
    /// contexts within one position the SQL orders by id: they are ordered by their strings, and the
    /// rows sorted again, when the window's ids become strings (`keys::Keys::tables_to_strings`).
    pub pairs_ordered_by_context: bool,
}

/// Declares the catalog: the enum `StateTable` and its entries, from one list.
macro_rules! catalog {
    ($($(#[$doc:meta])* $variant:ident => $entry:expr,)*) => {
        /// A table a window writes; its entry is in this module's catalog.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum StateTable {
            $($(#[$doc])* $variant,)*
        }

        impl StateTable {
            /// Every table, in the order a closed window writes them.
            pub const ALL: &'static [StateTable] = &[$(StateTable::$variant),*];

            /// The table's catalog entry.
            pub fn entry(self) -> &'static Entry {
                const ENTRIES: &[Entry] = &[$($entry),*];
                &ENTRIES[self as usize]
            }
        }
    };
}

catalog! {
    /// π inputs: impressions and clicks per (query, document, position, context, policy).
    PropensityCounts => Entry {
        name: "propensity_counts",
        computed: Computed::Partial {
            reduce: sql!("propensity_counts"),
            merge: sql!("merge_propensity_counts"),
            merge_input: "propensity_counts",
            keyed_by_query: true,
        },
        order: &["query_id", "doc_id", "position", "context", "policy_id"],
        total: Some(WindowTotal::Impressions("impressions")),
        pairs_ordered_by_context: false,
    },
    /// Sessions per query and policy: π's denominator.
    QuerySessions => Entry {
        name: "query_sessions",
        computed: Computed::Partial {
            reduce: sql!("query_sessions"),
            merge: sql!("merge_query_sessions"),
            merge_input: "query_sessions",
            keyed_by_query: true,
        },
        order: &["query_id", "policy_id"],
        total: Some(WindowTotal::Sessions("sessions")),
        pairs_ordered_by_context: false,
    },
    /// Per-position impressions, clicks and CTR.
    PositionCtr => Entry {
        name: "position_ctr",
        computed: Computed::Finished { sql: sql!("position_ctr"), from: StateTable::PropensityCounts, input: "propensity_counts" },
        order: &["position"],
        total: None,
        pairs_ordered_by_context: false,
    },
    /// The swap graph's edges: the distinct (q, d, k) set it needs is exactly the counts' keys.
    SwapEdges => Entry {
        name: "swap_edges",
        computed: Computed::Finished { sql: sql!("swap_edges"), from: StateTable::PropensityCounts, input: "impressions" },
        order: &["position_a", "context_a", "position_b", "context_b"],
        total: None,
        pairs_ordered_by_context: true,
    },
    /// A bottom-k sample of feature vectors per (position, context): its own merge.
    OverlapSample => Entry {
        name: "overlap_sample",
        computed: Computed::Partial {
            reduce: sql!("overlap_sample"),
            merge: sql!("overlap_sample"),
            merge_input: "impressions",
            keyed_by_query: false,
        },
        order: &["position", "context", "sample_key"],
        total: None,
        pairs_ordered_by_context: false,
    },
    /// Impressions and clicks per (query, document, position, split, feature vector): training's rows.
    TrainingRows => Entry {
        name: "training_rows",
        computed: Computed::Partial {
            reduce: sql!("training_rows"),
            merge: sql!("merge_training_rows"),
            merge_input: "training_rows",
            keyed_by_query: true,
        },
        order: &["query_id", "doc_id", "position", "split", "feature_key"],
        total: None,
        pairs_ordered_by_context: false,
    },
    /// The feature vectors behind the training rows' `feature_key`.
    TrainingFeatures => Entry {
        name: "training_features",
        computed: Computed::Partial {
            reduce: sql!("training_features"),
            merge: sql!("merge_training_features"),
            merge_input: "training_features",
            keyed_by_query: true,
        },
        order: &["query_id", "doc_id", "feature_key"],
        total: None,
        pairs_ordered_by_context: false,
    },
    /// Whole sessions (bounded by `[window] session_store_patterns`), for the click models.
    SessionStore => Entry {
        name: "session_store",
        computed: Computed::Partial {
            reduce: sql!("session_store"),
            merge: sql!("merge_session_store"),
            merge_input: "session_store",
            keyed_by_query: false,
        },
        order: &["pattern_key", "position"],
        total: None,
        pairs_ordered_by_context: false,
    },
}

/// π(d,k|q) over a horizon, from the windows' merged counts and sessions.
pub const CUMULATIVE_PROPENSITY: Statistic = sql!("cumulative_propensity");
/// Per (query, document, position, policy): counted and logged π.
pub const POLICY_PROPENSITY: Statistic = sql!("policy_propensity");
/// The π the IPS weights use, per policy's chosen source.
pub const IPS_PROPENSITY: Statistic = sql!("ips_propensity");
/// Training's examples: the horizon's training rows joined with their features and π.
pub const TRAINING_EXAMPLES: Statistic = sql!("training_examples");
/// Every view over a horizon's windows.
pub const VIEWS: [&Statistic; 4] = [&CUMULATIVE_PROPENSITY, &POLICY_PROPENSITY, &IPS_PROPENSITY, &TRAINING_EXAMPLES];

impl StateTable {
    /// The table's file stem and SQL name.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// The table named `name`, if the catalog has one.
    pub fn named(name: &str) -> Option<StateTable> {
        StateTable::ALL.iter().copied().find(|t| t.name() == name)
    }

    /// The tables a window keeps as partial aggregates while open, in catalog order.
    pub fn partials() -> impl Iterator<Item = StateTable> {
        StateTable::ALL.iter().copied().filter(|t| matches!(t.entry().computed, Computed::Partial { .. }))
    }
}

impl std::fmt::Display for StateTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
