//! The one error type of `sde-math`.

use thiserror::Error;

/// Everything that can be wrong with the inputs of a step.
///
/// Every variant names the bad value and what was expected. Errors are returned, never
/// swallowed: a step that cannot be computed faithfully is refused rather than approximated.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SdeError {
    /// A step's sigmas are not `0 <= sigma_next < sigma <= 1` with both finite.
    #[error(
        "invalid step sigmas: sigma = {sigma}, sigma_next = {sigma_next}; expected finite values with 0 <= sigma_next < sigma <= 1"
    )]
    InvalidSigmas {
        /// The current noise level.
        sigma: f32,
        /// The noise level after the step.
        sigma_next: f32,
    },

    /// A kernel parameter (noise level, eta, gamma) is out of its allowed range.
    #[error("invalid {kernel} parameter {name} = {value}; expected {expected}")]
    InvalidParameter {
        /// The kernel the parameter belongs to.
        kernel: &'static str,
        /// The parameter's name.
        name: &'static str,
        /// The value given.
        value: f64,
        /// What is allowed.
        expected: &'static str,
    },

    /// A Flow-SDE step at `sigma == 1`, where `g(sigma) = a * sqrt(sigma / (1 - sigma))` is
    /// singular, under the [`SigmaOnePolicy::Reject`](crate::SigmaOnePolicy::Reject) policy.
    #[error(
        "Flow-SDE step at sigma = 1 (sigma_next = {sigma_next}): the diffusion coefficient a*sqrt(sigma/(1-sigma)) is singular there. \
         Make step 0 deterministic (train steps >= 1), or opt into a reference convention with SigmaOnePolicy::SubstituteNext / Substitute"
    )]
    StochasticStepAtSigmaOne {
        /// The noise level after the step.
        sigma_next: f32,
    },

    /// The transition standard deviation of a stochastic step is zero (or not finite), so it
    /// has no density: e.g. CPS or churn with `sigma_next == 0`.
    #[error(
        "{kernel} step sigma = {sigma} -> sigma_next = {sigma_next} has transition std {std}; a stochastic step needs a finite std > 0 \
         (use the deterministic Euler step for the final step)"
    )]
    DegenerateStd {
        /// The kernel.
        kernel: &'static str,
        /// The current noise level.
        sigma: f32,
        /// The noise level after the step.
        sigma_next: f32,
        /// The std that came out.
        std: f64,
    },

    /// Per-sample sigmas were given for a different batch size than the tensors have.
    #[error("per-sample sigmas given for {given} samples but the batch has {batch}")]
    BatchMismatch {
        /// How many per-sample sigma pairs were given.
        given: usize,
        /// The tensors' batch size.
        batch: usize,
    },

    /// Two tensors that must have the same shape do not.
    #[error("shape mismatch: {what} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Which tensor.
        what: &'static str,
        /// Its shape.
        got: Vec<usize>,
        /// The expected shape.
        expected: Vec<usize>,
    },

    /// A tensor has a dtype the kernels cannot compute in.
    #[error(
        "unsupported dtype {dtype} for {what}; expected a floating-point tensor (f16, bf16, f32 or f64)"
    )]
    UnsupportedDtype {
        /// Which tensor.
        what: &'static str,
        /// Its dtype, as burn names it.
        dtype: String,
    },

    /// A deterministic solver was stepped with a schedule index that does not exist.
    #[error(
        "step index {index} is out of range for a schedule of {len} sigmas (the last step index is {last})"
    )]
    StepOutOfRange {
        /// The index asked for.
        index: usize,
        /// The number of sigmas in the schedule (steps + 1).
        len: usize,
        /// The last valid step index.
        last: usize,
    },

    /// A solver schedule is not strictly decreasing from a value `<= 1` down to `0`.
    #[error(
        "invalid solver schedule: {reason} (sigmas = {sigmas:?}); expected a strictly decreasing f32 sequence in [0, 1] ending at 0"
    )]
    InvalidSchedule {
        /// What is wrong.
        reason: &'static str,
        /// The schedule given.
        sigmas: Vec<f32>,
    },
}
