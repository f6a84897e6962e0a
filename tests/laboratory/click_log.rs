//! A released click log (the Yandex relevance-prediction layout of CLARA 2 and PyClick) through
//! `ultr import`, `ultr ingest`, `ultr train` and `ultr eval --qrels`: every click lands on the page a
//! direct reading of the generated log says, every imported session passes the contract, bad lines
//! are dead-lettered with their reason, and the judged figures equal trec_eval's (pytrec_eval, from
//! PyPI, installed by scripts/test.sh) to 1e-6. The log and the qrels are written here.

use crate::common::OutputWithin;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::{Rng, SeedableRng};

fn ultr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ultr"))
}

fn python() -> String {
    std::env::var("ULTR_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// What the generator knows about the log it wrote.
struct Log {
    lines: Vec<String>,
    /// Per page (its 1-based line): session id, query, URLs shown, URLs clicked.
    pages: BTreeMap<usize, (u64, String, Vec<String>, BTreeSet<String>)>,
    /// Per (query, URL): the editors' grade.
    grades: BTreeMap<(String, String), i64>,
    malformed: usize,
    clicks_without_page: usize,
}

/// `sessions` searches over `queries` queries of 8 URLs each. The production ranker orders a query's
/// URLs by grade plus noise and shows 6; clicks follow a position-based model (examination 1/k,
/// attractiveness by grade). A third of the sessions re-issue their query or search another, and
/// some of their clicks come after the later page, on a URL only the earlier page showed.
fn synthetic_log(seed: u64, sessions: u64, queries: u32) -> Log {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut grades = BTreeMap::new();
    for q in 0..queries {
        for d in 0..8 {
            grades.insert((format!("{}", 1000 + q), format!("{}", 50_000 + q * 100 + d)), rng.random_range(0..5i64));
        }
    }
    let attractive = [0.05, 0.2, 0.4, 0.7, 0.9];
    let mut log = Log { lines: Vec::new(), pages: BTreeMap::new(), grades, malformed: 0, clicks_without_page: 0 };
    let mut time = 0u64;
    for s in 0..sessions {
        if s % 97 == 13 {
            log.lines.push(format!("{s}\t{time}\tQ\t1000\t0.0"));
            log.malformed += 1;
            log.lines.push(format!("{s}\tsoon\tC\t50000"));
            log.malformed += 1;
        }
        if s % 131 == 7 {
            // A session that opens with a click.
            log.lines.push(format!("{s}\t{time}\tC\t99999\t\t\t"));
            log.clicks_without_page += 1;
        }
        let n_pages = if rng.random_bool(0.33) { 2 } else { 1 };
        let mut shown: Vec<(usize, Vec<String>)> = Vec::new();
        let mut pending: Vec<String> = Vec::new();
        for p in 0..n_pages {
            let q = rng.random_range(0..queries);
            let query = format!("{}", 1000 + q);
            let mut docs: Vec<(f64, String, i64)> = (0..8)
                .map(|d| {
                    let url = format!("{}", 50_000 + q * 100 + d);
                    let g = log.grades[&(query.clone(), url.clone())];
                    (g as f64 + 1.5 * rng.random::<f64>() * 2.0 - 1.5, url, g)
                })
                .collect();
            docs.sort_by(|a, b| b.0.total_cmp(&a.0));
            let urls: Vec<String> = docs.iter().take(6).map(|d| d.1.clone()).collect();
            time += rng.random_range(1..5_000);
            log.lines.push(format!("{s}\t{time}\tQ\t{query}\t0.0\t{}", urls.join("\t")));
            let line = log.lines.len();
            log.pages.insert(line, (s, query.clone(), urls.clone(), BTreeSet::new()));
            // Clicks held back on the first page of two come after the second page.
            for (k, d) in docs.iter().take(6).enumerate() {
                if rng.random_bool(attractive[d.2 as usize] / (k + 1) as f64) {
                    if p == 0 && n_pages == 2 && rng.random_bool(0.5) {
                        pending.push(d.1.clone());
                    } else {
                        time += rng.random_range(1..3_000);
                        log.lines.push(format!("{s}\t{time}\tC\t{}", d.1));
                        click(&mut log.pages, &shown, line, &urls, &d.1);
                    }
                }
            }
            shown.push((line, urls));
            if p == 1 {
                for url in pending.drain(..) {
                    time += rng.random_range(1..3_000);
                    log.lines.push(format!("{s}\t{time}\tC\t{url}"));
                    let (line, urls) = shown.last().unwrap().clone();
                    click(&mut log.pages, &shown[..shown.len() - 1], line, &urls, &url);
                }
            }
        }
        time += rng.random_range(1..20_000);
    }
    log
}

/// The latest page of the session that showed `url`: `current` if it did, else the earlier ones.
fn click(
    pages: &mut BTreeMap<usize, (u64, String, Vec<String>, BTreeSet<String>)>,
    earlier: &[(usize, Vec<String>)],
    current: usize,
    current_urls: &[String],
    url: &str,
) {
    let page = if current_urls.iter().any(|u| u == url) {
        Some(current)
    } else {
        earlier.iter().rev().find(|(_, urls)| urls.iter().any(|u| u == url)).map(|(l, _)| *l)
    };
    pages.get_mut(&page.expect("the generator clicks shown URLs")).unwrap().3.insert(url.to_string());
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert!(out.status.success(), "{cmd:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn import(dir: &Path, log: &Log) -> (PathBuf, serde_json::Value, PathBuf) {
    let log_path = dir.join("search.log");
    std::fs::write(&log_path, log.lines.join("\n") + "\n").unwrap();
    let out = dir.join("sessions.jsonl");
    let dead = dir.join("import-dead.jsonl");
    let summary =
        run(ultr().arg("import").arg(&log_path).args(["--base-time", "2026-01-01T00:00:00Z", "--json", "--out"]).arg(&out).arg("--dead-letter").arg(&dead));
    (out, serde_json::from_str(&summary).unwrap(), dead)
}

#[test]
fn import_puts_each_click_on_the_latest_page_that_showed_it_and_refuses_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log = synthetic_log(3, 1500, 30);
    let (out, summary, dead) = import(dir.path(), &log);
    let sessions: Vec<serde_json::Value> = std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(sessions.len(), log.pages.len());
    let mut clicks = 0;
    for s in &sessions {
        let id = s["session_id"].as_str().unwrap();
        let (sid, line) = id.split_once('/').unwrap();
        let (want_sid, query, urls, clicked) = &log.pages[&line.parse::<usize>().unwrap()];
        assert_eq!(sid, want_sid.to_string());
        assert_eq!(s["query_id"], query.as_str());
        let items = s["items"].as_array().unwrap();
        let got: Vec<(&str, bool)> = items.iter().map(|i| (i["doc_id"].as_str().unwrap(), i["clicked"].as_bool().unwrap())).collect();
        let want: Vec<(&str, bool)> = urls.iter().map(|u| (u.as_str(), clicked.contains(u))).collect();
        assert_eq!(got, want, "page {id}");
        assert!(items.iter().enumerate().all(|(k, i)| i["position"] == k as u64 + 1));
        clicks += clicked.len();
    }
    assert!(clicks > 300, "the log must click: {clicks}");
    assert_eq!(summary["sessions"], log.pages.len() as u64);
    assert_eq!(summary["clicks"], clicks as u64);
    assert_eq!(summary["lines"], log.lines.len() as u64);
    assert_eq!(summary["refused"]["malformed_log_line"], log.malformed as u64);
    assert_eq!(summary["refused"]["click_without_page"], log.clicks_without_page as u64);
    let letters: Vec<serde_json::Value> = std::fs::read_to_string(&dead).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(letters.len(), log.malformed + log.clicks_without_page);
    assert!(letters.iter().all(|l| l["detail"].as_str().unwrap().starts_with("line ") && !l["payload"].as_str().unwrap().is_empty()));
    // Every imported session passes the contract.
    let decoded: serde_json::Value =
        serde_json::from_str(&run(ultr().arg("decode").arg(&out).arg("--dead-letter").arg(dir.path().join("decode-dead.jsonl")).arg("--json"))).unwrap();
    assert_eq!(decoded["sessions"], log.pages.len() as u64);
    assert_eq!(decoded["clicks"], clicks as u64);
    assert_eq!(decoded["dead_letters"], serde_json::json!({}));
}

/// Regression (issue 57: `ultr import` wrote its dead letters by hand, uncapped, with non-UTF-8
/// lines stored lossily and hashed after conversion): a line that is not UTF-8 and a line longer
/// than the dead-letter cap (256 KiB) are refused into dead letters that carry the log's own bytes
/// (base64 for the first; the first 256 KiB and `truncated` for the second), the whole line's
/// length, and the SHA-256 of its original bytes (computed here with `sha2`); the valid page imports.
#[test]
fn import_dead_letters_keep_the_original_bytes_capped_with_their_hash() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let page = b"1\t0\tQ\t11\t0\ta\tb".to_vec();
    let not_utf8 = b"1\t1\tQ\t12\t0\t\xff\xfe\tz".to_vec();
    let long = [b"1\t2\tX\t".to_vec(), vec![b'y'; 300 << 10]].concat();
    let log = dir.path().join("search.log");
    std::fs::write(&log, [page.clone(), not_utf8.clone(), long.clone(), Vec::new()].join(&b'\n')).unwrap();
    let (out, dead) = (dir.path().join("sessions.jsonl"), dir.path().join("import-dead.jsonl"));
    let summary: serde_json::Value = serde_json::from_str(&run(ultr()
        .arg("import")
        .arg(&log)
        .args(["--base-time", "2026-01-01T00:00:00Z", "--json", "--out"])
        .arg(&out)
        .arg("--dead-letter")
        .arg(&dead)))
    .unwrap();
    assert_eq!((summary["sessions"].as_u64(), summary["refused"]["malformed_log_line"].as_u64()), (Some(1), Some(2)));
    let letters: Vec<serde_json::Value> = std::fs::read_to_string(&dead).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(letters.len(), 2);
    let sha = |b: &[u8]| sha2::Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect::<String>();
    let first = &letters[0];
    assert_eq!(first["offset"].as_u64(), Some(page.len() as u64 + 1));
    assert!(first["payload"].is_null(), "a non-UTF-8 line is not stored as text: {first}");
    let decoded = ultr::sinks::dead_letter::read_dead_letters(&dead).unwrap()[0].original_bytes().unwrap();
    assert_eq!(decoded, not_utf8);
    assert_eq!((first["payload_bytes"].as_u64(), first["payload_sha256"].as_str()), (Some(not_utf8.len() as u64), Some(sha(&not_utf8).as_str())));
    let second = &letters[1];
    assert_eq!(second["offset"].as_u64(), Some((page.len() + not_utf8.len() + 2) as u64));
    assert_eq!(second["truncated"], true);
    assert_eq!(second["payload"].as_str().unwrap().as_bytes(), &long[..256 << 10]);
    assert_eq!((second["payload_bytes"].as_u64(), second["payload_sha256"].as_str()), (Some(long.len() as u64), Some(sha(&long).as_str())));
}

/// The figures `ultr eval --qrels` reports for `ranker`, by metric.
fn means(report: &serde_json::Value, ranker: &str) -> BTreeMap<String, f64> {
    let metrics = report["judged"]["metrics"].as_array().unwrap();
    let r = report["judged"]["rankers"].as_array().unwrap().iter().find(|r| r["ranker"] == ranker).unwrap_or_else(|| panic!("{ranker} in {report}"));
    metrics.iter().zip(r["mean"].as_array().unwrap()).map(|(m, v)| (m.as_str().unwrap().to_string(), v["estimate"].as_f64().unwrap())).collect()
}

#[test]
fn judged_evaluation_of_an_imported_log_equals_trec_eval() {
    let dir = tempfile::tempdir().unwrap();
    let log = synthetic_log(11, 3000, 40);
    let (sessions, _, _) = import(dir.path(), &log);
    // Editors judged most pairs, not all: every fifth (query, URL) is unjudged.
    let qrels = dir.path().join("judged.qrels");
    let lines: Vec<String> = log.grades.iter().enumerate().filter(|(i, _)| i % 5 != 4).map(|(_, ((q, d), g))| format!("{q} 0 {d} {g}")).collect();
    std::fs::write(&qrels, lines.join("\n") + "\n").unwrap();
    let config = dir.path().join("clicklog.toml");
    std::fs::write(
        &config,
        format!(
            "[source.file]\npaths = [{:?}]\n[window]\nsize = \"10m\"\n[train]\ntower = \"embedding\"\nmax_positions = 6\nmax_epochs = 20\n[train.ips]\nenabled = false\n",
            sessions.display().to_string()
        ),
    )
    .unwrap();
    let state = dir.path().join("state");
    run(ultr().args(["ingest", "--config"]).arg(&config).arg("--state").arg(&state));
    let out = ultr().args(["train", "--config"]).arg(&config).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert_eq!(out.status.code(), Some(0), "the first model is promoted: {}", String::from_utf8_lossy(&out.stderr));
    for unjudged in ["zero", "drop"] {
        for ranker in ["model", "logged", "naive_ctr"] {
            let run_file = dir.path().join(format!("{ranker}-{unjudged}.run"));
            let report: serde_json::Value = serde_json::from_str(&run(ultr()
                .args(["eval", "--json", "--bootstrap", "200", "--unjudged", unjudged, "--run-ranker", ranker, "--config"])
                .arg(&config)
                .arg("--state")
                .arg(&state)
                .arg("--qrels")
                .arg(&qrels)
                .arg("--run-out")
                .arg(&run_file)))
            .unwrap();
            let ours = means(&report, ranker);
            let theirs: serde_json::Value = serde_json::from_str(&run(Command::new(python())
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/trec_parity.py"))
                .arg(&qrels)
                .arg(&run_file)
                .arg(unjudged)))
            .unwrap();
            assert_eq!(report["judged"]["queries"], theirs["queries"], "{ranker}, unjudged {unjudged}: the same queries");
            assert!(theirs["queries"].as_u64().unwrap() >= 35);
            for k in [1, 3, 5, 10] {
                let m = format!("nDCG@{k}");
                let (a, b) = (ours[&m], theirs[&m].as_f64().unwrap());
                assert!((a - b).abs() < 1e-6, "{ranker}, unjudged {unjudged}, {m}: ultr {a} vs trec_eval {b}");
            }
            if ranker == "model" {
                let judged = &report["judged"];
                assert!(judged["unjudged_documents"].as_u64().unwrap() > 0 && judged["judged_documents"].as_u64().unwrap() > 0);
                // Every ranker is paired against the logged order on every query.
                for r in judged["rankers"].as_array().unwrap() {
                    let n = r["wins"].as_u64().unwrap() + r["ties"].as_u64().unwrap() + r["losses"].as_u64().unwrap();
                    assert_eq!(n, judged["queries"].as_u64().unwrap());
                    let i = &r["minus_naive_ctr"][3];
                    assert!(
                        i["low"].as_f64().unwrap() <= i["estimate"].as_f64().unwrap() && i["estimate"].as_f64().unwrap() <= i["high"].as_f64().unwrap(),
                        "{r}"
                    );
                }
            }
        }
    }
}
