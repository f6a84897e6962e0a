//! The model interface (`crates/train/src/models/`): the additive model converges to the maximum-
//! likelihood fit an independent solver finds; every model trains from a state through `ultr train` and is listed by
//! `ultr models`; warm starts across models are refused naming both; a listwise model is refused on
//! aggregated rows with the reason; gradient reversal scales the adversary's gradient by −η.

use crate::common;
use crate::common::OutputWithin;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ultr::ingest::Ingest;
use ultr::session::DecodeLimits;
use ultr::simulate::source::SimulatorSource;
use ultr::simulate::{SimConfig, Simulator};
use ultr::sinks::dead_letter::DeadLetterSink;
use ultr::train::config::{ModelKind, PositionBiasSource, TowerKind, TrainConfig};
use ultr::train::data::{Examples, Split};
use ultr::train::fit::fit;

const HOLDOUT: ultr::window::Holdout = ultr::window::Holdout { validation: 0.1, evaluation: 0.1 };

fn raw_examples(seed: u64) -> Examples {
    let mut c = SimConfig { sessions: 3000, seed, log_propensity: true, ..SimConfig::default() };
    c.policy.tau = 0.3;
    let sim = Arc::new(Simulator::new(c).unwrap());
    let mut ingest = Ingest::new(SimulatorSource::new(sim, 0), DecodeLimits::default(), 4096);
    let batches = common::collect(&mut ingest, &mut DeadLetterSink::discard());
    Examples::from_batches(&batches, 50).unwrap()
}

/// The weighted maximum-likelihood fit of P(click) = σ(b + θ_k + w·x) on the training rows, by
/// Newton's method in f64 (no burn): θ_k − θ_1 for k = 2..K and their standard errors from the inverse
/// Hessian. The linear-tower additive model has exactly this likelihood, so trained to convergence
/// it must land on this optimum.
fn newton_logistic(ex: &Examples, rows: &[usize], weights: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let f = ex.n_features;
    let k_max = rows.iter().map(|&i| ex.rows[i].position as usize).max().unwrap();
    // Standardised features (θ does not depend on an affine change of x); constant ones dropped.
    let feature = |i: usize, j: usize| ex.docs[ex.rows[i].doc as usize * f + j] as f64;
    let n_total: f64 = rows.iter().map(|&i| ex.rows[i].impressions as f64).sum();
    let mut kept = Vec::new();
    for j in 0..f {
        let mean = rows.iter().map(|&i| ex.rows[i].impressions as f64 * feature(i, j)).sum::<f64>() / n_total;
        let var = rows.iter().map(|&i| ex.rows[i].impressions as f64 * (feature(i, j) - mean).powi(2)).sum::<f64>() / n_total;
        if var > 1e-12 {
            kept.push((j, mean, var.sqrt()));
        }
    }
    let dim = 1 + (k_max - 1) + kept.len();
    let design = |i: usize| -> Vec<f64> {
        let mut x = vec![0.0; dim];
        x[0] = 1.0;
        let k = ex.rows[i].position as usize;
        if k >= 2 {
            x[k - 1] = 1.0;
        }
        for (c, (j, mean, sd)) in kept.iter().enumerate() {
            x[k_max + c] = (feature(i, *j) - mean) / sd;
        }
        x
    };
    let mut beta = vec![0.0; dim];
    let mut hessian = vec![vec![0.0; dim]; dim];
    for _ in 0..100 {
        let mut grad = vec![0.0; dim];
        hessian = vec![vec![0.0; dim]; dim];
        for &i in rows {
            let r = &ex.rows[i];
            let x = design(i);
            let p = 1.0 / (1.0 + (-x.iter().zip(&beta).map(|(a, b)| a * b).sum::<f64>()).exp());
            let w = weights[i] as f64;
            for a in 0..dim {
                grad[a] += w * (r.clicks as f64 - r.impressions as f64 * p) * x[a];
                for b in 0..=a {
                    hessian[a][b] += w * r.impressions as f64 * p * (1.0 - p) * x[a] * x[b];
                }
            }
        }
        for a in 0..dim {
            for b in 0..a {
                hessian[b][a] = hessian[a][b];
            }
        }
        let step = solve(hessian.clone(), grad);
        beta.iter_mut().zip(&step).for_each(|(b, s)| *b += s);
        if step.iter().all(|s| s.abs() < 1e-10) {
            break;
        }
    }
    let se = (1..k_max)
        .map(|c| {
            let mut unit = vec![0.0; dim];
            unit[c] = 1.0;
            solve(hessian.clone(), unit)[c].sqrt()
        })
        .collect();
    (beta[1..k_max].to_vec(), se)
}

/// Solves A x = b by Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Vec<f64> {
    let n = b.len();
    for c in 0..n {
        let pivot = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs())).unwrap();
        a.swap(c, pivot);
        b.swap(c, pivot);
        for r in c + 1..n {
            let m = a[r][c] / a[c][c];
            for k in c..n {
                a[r][k] -= m * a[c][k];
            }
            b[r] -= m * b[c];
        }
    }
    for c in (0..n).rev() {
        b[c] = (b[c] - (c + 1..n).map(|k| a[c][k] * b[k]).sum::<f64>()) / a[c][c];
    }
    b
}

/// The additive model (Hager Eq. 1) with a linear tower, trained on raw rows through the model
/// interface with IPS weights and no weight decay for 300 epochs, lands on the weighted
/// maximum-likelihood optimum that Newton's method finds in f64 without burn. Measured on seeds 11,
/// 12, 13: worst gaps of 0.70, 0.84 and 0.76 standard errors (inverse-Hessian) over θ_2..θ_K − θ_1;
/// the bound is 1.5. (At 60 epochs the gap was 46–54 standard errors: not converged yet.)
#[test]
fn the_additive_model_converges_to_the_maximum_likelihood_fit() {
    for seed in [11, 12, 13] {
        let raw = raw_examples(seed);
        let agg = raw.aggregate(HOLDOUT);
        let cfg = TrainConfig {
            tower: TowerKind::Linear,
            max_epochs: 300,
            early_stopping: false,
            weight_decay: 0.0,
            // The joint fit is the maximum-likelihood estimator this test checks.
            position_bias: PositionBiasSource::Joint,
            seed: 5,
            validation_fraction: HOLDOUT.validation,
            evaluation_fraction: HOLDOUT.evaluation,
            ..TrainConfig::default()
        };
        // The aggregated training rows are the raw training sessions' rows, summed: the same
        // likelihood, on fewer rows for Newton.
        let training: Vec<usize> =
            agg.sessions.iter().filter(|s| ultr::train::data::split_of(s, HOLDOUT) == Split::Training).flat_map(|s| s.start..s.start + s.len).collect();
        let weights = ultr::train::weights::weights_of(&agg.rows, &cfg.ips).0;
        let (optimum, se) = newton_logistic(&agg, &training, &weights);
        let (t, _) = fit(&raw, &cfg, None, false).unwrap();
        let theta = t.position_bias();
        let worst = optimum.iter().zip(&se).enumerate().map(|(j, (o, s))| (theta[j + 1] - o).abs() / s).fold(0.0, f64::max);
        eprintln!("seed {seed}: θ_2..5 − θ_1 {:.4?} against Newton {:.4?}; worst gap {worst:.2} se", &theta[1..5], &optimum[..4]);
        assert!(worst < 1.5, "seed {seed}: θ is {worst:.2} standard errors from the maximum-likelihood fit");
    }
}

fn ultr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ultr"))
}

/// Trains `name` (a model that reads the stored sessions) with `--force` (its click logits are not
/// calibrated for the gate's comparison), asserts that it became the current model, and returns
/// `ultr train --json`'s outcome.
fn train_on_sessions(dir: &Path, state: &Path, name: &str, section: &str) -> serde_json::Value {
    train_on_sessions_seeded(dir, state, name, section, 3)
}

/// As `train_on_sessions`, on the state of the stream simulated with `seed`.
fn train_on_sessions_seeded(dir: &Path, state: &Path, name: &str, section: &str, seed: u64) -> serde_json::Value {
    let config = pipeline_seeded(dir, &format!("{name}-sessions-seed{seed}"), &format!("model = \"{name}\"\n{section}"), seed);
    let out =
        ultr().args(["train", "--json", "--force", "--config"]).arg(&config).arg("--state").arg(state).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert_eq!(out.status.code(), Some(0), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    let listing =
        String::from_utf8(ultr().args(["models", "--dir"]).arg(state.join("models")).output_within(crate::common::CHILD_DEADLINE).unwrap().stdout).unwrap();
    assert!(listing.lines().find(|l| l.starts_with('*')).unwrap().contains(&format!("  {name}/linear  ")), "{name}: {listing}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn pipeline(dir: &Path, name: &str, train: &str) -> PathBuf {
    pipeline_seeded(dir, name, train, 3)
}

fn pipeline_seeded(dir: &Path, name: &str, train: &str, seed: u64) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "source = \"simulator\"\n[simulator]\nrelevance = \"linear\"\nsessions = 20000\nseed = {seed}\ninterval_ms = 1000\n[simulator.policy]\ntau = 0.3\n\
             [simulator.synthetic]\nqueries = 60\ndocs_per_query = 10\nfeatures = 8\n[window]\nsize = \"1h\"\n[train]\ntower = \"linear\"\n{train}"
        ),
    )
    .unwrap();
    path
}

#[test]
fn every_model_trains_from_a_state_and_warm_starts_across_models_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let additive = pipeline(dir.path(), "additive", "");
    let out = ultr().args(["ingest", "--config"]).arg(&additive).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let models = [
        ("additive", "model = \"additive\"\n", "linear"),
        ("biased", "model = \"biased\"\n", "biased/linear"),
        ("gradient_reversal", "model = \"gradient_reversal\"\n[train.gradient_reversal]\neta = 0.5\ndropout = 0.2\n", "gradient_reversal/linear"),
        ("observation_dropout", "model = \"observation_dropout\"\n[train.observation_dropout]\nrate = 0.3\n", "observation_dropout/linear"),
        ("rem", "model = \"rem\"\n", "rem/linear"),
        ("edot", "model = \"edot\"\n[train.embedding_model]\ndimension = 4\n", "edot/linear"),
        ("einter", "model = \"einter\"\n[train.embedding_model]\ndimension = 4\ncanonical_position = 1\n", "einter/linear"),
    ];
    let mut thetas = Vec::new();
    for (name, train, label) in models {
        let config = pipeline(dir.path(), name, train);
        let out = ultr()
            .args(["train", "--json", "--force", "--config"])
            .arg(&config)
            .arg("--state")
            .arg(&state)
            .output_within(crate::common::CHILD_DEADLINE)
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        thetas.push((name, outcome["theta"][1].as_f64().unwrap()));
        let listing =
            String::from_utf8(ultr().args(["models", "--dir"]).arg(state.join("models")).output_within(crate::common::CHILD_DEADLINE).unwrap().stdout).unwrap();
        let current = listing.lines().find(|l| l.starts_with('*')).unwrap();
        assert!(current.contains(&format!("  {label}  ")), "{name}: {current}");
        let out = ultr().args(["eval", "--json", "--config"]).arg(&config).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let eval: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(eval["report"]["ndcg"]["10"].as_f64().unwrap() > 0.5, "{name}: {eval}");
    }
    // A randomised policy (τ = 0.3), a well-specified tower: the additive model recovers θ_2 − θ_1 =
    // −ln 2; the biased model has no position parameters; reversal and dropout hold the observation
    // tower back by design, so their position effect is shrunk towards 0 (same sign, smaller: asserted
    // below on three seeds). REM
    // (log P(E_2)/P(E_1)) and EDot/EInter (the mean item's logit at 2 minus at 1) measure another
    // quantity on these additive-logit clicks: asserted is that clicks fall from position 1 to 2, on
    // seeds 3, 4 and 5 (measured: REM −0.098/−0.134/−0.111 against its bound −0.05, EDot
    // −0.48/−0.76/−0.69 and EInter −0.48/−0.75/−0.64 against −0.1).
    eprintln!("θ_2 − θ_1 per model: {thetas:?}");
    let additive = thetas[0].1;
    // The additive model's θ_2 − θ_1 on two more simulated streams (seeds 4 and 5), so the bound
    // below holds over three seeds, not the one it was first checked on; and reversal's and
    // dropout's on the same streams, for their shrinkage claim.
    let mut additive_thetas = vec![additive];
    let mut shrunk: Vec<(&str, u64, f64, f64)> =
        thetas.iter().filter(|(n, _)| matches!(*n, "gradient_reversal" | "observation_dropout")).map(|(n, t)| (*n, 3, *t, additive)).collect();
    // Every sign claim below, per (model, seed): seed 3 for each model, seeds 4 and 5 for the models
    // whose only claim is a sign (reversal's and dropout's on 4 and 5 are in `shrunk`).
    let mut signed: Vec<(&str, u64, f64)> = thetas[1..].iter().map(|(n, t)| (*n, 3, *t)).collect();
    for seed in [4, 5] {
        let config = pipeline_seeded(dir.path(), &format!("additive-seed{seed}"), "", seed);
        let state = dir.path().join(format!("state-seed{seed}"));
        let out = ultr().args(["ingest", "--config"]).arg(&config).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let train = |config: &Path| -> f64 {
            let out = ultr()
                .args(["train", "--json", "--force", "--config"])
                .arg(config)
                .arg("--state")
                .arg(&state)
                .output_within(crate::common::CHILD_DEADLINE)
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "seed {seed}: {}", String::from_utf8_lossy(&out.stderr));
            let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            outcome["theta"][1].as_f64().unwrap()
        };
        let additive_seed = train(&config);
        additive_thetas.push(additive_seed);
        for (name, section, _) in models.iter().filter(|(n, ..)| matches!(*n, "gradient_reversal" | "observation_dropout")) {
            let config = pipeline_seeded(dir.path(), &format!("{name}-seed{seed}"), section, seed);
            shrunk.push((name, seed, train(&config), additive_seed));
        }
        for (name, section, _) in models.iter().filter(|(n, ..)| matches!(*n, "rem" | "edot" | "einter")) {
            let config = pipeline_seeded(dir.path(), &format!("{name}-seed{seed}"), section, seed);
            signed.push((name, seed, train(&config)));
        }
    }
    eprintln!("additive θ_2 − θ_1 on seeds 3, 4, 5: {additive_thetas:.4?} (truth {:.4})", -2f64.ln());
    for (seed, theta2) in [3, 4, 5].iter().zip(&additive_thetas) {
        assert!((theta2 + 2f64.ln()).abs() < 0.15, "additive, seed {seed}: θ_2 − θ_1 = {theta2}");
    }
    eprintln!("(model, seed, θ_2 − θ_1): {signed:.4?}");
    assert_eq!(signed.len(), 12);
    for (name, seed, theta2) in &signed {
        match *name {
            "biased" => assert_eq!(*theta2, 0.0),
            // REM's likelihood is flat along the split of a non-click into "not examined" and "not
            // relevant", so EM (or gradient) moves slowly there: after a few epochs on 20,000 sessions
            // its step is small (−0.10); `tests/laboratory/yan2022.rs` checks it recovers a PBM's examination.
            "rem" => assert!(*theta2 < -0.05, "{name}, seed {seed}: log P(E_2)/P(E_1) = {theta2}"),
            "edot" | "einter" => assert!(*theta2 < -0.1, "{name}, seed {seed}: position 2 − position 1 = {theta2}"),
            _ => assert!(*theta2 < -0.1, "{name}, seed {seed}: θ_2 − θ_1 = {theta2}"),
        }
    }
    // Same sign as the additive model's on the same stream, and strictly smaller in magnitude, on
    // seeds 3, 4 and 5 (measured on seed 3: additive −0.566, reversal −0.437, dropout −0.388; the
    // shrinkage is a design property, so no tolerance is granted toward a larger |θ|).
    eprintln!("(model, seed, θ_2 − θ_1, additive's): {shrunk:.4?}");
    assert_eq!(shrunk.len(), 6);
    for (name, seed, theta2, additive) in &shrunk {
        assert!(*theta2 < -0.1 && *theta2 > *additive, "{name}, seed {seed}: θ_2 − θ_1 = {theta2} against the additive model's {additive}");
    }
    // EDot and EInter need a feature tower: the embedding tower is refused naming the key.
    let config = pipeline(dir.path(), "edot-embedding", "model = \"edot\"\n");
    let text = std::fs::read_to_string(&config).unwrap().replace("tower = \"linear\"", "tower = \"embedding\"");
    std::fs::write(&config, text).unwrap();
    let out = ultr().args(["train", "--config"]).arg(&config).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("train.tower"), "{}", String::from_utf8_lossy(&out.stderr));
    // The current model is einter: warm-starting another model from it names both.
    let config = pipeline(dir.path(), "warm", "model = \"gradient_reversal\"\n");
    let out = ultr().args(["train", "--warm-start", "--config"]).arg(&config).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`einter`") && err.contains("`gradient_reversal`"), "{err}");
    // DLA trains on whole sessions: the windows' session stores. Its click logits are uncalibrated,
    // so the gate (click BCE against the current model) needs --force here.
    let outcome = train_on_sessions(dir.path(), &state, "dla", "");
    let sessions = outcome["fit"]["train_sessions"].as_u64().unwrap();
    assert!(sessions > 1000, "DLA trained on {sessions} stored sessions");
    // On 20,000 sessions DLA resolves the fall of examination with depth (φ_10 − φ_1 ≈ −1.3) but not
    // yet the first step (φ_2 − φ_1 ≈ +0.1): asserted is the trend.
    let phi10 = outcome["theta"][9].as_f64().unwrap();
    eprintln!("DLA from the session stores: {sessions} training lists, φ_k − φ_1 = {}", outcome["theta"]);
    assert!(phi10 < -0.5, "DLA: φ_10 − φ_1 = {phi10}");
    // MixEM too trains on the stored sessions (its E-step weighs each whole session).
    let outcome = train_on_sessions(dir.path(), &state, "mixem", "[train.mixem]\ntemperature = 1.0\n");
    assert_eq!(outcome["fit"]["train_sessions"].as_u64().unwrap(), sessions, "MixEM and DLA read the same stored sessions");
    let e10 = outcome["theta"][9].as_f64().unwrap();
    assert!(e10 < -0.3, "MixEM: e_10 − e_1 = {e10}");
    // Both trends on the streams of seeds 4 and 5 too (their states were ingested above).
    let mut trends = vec![(3, phi10, e10)];
    for seed in [4, 5] {
        let state = dir.path().join(format!("state-seed{seed}"));
        let dla = train_on_sessions_seeded(dir.path(), &state, "dla", "", seed)["theta"][9].as_f64().unwrap();
        let mixem = train_on_sessions_seeded(dir.path(), &state, "mixem", "[train.mixem]\ntemperature = 1.0\n", seed)["theta"][9].as_f64().unwrap();
        trends.push((seed, dla, mixem));
    }
    eprintln!("(seed, DLA φ_10 − φ_1, MixEM e_10 − e_1): {trends:.3?}");
    for (seed, dla, mixem) in &trends {
        assert!(*dla < -0.5 && *mixem < -0.3, "seed {seed}: DLA φ_10 − φ_1 = {dla}, MixEM e_10 − e_1 = {mixem}");
    }
    // XPA too reads the stored sessions (its examination attends over the session's items).
    let outcome = train_on_sessions(dir.path(), &state, "xpa", "");
    assert_eq!(outcome["fit"]["train_sessions"].as_u64().unwrap(), sessions, "XPA and DLA read the same stored sessions");
    let theta: Vec<f64> = outcome["theta"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect();
    assert!(theta.iter().all(|t| t.is_finite()), "XPA: e_pos(p_k) − e_pos(p_1) = {theta:?}");
    // Every model of the registry was trained above: a new model fails here until it is added.
    let trained: Vec<&str> = models.iter().map(|(name, ..)| *name).chain(["dla", "mixem", "xpa"]).collect();
    for kind in ultr_train::models::ModelKind::ALL {
        assert!(trained.contains(&kind.name()), "model `{}` of the registry is not trained by this test", kind.name());
    }
    // An unknown key in a model's section is refused by name.
    let config = pipeline(dir.path(), "typo", "model = \"gradient_reversal\"\n[train.gradient_reversal]\netaa = 0.5\n");
    let out = ultr().args(["train", "--config"]).arg(&config).arg("--state").arg(&state).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("etaa"));
}

/// The gradient reversal layer: identity forward; the adversary's squared error reaches the
/// observation tower's layer multiplied by −η, and the head itself by +1.
#[test]
fn gradient_reversal_multiplies_the_adversarial_gradient_by_minus_eta() {
    use burn::module::Module;
    use ultr::train::models::{observation_tower::AdversarialLabel, observation_tower::Objective, AnyModel};
    let raw = raw_examples(11);
    let agg = raw.aggregate(HOLDOUT);
    let cfg = TrainConfig { model: ModelKind::GradientReversal, tower: TowerKind::Linear, max_epochs: 1, seed: 5, ..TrainConfig::default() };
    let (trained, _) = fit(&agg, &cfg, None, false).unwrap();
    let ad = cfg.backend.autodiff_device().unwrap();
    let all: Vec<usize> = (0..agg.sessions.len()).collect();
    let (w, _) = ultr::train::weights::ips_weights(&agg.rows, &cfg.ips).unwrap();
    let (b, n) = ultr::train::fit::make_batch(&agg, &all, &w, &trained.qd_map(&agg), &trained.meta, &ad);
    let grads = |eta: f64| -> (Vec<f32>, Vec<f32>) {
        let AnyModel::GradientReversal(m) = trained.model.clone().train() else { panic!("an observation model") };
        let m = m.observation;
        let loss = m.objective_sum(&b, &Objective { eta, label: AdversarialLabel::Clicks, dropout: 0.0 }).div_scalar(n as f64);
        let g = loss.backward();
        let hidden = m.hidden.weight.val().grad(&g).unwrap().into_data().try_to_vec::<f32>().unwrap();
        let head = m.adversary.weight.val().grad(&g).map(|t| t.into_data().try_to_vec::<f32>().unwrap()).unwrap_or_default();
        (hidden, head)
    };
    // G: the gradient the adversary's squared error would send the hidden layer without reversal.
    let direct = {
        let AnyModel::GradientReversal(m) = trained.model.clone().train() else { panic!("an observation model") };
        let m = m.observation;
        let h = m.hidden_of(b.positions.clone(), b.bias_features.as_ref());
        let error = m.adversary.forward(h).squeeze_dim::<1>(1) - b.clicks.clone();
        let loss = (error.clone() * error * b.weights.clone()).sum().div_scalar(n as f64);
        let g = loss.backward();
        m.hidden.weight.val().grad(&g).unwrap().into_data().try_to_vec::<f32>().unwrap()
    };
    let (h0, _) = grads(0.0);
    let (h1, head1) = grads(1.0);
    let (h2, head2) = grads(2.0);
    // The adversary's contribution to the hidden layer is linear in η and changes sign: h(η) − h(0) = −η·G.
    let scale = h1.iter().zip(&h0).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(scale > 1e-6, "the adversary reaches the hidden layer");
    for i in 0..h0.len() {
        let (g1, g2) = (h1[i] - h0[i], h2[i] - h0[i]);
        assert!((g2 - 2.0 * g1).abs() <= 1e-3 * scale, "not linear in η at {i}: {g1} vs {g2}");
        assert!((g1 + direct[i]).abs() <= 1e-3 * scale, "η = 1 adds {g1}, not −G = {}", -direct[i]);
    }
    // The head is trained normally: its gradient does not depend on η.
    for (a, b) in head1.iter().zip(&head2) {
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1e-3), "head gradient {a} vs {b}");
    }
}

/// EDot and EInter serve r(x) at the canonical position through their folded tower: the export's
/// reference scorer, the burn relevance and the click logit at that position agree on every item.
#[test]
fn embedding_models_export_the_canonical_position_logit() {
    use ultr::train::export::to_export;
    let raw = raw_examples(11);
    let agg = raw.aggregate(HOLDOUT);
    for (model, canonical) in [(ModelKind::EDot, 1), (ModelKind::EInter, 3)] {
        let mut cfg = TrainConfig { model, tower: TowerKind::Mlp, max_epochs: 2, seed: 5, ..TrainConfig::default() };
        cfg.sections.embedding_model.canonical_position = canonical;
        cfg.validate().unwrap();
        let (trained, _) = fit(&agg, &cfg, None, false).unwrap();
        let device = cfg.backend.device().unwrap();
        let served = trained.relevance_of_rows(&agg, &device);
        // The same rows moved to the canonical position: their click logits are the served scores.
        let mut moved = agg.clone();
        for r in &mut moved.rows {
            r.position = canonical as u32;
        }
        let logits = trained.logits(&moved, &device);
        let export = to_export(&trained);
        assert_eq!(export.canonical_position, Some(canonical));
        assert_eq!(export.model, model);
        let f = agg.n_features;
        let mut worst = 0f64;
        for (i, r) in agg.rows.iter().enumerate().step_by(7) {
            let x = &agg.docs[r.doc as usize * f..(r.doc as usize + 1) * f];
            let reference = export.score_features(x);
            worst = worst.max((reference - served[i] as f64).abs()).max((logits[i] as f64 - served[i] as f64).abs());
        }
        assert!(worst < 1e-4, "{model:?}: export, relevance and canonical-position logits differ by {worst}");
    }
}
