//! The session-log contract: what one logged session is, its Arrow form, and why a record is refused.

pub mod decode;
pub mod reason;
pub mod schema;

pub use decode::{DecodeLimits, Decoder, Rejected};
pub use reason::Reason;
pub use schema::impressions_schema;

/// The only contract version this build reads. A producer bumps it on an incompatible change.
pub const SCHEMA_VERSION: u64 = 1;
