//! The noise levels of one denoising step.
//!
//! Sigmas enter the API as `f32` and nothing else. A schedule built in `f64` (numpy's
//! `linspace`, `torch.linspace` on the static-shift branch) must be rounded to `f32` before it
//! reaches a kernel, exactly once, by whoever builds it: the `1 / (2 sigma^2)` factor of the
//! log-density amplifies an `f64`-vs-`f32` sigma gap into a visible log-prob drift between
//! engines, which skews the policy-gradient ratio.
//!
//! Scalar coefficients derived from the `f32` sigmas (`sqrt(sigma / (1 - sigma))`, `exp(-h)`,
//! ...) are evaluated on the host in `f64` and rounded once to the tensor's element type.

use burn::tensor::{Tensor, TensorData, backend::Backend};

use crate::SdeError;

/// The noise levels before and after one step: `sigma = sigma_k`, `sigma_next = sigma_{k+1}`.
///
/// Invariant (checked by [`StepSigmas::new`]): both finite, `0 <= sigma_next < sigma <= 1`.
/// The step size is `dt = sigma_next - sigma < 0` (time runs from noise, `sigma = 1`, to data,
/// `sigma = 0`).
///
/// ```
/// use sde_math::StepSigmas;
/// let s = StepSigmas::new(0.8, 0.6).unwrap();
/// assert!((s.dt() - (-0.2)).abs() < 1e-7);
/// assert!(StepSigmas::new(0.6, 0.8).is_err()); // not decreasing
/// assert!(StepSigmas::new(1.5, 0.5).is_err()); // above 1
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSigmas {
    sigma: f32,
    sigma_next: f32,
}

impl StepSigmas {
    /// Validates and builds a step.
    ///
    /// # Errors
    /// [`SdeError::InvalidSigmas`] unless both are finite and `0 <= sigma_next < sigma <= 1`.
    pub fn new(sigma: f32, sigma_next: f32) -> Result<Self, SdeError> {
        let ok = sigma.is_finite()
            && sigma_next.is_finite()
            && sigma_next >= 0.0
            && sigma_next < sigma
            && sigma <= 1.0;
        if ok {
            Ok(Self { sigma, sigma_next })
        } else {
            Err(SdeError::InvalidSigmas { sigma, sigma_next })
        }
    }

    /// The step `index -> index + 1` of a schedule `sigmas` (`len = steps + 1`, ending at 0).
    ///
    /// # Errors
    /// [`SdeError::StepOutOfRange`] when `index + 1 >= sigmas.len()`, or
    /// [`SdeError::InvalidSigmas`] when the pair is not a valid step.
    ///
    /// ```
    /// use sde_math::StepSigmas;
    /// let sched = [1.0_f32, 0.5, 0.0];
    /// assert_eq!(StepSigmas::from_schedule(&sched, 1).unwrap().sigma(), 0.5);
    /// assert!(StepSigmas::from_schedule(&sched, 2).is_err());
    /// ```
    pub fn from_schedule(sigmas: &[f32], index: usize) -> Result<Self, SdeError> {
        if index + 1 >= sigmas.len() {
            return Err(SdeError::StepOutOfRange {
                index,
                len: sigmas.len(),
                last: sigmas.len().saturating_sub(2),
            });
        }
        Self::new(sigmas[index], sigmas[index + 1])
    }

    /// `sigma_k`, the noise level of the current sample.
    pub fn sigma(&self) -> f32 {
        self.sigma
    }

    /// `sigma_{k+1}`, the noise level after the step.
    pub fn sigma_next(&self) -> f32 {
        self.sigma_next
    }

    /// `dt = sigma_next - sigma` (negative), evaluated exactly in `f64`.
    pub fn dt(&self) -> f64 {
        f64::from(self.sigma_next) - f64::from(self.sigma)
    }
}

/// The sigmas of one step for a whole batch: one pair shared by every sample, or one per
/// sample (DanceGRPO-style per-sample timestep orders replay different steps side by side).
#[derive(Debug, Clone, PartialEq)]
pub enum Sigmas {
    /// Every sample of the batch takes the same step.
    Shared(StepSigmas),
    /// Sample `i` takes step `pairs[i]`; the length must equal the batch size.
    PerSample(Vec<StepSigmas>),
}

impl From<StepSigmas> for Sigmas {
    fn from(s: StepSigmas) -> Self {
        Sigmas::Shared(s)
    }
}

impl Sigmas {
    /// The per-sample pairs, expanded to `batch` entries.
    ///
    /// # Errors
    /// [`SdeError::BatchMismatch`] when per-sample pairs do not match `batch`.
    pub(crate) fn expand(&self, batch: usize) -> Result<Vec<StepSigmas>, SdeError> {
        match self {
            Sigmas::Shared(s) => Ok(vec![*s; batch]),
            Sigmas::PerSample(v) if v.len() == batch => Ok(v.clone()),
            Sigmas::PerSample(v) => Err(SdeError::BatchMismatch {
                given: v.len(),
                batch,
            }),
        }
    }
}

/// A scalar coefficient of a step, one value for the batch or one per sample.
///
/// Values are computed on the host in `f64` and rounded once to the element type of the
/// tensor they multiply. There is deliberately no division: callers pass host-computed
/// reciprocals, so a shared and a per-sample coefficient round identically, and burn 0.21's
/// autodiff (which differentiates `div_scalar` through an `f32` copy of the scalar) never caps
/// an `f64` gradient's precision.
#[derive(Debug, Clone)]
pub(crate) enum Coef<B: Backend, const D: usize> {
    Shared(f64),
    PerSample(Tensor<B, D>),
}

impl<B: Backend, const D: usize> Coef<B, D> {
    /// Builds a coefficient from per-sample values; collapses to `Shared` when all are equal.
    pub(crate) fn new(values: &[f64], like: &Tensor<B, D>) -> Self {
        let first = values[0];
        if values.iter().all(|v| v.to_bits() == first.to_bits()) {
            return Coef::Shared(first);
        }
        let mut shape = [1usize; D];
        shape[0] = values.len();
        let data = TensorData::new(values.to_vec(), shape).convert_dtype(like.dtype());
        Coef::PerSample(Tensor::from_data(data, (&like.device(), like.dtype())))
    }

    /// `t * c`, broadcast over the non-batch dimensions.
    pub(crate) fn mul(&self, t: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Coef::Shared(c) => t.mul_scalar(*c),
            Coef::PerSample(c) => t.mul(c.clone()),
        }
    }

    /// `t - c`, broadcast over the non-batch dimensions.
    pub(crate) fn sub_from(&self, t: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Coef::Shared(c) => t.sub_scalar(*c),
            Coef::PerSample(c) => t.sub(c.clone()),
        }
    }
}
