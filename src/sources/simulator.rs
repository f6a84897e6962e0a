//! The simulator as a source: sessions generated on demand, positioned by session index.

use std::sync::Arc;

use super::{Poll, RawRecord, RecordSource, SourcePosition};
use crate::simulate::Simulator;

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
        let stream = format!("sim:seed={}", sim.config().seed).into();
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
