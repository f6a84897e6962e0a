//! The session-log contract: what one logged session is, how its formats are read, its Arrow form, and why a record is refused.

pub mod codec;
pub mod decode;
pub mod reason;
pub mod schema;

pub use codec::Codec;
pub use decode::{DecodeLimits, Decoder, DuplicateDocId};
pub use reason::{Reason, Rejected};
pub use schema::{impressions_schema, SCHEMA_VERSION};
