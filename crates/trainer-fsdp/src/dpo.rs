//! Online Diffusion / Flow-DPO ([`Dpo`], seed 004): each prompt group's best and worst
//! samples form a pair, and the policy is asked to fit the winner's flow-matching target
//! better, relative to the loser's, than the frozen reference does.
//!
//! * **Rollouts** are deterministic, as DiffusionNFT's (`sampling.eta = 0`; every step runs
//!   `sampling.solver`), and store the endpoints alone ([`Recording::OdeEndpoints`]).
//! * **Pairs**: the candidates of a group with the highest and the lowest advantage (a group
//!   whose advantages are all equal gives none). Preflight keeps groups whole in every
//!   micro-batch (`rollout.micro_batch_size` a multiple of `rollout.group_size`).
//! * **One noise level and one noise per pair**: at each training timestep (the configured
//!   trained steps' noise levels) winner and loser are noised with the same keyed `ε` (drawn
//!   from the winner's seed; the release's `chunk(2)[0].repeat(2)`).
//! * **The loss** is [`flow_grpo::diffusion_dpo_loss`] of the per-row errors
//!   `mse(v, ε - x0)` of the policy and of the reference (the policy with its LoRA adapters
//!   off), `-mean log σ(-β/2 · ((e_w - e_l) - (e_w^ref - e_l^ref)))`, over every pair and
//!   timestep; the release's `β` is 5000. Its implicit accuracy is logged.

use std::ops::Range;

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use flow_grpo::{DpoDiagnostics, diffusion_dpo_loss, mean_squared_error};
use velocity_model::VelocityModel;

use crate::algorithm::{Algorithm, Recording};
use crate::error::TrainerError;
use crate::forward::{Pick, forward_rows_of};
use crate::monitor::{Metrics, names};
use crate::run::TrainContext;
use crate::train::{MicroBatchLoss, UpdateReport};
use crate::world::World;

/// Online Diffusion / Flow-DPO. See the module docs.
#[derive(Debug, Clone)]
pub struct Dpo {
    /// The inverse temperature `β` (the release's 5000).
    pub beta: f64,
}

/// The (winner, loser) sample indices of the groups of a range of a rollout's samples
/// (group-major, whole groups), by advantage; a group whose advantages are all equal gives no
/// pair. Ties go to the lowest slot.
pub fn best_and_worst(
    advantages: &[f64],
    samples: Range<usize>,
    group_size: usize,
) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    let g = group_size.max(1);
    let first_group = samples.start / g;
    let end_group = samples.end.div_ceil(g);
    for gi in first_group..end_group {
        let slots = (gi * g).max(samples.start)..((gi + 1) * g).min(samples.end);
        let mut best = slots.start;
        let mut worst = slots.start;
        for i in slots {
            if advantages[i] > advantages[best] {
                best = i;
            }
            if advantages[i] < advantages[worst] {
                worst = i;
            }
        }
        if advantages[best] > advantages[worst] {
            pairs.push((best, worst));
        }
    }
    pairs
}

impl<B: AutodiffBackend, W: World<B>> Algorithm<B, W> for Dpo {
    type Frozen = ();
    type Diagnostics = DpoDiagnostics;

    fn name(&self) -> &'static str {
        "Flow-DPO"
    }

    fn recording(&self) -> Recording {
        Recording::OdeEndpoints
    }

    /// The reference's margin is the loss's own baseline: always needed.
    fn reference_keys(&self) -> Option<String> {
        Some("algorithm.kind = \"dpo\"".into())
    }

    /// Nothing: the reference is the pretrained model (the policy with its adapters off, or
    /// the run's frozen copy of a full fine-tune's pretrained weights).
    fn freeze(
        &self,
        _ctx: &TrainContext<'_, B, W>,
        _policy: &W::Policy,
    ) -> Result<((), Metrics), TrainerError> {
        Ok(((), Metrics::new()))
    }

    fn micro_batch_loss(
        &self,
        ctx: &TrainContext<'_, B, W>,
        _frozen: &(),
        policy: &W::Policy,
        samples: Range<usize>,
    ) -> Result<MicroBatchLoss<B, DpoDiagnostics>, TrainerError> {
        let g = ctx.batch.group_size();
        let pairs = best_and_worst(&ctx.advantages.values, samples, g);
        let seed = |i: usize| ctx.batch.trajectories[i / g].common.candidates[i % g].seed_hash;
        let picks: Vec<Pick> = pairs
            .iter()
            .flat_map(|&(w, l)| {
                // one noise per pair: the winner's
                [
                    Pick {
                        sample: w,
                        noise_seed: seed(w),
                    },
                    Pick {
                        sample: l,
                        noise_seed: seed(w),
                    },
                ]
            })
            .collect();
        let Some(rows) = forward_rows_of::<B, W, B>(ctx, &picks)? else {
            return Ok(MicroBatchLoss {
                loss: Tensor::zeros([1], ctx.device),
                elements: 0,
                diagnostics: DpoDiagnostics {
                    implicit_accuracy: f64::NAN,
                    model_margin: f64::NAN,
                    reference_margin: f64::NAN,
                    pairs: 0,
                },
            });
        };
        let n_rows = rows.n * rows.steps;
        let n_pairs = pairs.len();
        let v = policy.velocity(rows.x.clone(), rows.sigma.clone(), &rows.cond);
        let v_ref =
            ctx.reference_velocity(policy, rows.x.clone(), rows.sigma.clone(), &rows.cond)?;
        let errors = |v: Tensor<B, 3>| -> Result<(Tensor<B, 1>, Tensor<B, 1>), TrainerError> {
            // rows are step-major over (winner, loser) picks: [steps, pairs, 2]
            let e = mean_squared_error(v.reshape([n_rows, rows.per]), rows.target.clone())?
                .reshape([rows.steps, n_pairs, 2]);
            let at = |k: usize| e.clone().narrow(2, k, 1).reshape([rows.steps * n_pairs]);
            Ok((at(0), at(1)))
        };
        let (err_w, err_l) = errors(v)?;
        let (ref_w, ref_l) = errors(v_ref.detach())?;
        let out = diffusion_dpo_loss(err_w, err_l, ref_w, ref_l, self.beta)?;
        Ok(MicroBatchLoss {
            loss: out.loss,
            elements: n_rows / 2,
            diagnostics: out.diagnostics,
        })
    }

    /// `train/dpo_implicit_accuracy`, `train/dpo_model_margin`, `train/dpo_reference_margin`
    /// (pair-weighted over every micro-batch) and `train/dpo_pairs` (per update, averaged).
    fn rollout_metrics(&self, updates: &[UpdateReport<DpoDiagnostics>]) -> Metrics {
        let all: Vec<&DpoDiagnostics> = updates.iter().flat_map(|u| &u.micro_batches).collect();
        let total: usize = all.iter().map(|d| d.pairs).sum();
        let mean = |f: &dyn Fn(&DpoDiagnostics) -> f64| {
            if total == 0 {
                return f64::NAN;
            }
            all.iter()
                .filter(|d| d.pairs > 0)
                .map(|d| d.pairs as f64 * f(d))
                .sum::<f64>()
                / total as f64
        };
        let mut m = Metrics::new();
        m.insert(
            names::TRAIN_DPO_IMPLICIT_ACCURACY.into(),
            mean(&|d| d.implicit_accuracy),
        );
        m.insert(
            names::TRAIN_DPO_MODEL_MARGIN.into(),
            mean(&|d| d.model_margin),
        );
        m.insert(
            names::TRAIN_DPO_REFERENCE_MARGIN.into(),
            mean(&|d| d.reference_margin),
        );
        m.insert(
            names::TRAIN_DPO_PAIRS.into(),
            total as f64 / updates.len().max(1) as f64,
        );
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_each_groups_best_and_worst() {
        // two groups of 3; the second is degenerate
        let adv = [0.5, -1.0, 0.5, 0.0, 0.0, 0.0];
        assert_eq!(best_and_worst(&adv, 0..6, 3), vec![(0, 1)]);
        // a range of one group
        let adv = [0.0, 0.0, 0.0, -0.2, 0.9, 0.1];
        assert_eq!(best_and_worst(&adv, 3..6, 3), vec![(4, 3)]);
    }
}
