//! The scripts behind `results/regimes` and `results/logged_order_prior` run end to end on a small
//! scale (one seed; the prior's at 1,000 sessions) against the `ultr` built with the tests, so the
//! code that makes a committed figure cannot rot. `scripts/clara2.sh` reads a log outside the
//! repository (`../shared/data/clara2`) and is not run here.

use crate::common::OutputWithin;
use std::path::Path;
use std::process::Command;

fn run_script(script: &str, args: &[&str]) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(repo.join("scripts").join(script))
        .args(args)
        .env("ULTR", env!("CARGO_BIN_EXE_ultr"))
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.success(), "{script}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// One row per regime, each with a finite θ, a gate decision and an nDCG@10 difference.
#[test]
fn the_regimes_script_writes_a_row_per_regime_with_finite_theta() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    run_script("regimes.sh", &[out, "1"]);
    let table = std::fs::read_to_string(dir.path().join("table.md")).unwrap();
    for regime in ["dense", "sparse", "strong", "sparse-additive"] {
        let row = table.lines().find(|l| l.starts_with(&format!("| {regime} | 1 |"))).unwrap_or_else(|| panic!("no row for {regime}:\n{table}"));
        assert!(!row.contains("NOT FINITE"), "{row}");
        assert!(row.contains("PROMOTED") || row.contains("REJECTED"), "{row}");
        assert!(!row.contains("nan"), "{row}");
    }
}

/// The prior's table: a row per policy with the model's nDCG@10 with and without the prior.
#[test]
fn the_logged_order_prior_script_writes_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    run_script("logged_order_prior.sh", &[out, "1000", "1"]);
    let table = std::fs::read_to_string(dir.path().join("table.md")).unwrap();
    let rows = table.lines().filter(|l| l.starts_with("| ") && l.chars().any(|c| c.is_ascii_digit()) && !l.starts_with("|---")).count();
    assert!(rows >= 2, "one row per policy expected:\n{table}");
}
