//! Reproductions of published experiments, one file each: Hager 2025 through the real pipeline,
//! Zhang 2023 on simulated logs through the shared fit loop.

pub mod hager2025;
pub mod plot;
pub mod population;
pub mod zhang2023;
