//! Progress bars for long commands (`ingest`, `train`, `experiment`): a rate and an ETA on stderr
//! when it is a terminal, nothing at all in CI, pipes and log files.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `len` units (with an ETA), or a spinner with a rate when the total is unknown; hidden
/// unless stderr is a terminal.
pub fn bar(len: Option<u64>, unit: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match len {
        Some(n) => (ProgressBar::new(n), format!("{{elapsed_precise}} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit}  {{per_sec}}  ETA {{eta}}  {{msg}}")),
        None => (ProgressBar::new_spinner(), format!("{{spinner}} {{elapsed_precise}} {{human_pos}} {unit}  {{per_sec}}  {{msg}}")),
    };
    bar.set_style(ProgressStyle::with_template(&template).expect("valid template").progress_chars("=> "));
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// Records in `paths`, estimated from their total size and the newline density of the first MiB
/// (exact when the files fit in it), for an ingest's ETA without a second pass over the data.
pub fn estimate_records(paths: &[std::path::PathBuf]) -> Option<u64> {
    use std::io::Read;
    let total: u64 = paths.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
    let first = paths.first()?;
    let mut sample = Vec::new();
    std::fs::File::open(first).ok()?.take(1 << 20).read_to_end(&mut sample).ok()?;
    let lines = sample.iter().filter(|b| **b == b'\n').count() as u64;
    if lines == 0 || sample.is_empty() {
        return None;
    }
    Some((total as f64 * lines as f64 / sample.len() as f64).round() as u64)
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    pub fn a_file_that_fits_the_sample_is_counted_exactly_and_a_longer_one_estimated() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("a.jsonl");
        std::fs::write(&small, "{}\n{\"x\":1}\n{}\n").unwrap();
        assert_eq!(super::estimate_records(std::slice::from_ref(&small)), Some(3));
        let big = dir.path().join("b.jsonl");
        std::fs::write(&big, "0123456789abcde\n".repeat(200_000)).unwrap(); // 3.2 MB, 16-byte lines
                                                                            // 200,003 lines; the first MiB says 16 bytes a line for all 3,200,014 bytes.
        assert_eq!(super::estimate_records(&[big, small]), Some(200_001));
        // Piped or redirected stderr (as under `cargo test`) gets no bar.
        assert!(super::bar(Some(10), "records").is_hidden() || std::io::IsTerminal::is_terminal(&std::io::stderr()));
    }
}
