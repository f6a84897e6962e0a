//! Reproductions of published experiments on the simulator, through the real pipeline.

pub mod hager2025;
pub mod plot;
pub mod population;
