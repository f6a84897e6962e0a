//! The promotion gate: every model scored on the same evaluation rows (sessions neither the
//! optimizer nor early stopping saw), the held-out click baselines, and the decision; and
//! `--compare-cold`'s retrain beside a warm start.

use serde::Serialize;

use crate::artefact::Trained;
use crate::checkpoint::{decide, Decision};
use crate::chunks::TrainingData;
use crate::config::TrainConfig;
use crate::data::{split_of, Examples, Split};
use crate::fit::{fit_chunks, FitReport};
use crate::scoring::LossSums;
use crate::weights::ips_weights;

/// A warm start next to a cold retrain of the whole horizon, scored on the same evaluation rows.
#[derive(Debug, Clone, Serialize)]
pub struct ColdComparison {
    pub warm_evaluation_loss: f64,
    pub cold_evaluation_loss: f64,
    pub warm_seconds: f64,
    pub cold_seconds: f64,
    /// max_k |θ_k(warm) − θ_k(cold)| over positions present in the data.
    pub max_theta_difference: f64,
    pub cold_train_impressions: usize,
}

/// The evaluation slice of `ex` with its weights (what the gate compares models on: sessions neither
/// the optimizer nor early stopping saw, so the candidate is not favoured).
pub fn evaluation_slice(ex: &Examples, config: &TrainConfig) -> anyhow::Result<(Examples, Vec<f32>)> {
    let val = ex.filter_sessions(|s| split_of(s, config.holdout()) == Split::Evaluation);
    let (w, _) = ips_weights(&val.rows, &config.applied_ips())?;
    Ok((val, w))
}

/// The gate's losses: each model's weighted loss on the evaluation rows of `data`, read once (chunk
/// by chunk when spilled); an incompatible model gets its error.
pub fn evaluation_losses(models: &[&Trained], data: &TrainingData, config: &TrainConfig) -> anyhow::Result<Vec<anyhow::Result<f64>>> {
    let cfg = config;
    let device = cfg.backend.device()?;
    let mut sums: Vec<anyhow::Result<LossSums>> = models.iter().map(|_| Ok(LossSums::default())).collect();
    let mut score = |val: &Examples, w: &[f32]| {
        for (m, s) in models.iter().zip(sums.iter_mut()) {
            if let Ok(total) = s {
                match m.check_compatible(val) {
                    Ok(()) => total.add(m.loss_sums(val, w, &device)),
                    Err(e) => *s = Err(e),
                }
            }
        }
    };
    match data {
        TrainingData::InMemory(ex) => {
            let (val, w) = evaluation_slice(ex, config)?;
            score(&val, &w);
        }
        TrainingData::Spilled(spilled) => {
            use crate::chunks::ExampleChunks;
            for i in 0..spilled.chunk_count(Split::Evaluation) {
                let (val, w) = evaluation_slice(&spilled.load_chunk(Split::Evaluation, i)?, config)?;
                score(&val, &w);
            }
        }
    }
    if sums.iter().flatten().any(|t| t.impressions == 0.0) {
        anyhow::bail!(
            "no impressions in the evaluation slice (key `train.evaluation_fraction` = {}): the promotion gate has nothing to compare models on",
            cfg.evaluation_fraction
        );
    }
    Ok(sums.into_iter().map(|s| s.map(|t| t.loss(cfg.ips.self_normalize))).collect())
}

/// The promotion gate: the candidate's and the current model's losses on the evaluation rows, and
/// the decision (`force`: promote unless diverged). Returns the decision and the candidate's loss.
pub(crate) fn gate(
    config: &TrainConfig,
    force: bool,
    trained: &Trained,
    report: &FitReport,
    current: Option<&(String, anyhow::Result<Trained>)>,
    data: &TrainingData,
) -> anyhow::Result<(Decision, f64)> {
    let current_model = current.and_then(|(_, t)| t.as_ref().ok());
    let models: Vec<&Trained> = std::iter::once(trained).chain(current_model).collect();
    let mut losses = evaluation_losses(&models, data, config)?.into_iter();
    let candidate_loss = losses.next().expect("the candidate's loss")?;
    let held_out = crate::baselines::held_out_clicks(data.chunks(), trained, current_model, config)?;
    let current_loss = current.map(|(id, t)| {
        let loss = match t {
            Ok(_) => losses.next().expect("the current model's loss"),
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        };
        (id.as_str(), loss)
    });
    Ok((decide(report.stop, candidate_loss, held_out.as_ref(), current_loss, config.promotion_tolerance, force), candidate_loss))
}

/// `--compare-cold`: retrains cold on the whole horizon `full` and compares it with the warm
/// candidate on the same evaluation rows of `data`; `progress` and `cancel` as for the warm fit.
pub(crate) fn compare_cold(
    config: &TrainConfig,
    progress: bool,
    cancel: Option<&std::sync::atomic::AtomicBool>,
    full: TrainingData,
    data: &TrainingData,
    warm: (&Trained, &FitReport, f64),
) -> anyhow::Result<ColdComparison> {
    let (trained, report, candidate_loss) = warm;
    let (cold, cold_report) = fit_chunks(full.chunks(), config, None, progress, cancel)?;
    drop(full);
    let cold_loss = evaluation_losses(&[&cold], data, config)?.remove(0)?;
    let k = report.max_position.min(cold_report.max_position) as usize;
    let (tw, tc) = (trained.position_bias(), cold.position_bias());
    Ok(ColdComparison {
        warm_evaluation_loss: candidate_loss,
        cold_evaluation_loss: cold_loss,
        warm_seconds: report.seconds,
        cold_seconds: cold_report.seconds,
        max_theta_difference: (0..k).map(|i| (tw[i] - tc[i]).abs()).fold(0.0, f64::max),
        cold_train_impressions: cold_report.train_impressions,
    })
}

/// What the gate knows of the team's ranking (`[eval] qrels` and the evaluation settings).
pub struct TeamRanking<'a> {
    pub qrels: &'a crate::eval::judged::Qrels,
    pub eval: &'a crate::eval::config::EvalConfig,
}

/// The gate's checks against the team's own ranking, after `gate`: the combination's
/// held-out clicks beside the logged order alone's (recorded; a combination below it is refused),
/// and with `judged` (editors' labels) the shipped ranking's nDCG@10 less the logged order's,
/// paired over queries: refused when its 95% interval lies below 0. `force` promotes regardless.
pub(crate) fn team_ranking_checks(
    decision: &mut Decision,
    trained: &Trained,
    report: &FitReport,
    data: &TrainingData,
    config: &TrainConfig,
    judged: Option<&TeamRanking>,
    force: bool,
) -> anyhow::Result<()> {
    use crate::logged_order_combination::Weight;
    if let Some(c) = &report.logged_order_combination {
        let ll = |w: Weight| c.candidates.iter().find(|(x, _)| *x == w).map(|(_, l)| *l);
        if let (Some(combined), Some(logged)) = (ll(c.chosen), ll(Weight::LoggedOrderAlone)) {
            decision.logged_order_clicks = Some((combined, logged));
            if decision.promoted && !force && combined < logged {
                decision.promoted = false;
                decision.reason = format!(
                    "the combination ({}) predicts held-out clicks worse than the logged order alone: {combined:.5} < {logged:.5} per impression",
                    c.chosen.label()
                );
            }
        }
    }
    let Some(team) = judged else { return Ok(()) };
    let Some(ex) = data.chunks().in_memory() else {
        tracing::warn!("the judged gate ([eval] qrels) needs the training rows in memory: raise `train.memory_budget`; not applied");
        return Ok(());
    };
    use crate::eval::judged::{evaluate, seen_by_query, Ranking};
    let seen = seen_by_query(ex);
    let shipped = match Ranking::combined(trained, ex, config)? {
        Some(r) => r,
        None => Ranking::from_rows("model", ex, &trained.relevance_of_rows(ex, &config.backend.device()?)),
    };
    let name = shipped.ranker.clone();
    let figures = evaluate(team.qrels, &[Ranking::logged(&seen), Ranking::naive_ctr(&seen), shipped], team.eval.unjudged, team.eval.bootstrap, team.eval.seed)?;
    let i = figures.metrics.iter().position(|m| *m == "nDCG@10").expect("nDCG@10 is a judged metric");
    let (Some(r), Some(logged)) = (figures.rankers.iter().find(|r| r.ranker == name), figures.rankers.iter().find(|r| r.ranker == "logged")) else {
        return Ok(());
    };
    let d = r.minus_logged[i];
    let refused = d.high < 0.0;
    decision.judged = Some(crate::checkpoint::JudgedGate {
        ranker: name.clone(),
        queries: figures.queries,
        ndcg10: r.mean[i].estimate,
        logged_ndcg10: logged.mean[i].estimate,
        minus_logged: d.estimate,
        minus_logged_low: d.low,
        minus_logged_high: d.high,
        refused,
    });
    if refused && !force {
        let why = format!(
            "on the editors' labels ([eval] qrels, {} queries) the shipped ranking ({name}) is below the logged order: nDCG@10 {:.4} − {:.4} = {:+.4} [{:+.4}, {:+.4}]",
            figures.queries, r.mean[i].estimate, logged.mean[i].estimate, d.estimate, d.low, d.high
        );
        // Refused already for another reason: both reasons stand.
        decision.reason = if decision.promoted { why } else { format!("{}; and {why}", decision.reason) };
        decision.promoted = false;
    }
    Ok(())
}
