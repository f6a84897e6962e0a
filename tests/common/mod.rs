//! Helpers shared by the integration tests: locating the shared LTR data and collecting batches.
#![allow(dead_code)]

use std::path::PathBuf;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float32Type, Float64Type, TimestampMillisecondType, UInt32Type};
use datafusion::arrow::record_batch::RecordBatch;
use ultr::ingest::Ingest;
use ultr::sinks::dead_letter::DeadLetterSink;
use ultr::sources::RecordSource;

/// `shared/data` beside the repository (CI clones with shared/ beside it), or `$ULTR_DATA_DIR`.
pub fn data_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("ULTR_DATA_DIR") {
        return PathBuf::from(dir);
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for base in [here.join("../shared/data"), here.join("shared/data"), PathBuf::from("/work/shared/data")] {
        if base.join("mq2008").is_dir() {
            return base;
        }
    }
    panic!("LTR data not found: set ULTR_DATA_DIR to the folder holding mq2008/ and lightgbm-rank/");
}

pub fn mq2008_files() -> Vec<PathBuf> {
    (1..=5).map(|i| data_dir().join(format!("mq2008/S{i}.txt"))).collect()
}

/// Drains an ingest, returning its impression batches; dead letters go to `dead`.
pub fn collect<S: RecordSource>(ingest: &mut Ingest<S>, dead: &mut DeadLetterSink) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    ingest.drain(dead, |b| out.push(b.impressions)).expect("ingest");
    out
}

/// One impression row as comparable text, every column included.
pub fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let s = |i: usize| b.column(i).as_string::<i32>();
        let (sid, qid, pid, ctx, doc) = (s(0), s(1), s(3), s(4), s(5));
        let time = b.column(2).as_primitive::<TimestampMillisecondType>();
        let pos = b.column(6).as_primitive::<UInt32Type>();
        let clicked = b.column(7).as_boolean();
        let n = b.column(8).as_primitive::<UInt32Type>();
        let feats = b.column(9).as_list::<i32>();
        let bias = b.column(10).as_list::<i32>();
        let prop = b.column(11).as_primitive::<Float64Type>();
        let list = |l: &datafusion::arrow::array::ListArray, i: usize| -> String {
            if l.is_null(i) {
                return "null".into();
            }
            let v = l.value(i);
            let v = v.as_primitive::<Float32Type>();
            v.values().iter().map(|x| x.to_bits().to_string()).collect::<Vec<_>>().join(",")
        };
        for i in 0..b.num_rows() {
            out.push(format!(
                "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
                sid.value(i),
                qid.value(i),
                time.value(i),
                pid.value(i),
                if ctx.is_null(i) { "null" } else { ctx.value(i) },
                doc.value(i),
                pos.value(i),
                clicked.value(i),
                n.value(i),
                list(feats, i),
                list(bias, i),
                if prop.is_null(i) { "null".to_string() } else { prop.value(i).to_string() },
            ));
        }
    }
    out
}
