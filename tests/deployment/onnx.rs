//! The ONNX exports run in a real ONNX runtime (onnxruntime from PyPI, installed by
//! scripts/test.sh; `$ULTR_PYTHON` names its interpreter) and reproduce `ultr score` on every
//! MQ2008 document, and the trained burn model's own click logit θ_k + b(z) + r(x) (as
//! `relevance.json` defines it, too) on every document shown at a trained position.

use crate::common;
use crate::common::OutputWithin;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ultr::train::artefact::Trained;
use ultr::train::config::{TowerKind, TrainConfig};
use ultr::train::data::{Examples, Row, SessionSpan};
use ultr::train::export::RelevanceExport;
use ultr::train::fit::fit;

const TOLERANCE: f64 = 1e-5;

fn python() -> String {
    std::env::var("ULTR_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A checkpoint of `tower` trained briefly on MQ2008 S1 (46 features, two bias features), its
/// export, the trained model and its config.
fn checkpoint(dir: &Path, tower: TowerKind) -> (PathBuf, RelevanceExport, Trained, TrainConfig) {
    let data = common::mq2008_files();
    let dataset = ultr::simulate::dataset::load_svmlight(&[data[0].as_path()]).unwrap();
    let mut ex = Examples { n_features: 46, n_bias_features: 2, ..Examples::default() };
    let mut n = 0u32;
    for q in dataset.queries.iter().take(60) {
        let start = ex.rows.len();
        for (k, d) in q.docs.iter().enumerate().take(10) {
            let qd = ex.qd_keys.len() as u32;
            ex.qd_keys.push((q.query_id.clone(), d.doc_id.clone()));
            ex.docs.extend_from_slice(&d.features);
            n += 1;
            let device = (n % 3) as f32;
            ex.bias.extend_from_slice(&[device, 1.0 - device / 2.0]);
            let clicked = (d.label.unwrap_or(0.0) > 0.0 && k < 6) || n % 9 == (device as u32);
            ex.rows.push(Row { doc: qd, qd, position: k as u32 + 1, impressions: 1, clicks: clicked as u32, propensity: 1.0 });
        }
        ex.sessions.push(SessionSpan { start, len: ex.rows.len() - start, hash: ultr::window::sample_key(&q.query_id, 0), split: None });
    }
    let cfg = TrainConfig { tower, max_epochs: 3, validation_fraction: 0.3, bias_feature_tower: true, ..TrainConfig::default() };
    let (trained, report) = fit(&ex, &cfg, None, false).unwrap();
    let id = common::store_checkpoint(dir, &trained, &report, &cfg);
    let export = serde_json::from_str(&std::fs::read_to_string(dir.join(&id).join("relevance.json")).unwrap()).unwrap();
    (dir.join(id), export, trained, cfg)
}

fn write_f32(path: &Path, values: impl IntoIterator<Item = f32>) {
    std::fs::write(path, values.into_iter().flat_map(f32::to_le_bytes).collect::<Vec<u8>>()).unwrap();
}

/// Runs `model` in onnxruntime on the named input files; the outputs by name.
fn onnxruntime(model: &Path, work: &Path, inputs: &[(&str, &Path)]) -> HashMap<String, Vec<f32>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/onnx_run.py");
    let out_dir = work.join(format!("out-{}", model.file_stem().unwrap().to_string_lossy()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut cmd = Command::new(python());
    cmd.arg(&script).arg(model).arg(&out_dir);
    for (name, path) in inputs {
        cmd.arg(format!("{name}={}", path.display()));
    }
    let out = cmd
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap_or_else(|e| panic!("{} (set ULTR_PYTHON to a python with onnxruntime; scripts/test.sh installs one): {e}", python()));
    assert!(out.status.success(), "onnxruntime on {}: {}{}", model.display(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    std::fs::read_dir(&out_dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let bytes = std::fs::read(e.path()).unwrap();
            let name = e.path().file_stem().unwrap().to_string_lossy().into_owned();
            (name, bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        })
        .collect()
}

/// relevance.onnx equals `ultr score` on all 15,211 MQ2008 documents; click_model.onnx equals the
/// trained burn model's click logits on every document shown at a position θ covers, and the
/// documented click logit θ_k + b(z) + r(x) read from relevance.json on every document, at
/// positions 1–14 (max |Δ| ≤ 1e-5 for each).
#[test]
fn onnx_exports_match_ultr_score_on_every_mq2008_document() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, export, trained, cfg) = checkpoint(&dir.path().join("models"), TowerKind::Mlp);
    assert_eq!(export.version, 2);
    let click = export.click.as_ref().expect("the additive model exports its click logit");
    assert!(click.bias_tower.is_some() && click.theta.len() >= 10);

    // `ultr score` (the burn model) on every MQ2008 file.
    let mut burn = HashMap::new();
    for file in common::mq2008_files() {
        let out = Command::new(env!("CARGO_BIN_EXE_ultr"))
            .args(["score", "--model"])
            .arg(&checkpoint)
            .arg("--input")
            .arg(&file)
            .output_within(crate::common::CHILD_DEADLINE)
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for line in String::from_utf8(out.stdout).unwrap().lines().skip(1) {
            let f: Vec<&str> = line.split('\t').collect();
            burn.insert((f[0].to_string(), f[1].to_string()), f[2].parse::<f64>().unwrap());
        }
    }
    let files = common::mq2008_files();
    let all = ultr::simulate::dataset::load_svmlight(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>()).unwrap();
    let docs: Vec<(String, String, &Vec<f32>)> =
        all.queries.iter().flat_map(|q| q.docs.iter().map(move |d| (q.query_id.clone(), d.doc_id.clone(), &d.features))).collect();
    assert_eq!(docs.len(), 15_211);
    assert_eq!(burn.len(), docs.len(), "ultr score scored every document once");

    let work = dir.path();
    let (features, positions, bias) = (work.join("features.f32"), work.join("position.i64"), work.join("bias.f32"));
    write_f32(&features, docs.iter().flat_map(|(_, _, x)| x[..46].iter().copied()));
    let shown: Vec<i64> = (0..docs.len()).map(|i| (i % 14) as i64 + 1).collect(); // past K = 10 too
    std::fs::write(&positions, shown.iter().flat_map(|k| k.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let z: Vec<[f32; 2]> = (0..docs.len()).map(|i| [(i % 3) as f32, 0.5 * (i % 5) as f32]).collect();
    write_f32(&bias, z.iter().flatten().copied());

    let relevance = onnxruntime(&checkpoint.join("relevance.onnx"), work, &[("features", &features)]);
    let r = &relevance["relevance"];
    assert_eq!(r.len(), docs.len());
    let mut worst: f64 = 0.0;
    for ((q, d, _), onnx) in docs.iter().zip(r) {
        worst = worst.max((burn[&(q.clone(), d.clone())] - *onnx as f64).abs());
    }
    eprintln!("relevance.onnx vs ultr score: max |Δ| {worst:.2e} over {} documents", docs.len());
    assert!(worst <= TOLERANCE, "relevance.onnx differs from ultr score by {worst}");

    let outputs = onnxruntime(&checkpoint.join("click_model.onnx"), work, &[("features", &features), ("position", &positions), ("bias_features", &bias)]);
    let (logits, probabilities) = (&outputs["click_logit"], &outputs["click_probability"]);
    let mut worst: f64 = 0.0;
    for (i, (_, _, x)) in docs.iter().enumerate() {
        let reference = export.click_logit(x, shown[i] as usize, &z[i]).unwrap();
        worst = worst.max((reference - logits[i] as f64).abs()).max((1.0 / (1.0 + (-reference).exp()) - probabilities[i] as f64).abs());
    }
    eprintln!("click_model.onnx vs the documented click logit: max |Δ| {worst:.2e}");
    assert!(worst <= TOLERANCE, "click_model.onnx differs from θ_k + b(z) + r(x) by {worst}");
    // The burn model's own click logits (what training fitted and the gate scores), on the same
    // rows: each document one row at the position it was shown, with its bias features.
    let trained_positions = click.theta.len();
    let mut rows = Examples { n_features: 46, n_bias_features: 2, ..Examples::default() };
    let mut row_of = Vec::new();
    for (i, (q, d, x)) in docs.iter().enumerate().filter(|(i, _)| shown[*i] as usize <= trained_positions) {
        let n = rows.rows.len() as u32;
        rows.qd_keys.push((q.clone(), d.clone()));
        rows.docs.extend_from_slice(&x[..46]);
        rows.bias.extend_from_slice(&z[i]);
        rows.rows.push(Row { doc: n, qd: n, position: shown[i] as u32, impressions: 1, clicks: 0, propensity: 1.0 });
        rows.sessions.push(SessionSpan { start: n as usize, len: 1, hash: n as u64, split: None });
        row_of.push(i);
    }
    let burn_logits = trained.logits(&rows, &cfg.backend.device().unwrap());
    let worst = row_of.iter().zip(&burn_logits).map(|(&i, b)| (*b as f64 - logits[i] as f64).abs()).fold(0.0, f64::max);
    eprintln!("click_model.onnx vs the burn model's click logits: max |Δ| {worst:.2e} over {} documents", row_of.len());
    assert!(row_of.len() > 10_000, "{} documents at positions θ covers", row_of.len());
    assert!(worst <= TOLERANCE, "click_model.onnx differs from the burn model's click logits by {worst}");
    // θ_k matters: the same document at positions 1 and 2 gets different logits, as θ says.
    assert!((click.theta[0] - click.theta[1]).abs() > 1e-6);
    let k1 = export.click_logit(docs[0].2, 1, &z[0]).unwrap() - export.click_logit(docs[0].2, 2, &z[0]).unwrap();
    assert!((k1 - (click.theta[0] - click.theta[1])).abs() < 1e-9);
}

/// An embedding tower is a lookup by ids: no relevance.onnx, and the reason says so.
#[test]
fn an_embedding_tower_has_no_onnx_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, export, _, _) = checkpoint(&dir.path().join("models"), TowerKind::Embedding);
    assert!(!checkpoint.join("relevance.onnx").exists() && !checkpoint.join("click_model.onnx").exists());
    let err = ultr::train::onnx::relevance_onnx(&export).unwrap_err().to_string();
    assert!(err.contains("embedding") && err.contains("relevance.json"), "{err}");
}
