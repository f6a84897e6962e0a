//! `ultr`: streaming unbiased learning to rank. Session logs in (Kafka, files, simulator), decoded to
//! Arrow impressions, windowed by DataFusion SQL, turned into debiased two-tower models and alerts.
//!
//! The crates follow the data flow: `ultr-core` (session contract, sources, sinks, windows and
//! `sql/`, state, identifiability) → `ultr-train` (models, fit, checkpoints, export, evaluation) →
//! `ultr-simulate` (the click simulator, a source, over `ultr-core` alone) → this library: the
//! assembled pipeline config and the always-on service with its monitor (scale-out lives in
//! `ultr-core`'s `scale_out`). The binary's command line (`src/cli/`)
//! calls it. The reproduced experiments (`ultr-lab`) are a binary of their own, which `ultr
//! experiment` runs; only the tests link them (a dev-dependency: the compiler refuses any other use).
//! The lower crates are re-exported under their stage names, so `ultr::window`, `ultr::train` and
//! `ultr::simulate` name one thing each.

/// mimalloc for every binary, test and bench linking the library (see Cargo.toml for why); the
/// `system-allocator` feature leaves the system's malloc in place, so heap profilers (heaptrack) see
/// every allocation.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Opts the process out of transparent huge pages (Linux; elsewhere, and where the kernel refuses,
/// nothing changes). mimalloc reserves its arena with `MADV_HUGEPAGE` and hands 64 KiB pieces of it
/// back to the kernel as they fall free; the next touch of such a piece then faults in, and zeroes,
/// a whole huge page. Ingest's profile showed much of its time zeroing pages that way
/// (`docs/benchmarks.md`); with base pages it touches only what it uses.
pub fn opt_out_of_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes one integer flag and reads no memory of ours.
        let status = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if status != 0 {
            tracing::debug!("prctl(PR_SET_THP_DISABLE): {}", std::io::Error::last_os_error());
        }
    }
}

pub use ultr_core::{context, identify, ingest, progress, scale_out, session, sinks, state, units, window};
pub use ultr_simulate as simulate;
pub use ultr_train as train;
pub use ultr_train::eval;

pub mod config;
pub mod config_reference;
pub mod demo;
pub mod evaluation;
pub mod monitor;
pub mod pipeline;
pub mod score;
pub mod service;
pub mod sources;
