//! The simulator as a source: sessions generated on demand, positioned by session index.

use std::sync::Arc;

use ultr_core::config::CoreConfig;
use ultr_core::pipeline::{run_with_source, Observer, RunReport};
use ultr_core::sources::{Poll, RawRecord, RecordSource, ResumeOffsets, SourcePosition};

use super::{SimConfig, Simulator};

/// The name the simulator's stream has in the state's manifest.
pub fn source_identity(config: &SimConfig) -> String {
    format!("sim:seed={}", config.seed)
}

/// The simulator positioned at the state's resume offsets (the next session index).
pub fn open(sim: Arc<Simulator>, resume: &ResumeOffsets) -> Box<dyn RecordSource + Send> {
    let start = resume.0.values().flat_map(|p| p.values()).copied().max().unwrap_or(0);
    Box::new(SimulatorSource::new(sim, start as u64))
}

/// Streams the simulator's sessions through the streaming core into `state_dir`, as `ultr ingest`
/// does with `source = "simulator"`.
pub fn run_to_state(
    context: &ultr_core::context::PipelineContext,
    sim: &SimConfig,
    core: &CoreConfig,
    state_dir: &std::path::Path,
    observer: &mut dyn Observer,
) -> anyhow::Result<RunReport> {
    let simulator = Arc::new(Simulator::new(sim.clone())?);
    run_with_source(context, core, state_dir, observer, &|resume| Ok(open(simulator.clone(), resume)))
}

pub struct SimulatorSource {
    sim: Arc<Simulator>,
    stream: Arc<str>,
    next: u64,
    end: u64,
    /// Wall-clock pacing (`sessions_per_second`): a live-looking stream for the service and its tests.
    pace: Option<(f64, std::time::Instant, u64)>,
}

impl SimulatorSource {
    /// Sessions `start..config.sessions`.
    pub fn new(sim: Arc<Simulator>, start: u64) -> Self {
        let end = sim.config().sessions;
        let stream = source_identity(sim.config()).into();
        let pace = sim.config().sessions_per_second.filter(|r| *r > 0.0).map(|r| (r, std::time::Instant::now(), start));
        SimulatorSource { sim, stream, next: start, end, pace }
    }
}

impl RecordSource for SimulatorSource {
    fn replays_history(&self) -> bool {
        true
    }

    fn poll(&mut self, max: usize) -> anyhow::Result<Poll> {
        if self.next >= self.end {
            return Ok(Poll::End);
        }
        let mut stop = self.end.min(self.next + max as u64);
        if let Some((rate, started, first)) = self.pace {
            let allowed = first + (started.elapsed().as_secs_f64() * rate) as u64;
            if allowed <= self.next {
                std::thread::sleep(std::time::Duration::from_millis(10));
                return Ok(Poll::Idle);
            }
            stop = stop.min(allowed);
        }
        let mut out = Vec::with_capacity((stop - self.next) as usize);
        for i in self.next..stop {
            let mut payload = Vec::new();
            self.sim.session(i, &mut payload);
            out.push(RawRecord {
                payload,
                position: SourcePosition { stream: self.stream.clone(), partition: 0, offset: i as i64 },
                next_offset: i as i64 + 1,
            });
        }
        self.next = stop;
        Ok(Poll::Records(out))
    }
}
