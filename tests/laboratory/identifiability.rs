//! Identifiability of the model trained: under a deterministic policy the swap graph falls apart, which
//! leaves an embedding tower unidentified and a feature tower identified through feature overlap;
//! randomization connects it; a rare context value is no node of its own; exit codes gate a scheduler;
//! bad state and config inputs fail with the file and key named and write nothing.

use crate::common::OutputWithin;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use ultr::identify::{components, randomization_advice, GraphReport, Node};

fn ultr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ultr"))
}

fn node(p: u32) -> Node {
    Node { position: p }
}

fn sim_config(dir: &Path, tau: f64, extra: &str) -> PathBuf {
    seeded_config(dir, tau, 3, extra)
}

fn seeded_config(dir: &Path, tau: f64, seed: u64, extra: &str) -> PathBuf {
    let path = dir.join(format!("sim-{tau}-{seed}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"source = "simulator"
batch_records = 2000
[window]
size = "10m"
allowed_lateness = "0s"
[simulator]
relevance = "linear"
sessions = 20000
seed = {seed}
[simulator.synthetic]
queries = 60
docs_per_query = 10
features = 6
[simulator.policy]
ranker = "linear"
tau = {tau}
{extra}"#
        ),
    )
    .unwrap();
    path
}

use crate::common::ultr_ingest as ingest;

fn analyse(config: &Path, state: &Path) -> (i32, serde_json::Value) {
    let out =
        ultr().args(["identifiability", "--json", "--state"]).arg(state).arg("--config").arg(config).output_within(crate::common::CHILD_DEADLINE).unwrap();
    let code = out.status.code().unwrap();
    assert!(code != 2, "{}", String::from_utf8_lossy(&out.stderr));
    (code, serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn deterministic_policy_breaks_the_swap_graph_and_randomization_connects_it() {
    let dir = tempfile::tempdir().unwrap();
    let embedding = "[train]\ntower = \"embedding\"\n";
    let linear = "[train]\ntower = \"linear\"\n";

    let det = sim_config(dir.path(), 0.0, embedding);
    ingest(&det, &dir.path().join("det"));
    let (code, report) = analyse(&det, &dir.path().join("det"));
    assert_eq!(code, 1, "τ = 0 does not identify a per-document tower");
    assert_eq!(report["model"], "embedding");
    assert_eq!(report["identification"], "swaps");
    let swap = &report["swap_graph"];
    assert_eq!(swap["components"].as_array().unwrap().len(), 10, "every position its own component");
    assert_eq!(swap["cut_off_from_position_1"].as_array().unwrap().len(), 9);
    assert_eq!(swap["randomization_advice"].as_array().unwrap().len(), 9, "c − 1 pairs connect c components");
    // Parquet on disk, readable by any Parquet reader.
    assert!(dir.path().join("det/cumulative/propensity.parquet").exists());

    // The same data identifies a linear tower (Hager Thm 4.1): adjacent positions' features overlap.
    let det_linear = sim_config(dir.path(), 0.0, linear);
    let (code, report) = analyse(&det_linear, &dir.path().join("det"));
    assert_eq!(code, 0, "τ = 0 identifies a feature tower: {}", report["union_graph"]);
    assert_eq!(report["identification"], "swaps_or_feature_overlap");
    assert_eq!(report["swap_graph"]["components"].as_array().unwrap().len(), 10);
    assert_eq!(report["union_graph"]["components"].as_array().unwrap().len(), 1);
    let scores = report["overlap_scores"].as_array().unwrap();
    assert_eq!(scores.len(), 9, "one score per adjacent pair, not per pair: {scores:?}");
    for s in scores {
        let (a, b) = (s["a"]["position"].as_u64().unwrap(), s["b"]["position"].as_u64().unwrap());
        assert_eq!(b, a + 1);
        let (overlap, noise) = (s["overlap"].as_f64().unwrap(), s["noise"].as_f64().unwrap());
        assert!((0.0..=1.0).contains(&overlap) && noise > 0.0 && noise < 0.3, "{s}");
    }
    let bottleneck = report["overlap_bottleneck"].as_f64().unwrap();
    let weakest = scores.iter().map(|s| s["overlap"].as_f64().unwrap()).fold(f64::INFINITY, f64::min);
    assert_eq!(bottleneck, weakest, "no swaps: the path's weakest adjacent pair is the bottleneck");
    assert!(bottleneck >= 0.1);

    let rand = sim_config(dir.path(), 0.3, embedding);
    ingest(&rand, &dir.path().join("rand"));
    let (code, report) = analyse(&rand, &dir.path().join("rand"));
    assert_eq!(code, 0, "τ = 0.3 connects every position");
    assert_eq!(report["swap_graph"]["components"].as_array().unwrap().len(), 1);
    assert_eq!(report["overlap_bottleneck"].as_f64().unwrap(), 1.0, "swaps are exact overlap");
}

/// Under a deterministic policy (no swaps), each adjacent pair's overlap score and the bottleneck
/// agree with overlaps computed here from the simulator's own sessions by another classifier
/// (Fisher's discriminant, not the report's logistic regression), averaged over random draws as
/// large as the report's sample: within 3.5 of the report's noise units (its closed-form standard
/// error; the report's is one draw), on seeds 3, 4 and 5. Measured (2026-12-06): the 27 gaps'
/// sd 1.1 noise units, the largest 2.55; 3.5 units is about three of the gaps' sd.
#[test]
fn overlap_scores_agree_with_a_fisher_discriminant_computed_from_the_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let mut worst: f64 = 0.0;
    for seed in [3, 4, 5] {
        let config = seeded_config(dir.path(), 0.0, seed, "[train]\ntower = \"linear\"\n");
        let state = dir.path().join(format!("det-{seed}"));
        ingest(&config, &state);
        let (_, report) = analyse(&config, &state);
        let scores = report["overlap_scores"].as_array().unwrap();
        let n = samples_behind(scores[0]["noise"].as_f64().unwrap());
        let by_hand = overlap_by_hand(&config, n);
        eprintln!("seed {seed}: {n} samples a position");
        assert_eq!(scores.len(), by_hand.len());
        for (s, mine) in scores.iter().zip(&by_hand) {
            let (overlap, noise) = (s["overlap"].as_f64().unwrap(), s["noise"].as_f64().unwrap());
            eprintln!("seed {seed}, positions {}–{}: overlap {overlap:.3} (noise {noise:.3}), by hand {mine:.3}", s["a"]["position"], s["b"]["position"]);
            worst = worst.max((overlap - mine).abs() / noise);
            assert!(
                (overlap - mine).abs() <= 3.5 * noise,
                "seed {seed}, positions {}–{}: overlap {overlap:.3}, by hand {mine:.3}",
                s["a"]["position"],
                s["b"]["position"]
            );
        }
        let bottleneck = report["overlap_bottleneck"].as_f64().unwrap();
        let weakest_by_hand = by_hand.iter().copied().fold(f64::INFINITY, f64::min);
        let noise = scores.iter().map(|s| s["noise"].as_f64().unwrap()).fold(0.0, f64::max);
        assert!((bottleneck - weakest_by_hand).abs() <= 3.5 * noise, "seed {seed}: bottleneck {bottleneck:.3}, by hand {weakest_by_hand:.3}");
    }
    eprintln!("largest gap: {worst:.2} noise units");
}

/// The overlap 1 − |2·AUC − 1| a cross-fitted linear classifier reaches on `n` samples a position,
/// for each adjacent pair of positions (1–2, …, 9–10), computed here from the simulator's sessions
/// of `config`, without `identify/`: the features shown at each position; 40 random draws of `n`
/// each; per draw, each sample split by parity, Fisher's linear discriminant fitted on one half and
/// the other half projected on it, and back; the AUC (Mann–Whitney) of all projections pooled; the
/// draws' overlaps averaged. An out-of-sample AUC on a finite sample is pulled toward ½ (a direction
/// fitted on a few hundred rows is noisy), so the draws are as large as the report's.
fn overlap_by_hand(config: &Path, n: usize) -> Vec<f64> {
    use rand::seq::IndexedRandom;
    use rand::SeedableRng;
    let cfg = ultr::config::PipelineConfig::load(config).unwrap();
    let sim = ultr::simulate::Simulator::new(cfg.simulator.clone()).unwrap();
    let mut features: Vec<Vec<Vec<f64>>> = vec![Vec::new(); 10];
    let mut buf = Vec::new();
    for i in 0..sim.config().sessions {
        sim.session(i, &mut buf);
        let session: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        for item in session["items"].as_array().unwrap() {
            let k = item["position"].as_u64().unwrap() as usize;
            if k <= 10 {
                features[k - 1].push(item["features"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect());
            }
        }
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    const DRAWS: usize = 40;
    (0..9)
        .map(|k| {
            (0..DRAWS)
                .map(|_| {
                    let draw = |rows: &[Vec<f64>], rng: &mut rand_chacha::ChaCha8Rng| -> Vec<Vec<f64>> { rows.choose_multiple(rng, n).cloned().collect() };
                    let (a, b) = (draw(&features[k], &mut rng), draw(&features[k + 1], &mut rng));
                    let half = |rows: &[Vec<f64>], parity: usize| -> Vec<Vec<f64>> { rows.iter().skip(parity).step_by(2).cloned().collect() };
                    let (mut scores_a, mut scores_b) = (Vec::new(), Vec::new());
                    for held_out in 0..2 {
                        let w = fisher_direction(&half(&a, 1 - held_out), &half(&b, 1 - held_out));
                        let project = |x: &Vec<f64>| -> f64 { x.iter().zip(&w).map(|(u, v)| u * v).sum() };
                        scores_a.extend(half(&a, held_out).iter().map(project));
                        scores_b.extend(half(&b, held_out).iter().map(project));
                    }
                    1.0 - (2.0 * mann_whitney_auc(&scores_a, &scores_b) - 1.0).abs()
                })
                .sum::<f64>()
                / DRAWS as f64
        })
        .collect()
}

/// The samples per position behind a noise figure 2·√((2n + 1) / (12 n²)) (equal samples).
fn samples_behind(noise: f64) -> usize {
    ((2.0 + (4.0 + 12.0 * noise * noise).sqrt()) / (6.0 * noise * noise)).round() as usize
}

/// (Σ_a + Σ_b + 1e-6·I)⁻¹ (μ_b − μ_a), solved by Gaussian elimination with partial pivoting.
fn fisher_direction(a: &[Vec<f64>], b: &[Vec<f64>]) -> Vec<f64> {
    let d = a[0].len();
    let mean = |rows: &[Vec<f64>]| -> Vec<f64> { (0..d).map(|j| rows.iter().map(|x| x[j]).sum::<f64>() / rows.len() as f64).collect() };
    let (ma, mb) = (mean(a), mean(b));
    let mut m = vec![vec![0.0; d + 1]; d];
    for (rows, mu) in [(a, &ma), (b, &mb)] {
        for x in rows {
            for i in 0..d {
                for j in 0..d {
                    m[i][j] += (x[i] - mu[i]) * (x[j] - mu[j]) / rows.len() as f64;
                }
            }
        }
    }
    for i in 0..d {
        m[i][i] += 1e-6;
        m[i][d] = mb[i] - ma[i];
    }
    for c in 0..d {
        let p = (c..d).max_by(|&i, &j| m[i][c].abs().total_cmp(&m[j][c].abs())).unwrap();
        m.swap(c, p);
        for r in 0..d {
            if r != c {
                let f = m[r][c] / m[c][c];
                for j in c..=d {
                    m[r][j] -= f * m[c][j];
                }
            }
        }
    }
    (0..d).map(|i| m[i][d] / m[i][i]).collect()
}

/// P(score of b > score of a) + ½ P(tie), by ranks.
fn mann_whitney_auc(a: &[f64], b: &[f64]) -> f64 {
    let mut all: Vec<(f64, bool)> = a.iter().map(|&s| (s, false)).chain(b.iter().map(|&s| (s, true))).collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut rank_sum_b = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let mid_rank = (i + j + 1) as f64 / 2.0;
        rank_sum_b += all[i..j].iter().filter(|(_, is_b)| *is_b).count() as f64 * mid_rank;
        i = j;
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    (rank_sum_b - nb * (nb + 1.0) / 2.0) / (na * nb)
}

/// Connected is not the same as determined. With ε-greedy τ = 0.0005 about 10 of the 20,000 sessions
/// are shuffled: the swap graph still links every position, yet the 50–100 (query, document) pairs
/// seen at two positions leave θ_k − θ_1's widest 95% interval at 3.0–5.9 logits (seeds 3–7
/// measured), wider than `[identifiability] max_theta_interval` (2): WEAKLY IDENTIFIED. τ = 0.3 on
/// the same traffic determines every θ_k to within 0.2. (τ = 0.002 measured 1.8–2.1: the line.)
const SPARSE_TAU: f64 = 0.0005;

fn weak_verdict(tau: f64, seed: u64) -> (bool, bool, f64) {
    let dir = tempfile::tempdir().unwrap();
    let config = seeded_config(dir.path(), tau, seed, "[train]\ntower = \"embedding\"\n");
    ingest(&config, &dir.path().join("state"));
    let (code, report) = analyse(&config, &dir.path().join("state"));
    let widest = report["theta_precision"]["standard_error"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap_or(f64::INFINITY)).fold(0.0, f64::max)
        * 2.0
        * 1.959964;
    eprintln!(
        "τ = {tau}, seed {seed}: identified {}, weakly {}, widest 95% interval {widest:.2}, exit {code}",
        report["identified"], report["weakly_identified"]
    );
    (report["identified"].as_bool().unwrap(), report["weakly_identified"].as_bool().unwrap(), widest)
}

mod a_connected_but_sparse_swap_graph_reads_as_weakly_identified {
    fn check(seed: u64) {
        let (identified, weak, widest) = super::weak_verdict(super::SPARSE_TAU, seed);
        assert!(identified && weak, "τ = {}: connected and too imprecise (widest interval {widest:.2})", super::SPARSE_TAU);
        let (identified, weak, widest) = super::weak_verdict(0.3, seed);
        assert!(identified && !weak && widest < 0.5, "τ = 0.3: widest interval {widest:.2}");
    }
    #[test]
    fn seed_3() {
        check(3)
    }
    #[test]
    fn seed_4() {
        check(4)
    }
    #[test]
    fn seed_5() {
        check(5)
    }
}

#[test]
fn components_and_cheapest_advice() {
    let nodes: BTreeSet<Node> = (1..=6).map(node).collect();
    let edges = vec![(node(1), node(2)), (node(2), node(3)), (node(5), node(6))];
    let comps = components(&nodes, &edges);
    assert_eq!(comps, vec![vec![node(1), node(2), node(3)], vec![node(4)], vec![node(5), node(6)]]);
    let advice = randomization_advice(&comps);
    assert_eq!(advice, vec![(node(3), node(4)), (node(4), node(5))]);
    let report = GraphReport::build(&nodes, &edges);
    assert_eq!(report.cut_off_from_position_1, vec![node(4), node(5), node(6)]);
    // With the advice applied, the graph is connected.
    let mut all = edges.clone();
    all.extend(advice);
    assert_eq!(components(&nodes, &all).len(), 1);
}

/// One session in 10,000 carries a context value nobody else has, on a query nobody else has: its
/// impressions are no bias configuration of their own (the model has θ_k, not θ_{k,context}), so the
/// data stay identified. Nodes were (position, context) before: the rare session made two isolated nodes.
#[test]
fn a_rare_context_value_does_not_make_the_data_unidentified() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("ctx.jsonl");
    let mut lines = Vec::new();
    for i in 0..10_000 {
        let (query, device, a, b) = match i {
            5_000 => ("q-rare", "fridge", "e1", "e2"),
            // Half the sessions swap the two documents: positions 1 and 2 are linked.
            _ if i % 2 == 0 => ("q", "web", "d2", "d1"),
            _ => ("q", "web", "d1", "d2"),
        };
        lines.push(format!(
            r#"{{"schema_version":1,"session_id":"s{i}","query_id":"{query}","event_time":{},"policy_id":"p","context":{{"device":"{device}"}},"items":[{{"doc_id":"{a}","position":1,"clicked":false}},{{"doc_id":"{b}","position":2,"clicked":true}}]}}"#,
            1_000 + i * 10
        ));
    }
    std::fs::write(&data, lines.join("\n")).unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(&config, format!("[source.file]\npaths = [{:?}]\n[window]\nsize = \"1m\"\n[train]\ntower = \"embedding\"\n", data.display().to_string()))
        .unwrap();
    let state = dir.path().join("state");
    ingest(&config, &state);
    let (code, report) = analyse(&config, &state);
    assert_eq!(report["swap_graph"]["nodes"].as_u64().unwrap(), 2, "positions are the nodes: {report}");
    assert_eq!(report["swap_graph"]["components"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(code, 0, "identified");
}

#[test]
fn bad_inputs_name_the_file_and_key_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cases = [
        ("[window]\nsize = \"1h\"\nsizee = 3\n", "sizee"),
        ("[window]\nsize = \"0s\"\n", "window.size"),
        ("[window]\nsize = \"1h\"\nslide = \"7m\"\n", "window.slide"),
        ("[window]\nallowed_lateness = \"-5m\"\n", "window.allowed_lateness"),
        ("[state]\nlookback = \"forever\"\n", "state.lookback"),
        ("[identifiability]\nidentified_by = \"swaps\"\n", "identifiability.identified_by"),
        ("[identifiability]\nmin_overlap_score = 1.5\n", "identifiability.min_overlap_score"),
    ];
    for (body, key) in cases {
        let config = dir.path().join("bad.toml");
        std::fs::write(&config, format!("source = \"simulator\"\n[simulator]\nrelevance = \"linear\"\n{body}")).unwrap();
        let out = ultr().args(["ingest", "--config"]).arg(&config).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2));
        assert!(err.contains("bad.toml") && err.contains(key), "{key}: {err}");
        assert!(!state.exists(), "a config error must write no state");
    }

    // A foreign directory is refused.
    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let config = sim_config(dir.path(), 0.0, "");
    let out = ultr().args(["ingest", "--config"]).arg(&config).arg("--state").arg(&foreign).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an ultr state directory"));

    // A manifest from another source is refused, naming the manifest and the key.
    ingest(&config, &state);
    let other = dir.path().join("other.toml");
    std::fs::write(&other, std::fs::read_to_string(&config).unwrap().replace("seed = 3", "seed = 4")).unwrap();
    let before = std::fs::read(state.join("manifest.json")).unwrap();
    let out = ultr().args(["ingest", "--config"]).arg(&other).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("manifest.json") && err.contains("`source`"), "{err}");
    assert_eq!(std::fs::read(state.join("manifest.json")).unwrap(), before);

    // An unreadable state directory is exit status 2 for the scheduler.
    let out = ultr().args(["identifiability", "--state"]).arg(dir.path().join("missing")).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert_eq!(out.status.code(), Some(2));
    // A corrupt manifest names the file.
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("manifest.json"), "{\"format\": \"something-else\"}").unwrap();
    let out = ultr().args(["identifiability", "--state"]).arg(&broken).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("manifest.json"));
}

/// The state keeps the lookback horizon, not the whole history: old windows' files are deleted.
#[test]
fn windows_beyond_the_retention_horizon_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    // 20,000 sessions 100 ms apart: 2000 s, four 10-minute windows; keep 20 minutes.
    let config = sim_config(dir.path(), 0.3, "[state]\nlookback = \"20m\"\n");
    let state = dir.path().join("state");
    ingest(&config, &state);
    let manifest = ultr::state::read_manifest(&state).unwrap();
    let ends: Vec<i64> = manifest.windows.iter().map(|w| w.end_ms).collect();
    // Retention is measured from the event watermark (which one outlier event cannot drag
    // forward): a window survives while it ends within 20 minutes of it.
    let watermark = manifest.operator.event_watermark.expect("recorded");
    let cutoff = watermark - 20 * 60_000;
    assert!(ends.iter().all(|e| *e > cutoff), "{ends:?} vs cutoff {cutoff}");
    assert_eq!(manifest.operator.counters.windows_closed, 4);
    let first_end = ends.iter().min().unwrap() - 10 * 60_000;
    assert!(first_end <= cutoff, "the dropped window ended before the cutoff");
    assert!(ends.len() < 4, "at least the oldest window was dropped: {ends:?}");
    let dirs = std::fs::read_dir(state.join("windows")).unwrap().count();
    assert_eq!(dirs, ends.len(), "dropped windows' folders are deleted");
}
