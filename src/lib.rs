//! `ultr`: streaming unbiased learning to rank. Session logs in (Kafka, files, simulator), decoded to
//! Arrow impressions, windowed by DataFusion SQL, turned into debiased two-tower models and alerts.
//!
//! Data flow, one module per stage: `sources` → `session` (decode) → `ingest` → … ; `sinks` carry
//! records out (Kafka, JSONL, dead letters); `simulate` is the laboratory with known ground truth.

/// mimalloc for every binary, test and bench linking the library (see Cargo.toml for why); the
/// `system-allocator` feature leaves the system's malloc in place, so heap profilers (heaptrack) see
/// every allocation.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod cli;
pub mod config;
pub mod config_reference;
pub mod demo;
pub mod eval;
pub mod experiment;
pub mod identify;
pub mod ingest;
pub mod monitor;
pub mod pipeline;
pub mod progress;
pub mod scale_out;
pub mod service;
pub mod session;
pub mod simulate;
pub mod sinks;
pub mod sources;
pub mod state;
pub mod summary;
pub mod train;
pub mod units;
pub mod window;
