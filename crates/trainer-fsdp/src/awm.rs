//! Advantage Weighted Matching ([`Awm`], seed 004): the policy is `p(x0 | c)`, one decision per
//! finished sample. The rollout samples exactly as FlowGRPO's does (the configured kernel on
//! the trained steps, the solver elsewhere) and also stores every candidate's clean endpoint
//! `x0`; the trained steps' noise levels `σ_k` are AWM's training timesteps (the release trains
//! on the sampler's own grid). For each sample and each of them the endpoint is noised with a
//! keyed noise `ε` ([`noise_recipe::forward_noise`] of the candidate's seed and the step), the
//! model's velocity at `x_σ = (1 - σ) x0 + σ ε` is scored against `ε - x0` by
//! [`flow_grpo::awm_log_likelihood`], and the surrogate log-likelihoods of the current and the
//! frozen policy (the same `σ` and `ε` for both) go into FlowGRPO's clipped objective with the
//! advantages rescaled to `±1` ([`flow_grpo::awm_advantages`]).
//!
//! The release's trust region is optional: `kl_coef` weighs the velocity KL to the reference
//! policy, `mean((v_θ - v_ref)^2)` at the same inputs (the release's 0.001; the paper's
//! velocity-space KL, where β 0.2 collapsed and 0.4 to 1.0 held), and `ema_kl_coef` the same
//! against the run's EMA copy of the policy (`[ema]`; the release's 1.0 at decay
//! `min(0.3, 0.001 · step)`), the term seed 004 names as the release's real trust region.

use std::ops::Range;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use flow_grpo::{
    AwmWeighting, ClipRange, PolicyAnchor, awm_advantages, awm_log_likelihood, grpo_clip_loss,
};
use velocity_model::VelocityModel;

use crate::algorithm::{
    Algorithm, PolicyDiagnostics, Recording, add_kl_term, policy_metrics, record_anchor,
};
use crate::error::TrainerError;
use crate::forward::forward_rows;
use crate::monitor::Metrics;
use crate::rollout::ReferenceFn;
use crate::run::TrainContext;
use crate::train::{MicroBatchLoss, UpdateReport};
use crate::world::World;

/// AWM: FlowGRPO's clipped objective over the flow-matching surrogate of `log p(x0 | c)`.
#[derive(Debug, Clone)]
pub struct Awm {
    /// The ratio band (the release's `[0, 2]` is `ClipRange::asymmetric(1.0, 1.0)`).
    pub clip: ClipRange,
    /// How the flow-matching error becomes the log-likelihood surrogate.
    pub weighting: AwmWeighting,
    /// The advantages are clipped to `±limit` and divided by it (5 in the release).
    pub advantage_limit: f64,
    /// The weight of the velocity KL to the reference policy, `mean((v_θ - v_ref)^2)` (0: no
    /// term and no reference forward; the release's 0.001).
    pub kl_coef: f64,
    /// The weight of the velocity KL to the EMA copy, `mean((v_θ - v_ema)^2)` (0: no term;
    /// the release's 1.0). Needs the run's `[ema]`.
    pub ema_kl_coef: f64,
}

/// The AWM surrogate log-likelihoods `[samples, trained steps]` of a range of a rollout's
/// samples (group-major) under `model`: every (sample, step) row in one forward, step-major.
/// For each of `others` (a reference policy's velocity at the same inputs), also each row's
/// velocity KL to it, `mean((v - v_other)^2)` over the latent (`[samples, trained steps]`).
fn awm_log_probs<B, W, Bx, M>(
    ctx: &TrainContext<'_, B, W>,
    model: &M,
    others: &[&ReferenceFn<'_, Bx, W::Cond<Bx>>],
    samples: Range<usize>,
    weighting: AwmWeighting,
) -> Result<(Tensor<Bx, 2>, Vec<Tensor<Bx, 2>>), TrainerError>
where
    B: AutodiffBackend,
    W: World<B>,
    Bx: Backend<Device = B::Device>,
    M: VelocityModel<Bx, Conditioning = W::Cond<Bx>>,
{
    let Some(rows) = forward_rows::<B, W, Bx>(ctx, samples.clone())? else {
        let (n, steps) = (samples.len(), ctx.batch.trained.len());
        let kls = others
            .iter()
            .map(|_| Tensor::zeros([n, steps], ctx.device))
            .collect();
        return Ok((Tensor::zeros([n, steps], ctx.device), kls));
    };
    let v = model.velocity(rows.x.clone(), rows.sigma.clone(), &rows.cond);
    let kls = others
        .iter()
        .map(|f| rows.velocity_kl(&v, f))
        .collect::<Result<Vec<_>, _>>()?;
    let v = v.reshape([rows.n * rows.steps, rows.per]);
    let lp = awm_log_likelihood(v, rows.target.clone(), rows.sigma.clone(), weighting)?;
    Ok((rows.per_sample(lp), kls))
}

impl<B: AutodiffBackend, W: World<B>> Algorithm<B, W> for Awm {
    type Frozen = PolicyAnchor;
    type Diagnostics = PolicyDiagnostics;

    fn name(&self) -> &'static str {
        "AWM"
    }

    fn recording(&self) -> Recording {
        Recording::SdeTransitionsAndEndpoints
    }

    fn reference_keys(&self) -> Option<String> {
        (self.kl_coef != 0.0).then(|| format!("algorithm.kl_coef = {}", self.kl_coef))
    }

    fn ema_keys(&self) -> Option<String> {
        (self.ema_kl_coef != 0.0).then(|| format!("algorithm.ema_kl_coef = {}", self.ema_kl_coef))
    }

    /// The frozen policy's surrogate log-likelihoods, through the same (autodiff) model and
    /// code path as the updates, so the first update's ratio is exactly 1.
    fn freeze(
        &self,
        ctx: &TrainContext<'_, B, W>,
        policy: &W::Policy,
    ) -> Result<(PolicyAnchor, Metrics), TrainerError> {
        let anchor = record_anchor(ctx, policy, |model, mb| {
            awm_log_probs::<B, W, B, _>(ctx, model, &[], mb, self.weighting).map(|(lp, _)| lp)
        })?;
        Ok((anchor, Metrics::new()))
    }

    fn micro_batch_loss(
        &self,
        ctx: &TrainContext<'_, B, W>,
        anchor: &PolicyAnchor,
        policy: &W::Policy,
        samples: Range<usize>,
    ) -> Result<MicroBatchLoss<B, PolicyDiagnostics>, TrainerError> {
        let reference = |x: Tensor<B, 3>, sigma: Tensor<B, 1>, cond: &W::Cond<B>| {
            ctx.reference_velocity(policy, x, sigma, cond)
        };
        let ema = |x: Tensor<B, 3>, sigma: Tensor<B, 1>, cond: &W::Cond<B>| match ctx.ema {
            Some(ema) => Ok(ema.velocity(x, sigma, cond).detach()),
            None => Err(TrainerError::NoEma {
                keys: format!("algorithm.ema_kl_coef = {}", self.ema_kl_coef),
            }),
        };
        let mut others: Vec<&ReferenceFn<'_, B, W::Cond<B>>> = Vec::new();
        if self.kl_coef != 0.0 {
            others.push(&reference);
        }
        if self.ema_kl_coef != 0.0 {
            others.push(&ema);
        }
        let (lp, mut kls) =
            awm_log_probs::<B, W, B, _>(ctx, policy, &others, samples.clone(), self.weighting)?;
        let raw: Vec<f64> = samples.clone().map(|i| ctx.advantages.values[i]).collect();
        let adv = awm_advantages(&raw, self.advantage_limit)?;
        let n = adv.len();
        let out = grpo_clip_loss(
            lp,
            anchor.log_probs::<B>(samples, ctx.device)?,
            Tensor::from_data(TensorData::new(adv, [n]), ctx.device),
            self.clip,
        )?;
        let mut diagnostics = PolicyDiagnostics::clip_only(out.diagnostics);
        // in the order pushed above: the reference's, then the EMA's
        let ema_kl = (self.ema_kl_coef != 0.0).then(|| kls.pop()).flatten();
        let ref_kl = (self.kl_coef != 0.0).then(|| kls.pop()).flatten();
        let (loss, kl_ref) = add_kl_term(out.loss, ref_kl, self.kl_coef);
        let (loss, kl_ema) = add_kl_term(loss, ema_kl, self.ema_kl_coef);
        diagnostics.kl_ref = kl_ref;
        diagnostics.kl_ema = kl_ema;
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
