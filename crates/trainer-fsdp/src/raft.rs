//! Best-of-N supervised fine-tuning on the model's own samples ([`Raft`]; RAFT, Dong et al.
//! 2023, "Reward rAnked FineTuning"): the baseline an RL objective has to beat at equal CPU.
//!
//! * **Rollouts** are deterministic, as DiffusionNFT's and DPO's (`sampling.eta = 0`; every
//!   step runs `sampling.solver`), and store the endpoints alone ([`Recording::OdeEndpoints`]):
//!   the samples are the model's own pictures, a group's candidates differing by their `x_T`.
//! * **Selection**: the `top_k` candidates of each prompt's group with the highest reward
//!   (advantage; ties go to the lowest slot). A group whose rewards are all equal ranks
//!   nothing and is skipped.
//! * **The loss** is plain flow matching on the selected endpoints: at each training timestep
//!   (the configured trained steps' noise levels) the endpoint is noised with the
//!   candidate's keyed `ε` and the model's velocity is fitted to `ε - x0`, mean squared error.
//!   No ratio, no clip, no reference: what the model is fine-tuned toward is only ever its own
//!   best pictures. A micro-batch's loss is the selected rows' summed error over its
//!   `samples x steps` rows, times `group_size / top_k`, so that a micro-batch of whole,
//!   ranked groups weighs as the mean error of its selected rows and a skipped group
//!   contributes nothing.

use std::ops::Range;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use flow_grpo::mean_squared_error;
use velocity_model::VelocityModel;

use crate::algorithm::{Algorithm, Recording};
use crate::error::TrainerError;
use crate::forward::forward_rows;
use crate::monitor::{Metrics, names};
use crate::run::TrainContext;
use crate::train::{MicroBatchLoss, UpdateReport};
use crate::world::World;

/// Best-of-N supervised fine-tuning. See the module docs.
#[derive(Debug, Clone)]
pub struct Raft {
    /// Candidates of each group fine-tuned on (its best), at least 1 and below the group.
    pub top_k: usize,
}

/// One micro-batch of [`Raft`]: how many samples it fine-tuned on and their error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RaftMicroBatch {
    /// Selected samples in the micro-batch.
    pub selected: usize,
    /// Their mean flow-matching error over the training timesteps (NaN with none).
    pub error: f64,
}

/// The selected samples of a range of a rollout's samples (group-major): each group's
/// `top_k` by advantage, ranked over the whole group (ties to the lowest slot), those inside
/// `samples` kept; a group whose advantages are all equal gives none.
///
/// ```
/// use trainer_fsdp::raft::best_of_groups;
/// // two groups of 3; the second is all equal
/// let a = [0.1, 0.9, -1.0, 0.5, 0.5, 0.5];
/// assert_eq!(best_of_groups(&a, 0..6, 3, 1), vec![1]);
/// assert_eq!(best_of_groups(&a, 0..6, 3, 2), vec![1, 0]);
/// // a range cutting the first group keeps its best alone where it falls
/// assert_eq!(best_of_groups(&a, 0..1, 3, 1), Vec::<usize>::new());
/// ```
pub fn best_of_groups(
    advantages: &[f64],
    samples: Range<usize>,
    group_size: usize,
    top_k: usize,
) -> Vec<usize> {
    let g = group_size.max(1);
    let mut out = Vec::new();
    if samples.is_empty() {
        return out;
    }
    for gi in samples.start / g..samples.end.div_ceil(g) {
        let slots: Vec<usize> = (gi * g..((gi + 1) * g).min(advantages.len())).collect();
        let (lo, hi) = slots
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &i| {
                (l.min(advantages[i]), h.max(advantages[i]))
            });
        if hi <= lo {
            continue;
        }
        let mut ranked = slots;
        // stable: equal advantages keep the lower slot first
        ranked.sort_by(|&a, &b| advantages[b].total_cmp(&advantages[a]));
        out.extend(
            ranked
                .into_iter()
                .take(top_k)
                .filter(|i| samples.contains(i)),
        );
    }
    out
}

impl<B: AutodiffBackend, W: World<B>> Algorithm<B, W> for Raft {
    type Frozen = ();
    type Diagnostics = RaftMicroBatch;

    fn name(&self) -> &'static str {
        "RAFT (best-of-N fine-tuning)"
    }

    fn recording(&self) -> Recording {
        Recording::OdeEndpoints
    }

    /// Nothing: the loss compares the policy with its own samples alone.
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
    ) -> Result<MicroBatchLoss<B, RaftMicroBatch>, TrainerError> {
        let g = ctx.batch.group_size();
        let len = samples.len();
        let selected = best_of_groups(&ctx.advantages.values, samples, g, self.top_k);
        let Some(rows) = forward_rows::<B, W, B>(ctx, selected.iter().copied())? else {
            return Ok(MicroBatchLoss {
                loss: Tensor::zeros([1], ctx.device),
                elements: 0,
                diagnostics: RaftMicroBatch {
                    selected: 0,
                    error: f64::NAN,
                },
            });
        };
        let n_rows = rows.n * rows.steps;
        let v = policy.velocity(rows.x.clone(), rows.sigma.clone(), &rows.cond);
        let errors = mean_squared_error(v.reshape([n_rows, rows.per]), rows.target.clone())?;
        let summed = errors.sum();
        let error = summed.clone().into_scalar().elem::<f64>() / n_rows as f64;
        let scale = g as f64 / self.top_k.max(1) as f64 / (len * rows.steps) as f64;
        Ok(MicroBatchLoss {
            loss: summed.mul_scalar(scale),
            elements: n_rows,
            diagnostics: RaftMicroBatch {
                selected: selected.len(),
                error,
            },
        })
    }

    /// `train/raft_selected` (samples fine-tuned on per update, averaged) and
    /// `train/raft_error` (their flow-matching error, weighted by samples).
    fn rollout_metrics(&self, updates: &[UpdateReport<RaftMicroBatch>]) -> Metrics {
        let all: Vec<&RaftMicroBatch> = updates.iter().flat_map(|u| &u.micro_batches).collect();
        let total: usize = all.iter().map(|d| d.selected).sum();
        let error = if total == 0 {
            f64::NAN
        } else {
            all.iter()
                .filter(|d| d.selected > 0)
                .map(|d| d.selected as f64 * d.error)
                .sum::<f64>()
                / total as f64
        };
        let mut m = Metrics::new();
        m.insert(
            names::TRAIN_RAFT_SELECTED.into(),
            total as f64 / updates.len().max(1) as f64,
        );
        m.insert(names::TRAIN_RAFT_ERROR.into(), error);
        m
    }
}
