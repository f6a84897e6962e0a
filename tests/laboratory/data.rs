//! The repository ships its LTR data (`data/`, gzipped): the files decompress to the recorded
//! digests, parse into the datasets the README describes, and are found without anything beside
//! the clone.

use sha2::{Digest, Sha256};
use ultr::simulate::dataset;

use crate::common;

#[test]
fn shipped_data_decompress_to_their_recorded_digests() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let mut checked = 0;
    for line in sums.lines() {
        let (digest, name) = line.split_once("  ").expect("sha256sum format");
        let text = dataset::read_text(&dir.join(name)).unwrap();
        let got: String = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, digest, "{name}");
        checked += 1;
    }
    assert_eq!(checked, 9, "five MQ2008 subsets, LightGBM's two files and two group files");
}

#[test]
fn shipped_data_parse_into_the_documented_datasets() {
    let mq = dataset::default_mq2008_dir().expect("data/mq2008");
    assert!(mq.starts_with(common::data_dir()));
    let files: Vec<_> = (1..=5).map(|i| mq.join(format!("S{i}.txt"))).collect();
    let all = dataset::load_svmlight(&files.iter().map(|p| p.as_path()).collect::<Vec<_>>()).unwrap();
    assert_eq!((all.queries.len(), all.n_docs(), all.n_features, all.max_label()), (784, 15_211, 46, Some(2.0)));
    let rank = dataset::default_lightgbm_rank_dir().expect("data/lightgbm-rank");
    let train = dataset::load_lightgbm(&rank.join("rank.train"), &rank.join("rank.train.query")).unwrap();
    let test = dataset::load_lightgbm(&rank.join("rank.test"), &rank.join("rank.test.query")).unwrap();
    assert_eq!((train.queries.len(), train.n_docs(), train.max_label()), (201, 3_005, Some(4.0)));
    assert_eq!((test.queries.len(), test.n_docs()), (50, 768));
}

/// A plain copy and its gzip read alike; a missing file names both names it looked for.
#[test]
fn plain_and_gzipped_files_read_alike() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = dataset::default_mq2008_dir().unwrap().join("S5.txt");
    let text = dataset::read_text(&shipped).unwrap();
    let plain = dir.path().join("S5.txt");
    std::fs::write(&plain, &text).unwrap();
    assert_eq!(dataset::read_text(&plain).unwrap(), text);
    let a = dataset::load_svmlight(&[&plain]).unwrap();
    let b = dataset::load_svmlight(&[&shipped]).unwrap();
    assert_eq!((a.queries.len(), a.n_docs()), (b.queries.len(), b.n_docs()));
    let err = dataset::read_text(&dir.path().join("S9.txt")).unwrap_err().to_string();
    assert!(err.contains("S9.txt") && err.contains("S9.txt.gz"), "{err}");
}
