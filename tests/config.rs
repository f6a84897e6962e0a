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
    let err = PipelineConfig::parse("source = \"simulator\"\n[train]\nkeep_checkpoints = 0\n", "z.toml").unwrap_err().to_string();
    assert!(err.contains("z.toml") && err.contains("train.keep_checkpoints"), "{err}");
}
