//! Running totals of an ingest run (records, sessions, impressions, clicks, dead letters by reason).

use datafusion::arrow::array::{Array, BooleanArray};
use serde::Serialize;

use crate::ingest::DecodedBatch;
use crate::session::schema::col;
use crate::sinks::dead_letter::ReasonCounts;

#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestSummary {
    pub records: u64,
    pub sessions: u64,
    pub impressions: u64,
    pub clicks: u64,
    pub dead_letters: ReasonCounts,
    pub feature_dim: Option<usize>,
}

impl IngestSummary {
    pub fn add(&mut self, batch: &DecodedBatch) {
        self.records += batch.records as u64;
        self.sessions += batch.sessions as u64;
        self.impressions += batch.impressions.num_rows() as u64;
        if let Some(clicked) = batch.impressions.column_by_name(col::CLICKED).and_then(|c| c.as_any().downcast_ref::<BooleanArray>()) {
            self.clicks += clicked.true_count() as u64;
        }
        for letter in &batch.dead_letters {
            self.dead_letters.add(letter.reason);
        }
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "records      {}\nsessions     {}\nimpressions  {}\nclicks       {}\ndead letters {}\n",
            self.records,
            self.sessions,
            self.impressions,
            self.clicks,
            self.dead_letters.total()
        );
        for (reason, n) in &self.dead_letters.0 {
            out.push_str(&format!("  {reason:<28} {n}\n"));
        }
        if let Some(d) = self.feature_dim {
            out.push_str(&format!("feature dim  {d}\n"));
        }
        out
    }
}
