//! `ultr train`'s report as text: what one training did, for the console and the service's log.

use crate::train_from_state::TrainOutcome;

impl TrainOutcome {
    /// The report `ultr train` prints and scheduled training logs (at debug level, target
    /// `ultr::training`): the checkpoint, the fit, the
    /// weights, θ (with intervals when drawn), the held-out clicks against the baselines and the
    /// gate's decision.
    pub fn render(&self) -> String {
        let outcome = self;
        let f = &outcome.fit;
        let mut s = String::new();
        s.push_str(&format!("checkpoint {} in {}\n", outcome.id, outcome.models_dir.display()));
        s.push_str(&f.trained_line());
        if !f.converged && f.stop == crate::fit::StopReason::MaxEpochs {
            s.push_str(&format!(
                "  NOT CONVERGED: max_epochs ({}) ran out with the validation loss still falling; θ is flattened toward 0 (raise [train] max_epochs)\n",
                f.epochs.len()
            ));
        }
        if let Some(last) = f.epochs.last() {
            s.push_str(&format!(
                "  last epoch: train loss {:.5}, validation loss {:.5}, {:.0} impressions/s\n",
                last.train_loss, last.validation_loss, last.impressions_per_second
            ));
        }
        let w = &f.weights;
        s.push_str(&format!(
            "  IPS {}: min π {:.4}, max weight {:.2}, clipped {:.2}%, effective sample size {:.0} ({:.1}%)\n",
            if w.enabled { "on" } else { "off" },
            w.min_propensity,
            w.max_weight,
            100.0 * w.clipped_fraction,
            w.effective_sample_size,
            100.0 * w.effective_sample_fraction
        ));
        if let Some(r) = &f.position_refit {
            let moved = r.before.iter().zip(&r.after).map(|(b, a)| (a - b).abs()).fold(0.0, f64::max);
            if r.method == crate::refit::RefitMethod::SwapPairs {
                s.push_str(&format!(
                    "  θ from the swap pairs before training, then held fixed ([train] position_bias = \"swap_pairs\"): {} positions\n",
                    r.positions
                ));
            } else {
                s.push_str(&format!(
                    "  θ refit after early stopping ([train] refit_position_bias): {} positions, θ_k − θ_1 moved by up to {moved:.3}\n",
                    r.positions
                ));
            }
            if !r.not_estimable.is_empty() {
                let list = r.not_estimable.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", ");
                s.push_str(&format!(
                    "  NOT ESTIMABLE: θ at position(s) {list}: their swap pairs carry no click (or only clicks), so they keep the early-stopped θ\n"
                ));
            }
        }
        if let Some(p) = &f.logged_order_prior {
            let tried = p.candidates.iter().map(|(l, ll)| format!("{l} → {ll:.5}")).collect::<Vec<_>>().join(", ");
            let prior = p.prior.iter().map(|(k, r)| format!("{k}: {r:+.2}")).collect::<Vec<_>>().join(" ");
            s.push_str(&format!(
                "  γ of {} pairs around the logged-order prior ([train] logged_order_prior): λ = {} chosen by validation clicks per impression ({tried})\n",
                p.pairs, p.strength
            ));
            s.push_str(&format!("    ρ by mean logged position: {prior}\n"));
        }
        if let Some(c) = &f.logged_order_combination {
            s.push_str("  ");
            s.push_str(crate::logged_order_combination::describe(c).replace('\n', "\n  ").trim_end_matches(' '));
        }
        s.push_str("  θ_k − θ_1: ");
        s.push_str(&outcome.theta.iter().take(10).map(|t| format!("{t:+.3}")).collect::<Vec<_>>().join(" "));
        s.push('\n');
        if let Some(t) = &outcome.theta_intervals {
            s.push_str(&format!("  θ_k − θ_1 with {:.0}% intervals ({} bootstrap replicates of the converged estimator):\n", 100.0 * t.level, t.replicates));
            s.push_str("      k   early-stopped   shipped   converged   interval\n");
            for k in 1..t.converged.len() {
                let shipped = t.shipped.get(k).copied().unwrap_or(f64::NAN);
                let within = if t.lower[k] <= shipped && shipped <= t.upper[k] { "" } else { "   shipped θ outside the interval" };
                s.push_str(&format!(
                    "    {:3}   {:+13.3}   {:+7.3}   {:+9.3}   [{:+.3}, {:+.3}]{within}\n",
                    k + 1,
                    t.early_stopped[k],
                    shipped,
                    t.converged[k],
                    t.lower[k],
                    t.upper[k]
                ));
            }
        }
        if let Some(h) = &outcome.decision.held_out_clicks {
            s.push_str(&format!("  {}\n", h.line()));
        }
        s.push_str(&format!("  {}: {}\n", if outcome.decision.promoted { "PROMOTED" } else { "REJECTED" }, outcome.decision.reason));
        if let Some(c) = &outcome.cold_comparison {
            s.push_str(&format!(
                "  warm vs cold retrain on the whole horizon ({} impressions): evaluation loss {:.6} vs {:.6}, {:.1}s vs {:.1}s, max |Δθ| {:.4}\n",
                c.cold_train_impressions, c.warm_evaluation_loss, c.cold_evaluation_loss, c.warm_seconds, c.cold_seconds, c.max_theta_difference
            ));
        }
        if let Some(n) = &outcome.note {
            s.push_str(&format!("  note: {n}\n"));
        }
        if !outcome.pruned.is_empty() {
            s.push_str(&format!("  deleted {} old checkpoint(s) (train.keep_checkpoints): {}\n", outcome.pruned.len(), outcome.pruned.join(", ")));
        }
        s
    }
}
