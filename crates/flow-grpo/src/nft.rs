//! DiffusionNFT: online RL on the forward process. The reward splits each group's samples
//! into an implicit positive and negative policy, `v± = (1 ∓ β) v_old ± β v_θ`, and one
//! flow-matching loss contrasts them, weighting each sample by its optimality probability `r`
//! toward the positive branch and `1 - r` toward the negative. No likelihood, no ratio: the
//! sampling policy is a soft-updated copy (`θ_old ← η θ_old + (1 - η) θ`, [`SoftUpdate`]).
//!
//! As released (seed 004): each branch's error is scored through its `x0` prediction
//! `x_σ - σ v` and normalised by that sample's own mean absolute error (detached, at least
//! `1e-5`); the loss is scaled by `5 / β` ([`nft_loss`]'s `scale`); `r` comes from the
//! advantage clipped to `±5` ([`nft_optimality`]); and an unmentioned `1e-4 * mse(v_θ, v_ref)`
//! anchors the pretrained model ([`crate::mean_squared_error`]).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::FlowGrpoError;
use crate::loss::host;
use crate::matching::{check_rows, check_shape};

/// The optimality probability of each sample from its advantage:
/// `r = clamp(1/2 + 1/2 * a / scale, 0, 1)` (`scale` 5 in the release, whose advantages are
/// clipped to `±5`).
///
/// # Errors
/// [`FlowGrpoError::InvalidParameter`] unless `scale` is finite and `> 0`.
///
/// ```
/// let r = flow_grpo::nft_optimality(&[-10.0, 0.0, 2.5], 5.0).unwrap();
/// assert_eq!(r, vec![0.0, 0.5, 0.75]);
/// ```
pub fn nft_optimality(advantages: &[f64], scale: f64) -> Result<Vec<f64>, FlowGrpoError> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(FlowGrpoError::InvalidParameter {
            what: "NFT advantage scale",
            given: scale,
            allowed: "a finite value > 0 (the release uses 5)",
        });
    }
    Ok(advantages
        .iter()
        .map(|a| (0.5 + 0.5 * a / scale).clamp(0.0, 1.0))
        .collect())
}

/// The DiffusionNFT loss and its diagnostics.
#[derive(Debug, Clone)]
pub struct NftLoss<B: Backend> {
    /// The loss to minimise, `[1]`.
    pub loss: Tensor<B, 1>,
    /// Host diagnostics.
    pub diagnostics: NftDiagnostics,
}

/// Health of the DiffusionNFT loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NftDiagnostics {
    /// Mean normalised error of the positive branch over the samples.
    pub positive_error: f64,
    /// Mean normalised error of the negative branch.
    pub negative_error: f64,
    /// Mean optimality probability.
    pub mean_optimality: f64,
    /// Samples.
    pub samples: usize,
}

/// The per-sample adaptive error of a velocity through its `x0` prediction:
/// `mean_e(err^2 / sg(max(mean_e |err|, 1e-5)))`, `err = x_σ - σ v - x0`.
fn normalised_error<B: Backend>(
    v: Tensor<B, 2>,
    x_t: Tensor<B, 2>,
    x0: Tensor<B, 2>,
    sigma: Tensor<B, 2>,
) -> Tensor<B, 1> {
    let [n, _] = v.dims();
    let err = x_t - v * sigma - x0;
    let scale = err.clone().abs().mean_dim(1).clamp_min(1e-5).detach();
    (err.clone() * err / scale).mean_dim(1).reshape([n])
}

/// The DiffusionNFT loss:
///
/// ```text
/// v+ = β v_θ + (1 - β) v_old          v- = (1 + β) v_old - β v_θ          (v_old detached)
/// loss = scale * mean_i [ r_i e(v+)_i + (1 - r_i) e(v-)_i ]
/// ```
///
/// with `e` the adaptive `x0`-space error (see the module docs). `velocity` is `v_θ(x_σ)`,
/// `old_velocity` the sampling policy's at the same point, `x_t` the noised sample
/// ([`crate::noised`]), all `[samples, elements]`; `sigma` and `optimality` are `[samples]`.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`],
/// [`FlowGrpoError::InvalidParameter`] for `beta` or `scale` not finite and `> 0`.
#[allow(clippy::too_many_arguments)]
pub fn nft_loss<B: Backend>(
    velocity: Tensor<B, 2>,
    old_velocity: Tensor<B, 2>,
    x_t: Tensor<B, 2>,
    x0: Tensor<B, 2>,
    sigma: Tensor<B, 1>,
    optimality: Tensor<B, 1>,
    beta: f64,
    scale: f64,
) -> Result<NftLoss<B>, FlowGrpoError> {
    let [n, e] = velocity.dims();
    check_rows("velocities", [n, e])?;
    check_shape("old velocities", old_velocity.dims(), [n, e])?;
    check_shape("noised samples", x_t.dims(), [n, e])?;
    check_shape("clean samples", x0.dims(), [n, e])?;
    check_shape("noise levels", sigma.dims(), [n])?;
    check_shape("optimality probabilities", optimality.dims(), [n])?;
    for (what, v, allowed) in [
        (
            "NFT beta",
            beta,
            "a finite value > 0 (the release uses 1.0, or 0.1)",
        ),
        (
            "NFT loss scale",
            scale,
            "a finite value > 0 (the release uses 5 / beta)",
        ),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(FlowGrpoError::InvalidParameter {
                what,
                given: v,
                allowed,
            });
        }
    }
    let old = old_velocity.detach();
    let positive = velocity.clone().mul_scalar(beta) + old.clone().mul_scalar(1.0 - beta);
    let negative = old.mul_scalar(1.0 + beta) - velocity.mul_scalar(beta);
    let s = sigma.reshape([n, 1]);
    let x0 = x0.detach();
    let x_t = x_t.detach();
    let e_pos = normalised_error(positive, x_t.clone(), x0.clone(), s.clone());
    let e_neg = normalised_error(negative, x_t, x0, s);
    let r = optimality.detach();
    let per_sample = e_pos.clone() * r.clone() + e_neg.clone() * r.clone().neg().add_scalar(1.0);
    let loss = per_sample.mean().mul_scalar(scale);
    let mean = |t: Tensor<B, 1>| host(t.detach()).iter().sum::<f64>() / n as f64;
    let diagnostics = NftDiagnostics {
        positive_error: mean(e_pos),
        negative_error: mean(e_neg),
        mean_optimality: mean(r),
        samples: n,
    };
    Ok(NftLoss { loss, diagnostics })
}

/// The decay `η_i` of DiffusionNFT's soft update of the sampling policy after iteration `i`,
/// `θ_old ← η_i θ_old + (1 - η_i) θ`: `clamp(slope * (i - delay), 0, max)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftUpdate {
    /// Iterations before the ramp starts (η stays 0: the sampler follows the policy).
    pub delay: u64,
    /// Growth of η per iteration.
    pub slope: f64,
    /// The ceiling of η, in `[0, 1)`.
    pub max: f64,
}

impl SoftUpdate {
    /// The paper's ramp, `η_i = min(0.001 i, 0.5)`.
    pub const RAMP: Self = Self {
        delay: 0,
        slope: 0.001,
        max: 0.5,
    };
    /// The release's OCR schedule, flat for 75 iterations, then `min(0.0075 (i - 75), 0.999)`.
    pub const FLAT_THEN_RAMP: Self = Self {
        delay: 75,
        slope: 0.0075,
        max: 0.999,
    };

    /// Checks the fields.
    ///
    /// # Errors
    /// [`FlowGrpoError::InvalidParameter`] for a slope not finite and `>= 0`, or a ceiling
    /// outside `[0, 1)`.
    pub fn validate(&self) -> Result<(), FlowGrpoError> {
        if !(self.slope.is_finite() && self.slope >= 0.0) {
            return Err(FlowGrpoError::InvalidParameter {
                what: "soft-update slope",
                given: self.slope,
                allowed: "a finite value >= 0",
            });
        }
        if !(self.max >= 0.0 && self.max < 1.0) {
            return Err(FlowGrpoError::InvalidParameter {
                what: "soft-update ceiling",
                given: self.max,
                allowed: "a value in [0, 1) (1 would freeze the sampling policy for good)",
            });
        }
        Ok(())
    }

    /// `η_i`.
    ///
    /// ```
    /// use flow_grpo::SoftUpdate;
    /// assert_eq!(SoftUpdate::RAMP.decay(0), 0.0);
    /// assert!((SoftUpdate::RAMP.decay(200) - 0.2).abs() < 1e-12);
    /// assert_eq!(SoftUpdate::RAMP.decay(10_000), 0.5);
    /// assert_eq!(SoftUpdate::FLAT_THEN_RAMP.decay(60), 0.0);
    /// assert!((SoftUpdate::FLAT_THEN_RAMP.decay(175) - 0.75).abs() < 1e-12);
    /// ```
    pub fn decay(&self, iteration: u64) -> f64 {
        let steps = iteration.saturating_sub(self.delay) as f64;
        (self.slope * steps).clamp(0.0, self.max)
    }
}
