//! The simulator source kind: sessions generated from the `[simulator]` table, with known truth.

use std::sync::Arc;

use super::interface::{Source, SourceContext};
use ultr_core::sources::{RecordSource, ResumeOffsets};
use ultr_simulate::{GroundTruth, Simulator};

/// `source = "simulator"`.
pub struct SimulatorSource;

impl Source for SimulatorSource {
    fn open(&self, context: &SourceContext<'_>, resume: &ResumeOffsets) -> anyhow::Result<Box<dyn RecordSource + Send>> {
        Ok(ultr_simulate::source::open(Arc::new(Simulator::new(context.simulator.clone())?), resume))
    }

    fn identity(&self, context: &SourceContext<'_>) -> String {
        ultr_simulate::source::source_identity(context.simulator)
    }

    fn describe(&self, context: &SourceContext<'_>) -> String {
        format!("the built-in simulator (seed {})", context.simulator.seed)
    }

    fn expected_records(&self, context: &SourceContext<'_>) -> Option<u64> {
        Some(context.simulator.sessions)
    }

    fn validate(&self, context: &SourceContext<'_>) -> Result<(), String> {
        context.simulator.validate().map_err(|e| format!("[simulator]: {e}"))
    }

    fn ground_truth(&self, context: &SourceContext<'_>) -> anyhow::Result<Option<GroundTruth>> {
        Ok(Some(Simulator::new(context.simulator.clone())?.truth().clone()))
    }
}
