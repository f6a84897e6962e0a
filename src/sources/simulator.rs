//! The simulator as a source: sessions generated on demand, positioned by session index.

use std::sync::Arc;

use super::{Poll, RawRecord, RecordSource, SourcePosition};
use crate::simulate::Simulator;

pub struct SimulatorSource {
    sim: Arc<Simulator>,
    stream: Arc<str>,
    next: u64,
    end: u64,
}

impl SimulatorSource {
    /// Sessions `start..config.sessions`.
    pub fn new(sim: Arc<Simulator>, start: u64) -> Self {
        let end = sim.config().sessions;
        let stream = format!("sim:seed={}", sim.config().seed).into();
        SimulatorSource { sim, stream, next: start, end }
    }
}

impl RecordSource for SimulatorSource {
    fn poll(&mut self, max: usize) -> anyhow::Result<Poll> {
        if self.next >= self.end {
            return Ok(Poll::End);
        }
        let stop = self.end.min(self.next + max as u64);
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
