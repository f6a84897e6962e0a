//! Measurements behind the misspecification monitor's figures, not checks: the per-window z of the
//! scenarios in `tests/laboratory/misspecification`, for any model, tower, click mixture and
//! traffic. Run with
//! `cargo run --release --example misspecification_explore -- mixture|oracle`
//! and the settings below from the environment. Prints to stderr.

/// The scenario runner the tests use, shared as source.
#[path = "../tests/laboratory/misspecification/scenario.rs"]
#[allow(dead_code)]
mod scenario;

mod common {
    use std::path::PathBuf;
    /// MQ2008's five folds, shipped in `data/`.
    pub fn mq2008_files() -> Vec<PathBuf> {
        let data = ultr::simulate::dataset::data_dir().expect("LTR data: the repository's data/ (or $ULTR_DATA_DIR)");
        (1..=5).map(|i| data.join(format!("mq2008/S{i}.txt"))).collect()
    }
}

use scenario::{run, Scenario, T0};
use ultr::config::PipelineConfig;
use ultr::simulate::relevance::RelevanceKind;

/// A setting from the environment, or its default.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("mixture") => explore_mixture(),
        Some("oracle") => explore_mixture_oracle(),
        _ => {
            eprintln!("usage: misspecification_explore mixture|oracle (settings: EXPLORE_MODEL, EXPLORE_TOWER, EXPLORE_MIX, EXPLORE_SPW, EXPLORE_SEED, EXPLORE_TRAIN)");
            std::process::exit(2);
        }
    }
}

/// `mixture`: z per held-out window for any model, tower, click
/// mixture and traffic, from the environment — `EXPLORE_MODEL` (mixem), `EXPLORE_TOWER`
/// (embedding), `EXPLORE_MIX` (0,1,1,0; `none` for additive PBM clicks), `EXPLORE_SPW` (15000),
/// `EXPLORE_SEED` (16).
/// The README's false-alarm row for the embedding tower and the MixEM figures in issue 14's note
/// come from it.
fn explore_mixture() {
    let dir = tempfile::tempdir().unwrap();
    let model: &'static str = Box::leak(env_or("EXPLORE_MODEL", "mixem".to_string()).into_boxed_str());
    let spw: u64 = env_or("EXPLORE_SPW", 15_000);
    let mix: String = env_or("EXPLORE_MIX", "0,1,1,0".to_string());
    let mixture: Vec<f64> = if mix == "none" { vec![] } else { mix.split(',').map(|v| v.parse().unwrap()).collect() };
    let tower: &'static str = Box::leak(env_or("EXPLORE_TOWER", "embedding".to_string()).into_boxed_str());
    let seed: u64 = env_or("EXPLORE_SEED", 16);
    let s = Scenario {
        name: "explore",
        relevance: RelevanceKind::Linear,
        tau: 0.333,
        tower,
        feature_limit: None,
        windows_after: 4,
        sessions_per_window: spw,
        seed,
        click_mixture: (mixture.len() == 4).then(|| [mixture[0], mixture[1], mixture[2], mixture[3]]),
        model,
        extra_train: env_or("EXPLORE_TRAIN", String::new()),
    };
    let o = run(&s, dir.path());
    let zs: Vec<f64> = o.scored.iter().map(|w| w.misspecification.z).collect();
    eprintln!("EXPLORE {model} spw {spw}: z {zs:.2?}");
}

/// `oracle`: the same per-document test as the monitor, on the same held-out windows
/// and propensities, scoring the trained model and the simulator's exact click probability
/// (Yan's mixture marginal) side by side. Whether the stream itself sits at the test's null under
/// the truth, and how far the model is from it.
fn explore_mixture_oracle() {
    use ultr::train::misspecification::{score_test, Nuisance};
    let dir = tempfile::tempdir().unwrap();
    let model: &'static str = Box::leak(env_or("EXPLORE_MODEL", "additive".to_string()).into_boxed_str());
    let spw: u64 = env_or("EXPLORE_SPW", 15_000);
    let seed: u64 = env_or("EXPLORE_SEED", 16);
    let mixture = [0.0, 1.0, 1.0, 0.0];
    let s = Scenario {
        name: "oracle",
        relevance: RelevanceKind::Linear,
        tau: 0.333,
        tower: "embedding",
        feature_limit: None,
        windows_after: 4,
        sessions_per_window: spw,
        seed,
        click_mixture: Some(mixture),
        model,
        extra_train: env_or("EXPLORE_TRAIN", String::new()),
    };
    let o = run(&s, dir.path());
    let config = PipelineConfig::parse(&std::fs::read_to_string(&o.config).unwrap(), "pipeline.toml").unwrap();
    let omega: std::collections::HashMap<(String, String), f64> =
        o.truth.queries.iter().flat_map(|q| q.docs.iter().map(move |d| ((q.query_id.clone(), d.doc_id.clone()), d.omega))).collect();
    let manifest = ultr::state::read_manifest(&o.state).unwrap();
    let device = config.train.backend.device().unwrap();
    let store = ultr::train::checkpoint::ModelStore::open(&ultr::train::models_dir(&config.train, &o.state)).unwrap();
    let id = store.current_id().unwrap().unwrap();
    let trained = store.load(&id, &device).unwrap();
    let data_end = store.info(&id).unwrap().data_range_ms.unwrap().1;
    let context = config.context();
    let rt = context.runner("explore").unwrap();
    let total: f64 = mixture.iter().sum();
    if let ultr::train::models::AnyModel::MixEm(mix) = &trained.model {
        // Session NLL (the EM's objective) of the truth and of the fitted mixture, on the sessions
        // of the training hour and on the held-out ones: overfitting, or an optimum not reached?
        let cumulative = rt.run(ultr::state::cumulative::compute(&context, &o.state, &manifest, i64::MAX)).unwrap();
        let pi = rt.run(ultr::train::ips_propensity::ips_propensity(&context, cumulative.policy_propensity.clone(), &config.train.ips)).unwrap();
        let ex = rt.run(ultr::train::data::examples_for_windows(&context, &o.state, &manifest.windows, pi, trained.meta.architecture.max_positions)).unwrap();
        let relevance = trained.relevance_of_rows(&ex, &device);
        let mut r_of: std::collections::HashMap<(String, String), f32> = Default::default();
        for (row, r) in ex.rows.iter().zip(&relevance) {
            r_of.insert(ex.qd_keys[row.qd as usize].clone(), *r);
        }
        let theta: Vec<f32> = mix.offsets.val().into_data().try_to_vec::<f32>().unwrap();
        let e: Vec<f32> = mix.examination.val().into_data().try_to_vec::<f32>().unwrap();
        let fitted_pi = mix.mixing_weights();
        let truth_pi: Vec<f64> = mixture.iter().map(|m| m / total).collect();
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let log_mix = |terms: [f64; 4], pi: &[f64]| {
            let t: Vec<f64> = (0..4).filter(|a| pi[*a] > 0.0).map(|a| terms[a] + pi[a].ln()).collect();
            let top = t.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            t.iter().map(|v| (v - top).exp()).sum::<f64>().ln() + top
        };
        let text = std::fs::read_to_string(dir.path().join("sessions.jsonl")).unwrap();
        // [train hour, held out] × [truth, fit]: sums and session counts.
        let mut sums = [[0.0f64; 2]; 2];
        let mut counts = [0usize; 2];
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let q = v["query_id"].as_str().unwrap().to_string();
            let part = usize::from(v["event_time"].as_i64().unwrap() >= data_end);
            let (mut truth_terms, mut fit_terms) = ([0.0f64; 4], [0.0f64; 4]);
            for item in v["items"].as_array().unwrap() {
                let k = item["position"].as_u64().unwrap() as usize;
                if k > e.len() {
                    continue;
                }
                let key = (q.clone(), item["doc_id"].as_str().unwrap().to_string());
                let c = item["clicked"].as_bool().unwrap();
                let om = omega[&key];
                let Some(r) = r_of.get(&key) else { continue };
                let (ek, r) = (e[k - 1] as f64, *r as f64);
                let truth_p = [0.1, 0.5 / k as f64, 0.5 * om, om / k as f64];
                let fit_p = [sig(theta[0] as f64), sig(theta[1] as f64 + ek), sig(theta[2] as f64 + r), sig(ek + r)];
                for a in 0..4 {
                    let (t, f) = (truth_p[a].clamp(1e-9, 1.0 - 1e-9), fit_p[a].clamp(1e-9, 1.0 - 1e-9));
                    truth_terms[a] += if c { t.ln() } else { (1.0 - t).ln() };
                    fit_terms[a] += if c { f.ln() } else { (1.0 - f).ln() };
                }
            }
            sums[part][0] -= log_mix(truth_terms, &truth_pi);
            sums[part][1] -= log_mix(fit_terms, &fitted_pi);
            counts[part] += 1;
        }
        for (part, name) in ["training hour", "held out"].iter().enumerate() {
            eprintln!(
                "ORACLE session NLL, {name} ({} sessions): truth {:.5}, MixEM {:.5}",
                counts[part],
                sums[part][0] / counts[part] as f64,
                sums[part][1] / counts[part] as f64
            );
        }
    }
    for w in manifest.windows.iter().filter(|w| w.start_ms >= data_end) {
        let mut seen = manifest.clone();
        seen.windows.retain(|x| x.end_ms <= w.end_ms);
        let cumulative = rt.run(ultr::state::cumulative::compute(&context, &o.state, &seen, config.state.lookback_ms())).unwrap();
        let pi = rt.run(ultr::train::ips_propensity::ips_propensity(&context, cumulative.policy_propensity.clone(), &config.train.ips)).unwrap();
        let ex =
            rt.run(ultr::train::data::examples_for_windows(&context, &o.state, std::slice::from_ref(w), pi, trained.meta.architecture.max_positions)).unwrap();
        let model_logits = trained.logits(&ex, &device);
        let truth_logits: Vec<f32> = ex
            .rows
            .iter()
            .map(|r| {
                let om = omega[&ex.qd_keys[r.qd as usize]];
                let k = r.position as f64;
                let p = (mixture[0] * 0.1 + mixture[1] * 0.5 / k + mixture[2] * 0.5 * om + mixture[3] * om / k) / total;
                (p / (1.0 - p)).ln() as f32
            })
            .collect();
        // Mean binomial NLL per impression of each row's marginal click probability: the truth's
        // and the model's (what the test scores).
        let nll = |logits: &[f32]| -> f64 {
            let (mut sum, mut n) = (0.0, 0.0);
            for (r, z) in ex.rows.iter().zip(logits) {
                let p = (1.0 / (1.0 + (-(*z as f64)).exp())).clamp(1e-9, 1.0 - 1e-9);
                sum -= r.clicks as f64 * p.ln() + (r.impressions - r.clicks) as f64 * (1.0 - p).ln();
                n += r.impressions as f64;
            }
            sum / n
        };
        eprintln!("ORACLE rows {}: NLL per impression truth {:.6}, {model} {:.6}", ex.rows.len(), nll(&truth_logits), nll(&model_logits));
        let min = config.identifiability.min_policy_variation;
        let m = score_test(&ex.rows, &model_logits, |_| true, min, Nuisance::PerDocument);
        let t = score_test(&ex.rows, &truth_logits, |_| true, min, Nuisance::PerDocument);
        eprintln!(
            "ORACLE window ending +{}m: {model} z {:+.2}  truth z {:+.2}  (blocks model {:+.1?} truth {:+.1?})",
            (w.end_ms - T0) / 60_000,
            m.z,
            t.z,
            m.per_block,
            t.per_block
        );
    }
}
