//! Misspecification and identifiability signals on simulated MQ2008 streams (Hager §5.3 sources at
//! τ ∈ {0, 0.333}): what the monitor exports per window, asserted here and replayed through the
//! alert rules with `promtool test rules`.

mod scenario;

use crate::common::OutputWithin;
use std::path::{Path, PathBuf};
use std::process::Command;

use scenario::{run, Scenario};
use ultr::config::PipelineConfig;
use ultr::monitor::metrics::Metrics;
use ultr::monitor::Monitor;
use ultr::monitor::ScoredWindow;
use ultr::simulate::relevance::RelevanceKind;

/// The MisspecificationSuspected threshold, read from the rules the service ships.
fn threshold() -> f64 {
    let rules = std::fs::read_to_string(repo().join("pipelines/alerts.yml")).unwrap();
    let line = rules.lines().find(|l| l.contains("expr: ultr_misspecification_z >")).expect("the rule");
    line.rsplit('>').next().unwrap().trim().parse().unwrap()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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
            let mut summary = rule["annotations"]["summary"]
                .as_str()
                .unwrap()
                .replace("{{ $labels.model }}", model)
                .replace("{{ $value | printf \"%.1f\" }}", &format!("{z:.1}"));
            // IdentifiabilityLost's `{{ if eq $value 1.0 }}weak{{ else }}lost{{ end }}`: its value
            // here is the exported `ultr_identified` 0, so Prometheus renders the else branch.
            if let (Some(start), Some(middle), Some(end)) = (summary.find("{{ if "), summary.find("{{ else }}"), summary.find("{{ end }}")) {
                let branch = if z == 1.0 {
                    summary[summary[start..].find("}}").unwrap() + start + 2..middle].to_string()
                } else {
                    summary[middle + 10..end].to_string()
                };
                summary = format!("{}{branch}{}", &summary[..start], &summary[end + 9..]);
            }
            let runbook = rule["annotations"]["runbook"].as_str().unwrap().trim();
            tests.push_str(&format!(
                "        exp_alerts:\n          - exp_labels: {{ severity: {severity}, instance: ultr, model: {model} }}\n            exp_annotations:\n              summary: {summary:?}\n              runbook: {runbook:?}\n"
            ));
        }
    }
    let file = dir.join("replay.test.yml");
    let rules = repo().join("pipelines/alerts.yml");
    std::fs::write(
        &file,
        format!(
            "rule_files:\n  - {:?}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{input}    alert_rule_test:\n{tests}",
            rules.display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new("promtool")
        .arg("test")
        .arg("rules")
        .arg(&file)
        .output_within(crate::common::CHILD_DEADLINE)
        .expect("promtool on PATH (the README's test command installs it)");
    assert!(
        out.status.success(),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&file).unwrap()
    );
}

/// Well-specified linear tower on linear relevance at τ = 0.333: z stays below the threshold for
/// 20 held-out windows (the observed false-alarm rate is printed), and the rules stay silent. On
/// three streams (seeds 11, 31, 41), each its own test; seed 41 runs on demand (`on_demand`: the CI
/// budget, docs/testing.md).
fn a_well_specified_model_stays_silent_over_twenty_windows(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let s = Scenario {
        name: "well-specified τ=0.333",
        relevance: RelevanceKind::Linear,
        tau: 0.333,
        tower: "linear",
        feature_limit: None,
        windows_after: 20,
        sessions_per_window: 3000,
        seed,
        click_mixture: None,
        model: "additive",
        extra_train: String::new(),
    };
    let o = run(&s, dir.path());
    let held_out: Vec<&ScoredWindow> = o.scored.iter().filter(|w| w.whole_window).collect();
    assert!(held_out.len() >= 20, "{} held-out windows scored", held_out.len());
    let zs: Vec<f64> = held_out.iter().map(|w| w.misspecification.z).collect();
    let alarms = zs.iter().filter(|z| **z > threshold()).count();
    let mean = zs.iter().sum::<f64>() / zs.len() as f64;
    eprintln!(
        "well-specified: {alarms}/{} windows above z = {} (false-alarm rate {:.3}); mean z {mean:.2}",
        zs.len(),
        threshold(),
        alarms as f64 / zs.len() as f64
    );
    assert!(held_out.iter().all(|w| w.misspecification.assessable));
    assert_eq!(alarms, 0, "z per window: {zs:.2?}");
    let n = o.exported.len();
    promtool(
        dir.path(),
        &o.exported,
        &["ultr_misspecification_z{model=\"linear\"}", "ultr_identified{model=\"linear\"}"],
        &[(n * 10 - 1, "MisspecificationSuspected", false), (n * 10 - 1, "IdentifiabilityLost", false), (n * 5, "MisspecificationSuspected", false)],
    );
}

/// Functional-form misfit (linear tower on MLP relevance) and omitted variables (30 of 46 features)
/// at τ = 0.333: the first or second held-out window crosses the threshold, and the rule fires.
/// A misspecified additive model fires within two held-out windows, and the rule with it.
fn fires_within_two_windows(s: Scenario) {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&s, dir.path());
    let first = o.scored.iter().position(|w| w.whole_window).expect("held-out windows");
    let crossed = o.scored[first..].iter().position(|w| w.misspecification.z > threshold());
    let crossed =
        crossed.filter(|c| *c <= 1).unwrap_or_else(|| panic!("{}: z {:?}", s.name, o.scored.iter().map(|w| w.misspecification.z).collect::<Vec<_>>()));
    // The rule fires by the end of the window that crossed (z > 4 for 1 minute; z of the next
    // window may fall back below, as seed 42's 4.49 then 2.52 did).
    promtool(dir.path(), &o.exported, &["ultr_misspecification_z{model=\"linear\"}"], &[((first + crossed + 1) * 10 - 1, "MisspecificationSuspected", true)]);
}

/// On three streams each (seeds 12, 32, 42 and 13, 33, 43), each its own test; the third of each
/// runs on demand (the CI budget, docs/testing.md).
fn a_linear_tower_on_mlp_relevance_fires_within_two_windows(seed: u64) {
    fires_within_two_windows(Scenario {
        name: "linear tower on MLP relevance",
        relevance: RelevanceKind::Mlp,
        tau: 0.333,
        tower: "linear",
        feature_limit: None,
        windows_after: 3,
        sessions_per_window: 15_000,
        seed,
        click_mixture: None,
        model: "additive",
        extra_train: String::new(),
    });
}

fn omitted_features_fire_within_two_windows(seed: u64) {
    fires_within_two_windows(Scenario {
        name: "omitted features (30 of 46)",
        relevance: RelevanceKind::Linear,
        tau: 0.333,
        tower: "linear",
        feature_limit: Some(30),
        windows_after: 3,
        sessions_per_window: 15_000,
        seed,
        click_mixture: None,
        model: "additive",
        extra_train: String::new(),
    });
}

crate::seeded_tests!(a_well_specified_model_stays_silent_over_twenty_windows => a_well_specified_model_stays_silent_over_twenty_windows; seed_11 = 11, seed_31 = 31; on_demand seed_41 = 41);

crate::seeded_tests!(a_linear_tower_on_mlp_relevance_fires_within_two_windows => a_linear_tower_on_mlp_relevance_fires_within_two_windows; seed_12 = 12, seed_32 = 32; on_demand seed_42 = 42);

crate::seeded_tests!(omitted_features_fire_within_two_windows => omitted_features_fire_within_two_windows; seed_13 = 13, seed_33 = 33; on_demand seed_43 = 43);

/// A deterministic policy (τ = 0): the linear tower is identified (feature overlap) and nothing
/// alerts; misspecification is reported as not assessable (a metric, a line in `ultr identifiability`
/// — also with 30 of 46 features, where the model is misspecified), and an embedding tower on the same
/// data is not identified. One stream (seed 14): these are consequences of τ = 0 (no position
/// variation within a document, so nothing to assess and no swaps), not statistical claims.
#[test]
fn a_deterministic_policy_is_identified_for_features_but_blind_to_misspecification() {
    let dir = tempfile::tempdir().unwrap();
    let s = Scenario {
        name: "deterministic τ=0",
        relevance: RelevanceKind::Linear,
        tau: 0.0,
        tower: "linear",
        feature_limit: None,
        windows_after: 8,
        sessions_per_window: 2000,
        seed: 14,
        click_mixture: None,
        model: "additive",
        extra_train: String::new(),
    };
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
        let out = Command::new(env!("CARGO_BIN_EXE_ultr"))
            .args(["identifiability", "--state"])
            .arg(&o.state)
            .arg("--config")
            .arg(config)
            .output_within(crate::common::CHILD_DEADLINE)
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("IDENTIFIED") && !stdout.contains("NOT IDENTIFIED"), "{stdout}");
        assert!(stdout.contains("misspecification: CANNOT BE ASSESSED"), "{stdout}");
    }
    // An embedding tower on the same data: not identified (no swaps at τ = 0); the monitor of such a
    // service exports ultr_identified{model="embedding"} = 0 and IdentifiabilityLost fires.
    let embedding_config =
        PipelineConfig::parse(&std::fs::read_to_string(&o.config).unwrap().replace("tower = \"linear\"", "tower = \"embedding\""), "embedding.toml").unwrap();
    let mut monitor = Monitor::new(&embedding_config.context(), std::sync::Arc::new(Metrics::new()), &embedding_config, &o.state);
    monitor.observe_recorded(&o.state, &ultr::state::read_manifest(&o.state).unwrap()).unwrap();
    let text = monitor.metrics.render();
    assert_eq!(exported_value(&text, "ultr_identified{model=\"embedding\"}"), Some(0.0));
    let exported = vec![text; 8];
    promtool(dir.path(), &exported, &["ultr_identified{model=\"embedding\"}"], &[(14, "IdentifiabilityLost", false), (79, "IdentifiabilityLost", true)]);
    let embedding = dir.path().join("embedding.toml");
    std::fs::write(&embedding, std::fs::read_to_string(&o.config).unwrap().replace("tower = \"linear\"", "tower = \"embedding\"")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["identifiability", "--state"])
        .arg(&o.state)
        .arg("--config")
        .arg(&embedding)
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT IDENTIFIED"));
}

/// Yan 2022's 0:1:1:0 mixture at τ = 0.333: half the sessions click by position alone (RCTR), half by
/// relevance alone (DCTR), so clicks do not factorise into examination × relevance. The additive
/// model with per-document γ (nothing else can be misspecified) stands far above the null, and
/// its rule fires where z crosses. MixEM, whose mixture contains the stream's (π = 0 : ½ : ½ : 0), trained on
/// the same stream from every session of its windows (`[window] session_store_patterns` above a
/// window's sessions), stays below the threshold in every held-out window and its rule stays silent.
/// The test is the per-document one (levels per (q, d) and per position refit on the held-out rows);
/// on this stream the simulator's exact click probability scores z ≈ 0 (`examples/misspecification_explore.rs -- oracle`,
/// docs/metrics.md "The 0:1:1:0 mixture, model by model").
fn mixture_scenario(model: &'static str, seed: u64, windows_after: usize) -> Scenario {
    Scenario {
        name: model,
        relevance: RelevanceKind::Linear,
        tau: 0.333,
        tower: "embedding",
        feature_limit: None,
        windows_after,
        sessions_per_window: 15_000,
        seed,
        click_mixture: Some([0.0, 1.0, 1.0, 0.0]),
        model,
        extra_train: String::new(),
    }
}

/// The additive model's signal on three streams (seeds 16, 17, 18; 18 on demand, the CI budget),
/// four held-out windows each:
/// the mean z sits far above the null (a well-specified model's z per window is N(0, 1), so the mean
/// of four exceeds 2 with probability 3·10⁻⁵), and the rule, replayed through promtool, fires in a
/// window exactly when z crossed the threshold there. Seed 16, the seed this was first checked on,
/// crosses in the first held-out window; seed 18 does not within two (z 0.94, 3.77): at 15,000
/// sessions a window the test's power on this mixture is near the threshold, so "fires within two
/// windows" is not asserted.
fn the_additive_model_signal_stands_above_the_null(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&mixture_scenario("additive", seed, 4), &dir.path().join("additive"));
    let first = o.scored.iter().position(|w| w.whole_window).expect("held-out windows");
    let held_out = &o.scored[first..];
    assert!(held_out.len() >= 4 && held_out.iter().all(|w| w.misspecification.assessable), "assessable");
    let zs: Vec<f64> = held_out.iter().map(|w| w.misspecification.z).collect();
    eprintln!("additive on 0:1:1:0, seed {seed}: z per held-out window {zs:.2?}");
    let mean = zs.iter().sum::<f64>() / zs.len() as f64;
    assert!(mean > 2.0, "additive on 0:1:1:0, seed {seed}: mean z {mean:.2}, z {zs:.2?}");
    let expect: Vec<(usize, &str, bool)> =
        zs.iter().enumerate().map(|(i, z)| ((first + i + 1) * 10 - 1, "MisspecificationSuspected", *z > threshold())).collect();
    promtool(dir.path(), &o.exported, &["ultr_misspecification_z{model=\"embedding\"}"], &expect);
}

crate::seeded_tests!(a_non_factorising_mixture_fires_for_the_additive_model => the_additive_model_signal_stands_above_the_null; seed_16 = 16, seed_17 = 17; on_demand seed_18 = 18);

/// MixEM stays below the threshold in four held-out windows on the same three streams (18 on
/// demand), and its rule stays silent.
fn mixem_stays_silent(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&mixture_scenario("mixem", seed, 4), &dir.path().join("mixem"));
    let first = o.scored.iter().position(|w| w.whole_window).expect("held-out windows");
    let held_out = &o.scored[first..];
    assert!(held_out.len() >= 4 && held_out.iter().all(|w| w.misspecification.assessable), "assessable");
    let zs: Vec<f64> = held_out.iter().map(|w| w.misspecification.z).collect();
    assert!(zs.iter().all(|z| *z < threshold()), "MixEM on 0:1:1:0, seed {seed}: z {zs:.2?}");
    let n = o.exported.len();
    promtool(
        dir.path(),
        &o.exported,
        &["ultr_misspecification_z{model=\"mixem/embedding\"}"],
        &[((first + 1) * 10 - 1, "MisspecificationSuspected", false), (n * 10 - 1, "MisspecificationSuspected", false)],
    );
}

crate::seeded_tests!(a_non_factorising_mixture_is_silent_for_mixem => mixem_stays_silent; seed_16 = 16, seed_17 = 17; on_demand seed_18 = 18);
