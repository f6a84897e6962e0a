//! The model store: one directory per checkpoint (written atomically), a `CURRENT` pointer that only
//! the promotion gate moves, and rejected candidates kept with their reason. Only an explicit
//! retention (`train.keep_checkpoints`) deletes, oldest first, and never the current model.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use super::artefact::{ModelMeta, Trained};
use super::config::TrainConfig;
use super::export;
use super::fit::StopReason;
use super::models::AnyModel;

pub const CURRENT: &str = "CURRENT";
const RECORD: &str = "model.bpk";
const META: &str = "meta.json";
const INFO: &str = "checkpoint.json";
const VOCABULARY: &str = "vocabulary.json";

/// The gate's verdict on a candidate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Decision {
    pub promoted: bool,
    pub reason: String,
    /// The candidate's loss on the evaluation slice (sessions neither its optimizer nor its early
    /// stopping saw). Checkpoints from before the three-way split call it validation loss.
    #[serde(alias = "candidate_validation_loss")]
    pub candidate_evaluation_loss: f64,
    /// The current model's loss on the same evaluation rows and weights.
    #[serde(alias = "current_validation_loss")]
    pub current_evaluation_loss: Option<f64>,
    pub current: Option<String>,
    /// Held-out click log-likelihoods of the candidate and the trivial baselines (`baselines`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out_clicks: Option<super::baselines::HeldOutClicks>,
    /// With `[eval] qrels`: the shipped ranking against the logged order on the editors' labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judged: Option<JudgedGate>,
    /// The combination's cross-fitted held-out click log-likelihood per impression beside the
    /// logged order alone's (`logged_order_combination.rs`), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logged_order_clicks: Option<(f64, f64)>,
}

/// The gate's judged check (`[eval] qrels`): nDCG@10 of the ranking that ships (the combination
/// when training chose one, else the model) less the logged order's, paired over queries.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JudgedGate {
    pub ranker: String,
    pub queries: usize,
    pub ndcg10: f64,
    pub logged_ndcg10: f64,
    /// The paired difference and its 95% bootstrap interval over queries.
    pub minus_logged: f64,
    pub minus_logged_low: f64,
    pub minus_logged_high: f64,
    /// Not promoted: the interval lies below 0.
    pub refused: bool,
}

/// What a checkpoint records besides its parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub id: String,
    pub created_at: String,
    pub config: TrainConfig,
    /// Event-time range of the windows trained on.
    pub data_range_ms: Option<(i64, i64)>,
    /// The checkpoint this one warm-started from.
    pub parent: Option<String>,
    /// θ_k − θ_1, k = 1..=max_positions.
    pub theta: Vec<f64>,
    pub fit: serde_json::Value,
    pub decision: Decision,
    /// θ's converged estimate and bootstrap intervals, when they were computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub theta_intervals: Option<super::uncertainty::ThetaIntervals>,
}

/// The gate: finite training; held-out clicks predicted at least as well as by position alone (never
/// overridden, not even by `force`); and an evaluation-slice loss not worse than the current model's
/// on the same rows beyond `tolerance` (relative).
pub fn decide(
    stop: StopReason,
    candidate_loss: f64,
    held_out: Option<&super::baselines::HeldOutClicks>,
    current: Option<(&str, anyhow::Result<f64>)>,
    tolerance: f64,
    force: bool,
) -> Decision {
    let mut d = Decision {
        promoted: false,
        reason: String::new(),
        candidate_evaluation_loss: candidate_loss,
        current_evaluation_loss: None,
        current: current.as_ref().map(|(id, _)| id.to_string()),
        held_out_clicks: held_out.cloned(),
        judged: None,
        logged_order_clicks: None,
    };
    if stop == StopReason::Diverged || !candidate_loss.is_finite() || held_out.is_some_and(|h| !h.candidate.is_finite()) {
        d.reason = "training diverged (a loss or parameter became NaN/inf)".into();
        return d;
    }
    if let Some(h) = held_out.filter(|h| h.applies && h.candidate < h.position_only) {
        d.reason = format!(
            "held-out click log-likelihood {:.5} per impression is worse than the position-only model's {:.5}: the model predicts clicks worse than position alone",
            h.candidate, h.position_only
        );
        return d;
    }
    match current {
        None => {
            d.promoted = true;
            d.reason = "first model".into();
        }
        Some((id, Err(e))) => {
            d.promoted = force;
            d.reason = if force {
                format!("promoted by --force although the current model {id} cannot score this data: {e:#}")
            } else {
                format!("the current model {id} cannot score this data ({e:#}); promote with --force after checking")
            };
        }
        Some((id, Ok(loss))) => {
            d.current_evaluation_loss = Some(loss);
            let bound = loss * (1.0 + tolerance);
            if candidate_loss <= bound || force || !loss.is_finite() {
                d.promoted = true;
                d.reason = format!("evaluation loss {candidate_loss:.6} ≤ {bound:.6} (current {id}: {loss:.6}, tolerance {tolerance})");
            } else {
                d.reason = format!("evaluation loss {candidate_loss:.6} is worse than the current model {id}'s {loss:.6} beyond tolerance {tolerance}");
            }
        }
    }
    d
}

pub struct ModelStore {
    dir: PathBuf,
}

impl ModelStore {
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating model directory {}", dir.display()))?;
        Ok(ModelStore { dir: dir.to_path_buf() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The exclusive right to write this directory (a CronJob's `ultr train` next to `ultr run`'s
    /// schedule: the second is refused instead of interleaving). Holding it, leftovers of a writer
    /// that crashed (`.tmp-*`, `.deleting-*`) are removed.
    pub fn lock_for_writing(&self) -> anyhow::Result<ultr_core::state::lock::DirLock> {
        let lock = ultr_core::state::lock::DirLock::acquire(&self.dir, "models directory")?;
        for entry in fs::read_dir(&self.dir).with_context(|| format!("reading {}", self.dir.display()))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") || name.starts_with(".deleting-") {
                let path = entry.path();
                tracing::info!("removing {} left by an interrupted writer", path.display());
                if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) }.with_context(|| format!("removing {}", path.display()))?;
            }
        }
        Ok(lock)
    }

    /// The promoted checkpoint's id, if any.
    pub fn current_id(&self) -> anyhow::Result<Option<String>> {
        let path = self.dir.join(CURRENT);
        if !path.exists() {
            return Ok(None);
        }
        let id = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?.trim().to_string();
        if !self.dir.join(&id).join(INFO).exists() {
            bail!("{} names {id:?}, which is not a checkpoint in {}", path.display(), self.dir.display());
        }
        Ok(Some(id))
    }

    /// When the promoted checkpoint was trained (Unix seconds), if there is one.
    pub fn current_created_at(&self) -> anyhow::Result<Option<f64>> {
        let Some(id) = self.current_id()? else { return Ok(None) };
        let info = self.info(&id)?;
        let at = chrono::DateTime::parse_from_rfc3339(&info.created_at).with_context(|| format!("checkpoint {id}: created_at {:?}", info.created_at))?;
        Ok(Some(at.timestamp_millis() as f64 / 1000.0))
    }

    pub fn info(&self, id: &str) -> anyhow::Result<CheckpointInfo> {
        let path = self.dir.join(id).join(INFO);
        let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a checkpoint description", path.display()))
    }

    /// Every checkpoint, oldest first.
    pub fn list(&self) -> anyhow::Result<Vec<CheckpointInfo>> {
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && e.path().join(INFO).exists() {
                out.push(self.info(&name)?);
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Loads a checkpoint's model for inference on `device`.
    pub fn load(&self, id: &str, device: &Device) -> anyhow::Result<Trained> {
        let dir = self.dir.join(id);
        let meta: ModelMeta = serde_json::from_str(&fs::read_to_string(dir.join(META)).with_context(|| format!("reading {}", dir.join(META).display()))?)
            .with_context(|| format!("{}: not a model description from this version of ultr", dir.join(META).display()))?;
        let vocabulary: Vec<(String, String)> = if meta.architecture.tower.pair_embedding() {
            serde_json::from_str(&fs::read_to_string(dir.join(VOCABULARY))?).with_context(|| format!("{}", dir.join(VOCABULARY).display()))?
        } else {
            vec![(String::new(), String::new())]
        };
        let model = AnyModel::load(&meta.architecture, meta.n_features, meta.n_bias_features, vocabulary.len(), &dir.join(RECORD), device)?;
        Ok(Trained { model, meta, vocabulary })
    }

    /// Writes a checkpoint directory atomically, then moves `CURRENT` if the decision promotes it.
    pub fn write(&self, trained: &Trained, mut info: CheckpointInfo) -> anyhow::Result<String> {
        let id = self.new_id();
        info.id = id.clone();
        let tmp = self.dir.join(format!(".tmp-{id}"));
        fs::create_dir_all(&tmp)?;
        trained.model.save(&tmp.join(RECORD))?;
        write_json(&tmp.join(META), &trained.meta)?;
        if trained.meta.architecture.tower.pair_embedding() {
            write_json(&tmp.join(VOCABULARY), &trained.vocabulary)?;
        }
        write_export(&tmp, trained)?;
        let mut csv = String::from("position,theta_minus_theta1\n");
        for (k, t) in info.theta.iter().enumerate() {
            csv.push_str(&format!("{},{t:.6}\n", k + 1));
        }
        fs::write(tmp.join("theta.csv"), csv)?;
        write_json(&tmp.join(INFO), &info)?;
        sync_dir(&tmp)?;
        fs::rename(&tmp, self.dir.join(&id))?;
        sync_dir(&self.dir)?;
        if info.decision.promoted {
            self.set_current(&id)?;
        }
        Ok(id)
    }

    /// Deletes the oldest checkpoints so that at most `keep` remain besides the current one, which
    /// is never deleted. Returns the deleted ids, oldest first. A checkpoint is renamed to a
    /// dot-name before its files go, so a crash mid-delete never leaves a half checkpoint listed.
    pub fn prune(&self, keep: usize) -> anyhow::Result<Vec<String>> {
        let current = self.current_id()?;
        let all = self.list()?;
        let mut kept = 0;
        let mut doomed = Vec::new();
        for info in all.iter().rev() {
            if Some(&info.id) == current.as_ref() {
                continue;
            }
            if kept < keep {
                kept += 1;
            } else {
                doomed.push(info.id.clone());
            }
        }
        doomed.reverse();
        for id in &doomed {
            let trash = self.dir.join(format!(".deleting-{id}"));
            fs::rename(self.dir.join(id), &trash).with_context(|| format!("retiring checkpoint {id}"))?;
            fs::remove_dir_all(&trash).with_context(|| format!("deleting {}", trash.display()))?;
        }
        if !doomed.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(doomed)
    }

    fn set_current(&self, id: &str) -> anyhow::Result<()> {
        let tmp = self.dir.join(".tmp-CURRENT");
        fs::write(&tmp, format!("{id}\n"))?;
        fs::File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, self.dir.join(CURRENT))?;
        sync_dir(&self.dir)
    }

    fn new_id(&self) -> String {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ").to_string().replace('.', "");
        let mut n = 0;
        loop {
            let id = format!("m-{stamp}-{n}");
            if !self.dir.join(&id).exists() && !self.dir.join(format!(".tmp-{id}")).exists() {
                return id;
            }
            n += 1;
        }
    }
}

fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let mut f = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(&serde_json::to_vec_pretty(value)?)?; // whole: a file writer makes a call per token
    f.sync_all()?;
    Ok(())
}

use ultr_core::state::sync_dir;

/// Writes `relevance.json` and the ONNX files the checkpoint supports (`onnx.rs`).
fn write_export(dir: &Path, trained: &Trained) -> anyhow::Result<()> {
    let export = export::to_export(trained);
    let mut f = fs::File::create(dir.join(export::EXPORT))?;
    f.write_all(&serde_json::to_vec(&export)?)?;
    f.sync_all()?;
    super::onnx::write_onnx(dir, &export)?;
    Ok(())
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn a_writer_removes_what_a_crashed_writer_left() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ModelStore::open(tmp.path()).unwrap();
        fs::create_dir_all(tmp.path().join(".tmp-20260101T000000Z-1")).unwrap();
        fs::create_dir_all(tmp.path().join(".deleting-20250101T000000Z-9")).unwrap();
        let lock = store.lock_for_writing().unwrap();
        let left: Vec<String> = fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(left, vec![".lock".to_string()]);
        let err = store.lock_for_writing().unwrap_err().to_string();
        assert!(err.contains("models directory") && err.contains("in use"), "{err}");
        drop(lock);
    }

    fn held_out(candidate: f64, applies: bool) -> crate::baselines::HeldOutClicks {
        crate::baselines::HeldOutClicks { candidate, current: None, position_only: -0.20, pair_ctr: -0.25, impressions: 1e4, below_pair_ctr: false, applies }
    }

    /// A candidate that predicts held-out clicks worse than position alone is rejected, the first
    /// model too and with `--force`; a model whose logits are uncalibrated (DLA) is not gated on it.
    pub fn a_candidate_below_the_position_only_model_is_rejected_even_when_forced() {
        let d = decide(StopReason::EarlyStopping, 0.3, Some(&held_out(-0.30, true)), None, 0.0, true);
        assert!(!d.promoted && d.reason.contains("position-only"), "{d:?}");
        let d = decide(StopReason::EarlyStopping, 0.3, Some(&held_out(-0.30, true)), Some(("m1", Ok(0.5))), 0.0, true);
        assert!(!d.promoted, "{d:?}");
        let d = decide(StopReason::EarlyStopping, 0.3, Some(&held_out(-0.19, true)), None, 0.0, false);
        assert!(d.promoted && d.reason == "first model", "{d:?}");
        let d = decide(StopReason::EarlyStopping, 0.3, Some(&held_out(-0.30, false)), None, 0.0, false);
        assert!(d.promoted, "{d:?}");
        let d = decide(StopReason::EarlyStopping, 0.3, Some(&held_out(f64::NEG_INFINITY, true)), None, 0.0, true);
        assert!(!d.promoted && d.reason.contains("diverged"), "{d:?}");
    }

    /// Writes a checkpoint description only (enough for `list` and `prune`).
    fn fake_checkpoint(store: &ModelStore, id: &str) {
        let dir = store.dir().join(id);
        fs::create_dir_all(&dir).unwrap();
        let info = CheckpointInfo {
            id: id.into(),
            created_at: String::new(),
            config: TrainConfig::default(),
            data_range_ms: None,
            parent: None,
            theta: vec![0.0],
            fit: serde_json::Value::Null,
            decision: Decision {
                promoted: false,
                reason: String::new(),
                candidate_evaluation_loss: 1.0,
                current_evaluation_loss: None,
                current: None,
                held_out_clicks: None,
                judged: None,
                logged_order_clicks: None,
            },
            theta_intervals: None,
        };
        write_json(&dir.join(INFO), &info).unwrap();
    }

    pub fn prune_keeps_the_newest_and_never_the_current_model() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ModelStore::open(tmp.path()).unwrap();
        let ids: Vec<String> = (0..6).map(|i| format!("m-20260101T00000{i}000Z-0")).collect();
        for id in &ids {
            fake_checkpoint(&store, id);
        }
        store.set_current(&ids[1]).unwrap();
        let deleted = store.prune(2).unwrap();
        assert_eq!(deleted, vec![ids[0].clone(), ids[2].clone(), ids[3].clone()]);
        let left: Vec<String> = store.list().unwrap().into_iter().map(|c| c.id).collect();
        assert_eq!(left, vec![ids[1].clone(), ids[4].clone(), ids[5].clone()]);
        assert_eq!(store.current_id().unwrap().as_deref(), Some(ids[1].as_str()));
        assert!(fs::read_dir(tmp.path()).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().starts_with(".deleting-")));
        assert!(store.prune(2).unwrap().is_empty(), "a second prune has nothing to do");
    }
}
