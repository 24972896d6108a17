//! GRPO-Guard (Wang et al. 2025, arXiv 2510.22319): FlowGRPO's rollout, replay and clipped
//! objective, with the regulated ratio of [`flow_grpo::grpo_guard_loss`] in place of
//! `exp(log_prob - anchor)`.
//!
//! The regulated log-ratio of a trained transition is `(lp - lp_old) s + mean((mu -
//! mu_old)^2) / (2 s)`, with `s` the transition's std: the drift of the mean, which biases the
//! plain ratio below 1, added back, and the whole scaled by `s`, which evens the steps'
//! gradients out (Flow-Factory's `grpo-guard` trainer computes the same). So the anchor keeps
//! pi_old's transition means as well as its log-probs: it is always the replayed anchor,
//! recorded through the same autodiff code path as the updates, so the first update's ratio
//! is exactly 1.
//!
//! The paper states it for Flow-GRPO's SDE; the identity holds for any Gaussian kernel whose
//! two policies share the std (every kernel of `sde-math`), so any `sampling.sde_type` is
//! accepted.

use std::ops::Range;

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use flow_grpo::{ClipRange, PolicyAnchor, grpo_guard_loss, mean_squared_error};

use crate::algorithm::{
    Algorithm, PolicyDiagnostics, Recording, add_kl_term, policy_metrics, record_anchor_with,
    replay_policy_terms, sampler_parity,
};
use crate::error::TrainerError;
use crate::monitor::Metrics;
use crate::rollout::StepColumns;
use crate::run::TrainContext;
use crate::train::{MicroBatchLoss, UpdateReport};
use crate::world::World;

/// GRPO-Guard. See the module docs.
#[derive(Debug, Clone)]
pub struct GrpoGuard {
    /// PPO's band for the regulated ratio.
    pub clip: ClipRange,
    /// The weight of the KL of every trained transition to the reference policy's (as
    /// FlowGRPO's; 0: no term and no reference forward).
    pub kl_coef: f64,
}

/// What GRPO-Guard freezes before a rollout's updates: pi_old's log-probs, and each
/// micro-batch's transition means (step-major, `[steps * samples, tokens, channels]`).
pub struct GuardAnchor<Bi: burn::tensor::backend::Backend> {
    log_probs: PolicyAnchor,
    means: Vec<(Range<usize>, Tensor<Bi, 3>)>,
}

impl<Bi: burn::tensor::backend::Backend> GuardAnchor<Bi> {
    fn means_of(&self, samples: &Range<usize>) -> Result<&Tensor<Bi, 3>, TrainerError> {
        self.means
            .iter()
            .find(|(mb, _)| mb == samples)
            .map(|(_, m)| m)
            .ok_or(TrainerError::AnchorRange {
                start: samples.start,
                end: samples.end,
            })
    }
}

/// `[samples, steps]`: `mean((mu - mu_old)^2)` of each transition, from step-major means.
fn mean_sq_drift<B: burn::tensor::backend::Backend>(
    mean: Tensor<B, 3>,
    old: Tensor<B, 3>,
    n: usize,
    steps: usize,
) -> Result<Tensor<B, 2>, TrainerError> {
    let [rows, tokens, channels] = mean.dims();
    debug_assert_eq!(rows, n * steps);
    let mut cols = Vec::with_capacity(steps);
    for s in 0..steps {
        let at = |t: &Tensor<B, 3>| {
            t.clone()
                .narrow(0, s * n, n)
                .reshape([n, tokens * channels])
        };
        cols.push(mean_squared_error(at(&mean), at(&old))?.unsqueeze_dim(1));
    }
    Ok(Tensor::cat(cols, 1))
}

impl<B: AutodiffBackend, W: World<B>> Algorithm<B, W> for GrpoGuard {
    type Frozen = GuardAnchor<B::InnerBackend>;
    type Diagnostics = PolicyDiagnostics;

    fn name(&self) -> &'static str {
        "GRPO-Guard"
    }

    fn recording(&self) -> Recording {
        Recording::SdeTransitions
    }

    fn reference_keys(&self) -> Option<String> {
        (self.kl_coef != 0.0).then(|| format!("algorithm.kl_coef = {}", self.kl_coef))
    }

    /// pi_old's log-probs and transition means, replayed through the autodiff model the
    /// updates use; `train/logp_parity_max_abs` compares the log-probs with the sampler's.
    fn freeze(
        &self,
        ctx: &TrainContext<'_, B, W>,
        policy: &W::Policy,
    ) -> Result<(Self::Frozen, Metrics), TrainerError> {
        let (log_probs, means) = record_anchor_with(ctx, policy, |model, mb| {
            let terms = replay_policy_terms(ctx, model, mb.clone(), StepColumns::All, false, true)?;
            let (mean, _) = terms.means.expect("the replay was asked for its means");
            Ok((terms.log_probs, (mb, mean.detach().inner())))
        })?;
        let metrics = sampler_parity(ctx, &log_probs, None)?;
        Ok((GuardAnchor { log_probs, means }, metrics))
    }

    fn micro_batch_loss(
        &self,
        ctx: &TrainContext<'_, B, W>,
        anchor: &Self::Frozen,
        policy: &W::Policy,
        samples: Range<usize>,
    ) -> Result<MicroBatchLoss<B, PolicyDiagnostics>, TrainerError> {
        let terms = replay_policy_terms(
            ctx,
            policy,
            samples.clone(),
            StepColumns::All,
            self.kl_coef != 0.0,
            true,
        )?;
        let (mean, std) = terms.means.expect("the replay was asked for its means");
        let [n, steps] = terms.log_probs.dims();
        let old = Tensor::<B, 3>::from_inner(anchor.means_of(&samples)?.clone());
        let drift = mean_sq_drift(mean, old, n, steps)?;
        let idx: Vec<usize> = samples.clone().collect();
        let lp_old = anchor.log_probs.log_probs::<B>(samples, ctx.device)?;
        let advantages = ctx.advantages.tensor::<B>(&idx, ctx.device);
        let out = grpo_guard_loss(terms.log_probs, lp_old, drift, std, advantages, self.clip)?;
        let mut diagnostics = PolicyDiagnostics::clip_only(out.diagnostics);
        let (loss, kl_ref) = add_kl_term(out.loss, terms.kl, self.kl_coef);
        diagnostics.kl_ref = kl_ref;
        Ok(MicroBatchLoss {
            loss,
            elements: out.diagnostics.elements,
            diagnostics,
        })
    }

    fn rollout_metrics(&self, updates: &[UpdateReport<PolicyDiagnostics>]) -> Metrics {
        policy_metrics(updates)
    }
}
