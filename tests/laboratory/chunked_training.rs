//! Training past `[train] memory_budget`: a horizon spilled to chunks on disk holds exactly the rows
//! the in-memory path holds (each once), the gate's loss summed over chunks equals the in-memory
//! loss, a fit that streams the chunks every epoch recovers the simulator's θ like the in-memory fit
//! (within seed noise), and `train_from_state` runs end to end on a budget far below the data, its
//! gate's trivial baselines equal to a recount from the in-memory rows.

use std::collections::BTreeMap;
use std::path::Path;

use ultr::config::PipelineConfig;
use ultr::simulate::truth_theta;
use ultr::simulate::Simulator;
use ultr::train::chunks::{load_training_data, ExampleChunks, TrainingData};
use ultr::train::config::{AggregatedEpoch, TrainConfig};
use ultr::train::data::{load_from_state, Examples, Horizon, Split};
use ultr::train::fit::{fit, fit_chunks};
use ultr::train::{evaluation_losses, spill_dir, train_from_state, TrainRequest};

fn config(extra: &str) -> PipelineConfig {
    let text = format!(
        "source = \"simulator\"\n[simulator]\nrelevance = \"linear\"\nsessions = 30000\nseed = 5\ninterval_ms = 1000\n[simulator.policy]\ntau = 0.3\n\
         [simulator.synthetic]\nqueries = 200\ndocs_per_query = 10\nfeatures = 8\n[window]\nsize = \"1h\"\n[train]\ntower = \"linear\"\nmax_epochs = 30\n{extra}"
    );
    PipelineConfig::parse(&text, "test").unwrap()
}

/// Every row as a comparable key: (query, doc, position, split, features' bits) → (impressions, clicks, π's bits).
fn rows(ex: &Examples) -> BTreeMap<(String, String, u32, Split, Vec<u32>), (u32, u32, u64)> {
    let mut out = BTreeMap::new();
    for s in &ex.sessions {
        for r in &ex.rows[s.start..s.start + s.len] {
            let (q, d) = ex.qd_keys[r.qd as usize].clone();
            let features = ex.doc_features(r.doc).iter().map(|v| v.to_bits()).collect();
            let previous = out.insert((q, d, r.position, s.split.unwrap(), features), (r.impressions, r.clicks, r.propensity.to_bits()));
            assert!(previous.is_none(), "a key appears twice");
        }
    }
    out
}

fn load(state: &Path, config: &PipelineConfig, budget: usize) -> TrainingData {
    let manifest = ultr::state::read_manifest(state).unwrap();
    let lookback = config.state.lookback_ms();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(load_training_data(
        &ultr::context::PipelineContext::default(),
        state,
        &manifest,
        lookback,
        Horizon::Lookback(lookback),
        50,
        &Default::default(),
        budget,
        &spill_dir(state),
    ))
    .unwrap()
}

#[test]
fn a_spilled_horizon_trains_like_the_in_memory_one() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cfg = config("");
    ultr::pipeline::run_to_state(&cfg, &state, &mut ultr::pipeline::NoObserver).unwrap();
    let manifest = ultr::state::read_manifest(&state).unwrap();
    assert!(manifest.windows.len() >= 8, "a horizon of several windows: {}", manifest.windows.len());

    // Within budget: one pass, in memory, the same examples `load_from_state` builds.
    let TrainingData::InMemory(all) = load(&state, &cfg, usize::MAX) else { panic!("a generous budget keeps the examples in memory") };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lookback = cfg.state.lookback_ms();
    let direct = rt
        .block_on(load_from_state(
            &ultr::context::PipelineContext::default(),
            &state,
            &manifest,
            lookback,
            Horizon::Lookback(lookback),
            50,
            &Default::default(),
        ))
        .unwrap();
    assert_eq!(all.rows, direct.rows);
    assert_eq!(all.docs, direct.docs);

    // A fifth of the examples' size: chunks on disk, every row in exactly one of them.
    let budget = all.approx_bytes() / 5;
    let data = load(&state, &cfg, budget);
    let TrainingData::Spilled(spilled) = &data else { panic!("a budget of {budget} bytes must spill {} bytes", all.approx_bytes()) };
    assert!(spilled.chunk_count(Split::Training) >= 4, "{} training chunks", spilled.chunk_count(Split::Training));
    assert!(spilled.chunk_count(Split::Validation) >= 1 && spilled.chunk_count(Split::Evaluation) >= 1);
    let mut union = BTreeMap::new();
    let mut pieces: Vec<(Examples, Split)> = Vec::new();
    for split in Split::ALL {
        for i in 0..spilled.chunk_count(split) {
            pieces.push((spilled.load_chunk(split, i).unwrap(), split));
        }
    }
    for (chunk, split) in &pieces {
        assert!(chunk.sessions.iter().all(|s| s.split == Some(*split)), "a chunk holds one split");
        // The budget, plus at most one slice of rows past it.
        let slack = 1024 * (all.approx_bytes() / all.rows.len()) * 4;
        assert!(chunk.approx_bytes() <= budget + slack, "chunk of {} bytes for a budget of {budget}", chunk.approx_bytes());
        for (key, value) in rows(chunk) {
            assert!(union.insert(key, value).is_none(), "a row in two chunks");
        }
    }
    assert_eq!(union, rows(&all), "the chunks hold exactly the in-memory rows");

    // The gate's loss of a model, summed over evaluation chunks, is the in-memory loss.
    let pipeline = config("");
    let (model, _) = fit(&all, &TrainConfig { max_epochs: 2, ..pipeline.train.clone() }, None, false).unwrap();
    let in_memory = evaluation_losses(&[&model], &TrainingData::InMemory(all.clone()), &pipeline.train).unwrap().remove(0).unwrap();
    let chunked = evaluation_losses(&[&model], &data, &pipeline.train).unwrap().remove(0).unwrap();
    assert!((in_memory - chunked).abs() <= 1e-6 * in_memory, "evaluation loss in memory {in_memory} vs over chunks {chunked}");

    // Fits: in memory (two seeds, for the noise) and streaming the chunks every epoch.
    let sim = Simulator::new(cfg.simulator.clone()).unwrap();
    let truth = truth_theta(sim.truth());
    let theta = |t: &ultr::train::artefact::Trained| t.position_bias()[..6].to_vec();
    let (a, ra) = fit(&all, &pipeline.train, None, false).unwrap();
    let (b, _) = fit(&all, &TrainConfig { seed: 2, ..pipeline.train.clone() }, None, false).unwrap();
    let (c, rc) = fit_chunks(spilled, &pipeline.train, None, false, None).unwrap();
    assert_eq!((rc.train_chunks, rc.validation_chunks), (spilled.chunk_count(Split::Training), spilled.chunk_count(Split::Validation)));
    assert_eq!((ra.train_impressions, ra.validation_impressions), (rc.train_impressions, rc.validation_impressions));
    assert_eq!((ra.train_sessions, ra.validation_sessions), (rc.train_sessions, rc.validation_sessions));
    let diff = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0f64, f64::max);
    let noise = diff(&theta(&a), &theta(&b));
    eprintln!("θ truth {:.3?}\nθ in memory {:.3?} / seed 2 {:.3?}\nθ chunked {:.3?}", &truth[..6], theta(&a), theta(&b), theta(&c));
    eprintln!("best validation loss in memory {:.5}, chunked {:.5}; seed noise in θ {noise:.4}", ra.best_validation_loss, rc.best_validation_loss);
    assert!(diff(&theta(&a), &theta(&c)) <= (2.0 * noise).max(0.05), "θ chunked vs in memory beyond seed noise {noise:.4}");
    // As close to the simulator's truth as the in-memory fit, up to seed noise.
    let (error_a, error_c) = (diff(&theta(&a), &truth[..6]), diff(&theta(&c), &truth[..6]));
    assert!(error_c <= error_a + noise.max(0.02), "θ chunked is {error_c:.4} from the truth, in memory {error_a:.4}");
    assert!((ra.best_validation_loss - rc.best_validation_loss).abs() < 0.005 * ra.best_validation_loss);

    // `aggregated_epoch = "rows"` (every row once per epoch, count-weighted; each chunk's share of
    // its shuffled rows per visit), in memory and over the chunks: θ as above.
    let rows_cfg = TrainConfig { aggregated_epoch: AggregatedEpoch::Rows, max_epochs: 400, ..pipeline.train.clone() };
    let (d, rd) = fit(&all, &rows_cfg, None, false).unwrap();
    let (e, re) = fit_chunks(spilled, &rows_cfg, None, false, None).unwrap();
    for (name, t, r) in [("in memory", &d, &rd), ("chunked", &e, &re)] {
        eprintln!(
            "every row once per epoch, {name}: θ {:.3?}, {} epochs (best {}), best validation loss {:.5}",
            theta(t),
            r.epochs.len(),
            r.best_epoch,
            r.best_validation_loss
        );
        assert!(diff(&theta(&a), &theta(t)) <= (2.0 * noise).max(0.05), "θ rows per epoch ({name}) vs in memory beyond seed noise {noise:.4}");
        assert!(diff(&theta(t), &truth[..6]) <= error_a + noise.max(0.02), "θ rows per epoch ({name}) from the truth vs {error_a:.4}");
    }

    // The spill folder goes with the data.
    let folder = spilled.dir().to_path_buf();
    assert!(folder.exists());
    drop(data);
    assert!(!folder.exists(), "spilled chunks are removed after training");
}

#[test]
fn train_from_state_streams_a_horizon_beyond_its_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cfg = config("memory_budget = \"64KiB\"\n");
    ultr::pipeline::run_to_state(&cfg, &state, &mut ultr::pipeline::NoObserver).unwrap();
    let outcome = train_from_state(&TrainRequest {
        state_dir: &state,
        core: &cfg.core(),
        config: &cfg.train,
        warm_start: false,
        compare_cold: false,
        force: false,
        progress: false,
        cancel: None,
        judged: None,
        truth_theta: None,
        context: &Default::default(),
    })
    .unwrap();
    assert!(outcome.fit.train_chunks > 4, "64 KiB must spill: {} chunks", outcome.fit.train_chunks);
    assert!(outcome.decision.promoted, "{}", outcome.decision.reason);
    // A guard on one stream, not a statistical claim: that streamed chunks train to the same θ as
    // memory is this file's first test (within the seed noise it measures), and θ_2 within 0.15 of
    // −ln 2 on this simulator shape is `model_interface`'s claim on three seeds.
    assert!((outcome.theta[1] + 2f64.ln()).abs() < 0.15, "θ_2 − θ_1 = {}", outcome.theta[1]);
    let leftovers: Vec<_> = std::fs::read_dir(spill_dir(&state)).unwrap().collect();
    assert!(leftovers.is_empty(), "the spill folder is emptied after training: {leftovers:?}");

    // The gate's baselines (issue 55), summed over the spilled chunks: the position-only model's
    // held-out click log-likelihood equals a recount from the in-memory rows, the candidate's equals
    // its in-memory score, and a model of the simulator's linear relevance beats position alone.
    let h = outcome.decision.held_out_clicks.clone().expect("the gate scored the baselines");
    let TrainingData::InMemory(all) = load(&state, &cfg, usize::MAX) else { panic!("in memory") };
    let holdout = cfg.train.holdout();
    let (mut by_position, mut eval_rows) = (BTreeMap::<u32, (f64, f64)>::new(), Vec::new());
    let (mut clicks, mut impressions) = (0.0, 0.0);
    for span in &all.sessions {
        for r in &all.rows[span.start..span.start + span.len] {
            if ultr::train::data::split_of(span, holdout) == Split::Evaluation {
                eval_rows.push((r.position, r.clicks as f64, r.impressions as f64));
            } else {
                let e = by_position.entry(r.position).or_default();
                e.0 += r.clicks as f64;
                e.1 += r.impressions as f64;
                clicks += r.clicks as f64;
                impressions += r.impressions as f64;
            }
        }
    }
    let mean = (clicks + 1.0) / (impressions + 2.0);
    let (mut ll, mut n) = (0.0, 0.0);
    for (k, c, m) in eval_rows {
        let p = by_position.get(&k).map_or(mean, |(ck, nk)| (ck + 1.0) / (nk + 2.0));
        ll += c * p.ln() + (m - c) * (1.0 - p).ln();
        n += m;
    }
    assert_eq!(h.impressions, n);
    assert!((h.position_only - ll / n).abs() < 1e-9, "position-only {} vs recount {}", h.position_only, ll / n);
    let device = cfg.train.backend.device().unwrap();
    let trained = ultr::train::checkpoint::ModelStore::open(&outcome.models_dir).unwrap().load(&outcome.id, &device).unwrap();
    let in_memory = ultr::train::baselines::held_out_clicks(&all, &trained, None, &cfg.train).unwrap().unwrap();
    assert!((in_memory.position_only - h.position_only).abs() < 1e-9 && (in_memory.pair_ctr - h.pair_ctr).abs() < 1e-9, "{in_memory:?} vs {h:?}");
    assert!((in_memory.candidate - h.candidate).abs() < 1e-5, "{in_memory:?} vs {h:?}");
    assert!(h.candidate > h.position_only, "a model of the linear relevance beats position alone: {h:?}");
}
