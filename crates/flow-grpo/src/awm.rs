//! Advantage Weighted Matching (AWM): the policy is `p(x0 | c)`, one decision per finished
//! sample, and its log-likelihood is read through the flow-matching loss on the forward
//! process. A rollout stores clean endpoints only (any sampler, ODE included); training draws
//! a noise level and a noise per sample, shared by the current and the old policy, and feeds
//! the surrogate log-likelihoods of both into the clipped objective
//! ([`crate::grpo_clip_loss`], one column per drawn noise level).
//!
//! Paper and release differ (seed 004): the paper weights uniformly, `w(t) = 1`, with a plain
//! squared error; the released training script uses a generalised Huber at power 0.25 times
//! the noise level ([`AwmWeighting::GeneralisedHuber`]), rescales the advantage to `±1`
//! ([`awm_advantages`]), clips the ratio to `[0, 2]` (`ClipRange::asymmetric(1.0, 1.0)`) and
//! adds two velocity terms, `0.001 * mse(v, v_ref)` and `1.0 * mse(v, v_ema)`
//! ([`crate::mean_squared_error`]).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::FlowGrpoError;
use crate::matching::{check_shape, mean_squared_error};

/// How AWM turns a sample's flow-matching error into its log-likelihood surrogate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AwmWeighting {
    /// The paper's: `log p = -mean_e (v - target)^2` (uniform `w(t) = 1`).
    Uniform,
    /// The released script's: `log p = -(mean_e (v - target)^2)^power * sigma / power`
    /// (power 0.25 there).
    GeneralisedHuber {
        /// The power, in `(0, 1]`.
        power: f64,
    },
}

impl AwmWeighting {
    /// The released script's weighting, the generalised Huber at power 0.25.
    pub const RELEASED: Self = Self::GeneralisedHuber { power: 0.25 };
}

/// The AWM log-likelihood surrogate of each sample, `[samples]`: the flow-matching error of
/// `velocity` (the model's output at `x_sigma`) against `target` (`noise - x0`, see
/// [`crate::velocity_target`]) under `weighting`. `sigma` is `[samples]`.
///
/// # Errors
/// [`FlowGrpoError::ShapeMismatch`], [`FlowGrpoError::Empty`],
/// [`FlowGrpoError::InvalidParameter`] for a Huber power outside `(0, 1]`.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use flow_grpo::{AwmWeighting, awm_log_likelihood};
/// let dev = Default::default();
/// let v = Tensor::<Flex, 2>::from_floats([[1.0, 1.0]], &dev);
/// let target = Tensor::<Flex, 2>::from_floats([[3.0, 1.0]], &dev); // mse 2
/// let sigma = Tensor::<Flex, 1>::from_floats([0.5], &dev);
/// let lp = awm_log_likelihood(v.clone(), target.clone(), sigma.clone(), AwmWeighting::Uniform).unwrap();
/// assert_eq!(lp.into_scalar(), -2.0);
/// let w = AwmWeighting::GeneralisedHuber { power: 0.5 };
/// let lp = awm_log_likelihood(v, target, sigma, w).unwrap().into_scalar();
/// assert!((lp - -(2f32.sqrt()) * 0.5 / 0.5).abs() < 1e-6);
/// ```
pub fn awm_log_likelihood<B: Backend>(
    velocity: Tensor<B, 2>,
    target: Tensor<B, 2>,
    sigma: Tensor<B, 1>,
    weighting: AwmWeighting,
) -> Result<Tensor<B, 1>, FlowGrpoError> {
    let [n, _] = velocity.dims();
    let mse = mean_squared_error(velocity, target)?;
    check_shape("noise levels", sigma.dims(), [n])?;
    match weighting {
        AwmWeighting::Uniform => Ok(mse.neg()),
        AwmWeighting::GeneralisedHuber { power } => {
            if !(power.is_finite() && power > 0.0 && power <= 1.0) {
                return Err(FlowGrpoError::InvalidParameter {
                    what: "AWM Huber power",
                    given: power,
                    allowed: "a finite value in (0, 1] (the release uses 0.25)",
                });
            }
            Ok(mse.powf_scalar(power).mul(sigma).div_scalar(power).neg())
        }
    }
}

/// The released AWM advantage: `clip(a, -limit, limit) / limit`, in `[-1, 1]` (limit 5 there).
///
/// # Errors
/// [`FlowGrpoError::InvalidParameter`] unless `limit` is finite and `> 0`.
///
/// ```
/// assert_eq!(flow_grpo::awm_advantages(&[-7.0, 2.5, 5.0], 5.0).unwrap(), vec![-1.0, 0.5, 1.0]);
/// ```
pub fn awm_advantages(advantages: &[f64], limit: f64) -> Result<Vec<f64>, FlowGrpoError> {
    if !(limit.is_finite() && limit > 0.0) {
        return Err(FlowGrpoError::InvalidParameter {
            what: "AWM advantage limit",
            given: limit,
            allowed: "a finite value > 0 (the release uses 5)",
        });
    }
    Ok(advantages
        .iter()
        .map(|a| a.clamp(-limit, limit) / limit)
        .collect())
}
