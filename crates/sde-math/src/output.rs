//! The record a stochastic step returns.

use burn::tensor::{Tensor, backend::Backend};

use crate::gaussian;

/// One stochastic step `x_k -> x_{k+1} ~ N(mean, std^2 I)`, sampled or replayed.
///
/// Shapes: `B` is the batch size, `[B, ...]` the sample's shape. Tensors are in the compute
/// dtype (`f32`, or `f64` on an `f64` backend) whatever the inputs' dtype.
#[derive(Debug, Clone)]
pub struct Transition<B: Backend, const D: usize> {
    /// `x_{k+1}`, `[B, ...]`, after the storage round trip — exactly the value a trajectory
    /// stores and replay reads back. No autodiff history.
    pub prev_sample: Tensor<B, D>,
    /// The transition mean `mu_k`, `[B, ...]`, kept in the compute dtype (never narrowed to the
    /// storage precision: a KL between two means must see sub-ULP policy differences).
    /// Differentiable in the model output.
    pub mean: Tensor<B, D>,
    /// The transition standard deviation per sample, length `B` (`f64` host values; the
    /// tensors used them rounded to the compute dtype).
    pub std: Vec<f64>,
    /// The diffusion coefficient before the step-size factor, per sample (`g(sigma)` for
    /// Flow-SDE, `eta` for Dance, equal to `std` for CPS and churn). Needed only by
    /// [`gaussian::kl_flow_grpo_reference`].
    pub std_dev_t: Vec<f64>,
    /// `[B]`: the Gaussian log-density of `prev_sample` **averaged** over the non-batch
    /// elements — the references' reduction (`log_prob.mean(dim=non-batch)`), the quantity the
    /// GRPO ratio is built from. Normalised (all constants kept), so for CPS it differs from
    /// the reference's unnormalised score ([`Transition::cps_reference_score`]).
    pub log_prob: Tensor<B, 1>,
    /// `[B]`: the exact log-density of the whole `prev_sample`, the **sum** over the non-batch
    /// elements (computed as `log_prob * elements_per_sample`).
    pub log_density: Tensor<B, 1>,
}

impl<B: Backend, const D: usize> Transition<B, D> {
    /// Per-element log-density `log N(prev_sample; mean, std^2)`, `[B, ...]`.
    pub fn log_prob_elements(&self) -> Tensor<B, D> {
        gaussian::log_density_elements(self.prev_sample.clone(), self.mean.clone(), &self.std)
    }

    /// The quantity flow_grpo's CPS branch calls `log_prob`: `-mean((x_{k+1} - mu)^2)` per
    /// sample. **Not a log-density**: it drops the `1/(2 std^2)` scale and every constant.
    /// Provided to reproduce that reference; ratios built from it are not likelihood ratios.
    pub fn cps_reference_score(&self) -> Tensor<B, 1> {
        let residual = self.prev_sample.clone().sub(self.mean.clone());
        gaussian::mean_over_non_batch(residual.clone().mul(residual.clone())).neg()
    }
}
