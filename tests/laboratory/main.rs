//! Integration tests in the laboratory: the pipeline in process on files and the simulator, the
//! models against the simulator's truth, the CLI's one-shot commands, the reproduced experiments.
//! One binary links burn, datafusion and rdkafka once.

// The brute-force references are tuples of the columns they compare, and their matrix arithmetic
// reads as the textbook's, by index.
#![allow(clippy::type_complexity, clippy::needless_range_loop)]

#[path = "../common/mod.rs"]
mod common;

mod aggregated_training;
mod chunked_training;
mod click_log;
mod codecs;
mod config;
mod cumulative;
mod data;
mod fuzz;
mod identifiability;
mod ingest_workers;
mod library;
mod logged_propensity;
mod malformed_records;
mod misspecification;
mod misspecification_statistics;
mod model_interface;
mod population;
mod position_bias;
mod production_ingest;
mod randomization_plan;
mod results_scripts;
mod simulator;
mod team_ranking;
mod theta_intervals;
mod training;
mod units;
mod windows;
mod yan2022;
mod zhang2023;
mod zhuang2021;
