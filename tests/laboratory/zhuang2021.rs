//! `ultr experiment zhuang2021` at a small scale (MQ2008 fold 1, 50,000 training sessions per cell, 3
//! seeds, DCM clicks, the two methods the assertions read, Pos and XPA): what reproduces robustly is
//! asserted — XPA predicts cascade (DCM) clicks better than the additive model beyond the paired seed
//! noise (a one-sided paired t-test) — and the attention matrix is a proper one (rows over the other
//! positions sum to 1). PBM clicks are left out: 3 seeds cannot show XPA's non-inferiority there (the
//! test says why), so no assertion could read them. docs/experiments.md "Reproducing Zhuang et al.
//! 2021" has the rest.

use crate::common;

use ultr::train::config::TowerKind;
use ultr::train::device::BackendKind;
use ultr_lab::experiment::zhang2023::beyond_noise;
use ultr_lab::experiment::zhuang2021::{self as z, Method, Options};

#[test]
fn zhuang2021_xpa_fits_cascade_clicks_better_than_the_additive_model() {
    let dir = tempfile::tempdir().unwrap();
    let data = ultr_lab::experiment::yan2022::mq2008(common::mq2008_files()[0].parent().unwrap()).unwrap();
    let opts = Options {
        out: dir.path().to_path_buf(),
        train_sessions: 50_000,
        seeds: vec![1, 2, 3],
        max_epochs: 50,
        jobs: 1, // one run at a time: runs in parallel share burn's device generator
        backend: BackendKind::Flex,
        tower: TowerKind::Mlp,
        max_positions: 10,
        logging_label_fraction: 0.01,
        // DCM only: the PBM cells were half the runs and were only printed (below).
        click_models: vec!["DCM".into()],
        methods: Method::table().into_iter().filter(|m| ["Pos", "XPA"].contains(&m.name.as_str())).collect(),
        progress: false,
    };
    let summary = z::run(&opts, std::slice::from_ref(&data)).unwrap();
    for f in ["results.csv", "summary.md", "summary.json", "attention.svg"] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
    eprintln!("{}", std::fs::read_to_string(dir.path().join("summary.md")).unwrap());
    assert_eq!(summary.runs.len(), 2 * 3);
    let ll = |click: &str, method: &str| -> Vec<(u64, f64)> {
        summary.runs.iter().filter(|r| r.click_model == click && r.method == method).map(|r| (r.seed, r.click_log_likelihood)).collect()
    };
    // One-sided paired t-tests at 5% with 2 degrees of freedom (t = 2.92).
    let (better, diff, bound) = beyond_noise(&ll("DCM", "XPA"), &ll("DCM", "Pos"));
    assert!(better, "DCM: XPA − Pos log-likelihood {diff:+.5} (t·se {bound:.5})");
    // Not run: "XPA is not worse than Pos on PBM clicks". Tested as "not worse beyond noise" it could
    // not fail at 3 seeds; tested as non-inferiority within 0.0005 nats (the experiment's claim 1) it
    // failed here for want of power: XPA − Pos = −0.00014, t·se = 0.00198 (paired sd ≈ 0.0012 nats),
    // so the bound needs about 50 seeds. The full run reports it (docs/experiments.md).
    for r in summary.runs.iter().filter(|r| r.method == "XPA") {
        assert_eq!(r.attention.len(), 10);
        for (j, row) in r.attention.iter().enumerate() {
            assert_eq!(row[j], 0.0, "an item does not attend to itself");
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-4, "row {j} of the attention sums to {}", row.iter().sum::<f64>());
        }
    }
}
