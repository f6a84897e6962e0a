//! The team's own ranking (issue 89): the logged order combined with the clicks ranks at least as
//! well as the better of the logged order and naive click-through on a regime with room above both,
//! and the gate refuses a ranking that the editors' labels put below the logged order.

use crate::common::OutputWithin;
use std::path::Path;
use std::process::Command;

fn ultr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ultr"))
}

/// `scripts/regimes-room.sh`'s simulator: 200 queries of 50 documents, graded relevance with noise no
/// feature carries, a logging ranker of quality `alpha`, 25 results per page, ε-greedy τ = 0.1.
/// Writes the sessions, the truth's grades as qrels, and a pipeline config (`extra` appended).
fn simulate(dir: &Path, alpha: f64, sessions: u64, seed: u64, extra: &str) -> std::path::PathBuf {
    let log = dir.join("sessions.jsonl");
    let truth = dir.join("truth.json");
    let out = ultr()
        .args(["simulate", "--relevance", "mlp", "--noise", "1", "--ranker", "mlp", "--alpha", &alpha.to_string()])
        .args(["--tau", "0.1", "--top-n", "25", "--synthetic-queries", "200", "--synthetic-docs", "50", "--no-features"])
        .args(["--sessions", &sessions.to_string(), "--seed", &seed.to_string(), "--out"])
        .arg(&log)
        .arg("--truth")
        .arg(&truth)
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    let mut qrels = String::new();
    for q in t["queries"].as_array().unwrap() {
        for d in q["docs"].as_array().unwrap() {
            let grade = d["relevance"].as_f64().unwrap().round().clamp(0.0, 4.0) as i64;
            qrels.push_str(&format!("{} 0 {} {grade}\n", q["query_id"].as_str().unwrap(), d["doc_id"].as_str().unwrap()));
        }
    }
    std::fs::write(dir.join("truth.qrels"), qrels).unwrap();
    let config = dir.join("pipeline.toml");
    std::fs::write(
        &config,
        format!(
            "[source.file]\npaths = [{:?}]\n[window]\nsize = \"1m\"\n[train]\ntower = \"embedding\"\nmax_positions = 25\n{extra}",
            log.display().to_string()
        ),
    )
    .unwrap();
    let out = ultr().args(["ingest", "--config"]).arg(&config).arg("--state").arg(dir.join("state")).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    config
}

fn train(dir: &Path, config: &Path) -> (Option<i32>, serde_json::Value) {
    let out =
        ultr().args(["train", "--json", "--config"]).arg(config).arg("--state").arg(dir.join("state")).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert!(out.status.code().is_some_and(|c| c <= 1), "{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code(), serde_json::from_slice(&out.stdout).unwrap())
}

/// On the good-but-imperfect policy (α 0.5), sparse (2,000 sessions), one seed per test: training
/// chooses a weight for the logged order, reports where the clicks move it (every query in a bucket,
/// moved shares within [0, 1]), and the combined ranking's nDCG@10 on the truth's grades, paired over
/// queries, is not below the better of the logged order and naive click-through (95% upper bound ≥
/// 0). Measured by `scripts/regimes-room.sh` on seeds 1–3 (results/regimes/room.md): +0.024…+0.025
/// against naive click-through, lower bounds +0.015…+0.016.
fn the_combination_ranks_at_least_as_well_as_the_better_baseline(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let config = simulate(dir.path(), 0.5, 2_000, seed, "");
    let (code, outcome) = train(dir.path(), &config);
    assert_eq!(code, Some(0), "{}", outcome["decision"]);
    let c = &outcome["fit"]["logged_order_combination"];
    assert!(c.is_object(), "no combination in {}", outcome["fit"]);
    let buckets = c["by_click_volume"].as_array().unwrap();
    let queries: u64 = buckets.iter().map(|b| b["queries"].as_u64().unwrap()).sum();
    assert_eq!(queries, 200, "every query in one bucket: {buckets:?}");
    for b in buckets {
        let moved = b["moved_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&moved) && b["discordant_share"].as_f64().unwrap() <= moved + 1e-12, "{b}");
    }
    let out = ultr()
        .args(["eval", "--json", "--config"])
        .arg(&config)
        .arg("--state")
        .arg(dir.path().join("state"))
        .arg("--qrels")
        .arg(dir.path().join("truth.qrels"))
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j = &serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["judged"];
    let i = j["metrics"].as_array().unwrap().iter().position(|m| m == "nDCG@10").unwrap();
    let ranker = |name: &str| j["rankers"].as_array().unwrap().iter().find(|r| r["ranker"] == name).unwrap_or_else(|| panic!("no {name} in {j}")).clone();
    let (logged, naive, combined) = (ranker("logged"), ranker("naive_ctr"), ranker("combined"));
    let mean = |r: &serde_json::Value| r["mean"][i]["estimate"].as_f64().unwrap();
    let versus = if mean(&logged) >= mean(&naive) { &combined["minus_logged"][i] } else { &combined["minus_naive_ctr"][i] };
    assert!(
        versus["high"].as_f64().unwrap() >= 0.0,
        "combined {:.3} below the better of logged {:.3} and naive CTR {:.3}: {versus}",
        mean(&combined),
        mean(&logged),
        mean(&naive)
    );
}

/// Regression (the first CLARA 2 run): the combined ranking held only the pairs of training and
/// validation sessions, leaving out pairs shown only in the gate's evaluation sessions. On the good
/// regime's log with every tenth session's last document renamed to an id of its own (pairs shown
/// once, a tenth of them in evaluation sessions) it ranks exactly the pairs the logged order ranks.
#[test]
fn the_combined_ranking_ranks_every_pair_the_log_showed() {
    let dir = tempfile::tempdir().unwrap();
    let config = simulate(dir.path(), 0.5, 2_000, 1, "");
    let log = dir.path().join("sessions.jsonl");
    let mut text = String::new();
    for (n, line) in std::fs::read_to_string(&log).unwrap().lines().enumerate() {
        let mut s: serde_json::Value = serde_json::from_str(line).unwrap();
        if n % 10 == 0 {
            let items = s["items"].as_array_mut().unwrap();
            let last = items.iter_mut().max_by_key(|i| i["position"].as_u64().unwrap()).unwrap();
            last["doc_id"] = serde_json::Value::String(format!("once-{n}"));
        }
        text.push_str(&s.to_string());
        text.push('\n');
    }
    std::fs::write(&log, text).unwrap();
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let out =
        ultr().args(["ingest", "--config"]).arg(&config).arg("--state").arg(dir.path().join("state")).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, outcome) = train(dir.path(), &config);
    assert_eq!(code, Some(0), "{}", outcome["decision"]);
    let docs = |ranker: &str| -> std::collections::BTreeSet<(String, String)> {
        let run = dir.path().join(format!("{ranker}.run"));
        let out = ultr()
            .args(["eval", "--config"])
            .arg(&config)
            .arg("--state")
            .arg(dir.path().join("state"))
            .arg("--qrels")
            .arg(dir.path().join("truth.qrels"))
            .arg("--run-out")
            .arg(&run)
            .args(["--run-ranker", ranker])
            .output_within(crate::common::CHILD_DEADLINE)
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(&run)
            .unwrap()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[0].to_string(), f[2].to_string())
            })
            .collect()
    };
    assert_eq!(docs("combined"), docs("logged"), "the combined ranking ranks every pair the logged order ranks");
}

crate::seeded_tests!(the_combination_ranks_at_least_as_well_as_the_better_baseline => the_combination_ranks_at_least_as_well_as_the_better_baseline; seed_1 = 1, seed_2 = 2, seed_3 = 3);

/// The judged gate (`[eval] qrels`): on an adversarial policy's log (α −0.5), labels that follow the
/// logged order exactly (each query's documents graded 4, 3, 2, 1, 0, 0, … by mean logged position)
/// make the clicks' ranking far worse than the logged order: the candidate is not promoted, the
/// reason names the logged order, and the decision records the paired difference below 0. With the
/// truth's grades on the same log the judged gate does not refuse (its difference above 0): the
/// candidate is promoted, or refused for another reason only (this sparse log's embedding tower
/// can fall below position-only on held-out queries, a check that comes first).
#[test]
fn the_gate_refuses_a_ranking_the_labels_put_below_the_logged_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = simulate(dir.path(), -0.5, 2_000, 4, "");
    // Labels from the log itself: mean logged position per (query, document), independent of ultr.
    let mut positions: std::collections::BTreeMap<(String, String), (f64, f64)> = Default::default();
    for line in std::fs::read_to_string(dir.path().join("sessions.jsonl")).unwrap().lines() {
        let s: serde_json::Value = serde_json::from_str(line).unwrap();
        for item in s["items"].as_array().unwrap() {
            let e = positions.entry((s["query_id"].as_str().unwrap().to_string(), item["doc_id"].as_str().unwrap().to_string())).or_default();
            e.0 += item["position"].as_f64().unwrap();
            e.1 += 1.0;
        }
    }
    let mut by_query: std::collections::BTreeMap<String, Vec<(f64, String)>> = Default::default();
    for ((q, d), (sum, n)) in positions {
        by_query.entry(q).or_default().push((sum / n, d));
    }
    let mut qrels = String::new();
    for (q, mut docs) in by_query {
        docs.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (rank, (_, d)) in docs.iter().enumerate() {
            qrels.push_str(&format!("{q} 0 {d} {}\n", 4usize.saturating_sub(rank)));
        }
    }
    std::fs::write(dir.path().join("logged.qrels"), qrels).unwrap();
    for (qrels, refused) in [("logged.qrels", true), ("truth.qrels", false)] {
        let judged = dir.path().join(format!("judged-{qrels}.toml"));
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&judged, format!("{text}[eval]\nqrels = {:?}\n", dir.path().join(qrels).display().to_string())).unwrap();
        let models = dir.path().join(format!("models-{qrels}"));
        let text = std::fs::read_to_string(&judged).unwrap().replace("[train]\n", &format!("[train]\nmodels_dir = {:?}\n", models.display().to_string()));
        std::fs::write(&judged, text).unwrap();
        let (code, outcome) = train(dir.path(), &judged);
        let d = &outcome["decision"];
        let g = &d["judged"];
        assert_eq!(g["refused"], refused, "{qrels}: {d}");
        if refused {
            assert_eq!(code, Some(1), "{d}");
            assert_eq!(d["promoted"], false);
            assert!(d["reason"].as_str().unwrap().contains("below the logged order"), "{d}");
            assert!(g["minus_logged_high"].as_f64().unwrap() < 0.0, "{g}");
        } else {
            assert!(g["minus_logged_low"].as_f64().unwrap() > 0.0, "{g}");
            assert!(!d["reason"].as_str().unwrap().contains("below the logged order"), "{d}");
            assert_eq!(code == Some(0), d["promoted"] == true, "{d}");
        }
        // Without qrels the combination's held-out clicks are recorded beside the logged order alone's.
        let (combined, logged) = (d["logged_order_clicks"][0].as_f64().unwrap(), d["logged_order_clicks"][1].as_f64().unwrap());
        assert!(combined >= logged, "the chosen combination {combined} is below the logged order alone {logged}");
    }
}

/// The premise of `alerting::a_model_ranking_below_the_logged_order_fires_…`, which runs one stream
/// per logging policy: on the shipped demo's simulator (120,000 sessions, about what its first
/// scheduled training sees), its model scored against the truth's grades (`ultr eval --qrels`, the
/// figures the service exports as `ultr_judged_ndcg_difference`) ranks below the logged order
/// beyond the paired 95% interval when the production ranker is the truth's MLP (α = 1), on seeds 7
/// (the demo's), 8 and 9, and below neither baseline when it is mostly fixed noise (α = 0.2), on
/// seed 7. Measured (2026-12-06): at α 1 the upper bounds are −0.0004, −0.0054 and −0.0018 (a thin
/// margin on the demo's own seed); at α 0.2 the model led the logged order by 0.37–0.39 and naive
/// click-through with upper bounds +0.05–+0.06 on all three seeds, so seeds 8 and 9 no longer run
/// α 0.2 (two of the six runs' 140 CPU-s).
#[test]
fn the_demo_model_ranks_below_a_strong_logged_order_and_not_below_a_weak_one() {
    let root = tempfile::tempdir().unwrap();
    let demo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/demo.toml")).unwrap();
    let mut figures = Vec::new();
    for seed in [7, 8, 9] {
        for alpha in if seed == 7 { vec![1.0, 0.2] } else { vec![1.0] } {
            let dir = root.path().join(format!("seed{seed}-alpha{alpha}"));
            std::fs::create_dir_all(&dir).unwrap();
            let text = demo
                .replace("seed = 7\n", &format!("seed = {seed}\n"))
                .replace("sessions = 300000\n", "sessions = 120000\n")
                .replace("sessions_per_second = 2000.0\n", "")
                .replace("tau = 0.3\n", &format!("tau = 0.3\nalpha = {alpha}\n"));
            assert!(
                text.contains(&format!("seed = {seed}\n")) && text.contains("sessions = 120000\n") && !text.contains("sessions_per_second"),
                "the demo config changed shape"
            );
            let config = dir.join("demo.toml");
            std::fs::write(&config, text).unwrap();
            crate::common::write_truth_qrels(&config, &dir.join("judged.qrels"));
            let state = dir.join("state");
            let run = |args: &[&str], extra: &[&Path]| {
                let mut cmd = ultr();
                cmd.args(args);
                for e in extra {
                    cmd.arg(e);
                }
                cmd.arg("--config").arg(&config).arg("--state").arg(&state).current_dir(&dir);
                let out = cmd.output_within(crate::common::CHILD_DEADLINE).unwrap();
                assert!(out.status.code().is_some_and(|c| c <= 1), "ultr {args:?}: {}", String::from_utf8_lossy(&out.stderr));
                out.stdout
            };
            run(&["ingest"], &[]);
            run(&["train", "--json"], &[]);
            let qrels = dir.join("judged.qrels");
            let out = run(&["eval", "--json", "--qrels"], &[&qrels]);
            let j = &serde_json::from_slice::<serde_json::Value>(&out).unwrap()["judged"];
            let i = j["metrics"].as_array().unwrap().iter().position(|m| m == "nDCG@10").unwrap();
            let model = j["rankers"].as_array().unwrap().iter().find(|r| r["ranker"] == "model").unwrap_or_else(|| panic!("no model in {j}")).clone();
            let high = |d: &str| model[d][i]["high"].as_f64().unwrap();
            figures.push((seed, alpha, model["minus_logged"][i]["estimate"].as_f64().unwrap(), high("minus_logged"), high("minus_naive_ctr")));
        }
    }
    eprintln!("(seed, α, model − logged nDCG@10, its 95% upper bound, model − naive CTR upper bound): {figures:.4?}");
    for (seed, alpha, _, vs_logged, vs_naive) in &figures {
        if *alpha == 1.0 {
            assert!(*vs_logged < 0.0, "seed {seed}, α 1: the model is not below the logged order (upper bound {vs_logged:.4})");
        } else {
            assert!(*vs_logged >= 0.0 && *vs_naive >= 0.0, "seed {seed}, α 0.2: the model is below a baseline ({vs_logged:.4}, {vs_naive:.4})");
        }
    }
}
