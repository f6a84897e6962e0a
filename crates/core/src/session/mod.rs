//! The session-log contract: what one logged session is, how its formats are read, its Arrow form, and why a record is refused.

pub mod codec;
pub mod decode;
mod null_run;
pub mod reason;
pub mod schema;
mod text_column;
/// The null runs' unit tests, run by `tests/laboratory/units.rs` (the module stays crate-private).
#[cfg(feature = "unit-tests")]
pub use null_run::tests as null_run_tests;
/// The text column's unit tests, run by `tests/laboratory/units.rs` (the module stays crate-private).
#[cfg(feature = "unit-tests")]
pub use text_column::tests as text_column_tests;

pub use codec::Codec;
pub use decode::{DecodeLimits, Decoder, DuplicateDocId};
pub use reason::{Reason, Rejected};
pub use schema::{impressions_schema, SCHEMA_VERSION};
