//! The simulator source kind: sessions generated from the `[simulator]` table, with known truth.

use std::sync::Arc;

use super::{RecordSource, ResumeOffsets, Source};
use crate::config::PipelineConfig;
use crate::simulate::{GroundTruth, Simulator};

/// `source = "simulator"`.
pub struct SimulatorSource;

impl Source for SimulatorSource {
    fn open(&self, config: &PipelineConfig, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> {
        Ok(ultr_simulate::source::open(Arc::new(Simulator::new(config.simulator.clone())?), resume))
    }

    fn identity(&self, config: &PipelineConfig) -> String {
        ultr_simulate::source::source_identity(&config.simulator)
    }

    fn describe(&self, config: &PipelineConfig) -> String {
        format!("the built-in simulator (seed {})", config.simulator.seed)
    }

    fn expected_records(&self, config: &PipelineConfig) -> Option<u64> {
        Some(config.simulator.sessions)
    }

    fn validate(&self, config: &PipelineConfig) -> Result<(), String> {
        config.simulator.validate().map_err(|e| format!("[simulator]: {e}"))
    }

    fn ground_truth(&self, config: &PipelineConfig) -> anyhow::Result<Option<GroundTruth>> {
        Ok(Some(Simulator::new(config.simulator.clone())?.truth().clone()))
    }
}
