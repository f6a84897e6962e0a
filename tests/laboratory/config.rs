//! Pipeline configs: the shipped ones parse; bad ones fail with the file and the key named.

use std::path::Path;

use ultr::config::{PipelineConfig, SourceConfig};

#[test]
fn shipped_pipelines_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            PipelineConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 1);
    let demo = PipelineConfig::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/demo.toml")).unwrap();
    assert_eq!(demo.source, SourceConfig::Simulator);
    assert_eq!(demo.decode.feature_dim, Some(46));
}

#[test]
fn unknown_key_is_named_with_the_file() {
    let err = PipelineConfig::parse("source = \"simulator\"\n[decode]\nmax_itemz = 3\n", "pipelines/bad.toml").unwrap_err().to_string();
    assert!(err.contains("pipelines/bad.toml") && err.contains("max_itemz"), "{err}");
    let err = PipelineConfig::parse("source = \"simulator\"\n[simulator.policy]\ntau = 2.0\n", "x.toml").unwrap_err().to_string();
    assert!(err.contains("x.toml") && err.contains("tau"), "{err}");
    let err = PipelineConfig::parse("source = \"simulator\"\nbatch_records = 0\n", "y.toml").unwrap_err().to_string();
    assert!(err.contains("y.toml") && err.contains("batch_records"), "{err}");
    // `[train]` flattens the models' sections into itself: its unknown keys are still named.
    let err = PipelineConfig::parse("source = \"simulator\"\n[train]\nlearning_rat = 0.1\n", "t.toml").unwrap_err().to_string();
    assert!(err.contains("t.toml") && err.contains("key `train.learning_rat`"), "{err}");
    let err = PipelineConfig::parse("source = \"simulator\"\n[train.dla]\nmax_weigth = 2\n", "t.toml").unwrap_err().to_string();
    assert!(err.contains("t.toml") && err.contains("max_weigth"), "{err}");
    let err = PipelineConfig::parse("source = \"simulator\"\n[train]\nkeep_checkpoints = 0\n", "z.toml").unwrap_err().to_string();
    assert!(err.contains("z.toml") && err.contains("train.keep_checkpoints"), "{err}");
    let err = PipelineConfig::parse("source = \"simulator\"\n[train]\naggregated_epoch = \"sessions\"\n", "e.toml").unwrap_err().to_string();
    assert!(err.contains("e.toml") && err.contains("aggregated_epoch") && err.contains("rows"), "{err}");
    let ok = PipelineConfig::parse("source = \"simulator\"\n[train]\naggregated_epoch = \"rows\"\n", "e.toml").unwrap();
    assert_eq!(ok.train.aggregated_epoch, ultr::train::config::AggregatedEpoch::Rows);
    let err = PipelineConfig::parse("source = \"simulator\"\n[window]\nsession_store_patterns = 0\n", "w.toml").unwrap_err().to_string();
    assert!(err.contains("w.toml") && err.contains("window.session_store_patterns"), "{err}");
    let ok = PipelineConfig::parse("source = \"simulator\"\n[window]\nsession_store_patterns = 50000\n", "w.toml").unwrap();
    assert_eq!(ok.window.statistic_bounds().session_store_patterns, 50_000);
}

#[test]
fn object_store_settings_are_checked_naming_the_key() {
    let kafka = "[source.kafka]\nbrokers = \"b:9092\"\ngroup_id = \"g\"\ntopics = [\"t\"]\n";
    let ok = format!("{kafka}[state.object_store]\nurl = \"s3://bucket/prefix\"\n");
    PipelineConfig::parse(&ok, "ok.toml").unwrap();
    let cases = [
        ("source = \"simulator\"\n[state.object_store]\nurl = \"s3://b/p\"\n".to_string(), "state.object_store"),
        (format!("{kafka}[state.object_store]\nurl = \"file:///shared/ultr\"\n"), "state.object_store.url"),
        (format!("{kafka}[state.object_store]\nurl = \"s3://b/p\"\nlease_ttl = \"soon\"\n"), "state.object_store.lease_ttl"),
        (format!("{kafka}[dead_letter.file]\npath = \"dead.jsonl\"\n[state.object_store]\nurl = \"s3://b/p\"\n"), "dead_letter.file"),
        (format!("{kafka}[state.object_store]\nurl = \"s3://b/p\"\nbucket = \"x\"\n"), "bucket"),
        // Regression: object_store's parse_url_opts drops keys it does not know, so a typo sent the
        // client to real AWS with default settings. Refused, naming the key and the file.
        (
            format!("{kafka}[state.object_store]\nurl = \"s3://b/p\"\noptions = {{ aws_endpiont = \"http://s3:5000\" }}\n"),
            "state.object_store.options.aws_endpiont",
        ),
        (format!("{kafka}[decode]\nmax_event_age = \"a while\"\n"), "decode.max_event_age"),
    ];
    for (text, key) in cases {
        let err = PipelineConfig::parse(&text, "scaled.toml").unwrap_err().to_string();
        assert!(err.contains("scaled.toml") && err.contains(key), "{key}: {err}");
    }
    // The keys object_store knows pass, in either spelling and case.
    let known = format!("{kafka}[state.object_store]\nurl = \"s3://b/p\"\noptions = {{ aws_endpoint = \"http://s3:5000\", AWS_REGION = \"us-east-1\", allow_http = \"true\", aws_access_key_id = \"env:K\" }}\n");
    PipelineConfig::parse(&known, "ok.toml").unwrap();
}

/// `docs/configuration.md` is what `ultr config-reference` writes today: a key added, removed or
/// re-documented without regenerating it fails here. `ULTR_BLESS=1` rewrites the file and fails the
/// test all the same (a blessed run never passes; the next run compares the written file), and
/// `scripts/test.sh` refuses to run with it set. And the reference lists every key the loader fills
/// in with a default.
#[test]
fn the_configuration_reference_is_generated_and_current() {
    let generated = ultr::config_reference::render();
    generated_and_current("docs/configuration.md", &generated, "ultr config-reference");
    let config = ultr::config::PipelineConfig::parse("source = \"simulator\"\n", "test").unwrap();
    let defaults = toml::Value::try_from(&config).unwrap();
    fn leaves(v: &toml::Value, path: &str, out: &mut Vec<(String, String)>) {
        if let Some(t) = v.as_table() {
            for (k, v) in t {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                if v.is_table() {
                    leaves(v, &p, out);
                } else {
                    out.push((path.to_string(), k.clone()));
                }
            }
        }
    }
    let mut keys = Vec::new();
    leaves(&defaults, "", &mut keys);
    assert!(keys.len() >= 90, "the walk over the defaults found only {} keys", keys.len());
    for (table, key) in keys {
        let section = if table.is_empty() { "## Top level".to_string() } else { format!("## `[{table}]`") };
        let body = generated.split(&section).nth(1).unwrap_or_else(|| panic!("no section {section}"));
        let body = body.split("\n## ").next().unwrap();
        // A key whose value picks a table (`source = "simulator"` or `[source.kafka]`) has a section of its own.
        let full = if table.is_empty() { key.clone() } else { format!("{table}.{key}") };
        assert!(body.contains(&format!("| `{key}` |")) || generated.contains(&format!("## `{full}`")), "{full} is not in the reference");
    }
}

/// `pipelines/alerts.yml` is what `ultr alert-rules` writes from the signals catalog today: a rule
/// or threshold changed in the catalog without regenerating the file fails here (promtool's test and
/// the deployment's Prometheus read the file). `ULTR_BLESS=1` rewrites it and fails the test all the
/// same, as for the configuration reference.
#[test]
fn the_alert_rules_file_is_generated_from_the_signals_catalog_and_current() {
    generated_and_current("pipelines/alerts.yml", &ultr::monitor::signals::alerts_yaml(), "ultr alert-rules");
}

/// `pipelines/alerts.test.yml` (promtool's unit tests of the rules) is what `ultr alert-rules
/// --tests` writes from the catalog's scenarios today, blessed as the rules file is.
#[test]
fn the_alert_rules_promtool_tests_are_generated_from_the_signals_catalog_and_current() {
    generated_and_current("pipelines/alerts.test.yml", &ultr::monitor::signals::alerts_test_yaml(), "ultr alert-rules --tests");
}

/// Fails unless the committed `file` equals `generated`; `ULTR_BLESS=1` rewrites it and fails all the same.
fn generated_and_current(file: &str, generated: &str, command: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    if std::env::var_os("ULTR_BLESS").is_some() {
        std::fs::write(&path, generated).unwrap();
        panic!("ULTR_BLESS: {file} rewritten; this run does not pass, run the test again without it");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(committed == generated, "{file} is stale: run `{command} > {file}`");
}

/// Every command that writes a state finds its directory by one rule: `--state`, else `[state] dir`,
/// else `ultr-state/<the pipeline file's name>`.
#[test]
fn the_state_directory_is_the_flag_else_the_key_else_one_named_after_the_pipeline_file() {
    use std::path::{Path, PathBuf};
    let bare = ultr::config::PipelineConfig::parse("source = \"simulator\"\n", "bare.toml").unwrap();
    let keyed = ultr::config::PipelineConfig::parse("source = \"simulator\"\n[state]\ndir = \"/srv/ultr\"\n", "keyed.toml").unwrap();
    let file = Path::new("conf/nightly.toml");
    assert_eq!(bare.state_dir(None, file), PathBuf::from("ultr-state/nightly"));
    assert_eq!(keyed.state_dir(None, file), PathBuf::from("/srv/ultr"));
    assert_eq!(keyed.state_dir(Some(Path::new("here")), file), PathBuf::from("here"));
}

/// A pipeline file's context has the file's settings: `[runtime] worker_threads` and `[state]
/// query_memory_limit` (two files in one process, each its own).
#[test]
fn the_pipeline_context_takes_the_files_worker_threads_and_query_memory_limit() {
    let parse = |text: &str| ultr::config::PipelineConfig::parse(text, "pipeline.toml").unwrap().context();
    let small = parse("source = \"simulator\"\n[runtime]\nworker_threads = 3\n[state]\nquery_memory_limit = \"64MiB\"\n");
    let default = parse("source = \"simulator\"\n");
    assert_eq!((small.worker_threads(), small.query_memory_limit()), (3, 64 << 20));
    assert_eq!((default.worker_threads(), default.query_memory_limit()), (2, 1 << 30));
}
