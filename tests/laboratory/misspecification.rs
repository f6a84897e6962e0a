//! Misspecification and identifiability signals on simulated MQ2008 streams (Hager §5.3 sources at
//! τ ∈ {0, 0.333}): what the monitor exports per window, asserted here and replayed through the
//! alert rules with `promtool test rules`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ultr::config::PipelineConfig;
use ultr::monitor::metrics::Metrics;
use ultr::monitor::{Monitor, ScoredWindow};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator};
use ultr::sinks::jsonl::JsonlSink;

const T0: i64 = 1_767_225_600_000;
const WINDOW_MS: i64 = 600_000;

/// The MisspecificationSuspected threshold, read from the rules the service ships.
fn threshold() -> f64 {
    let rules = std::fs::read_to_string(repo().join("pipelines/alerts.yml")).unwrap();
    let line = rules.lines().find(|l| l.contains("expr: ultr_misspecification_z >")).expect("the rule");
    line.rsplit('>').next().unwrap().trim().parse().unwrap()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Scenario {
    name: &'static str,
    relevance: RelevanceKind,
    tau: f64,
    /// The model's tower and how many of MQ2008's 46 features it sees.
    tower: &'static str,
    feature_limit: Option<usize>,
    /// Windows scored after the model is trained on the first hour.
    windows_after: usize,
    sessions_per_window: u64,
    seed: u64,
    /// Yan 2022 mixture weights RCM:RCTR:DCTR:PBM for the clicks (None: the additive PBM).
    click_mixture: Option<[f64; 4]>,
    /// `[train] model`.
    model: &'static str,
}

/// What the service exported after each scored window.
struct Outcome {
    scored: Vec<ScoredWindow>,
    /// Per scored window: the exported exposition text right after it was scored.
    exported: Vec<String>,
    state: PathBuf,
    config: PathBuf,
    truth: ultr::simulate::GroundTruth,
}

fn run(s: &Scenario, dir: &Path) -> Outcome {
    std::fs::create_dir_all(dir).unwrap();
    let windows = 6 + s.windows_after as i64;
    let sessions = s.sessions_per_window * windows as u64;
    let sim = Simulator::new(SimConfig {
        data: common::mq2008_files(),
        relevance: s.relevance,
        policy: PolicyConfig { tau: s.tau, ..PolicyConfig::default() },
        sessions,
        seed: s.seed,
        start_ms: T0,
        interval_ms: WINDOW_MS / s.sessions_per_window as i64,
        click_model: match s.click_mixture {
            Some(mixture) => ultr::simulate::click::ClickModel { kind: ultr::simulate::click::ClickModelKind::Mixture, mixture, ..Default::default() },
            None => Default::default(),
        },
        ..SimConfig::default()
    })
    .unwrap();
    let truth = sim.truth().clone();
    let data = dir.join("sessions.jsonl");
    sim.run(&mut JsonlSink::create(&data).unwrap()).unwrap();
    let mut limit = s.feature_limit.map(|n| format!("feature_limit = {n}\n")).unwrap_or_default();
    // Extra `[train]` lines for measurements (`explore_mixture`), e.g. "early_stopping = false".
    let mut epochs = "max_epochs = 30\n".to_string();
    if let Ok(extra) = std::env::var("EXPLORE_TRAIN") {
        if extra.contains("max_epochs") {
            epochs.clear();
        }
        limit.push_str(&extra.replace(';', "\n"));
        limit.push('\n');
    }
    let text = format!(
        "batch_records = 500\n[source.file]\npaths = [{:?}]\n[window]\nsize = \"10m\"\nallowed_lateness = \"10s\"\nsession_store_patterns = {}\n[state]\nlookback = \"1h\"\n\
         checkpoint_every_records = 1000\n[train]\nmodel = {:?}\ntower = {:?}\n{epochs}{limit}",
        data.display().to_string(),
        // Session models (MixEM) train on every session of a window, not a sample of them.
        2 * s.sessions_per_window,
        s.model,
        s.tower
    );
    let config_path = dir.join("pipeline.toml");
    std::fs::write(&config_path, &text).unwrap();
    let config = PipelineConfig::parse(&text, "pipeline.toml").unwrap();
    let state = dir.join("state");
    let mut monitor = Monitor::new(std::sync::Arc::new(Metrics::new()), &config, &state);
    struct Rec<'a> {
        monitor: &'a mut Monitor,
        config: &'a PipelineConfig,
        trained: bool,
        scored: usize,
        exported: Vec<String>,
    }
    impl ultr::pipeline::Observer for Rec<'_> {
        fn after_checkpoint(&mut self, store: &ultr::state::StateStore, report: &ultr::pipeline::RunReport) {
            let latest = store.manifest().windows.iter().map(|w| w.end_ms).max().unwrap_or(i64::MIN);
            if !self.trained && latest >= T0 + 6 * WINDOW_MS {
                let req = ultr::train::TrainRequest { state_dir: store.dir(), core: &self.config.core(), config: &self.config.train, warm_start: false, compare_cold: false, force: false, progress: false, cancel: None };
                let outcome = ultr::train::train_from_state(&req).unwrap();
                self.trained = true;
                // What the mixture learnt (a measurement for issue 14's note).
                let device = self.config.train.backend.device().unwrap();
                let trained = ultr::train::checkpoint::ModelStore::open(&outcome.models_dir).unwrap().load(&outcome.id, &device).unwrap();
                if let ultr::train::models::AnyModel::MixEm(m) = &trained.model {
                    eprintln!("MixEM π (RCM:RCTR:DCTR:PBM) {:.3?}; e(k)−e(1) {:.2?}; epochs {} (best {}, {:?}); best validation loss {:.6}", m.mixing_weights(), ultr::train::models::Model::position_bias(m, 10), outcome.fit.epochs.len(), outcome.fit.best_epoch, outcome.fit.stop, outcome.fit.best_validation_loss);
                } else {
                    eprintln!("θ_k − θ_1 {:.2?}; epochs {}", outcome.theta, outcome.fit.epochs.len());
                }
            }
            self.monitor.observe(store.dir(), store.manifest(), report).unwrap();
            let scored = self.monitor.metrics.residual_windows.get() as usize;
            assert!(scored <= self.scored + 1, "one window scored per checkpoint, so each has its exported series");
            if scored > self.scored {
                self.exported.push(self.monitor.metrics.render());
            }
            self.scored = scored;
        }
    }
    let mut rec = Rec { monitor: &mut monitor, config: &config, trained: false, scored: 0, exported: Vec::new() };
    ultr::pipeline::run_to_state(&config, &state, &mut rec).unwrap();
    let exported = rec.exported;
    let scored: Vec<ScoredWindow> = monitor.history.iter().cloned().collect();
    for w in &scored {
        let t = &w.misspecification;
        eprintln!(
            "{}: window ending +{}m: z {:+.2} (χ² {:.1}, {} dof, {} clusters, sd π {:.3}, whole window {}) {}",
            s.name,
            (w.end_ms - T0) / 60_000,
            t.z,
            t.chi2,
            t.dof,
            t.clusters,
            t.policy_variation,
            w.whole_window,
            t.reason.as_deref().unwrap_or("")
        );
        eprintln!("    per position block z_B: {:+.1?}", t.per_block);
    }
    Outcome { scored, exported, state, config: config_path, truth }
}

/// The value of one exported series (`name{labels}`) in an exposition text.
fn exported_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(series) && l[series.len()..].starts_with(' ')).map(|l| {
        let v = l.rsplit(' ').next().unwrap();
        if v == "NaN" {
            f64::NAN
        } else {
            v.parse().unwrap()
        }
    })
}

/// Replays the exported series (one sample a minute, a window every 10 minutes) through the shipped
/// rules; `expect` lists (eval minute, alert, fires).
fn promtool(dir: &Path, exported: &[String], series: &[&str], expect: &[(usize, &str, bool)]) {
    let mut input = String::new();
    for name in series {
        let values: Vec<String> = exported
            .iter()
            .flat_map(|text| {
                let v = exported_value(text, name).unwrap_or_else(|| panic!("{name} not exported"));
                std::iter::repeat_n(if v.is_nan() { "NaN".to_string() } else { format!("{v}") }, 10)
            })
            .collect();
        let (metric, labels) = name.split_once('{').unwrap();
        input.push_str(&format!("      - series: '{metric}{{instance=\"ultr\",{labels}'\n        values: '{}'\n", values.join(" ")));
    }
    let rules: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(repo().join("pipelines/alerts.yml")).unwrap()).unwrap();
    let mut tests = String::new();
    for (minute, alert, fires) in expect {
        tests.push_str(&format!("      - eval_time: {minute}m\n        alertname: {alert}\n"));
        if !fires {
            tests.push_str("        exp_alerts: []\n");
        } else {
            let rule = rules["groups"][0]["rules"].as_sequence().unwrap().iter().find(|r| r["alert"].as_str() == Some(alert)).expect("the rule");
            let severity = rule["labels"]["severity"].as_str().unwrap();
            // The annotations as Prometheus renders them: the model label, and z of the window in effect.
            let z = exported_value(&exported[minute / 10], series[0]).unwrap();
            let model = series[0].split("model=\"").nth(1).unwrap().split('"').next().unwrap();
            let summary = rule["annotations"]["summary"].as_str().unwrap().replace("{{ $labels.model }}", model).replace("{{ $value | printf \"%.1f\" }}", &format!("{z:.1}"));
            let runbook = rule["annotations"]["runbook"].as_str().unwrap().trim();
            tests.push_str(&format!(
                "        exp_alerts:\n          - exp_labels: {{ severity: {severity}, instance: ultr, model: {model} }}\n            exp_annotations:\n              summary: {summary:?}\n              runbook: {runbook:?}\n"
            ));
        }
    }
    let file = dir.join("replay.test.yml");
    let rules = repo().join("pipelines/alerts.yml");
    std::fs::write(&file, format!("rule_files:\n  - {:?}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{input}    alert_rule_test:\n{tests}", rules.display().to_string()))
        .unwrap();
    let out = Command::new("promtool").arg("test").arg("rules").arg(&file).output().expect("promtool on PATH (the README's test command installs it)");
    assert!(out.status.success(), "{}{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr), std::fs::read_to_string(&file).unwrap());
}

/// Well-specified linear tower on linear relevance at τ = 0.333: z stays below the threshold for
/// 20 held-out windows (the observed false-alarm rate is printed), and the rules stay silent.
#[test]
fn a_well_specified_model_stays_silent_over_twenty_windows() {
    let dir = tempfile::tempdir().unwrap();
    let s = Scenario { name: "well-specified τ=0.333", relevance: RelevanceKind::Linear, tau: 0.333, tower: "linear", feature_limit: None, windows_after: 20, sessions_per_window: 3000, seed: 11, click_mixture: None, model: "additive" };
    let o = run(&s, dir.path());
    let held_out: Vec<&ScoredWindow> = o.scored.iter().filter(|w| w.whole_window).collect();
    assert!(held_out.len() >= 20, "{} held-out windows scored", held_out.len());
    let zs: Vec<f64> = held_out.iter().map(|w| w.misspecification.z).collect();
    let alarms = zs.iter().filter(|z| **z > threshold()).count();
    let mean = zs.iter().sum::<f64>() / zs.len() as f64;
    eprintln!("well-specified: {alarms}/{} windows above z = {} (false-alarm rate {:.3}); mean z {mean:.2}", zs.len(), threshold(), alarms as f64 / zs.len() as f64);
    assert!(held_out.iter().all(|w| w.misspecification.assessable));
    assert_eq!(alarms, 0, "z per window: {zs:.2?}");
    let n = o.exported.len();
    promtool(dir.path(), &o.exported, &["ultr_misspecification_z{model=\"linear\"}", "ultr_identified{model=\"linear\"}"], &[
        (n * 10 - 1, "MisspecificationSuspected", false),
        (n * 10 - 1, "IdentifiabilityLost", false),
        (n * 5, "MisspecificationSuspected", false),
    ]);
}

/// Functional-form misfit (linear tower on MLP relevance) and omitted variables (30 of 46 features)
/// at τ = 0.333: the first or second held-out window crosses the threshold, and the rule fires.
/// A misspecified additive model fires within two held-out windows, and the rule with it.
fn fires_within_two_windows(s: Scenario) {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&s, dir.path());
    let first = o.scored.iter().position(|w| w.whole_window).expect("held-out windows");
    let crossed = o.scored[first..].iter().position(|w| w.misspecification.z > threshold());
    assert!(crossed.is_some_and(|c| c <= 1), "{}: z {:?}", s.name, o.scored.iter().map(|w| w.misspecification.z).collect::<Vec<_>>());
    // The rule fires by the end of the second held-out window's scrape interval.
    promtool(dir.path(), &o.exported, &["ultr_misspecification_z{model=\"linear\"}"], &[((first + 2) * 10 - 1, "MisspecificationSuspected", true)]);
}

#[test]
fn a_linear_tower_on_mlp_relevance_fires_within_two_windows() {
    fires_within_two_windows(Scenario { name: "linear tower on MLP relevance", relevance: RelevanceKind::Mlp, tau: 0.333, tower: "linear", feature_limit: None, windows_after: 3, sessions_per_window: 15_000, seed: 12, click_mixture: None, model: "additive" });
}

#[test]
fn omitted_features_fire_within_two_windows() {
    fires_within_two_windows(Scenario { name: "omitted features (30 of 46)", relevance: RelevanceKind::Linear, tau: 0.333, tower: "linear", feature_limit: Some(30), windows_after: 3, sessions_per_window: 15_000, seed: 13, click_mixture: None, model: "additive" });
}

/// A deterministic policy (τ = 0): the linear tower is identified (feature overlap) and nothing
/// alerts; misspecification is reported as not assessable (a metric, a line in `ultr identifiability`
/// — also with 30 of 46 features, where the model is misspecified), and an embedding tower on the same
/// data is not identified.
#[test]
fn a_deterministic_policy_is_identified_for_features_but_blind_to_misspecification() {
    let dir = tempfile::tempdir().unwrap();
    let s = Scenario { name: "deterministic τ=0", relevance: RelevanceKind::Linear, tau: 0.0, tower: "linear", feature_limit: None, windows_after: 8, sessions_per_window: 2000, seed: 14, click_mixture: None, model: "additive" };
    let o = run(&s, dir.path());
    assert!(o.scored.len() >= 8);
    for text in &o.exported {
        assert_eq!(exported_value(text, "ultr_identified{model=\"linear\"}"), Some(1.0));
        assert_eq!(exported_value(text, "ultr_misspecification_assessable{model=\"linear\"}"), Some(0.0));
        assert!(exported_value(text, "ultr_misspecification_z{model=\"linear\"}").is_some_and(f64::is_nan), "blind is not a healthy 0");
    }
    let n = o.exported.len();
    promtool(
        dir.path(),
        &o.exported,
        &["ultr_misspecification_z{model=\"linear\"}", "ultr_identified{model=\"linear\"}", "ultr_misspecification_assessable{model=\"linear\"}"],
        &[(n * 10 - 1, "MisspecificationSuspected", false), (n * 10 - 1, "IdentifiabilityLost", false), (n * 10 - 1, "MisspecificationUnassessable", true)],
    );

    // `ultr identifiability` says so, for the full and the 30-feature model alike.
    let omitted = dir.path().join("omitted.toml");
    std::fs::write(&omitted, std::fs::read_to_string(&o.config).unwrap().replace("max_epochs = 30\n", "max_epochs = 30\nfeature_limit = 30\n")).unwrap();
    for config in [&o.config, &omitted] {
        let out = Command::new(env!("CARGO_BIN_EXE_ultr")).args(["identifiability", "--state"]).arg(&o.state).arg("--config").arg(config).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("IDENTIFIED") && !stdout.contains("NOT IDENTIFIED"), "{stdout}");
        assert!(stdout.contains("misspecification: CANNOT BE ASSESSED"), "{stdout}");
    }
    // An embedding tower on the same data: not identified (no swaps at τ = 0); the monitor of such a
    // service exports ultr_identified{model="embedding"} = 0 and IdentifiabilityLost fires.
    let embedding_config = PipelineConfig::parse(&std::fs::read_to_string(&o.config).unwrap().replace("tower = \"linear\"", "tower = \"embedding\""), "embedding.toml").unwrap();
    let mut monitor = Monitor::new(std::sync::Arc::new(Metrics::new()), &embedding_config, &o.state);
    monitor.observe_recorded(&o.state, &ultr::state::read_manifest(&o.state).unwrap()).unwrap();
    let text = monitor.metrics.render();
    assert_eq!(exported_value(&text, "ultr_identified{model=\"embedding\"}"), Some(0.0));
    let exported = vec![text; 8];
    promtool(dir.path(), &exported, &["ultr_identified{model=\"embedding\"}"], &[(14, "IdentifiabilityLost", false), (79, "IdentifiabilityLost", true)]);
    let embedding = dir.path().join("embedding.toml");
    std::fs::write(&embedding, std::fs::read_to_string(&o.config).unwrap().replace("tower = \"linear\"", "tower = \"embedding\"")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ultr")).args(["identifiability", "--state"]).arg(&o.state).arg("--config").arg(&embedding).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT IDENTIFIED"));
}

/// Yan 2022's 0:1:1:0 mixture at τ = 0.333: half the sessions click by position alone (RCTR), half by
/// relevance alone (DCTR), so clicks do not factorise into examination × relevance. The additive
/// model with per-document γ (nothing else can be misspecified) fires within two held-out windows,
/// and the rule with it. MixEM, whose mixture contains the stream's (π = 0 : ½ : ½ : 0), trained on
/// the same stream from every session of its windows (`[window] session_store_patterns` above a
/// window's sessions), stays below the threshold in every held-out window and its rule stays silent.
/// The test is the per-document one (levels per (q, d) and per position refit on the held-out rows);
/// on this stream the simulator's exact click probability scores z ≈ 0 (`explore_mixture_oracle`,
/// README "The 0:1:1:0 mixture, model by model").
fn mixture_scenario(model: &'static str) -> Scenario {
    Scenario {
        name: model,
        relevance: RelevanceKind::Linear,
        tau: 0.333,
        tower: "embedding",
        feature_limit: None,
        windows_after: 4,
        sessions_per_window: 15_000,
        seed: 16,
        click_mixture: Some([0.0, 1.0, 1.0, 0.0]),
        model,
    }
}

#[test]
fn a_non_factorising_mixture_fires_for_the_additive_model() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&mixture_scenario("additive"), &dir.path().join("additive"));
    let first = o.scored.iter().position(|w| w.whole_window).expect("held-out windows");
    let zs: Vec<f64> = o.scored[first..].iter().map(|w| w.misspecification.z).collect();
    assert!(o.scored[first..].iter().all(|w| w.misspecification.assessable), "assessable");
    let crossed = zs.iter().take(2).position(|z| *z > threshold());
    assert!(crossed.is_some(), "additive on 0:1:1:0: z {zs:.2?}");
    // The alert is firing in the last minute of the window that crossed.
    let window = first + crossed.unwrap();
    promtool(dir.path(), &o.exported, &["ultr_misspecification_z{model=\"embedding\"}"], &[((window + 1) * 10 - 1, "MisspecificationSuspected", true)]);
}

#[test]
fn a_non_factorising_mixture_is_silent_for_mixem() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&mixture_scenario("mixem"), &dir.path().join("mixem"));
    let first = o.scored.iter().position(|w| w.whole_window).expect("held-out windows");
    let held_out = &o.scored[first..];
    assert!(held_out.len() >= 4 && held_out.iter().all(|w| w.misspecification.assessable), "assessable");
    let zs: Vec<f64> = held_out.iter().map(|w| w.misspecification.z).collect();
    assert!(zs.iter().all(|z| *z < threshold()), "MixEM on 0:1:1:0: z {zs:.2?}");
    let n = o.exported.len();
    promtool(dir.path(), &o.exported, &["ultr_misspecification_z{model=\"mixem/embedding\"}"], &[
        ((first + 1) * 10 - 1, "MisspecificationSuspected", false),
        (n * 10 - 1, "MisspecificationSuspected", false),
    ]);
}

/// A measurement's setting from the environment, or its default.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A measurement, not a check (hence ignored): z per held-out window for any model, tower, click
/// mixture and traffic, from the environment — `EXPLORE_MODEL` (mixem), `EXPLORE_TOWER`
/// (embedding), `EXPLORE_MIX` (0,1,1,0; `none` for additive PBM clicks), `EXPLORE_SPW` (15000),
/// `EXPLORE_SEED` (16).
/// The README's false-alarm row for the embedding tower and the MixEM figures in issue 14's note
/// come from it.
#[test]
#[ignore]
fn explore_mixture() {
    let dir = tempfile::tempdir().unwrap();
    let model: &'static str = Box::leak(env_or("EXPLORE_MODEL", "mixem".to_string()).into_boxed_str());
    let spw: u64 = env_or("EXPLORE_SPW", 15_000);
    let mix: String = env_or("EXPLORE_MIX", "0,1,1,0".to_string());
    let mixture: Vec<f64> = if mix == "none" { vec![] } else { mix.split(',').map(|v| v.parse().unwrap()).collect() };
    let tower: &'static str = Box::leak(env_or("EXPLORE_TOWER", "embedding".to_string()).into_boxed_str());
    let seed: u64 = env_or("EXPLORE_SEED", 16);
    let s = Scenario { name: "explore", relevance: RelevanceKind::Linear, tau: 0.333, tower, feature_limit: None, windows_after: 4, sessions_per_window: spw, seed, click_mixture: (mixture.len() == 4).then(|| [mixture[0], mixture[1], mixture[2], mixture[3]]), model };
    let o = run(&s, dir.path());
    let zs: Vec<f64> = o.scored.iter().map(|w| w.misspecification.z).collect();
    eprintln!("EXPLORE {model} spw {spw}: z {zs:.2?}");
}

/// A measurement (ignored): the same per-document test as the monitor, on the same held-out windows
/// and propensities, scoring the trained model and the simulator's exact click probability
/// (Yan's mixture marginal) side by side. Whether the stream itself sits at the test's null under
/// the truth, and how far the model is from it.
#[test]
#[ignore]
fn explore_mixture_oracle() {
    use ultr::monitor::misspecification::{score_test, Nuisance};
    let dir = tempfile::tempdir().unwrap();
    let model: &'static str = Box::leak(env_or("EXPLORE_MODEL", "additive".to_string()).into_boxed_str());
    let spw: u64 = env_or("EXPLORE_SPW", 15_000);
    let seed: u64 = env_or("EXPLORE_SEED", 16);
    let mixture = [0.0, 1.0, 1.0, 0.0];
    let s = Scenario { name: "oracle", relevance: RelevanceKind::Linear, tau: 0.333, tower: "embedding", feature_limit: None, windows_after: 4, sessions_per_window: spw, seed, click_mixture: Some(mixture), model };
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
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let total: f64 = mixture.iter().sum();
    if let ultr::train::models::AnyModel::MixEm(mix) = &trained.model {
        // Session NLL (the EM's objective) of the truth and of the fitted mixture, on the sessions
        // of the training hour and on the held-out ones: overfitting, or an optimum not reached?
        let cumulative = rt.block_on(ultr::state::cumulative::compute(&o.state, &manifest, i64::MAX)).unwrap();
        let pi = rt.block_on(ultr::train::ips_propensity::ips_propensity(cumulative.policy_propensity.clone(), &config.train.ips)).unwrap();
        let ex = rt.block_on(ultr::train::data::examples_for_windows(&o.state, &manifest.windows, pi, trained.meta.architecture.max_positions)).unwrap();
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
            eprintln!("ORACLE session NLL, {name} ({} sessions): truth {:.5}, MixEM {:.5}", counts[part], sums[part][0] / counts[part] as f64, sums[part][1] / counts[part] as f64);
        }
    }
    for w in manifest.windows.iter().filter(|w| w.start_ms >= data_end) {
        let mut seen = manifest.clone();
        seen.windows.retain(|x| x.end_ms <= w.end_ms);
        let cumulative = rt.block_on(ultr::state::cumulative::compute(&o.state, &seen, config.lookback_ms())).unwrap();
        let pi = rt.block_on(ultr::train::ips_propensity::ips_propensity(cumulative.policy_propensity.clone(), &config.train.ips)).unwrap();
        let ex = rt.block_on(ultr::train::data::examples_for_windows(&o.state, std::slice::from_ref(w), pi, trained.meta.architecture.max_positions)).unwrap();
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
        eprintln!("ORACLE window ending +{}m: {model} z {:+.2}  truth z {:+.2}  (blocks model {:+.1?} truth {:+.1?})", (w.end_ms - T0) / 60_000, m.z, t.z, m.per_block, t.per_block);
    }
}
