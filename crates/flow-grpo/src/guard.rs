//! GRPO-Guard's regulated ratio (Wang et al. 2025, arXiv 2510.22319), in the form of
//! Flow-Factory's `grpo-guard` trainer, for Gaussian transitions whose two policies share one
//! std `s` (every SDE kernel here).
//!
//! With `lp` a transition's log-density averaged over its elements (the references'
//! reduction), `r = x' - mu_old` the stored sample's residual under pi_old and
//! `d = mu - mu_old` the drift of the mean, the plain log-ratio is
//!
//! ```text
//! lp - lp_old = (2 mean(r d) - mean(d^2)) / (2 s^2)
//! ```
//!
//! Its second term is never positive, so as the policy moves every ratio is pulled below 1
//! (the "negatively biased ratio distribution" the paper finds), the clip's upper side stops
//! acting, and the gradient scales as `1 / s^2`, so the least noisy steps dominate. GRPO-Guard
//! adds the drift back and multiplies by `s`:
//!
//! ```text
//! g = (lp - lp_old) s + mean(d^2) / (2 s)     (= mean(r d) / s)
//! ```
//!
//! and puts `exp(g)` through PPO's clip in place of the ratio.

use burn::tensor::{Tensor, backend::Backend};

use crate::loss::{ClipLoss, grpo_clip_loss};
use crate::matching::check_shape;
use crate::{ClipRange, FlowGrpoError};

/// GRPO-Guard's regulated log-ratio, `[samples, steps]`:
/// `g = (log_probs - anchor) * std + mean_sq_drift / (2 std)` elementwise.
///
/// * `log_probs`: the replay under the current policy, differentiable;
/// * `anchor`: pi_old's log-probs of the same transitions (detached here);
/// * `mean_sq_drift`: `mean((mu - mu_old)^2)` over each transition's elements,
///   differentiable through `mu`;
/// * `std`: each transition's std (the same for both policies), detached here.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`].
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use flow_grpo::guard_log_ratio;
/// let dev = Default::default();
/// let t = |v: f32| Tensor::<Flex, 2>::from_floats([[v]], &dev);
/// // lp - lp_old = -0.5, s = 0.1, mean(d^2) = 0.002: g = -0.05 + 0.01
/// let g = guard_log_ratio(t(-1.5), t(-1.0), t(0.002), t(0.1)).unwrap();
/// assert!((g.into_scalar() - -0.04).abs() < 1e-7);
/// ```
pub fn guard_log_ratio<B: Backend>(
    log_probs: Tensor<B, 2>,
    anchor: Tensor<B, 2>,
    mean_sq_drift: Tensor<B, 2>,
    std: Tensor<B, 2>,
) -> Result<Tensor<B, 2>, FlowGrpoError> {
    let [n, s] = log_probs.dims();
    check_shape("anchor log-probs", anchor.dims(), [n, s])?;
    check_shape("mean squared drift", mean_sq_drift.dims(), [n, s])?;
    check_shape("transition stds", std.dims(), [n, s])?;
    crate::matching::check_rows("log-prob matrix", [n, s])?;
    let std = std.detach();
    let scaled = log_probs.sub(anchor.detach()).mul(std.clone());
    Ok(scaled.add(mean_sq_drift.div(std.mul_scalar(2.0))))
}

/// GRPO-Guard's objective: PPO's clipped objective ([`grpo_clip_loss`]) with `exp(g)` of
/// [`guard_log_ratio`] as the ratio. The diagnostics are those of that ratio (`approx_kl` is
/// `0.5 mean(g^2)`).
///
/// # Errors
/// As [`guard_log_ratio`] and [`grpo_clip_loss`].
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use flow_grpo::{ClipRange, grpo_guard_loss};
/// let dev = Default::default();
/// let lp = Tensor::<Flex, 2>::from_floats([[-1.0, -2.0]], &dev);
/// let zero = Tensor::<Flex, 2>::zeros([1, 2], &dev);
/// let std = Tensor::<Flex, 2>::from_floats([[0.3, 0.1]], &dev);
/// let adv = Tensor::<Flex, 1>::from_floats([1.5], &dev);
/// // pi = pi_old and no drift: the ratio is exactly 1, the loss -A
/// let out = grpo_guard_loss(lp.clone(), lp, zero, std, adv, ClipRange::symmetric(1e-4).unwrap())
///     .unwrap();
/// assert_eq!((out.diagnostics.ratio_min, out.diagnostics.ratio_max), (1.0, 1.0));
/// assert_eq!(out.loss.into_scalar(), -1.5);
/// ```
pub fn grpo_guard_loss<B: Backend>(
    log_probs: Tensor<B, 2>,
    anchor: Tensor<B, 2>,
    mean_sq_drift: Tensor<B, 2>,
    std: Tensor<B, 2>,
    advantages: Tensor<B, 1>,
    clip: ClipRange,
) -> Result<ClipLoss<B>, FlowGrpoError> {
    let g = guard_log_ratio(log_probs, anchor, mean_sq_drift, std)?;
    let zeros = g.zeros_like();
    grpo_clip_loss(g, zeros, advantages, clip)
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, Tensor};

    use super::*;

    type B = Autodiff<Flex>;

    /// The regulated log-ratio is `mean(r d) / s` (the drift's square cancels), and its
    /// gradient in `mu` is `(x' - mu_old) / (s n)`: it does not depend on `mu` and scales with
    /// `1 / s`, where the plain log-ratio's is `(x' - mu) / (s^2 n)`.
    #[test]
    fn the_regulated_log_ratio_is_the_residual_drift_product_over_the_std() {
        let dev = Default::default();
        let n = 96;
        for s in [0.05f64, 0.3, 1.1] {
            let mu_old = Tensor::<B, 2>::random([1, n], Distribution::Normal(0.0, 1.0), &dev);
            let x_next =
                mu_old.clone() + Tensor::<B, 2>::random([1, n], Distribution::Normal(0.0, s), &dev);
            let mu = (mu_old.clone()
                + Tensor::<B, 2>::random([1, n], Distribution::Normal(0.0, 0.01), &dev))
            .require_grad();
            let log_density = |m: Tensor<B, 2>| {
                let r = x_next.clone() - m;
                (r.clone() * r)
                    .mean_dim(1)
                    .div_scalar(-2.0 * s * s)
                    .sub_scalar(s.ln() + 0.5 * (2.0 * std::f64::consts::PI).ln())
            };
            let d = mu.clone() - mu_old.clone();
            let drift = (d.clone() * d.clone()).mean_dim(1);
            let std = Tensor::<B, 2>::full([1, 1], s, &dev);
            let g = guard_log_ratio(
                log_density(mu.clone()),
                log_density(mu_old.clone()),
                drift,
                std,
            )
            .unwrap();
            let want = ((x_next.clone() - mu_old.clone()) * d)
                .mean_dim(1)
                .div_scalar(s);
            let (g_v, want_v) = (g.clone().into_scalar() as f64, want.into_scalar() as f64);
            assert!(
                (g_v - want_v).abs() < 1e-5 * (1.0 + want_v.abs()),
                "s {s}: {g_v} vs {want_v}"
            );
            let grads = g.sum().backward();
            let got = mu
                .grad(&grads)
                .unwrap()
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            let expected = ((x_next - mu_old).inner().div_scalar(s * n as f64))
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            for (a, b) in got.iter().zip(&expected) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "s {s}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn mismatched_shapes_are_refused_by_name() {
        let dev = Default::default();
        let a = Tensor::<Flex, 2>::zeros([2, 3], &dev);
        let b = Tensor::<Flex, 2>::zeros([2, 2], &dev);
        let err = guard_log_ratio(a.clone(), a.clone(), b, a).unwrap_err();
        assert!(err.to_string().contains("mean squared drift"), "{err}");
    }
}
