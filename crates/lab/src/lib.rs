//! `ultr-lab`: the laboratory. A click simulator with known ground truth (`simulate`), usable as a
//! source of the streaming core, and the reproduced experiments of the papers (`experiment`), each
//! run through the same pipeline and training as production.

pub mod experiment;
pub mod simulate;
