//! The deployment files, checked without Docker: docker-compose.yml parses, every image is pinned,
//! every mounted file exists, the configs it mounts parse, and every metric the alert rules and the
//! Grafana dashboard query is one `ultr run` exports. Alert rules pass `promtool test rules`.

use crate::common::OutputWithin;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn yaml(path: &Path) -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn pinned(image: &str) -> bool {
    if image.contains("@sha256:") {
        return true;
    }
    let tag = image.rsplit_once(':').filter(|(name, _)| !name.ends_with('/') && !name.is_empty());
    matches!(tag, Some((_, t)) if t != "latest" && !t.contains('/'))
}

#[test]
fn compose_file_is_complete_and_pinned() {
    let compose = yaml(&repo().join("docker-compose.yml"));
    let services = compose["services"].as_mapping().expect("services");
    let names: BTreeSet<&str> = services.keys().filter_map(|k| k.as_str()).collect();
    for needed in ["kafka", "ultr", "s3", "s3-bucket", "prometheus", "alertmanager", "grafana"] {
        assert!(names.contains(needed), "service {needed} missing");
    }
    let mut mounted_targets = BTreeSet::new();
    for (name, svc) in services {
        let name = name.as_str().unwrap();
        let image = svc["image"].as_str().unwrap_or_else(|| panic!("service {name} has no image"));
        assert!(pinned(image), "service {name}: image {image} is not pinned to a version");
        for dep in svc["depends_on"].as_sequence().into_iter().flatten() {
            assert!(names.contains(dep.as_str().unwrap()), "{name} depends on unknown {dep:?}");
        }
        for v in svc["volumes"].as_sequence().into_iter().flatten() {
            let spec = v.as_str().unwrap();
            let parts: Vec<&str> = spec.split(':').collect();
            if parts[0].starts_with("./") {
                let source = repo().join(parts[0]);
                assert!(source.is_file(), "service {name} mounts {} which does not exist", source.display());
                mounted_targets.insert((name.to_string(), parts[1].to_string(), source));
            } else {
                let volumes = compose["volumes"].as_mapping().expect("named volumes declared");
                assert!(volumes.contains_key(Value::from(parts[0])), "{name} uses undeclared volume {}", parts[0]);
            }
        }
    }
    // ultr runs the mounted pipeline config, which must parse and listen where Prometheus scrapes.
    let ultr = &compose["services"]["ultr"];
    let command: Vec<&str> = ultr["command"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(command[0], "run");
    let config_target = command[1];
    let (_, _, config_file) = mounted_targets.iter().find(|(s, t, _)| s == "ultr" && t == config_target).expect("ultr's config is mounted");
    let config = ultr::config::PipelineConfig::load(config_file).unwrap();
    let listen = command.iter().position(|a| *a == "--listen").map(|i| command[i + 1]).unwrap();
    let port = listen.rsplit(':').next().unwrap();
    // Scalable (`--scale ultr=3`): no fixed host port, state in the compose object store, the
    // bucket created before ultr starts, and Prometheus scraping every replica found by DNS.
    assert!(ultr["ports"].is_null(), "a fixed host port would stop `--scale ultr=3`");
    assert!(ultr["expose"].as_sequence().unwrap().iter().any(|p| p.as_str() == Some(port)));
    let store = config.state.object_store.as_ref().expect("the scaled service keeps its state in the object store");
    let endpoint = store.options.get("aws_endpoint").unwrap();
    assert!(endpoint.starts_with("http://s3:"), "{endpoint}");
    let bucket = store.url.trim_start_matches("s3://").split('/').next().unwrap();
    let init: Vec<&str> = compose["services"]["s3-bucket"]["command"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(init.iter().any(|a| *a == format!("{endpoint}/{bucket}")), "s3-bucket creates bucket {bucket} at {endpoint}: {init:?}");
    assert!(ultr["depends_on"].as_sequence().unwrap().iter().any(|d| d.as_str() == Some("s3-bucket")));
    let prom_target = mounted_targets.iter().find(|(s, t, _)| s == "prometheus" && t.ends_with("prometheus.yml")).unwrap();
    let prom = yaml(&prom_target.2);
    let sd = &prom["scrape_configs"][0]["dns_sd_configs"][0];
    assert_eq!(sd["names"][0].as_str(), Some("ultr"));
    assert_eq!(sd["port"].as_u64().map(|p| p.to_string()).as_deref(), Some(port));
    let rule_file = prom["rule_files"][0].as_str().unwrap();
    let (_, _, rules_source) = mounted_targets.iter().find(|(s, t, _)| s == "prometheus" && t == rule_file).expect("the rule file Prometheus loads is mounted");
    assert!(rules_source.ends_with("pipelines/alerts.yml"));
    let am = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0].as_str().unwrap();
    assert!(am.starts_with("alertmanager:"));
    // Grafana: datasource points at the prometheus service; the dashboard file is provisioned.
    let grafana: Vec<&(String, String, PathBuf)> = mounted_targets.iter().filter(|(s, _, _)| s == "grafana").collect();
    let ds = grafana.iter().find(|(_, t, _)| t.contains("datasources")).unwrap();
    assert_eq!(yaml(&ds.2)["datasources"][0]["url"].as_str().unwrap(), "http://prometheus:9090");
    let provider = grafana.iter().find(|(_, t, _)| t.contains("provisioning/dashboards")).unwrap();
    let dash_dir = yaml(&provider.2)["providers"][0]["options"]["path"].as_str().unwrap().to_string();
    assert!(grafana.iter().any(|(_, t, p)| t.starts_with(&dash_dir) && p.ends_with("grafana-dashboard.json")));
    // Dockerfile base images pinned too.
    for line in std::fs::read_to_string(repo().join("Dockerfile")).unwrap().lines().filter(|l| l.starts_with("FROM ")) {
        let image = line.split_whitespace().nth(1).unwrap();
        assert!(pinned(image), "Dockerfile: {image} is not pinned");
    }
}

/// The `ultr_…` metric names in a PromQL expression (a histogram's `_bucket` by its family).
pub(crate) fn metric_names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("ultr_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let preceded_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_' || bytes[start - 1] == b'`');
        if preceded_ok {
            out.insert(text[start..end].trim_end_matches("_bucket").to_string());
        }
        i = end;
    }
    out
}

/// Every rule has a runbook and every fault the alerting tests inject has its rule; the dashboard
/// queries metrics. That each queried metric is exported is checked against running instances'
/// `/metrics` (`alerting::demo_shape_…`, `single_instance_…`, `a_model_ranking_below_…`), not here.
#[test]
fn alert_rules_have_runbooks_and_the_dashboard_queries_metrics() {
    let rules = yaml(&repo().join("pipelines/alerts.yml"));
    let mut alert_names = BTreeSet::new();
    for rule in rules["groups"][0]["rules"].as_sequence().unwrap() {
        alert_names.insert(rule["alert"].as_str().unwrap().to_string());
        assert!(rule["annotations"]["runbook"].as_str().is_some_and(|r| r.len() > 40), "{:?} has no runbook", rule["alert"]);
        assert!(!metric_names_in(rule["expr"].as_str().unwrap()).is_empty(), "alert {:?} queries no ultr metric", rule["alert"]);
    }
    for needed in [
        "IdentifiabilityLost",
        "FeatureOverlapLow",
        "MisspecificationSuspected",
        "LoggedPropensityMismatch",
        "ResidualDrift",
        "TrainingStale",
        "IngestErrorsHigh",
        "ConsumerLagHigh",
    ] {
        assert!(alert_names.contains(needed), "{needed}");
    }
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(repo().join("pipelines/grafana-dashboard.json")).unwrap()).unwrap();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queried += metric_names_in(target["expr"].as_str().unwrap()).len();
        }
    }
    assert!(queried >= 20);
}

#[test]
fn alert_rules_pass_promtool() {
    let dir = repo().join("pipelines");
    let check = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg("alerts.yml")
        .current_dir(&dir)
        .output_within(crate::common::CHILD_DEADLINE)
        .expect("promtool (Debian package `prometheus`) on PATH");
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    let test = Command::new("promtool").arg("test").arg("rules").arg("alerts.test.yml").current_dir(&dir).output_within(crate::common::CHILD_DEADLINE).unwrap();
    assert!(test.status.success(), "{}{}", String::from_utf8_lossy(&test.stdout), String::from_utf8_lossy(&test.stderr));
}
