//! The scripts behind `results/regimes` (its room regimes too) and `results/logged_order_prior` run end to end on a small
//! scale (one seed; the prior's at 1,000 sessions) against the `ultr` built with the tests, and the
//! per-query comparison behind a table of `results/regimes/summary.md` on runs scored by hand, so the
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

/// Writes `files` (name, text) into a new folder and runs `scripts/<script>` on them, in that order,
/// with the tests' Python: its output.
fn python_script_on(script: &str, files: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<std::path::PathBuf> = files
        .iter()
        .map(|(name, text)| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    Command::new(std::env::var("ULTR_PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg(repo.join("scripts").join(script))
        .args(&paths)
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap()
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

/// `scripts/regimes-room.sh` on one seed: a row per regime (3 policies × 2 densities), each with the
/// four rankers' nDCG@10, the combination's weight and its verdict against the better baseline.
#[test]
fn the_room_regimes_script_writes_a_row_per_regime() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    run_script("regimes-room.sh", &[out, "1"]);
    let table = std::fs::read_to_string(dir.path().join("room.md")).unwrap();
    for policy in ["good", "weak", "adversarial"] {
        for density in ["dense", "sparse"] {
            let name = format!("| {policy}-{density}-s1 |");
            let row = table.lines().find(|l| l.starts_with(&name)).unwrap_or_else(|| panic!("no row {name}:\n{table}"));
            assert!(row.contains("κ") && (row.contains("| yes (") || row.contains("| NO (")), "{row}");
            assert!(!row.contains("nan") && !row.contains("no model promoted"), "{row}");
        }
    }
    assert!(table.contains("of 6 runs."), "{table}");
}

/// `scripts/clara2_buckets.py` on two queries worked out by hand: query 1 (no click) has one grade-1
/// document, which run A ranks second (nDCG@10 1/log2(3) = 0.6309) and run B first (1.0); query 2
/// (two clicks) has one grade-2 document, which A ranks first and B second. So the 0–0 bucket holds
/// query 1 at −0.3691 and the 1–9 bucket query 2 at +0.3691, each interval its one value.
#[test]
fn the_click_volume_script_reports_hand_computed_ndcg_differences_per_bucket() {
    let out = python_script_on(
        "clara2_buckets.py",
        &[
            (
                "sessions.jsonl",
                "{\"query_id\":\"1\",\"items\":[{\"doc_id\":\"d1\",\"position\":1,\"clicked\":false}]}\n\
                 {\"query_id\":\"2\",\"items\":[{\"doc_id\":\"d3\",\"position\":1,\"clicked\":true},{\"doc_id\":\"d4\",\"position\":2,\"clicked\":true}]}\n",
            ),
            ("labels.qrels", "1 0 d1 1\n1 0 d2 0\n2 0 d3 2\n2 0 d4 0\n"),
            ("a.txt", "1 Q0 d2 1 0.9 a\n1 Q0 d1 2 0.8 a\n2 Q0 d3 1 0.9 a\n2 Q0 d4 2 0.8 a\n"),
            ("b.txt", "1 Q0 d1 1 0.9 b\n1 Q0 d2 2 0.8 b\n2 Q0 d4 1 0.9 b\n2 Q0 d3 2 0.8 b\n"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("| 0–0 | 1 | 0.6309 | 1.0000 | -0.3691 [-0.3691, -0.3691] |"), "{text}");
    assert!(text.contains("| 1–9 | 1 | 1.0000 | 0.6309 | +0.3691 [+0.3691, +0.3691] |"), "{text}");
}

/// The prior's table has at least two rows holding a digit (its rows per policy; their figures are
/// not checked here).
#[test]
fn the_logged_order_prior_script_writes_a_table_of_at_least_two_rows() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    run_script("logged_order_prior.sh", &[out, "1000", "1"]);
    let table = std::fs::read_to_string(dir.path().join("table.md")).unwrap();
    let rows = table.lines().filter(|l| l.starts_with("| ") && l.chars().any(|c| c.is_ascii_digit()) && !l.starts_with("|---")).count();
    assert!(rows >= 2, "one row per policy expected:\n{table}");
}

/// `scripts/per-query-ndcg.py` (the per-query table of `results/regimes/summary.md`) on two queries
/// whose nDCG@10 is worked out here by hand: query 1 has one grade-1 document, which run A ranks
/// second (nDCG 1/log2(3) = 0.6309) and run B first (1.0); query 2 has one grade-2 document, which
/// A ranks first and B second. So A − B is −0.3691 and +0.3691, the mean 0, the mean without the
/// worst query (−0 + 0.3691) / 2 = +0.1845, and query 1 is listed first.
#[test]
fn the_per_query_script_reports_hand_computed_ndcg_differences() {
    let out = python_script_on(
        "per-query-ndcg.py",
        &[
            ("labels.qrels", "1 0 d1 1\n1 0 d2 0\n2 0 d3 2\n2 0 d4 0\n"),
            ("a.txt", "1 Q0 d2 1 0.9 a\n1 Q0 d1 2 0.8 a\n2 Q0 d3 1 0.9 a\n2 Q0 d4 2 0.8 a\n"),
            ("b.txt", "1 Q0 d1 1 0.9 b\n1 Q0 d2 2 0.8 b\n2 Q0 d4 1 0.9 b\n2 Q0 d3 2 0.8 b\n"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let head = text.lines().next().unwrap_or_default();
    assert!(head.starts_with("2 queries with a relevant document; mean A - B +0.0000; A ahead on 1, behind on 1;"), "{text}");
    assert!(head.ends_with("mean without the worst query +0.1845"), "{text}");
    let worst = text.lines().nth(1).unwrap_or_default();
    assert!(worst.trim_start().starts_with("1  -0.369"), "{text}");
}

/// `scripts/pbm-em.py` (the textbook column of `results/regimes/table.md`) on one query whose outcome
/// is worked out by hand: over ten pages X at position 1 is clicked five times and Y at position 2
/// never, so γ_X > γ_Y and PBM-EM ranks X (grade 1) first, nDCG 1; the naive run given ranks Y first,
/// nDCG 1/log2(3) = 0.6309. So PBM-EM − naive is +0.3691, and with one query every bootstrap
/// resample is that value. Each page lists X again at position 3, clicked: the repeat is dropped as
/// ultr's ingest drops it, so θ has positions 1 and 2 only.
#[test]
fn the_pbm_em_script_reports_a_hand_computed_ndcg_difference_and_drops_repeats() {
    let sessions: String = (0..10)
        .map(|i| {
            format!(
                "{{\"session_id\":\"s{i}\",\"query_id\":\"1\",\"items\":[{{\"doc_id\":\"X\",\"position\":1,\"clicked\":{}}},\
                 {{\"doc_id\":\"Y\",\"position\":2,\"clicked\":false}},{{\"doc_id\":\"X\",\"position\":3,\"clicked\":true}}]}}\n",
                i < 5
            )
        })
        .collect();
    let out = python_script_on(
        "pbm-em.py",
        &[("sessions.jsonl", &sessions), ("labels.qrels", "1 0 X 1\n1 0 Y 0\n"), ("naive.txt", "1 Q0 Y 1 1 n\n1 Q0 X 2 0.5 n\n")],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected = 1.0 - 1.0 / 3f64.log2();
    for key in ["minus_naive_ctr", "low", "high"] {
        assert!((v[key].as_f64().unwrap() - expected).abs() < 1e-9, "{key}: {v}");
    }
    assert_eq!(v["queries"], 1);
    let positions: Vec<&String> = v["theta_over_theta_1"].as_object().unwrap().keys().collect();
    assert_eq!(positions, ["1", "2"], "{v}");
}

/// `scripts/bench-vs-gbdt.sh` at one small cell (α 0.5, 2,000 sessions, seed 1) with the real
/// XGBoost and LightGBM from the tests' venv: the score covers every S5 query with a relevant
/// document (counted here from the LETOR file), each ranker's nDCG@10 lies in (0, 1], the paired
/// interval holds its estimate, and θ's bias RMSE is finite; the table has the cell's row.
#[test]
fn the_gbdt_bench_scores_every_held_out_query_at_one_small_cell() {
    use std::io::BufRead;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let python = std::path::PathBuf::from(std::env::var("ULTR_PYTHON").expect("ULTR_PYTHON: the tests' venv (scripts/test.sh sets it)"));
    let venv = python.parent().and_then(Path::parent).unwrap();
    let out = Command::new("bash")
        .arg(repo.join("scripts/bench-vs-gbdt.sh"))
        .args([dir.path().to_str().unwrap(), "0.5:2000:1"])
        .env("ULTR", env!("CARGO_BIN_EXE_ultr"))
        .env("GBDT_VENV", venv)
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // S5's queries with a document labelled above 0, read independently of the script.
    let file = std::fs::File::open(repo.join("data/mq2008/S5.txt.gz")).unwrap();
    let mut relevant = std::collections::BTreeSet::new();
    for line in std::io::BufReader::new(flate2::read::GzDecoder::new(file)).lines() {
        let line = line.unwrap();
        let mut parts = line.split_whitespace();
        let label: f64 = parts.next().unwrap().parse().unwrap();
        let qid = parts.next().unwrap().trim_start_matches("qid:").to_string();
        if label > 0.0 {
            relevant.insert(qid);
        }
    }
    let score: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("a0.5-n2000-s1/score.json")).unwrap()).unwrap();
    assert_eq!(score["queries"].as_u64().unwrap() as usize, relevant.len(), "{score}");
    for ranker in ["ultr-default", "xgboost_unbiased", "lightgbm_position"] {
        let v = score["ndcg10"][ranker].as_f64().unwrap_or(f64::NAN);
        assert!(v > 0.0 && v <= 1.0, "{ranker}: nDCG@10 {v}");
    }
    let d = &score["minus_xgboost_unbiased"]["ultr-default"];
    let (low, est, high) = (d["low"].as_f64().unwrap(), d["estimate"].as_f64().unwrap(), d["high"].as_f64().unwrap());
    assert!(low <= est && est <= high, "{d}");
    assert!(score["ultr"]["default"]["theta_bias_rmse"].as_f64().unwrap().is_finite(), "{score}");
    let table = std::fs::read_to_string(dir.path().join("table.md")).unwrap();
    assert!(table.lines().any(|l| l.starts_with("| a0.5-n2000-s1 | default |")), "{table}");
}
