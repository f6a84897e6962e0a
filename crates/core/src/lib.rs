//! `ultr-core`: the streaming core of `ultr`. Records come from a source (`sources`), are decoded
//! against the session contract (`session`, `ingest`), gathered into event-time windows whose
//! statistics `sql/` computes (`window`), kept durably with the source positions they cover
//! (`state`), and read by the identifiability checks (`identify`). `pipeline` is that loop;
//! `sinks` carry records out (Kafka, JSONL, dead letters). Nothing here trains or serves.

pub mod config;
pub mod context;
pub mod identify;
pub mod import;
pub mod ingest;
pub mod letor;
pub mod math;
pub mod pipeline;
pub mod progress;
pub mod runtime;
pub mod scale_out;
pub mod session;
pub mod sinks;
pub mod sources;
pub mod state;
#[cfg(feature = "unit-tests")]
mod testing;
pub mod units;
pub mod window;
