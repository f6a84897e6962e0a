//! `ultr-lab`: the laboratory. The reproduced experiments of the papers (`experiment`), each run
//! through the same pipeline and training as production, on the click simulator (`ultr-simulate`,
//! re-exported here as `simulate`).

pub mod experiment;
pub use ultr_simulate as simulate;
