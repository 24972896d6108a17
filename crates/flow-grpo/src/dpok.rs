//! DPOK's policy-gradient objective (the released `train_online_pg.py`): not PPO — the ratio
//! is clamped outright, so an element outside the band contributes a constant instead of
//! being dropped by a `max` over two branches, and the reward weight scales the whole term:
//!
//! ```text
//! loss = mean_{i, s} ( -w * A_i * clamp(exp(log_probs - anchor), 1 - low, 1 + high) )
//! ```
//!
//! The release uses `w = 100` (its appendix says 10), the band `1 ± 1e-4`, `A = r - V(x_t)`
//! with its learned value baseline (on by default, `--v_flag 1`; the raw reward `r` with it
//! off), and adds `0.01 * KL` to the pretrained model after a warm-up
//! ([`crate::kl_to_reference`]).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::loss::{ClipLoss, host, ratio_diagnostics};
use crate::{ClipRange, FlowGrpoError};

/// DPOK's clamped-ratio objective over a `[samples, steps]` log-prob matrix (shapes as in
/// [`crate::grpo_clip_loss`]). In the diagnostics every element outside the band counts as
/// having lost its gradient (`clipped_gradient_fraction == clip_fraction`).
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`],
/// [`FlowGrpoError::InvalidParameter`] for a reward weight not finite and `> 0`.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use flow_grpo::{ClipRange, dpok_loss};
/// let dev = Default::default();
/// let anchor = Tensor::<Flex, 2>::from_floats([[0.0]], &dev);
/// let lp = Tensor::<Flex, 2>::from_floats([[0.5]], &dev); // ratio e^0.5, clamped to 1.1
/// let adv = Tensor::<Flex, 1>::from_floats([2.0], &dev);
/// let out = dpok_loss(lp, anchor, adv, ClipRange::symmetric(0.1).unwrap(), 10.0).unwrap();
/// assert!((out.loss.into_scalar() - -22.0).abs() < 1e-5);
/// assert_eq!(out.diagnostics.clip_fraction, 1.0);
/// ```
pub fn dpok_loss<B: Backend>(
    log_probs: Tensor<B, 2>,
    anchor: Tensor<B, 2>,
    advantages: Tensor<B, 1>,
    clip: ClipRange,
    reward_weight: f64,
) -> Result<ClipLoss<B>, FlowGrpoError> {
    let n = log_probs.dims()[0];
    crate::matching::check_shape("advantages", advantages.dims(), [n])?;
    clamped_loss(
        log_probs,
        anchor,
        advantages.reshape([n, 1]),
        clip,
        reward_weight,
    )
}

/// [`dpok_loss`] with one advantage per element of the `[samples, steps]` log-prob matrix:
/// the release's `A = r - V(x_t, c, t)` of a learned value baseline, which differs per step.
/// Its diagnostics are [`dpok_loss`]'s.
///
/// # Errors
/// As [`dpok_loss`], the advantages shaped `[samples, steps]`.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use flow_grpo::{ClipRange, dpok_loss_per_step};
/// let dev = Default::default();
/// let anchor = Tensor::<Flex, 2>::from_floats([[0.0, 0.0]], &dev);
/// let lp = Tensor::<Flex, 2>::from_floats([[0.5, -0.5]], &dev); // ratios clamped to 1.1, 0.9
/// let adv = Tensor::<Flex, 2>::from_floats([[2.0, -1.0]], &dev);
/// let out = dpok_loss_per_step(lp, anchor, adv, ClipRange::symmetric(0.1).unwrap(), 10.0).unwrap();
/// // mean(-10 * [2 * 1.1, -1 * 0.9]) = mean([-22, 9])
/// assert!((out.loss.into_scalar() - -6.5).abs() < 1e-5);
/// ```
pub fn dpok_loss_per_step<B: Backend>(
    log_probs: Tensor<B, 2>,
    anchor: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
    clip: ClipRange,
    reward_weight: f64,
) -> Result<ClipLoss<B>, FlowGrpoError> {
    crate::matching::check_shape("advantages", advantages.dims(), log_probs.dims())?;
    clamped_loss(log_probs, anchor, advantages, clip, reward_weight)
}

/// The clamped objective with `advantages` shaped `[samples, 1]` (one per sample) or
/// `[samples, steps]` (one per element).
fn clamped_loss<B: Backend>(
    log_probs: Tensor<B, 2>,
    anchor: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
    clip: ClipRange,
    reward_weight: f64,
) -> Result<ClipLoss<B>, FlowGrpoError> {
    let [n, s] = log_probs.dims();
    crate::matching::check_shape("anchor log-probs", anchor.dims(), [n, s])?;
    crate::matching::check_rows("log-prob matrix", [n, s])?;
    if !(reward_weight.is_finite() && reward_weight > 0.0) {
        return Err(FlowGrpoError::InvalidParameter {
            what: "DPOK reward weight",
            given: reward_weight,
            allowed: "a finite value > 0 (the release uses 100)",
        });
    }
    // the advantages' elements per sample: 1, or one per step
    let per_sample = advantages.dims()[1];
    let delta = log_probs.sub(anchor.detach());
    let ratio = delta.clone().exp();
    let adv = advantages.detach();
    let per_element = adv
        .clone()
        .mul_scalar(-reward_weight)
        .mul(ratio.clone().clamp(clip.lower_bound(), clip.upper_bound()));
    let loss = per_element.clone().mean();
    let mut diagnostics = ratio_diagnostics(
        &host(ratio.clone().detach()),
        &host(delta.detach()),
        &host(adv.detach()),
        s / per_sample,
        clip,
    );
    // clamped, an element outside the band has no gradient whatever its advantage's sign
    diagnostics.clipped_gradient_fraction = diagnostics.clip_fraction;
    Ok(ClipLoss {
        loss,
        per_element,
        ratio: ratio.detach(),
        diagnostics,
    })
}
