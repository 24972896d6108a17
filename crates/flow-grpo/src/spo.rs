//! Paired finite differences (FDFO): two rollouts from one `x_T` (churn noise makes them
//! differ), the reward difference `ΔR = R(x̂) - R(x)` and the endpoint difference
//! `Δx = x̂ - x`; every stored velocity of both rollouts is bent toward the better endpoint,
//! `v_target = v_ref - Δx̄` (a velocity is `noise - x0`, so lowering it by `Δx̄` moves the
//! endpoint by `+Δx̄`), with `Δx̄ = Δx / (mean_e Δx^2 + 1e-6)` ([`normalised_difference`]).
//! Without a likelihood, the trust region is SPO's: a proxy ratio from two regressions and a
//! quadratic penalty on straying from the rollout's velocity ([`spo_loss`], `ε = 0.03`).
//!
//! The release means every loss over pixels (the appendix sums) and churns the pair's shared
//! seed, so the two rollouts differ from the first step (seed 004).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::FlowGrpoError;
use crate::loss::host;
use crate::matching::{check_rows, check_shape, mean_squared_error};

/// The paper's `+1e-6` in [`normalised_difference`]'s denominator.
pub const FDFO_NORMALISATION_EPS: f64 = 1e-6;

/// `Δx̄ = Δx / (mean_e Δx^2 + 1e-6)` per sample: the difference over its own mean square, so
/// `ΔR Δx̄` does not count the pair's distance twice (`ΔR` grows with `|Δx|` already).
///
/// # Errors
/// [`FlowGrpoError::Empty`].
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// let dev = Default::default();
/// let dx = Tensor::<Flex, 2>::from_floats([[2.0, 0.0]], &dev); // mean square 2
/// let n = flow_grpo::normalised_difference(dx).unwrap().into_data().to_vec::<f32>().unwrap();
/// assert!((n[0] - 2.0 / (2.0 + 1e-6)).abs() < 1e-6 && n[1] == 0.0);
/// ```
pub fn normalised_difference<B: Backend>(
    delta_x: Tensor<B, 2>,
) -> Result<Tensor<B, 2>, FlowGrpoError> {
    let [n, e] = delta_x.dims();
    check_rows("endpoint differences", [n, e])?;
    let ms = (delta_x.clone() * delta_x.clone())
        .mean_dim(1)
        .add_scalar(FDFO_NORMALISATION_EPS);
    Ok(delta_x / ms)
}

/// The SPO loss of paired finite differences and its diagnostics.
#[derive(Debug, Clone)]
pub struct SpoLoss<B: Backend> {
    /// The loss to minimise, `[1]`.
    pub loss: Tensor<B, 1>,
    /// Host diagnostics.
    pub diagnostics: SpoDiagnostics,
}

/// Health of the SPO loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpoDiagnostics {
    /// Mean proxy ratio.
    pub ratio_mean: f64,
    /// Largest `|ρ - 1|`.
    pub ratio_max_deviation: f64,
    /// Samples.
    pub samples: usize,
}

/// SPO over stored velocities, all `[samples, elements]`: `velocity` the current policy's at
/// a stored point, `reference` the rollout's velocity there (`v_ref`), `target`
/// `v_ref - Δx̄`; `delta_reward` is each sample's pair `ΔR`, `[samples]`.
///
/// ```text
/// ρ    = exp(mean_e (target - reference)^2 - mean_e (target - velocity)^2)
/// loss = mean_i ( -ΔR_i ρ_i + |ΔR_i| / (2 ε) (ρ_i - 1)^2 )
/// ```
///
/// `ρ = 1` at the rollout's own velocity, above 1 once the policy is closer to the target.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`],
/// [`FlowGrpoError::InvalidParameter`] for `eps` not finite and `> 0`.
pub fn spo_loss<B: Backend>(
    velocity: Tensor<B, 2>,
    reference: Tensor<B, 2>,
    target: Tensor<B, 2>,
    delta_reward: Tensor<B, 1>,
    eps: f64,
) -> Result<SpoLoss<B>, FlowGrpoError> {
    let [n, e] = velocity.dims();
    check_rows("velocities", [n, e])?;
    check_shape("reference velocities", reference.dims(), [n, e])?;
    check_shape("target velocities", target.dims(), [n, e])?;
    check_shape("reward differences", delta_reward.dims(), [n])?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(FlowGrpoError::InvalidParameter {
            what: "SPO epsilon",
            given: eps,
            allowed: "a finite value > 0 (the paper uses 0.03)",
        });
    }
    let target = target.detach();
    let far = mean_squared_error(target.clone(), reference.detach())?;
    let near = mean_squared_error(target, velocity)?;
    let ratio = (far - near).exp();
    let dr = delta_reward.detach();
    let dev = ratio.clone().sub_scalar(1.0);
    let per_sample = dr.clone().neg() * ratio.clone()
        + dr.abs().div_scalar(2.0 * eps) * dev.clone() * dev.clone();
    let loss = per_sample.mean();
    let r = host(ratio.detach());
    let diagnostics = SpoDiagnostics {
        ratio_mean: r.iter().sum::<f64>() / n as f64,
        ratio_max_deviation: crate::stats::nan_max(r.iter().map(|x| (x - 1.0).abs())),
        samples: n,
    };
    Ok(SpoLoss { loss, diagnostics })
}
