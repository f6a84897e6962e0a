//! The status page's text facts: what a gauge cannot carry (model ids, the gate's reasons, the last
//! trainings, graph components and randomization advice, why a test cannot be assessed). Numbers
//! stay in `metrics`; the page reads those from the same text `/metrics` serves.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::PathBuf;

/// Trainings kept for the page, newest last.
pub const TRAININGS_KEPT: usize = 12;

/// Counter samples kept for rates (one per checkpoint).
pub const SAMPLES_KEPT: usize = 256;

/// The promoted model, as its checkpoint records it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCard {
    pub id: String,
    pub created_at: String,
    pub parent: Option<String>,
    /// Event-time range of the windows it was trained on.
    pub data_range_ms: Option<(i64, i64)>,
    /// Closed windows of the state inside that range, when the monitor last looked.
    pub windows: usize,
    pub promoted_reason: String,
    /// "95% bootstrap (query)" when the checkpoint carries θ intervals.
    pub intervals: Option<String>,
}

/// One training run (scheduled or triggered) and the gate's decision.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingCard {
    pub finished_unix_s: f64,
    pub id: Option<String>,
    /// promoted, rejected, failed or cancelled (as `ultr_trainings_total{result}`).
    pub result: String,
    pub reason: String,
    pub theta: Vec<f64>,
    pub seconds: f64,
    pub warm_start: bool,
    /// The logged order combined with the clicks: the weight chosen and where the clicks move the
    /// ranking, per bucket of click volume (`logged_order_combination.rs`), when it ran.
    pub combination: Option<ultr_train::logged_order_combination::Combination>,
}

/// The identifiability verdict's structure: which graph the model needs and how it falls apart.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GraphCard {
    pub model: String,
    /// The graph that decides (swap or union) and what it means.
    pub decides: String,
    /// Components of that graph (positions), the one holding position 1 first.
    pub components: Vec<Vec<u32>>,
    /// Position pairs to randomise to connect it.
    pub advice: Vec<(u32, u32)>,
    /// Why misspecification cannot be assessed, when it cannot.
    pub misspecification_blind: Option<String>,
}

/// A point of the ingest counters (for sessions/s and the dead-letter rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CounterSample {
    pub unix_s: f64,
    pub records: u64,
    pub sessions: u64,
    pub bad_records: u64,
}

#[derive(Debug, Clone, Default)]
pub struct BoardState {
    pub current_model: Option<ModelCard>,
    pub trainings: VecDeque<TrainingCard>,
    pub graph: Option<GraphCard>,
    /// The randomization plan at the last verdict (its numbers are also series).
    pub plan: Option<ultr_core::identify::plan::Plan>,
    pub samples: VecDeque<CounterSample>,
    /// The dead-letter file the page lists the newest letters of (none for a Kafka topic).
    pub dead_letter_file: Option<PathBuf>,
    /// Where dead letters go, in words.
    pub dead_letter_target: String,
    /// The source, in words (file paths, topics, simulator).
    pub source: String,
}

/// Shared between the monitor, the scheduler and the HTTP server.
#[derive(Debug, Default)]
pub struct Board {
    state: Mutex<BoardState>,
}

impl Board {
    pub fn snapshot(&self) -> BoardState {
        self.state.lock().clone()
    }

    pub fn update(&self, change: impl FnOnce(&mut BoardState)) {
        change(&mut self.state.lock());
    }

    pub fn push_training(&self, card: TrainingCard) {
        self.update(|s| {
            if s.trainings.len() == TRAININGS_KEPT {
                s.trainings.pop_front();
            }
            s.trainings.push_back(card);
        });
    }

    pub fn push_sample(&self, sample: CounterSample) {
        self.update(|s| {
            if s.samples.len() == SAMPLES_KEPT {
                s.samples.pop_front();
            }
            s.samples.push_back(sample);
        });
    }
}

impl BoardState {
    /// Per-second rate of a counter over the samples of the last `span_s` seconds (None with fewer
    /// than two samples in the span or no time between them).
    pub fn rate(&self, span_s: f64, counter: impl Fn(&CounterSample) -> u64) -> Option<f64> {
        let last = self.samples.back()?;
        let first = self.samples.iter().find(|s| s.unix_s >= last.unix_s - span_s)?;
        let dt = last.unix_s - first.unix_s;
        (dt > 0.0).then(|| counter(last).saturating_sub(counter(first)) as f64 / dt)
    }
}
